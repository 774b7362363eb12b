//! A limit charged by the response: by the statuses that count (`count`),
//! or by the cost the response reports (`cost_from_response`); and the
//! reservation a request takes before it goes upstream.

use http::HeaderName;

use crate::body::BodyFields;

/// The upstream statuses that charge a limit charged by its response's
/// status (`count = { statuses = [401, "5xx"] }`): inclusive ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statuses(Vec<(u16, u16)>);

impl Statuses {
    /// Statuses from inclusive ranges: `(401, 401)` for 401, `(500, 599)` for
    /// `5xx`.
    pub fn new(ranges: Vec<(u16, u16)>) -> Statuses {
        Statuses(ranges)
    }

    /// Whether `status` is in one of the ranges: a response that charges the
    /// limit.
    pub fn contains(&self, status: u16) -> bool {
        self.0
            .iter()
            .any(|&(low, high)| (low..=high).contains(&status))
    }
}

impl std::fmt::Display for Statuses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, &(low, high)) in self.0.iter().enumerate() {
            let sep = if i > 0 { ", " } else { "" };
            if low == high {
                write!(f, "{sep}{low}")?;
            } else {
                write!(f, "{sep}{}xx", low / 100)?;
            }
        }
        Ok(())
    }
}

/// Whose usage an LLM answer reports, in its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlmProvider {
    /// `usage.prompt_tokens` and `completion_tokens` (and every
    /// OpenAI-compatible server's); a stream's last chunk.
    OpenAi,
    /// `usage.input_tokens` and `output_tokens`; a stream's
    /// `message_start` and `message_delta`s.
    Anthropic,
}

impl LlmProvider {
    /// The provider as the config spells it (`usage = "openai"`).
    pub fn name(self) -> &'static str {
        match self {
            LlmProvider::OpenAi => "openai",
            LlmProvider::Anthropic => "anthropic",
        }
    }
}

/// Where a response says what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostSource {
    /// The largest whole number of a header.
    Header(HeaderName),
    /// An LLM provider's usage in the body, priced: prompt tokens times
    /// `prompt_weight` plus completion tokens times `completion_weight`.
    Usage {
        /// Whose usage format the body is read in.
        provider: LlmProvider,
        /// Units charged per prompt (input) token.
        prompt_weight: u64,
        /// Units charged per completion (output) token.
        completion_weight: u64,
    },
}

impl std::fmt::Display for CostSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CostSource::Header(name) => name.fmt(f),
            CostSource::Usage {
                provider,
                prompt_weight,
                completion_weight,
            } => write!(
                f,
                "{} usage ({prompt_weight} per prompt token, {completion_weight} per completion token)",
                provider.name()
            ),
        }
    }
}

/// `cost_from_response`: the request reserves `reserve` units before it
/// goes upstream (refused when they are not there), and the response
/// settles it: charged what its `source` says, at most `max`; `default`
/// when that is missing or unreadable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseCost {
    /// Where the response says what it cost: a header, or an LLM provider's
    /// usage in the body.
    pub source: CostSource,
    /// The most a response is charged, whatever it reports; what a reservation
    /// from the request is capped at.
    pub max: u64,
    /// What a response is charged when it reports no cost, or one that cannot
    /// be read.
    pub default: u64,
    /// Taken before the request goes upstream; the response settles it.
    /// With `from_request`, what a request whose body tells nothing takes.
    pub reserve: u64,
    /// `reserve = "request"`: an LLM request's own worst case, read from
    /// its body (`reservation`).
    pub from_request: bool,
    /// `include_usage`: an OpenAI stream that did not ask for its usage is
    /// made to, and the extra chunk taken back out of what its client gets.
    pub include_usage: bool,
    /// Whether the client sees the header (a usage source has none).
    pub expose: bool,
}

/// A prompt's tokens are estimated as one per this many bytes of the
/// request's body: about four characters a token for English text (OpenAI's
/// rule of thumb), and a JSON body's quoting and field names only add bytes.
pub const PROMPT_BYTES_PER_TOKEN: u64 = 4;

