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
//! that does not come in time is cut: at the body floor (`MIN_BODY_RATE`
//! after a grace of `header_timeout`, counted from the stream's head)
//! unless the route is exempt, and at the deadline of a request that holds
//! a slot. A cut is a PRIORITY frame making the stream depend on itself,
//! given to the h2 server as if the client had sent it: a stream error the
//! h2 server answers itself, resetting the stream towards the client and
//! discarding its late frames, so the connection's other streams go on.
//!
//! Requests learn their stream: the first header block of each stream gets
//! one more header, `floodgate-h2-stream: <watch>:<stream>`, appended as a
//! CONTINUATION frame (a literal the HPACK decoder reads without touching
//! its table), which the gateway reads and removes (`H2Stream::named`).
//! The watch's own frames go in only between two of the client's; a
//! client that keeps a frame half sent longer than its length at the body
//! floor allows loses the connection.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::task::Waker;
use std::time::Duration;

use pingora::protocols::SocketDigest;
use tokio::time::Instant;

use log::debug;

use super::clock::MIN_BODY_RATE;
use super::hpack_bounds::HpackBounds;

/// The header a stream's first header block carries to its request.
pub const STREAM_HEADER: &str = "floodgate-h2-stream";
/// The same, as a name a header map looks up without parsing it again.
pub static STREAM_HEADER_NAME: http::HeaderName = http::HeaderName::from_static(STREAM_HEADER);

const PREFACE_LEN: usize = 24;
const FRAME_HEAD: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY_FLAG: u8 = 0x20;

/// Streams followed at once on one connection, far above what the h2
/// server lets a client open (those it refuses are answered at once); a
/// stream beyond it is cut as it opens.
const MOST_STREAMS: usize = 1024;

/// The maps looked up on every frame and request: SipHash, the standard
/// map's, cost about a fifth of what the watch does per request. Stream ids
/// are the client's to choose, so the seed is still random per map.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

static WATCHES: LazyLock<Mutex<FastMap<u64, Weak<H2Watch>>>> =
    LazyLock::new(|| Mutex::new(FastMap::default()));

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One connection's streams, shared by its stream (which reads and writes
/// the frames) and its requests (which say what their bodies owe).
pub struct H2Watch {
    id: u64,
    /// The connection's socket as Pingora describes it to each of its
    /// requests: a request names a stream of this watch only if it came on
    /// this connection.
    socket: Option<Arc<SocketDigest>>,
    header_timeout: Duration,
    /// The longest a reset is held for an answer: past it the upstream has
    /// given up anyway (its read timeout).
    hold_limit: Duration,
    /// Whether `inbound` holds anything, read without the lock on every
    /// frame.
    inbound_waiting: AtomicBool,
    /// `Shared::client_gone`, read without the lock on every read.
    gone: AtomicBool,
    shared: Mutex<Shared>,
}

#[derive(Default)]
struct Shared {
    streams: FastMap<u32, Stream>,
    /// The highest client stream opened: a HEADERS frame above it opens one.
    highest: u32,
    /// Frames for the h2 server before anything more is read: resets let
    /// go, cuts.
    inbound: VecDeque<u8>,
    /// The connection's reading task, to wake when `inbound` grows.
    reader: Option<Waker>,
    /// The client closed its side: reads end once every whole request is
    /// answered, and writes go nowhere meanwhile.
    client_gone: bool,
    /// Streams cut for a late body (for the metric, and for the stream
    /// whose frame the client stopped sending halfway).
    cut: Vec<u32>,
}

