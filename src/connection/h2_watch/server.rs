//! The reader of what the h2 server writes to the client: only frame heads,
//! for when a stream is answered, ended or reset, which is when the watch
//! lets go of a reset it held and stops following the stream. Nothing
//! written is changed.

use std::sync::Arc;

use super::watch::H2Watch;
use super::wire::{frame_head, FRAME_HEAD};

/// The server's frames as they are written: only read, for the answers.
pub(crate) struct ServerFrames {
    watch: Arc<H2Watch>,
    head: [u8; FRAME_HEAD],
    head_len: usize,
    payload_left: usize,
}

impl ServerFrames {
    pub(crate) fn new(watch: Arc<H2Watch>) -> ServerFrames {
        ServerFrames {
            watch,
            head: [0; FRAME_HEAD],
            head_len: 0,
            payload_left: 0,
        }
    }

    /// `written`, as it went to the client (or nowhere, once it is gone).
    pub(crate) fn wrote(&mut self, mut written: &[u8]) {
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
