//! Asking OpenAI for a stream's usage when the client did not, and taking
//! the extra chunk back out. A streamed chat completion reports its tokens
//! only when the request sets `stream_options.include_usage`; without them
//! a stream's cost is unknown. The request is amended by splicing its text,
//! not by serializing it again, so numbers, key order, escapes and
//! whitespace stay as the client wrote them (serde_json here keeps no key
//! order). The answer then ends with a usage-only chunk the client did not
//! ask for: `UsageChunkStripper` removes it as the stream passes.

use std::ops::Range;

use serde::de::IgnoredAny;
use serde::Deserialize;

/// The request body with `stream_options.include_usage` set to true, when
/// it streams (`"stream": true` at the top) and does not ask for usage
/// itself. `Some`: the answer will end with a usage chunk the client did
/// not ask for, to be removed with a `UsageChunkStripper`. `None`: the body
/// is sent as it is: not streaming, asking already, not a JSON object, or
/// ambiguous (a name twice in one object: which one the upstream reads is
/// not ours to guess), or `stream_options` / `include_usage` of a type the
/// upstream refuses anyway.
pub fn ask_for_usage(body: &[u8]) -> Option<Vec<u8>> {
    // The whole body is JSON: the scan below only has to find where things
    // lie, not to check them.
    serde_json::from_slice::<IgnoredAny>(body).ok()?;
    let open = skip_space(body, 0);
    if body.get(open) != Some(&b'{') {
        return None;
    }
    let top = members(body, open, ["stream", "stream_options"])?;
    let [stream, options] = top.found;
    if !holds(body, stream?, b"true") {
        return None;
    }
    let (replaced, text): (Range<usize>, &str) = match options {
        // `stream` is there: the object has a last member to follow.
        None => {
            let end = top.last_end?;
            (end..end, r#","stream_options":{"include_usage":true}"#)
        }
        // The API's "not given", as if absent.
        Some(value) if holds(body, value.clone(), b"null") => (value, r#"{"include_usage":true}"#),
        Some(value) if body.get(value.start) == Some(&b'{') => {
            let options = members(body, value.start, ["include_usage"])?;
            let [include] = options.found;
            match (include, options.last_end) {
                (None, Some(end)) => (end..end, r#","include_usage":true"#),
                (None, None) => (value.start + 1..value.start + 1, r#""include_usage":true"#),
                (Some(v), _) if holds(body, v.clone(), b"false") => (v, "true"),
                (Some(v), _) if holds(body, v.clone(), b"null") => (v, "true"),
                // `true`: the client asked itself, and gets the chunk.
                (Some(_), _) => return None,
            }
        }
        Some(_) => return None,
    };
    let mut amended = Vec::with_capacity(body.len() + text.len());
    amended.extend_from_slice(body.get(..replaced.start)?);
    amended.extend_from_slice(text.as_bytes());
    amended.extend_from_slice(body.get(replaced.end..)?);
    Some(amended)
}

fn holds(json: &[u8], at: Range<usize>, text: &[u8]) -> bool {
    json.get(at) == Some(text)
}

/// What an object holds under some names.
struct Object<const N: usize> {
    /// Each name's value.
    found: [Option<Range<usize>>; N],
    /// The end of its last member's value; none for an empty object.
    last_end: Option<usize>,
}

/// The members named `names` of the object opening at `open`; `None` when
/// one of them is there twice (or the text is not what it should be).
fn members<const N: usize>(json: &[u8], open: usize, names: [&str; N]) -> Option<Object<N>> {
    let mut object = Object {
        found: std::array::from_fn(|_| None),
        last_end: None,
    };
    let mut at = skip_space(json, open + 1);
    if json.get(at) == Some(&b'}') {
        return Some(object);
    }
    loop {
        let key = json.get(at..string_end(json, at)?)?;
        at = skip_space(json, at + key.len());
        if json.get(at) != Some(&b':') {
            return None;
        }
        let start = skip_space(json, at + 1);
        let value = start..value_end(json, start)?;
        at = skip_space(json, value.end);
        object.last_end = Some(value.end);
        if let Some(i) = names.iter().position(|name| key_is(key, name)) {
            if object.found[i].replace(value).is_some() {
                return None;
            }
        }
        match json.get(at)? {
            b',' => at = skip_space(json, at + 1),
            b'}' => return Some(object),
            _ => return None,
        }
    }
}

/// Whether a key (quotes included) is `name`, escapes decoded: the
/// upstream reads `"\u0073tream"` as `stream`.
fn key_is(key: &[u8], name: &str) -> bool {
    if memchr::memchr(b'\\', key).is_none() {
        return key.strip_prefix(b"\"").and_then(|k| k.strip_suffix(b"\""))
            == Some(name.as_bytes());
    }
    serde_json::from_slice::<String>(key).is_ok_and(|k| k == name)
}

/// JSON's whitespace (not `u8::is_ascii_whitespace`, which has form feed).
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn skip_space(json: &[u8], at: usize) -> usize {
    json.get(at..)
        .and_then(|rest| rest.iter().position(|&b| !is_space(b)))
        .map_or(json.len(), |n| at + n)
}

/// Past the closing quote of the string opening at `start`.
fn string_end(json: &[u8], start: usize) -> Option<usize> {
    if json.get(start) != Some(&b'"') {
        return None;
    }
    let mut at = start + 1;
    loop {
        at += memchr::memchr2(b'"', b'\\', json.get(at..)?)?;
        if json.get(at) == Some(&b'"') {
            return Some(at + 1);
        }
        // A backslash: the byte it escapes is no quote.
        at += 2;
    }
}

/// Past the value starting at `start` (valid JSON).
fn value_end(json: &[u8], start: usize) -> Option<usize> {
    match json.get(start)? {
        b'"' => string_end(json, start),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut at = start;
            loop {
                match json.get(at)? {
                    b'"' => {
                        at = string_end(json, at)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(at + 1);
                        }
                    }
                    _ => {}
                }
                at += 1;
            }
        }
        // A number or a literal: up to what follows it.
        _ => Some(
            json.get(start..)?
                .iter()
                .position(|&b| matches!(b, b',' | b'}' | b']') || is_space(b))
                .map_or(json.len(), |n| start + n),
        ),
    }
}

/// The longest event held back to be read. The usage chunk is a few
/// hundred bytes: a longer event is not it and passes as it comes, unread,
/// so a stream costs at most this much memory.
pub const MAX_HELD_EVENT: usize = 1 << 20;

/// Capacity kept between events: one long event's buffer is not kept for
/// the rest of the stream.
const KEPT_CAPACITY: usize = 16 * 1024;

/// What the line feed right after a carriage return that ended a line
/// belongs to: CRLF is one line end, and goes with its line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum AfterCr {
    #[default]
    No,
    /// A line within the event (held or passing with it).
    Line,
    /// The event's blank line, the event sent.
    Sent,
    /// The event's blank line, the event dropped.
    Dropped,
}

/// An OpenAI event stream as it passes, less the usage-only chunk (`data:`
/// an object whose `choices` is empty and whose `usage` is an object) that
/// `include_usage` adds. Every other byte passes as it came. Each event is
/// held until its blank line ends it, then sent or dropped whole; an event
/// longer than `MAX_HELD_EVENT` passes as it arrives.
///
/// With `include_usage` on, OpenAI also puts `"usage":null` in every other
/// chunk, which a client that did not ask would not have seen. Those pass
/// unchanged: taking the member out means rewriting each chunk, and a
/// null usage is what the API documents for a chunk, which clients already
/// read (the official SDKs declare `usage` optional on every chunk).
#[derive(Debug, Default)]
pub struct UsageChunkStripper {
    /// The current event's bytes so far, line ends included.
    held: Vec<u8>,
    /// The current event outgrew `MAX_HELD_EVENT`: it passes unread.
    passing: bool,
    /// The current line has a byte before its end (so its end is no blank
    /// line).
    line_started: bool,
    after_cr: AfterCr,
    /// An event's data lines, joined: reused from event to event.
    data: Vec<u8>,
}

impl UsageChunkStripper {
    pub fn new() -> UsageChunkStripper {
        UsageChunkStripper::default()
    }

    /// The next bytes of the upstream's body; what the client gets of them
    /// (and of earlier ones held) is appended to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        let mut rest = chunk;
        while let Some(&first) = rest.first() {
            let after_cr = std::mem::take(&mut self.after_cr);
            if first == b'\n' && after_cr != AfterCr::No {
                match after_cr {
                    AfterCr::Line => self.take(b"\n", out),
                    AfterCr::Sent => out.push(b'\n'),
                    AfterCr::No | AfterCr::Dropped => {}
                }
                rest = &rest[1..];
                continue;
            }
            let Some(end) = memchr::memchr2(b'\n', b'\r', rest) else {
                self.take(rest, out);
                self.line_started = true;
                return;
            };
            let (line, after) = rest.split_at(end + 1);
            self.take(line, out);
            let blank = end == 0 && !self.line_started;
            self.line_started = false;
            let sent = !blank || self.end_event(out);
            if line.ends_with(b"\r") {
                self.after_cr = match (blank, sent) {
                    (false, _) => AfterCr::Line,
                    (true, true) => AfterCr::Sent,
                    (true, false) => AfterCr::Dropped,
                };
            }
            rest = after;
        }
    }

    /// The body has ended: what is still held goes out, unless it is the
    /// usage chunk cut short of its blank line (some clients dispatch such
    /// an event anyway).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.passing && !usage_only(&self.held, &mut self.data) {
            out.extend_from_slice(&self.held);
        }
        self.held.clear();
        self.passing = false;
        self.line_started = false;
        self.after_cr = AfterCr::No;
    }

    /// Bytes of the current event: held, or passed on once it is too long.
    fn take(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        if !self.passing && self.held.len() + bytes.len() > MAX_HELD_EVENT {
            out.extend_from_slice(&self.held);
            self.held.clear();
            self.passing = true;
        }
        if self.passing {
            out.extend_from_slice(bytes);
        } else {
            self.held.extend_from_slice(bytes);
        }
    }

    /// A blank line ended the event: sent (true) or dropped.
    fn end_event(&mut self, out: &mut Vec<u8>) -> bool {
        if std::mem::take(&mut self.passing) {
            return true;
        }
        let sent = !usage_only(&self.held, &mut self.data);
        if sent {
            out.extend_from_slice(&self.held);
        }
        self.held.clear();
        self.held.shrink_to(KEPT_CAPACITY);
        sent
    }
}

/// The fields of a chunk that tell the usage-only one.
#[derive(Deserialize)]
struct Chunk {
    choices: Vec<IgnoredAny>,
    usage: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Whether an event's data is the usage-only chunk. Anything that does not
/// read as one (a duplicated field, `usage` not an object, `[DONE]`, no
/// data) is not.
fn usage_only(event: &[u8], data: &mut Vec<u8>) -> bool {
    data.clear();
    let mut any = false;
    // Line ends split the event; the empty piece between CR and LF, and
    // the blank line, are no data line.
    for line in event.split(|&b| b == b'\n' || b == b'\r') {
        let (field, value) = match memchr::memchr(b':', line) {
            Some(colon) => line.split_at(colon),
            None => (line, &b""[..]),
        };
        if field != b"data" {
            continue;
        }
        let value = value.strip_prefix(b":").unwrap_or(value);
        if any {
            data.push(b'\n');
        }
        data.extend_from_slice(value.strip_prefix(b" ").unwrap_or(value));
        any = true;
    }
    any && serde_json::from_slice::<Chunk>(data)
        .is_ok_and(|chunk| chunk.choices.is_empty() && chunk.usage.is_some())
}

#[cfg(test)]
mod tests;