#[expect(
    clippy::struct_excessive_bools,
    reason = "a stream's request and response move on independently, and either side may reset it at any point: no one kind holds both halves"
)]
struct Stream {
    opened: Instant,
    body_bytes: u64,
    /// The client sent END_STREAM: the request is whole.
    whole: bool,
    /// The server sent the response's head.
    answered: bool,
    /// The server ended its response (or reset the stream).
    response_ended: bool,
    /// The server reset the stream: nothing more comes on it.
    server_reset: bool,
    /// The server reset the stream while its whole request waited for its
    /// answer (a stream error the client provoked): the upstream works on.
    reset_while_whole: bool,
    /// The client reset it and the reset went on (its request was not
    /// whole, or already answered).
    client_reset: bool,
    /// Cut here for a late body.
    cut: bool,
    /// A request holds the stream (`H2Stream`): its entry stays until then.
    claimed: bool,
    /// The client's reset, held until the answer, and since when.
    held: Option<([u8; FRAME_HEAD + 4], Instant)>,
    /// Whether the body floor applies (not on a route the config exempts).
    floor: bool,
    /// A slot holder's deadline for its whole body.
    deadline: Option<Instant>,
}

impl Stream {
    /// Whether the request may still send body (an answered request may:
    /// its stream is held until the body ends, so the floor still counts).
    fn receiving(&self) -> bool {
        !self.whole && !self.cut && !self.client_reset && !self.server_reset
    }

