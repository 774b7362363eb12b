//! A header name as floodgate writes it: the name a header map keys on, and
//! the spelling an HTTP/1.1 peer reads when `[upstream].preserve_header_case`
//! keeps every name as it was spelled. Built once, so writing a header costs
//! no parse and no heap copy of its name.

use bytes::Bytes;
use http::HeaderName;

#[derive(Debug, Clone)]
pub struct SpelledName {
    name: HeaderName,
    spelling: Bytes,
}

impl SpelledName {
    /// `name` must be `spelling` in lower case (the constants are checked by
    /// their modules' tests); a name that is not a valid lower-case header
    /// name fails to compile.
    pub const fn from_static(name: &'static str, spelling: &'static str) -> SpelledName {
        SpelledName {
            name: HeaderName::from_static(name),
            spelling: Bytes::from_static(spelling.as_bytes()),
        }
    }

    /// A name from the config, spelled as the operator wrote it.
    pub fn new(spelling: &str) -> Result<SpelledName, http::header::InvalidHeaderName> {
        Ok(SpelledName {
            name: HeaderName::from_bytes(spelling.as_bytes())?,
            spelling: Bytes::copy_from_slice(spelling.as_bytes()),
        })
    }

    pub fn name(&self) -> &HeaderName {
        &self.name
    }

    /// The spelling as bytes, shared rather than copied.
    pub fn spelling_bytes(&self) -> Bytes {
        self.spelling.clone()
    }

    pub fn spelling(&self) -> &str {
        // Header names are ASCII, so this never falls back.
        std::str::from_utf8(&self.spelling).unwrap_or_default()
    }
}

/// The same header, however it is spelled.
impl PartialEq for SpelledName {
    fn eq(&self, other: &SpelledName) -> bool {
        self.name == other.name
    }
}

impl Eq for SpelledName {}

#[cfg(test)]
pub(crate) fn assert_lower_case_of_spelling(names: &[&SpelledName]) {
    for name in names {
        assert_eq!(
            name.name().as_str(),
            name.spelling().to_ascii_lowercase(),
            "{name:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_name_keeps_its_spelling_and_compares_by_name() {
        let spelled = SpelledName::new("X-Trace-ID").expect("a header name");
        assert_eq!(spelled.spelling(), "X-Trace-ID");
        assert_eq!(spelled.name().as_str(), "x-trace-id");
        assert_eq!(
            spelled,
            SpelledName::new("x-trace-id").expect("a header name")
        );
        assert!(SpelledName::new("not a name").is_err());
    }
}
