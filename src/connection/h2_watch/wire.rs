//! HTTP/2's frame layout (RFC 9113 §4.1), as much of it as the watch reads,
//! and the one frame it writes to cut a stream. Both directions' readers
//! and the watch itself name frames by these constants, so they live apart
//! from any one of them.

pub(super) const PREFACE_LEN: usize = 24;
pub(super) const FRAME_HEAD: usize = 9;
pub(super) const DATA: u8 = 0x0;
pub(super) const HEADERS: u8 = 0x1;
pub(super) const PRIORITY: u8 = 0x2;
pub(super) const RST_STREAM: u8 = 0x3;
pub(super) const CONTINUATION: u8 = 0x9;
pub(super) const END_STREAM: u8 = 0x1;
pub(super) const END_HEADERS: u8 = 0x4;
pub(super) const PADDED: u8 = 0x8;
pub(super) const PRIORITY_FLAG: u8 = 0x20;

/// A frame head's length, type, flags and stream.
pub(super) fn frame_head(head: &[u8]) -> (usize, u8, u8, u32) {
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    (len, head[3], head[4], id)
}

/// A PRIORITY frame making stream `id` depend on itself: a stream error
/// (RFC 9113 §5.3.1) the h2 server answers by resetting the stream.
pub(super) fn self_dependency(id: u32) -> [u8; FRAME_HEAD + 5] {
    let id = id & 0x7fff_ffff;
    let mut frame = [0u8; FRAME_HEAD + 5];
    frame[2] = 5;
    frame[3] = PRIORITY;
    frame[5..9].copy_from_slice(&id.to_be_bytes());
    frame[9..13].copy_from_slice(&id.to_be_bytes());
    frame
}