    fn body_due(&self, header_timeout: Duration) -> Option<Instant> {
        if !self.receiving() {
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

    /// Whether nothing more can happen on the stream that the watch must
    /// follow: answered in full, or reset, with its request whole or gone.
    fn over(&self) -> bool {
        !self.claimed
            && self.held.is_none()
            && (self.client_reset
                || self.cut
                || self.server_reset
                || (self.whole && self.response_ended))
    }

    /// A whole request whose answer never came through: its exchange was
    /// cut (or still runs).
    fn whole_unanswered(&self) -> bool {
        self.whole && !self.cut && (!self.answered || self.reset_while_whole)
    }
}

impl H2Watch {
    pub fn new(
        socket: Option<Arc<SocketDigest>>,
        header_timeout: Duration,
        hold_limit: Duration,
    ) -> Arc<H2Watch> {
        let mut registry = lock(&WATCHES);
        let id = loop {
            let mut bytes = [0u8; 8];
            // Without the system's randomness, a counter's next value: the
            // loop must end, under the registry's lock.
            let id = match getrandom::fill(&mut bytes) {
                Ok(()) => u64::from_le_bytes(bytes),
                Err(_) => NEXT_ID.fetch_add(1, Ordering::Relaxed),
            };
            if id != 0 && !registry.contains_key(&id) {
                break id;
            }
        };
        let watch = Arc::new(H2Watch {
            id,
            socket,
            header_timeout,
            hold_limit,
            inbound_waiting: AtomicBool::new(false),
            gone: AtomicBool::new(false),
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
            && !shared
                .streams
                .values()
                .any(|s| s.whole && !s.answered && !s.response_ended)
    }

    pub(super) fn client_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// The client closed its side (or its connection broke): bodies that
    /// will never come are cut now, whole requests keep their exchange.
    pub(super) fn client_left(&self) {
        let mut shared = self.shared();
        shared.client_gone = true;
        self.gone.store(true, Ordering::Release);
        let incomplete: Vec<u32> = shared
            .streams
            .iter()
            .filter(|(_, s)| s.receiving())
            .map(|(&id, _)| id)
            .collect();
        for id in incomplete {
            Self::cut_stream(&mut shared, id);
        }
        self.note_inbound(&shared);
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
        self.note_inbound(&shared);
        n
    }

    /// Everything meant for the h2 server, appended to `out` (the client's
    /// frames are between two frames there).
    fn drain_inbound(&self, out: &mut Vec<u8>) {
        if !self.inbound_waiting.load(Ordering::Acquire) {
            return;
        }
        let mut shared = self.shared();
        out.extend(shared.inbound.drain(..));
        self.note_inbound(&shared);
    }

    fn note_inbound(&self, shared: &Shared) {
        self.inbound_waiting
            .store(!shared.inbound.is_empty(), Ordering::Release);
    }

    pub(super) fn has_inbound(&self) -> bool {
        self.inbound_waiting.load(Ordering::Acquire)
    }

    /// Cuts late bodies and lets go of resets held too long; the next
    /// instant this must run again. `waker` is called when the h2 server
    /// has more to read.
    pub(super) fn tick(&self, now: Instant, waker: &Waker) -> Option<Instant> {
        let mut shared = self.shared();
        if !shared.reader.as_ref().is_some_and(|w| w.will_wake(waker)) {
            shared.reader = Some(waker.clone());
        }
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
            Self::cut_stream(&mut shared, id);
            shared.cut.push(id);
        }
        for id in released {
            if let Some(stream) = shared.streams.get_mut(&id) {
                if let Some((frame, _)) = stream.held.take() {
                    stream.client_reset = true;
                    shared.inbound.extend(frame);
                }
            }
            Self::forget_if_over(&mut shared, id);
        }
        self.note_inbound(&shared);
        next
    }

    /// The stream reset by the h2 server itself, for a stream error it was
    /// handed (a PRIORITY on the stream, depending on itself): the server
    /// tells the client, and discards what the client still sends for it.
    fn cut_stream(shared: &mut Shared, id: u32) {
        shared.inbound.extend(self_dependency(id));
        if let Some(stream) = shared.streams.get_mut(&id) {
            stream.cut = true;
        }
        Self::forget_if_over(shared, id);
    }

    fn forget_if_over(shared: &mut Shared, id: u32) {
        if shared.streams.get(&id).is_some_and(Stream::over) {
            shared.streams.remove(&id);
        }
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
                                response_ended: false,
                                server_reset: false,
                                reset_while_whole: false,
                                client_reset: false,
                                cut: false,
                                claimed: false,
                                held: None,
                                floor: true,
                                deadline: None,
                            },
                        );
                        *block = Some(id);
                    } else {
                        // Too many followed at once: not let run untracked.
                        shared.inbound.extend(self_dependency(id));
                        self.note_inbound(&shared);
                    }
                } else if flags & END_STREAM != 0 {
                    // Trailers end the request.
                    if let Some(stream) = shared.streams.get_mut(&id) {
                        stream.whole = true;
                    }
                    Self::forget_if_over(&mut shared, id);
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
                if flags & END_STREAM != 0 {
                    Self::forget_if_over(&mut shared, id);
                }
            }
            _ => {}
        }
        false
    }

    /// The client's reset of a stream: held while the stream's whole request
    /// waits for its answer (true), and so is a second one while the first
    /// is held; passed on otherwise.
    fn client_reset(&self, id: u32, frame: [u8; FRAME_HEAD + 4]) -> bool {
        let mut shared = self.shared();
        let Some(stream) = shared.streams.get_mut(&id) else {
            return false;
        };
        if stream.held.is_some() {
            return true;
        }
        if stream.whole && !stream.answered && !stream.response_ended {
            stream.held = Some((frame, Instant::now()));
            return true;
        }
        stream.client_reset = true;
        Self::forget_if_over(&mut shared, id);
        false
    }

    /// A frame head the server wrote: HEADERS answers a stream, END_STREAM
    /// ends its response, a reset ends it all; a reset held for it goes to
    /// the h2 server now.
    fn server_frame(&self, kind: u8, flags: u8, id: u32) {
        if !matches!(kind, HEADERS | DATA | RST_STREAM) {
            return;
        }
        let mut shared = self.shared();
        let Some(stream) = shared.streams.get_mut(&id) else {
            return;
        };
        match kind {
            RST_STREAM => {
                if stream.whole && !stream.answered {
                    stream.reset_while_whole = true;
                }
                stream.response_ended = true;
                stream.server_reset = true;
            }
            HEADERS => stream.answered = true,
            _ => {}
        }
        if flags & END_STREAM != 0 && kind != RST_STREAM {
            stream.response_ended = true;
        }
        let released = if stream.answered || kind == RST_STREAM {
            stream.held.take()
        } else {
            None
        };
        if released.is_some() {
            stream.client_reset = true;
        }
        Self::forget_if_over(&mut shared, id);
        if let Some((frame, _)) = &released {
            shared.inbound.extend(*frame);
        }
        self.note_inbound(&shared);
        if released.is_some() || shared.client_gone {
            Self::wake_reader(&mut shared);
        }
    }

    fn with_stream(&self, id: u32, change: impl FnOnce(&mut Stream)) {
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

/// The value of `STREAM_HEADER` that names a request's stream: the last,
/// the one the watch appended (a client's own go before it; the gateway
/// removes them all).
pub fn stream_header(headers: &http::HeaderMap) -> Option<&http::HeaderValue> {
    headers.get_all(&STREAM_HEADER_NAME).iter().next_back()
}

/// A request's stream on its connection's watch.
pub struct H2Stream {
    watch: Arc<H2Watch>,
    id: u32,
}

impl H2Stream {
    /// The stream a request's `STREAM_HEADER` value (`stream_header`) names,
    /// if it is a stream of the request's own connection (`socket`, its
    /// digest's) that no other request holds.
    pub fn named(
        value: &http::HeaderValue,
        socket: Option<&Arc<SocketDigest>>,
    ) -> Option<H2Stream> {
        let (watch, id) = value.to_str().ok()?.split_once(':')?;
        let (watch, id) = (u64::from_str_radix(watch, 16).ok()?, id.parse().ok()?);
        let watch = lock(&WATCHES).get(&watch)?.upgrade()?;
        let same_connection = match (&watch.socket, socket) {
            (Some(own), Some(request)) => Arc::ptr_eq(own, request),
            (None, None) => true,
            _ => false,
        };
        if !same_connection {
            return None;
        }
        let stream = watch.shared().streams.get_mut(&id).map(|stream| {
            let free = !stream.claimed;
            stream.claimed = true;
            free
        });
        stream
            .is_some_and(|free| free)
            .then_some(H2Stream { watch, id })
    }

    /// Whether the stream's request is whole and its exchange was cut
    /// before the answer came (its connection torn down, or reset by the h2
    /// server for an error the client provoked): the upstream may still be
    /// working on it.
    pub fn cut_while_whole(&self) -> bool {
        self.watch
            .shared()
            .streams
            .get(&self.id)
            .is_some_and(Stream::whole_unanswered)
    }

    /// The route's body may rightly be slow and long (a client-streaming
    /// gRPC call): no floor.
    pub fn exempt_from_body_floor(&self) {
        self.watch.with_stream(self.id, |s| s.floor = false);
    }

    /// The whole body must have come by `until` (a request holding slots).
    pub fn body_deadline(&self, until: Instant) {
        self.watch.with_stream(self.id, |s| {
            s.deadline = Some(s.deadline.map_or(until, |d| d.min(until)));
        });
    }
}

impl Drop for H2Stream {
    /// The request is over: the stream is the watch's to forget once
    /// nothing more happens on it.
    fn drop(&mut self) {
        let mut shared = self.watch.shared();
        if let Some(stream) = shared.streams.get_mut(&self.id) {
            stream.claimed = false;
            if stream.held.is_none() {
                shared.streams.remove(&self.id);
            }
        }
    }
}

/// A PRIORITY frame making stream `id` depend on itself: a stream error
/// (RFC 9113 §5.3.1) the h2 server answers by resetting the stream.
fn self_dependency(id: u32) -> [u8; FRAME_HEAD + 5] {
    let id = id & 0x7fff_ffff;
    let mut frame = [0u8; FRAME_HEAD + 5];
    frame[2] = 5;
    frame[3] = PRIORITY;
    frame[5..9].copy_from_slice(&id.to_be_bytes());
    frame[9..13].copy_from_slice(&id.to_be_bytes());
    frame
}

/// The CONTINUATION frame that ends stream `id`'s first header block with
/// the header naming it: a literal field without indexing, new name (RFC
/// 7541 §6.2.2), which leaves the decoder's table as it was.
fn naming_frame(watch: u64, id: u32, out: &mut Vec<u8>) {
    // The value, `<watch hex>:<stream>`, at most 16 + 1 + 10 bytes.
    let mut value = [0u8; 27];
    let mut len = 0;
    for shift in (0..16).rev() {
        let digit = ((watch >> (shift * 4)) & 0xf) as u8;
        if digit != 0 || len > 0 || shift == 0 {
            value[len] = b"0123456789abcdef"[digit as usize];
            len += 1;
        }
    }
    value[len] = b':';
    len += 1;
    let mut digits = itoa::Buffer::new();
    let id_text = digits.format(id & 0x7fff_ffff).as_bytes();
    value[len..len + id_text.len()].copy_from_slice(id_text);
    len += id_text.len();
    let field_len = 2 + STREAM_HEADER.len() + 1 + len;
    out.extend_from_slice(&(field_len as u32).to_be_bytes()[1..]);
    out.push(CONTINUATION);
    out.push(END_HEADERS);
    out.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(&[0x00, STREAM_HEADER.len() as u8]);
    out.extend_from_slice(STREAM_HEADER.as_bytes());
    out.push(len as u8);
    out.extend_from_slice(&value[..len]);
}

/// An empty CONTINUATION ending stream `id`'s header block as the client
/// left it.
fn unnamed_block_end(id: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&[0, 0, 0, CONTINUATION, END_HEADERS]);
    out.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
}

