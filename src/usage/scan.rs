//! The running scan of one JSON document for a provider's token counts:
//! where each provider puts them, and the document read a byte at a time in
//! bounded memory (no key longer than those looked for, no nesting deeper
//! than a usage lies), its counts kept only once it is whole.

/// Whose wire format the response is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    OpenAi,
    Anthropic,
}

/// The tokens a response reported, as far as they were read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt: Option<u64>,
    pub completion: Option<u64>,
}

/// A count larger than any response reports: beyond it, a value is
/// unreadable rather than a bill.
const MOST_TOKENS: u64 = 1_000_000_000_000;

/// Nesting deeper than any usage lies: past it the document is not read.
const MAX_DEPTH: usize = 32;

/// The longest key compared (the keys looked for are shorter).
const MAX_KEY: usize = 24;

/// The longest number read (more digits than `MOST_TOKENS` has).
const MAX_NUMBER: usize = 24;

/// Which number of a document is which count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    Prompt,
    Completion,
}

/// The paths a provider's counts are at, from the document's root.
fn count_at(provider: Provider, path: &[Key]) -> Option<Count> {
    let names: [&str; 3] = [
        path.first().map_or("", Key::as_str),
        path.get(1).map_or("", Key::as_str),
        path.get(2).map_or("", Key::as_str),
    ];
    match (provider, path.len(), names) {
        (Provider::OpenAi, 2, ["usage", "prompt_tokens", _]) => Some(Count::Prompt),
        (Provider::OpenAi, 2, ["usage", "completion_tokens", _]) => Some(Count::Completion),
        (Provider::Anthropic, 2, ["usage", "input_tokens", _]) => Some(Count::Prompt),
        (Provider::Anthropic, 2, ["usage", "output_tokens", _]) => Some(Count::Completion),
        // A stream's `message_start`: its output count is a placeholder.
        (Provider::Anthropic, 3, ["message", "usage", "input_tokens"]) => Some(Count::Prompt),
        _ => None,
    }
}

/// A key on the path, kept only as long as it could be one looked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Key {
    bytes: [u8; MAX_KEY],
    len: usize,
    /// Longer than any key looked for, or escaped: matches none.
    other: bool,
}

impl Key {
    fn as_str(&self) -> &str {
        if self.other {
            return "";
        }
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or("")
    }

    fn push(&mut self, byte: u8) {
        if self.len < MAX_KEY {
            self.bytes[self.len] = byte;
            self.len += 1;
        } else {
            self.other = true;
        }
    }
}

/// Where the scanner is within a JSON document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// Before a value (the document's, an array element, after a colon).
    Value,
    /// In an object, before a key or its end.
    KeyOrEnd,
    /// After a key, before its colon.
    Colon,
    /// After a value, before a comma or the container's end.
    AfterValue,
    /// In a string; `key` when it is an object's key.
    Str { key: bool, escaped: bool },
    /// In a number.
    Number,
    /// In `true`, `false` or `null`.
    Literal,
    /// The document is whole.
    Done,
    /// Not JSON, or too deep: nothing more of this document is read.
    Broken,
}

/// One container open on the way down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Object,
    Array,
}

/// A running scan of one JSON document for a provider's counts.
#[derive(Debug)]
pub(super) struct Scan {
    provider: Provider,
    at: At,
    open: Vec<Open>,
    /// Arrays among `open`: no count lies in one.
    arrays_open: usize,
    /// The keys of the open objects (one per `Open::Object` on `open`,
    /// the current key of each, `Key::default()` before its first).
    path: Vec<Key>,
    /// The key being read.
    key: Key,
    number: [u8; MAX_NUMBER],
    number_len: usize,
    /// Counts read in this document, committed once it is whole.
    found: Usage,
    /// A count's value that did not read as one (negative, fractional,
    /// huge, not a number).
    spoiled: bool,
}

impl Scan {
    pub(super) fn new(provider: Provider) -> Scan {
        Scan {
            provider,
            at: At::Value,
            open: Vec::new(),
            arrays_open: 0,
            path: Vec::new(),
            key: Key::default(),
            number: [0; MAX_NUMBER],
            number_len: 0,
            found: Usage::default(),
            spoiled: false,
        }
    }

    /// Which count the value about to be read is: none where an array lies
    /// on the way, or at a depth no count is at (most values: cheaply).
    fn count_here(&self) -> Option<Count> {
        if self.arrays_open > 0 || !(2..=3).contains(&self.path.len()) {
            return None;
        }
        count_at(self.provider, &self.path)
    }

    /// A value that is not a number where a count is: spoiled.
    fn non_number_value(&mut self) {
        if self.count_here().is_some() {
            self.spoiled = true;
        }
    }

    fn value_ended(&mut self) {
        self.at = if self.open.is_empty() {
            At::Done
        } else {
            At::AfterValue
        };
    }

    fn open(&mut self, container: Open) {
        if self.open.len() >= MAX_DEPTH {
            self.at = At::Broken;
            return;
        }
        self.open.push(container);
        match container {
            Open::Object => {
                self.path.push(Key::default());
                self.at = At::KeyOrEnd;
            }
            Open::Array => {
                self.arrays_open += 1;
                self.at = At::Value;
            }
        }
    }

    fn close(&mut self, container: Open) {
        if self.open.pop() != Some(container) {
            self.at = At::Broken;
            return;
        }
        match container {
            Open::Object => {
                self.path.pop();
            }
            Open::Array => self.arrays_open -= 1,
        }
        self.value_ended();
    }

