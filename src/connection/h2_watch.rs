//! An HTTP/2 connection's streams as its frames tell them, read below the
//! h2 server: which requests are whole, which are answered, how fast a
//! body comes.
//!
//! A client that resets a stream (or closes the connection) once its
//! request is whole does not stop the upstream's work on it. So the reset
//! (or the close) is held back until the stream is answered: the exchange
//! with the upstream runs to its end, the request keeps its place under the
//! per-address cap and its concurrency slots until then, and a client
//! cannot put more work in flight at the upstream by cancelling. A body
//! that does not come in time is cut, as if the client had reset its
//! stream: at the body floor (`MIN_BODY_RATE` after a grace of
//! `header_timeout`, counted from the stream's head) unless the route is
//! exempt, and at the deadline of a request that holds a slot.
//!
//! Requests learn their stream: the first header block of each stream gets
//! one more header, `floodgate-h2-stream: <watch>:<stream>`, appended as a
//! CONTINUATION frame (a literal the HPACK decoder reads without touching
//! its table), which the gateway reads and removes (`H2Stream::take`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use super::clock::MIN_BODY_RATE;

/// The header a stream's first header block carries to its request.
pub const STREAM_HEADER: &str = "floodgate-h2-stream";

const PREFACE_LEN: usize = 24;
const FRAME_HEAD: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const CANCEL: u32 = 0x8;

/// Streams followed at once on one connection, far above what the h2
/// server lets a client open (those it refuses are answered at once).
const MOST_STREAMS: usize = 1024;

static WATCHES: LazyLock<Mutex<HashMap<u64, Weak<H2Watch>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One connection's streams, shared by its stream (which reads and writes
/// the frames) and its requests (which say what their bodies owe).
pub struct H2Watch {
    id: u64,
    header_timeout: Duration,
    /// The longest a reset is held for an answer: past it the upstream has
    /// given up anyway (its read timeout).
    hold_limit: Duration,
    shared: Mutex<Shared>,
}

#[derive(Default)]
struct Shared {
    streams: HashMap<u32, Stream>,
    /// The highest client stream opened: a HEADERS frame above it opens one.
    highest: u32,
    /// Bytes for the h2 server before anything more is read: resets let
    /// go or made, the header frames appended.
    inbound: VecDeque<u8>,
    /// Resets for the client of streams cut here (the h2 server was told
    /// the client reset them, so it tells the client nothing).
    outbound: Vec<u8>,
    /// The connection's reading task, to wake when `inbound` grows.
    reader: Option<Waker>,
    /// The client closed its side: reads end once every whole request is
    /// answered, and writes go nowhere meanwhile.
    client_gone: bool,
    /// Streams cut for a late body (for the metric, and for the stream
    /// whose frame the client stopped sending halfway).
    cut: Vec<u32>,
}

struct Stream {
    opened: Instant,
    body_bytes: u64,
    /// The client sent END_STREAM: the request is whole.
    whole: bool,
    answered: bool,
    /// The client's reset, held until the answer, and since when.
    held: Option<([u8; FRAME_HEAD + 4], Instant)>,
    /// Whether the body floor applies (not on a route the config exempts).
    floor: bool,
    /// A slot holder's deadline for its whole body.
    deadline: Option<Instant>,
}