fn frame_head(head: &[u8]) -> (usize, u8, u8, u32) {
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    (len, head[3], head[4], id)
}

/// The client's frames as they are read: passed on, held (a reset), or
/// added to (the naming header, and between two frames what the watch has
/// for the h2 server).
pub(super) struct ClientFrames {
    watch: Arc<H2Watch>,
    preface_left: usize,
    head: [u8; FRAME_HEAD],
    head_len: usize,
    payload_left: usize,
    /// When the frame being passed on began, and by when it must be whole.
    inside_until: Option<Instant>,
    /// A reset being read: its bytes so far.
    reset: Option<([u8; FRAME_HEAD + 4], usize)>,
    /// The stream whose naming header follows the current frame.
    name_after: Option<u32>,
    /// The stream whose first header block is being read.
    block: Option<u32>,
    /// A header block the client has begun and not ended, and since when:
    /// the h2 server takes no other frame until it ends.
    open_block: Option<(u32, Instant)>,
    /// Where the fields of the first block being read begin and end.
    bounds: HpackBounds,
    /// The current frame's payload belongs to that block: which of its
    /// bytes are the block's.
    fragment: Option<Fragment>,
}

/// A header frame's payload around its block fragment (RFC 9113 §6.2):
/// a pad length and a priority before it, padding after it.
#[derive(Clone, Copy)]
struct Fragment {
    /// The next byte is the pad length.
    pad_length_next: bool,
    /// Priority bytes still before the fragment.
    skip: usize,
    /// Padding bytes at the payload's end.
    padding: usize,
}

