//! The header that tells a request which stream it came on: written by the
//! watch into the client's first header block, read back (and removed) by
//! the gateway. Both ends of the format are here so they cannot drift
//! apart.
//!
//! It goes in as a CONTINUATION frame holding a literal the HPACK decoder
//! reads without touching its table, so the h2 server's view of the
//! client's other headers is unchanged.

use super::wire::{CONTINUATION, END_HEADERS};

/// The header a stream's first header block carries to its request.
pub(crate) const STREAM_HEADER: &str = "floodgate-h2-stream";
/// The same, as a name a header map looks up without parsing it again.
pub(crate) static STREAM_HEADER_NAME: http::HeaderName =
    http::HeaderName::from_static(STREAM_HEADER);

/// The value of `STREAM_HEADER` that names a request's stream: the last,
/// the one the watch appended (a client's own go before it; the gateway
/// removes them all).
pub(crate) fn stream_header(headers: &http::HeaderMap) -> Option<&http::HeaderValue> {
    headers.get_all(&STREAM_HEADER_NAME).iter().next_back()
}

/// The CONTINUATION frame that ends stream `id`'s first header block with
/// the header naming it: a literal field without indexing, new name (RFC
/// 7541 §6.2.2), which leaves the decoder's table as it was.
pub(super) fn naming_frame(watch: u64, id: u32, out: &mut Vec<u8>) {
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
pub(super) fn unnamed_block_end(id: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&[0, 0, 0, CONTINUATION, END_HEADERS]);
    out.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
}

/// The watch and stream a `STREAM_HEADER` value names, if it is one the
/// watch could have written.
pub(super) fn parse_name(value: &http::HeaderValue) -> Option<(u64, u32)> {
    let (watch, id) = value.to_str().ok()?.split_once(':')?;
    Some((u64::from_str_radix(watch, 16).ok()?, id.parse().ok()?))
}
