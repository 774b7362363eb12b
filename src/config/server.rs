//! `[server]` and `[server.tls]`: the listeners, the threads, the connection
//! limits and the certificates served.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::file::{OneOrMany, ServerSection, TlsSection};
use super::{at, duration, AsSegment, Inputs, Invalid};
use crate::server::settings::ServerSettings;
use crate::server::tls::{CertSet, CertSource, TlsListeners};
use floodgate_policy::path::PathRules;

const DEFAULT_GRACE: Duration = Duration::from_secs(5);
/// Long enough for a phone on a bad link to send a head, short enough that a
/// slow-header client holds a connection for seconds, not minutes.
const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A minute for a slot holder's body: an upload of tens of megabytes on a
/// good link, not the 2.3 hours the body floor would give ten megabytes.
const DEFAULT_SLOT_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// What browsers and most load balancers keep idle connections for.
const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// A browser opens about 6 connections per host; a NAT of a few dozen users
/// fits; one address cannot take the fd table.
const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 256;

fn socket_addr(text: &str, path: &[&dyn AsSegment]) -> Result<SocketAddr, Invalid> {
    text.parse().map_err(|_| {
        at(
            path,
            format!("\"{text}\" is not an address like \"0.0.0.0:8080\" or \"[::]:8080\""),
        )
    })
}

pub(super) fn validate_server(s: &ServerSection, cores: usize) -> Result<ServerSettings, Invalid> {
    let listen = match &s.listen {
        OneOrMany::One(a) => vec![socket_addr(a, &[&"server", &"listen"])?],
        OneOrMany::Many(list) => {
            if list.is_empty() {
                return Err(at(&[&"server", &"listen"], "needs at least one address"));
            }
            list.iter()
                .enumerate()
                .map(|(i, a)| socket_addr(a, &[&"server", &"listen", &i]))
                .collect::<Result<_, _>>()?
        }
    };
    let admin_listen = s
        .admin_listen
        .as_deref()
        .map(|a| socket_addr(a, &[&"server", &"admin_listen"]))
        .transpose()?;
    // One worker thread per core unless told otherwise: the proxy is usually
    // the machine's main job.
    let threads = s.threads.unwrap_or(cores);
    if threads == 0 || threads > 1024 {
        return Err(at(&[&"server", &"threads"], "must be from 1 to 1024"));
    }
    let positive = |value: Option<String>, default: Duration, key: &'static str| {
        let d = duration(&value, default, &[&"server", &key])?;
        if d.is_zero() {
            return Err(at(&[&"server", &key], "must be longer than 0"));
        }
        Ok(d)
    };
    let count = |value: Option<i64>, key: &'static str| -> Result<Option<usize>, Invalid> {
        value
            .map(|n| {
                usize::try_from(n)
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| at(&[&"server", &key], "must be a whole number of at least 1"))
            })
            .transpose()
    };
    Ok(ServerSettings {
        listen,
        admin_listen,
        threads,
        grace_period: duration(
            &s.grace_period,
            DEFAULT_GRACE,
            &[&"server", &"grace_period"],
        )?,
        header_timeout: positive(
            s.header_timeout.clone(),
            DEFAULT_HEADER_TIMEOUT,
            "header_timeout",
        )?,
        keepalive_timeout: positive(
            s.keepalive_timeout.clone(),
            DEFAULT_KEEPALIVE_TIMEOUT,
            "keepalive_timeout",
        )?,
        max_connections: count(s.max_connections, "max_connections")?,
        max_connections_per_ip: count(s.max_connections_per_ip, "max_connections_per_ip")?
            .unwrap_or(DEFAULT_MAX_CONNECTIONS_PER_IP),
        h2c: s.h2c,
        slot_body_timeout: positive(
            s.slot_body_timeout.clone(),
            DEFAULT_SLOT_BODY_TIMEOUT,
            "slot_body_timeout",
        )?,
    })
}

/// `max_body`: the most of a request's body read before its decision (by
/// limits that read it). 1 MiB holds a long prompt; at most 64 MiB.
pub(super) fn max_body(value: Option<i64>) -> Result<usize, Invalid> {
    const DEFAULT: usize = 1 << 20;
    const MOST: i64 = 64 << 20;
    match value {
        None => Ok(DEFAULT),
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|&n| n >= 1 && n as i64 <= MOST)
            .ok_or_else(|| {
                at(
                    &[&"server", &"max_body"],
                    format!("must be a whole number of bytes from 1 to {MOST}"),
                )
            }),
    }
}

pub(super) fn validate_tls(t: &TlsSection, inputs: &Inputs) -> Result<TlsListeners, Invalid> {
    let listen = match &t.listen {
        OneOrMany::One(a) => vec![socket_addr(a, &[&"server", &"tls", &"listen"])?],
        OneOrMany::Many(list) => list
            .iter()
            .enumerate()
            .map(|(i, a)| socket_addr(a, &[&"server", &"tls", &"listen", &i]))
            .collect::<Result<_, _>>()?,
    };
    let default = CertSource {
        server_names: Vec::new(),
        cert_file: t.cert_file.clone(),
        key_file: t.key_file.clone(),
    };
    let mut others = Vec::new();
    for (i, c) in t.certs.iter().enumerate() {
        if c.server_names.is_empty() {
            return Err(at(
                &[&"server", &"tls", &"certs", &i, &"server_names"],
                "needs at least one name, e.g. [\"api.example.org\", \"*.example.org\"]",
            ));
        }
        others.push(CertSource {
            server_names: c.server_names.clone(),
            cert_file: c.cert_file.clone(),
            key_file: c.key_file.clone(),
        });
    }
    let read = |file: &Path| inputs.read(file);
    // Which entry failed, for the error's key.
    CertSet::load(&default, &[], &read)
        .map_err(|e| at(&[&"server", &"tls", &"cert_file"], e.to_string()))?;
    for (i, source) in others.iter().enumerate() {
        CertSet::load(source, &[], &read).map_err(|e| {
            at(
                &[&"server", &"tls", &"certs", &i, &"cert_file"],
                e.to_string(),
            )
        })?;
    }
    let certs = CertSet::load(&default, &others, &read)
        .map_err(|e| at(&[&"server", &"tls", &"cert_file"], e.to_string()))?;
    let mut sources = vec![default];
    sources.extend(others);
    Ok(TlsListeners {
        listen,
        http2: t.http2.unwrap_or(true),
        sources,
        certs: Arc::new(certs),
    })
}

/// How request paths are read, which the patterns of `[exempt]`, `[[limits]]`
/// and `[[costs]]` follow.
pub(super) fn path_rules(s: &ServerSection) -> PathRules {
    PathRules {
        escaped_slashes: s.escaped_slashes.map_or_else(Default::default, Into::into),
        case_insensitive: s.case_insensitive_paths,
    }
}
