//! `[rls]`: where Envoy's rate limit service listens, and the limits it
//! serves (those matched by a domain's descriptors).

use std::net::SocketAddr;

use super::file::RlsSection;
use super::{at, Invalid};
use crate::policy::Limit;
use crate::rls::{RlsSettings, DEFAULT_MAX_MESSAGE_BYTES, MESSAGE_BYTES_RANGE};

pub(super) fn validate_rls(
    section: Option<&RlsSection>,
    limits: &[Limit],
    server_tls: bool,
) -> Result<Option<RlsSettings>, Invalid> {
    let Some(section) = section else {
        // A limit only the service could apply, with no service: it would
        // limit nothing, and say nothing of it.
        if let Some(i) = limits.iter().position(|l| l.matcher.descriptors.is_some()) {
            return Err(at(
                &[&"limits", &i, &"match", &"domain"],
                "limits on descriptors are served to Envoy by the rate limit service: set [rls].listen",
            ));
        }
        return Ok(None);
    };
    if !cfg!(feature = "rls") {
        return Err(at(
            &[&"rls"],
            "this build of floodgate has no rate limit service (built without the `rls` feature)",
        ));
    }
    let listen = section.listen.parse::<SocketAddr>().map_err(|_| {
        at(
            &[&"rls", &"listen"],
            format!(
                "\"{}\" is not an address and port like \"127.0.0.1:8081\" or \"[::]:8081\"",
                section.listen
            ),
        )
    })?;
    if section.tls && !server_tls {
        return Err(at(
            &[&"rls", &"tls"],
            "the rate limit service serves the certificates of [server.tls], and there is none: configure [server.tls] or set tls = false",
        ));
    }
    let max_message_bytes = match section.max_message_bytes {
        None => DEFAULT_MAX_MESSAGE_BYTES,
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|n| MESSAGE_BYTES_RANGE.contains(n))
            .ok_or_else(|| {
                at(
                    &[&"rls", &"max_message_bytes"],
                    format!(
                        "must be a number of bytes from {} to {} (got {n}); Envoy's calls are a few hundred bytes",
                        MESSAGE_BYTES_RANGE.start(),
                        MESSAGE_BYTES_RANGE.end()
                    ),
                )
            })?,
    };
    let count = |value: Option<i64>, key: &'static str| -> Result<Option<usize>, Invalid> {
        value
            .map(|n| {
                usize::try_from(n).ok().filter(|&n| n >= 1).ok_or_else(|| {
                    at(
                        &[&"rls", &key],
                        "must be a whole number of at least 1 (without it, [server]'s applies)",
                    )
                })
            })
            .transpose()
    };
    Ok(Some(RlsSettings {
        listen,
        tls: section.tls,
        max_message_bytes,
        max_connections: count(section.max_connections, "max_connections")?,
        max_connections_per_ip: count(section.max_connections_per_ip, "max_connections_per_ip")?,
    }))
}