impl Stream {
    fn body_due(&self, header_timeout: Duration) -> Option<Instant> {
        if self.whole {
            return None;
        }
        let floor = self.floor.then(|| {
            self.opened + header_timeout + Duration::from_secs(self.body_bytes / MIN_BODY_RATE)
        });
        match (floor, self.deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl H2Watch {
    pub fn new(header_timeout: Duration, hold_limit: Duration) -> Arc<H2Watch> {
        let mut registry = lock(&WATCHES);
        let id = loop {
            let mut bytes = [0u8; 8];
            let _ = getrandom::fill(&mut bytes);
            let id = u64::from_le_bytes(bytes);
            if id != 0 && !registry.contains_key(&id) {
                break id;
            }
        };
        let watch = Arc::new(H2Watch {
            id,
            header_timeout,
            hold_limit,
            shared: Mutex::new(Shared::default()),
        });
        registry.insert(id, Arc::downgrade(&watch));
        watch
    }

    fn shared(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    /// Streams cut for a late body since the last call.
    pub(super) fn take_cut(&self) -> Vec<u32> {
        std::mem::take(&mut self.shared().cut)
    }

    /// Whether reads are over: the client is gone and no whole request
    /// waits for its answer.
    pub(super) fn finished(&self) -> bool {
        let shared = self.shared();
        shared.client_gone
            && shared.inbound.is_empty()
            && !shared.streams.values().any(|s| s.whole && !s.answered)
    }

    pub(super) fn client_gone(&self) -> bool {
        self.shared().client_gone
    }

    /// The client closed its side (or its connection broke): bodies that
    /// will never come are cut now, whole requests keep their exchange.
    pub(super) fn client_left(&self) {
        let mut shared = self.shared();
        shared.client_gone = true;
        let incomplete: Vec<u32> = shared
            .streams
            .iter()
            .filter(|(_, s)| !s.whole)
            .map(|(&id, _)| id)
            .collect();
        for id in incomplete {
            shared.streams.remove(&id);
            shared.inbound.extend(reset_frame(id, CANCEL));
        }
    }

    /// `waker` is called when the h2 server has more to read.
    pub(super) fn wake_on_inbound(&self, waker: &Waker) {
        self.shared().reader = Some(waker.clone());
    }

    /// Moves up to `buf.len()` bytes meant for the h2 server ahead of what
    /// is read (only ever between two of the client's frames); how many.
    /// `waker` is called when more come.
    pub(super) fn pending_inbound(&self, buf: &mut [u8], waker: &Waker) -> usize {
        let mut shared = self.shared();
        shared.reader = Some(waker.clone());
        let n = buf.len().min(shared.inbound.len());
        for (slot, byte) in buf.iter_mut().zip(shared.inbound.drain(..n)) {
            *slot = byte;
        }
        n
    }

    /// The resets owed to the client, taken to be written.
    pub(super) fn take_outbound(&self) -> Vec<u8> {
        std::mem::take(&mut self.shared().outbound)
    }

    pub(super) fn has_inbound(&self) -> bool {
        !self.shared().inbound.is_empty()
    }

    /// Cuts late bodies and lets go of resets held too long; the next
    /// instant this must run again.
    pub(super) fn tick(&self, now: Instant) -> Option<Instant> {
        let mut shared = self.shared();
        let mut next: Option<Instant> = None;
        let mut late = Vec::new();
        let mut released = Vec::new();
        for (&id, stream) in &shared.streams {
            if let Some(due) = stream.body_due(self.header_timeout) {
                if due <= now {
                    late.push(id);
                    continue;
                }
                next = Some(next.map_or(due, |n| n.min(due)));
            }
            if let Some((_, since)) = &stream.held {
                let until = *since + self.hold_limit;
                if until <= now {
                    released.push(id);
                } else {
                    next = Some(next.map_or(until, |n| n.min(until)));
                }
            }
        }
        for id in late {
            shared.streams.remove(&id);
            shared.inbound.extend(reset_frame(id, CANCEL));
            shared.outbound.extend(reset_frame(id, CANCEL));
            shared.cut.push(id);
        }
        for id in released {
            if let Some(stream) = shared.streams.remove(&id) {
                if let Some((frame, _)) = stream.held {
                    shared.inbound.extend(frame);
                }
            }
        }
        next
    }

    fn wake_reader(shared: &mut Shared) {
        if let Some(waker) = shared.reader.take() {
            waker.wake();
        }
    }

    /// A frame head from the client, before it is passed on: what it tells
    /// of its stream. Returns whether the frame is the last of a stream's
    /// first header block (its END_HEADERS is then cleared, and the header
    /// naming the stream follows it).
    fn client_frame(
        &self,
        kind: u8,
        flags: u8,
        id: u32,
        len: usize,
        block: &mut Option<u32>,
    ) -> bool {
        let mut shared = self.shared();
        let now = Instant::now();
        match kind {
            HEADERS => {
                let opens = id % 2 == 1 && id > shared.highest;
                if opens {
                    shared.highest = id;
                    if shared.streams.len() < MOST_STREAMS {
                        shared.streams.insert(
                            id,
                            Stream {
                                opened: now,
                                body_bytes: 0,
                                whole: flags & END_STREAM != 0,
                                answered: false,
                                held: None,
                                floor: true,
                                deadline: None,
                            },
                        );
                        *block = Some(id);
                    }
                } else if flags & END_STREAM != 0 {
                    // Trailers end the request.
                    if let Some(stream) = shared.streams.get_mut(&id) {
                        stream.whole = true;
                    }
                }
                if flags & END_HEADERS != 0 {
                    return block.take() == Some(id) && opens;
                }
            }
            CONTINUATION if flags & END_HEADERS != 0 => return block.take() == Some(id),
            DATA => {
                if let Some(stream) = shared.streams.get_mut(&id) {
                    stream.body_bytes += len as u64;
                    if flags & END_STREAM != 0 {
                        stream.whole = true;
                    }
                }
            }
            _ => {}
        }
        false
    }

    /// The client's reset of a stream: held while the stream's whole request
    /// waits for its answer (true), passed on otherwise.
    fn client_reset(&self, id: u32, frame: [u8; FRAME_HEAD + 4]) -> bool {
        let mut shared = self.shared();
        match shared.streams.get_mut(&id) {
            Some(stream) if stream.whole && !stream.answered && stream.held.is_none() => {
                stream.held = Some((frame, Instant::now()));
                true
            }
            _ => {
                shared.streams.remove(&id);
                false
            }
        }
    }

    /// A frame head the server wrote: HEADERS answers a stream (a reset
    /// ends it); a reset held for it goes to the h2 server now.
    fn server_frame(&self, kind: u8, id: u32) {
        if kind != HEADERS && kind != RST_STREAM {
            return;
        }
        let mut shared = self.shared();
        let Some(stream) = shared.streams.get_mut(&id) else {
            return;
        };
        stream.answered = true;
        let done = stream.whole || stream.held.is_some() || kind == RST_STREAM;
        let held = stream.held.take();
        if done {
            shared.streams.remove(&id);
        }
        if let Some((frame, _)) = held {
            shared.inbound.extend(frame);
        }
        if held.is_some() || shared.client_gone {
            Self::wake_reader(&mut shared);
        }
    }

    fn set(&self, id: u32, change: impl FnOnce(&mut Stream)) {
        let mut shared = self.shared();
        if let Some(stream) = shared.streams.get_mut(&id) {
            change(stream);
            // The reader re-arms its timer for the new deadline.
            Self::wake_reader(&mut shared);
        }
    }
}

impl Drop for H2Watch {
    fn drop(&mut self) {
        lock(&WATCHES).remove(&self.id);
    }
}

/// A request's stream on its connection's watch.
pub struct H2Stream {
    watch: Arc<H2Watch>,
    id: u32,
}

impl H2Stream {
    /// The stream an HTTP/2 request's headers name: the last value of
    /// `STREAM_HEADER`, the one the watch appended (a client's own go
    /// before it; the gateway removes them all).
    pub fn named(headers: &http::HeaderMap) -> Option<H2Stream> {
        let value = headers.get_all(STREAM_HEADER).iter().next_back()?;
        let (watch, id) = value.to_str().ok()?.split_once(':')?;
        let (watch, id) = (u64::from_str_radix(watch, 16).ok()?, id.parse().ok()?);
        let watch = lock(&WATCHES).get(&watch)?.upgrade()?;
        Some(H2Stream { watch, id })
    }

    /// Whether the stream's request is whole and still waits for its answer
    /// (as a stream whose connection broke before it came does).
    pub fn whole_and_unanswered(&self) -> bool {
        self.watch
            .shared()
            .streams
            .get(&self.id)
            .is_some_and(|s| s.whole && !s.answered)
    }

    /// The route's body may rightly be slow and long (a client-streaming
    /// gRPC call): no floor.
    pub fn exempt_from_body_floor(&self) {
        self.watch.set(self.id, |s| s.floor = false);
    }

    /// The whole body must have come by `until` (a request holding slots).
    pub fn body_deadline(&self, until: Instant) {
        self.watch.set(self.id, |s| {
            s.deadline = Some(s.deadline.map_or(until, |d| d.min(until)));
        });
    }
}

/// A reset of `id` as the client would send it.
fn reset_frame(id: u32, code: u32) -> [u8; FRAME_HEAD + 4] {
    let mut frame = [0u8; FRAME_HEAD + 4];
    frame[2] = 4;
    frame[3] = RST_STREAM;
    frame[5..9].copy_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
    frame[9..].copy_from_slice(&code.to_be_bytes());
    frame
}

/// The CONTINUATION frame that ends stream `id`'s first header block with
/// the header naming it: a literal field without indexing, new name (RFC
/// 7541 §6.2.2), which leaves the decoder's table as it was.
fn naming_frame(watch: u64, id: u32) -> Vec<u8> {
    let value = format!("{watch:x}:{id}");
    let mut field = vec![0x00, STREAM_HEADER.len() as u8];
    field.extend_from_slice(STREAM_HEADER.as_bytes());
    field.push(value.len() as u8);
    field.extend_from_slice(value.as_bytes());
    let mut frame = Vec::with_capacity(FRAME_HEAD + field.len());
    frame.extend_from_slice(&(field.len() as u32).to_be_bytes()[1..]);
    frame.push(CONTINUATION);
    frame.push(END_HEADERS);
    frame.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
    frame.extend_from_slice(&field);
    frame
}

fn frame_head(head: &[u8; FRAME_HEAD]) -> (usize, u8, u8, u32) {
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    (len, head[3], head[4], id)
}

/// The client's frames as they are read: passed on, held (a reset), or
/// added to (the naming header).
pub(super) struct ClientFrames {
    watch: Arc<H2Watch>,
    preface_left: usize,
    head: [u8; FRAME_HEAD],
    head_len: usize,
    payload_left: usize,
    /// A reset being read: its bytes so far.
    reset: Option<([u8; FRAME_HEAD + 4], usize)>,
    /// The stream whose naming header follows the current frame.
    name_after: Option<u32>,
    /// The stream whose first header block is being read.
    block: Option<u32>,
}

impl ClientFrames {
    pub(super) fn new(watch: Arc<H2Watch>) -> ClientFrames {
        ClientFrames {
            watch,
            preface_left: PREFACE_LEN,
            head: [0; FRAME_HEAD],
            head_len: 0,
            payload_left: 0,
            reset: None,
            name_after: None,
            block: None,
        }
    }

    pub(super) fn watch(&self) -> &Arc<H2Watch> {
        &self.watch
    }

    /// Between two of the client's frames, as the h2 server has been given
    /// them: where a frame of the watch's own may go in.
    pub(super) fn between_frames(&self) -> bool {
        self.preface_left == 0 && self.payload_left == 0
    }

    /// The stream whose frame the h2 server has been given part of.
    pub(super) fn inside_frame_of(&self) -> Option<u32> {
        (self.payload_left > 0).then(|| frame_head(&self.head).3)
    }

    /// What of `input` goes on to the h2 server, appended to `out`.
    pub(super) fn read(&mut self, mut input: &[u8], out: &mut Vec<u8>) {
        while !input.is_empty() {
            if self.preface_left > 0 {
                let n = self.preface_left.min(input.len());
                out.extend_from_slice(&input[..n]);
                self.preface_left -= n;
                input = &input[n..];
            } else if let Some((frame, filled)) = &mut self.reset {
                let n = (frame.len() - *filled).min(input.len());
                frame[*filled..*filled + n].copy_from_slice(&input[..n]);
                *filled += n;
                input = &input[n..];
                if *filled == frame.len() {
                    let frame = *frame;
                    self.reset = None;
                    let (_, _, _, id) = frame_head(&[
                        frame[0], frame[1], frame[2], frame[3], frame[4], frame[5], frame[6],
                        frame[7], frame[8],
                    ]);
                    if !self.watch.client_reset(id, frame) {
                        out.extend_from_slice(&frame);
                    }
                }
            } else if self.payload_left > 0 {
                let n = self.payload_left.min(input.len());
                out.extend_from_slice(&input[..n]);
                self.payload_left -= n;
                input = &input[n..];
                if self.payload_left == 0 {
                    self.frame_done(out);
                }
            } else {
                let n = (FRAME_HEAD - self.head_len).min(input.len());
                self.head[self.head_len..self.head_len + n].copy_from_slice(&input[..n]);
                self.head_len += n;
                input = &input[n..];
                if self.head_len == FRAME_HEAD {
                    self.head_len = 0;
                    self.frame_started(out);
                }
            }
        }
    }

    fn frame_started(&mut self, out: &mut Vec<u8>) {
        let (len, kind, flags, id) = frame_head(&self.head);
        if kind == RST_STREAM && len == 4 {
            let mut frame = [0u8; FRAME_HEAD + 4];
            frame[..FRAME_HEAD].copy_from_slice(&self.head);
            self.reset = Some((frame, FRAME_HEAD));
            return;
        }
        if self
            .watch
            .client_frame(kind, flags, id, len, &mut self.block)
        {
            // The block goes on in the frame that names the stream.
            self.head[4] &= !END_HEADERS;
            self.name_after = Some(id);
        }
        out.extend_from_slice(&self.head);
        self.payload_left = len;
        if len == 0 {
            self.frame_done(out);
        }
    }

    fn frame_done(&mut self, out: &mut Vec<u8>) {
        if let Some(id) = self.name_after.take() {
            out.extend_from_slice(&naming_frame(self.watch.id, id));
        }
    }
}

/// The server's frames as they are written: only read, for the answers.
pub(super) struct ServerFrames {
    watch: Arc<H2Watch>,
    head: [u8; FRAME_HEAD],
    head_len: usize,
    payload_left: usize,
}

impl ServerFrames {
    /// Between two frames: a frame of the watch's own may go out here.
    pub(super) fn between_frames(&self) -> bool {
        self.head_len == 0 && self.payload_left == 0
    }
}

impl ServerFrames {
    pub(super) fn new(watch: Arc<H2Watch>) -> ServerFrames {
        ServerFrames {
            watch,
            head: [0; FRAME_HEAD],
            head_len: 0,
            payload_left: 0,
        }
    }

    /// `written`, as it went to the client (or nowhere, once it is gone).
    pub(super) fn wrote(&mut self, mut written: &[u8]) {
        while !written.is_empty() {
            if self.payload_left > 0 {
                let n = self.payload_left.min(written.len());
                self.payload_left -= n;
                written = &written[n..];
                continue;
            }
            let n = (FRAME_HEAD - self.head_len).min(written.len());
            self.head[self.head_len..self.head_len + n].copy_from_slice(&written[..n]);
            self.head_len += n;
            written = &written[n..];
            if self.head_len == FRAME_HEAD {
                self.head_len = 0;
                let (len, kind, _, id) = frame_head(&self.head);
                self.payload_left = len;
                self.watch.server_frame(kind, id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, id: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.push(kind);
        f.push(flags);
        f.extend_from_slice(&id.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn preface() -> Vec<u8> {
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec()
    }

    /// Everything read, fed byte by byte: frames cut anywhere read alike.
    fn read_all(frames: &mut ClientFrames, input: &[u8], by_byte: bool) -> Vec<u8> {
        let mut out = Vec::new();
        if by_byte {
            for b in input {
                frames.read(std::slice::from_ref(b), &mut out);
            }
        } else {
            frames.read(input, &mut out);
        }
        out
    }

    #[test]
    fn a_reset_of_a_whole_request_waits_for_its_answer() {
        for by_byte in [false, true] {
            let watch = H2Watch::new(Duration::from_secs(10), Duration::from_secs(60));
            let mut client = ClientFrames::new(watch.clone());
            let mut server = ServerFrames::new(watch.clone());
            let mut input = preface();
            input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x82"));
            input.extend(frame(RST_STREAM, 0, 1, &CANCEL.to_be_bytes()));
            input.extend(frame(HEADERS, END_HEADERS, 3, b"\x83"));
            input.extend(frame(RST_STREAM, 0, 3, &CANCEL.to_be_bytes()));
            let out = read_all(&mut client, &input, by_byte);
            let mut expected = preface();
            // Stream 1's block gets the naming frame; its reset is held.
            expected.extend(frame(HEADERS, END_STREAM, 1, b"\x82"));
            expected.extend(naming_frame(watch.id, 1));
            // Stream 3's request was not whole: its reset goes on.
            expected.extend(frame(HEADERS, 0, 3, b"\x83"));
            expected.extend(naming_frame(watch.id, 3));
            expected.extend(frame(RST_STREAM, 0, 3, &CANCEL.to_be_bytes()));
            assert_eq!(out, expected, "by byte: {by_byte}");
            let waker = Waker::noop();
            let mut buf = [0u8; 64];
            assert_eq!(watch.pending_inbound(&mut buf, waker), 0);
            // The answer's head goes out: the reset follows it in.
            server.wrote(&frame(HEADERS, END_HEADERS, 1, b"\x88")[..5]);
            assert_eq!(watch.pending_inbound(&mut buf, waker), 0);
            server.wrote(&frame(HEADERS, END_HEADERS, 1, b"\x88")[5..]);
            let n = watch.pending_inbound(&mut buf, waker);
            assert_eq!(
                &buf[..n],
                &frame(RST_STREAM, 0, 1, &CANCEL.to_be_bytes())[..]
            );
            assert!(watch.shared().streams.is_empty());
        }
    }

    #[test]
    fn the_stream_is_named_once_after_its_whole_first_block() {
        let watch = H2Watch::new(Duration::from_secs(10), Duration::from_secs(60));
        let mut client = ClientFrames::new(watch.clone());
        let mut input = preface();
        input.extend(frame(HEADERS, 0, 5, b"\x82"));
        input.extend(frame(CONTINUATION, END_HEADERS, 5, b"\x84"));
        input.extend(frame(DATA, 0, 5, b"abc"));
        // Trailers: no name.
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 5, b"\x40"));
        let out = read_all(&mut client, &input, true);
        let mut expected = preface();
        expected.extend(frame(HEADERS, 0, 5, b"\x82"));
        expected.extend(frame(CONTINUATION, 0, 5, b"\x84"));
        expected.extend(naming_frame(watch.id, 5));
        expected.extend(frame(DATA, 0, 5, b"abc"));
        expected.extend(frame(HEADERS, END_HEADERS | END_STREAM, 5, b"\x40"));
        assert_eq!(out, expected);
        let stream = &watch.shared().streams[&5];
        assert!(stream.whole);
        assert_eq!(stream.body_bytes, 3);
        let mut headers = http::HeaderMap::new();
        headers.append(STREAM_HEADER, "forged:7".parse().unwrap());
        headers.append(STREAM_HEADER, format!("{:x}:5", watch.id).parse().unwrap());
        let named = H2Stream::named(&headers).expect("named");
        assert_eq!(named.id, 5);
    }

    #[test]
    fn a_late_body_is_cut_and_a_gone_client_waits_for_its_answers() {
        let watch = H2Watch::new(Duration::from_secs(1), Duration::from_secs(60));
        let mut client = ClientFrames::new(watch.clone());
        let mut input = preface();
        input.extend(frame(HEADERS, END_HEADERS, 1, b"\x82"));
        input.extend(frame(HEADERS, END_HEADERS, 3, b"\x82"));
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 5, b"\x82"));
        read_all(&mut client, &input, false);
        let start = Instant::now();
        // Stream 3 holds a slot: its body is due in 100 ms.
        H2Stream {
            watch: watch.clone(),
            id: 3,
        }
        .body_deadline(start + Duration::from_millis(100));
        let next = watch.tick(start);
        assert!(next.is_some_and(|n| n <= start + Duration::from_millis(100)));
        watch.tick(start + Duration::from_millis(150));
        let mut buf = [0u8; 64];
        let n = watch.pending_inbound(&mut buf, Waker::noop());
        assert_eq!(&buf[..n], &reset_frame(3, CANCEL)[..]);
        assert_eq!(watch.take_cut(), vec![3]);
        // The client goes: stream 1's body will never come (cut); stream
        // 5's whole request keeps the reads open until it is answered.
        watch.client_left();
        let n = watch.pending_inbound(&mut buf, Waker::noop());
        assert_eq!(&buf[..n], &reset_frame(1, CANCEL)[..]);
        assert!(!watch.finished());
        ServerFrames::new(watch.clone()).wrote(&frame(HEADERS, END_HEADERS, 5, b"\x88"));
        assert!(watch.finished());
    }
}
