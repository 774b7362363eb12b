//! The client's address: the TCP peer, or, behind trusted proxies, the
//! first untrusted entry of the forwarding chain they wrote
//! (X-Forwarded-For or RFC 7239 `Forwarded`), read right to left.

use std::net::IpAddr;

use http::HeaderMap;
use smallvec::SmallVec;

use ipnet::IpNet;

use super::error::IdentityError;

/// `[clients].forwarded_header`: the one header trusted proxies write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For`, the default: a list of addresses, client first.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=...`.
    Forwarded,
}

impl ForwardedHeader {
    /// The header's name as configured and as requests carry it, lower case.
    pub fn name(&self) -> &'static str {
        match self {
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::Forwarded => "forwarded",
        }
    }
}

/// An IPv4-mapped IPv6 address is the IPv4 client it carries.
pub fn normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The peer itself, unless it is a trusted proxy: then the chain of the
/// configured header (all its lines, in order) is read right to left and
/// the first entry that is not a trusted proxy is the client. A trusted
/// proxy never writes an entry that is not an address, so reaching one
/// means the chain cannot be believed: the request is refused rather than
/// pinned on the proxy. Entries left of the client are never read.
pub(super) fn client_address(
    peer: IpAddr,
    headers: &HeaderMap,
    forwarded_header: ForwardedHeader,
    trusted_proxies: &[IpNet],
) -> Result<(IpAddr, SmallVec<[IpAddr; 2]>), IdentityError> {
    let is_trusted = |ip: &IpAddr| trusted_proxies.iter().any(|n| n.contains(ip));
    let mut via = SmallVec::new();
    if !is_trusted(&peer) {
        return Ok((peer, via));
    }
    let mut entries: SmallVec<[ChainEntry<'_>; 8]> = SmallVec::new();
    for line in headers.get_all(forwarded_header.name()) {
        match forwarded_header {
            ForwardedHeader::XForwardedFor => {
                entries.extend(x_forwarded_for_entries(line.as_bytes()))
            }
            ForwardedHeader::Forwarded => entries.extend(forwarded_elements(line.as_bytes())),
        }
    }
    let mut client = peer;
    for (walked, entry) in entries.iter().rev().enumerate() {
        let address = entry.and_then(|entry| match forwarded_header {
            ForwardedHeader::XForwardedFor => parse_hop(entry),
            ForwardedHeader::Forwarded => forwarded_for(entry).and_then(parse_hop),
        });
        if walked > 0 {
            via.insert(0, client);
        }
        client = address.ok_or(IdentityError::UnreadableForwardedEntry)?;
        if !is_trusted(&client) {
            break;
        }
    }
    Ok((client, via))
}

/// One entry of a forwarding chain: its bytes, or `None` where the header's
/// syntax around it cannot be trusted.
type ChainEntry<'a> = Option<&'a [u8]>;

/// The entries of one `X-Forwarded-For` line, as bytes: split at every comma
/// (the header has no quoting), white space trimmed, and empty elements
/// skipped (RFC 9110, section 5.6.1).
fn x_forwarded_for_entries(value: &[u8]) -> impl Iterator<Item = ChainEntry<'_>> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|e| !e.is_empty())
        .map(Some)
}

/// The elements of one `Forwarded` line (RFC 7239): a comma inside a quoted
/// string does not separate. A quote left open would swallow what a proxy
/// appended after it, so the last element of such a line is unreadable.
fn forwarded_elements(value: &[u8]) -> SmallVec<[ChainEntry<'_>; 4]> {
    let (pieces, balanced) = split_unquoted(value, b',');
    let last = pieces.len() - 1;
    pieces
        .into_iter()
        .enumerate()
        .map(|(i, e)| (i < last || balanced).then(|| e.trim_ascii()))
        .filter(|e| e.is_none_or(|e| !e.is_empty()))
        .collect()
}

/// Splits at `separator` outside double-quoted strings (with `\` escapes);
/// also tells whether every quote was closed.
fn split_unquoted(value: &[u8], separator: u8) -> (SmallVec<[&[u8]; 4]>, bool) {
    let mut start = 0;
    let mut quoted = false;
    let mut escaped = false;
    let mut pieces: SmallVec<[&[u8]; 4]> = SmallVec::new();
    for (i, &b) in value.iter().enumerate() {
        if escaped {
            escaped = false;
        } else if quoted && b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            quoted = !quoted;
        } else if b == separator && !quoted {
            pieces.push(&value[start..i]);
            start = i + 1;
        }
    }
    pieces.push(&value[start..]);
    (pieces, !quoted)
}

/// The `for=` value of one `Forwarded` element, unquoted; `None` unless the
/// element has exactly one.
fn forwarded_for(element: &[u8]) -> Option<&[u8]> {
    let mut found = None;
    for pair in split_unquoted(element, b';').0 {
        let Some(at) = pair.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (name, value) = (pair[..at].trim_ascii(), pair[at + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"for") {
            if found.is_some() {
                return None;
            }
            found = Some(
                value
                    .strip_prefix(b"\"")
                    .and_then(|v| v.strip_suffix(b"\""))
                    .unwrap_or(value),
            );
        }
    }
    found
}

/// `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:80`.
fn parse_hop(hop: &[u8]) -> Option<IpAddr> {
    let hop = std::str::from_utf8(hop).ok()?;
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(normalize(ip));
    }
    if let Ok(sa) = hop.parse::<std::net::SocketAddr>() {
        return Some(normalize(sa.ip()));
    }
    let inner = hop.strip_prefix('[')?.strip_suffix(']')?;
    inner.parse::<IpAddr>().ok().map(normalize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quote_left_open_spoils_the_last_element_of_its_line_only() {
        let elements = forwarded_elements(b"for=192.0.2.1, , for=192.0.2.2;x=\"a, b");
        assert_eq!(
            elements.as_slice(),
            [Some(&b"for=192.0.2.1"[..]), None],
            "the open quote swallows what follows it"
        );
        let closed = forwarded_elements(b"for=192.0.2.1, for=\"[2001:db8::1]\"");
        assert_eq!(
            closed.as_slice(),
            [
                Some(&b"for=192.0.2.1"[..]),
                Some(&b"for=\"[2001:db8::1]\""[..])
            ]
        );
    }
}
