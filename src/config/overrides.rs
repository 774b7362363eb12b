//! A client's own numbers under a limit, given at run time
//! (`/v1/overrides`), checked as the file's numbers for that limit are:
//! the same code, so the same ranges and the same messages.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::file::Numbers;
use super::rule::{rule_of, RuleFrame};
use super::source::render_path;
use floodgate_policy::Rule;

/// The fields an override's numbers may hold (each algorithm takes some).
pub const NUMBER_FIELDS: [&str; 7] = [
    "capacity",
    "refill_rate",
    "limit",
    "window",
    "rate",
    "period",
    "max",
];

/// Numbers that do not make the limit's rule: the field at fault and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct OverrideError {
    pub field: String,
    pub message: String,
}

/// How each limit of a configuration reads numbers, by its place in
/// `policy.limits`; none for a limit that takes no overrides.
#[derive(Debug, Clone, Default)]
pub struct OverrideRules {
    frames: Arc<Vec<Result<RuleFrame, &'static str>>>,
}

impl OverrideRules {
    pub(super) fn new(frames: Vec<Result<RuleFrame, &'static str>>) -> Self {
        OverrideRules {
            frames: Arc::new(frames),
        }
    }

    /// The rule `numbers` make for the limit at `limit`: every number its
    /// algorithm needs given (none is taken from the file, so an override
    /// says all it means), none it does not have.
    pub fn rule(&self, limit: usize, numbers: &Map<String, Value>) -> Result<Rule, OverrideError> {
        let invalid = |field: &str, message: String| OverrideError {
            field: field.into(),
            message,
        };
        let frame = match self.frames.get(limit) {
            Some(Ok(frame)) => frame,
            Some(Err(why)) => return Err(invalid("limit", (*why).into())),
            None => return Err(invalid("limit", "no such limit".into())),
        };
        if numbers.is_empty() {
            return Err(invalid(
                "body",
                format!(
                    "give the limit's numbers for this client (its algorithm's of: {})",
                    NUMBER_FIELDS.join(", ")
                ),
            ));
        }
        for (field, value) in numbers {
            let expected = match field.as_str() {
                "window" | "period" => value.is_string(),
                f if NUMBER_FIELDS.contains(&f) => value.is_number(),
                _ => {
                    return Err(invalid(
                        field,
                        format!(
                            "unknown field (a limit's numbers are {})",
                            NUMBER_FIELDS.join(", ")
                        ),
                    ))
                }
            };
            if !expected {
                let wanted = if matches!(field.as_str(), "window" | "period") {
                    "a string such as \"1m\" or \"day\""
                } else {
                    "a number"
                };
                return Err(invalid(field, format!("{wanted} is expected")));
            }
        }
        let parsed: Numbers = serde_json::from_value(Value::Object(numbers.clone()))
            .map_err(|e| invalid("body", e.to_string()))?;
        rule_of(frame, &parsed, None, &[]).map_err(|(path, message)| OverrideError {
            field: render_path(&path),
            message,
        })
    }
}
