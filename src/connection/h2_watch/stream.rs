//! One stream as the watch follows it: what the client and the server have
//! each done on it, and what that means for its body's deadline and for
//! how long the watch must keep it. Both directions' frames change it, and
//! the request that holds it asks it questions, so its rules live here
//! rather than in any one of them.

use std::time::Duration;

use tokio::time::Instant;

use super::wire::FRAME_HEAD;
use crate::connection::clock::MIN_BODY_RATE;

#[expect(
    clippy::struct_excessive_bools,
    reason = "a stream's request and response move on independently, and either side may reset it at any point: no one kind holds both halves"
)]
pub(super) struct Stream {
    pub(super) opened: Instant,
    pub(super) body_bytes: u64,
    /// The client sent END_STREAM: the request is whole.
    pub(super) whole: bool,
    /// The server sent the response's head.
    pub(super) answered: bool,
    /// The server ended its response (or reset the stream).
    pub(super) response_ended: bool,
    /// The server reset the stream: nothing more comes on it.
    pub(super) server_reset: bool,
    /// The server reset the stream while its whole request waited for its
    /// answer (a stream error the client provoked): the upstream works on.
    pub(super) reset_while_whole: bool,
    /// The client reset it and the reset went on (its request was not
    /// whole, or already answered).
    pub(super) client_reset: bool,
    /// Cut here for a late body.
    pub(super) cut: bool,
    /// A request holds the stream (`H2Stream`): its entry stays until then.
    pub(super) claimed: bool,
    /// The client's reset, held until the answer, and since when.
    pub(super) held: Option<([u8; FRAME_HEAD + 4], Instant)>,
    /// Whether the body floor applies (not on a route the config exempts).
    pub(super) floor: bool,
    /// A slot holder's deadline for its whole body.
    pub(super) deadline: Option<Instant>,
}

impl Stream {
    /// A stream its HEADERS frame opens at `now`; `whole` if that frame
    /// ends the request.
    pub(super) fn new(now: Instant, whole: bool) -> Stream {
        Stream {
            opened: now,
            body_bytes: 0,
            whole,
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
        }
    }

    /// Whether the request may still send body (an answered request may:
    /// its stream is held until the body ends, so the floor still counts).
    pub(super) fn receiving(&self) -> bool {
        !self.whole && !self.cut && !self.client_reset && !self.server_reset
    }

    /// By when the body must be whole: at the floor's pace from the
    /// stream's head, or by a slot holder's deadline, whichever is sooner.
    pub(super) fn body_due(&self, header_timeout: Duration) -> Option<Instant> {
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
    pub(super) fn over(&self) -> bool {
        !self.claimed
            && self.held.is_none()
            && (self.client_reset
                || self.cut
                || self.server_reset
                || (self.whole && self.response_ended))
    }

    /// A whole request whose answer never came through: its exchange was
    /// cut (or still runs).
    pub(super) fn whole_unanswered(&self) -> bool {
        self.whole && !self.cut && (!self.answered || self.reset_while_whole)
    }
}
