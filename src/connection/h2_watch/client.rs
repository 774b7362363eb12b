//! The reader of the client's HTTP/2 bytes, which sees them before
//! Pingora's h2 server does: it passes each frame on, holds back a reset
//! the watch wants held, names each stream's first header block, and puts
//! the watch's own frames in between two of the client's.
//!
//! Everything here is read from an untrusted peer ahead of the h2 crate's
//! own checks, so it keeps little of its own (a frame head, a reset being
//! read, where the block being named stands in HPACK terms), and it never
//! lets a frame of the watch's split one of the client's: a frame half in,
//! or a header block still open, keeps them out until it ends, and
//! `inside_frame` gives the connection the deadline by which it must.

use std::sync::Arc;
use std::time::Duration;

use log::debug;
use tokio::time::Instant;

use super::naming::{naming_frame, unnamed_block_end};
use super::watch::H2Watch;
use super::wire::{
    frame_head, CONTINUATION, END_HEADERS, FRAME_HEAD, HEADERS, PADDED, PREFACE_LEN, PRIORITY_FLAG,
    RST_STREAM,
};
use crate::connection::clock::MIN_BODY_RATE;
use crate::connection::hpack_bounds::HpackBounds;

/// The client's frames as they are read: passed on, held (a reset), or
/// added to (the naming header, and between two frames what the watch has
/// for the h2 server).
pub(crate) struct ClientFrames {
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
    pub(crate) fn new(watch: Arc<H2Watch>) -> ClientFrames {
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

    pub(crate) fn watch(&self) -> &Arc<H2Watch> {
        &self.watch
    }

    /// Between two of the client's frames, as the h2 server has been given
    /// them: where a frame of the watch's own may go in.
    pub(crate) fn between_frames(&self) -> bool {
        self.preface_left == 0 && self.payload_left == 0 && self.open_block.is_none()
    }

    /// The stream whose frame (or header block) the h2 server has been
    /// given part of, and by when the rest must have come: a frame's
    /// length at the body floor after a grace of `header_timeout`, a
    /// block within `header_timeout` of its first frame.
    pub(crate) fn inside_frame(&self) -> Option<(u32, Instant)> {
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
    pub(crate) fn read(&mut self, mut input: &[u8], out: &mut Vec<u8>) {
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
