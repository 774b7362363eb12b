//! The top-level fields of a JSON request body that limits read: a key's
//! `body:<field>`, a match on a field, an LLM request's `max_tokens` for
//! its reservation. Only the fields some limit names are kept; the rest of
//! the document is checked and skipped, never held.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

/// A read field's value, as keys and matches compare it.
#[derive(Debug, Clone, PartialEq)]
enum FieldValue {
    /// A string, a number or a boolean, as text (a string unquoted and
    /// unescaped: `"gpt-4o"` and `"gpt\u002d4o"` are one model).
    Scalar(String),
    /// An object, an array or null: no key, no match.
    Other,
}

/// Why a body gives no fields.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The body is not JSON, or its top level is not an object: no field
    /// can be read from it.
    #[error("the body is not a JSON object")]
    NotJson,
    /// A field read twice: the application may read either value.
    #[error("the body names \"{0}\" more than once")]
    Ambiguous(Box<str>),
}

/// The fields a request's body gave, of those asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BodyFields {
    fields: Vec<(Box<str>, FieldValue)>,
    /// The body's length in bytes.
    pub len: usize,
}

impl BodyFields {
    /// Reads the fields named in `wanted` from `body`, a JSON object. The
    /// whole document must be valid JSON: a body the upstream would refuse
    /// gives nothing.
    pub fn read(body: &[u8], wanted: &[Box<str>]) -> Result<BodyFields, BodyError> {
        let mut reader = serde_json::Deserializer::from_slice(body);
        let fields =
            Fields { wanted }
                .deserialize(&mut reader)
                .map_err(|e| match classify(&e) {
                    Some(field) => BodyError::Ambiguous(field.into()),
                    None => BodyError::NotJson,
                })?;
        reader.end().map_err(|_| BodyError::NotJson)?;
        Ok(BodyFields {
            fields,
            len: body.len(),
        })
    }

    /// A field's value as a key or a match reads it: a string's text, a
    /// number or a boolean as written; none for an object, an array, null,
    /// or a field the body lacks.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(field, _)| &**field == name)
            .and_then(|(_, value)| match value {
                FieldValue::Scalar(text) => Some(text.as_str()),
                FieldValue::Other => None,
            })
    }

    /// A field's value as a count of tokens: a whole number from 0 up.
    pub fn count(&self, name: &str) -> Option<u64> {
        self.text(name).and_then(|text| text.parse().ok())
    }
}

/// serde's errors carry text only: an ambiguity is told by its prefix.
const AMBIGUOUS: &str = "floodgate: field read twice: ";

fn classify(e: &serde_json::Error) -> Option<String> {
    let text = e.to_string();
    let rest = text.strip_prefix(AMBIGUOUS)?;
    // serde_json appends " at line L column C".
    Some(
        rest.rsplit_once(" at line ")
            .map_or(rest, |(f, _)| f)
            .to_string(),
    )
}

struct Fields<'w> {
    wanted: &'w [Box<str>],
}

