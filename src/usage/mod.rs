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

use scan::Scan;
pub use scan::{Provider, Usage};

/// How the body is framed and encoded, from the response's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Json,
    EventStream,
}

/// At most this much of a body is decompressed and read: past it, the
/// usage is unread (a compressed body that grows without end costs no
/// more).
const MAX_DECOMPRESSED: u64 = 64 * 1024 * 1024;

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

mod scan;

pub mod include_usage;

#[cfg(test)]
mod tests;
