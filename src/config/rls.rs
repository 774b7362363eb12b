//! `[rls]`: where Envoy's rate limit service listens, and the limits it
//! serves (those matched by a domain's descriptors).

use std::net::SocketAddr;

use super::admin::token_of;
use super::file::RlsSection;
use super::inputs::Inputs;
use super::{at, AsSegment, Invalid};
use crate::rls::{RlsSettings, RlsTokens, DEFAULT_MAX_MESSAGE_BYTES, MESSAGE_BYTES_RANGE};
use floodgate_policy::Limit;

/// Tokens one file may hold: the one in use and those being rolled out.
const MAX_TOKENS: usize = 8;

/// `[rls].token_file`'s tokens, read again on every reload (so that they
/// can be rotated); none without the key, and any caller is answered.
pub(super) fn validate_rls_tokens(
    section: Option<&RlsSection>,
    inputs: &Inputs,
) -> Result<Option<RlsTokens>, Invalid> {
    let path: [&dyn AsSegment; 2] = [&"rls", &"token_file"];
    let Some(file) = section.and_then(|s| s.token_file.as_ref()) else {
        return Ok(None);
    };
    let bytes = inputs
        .read(file)
        .map_err(|e| at(&path, format!("cannot read {}: {e}", file.display())))?;
    let mut tokens = Vec::new();
    for (n, line) in bytes.split(|&b| b == b'\n').enumerate() {
        if line.trim_ascii().is_empty() {
            continue;
        }
        let token = token_of(line).map_err(|why| at(&path, format!("line {}: {why}", n + 1)))?;
        tokens.push(token.to_string());
    }
    if tokens.is_empty() {
        return Err(at(
            &path,
            format!(
                "{} holds no token: one a line (e.g. the output of `openssl rand -hex 32`)",
                file.display()
            ),
        ));
    }
    if tokens.len() > MAX_TOKENS {
        return Err(at(
            &path,
            format!(
                "{} tokens: at most {MAX_TOKENS}, the one in use and those being rolled out",
                tokens.len()
            ),
        ));
    }
    Ok(Some(RlsTokens::new(tokens)))
}

pub(super) fn validate_rls(
    section: Option<&RlsSection>,
    limits: &[Limit],
    server_tls: bool,
) -> Result<Option<RlsSettings>, Invalid> {
    let Some(section) = section else {
        // A limit only the service could apply, with no service: it would
        // limit nothing, and say nothing of it.
        if let Some(i) = limits
            .iter()
            .position(|l| l.matcher.descriptors().is_some())
        {
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