impl<'de> DeserializeSeed<'de> for Fields<'_> {
    type Value = Vec<(Box<str>, FieldValue)>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Fields<'_> {
    type Value = Vec<(Box<str>, FieldValue)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found: Vec<(Box<str>, FieldValue)> = Vec::with_capacity(self.wanted.len());
        while let Some(name) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let Some(wanted) = self.wanted.iter().find(|w| ***w == *name) else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            if found.iter().any(|(f, _)| f == wanted) {
                return Err(serde::de::Error::custom(format!("{AMBIGUOUS}{wanted}")));
            }
            let value = match map.next_value::<Value>()? {
                Value::String(text) => FieldValue::Scalar(text),
                Value::Number(n) => FieldValue::Scalar(n.to_string()),
                Value::Bool(b) => FieldValue::Scalar(b.to_string()),
                Value::Null | Value::Array(_) | Value::Object(_) => FieldValue::Other,
            };
            found.push((wanted.clone(), value));
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(names: &[&str]) -> Vec<Box<str>> {
        names.iter().map(|n| (*n).into()).collect()
    }

    #[test]
    fn only_the_top_level_fields_asked_for_are_kept() {
        let body = br#"{"model":"gpt-4o","messages":[{"role":"user","content":"{\"model\":\"x\"}","model":"nested"}],"max_tokens":500,"stream":true,"n":null}"#;
        let fields = BodyFields::read(
            body,
            &wanted(&["model", "max_tokens", "stream", "n", "user"]),
        )
        .unwrap();
        assert_eq!(fields.text("model"), Some("gpt-4o"));
        assert_eq!(fields.count("max_tokens"), Some(500));
        assert_eq!(fields.text("stream"), Some("true"));
        assert_eq!(fields.text("n"), None);
        assert_eq!(fields.text("user"), None);
        assert_eq!(fields.text("messages"), None, "not asked for");
        assert_eq!(fields.len, body.len());
    }

    #[test]
    fn escapes_are_read_as_the_application_reads_them() {
        let plain = BodyFields::read(br#"{"model":"gpt-4o"}"#, &wanted(&["model"])).unwrap();
        let escaped =
            BodyFields::read(br#"{"m\u006fdel":"gpt\u002d4o"}"#, &wanted(&["model"])).unwrap();
        assert_eq!(plain.text("model"), escaped.text("model"));
    }

    #[test]
    fn a_field_named_twice_is_ambiguous_wherever_the_second_is() {
        for body in [
            &br#"{"model":"cheap","model":"gpt-4o"}"#[..],
            br#"{"model":"cheap","x":1,"mod\u0065l":"gpt-4o"}"#,
        ] {
            assert_eq!(
                BodyFields::read(body, &wanted(&["model"])),
                Err(BodyError::Ambiguous("model".into()))
            );
        }
        // Fields nobody reads may repeat, as JSON parsers allow.
        assert!(BodyFields::read(br#"{"x":1,"x":2,"model":"a"}"#, &wanted(&["model"])).is_ok());
    }

    #[test]
    fn what_is_not_one_json_object_gives_nothing() {
        for body in [
            &b""[..],
            b"[1,2]",
            b"\"model\"",
            b"{\"model\":\"a\"",
            b"{\"model\":\"a\"} {\"model\":\"b\"}",
            b"{\"model\":\"a\"}garbage",
            b"\xff\xfe",
            b"model=a",
        ] {
            assert_eq!(
                BodyFields::read(body, &wanted(&["model"])),
                Err(BodyError::NotJson),
                "{body:?}"
            );
        }
    }

    #[test]
    fn counts_are_whole_numbers_from_zero() {
        let fields = BodyFields::read(
            br#"{"a":12,"b":-1,"c":1.5,"d":"7","e":1e3,"f":18446744073709551616}"#,
            &wanted(&["a", "b", "c", "d", "e", "f"]),
        )
        .unwrap();
        assert_eq!(fields.count("a"), Some(12));
        assert_eq!(fields.count("b"), None);
        assert_eq!(fields.count("c"), None);
        assert_eq!(fields.count("d"), Some(7), "a number sent as text");
        assert_eq!(fields.count("e"), None);
        assert_eq!(fields.count("f"), None);
    }

    #[test]
    fn deep_nesting_neither_overflows_nor_hides_a_field() {
        let deep = |n: usize| {
            let mut v = std::iter::repeat_n(b'[', n).collect::<Vec<u8>>();
            v.extend(std::iter::repeat_n(b']', n));
            v
        };
        // Skipped: read without recursion, the field after it found.
        let mut body = b"{\"x\":".to_vec();
        body.extend(deep(100_000));
        body.extend(b",\"model\":\"a\"}");
        let fields = BodyFields::read(&body, &wanted(&["model"])).unwrap();
        assert_eq!(fields.text("model"), Some("a"));
        // Read: serde_json's depth limit refuses it.
        let mut body = b"{\"model\":".to_vec();
        body.extend(deep(100_000));
        body.extend(b"}");
        assert_eq!(
            BodyFields::read(&body, &wanted(&["model"])),
            Err(BodyError::NotJson)
        );
    }
}
