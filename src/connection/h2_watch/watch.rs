//! One connection's HTTP/2 streams, shared by the connection's stream
//! (whose frame readers tell it what each side does) and the requests on
//! it (which say what their bodies owe and learn whether their exchange
//! was cut). It holds the rules that span streams: how many are followed,
//! when a client's reset is held back and let go, when a late body is cut,
//! and the frames it has for the h2 server meanwhile.
//!
//! Every watch is registered under an id so that a request can find its
//! connection's watch from the header naming its stream. The id is random,
//! and `H2Stream::named` matches the request's socket to the watch's too,
//! so a client cannot reach another connection's streams by naming them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::task::Waker;
use std::time::Duration;

use pingora::protocols::SocketDigest;
use tokio::time::Instant;

use super::stream::Stream;
use super::wire::{
    self_dependency, CONTINUATION, DATA, END_HEADERS, END_STREAM, FRAME_HEAD, HEADERS, RST_STREAM,
};

/// Streams followed at once on one connection, far above what the h2
/// server lets a client open (those it refuses are answered at once); a
/// stream beyond it is cut as it opens.
pub(super) const MOST_STREAMS: usize = 1024;

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
pub(crate) struct H2Watch {
    pub(super) id: u64,
    /// The connection's socket as Pingora describes it to each of its
    /// requests: a request names a stream of this watch only if it came on
    /// this connection.
    pub(super) socket: Option<Arc<SocketDigest>>,
    pub(super) header_timeout: Duration,
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
pub(super) struct Shared {
    pub(super) streams: FastMap<u32, Stream>,
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

impl H2Watch {
    pub(crate) fn new(
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

    /// The watch registered under `id`, if its connection is still open.
    pub(super) fn registered(id: u64) -> Option<Arc<H2Watch>> {
        lock(&WATCHES).get(&id)?.upgrade()
    }

    pub(super) fn shared(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    /// Streams cut for a late body since the last call.
    pub(crate) fn take_cut(&self) -> Vec<u32> {
        std::mem::take(&mut self.shared().cut)
    }

    /// Whether reads are over: the client is gone and no whole request
    /// waits for its answer.
    pub(crate) fn finished(&self) -> bool {
        let shared = self.shared();
        shared.client_gone
            && shared.inbound.is_empty()
            && !shared
                .streams
                .values()
                .any(|s| s.whole && !s.answered && !s.response_ended)
    }

    pub(crate) fn client_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// The client closed its side (or its connection broke): bodies that
    /// will never come are cut now, whole requests keep their exchange.
    pub(crate) fn client_left(&self) {
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
    pub(crate) fn pending_inbound(&self, buf: &mut [u8], waker: &Waker) -> usize {
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
    pub(super) fn drain_inbound(&self, out: &mut Vec<u8>) {
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

    pub(crate) fn has_inbound(&self) -> bool {
        self.inbound_waiting.load(Ordering::Acquire)
    }

    /// Cuts late bodies and lets go of resets held too long; the next
    /// instant this must run again. `waker` is called when the h2 server
    /// has more to read.
    pub(crate) fn tick(&self, now: Instant, waker: &Waker) -> Option<Instant> {
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
    pub(super) fn client_frame(
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
                        shared
                            .streams
                            .insert(id, Stream::new(now, flags & END_STREAM != 0));
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
    pub(super) fn client_reset(&self, id: u32, frame: [u8; FRAME_HEAD + 4]) -> bool {
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
    pub(super) fn server_frame(&self, kind: u8, flags: u8, id: u32) {
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

    pub(super) fn with_stream(&self, id: u32, change: impl FnOnce(&mut Stream)) {
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