    fn number_ended(&mut self) {
        let Some(count) = self.count_here() else {
            return;
        };
        let text = &self.number[..self.number_len];
        let value = std::str::from_utf8(text)
            .ok()
            .filter(|t| t.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|t| t.parse::<u64>().ok())
            .filter(|&v| v <= MOST_TOKENS);
        match (value, count) {
            (None, _) => self.spoiled = true,
            (Some(v), Count::Prompt) => self.found.prompt = Some(v),
            (Some(v), Count::Completion) => self.found.completion = Some(v),
        }
    }

    pub(super) fn feed(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while let Some((&b, after)) = rest.split_first() {
            // Most of an answer is its text: a value string, skipped to its
            // next quote or backslash at once.
            if let At::Str {
                key: false,
                escaped: false,
            } = self.at
            {
                match memchr::memchr2(b'"', b'\\', rest) {
                    Some(at) => {
                        self.byte(rest[at]);
                        rest = &rest[at + 1..];
                    }
                    None => rest = &[],
                }
                continue;
            }
            self.byte(b);
            rest = after;
        }
    }

    pub(super) fn byte(&mut self, b: u8) {
        match self.at {
            At::Broken => {}
            At::Done => {
                if !b.is_ascii_whitespace() {
                    self.at = At::Broken;
                }
            }
            At::Str { key, escaped } => self.string_byte(b, key, escaped),
            At::Number => self.number_byte(b),
            At::Literal => {
                if !b.is_ascii_alphabetic() {
                    self.value_ended();
                    self.byte(b);
                }
            }
            _ if b.is_ascii_whitespace() => {}
            At::Value => self.value_start(b),
            At::KeyOrEnd => match b {
                b'"' => {
                    self.key = Key::default();
                    self.at = At::Str {
                        key: true,
                        escaped: false,
                    };
                }
                b'}' => self.close(Open::Object),
                _ => self.at = At::Broken,
            },
            At::Colon => match b {
                b':' => self.at = At::Value,
                _ => self.at = At::Broken,
            },
            At::AfterValue => match (b, self.open.last()) {
                (b',', Some(Open::Object)) => self.at = At::KeyOrEnd,
                (b',', Some(Open::Array)) => self.at = At::Value,
                (b'}', Some(Open::Object)) => self.close(Open::Object),
                (b']', Some(Open::Array)) => self.close(Open::Array),
                _ => self.at = At::Broken,
            },
        }
    }

    /// A byte of a string: an object's key is kept (as far as it could be
    /// one looked for), a value's text is not.
    fn string_byte(&mut self, b: u8, key: bool, escaped: bool) {
        if escaped {
            if key {
                // An escaped key matches no key looked for.
                self.key.other = true;
            }
            self.at = At::Str {
                key,
                escaped: false,
            };
        } else if b == b'\\' {
            self.at = At::Str { key, escaped: true };
        } else if b == b'"' {
            if key {
                if let Some(last) = self.path.last_mut() {
                    *last = std::mem::take(&mut self.key);
                }
                self.at = At::Colon;
            } else {
                self.value_ended();
            }
        } else if key {
            self.key.push(b);
        }
    }

    /// A byte within a number, or the one after its end.
    fn number_byte(&mut self, b: u8) {
        if matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
            if self.number_len < MAX_NUMBER {
                self.number[self.number_len] = b;
                self.number_len += 1;
            } else {
                // Longer than any count: marked unreadable.
                self.number[0] = b'x';
            }
        } else {
            self.number_ended();
            self.value_ended();
            self.byte(b);
        }
    }

    /// The first byte of a value (or an array's end where its next value
    /// could be).
    fn value_start(&mut self, b: u8) {
        match b {
            b'{' => {
                self.non_number_value();
                self.open(Open::Object);
            }
            b'[' => {
                self.non_number_value();
                self.open(Open::Array);
            }
            b'"' => {
                self.non_number_value();
                self.at = At::Str {
                    key: false,
                    escaped: false,
                };
            }
            b'-' | b'0'..=b'9' => {
                self.number[0] = b;
                self.number_len = 1;
                self.at = At::Number;
            }
            b't' | b'f' | b'n' => {
                // `null` where a count is: none reported (OpenAI's
                // chunks before the last), not a spoiled one.
                if b != b'n' {
                    self.non_number_value();
                }
                self.at = At::Literal;
            }
            b']' if self.open.last() == Some(&Open::Array) => self.close(Open::Array),
            _ => self.at = At::Broken,
        }
    }

    /// What the document says, if it is whole (a number at its very end,
    /// a document of one number, ends with it).
    pub(super) fn finish(&mut self) -> Option<(Usage, bool)> {
        if self.at == At::Number {
            self.number_ended();
            self.value_ended();
        }
        (self.at == At::Done).then_some((self.found, self.spoiled))
    }

    /// Ready for the next document (an event stream's next event), keeping
    /// what was allocated.
    pub(super) fn reset(&mut self) {
        self.at = At::Value;
        self.open.clear();
        self.arrays_open = 0;
        self.path.clear();
        self.found = Usage::default();
        self.spoiled = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_past_the_bound_is_not_read_and_holds_no_more() {
        let deep = format!(
            "{}{}",
            "{\"a\":".repeat(10_000),
            "{\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}"
        );
        let mut scan = Scan::new(Provider::OpenAi);
        scan.feed(deep.as_bytes());
        assert!(scan.open.len() <= MAX_DEPTH);
        assert_eq!(scan.finish(), None);
    }
}
