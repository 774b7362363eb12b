//! An LLM provider's token usage, read from its response body as the body
//! passes: a JSON answer or a stream of server-sent events, in OpenAI's
//! shape (`usage.prompt_tokens`, `usage.completion_tokens`; a stream's
//! last chunk) or Anthropic's (`usage.input_tokens`, `usage.output_tokens`;
//! a stream's `message_start` and its cumulative `message_delta`s). Nothing
//! is held back from the client and nothing is buffered whole: a running
//! scan whose memory is bounded, whatever the body. Values are committed
//! only from a JSON document read to its end, so no fragment of a broken
//! one counts.

use std::io::Write;

/// Whose wire format the response is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    OpenAi,
    Anthropic,
}

/// How the body is framed and encoded, from the response's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Json,
    EventStream,
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

/// At most this much of a body is decompressed and read: past it, the
/// usage is unread (a compressed body that grows without end costs no
/// more).
const MAX_DECOMPRESSED: u64 = 64 * 1024 * 1024;

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
struct Scan {
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
    fn new(provider: Provider) -> Scan {
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

    fn feed(&mut self, bytes: &[u8]) {
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

    fn byte(&mut self, b: u8) {
        match self.at {
            At::Broken => {}
            At::Done => {
                if !b.is_ascii_whitespace() {
                    self.at = At::Broken;
                }
            }
            At::Str { key, escaped } => {
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
            At::Number => {
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
            At::Literal => {
                if !b.is_ascii_alphabetic() {
                    self.value_ended();
                    self.byte(b);
                }
            }
            _ if b.is_ascii_whitespace() => {}
            At::Value => match b {
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
            },
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

    /// What the document says, if it is whole (a number at its very end,
    /// a document of one number, ends with it).
    fn finish(&mut self) -> Option<(Usage, bool)> {
        if self.at == At::Number {
            self.number_ended();
            self.value_ended();
        }
        (self.at == At::Done).then_some((self.found, self.spoiled))
    }

    /// Ready for the next document (an event stream's next event), keeping
    /// what was allocated.
    fn reset(&mut self) {
        self.at = At::Value;
        self.open.clear();
        self.arrays_open = 0;
        self.path.clear();
        self.found = Usage::default();
        self.spoiled = false;
    }
}

/// What a whole response said: the counts, and whether any was there but
/// unreadable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Read {
    pub usage: Usage,
    pub spoiled: bool,
}

/// Where an event stream's line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// At its start: its field's name being read.
    Field { len: usize },
    /// A `data` line's value, after the colon (and the one space).
    Data { started: bool },
    /// Any other line: skipped to its end.
    Skip,
}

/// The length of the event `bytes` start with, when it is one `data` line
/// followed by a blank line (LF or CRLF line ends), all within `bytes`, and
/// names no `"usage"`: nothing in it could be counted.
fn event_without_usage(bytes: &[u8]) -> Option<usize> {
    if !bytes.starts_with(b"data:") {
        return None;
    }
    let end = memchr::memchr2(b'\n', b'\r', bytes)?;
    let after = &bytes[end..];
    let blank = if after.starts_with(b"\n\n") {
        2
    } else if after.starts_with(b"\r\n\r\n") {
        4
    } else {
        return None;
    };
    memchr::memmem::find(&bytes[..end], b"\"usage\"")
        .is_none()
        .then_some(end + blank)
}

/// The body as it passes, read for the provider's usage.
pub struct UsageReader {
    provider: Provider,
    framing: Framing,
    scan: Option<Scan>,
    read: Read,
    line: Line,
    field: [u8; 8],
    /// A `\r` ended the last line: a `\n` right after it is the same end.
    after_cr: bool,
    /// An event's `data` lines so far (a blank line ends the event).
    in_event: bool,
    decoder: Option<Decoder>,
    /// Bytes read (after decompression).
    seen: u64,
    /// The body could not be read to its end (a bad compression, too much).
    unreadable: bool,
}

/// A compressed body, decompressed into the reader as it passes.
enum Decoder {
    Gzip(flate2::write::GzDecoder<Sink>),
    Deflate(flate2::write::ZlibDecoder<Sink>),
}

/// Where decompressed bytes go: kept only until the reader takes them, a
/// chunk at a time.
#[derive(Default)]
struct Sink(Vec<u8>);

impl Write for Sink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        // At most what one input chunk expands to per call; the reader
        // drains it after each chunk and stops past `MAX_DECOMPRESSED`.
        if self.0.len() > 1 << 20 {
            return Err(std::io::Error::other("a chunk expands too far"));
        }
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl UsageReader {
    /// A reader for a response of `content_type` and `content_encoding`
    /// (as the head says); none for a body no usage is read from.
    pub fn for_response(
        provider: Provider,
        content_type: Option<&[u8]>,
        content_encoding: Option<&[u8]>,
    ) -> Option<UsageReader> {
        let media = content_type
            .and_then(|t| std::str::from_utf8(t).ok())
            .map(|t| {
                t.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
            .unwrap_or_default();
        let framing = if media == "text/event-stream" {
            Framing::EventStream
        } else if media == "application/json" || media.ends_with("+json") {
            Framing::Json
        } else {
            return None;
        };
        let encoding = content_encoding
            .and_then(|e| std::str::from_utf8(e).ok())
            .map(|e| e.trim().to_ascii_lowercase())
            .unwrap_or_default();
        let mut reader = UsageReader::new(provider, framing);
        match encoding.as_str() {
            "" | "identity" => {}
            "gzip" | "x-gzip" => {
                reader.decoder = Some(Decoder::Gzip(
                    flate2::write::GzDecoder::new(Sink::default()),
                ))
            }
            "deflate" => {
                reader.decoder = Some(Decoder::Deflate(flate2::write::ZlibDecoder::new(
                    Sink::default(),
                )))
            }
            // br, zstd, layered encodings: not read.
            _ => reader.unreadable = true,
        }
        Some(reader)
    }

    pub fn new(provider: Provider, framing: Framing) -> UsageReader {
        UsageReader {
            provider,
            framing,
            scan: (framing == Framing::Json).then(|| Scan::new(provider)),
            read: Read::default(),
            line: Line::Field { len: 0 },
            field: [0; 8],
            after_cr: false,
            in_event: false,
            decoder: None,
            seen: 0,
            unreadable: false,
        }
    }

    /// The next bytes of the body, as they came.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.unreadable {
            return;
        }
        let Some(mut decoder) = self.decoder.take() else {
            self.plain(bytes);
            return;
        };
        let mut rest = bytes;
        while !rest.is_empty() && !self.unreadable {
            let written = match &mut decoder {
                Decoder::Gzip(d) => d.write(rest),
                Decoder::Deflate(d) => d.write(rest),
            };
            let out = match &mut decoder {
                Decoder::Gzip(d) => std::mem::take(&mut d.get_mut().0),
                Decoder::Deflate(d) => std::mem::take(&mut d.get_mut().0),
            };
            match written {
                Ok(0) | Err(_) => self.unreadable = true,
                Ok(n) => rest = &rest[n..],
            }
            self.plain_decoded(&out);
        }
        self.decoder = Some(decoder);
    }

    /// Decompressed bytes: counted against `MAX_DECOMPRESSED`.
    fn plain_decoded(&mut self, bytes: &[u8]) {
        self.seen += bytes.len() as u64;
        if self.seen > MAX_DECOMPRESSED {
            self.unreadable = true;
            return;
        }
        self.read_bytes(bytes);
    }

    fn plain(&mut self, bytes: &[u8]) {
        self.seen += bytes.len() as u64;
        self.read_bytes(bytes);
    }

    fn read_bytes(&mut self, bytes: &[u8]) {
        match self.framing {
            Framing::Json => {
                if let Some(scan) = &mut self.scan {
                    scan.feed(bytes);
                }
            }
            Framing::EventStream => {
                let mut rest = bytes;
                while let Some((&b, after)) = rest.split_first() {
                    // A whole event of one data line that names no usage
                    // (every count is under a "usage" key, unescaped) is
                    // passed over at once: all of an OpenAI stream's chunks
                    // but its last.
                    if self.line == (Line::Field { len: 0 }) && !self.in_event && !self.after_cr {
                        if let Some(length) = event_without_usage(rest) {
                            rest = &rest[length..];
                            continue;
                        }
                    }
                    // A data line's value goes to the scan whole, up to its
                    // end.
                    if let (Line::Data { started: true }, Some(scan)) = (self.line, &mut self.scan)
                    {
                        let end = memchr::memchr2(b'\n', b'\r', rest).unwrap_or(rest.len());
                        if end > 0 {
                            scan.feed(&rest[..end]);
                            rest = &rest[end..];
                            continue;
                        }
                    }
                    self.event_byte(b);
                    rest = after;
                }
            }
        }
    }

    fn event_byte(&mut self, b: u8) {
        let ends_line = b == b'\n' || b == b'\r';
        if b == b'\n' && std::mem::take(&mut self.after_cr) {
            return;
        }
        self.after_cr = b == b'\r';
        if ends_line {
            match self.line {
                // A blank line ends the event.
                Line::Field { len: 0 } => self.end_event(),
                // `data` alone: an empty line of data.
                Line::Field { len } if &self.field[..len] == b"data" => self.data_line(),
                Line::Data { .. } => {}
                _ => {}
            }
            self.line = Line::Field { len: 0 };
            return;
        }
        match self.line {
            Line::Field { len } if b == b':' => {
                self.line = if &self.field[..len] == b"data" {
                    self.data_line();
                    Line::Data { started: false }
                } else {
                    Line::Skip
                };
            }
            Line::Field { len } if len < self.field.len() => {
                self.field[len] = b;
                self.line = Line::Field { len: len + 1 };
            }
            Line::Field { .. } => self.line = Line::Skip,
            Line::Data { started: false } if b == b' ' => {
                self.line = Line::Data { started: true };
            }
            Line::Data { .. } => {
                self.line = Line::Data { started: true };
                if let Some(scan) = &mut self.scan {
                    scan.byte(b);
                }
            }
            Line::Skip => {}
        }
    }

    /// A `data` line begins: the event's document goes on (its lines are
    /// joined by a line feed, whitespace to JSON).
    fn data_line(&mut self) {
        match &mut self.scan {
            Some(scan) if self.in_event => scan.byte(b'\n'),
            Some(scan) => {
                scan.reset();
                self.in_event = true;
            }
            None => {
                self.scan = Some(Scan::new(self.provider));
                self.in_event = true;
            }
        }
    }

    fn end_event(&mut self) {
        if std::mem::take(&mut self.in_event) {
            self.commit();
        }
    }

    fn commit(&mut self) {
        let Some((found, spoiled)) = self.scan.as_mut().and_then(Scan::finish) else {
            return;
        };
        self.read.spoiled |= spoiled;
        // Later counts replace earlier ones: Anthropic's deltas are
        // cumulative, OpenAI's last chunk is the whole.
        if found.prompt.is_some() {
            self.read.usage.prompt = found.prompt;
        }
        if found.completion.is_some() {
            self.read.usage.completion = found.completion;
        }
    }

    /// What the body said, the body having ended (`whole`) or been cut.
    pub fn finish(mut self, whole: bool) -> Read {
        if whole && !self.unreadable {
            // What the decoder still holds.
            let finished = match &mut self.decoder {
                None => Ok(Vec::new()),
                Some(Decoder::Gzip(d)) => {
                    d.try_finish().map(|()| std::mem::take(&mut d.get_mut().0))
                }
                Some(Decoder::Deflate(d)) => {
                    d.try_finish().map(|()| std::mem::take(&mut d.get_mut().0))
                }
            };
            match finished {
                Ok(rest) => self.plain_decoded(&rest),
                Err(_) => self.unreadable = true,
            }
        }
        if self.unreadable {
            return Read {
                usage: Usage::default(),
                spoiled: true,
            };
        }
        match self.framing {
            Framing::Json if whole => self.commit(),
            // A stream's last event may lack its blank line at the end.
            Framing::EventStream if whole => self.end_event(),
            _ => {}
        }
        self.read
    }
}

pub mod include_usage;

#[cfg(test)]
mod tests;