impl ResponseCost {
    /// What a request reserves before it goes upstream. With
    /// `reserve = "request"`: its prompt's estimate and the most it asks to
    /// be answered (`max_completion_tokens` or `max_tokens`), priced by the
    /// weights, at most `max` (what the response can be charged at most);
    /// `max` for a request that does not say (no readable body, no
    /// `max_tokens`).
    pub fn reservation(&self, body: Option<&BodyFields>) -> u64 {
        if !self.from_request {
            return self.reserve;
        }
        let CostSource::Usage {
            provider,
            prompt_weight,
            completion_weight,
        } = self.source
        else {
            return self.reserve;
        };
        let Some(body) = body else {
            return self.max;
        };
        let most_answered = provider
            .answer_limits()
            .iter()
            .find_map(|field| body.count(field));
        let Some(most_answered) = most_answered else {
            return self.max;
        };
        let prompt = (body.len as u64).div_ceil(PROMPT_BYTES_PER_TOKEN);
        prompt
            .saturating_mul(prompt_weight)
            .saturating_add(most_answered.saturating_mul(completion_weight))
            .clamp(1, self.max)
    }
}

impl LlmProvider {
    /// The request's fields that bound its answer's tokens, the first
    /// given applying (OpenAI's newer name before its older one).
    pub fn answer_limits(self) -> &'static [&'static str] {
        match self {
            LlmProvider::OpenAi => &["max_completion_tokens", "max_tokens"],
            LlmProvider::Anthropic => &["max_tokens"],
        }
    }
}

/// How a limit charged by the response is charged once the response is
/// known. A request takes a reservation before it goes upstream, settled
/// by this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargedByResponse {
    /// `count`: the request's cost, when the upstream's status is listed.
    Status(Statuses),
    /// `cost_from_response`: the cost the response reports.
    Cost(ResponseCost),
}

#[cfg(test)]
mod reservation_tests {
    use super::*;

    fn priced(provider: LlmProvider, from_request: bool) -> ResponseCost {
        ResponseCost {
            source: CostSource::Usage {
                provider,
                prompt_weight: 1,
                completion_weight: 4,
            },
            max: 10_000,
            default: 10,
            reserve: if from_request { 10_000 } else { 50 },
            from_request,
            include_usage: false,
            expose: false,
        }
    }

    fn fields(body: &str, provider: LlmProvider) -> BodyFields {
        let wanted: Vec<Box<str>> = provider
            .answer_limits()
            .iter()
            .map(|f| (*f).into())
            .collect();
        BodyFields::read(body.as_bytes(), &wanted).expect("JSON")
    }

    #[test]
    fn a_request_reserves_its_prompts_estimate_and_its_answers_most() {
        let openai = priced(LlmProvider::OpenAi, true);
        // 80 bytes: a prompt of 20, and 100 tokens answered at 4 each.
        let body = format!(
            r#"{{"model":"gpt-4o","max_tokens":100,"x":"{}"}}"#,
            "a".repeat(38)
        );
        assert_eq!(body.len(), 80);
        assert_eq!(
            openai.reservation(Some(&fields(&body, LlmProvider::OpenAi))),
            20 + 400
        );
        // The newer field first.
        let both = r#"{"max_completion_tokens":10,"max_tokens":100}"#;
        let prompt = (both.len() as u64).div_ceil(4);
        assert_eq!(
            openai.reservation(Some(&fields(both, LlmProvider::OpenAi))),
            prompt + 40
        );
        // Anthropic reads max_tokens only.
        let anthropic = priced(LlmProvider::Anthropic, true);
        let body = r#"{"max_completion_tokens":10,"max_tokens":100}"#;
        assert_eq!(
            anthropic.reservation(Some(&fields(body, LlmProvider::Anthropic))),
            prompt + 400
        );
    }

    #[test]
    fn a_request_that_does_not_say_reserves_the_most_it_can_be_charged() {
        let openai = priced(LlmProvider::OpenAi, true);
        assert_eq!(openai.reservation(None), 10_000);
        for body in [
            r#"{"model":"a"}"#,
            r#"{"max_tokens":-1}"#,
            r#"{"max_tokens":"lots"}"#,
            r#"{"max_tokens":1.5}"#,
        ] {
            assert_eq!(
                openai.reservation(Some(&fields(body, LlmProvider::OpenAi))),
                10_000,
                "{body}"
            );
        }
        // Never above max, whatever it asks.
        let huge = r#"{"max_tokens":18446744073709551615}"#;
        assert_eq!(
            openai.reservation(Some(&fields(huge, LlmProvider::OpenAi))),
            10_000
        );
        // A fixed reservation ignores the body.
        let fixed = priced(LlmProvider::OpenAi, false);
        assert_eq!(
            fixed.reservation(Some(&fields(huge, LlmProvider::OpenAi))),
            50
        );
    }
}