impl ClientFrames {
    pub(super) fn new(watch: Arc<H2Watch>) -> ClientFrames {
        ClientFrames {
            watch,
            preface_left: PREFACE_LEN,
            head: [0; FRAME_HEAD],
            head_len: 0,
            payload_left: 0,
            inside_until: None,
            reset: None,
            name_after: None,
            block: None,
            open_block: None,
            bounds: HpackBounds::default(),
            fragment: None,
        }
    }

    pub(super) fn watch(&self) -> &Arc<H2Watch> {
        &self.watch
    }

    /// Between two of the client's frames, as the h2 server has been given
    /// them: where a frame of the watch's own may go in.
    pub(super) fn between_frames(&self) -> bool {
        self.preface_left == 0 && self.payload_left == 0 && self.open_block.is_none()
    }

    /// The stream whose frame (or header block) the h2 server has been
    /// given part of, and by when the rest must have come: a frame's
    /// length at the body floor after a grace of `header_timeout`, a
    /// block within `header_timeout` of its first frame.
    pub(super) fn inside_frame(&self) -> Option<(u32, Instant)> {
        let frame = self
            .inside_until
            .filter(|_| self.payload_left > 0)
            .map(|until| (frame_head(&self.head).3, until));
        let block = self
            .open_block
            .map(|(id, since)| (id, since + self.watch.header_timeout));
        match (frame, block) {
            (Some(f), Some(b)) => Some(if b.1 < f.1 { b } else { f }),
            (f, b) => f.or(b),
        }
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
                    let (_, _, _, id) = frame_head(&frame);
                    if !self.watch.client_reset(id, frame) {
                        out.extend_from_slice(&frame);
                    }
                }
            } else if self.payload_left > 0 {
                let n = self.payload_left.min(input.len());
                out.extend_from_slice(&input[..n]);
                if self.fragment.is_some() {
                    self.read_fragment(&input[..n]);
                }
                self.payload_left -= n;
                input = &input[n..];
                if self.payload_left == 0 {
                    self.frame_done(out);
                }
            } else {
                if self.head_len == 0 && self.open_block.is_none() {
                    // Between two frames, outside a header block: what the
                    // watch has goes first.
                    self.watch.drain_inbound(out);
                }
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
        match kind {
            HEADERS if flags & END_HEADERS == 0 => self.open_block = Some((id, Instant::now())),
            CONTINUATION if flags & END_HEADERS != 0 => self.open_block = None,
            _ => {}
        }
        let opening = kind == HEADERS && self.block != Some(id);
        let last = self
            .watch
            .client_frame(kind, flags, id, len, &mut self.block);
        self.fragment = None;
        if last || (self.block == Some(id) && matches!(kind, HEADERS | CONTINUATION)) {
            if opening {
                self.bounds = HpackBounds::default();
            }
            let headers = kind == HEADERS;
            self.fragment = Some(Fragment {
                pad_length_next: headers && flags & PADDED != 0,
                skip: if headers && flags & PRIORITY_FLAG != 0 {
                    5
                } else {
                    0
                },
                padding: 0,
            });
        }
        if last {
            // The block goes on in the frame that names the stream.
            self.head[4] &= !END_HEADERS;
            self.name_after = Some(id);
        }
        out.extend_from_slice(&self.head);
        self.payload_left = len;
        if len == 0 {
            self.frame_done(out);
        } else {
            let allowed =
                self.watch.header_timeout + Duration::from_secs(len as u64 / MIN_BODY_RATE);
            self.inside_until = Some(Instant::now() + allowed);
        }
    }

    /// Bytes of a first header block's frame, `self.payload_left` of its
    /// payload still to come before them: the fragment's go to `bounds`.
    fn read_fragment(&mut self, mut bytes: &[u8]) {
        let Some(fragment) = self.fragment.as_mut() else {
            return;
        };
        let mut left = self.payload_left;
        if fragment.pad_length_next {
            let Some((&pad, rest)) = bytes.split_first() else {
                return;
            };
            fragment.pad_length_next = false;
            fragment.padding = usize::from(pad);
            left -= 1;
            bytes = rest;
            if fragment.padding > left.saturating_sub(fragment.skip) {
                // More padding than payload: the h2 server refuses the
                // frame, and nothing is appended to the block.
                self.bounds.refuse();
            }
        }
        let skipped = fragment.skip.min(bytes.len());
        fragment.skip -= skipped;
        left -= skipped;
        bytes = &bytes[skipped..];
        // What lies before the padding.
        let block_bytes = left.saturating_sub(fragment.padding).min(bytes.len());
        self.bounds.read(&bytes[..block_bytes]);
    }

    fn frame_done(&mut self, out: &mut Vec<u8>) {
        self.inside_until = None;
        self.fragment = None;
        if let Some(id) = self.name_after.take() {
            if self.bounds.at_field_boundary() {
                naming_frame(self.watch.id, id, out);
            } else {
                // The client's block ends inside a field, which would read
                // what follows as its own: the block ends here, unnamed,
                // and the h2 server refuses the connection for it.
                debug!("HTTP/2 header block of stream {id} ends inside a field");
                unnamed_block_end(id, out);
            }
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
                let (len, kind, flags, id) = frame_head(&self.head);
                self.payload_left = len;
                self.watch.server_frame(kind, flags, id);
            }
        }
    }
}

#[cfg(test)]
mod tests;
