//! `[redis]`: the shared store.

use std::path::Path;
use std::time::Duration;

use super::file::{InstancesName, LeasesMode, RedisSection, SentinelSection};
use super::{at, duration, AsSegment, Inputs, Invalid};
use floodgate_limiter::redis::LeaseSettings;
use floodgate_limiter::redis::{InstanceCount, SentinelSettings, Topology};
use floodgate_limiter::{ClockSource, OnFailure, RedisSettings};

pub(super) fn validate_redis(r: &RedisSection, inputs: &Inputs) -> Result<RedisSettings, Invalid> {
    let topology = topology(r, inputs)?;
    let timeout = timeout(r)?;
    let key_prefix = key_prefix(r)?;
    let instances = instances(r)?;
    let tls_ca = read_tls_ca(r, inputs)?;
    let leases = leases(r)?;
    check_tls_ca_used(tls_ca.is_some(), &topology)?;
    Ok(RedisSettings {
        topology,
        timeout,
        clock: r.clock.unwrap_or(ClockSource::Redis),
        key_prefix,
        on_failure: r.on_failure.map_or(OnFailure::Local, Into::into),
        instances,
        tls_ca,
        leases,
    })
}

/// One of `url` (or REDIS_URL), `sentinel` and `cluster`, checked.
fn topology(r: &RedisSection, inputs: &Inputs) -> Result<Topology, Invalid> {
    let cluster = r.cluster.clone().unwrap_or_default();
    let url = inputs.redis_url.clone().or_else(|| r.url.clone());
    if url.is_none() && cluster.is_empty() && r.sentinel.is_none() {
        return Err(at(
            &[&"redis"],
            "needs `url` (or REDIS_URL), `sentinel` or `cluster`",
        ));
    }
    let given = [r.url.is_some(), !cluster.is_empty(), r.sentinel.is_some()];
    if given.iter().filter(|&&g| g).count() > 1 {
        let key = if r.sentinel.is_some() {
            "sentinel"
        } else {
            "cluster"
        };
        return Err(at(
            &[&"redis", &key],
            "give one of `url`, `sentinel` and `cluster`",
        ));
    }
    let sentinel = r
        .sentinel
        .as_ref()
        .map(|s| validate_sentinel(s, inputs))
        .transpose()?;
    for (i, u) in cluster.iter().enumerate() {
        check_redis_url(u, &[&"redis", &"cluster", &i])?;
    }
    if let Some(u) = &r.url {
        check_redis_url(u, &[&"redis", &"url"])?;
    }
    // REDIS_URL stands in for `url` only: it does not override a sentinel
    // or cluster section.
    Ok(match (sentinel, url) {
        (Some(sentinel), _) => Topology::Sentinel(sentinel),
        (None, Some(url)) if cluster.is_empty() => Topology::Standalone(url),
        _ => Topology::Cluster(cluster),
    })
}

fn timeout(r: &RedisSection) -> Result<Duration, Invalid> {
    let timeout = duration(
        &r.timeout,
        Duration::from_millis(50),
        &[&"redis", &"timeout"],
    )?;
    if timeout.is_zero() {
        return Err(at(&[&"redis", &"timeout"], "must be longer than 0"));
    }
    Ok(timeout)
}

fn key_prefix(r: &RedisSection) -> Result<String, Invalid> {
    let key_prefix = r.key_prefix.clone().unwrap_or_else(|| "floodgate".into());
    if key_prefix.is_empty()
        || !key_prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c))
    {
        return Err(at(
            &[&"redis", &"key_prefix"],
            "must be non-empty letters, digits, '_', '-', '.' or ':'",
        ));
    }
    Ok(key_prefix)
}

fn instances(r: &RedisSection) -> Result<InstanceCount, Invalid> {
    Ok(match &r.instances {
        None => InstanceCount::Fixed(1),
        Some(InstancesName::Count(n)) if *n >= 1 => InstanceCount::Fixed(*n as u64),
        Some(InstancesName::Count(_)) => {
            return Err(at(&[&"redis", &"instances"], "must be at least 1"))
        }
        Some(InstancesName::Word(word)) if word == "auto" => InstanceCount::Auto,
        Some(InstancesName::Word(word)) => {
            return Err(at(
                &[&"redis", &"instances"],
                format!("must be a number of instances or \"auto\", not \"{word}\""),
            ))
        }
    })
}

fn read_tls_ca(r: &RedisSection, inputs: &Inputs) -> Result<Option<Vec<u8>>, Invalid> {
    r.tls_ca_file
        .as_ref()
        .map(|file| {
            inputs.read(file).map_err(|e| {
                at(
                    &[&"redis", &"tls_ca_file"],
                    format!("cannot read {}: {e}", file.display()),
                )
            })
        })
        .transpose()
}

/// `leases`, `lease_max` and `lease_ttl`: the bounds are checked even when
/// leases are off.
fn leases(r: &RedisSection) -> Result<Option<LeaseSettings>, Invalid> {
    let lease_max = r.lease_max.unwrap_or(LeaseSettings::DEFAULT_MAX);
    if lease_max == 0 {
        return Err(at(
            &[&"redis", &"lease_max"],
            "must be at least 1 (to lease nothing, set leases = \"off\")",
        ));
    }
    let lease_ttl = duration(
        &r.lease_ttl,
        Duration::from_micros(LeaseSettings::DEFAULT_TTL_US),
        &[&"redis", &"lease_ttl"],
    )?;
    if lease_ttl < Duration::from_millis(1) || lease_ttl > Duration::from_secs(60) {
        return Err(at(
            &[&"redis", &"lease_ttl"],
            "must be from 1ms to 60s: a lease a crashed instance held is lost for this long",
        ));
    }
    Ok(match r.leases.unwrap_or(LeasesMode::Auto) {
        LeasesMode::Off => None,
        LeasesMode::Auto => Some(LeaseSettings {
            max: lease_max,
            ttl_us: lease_ttl.as_micros() as u64,
        }),
    })
}

/// The file would be read and never used: the operator meant TLS and
/// would get plain text.
fn check_tls_ca_used(tls_ca: bool, topology: &Topology) -> Result<(), Invalid> {
    let speaks_tls = match topology {
        Topology::Standalone(url) => url.starts_with("rediss://"),
        Topology::Sentinel(sentinel) => sentinel.tls,
        Topology::Cluster(nodes) => nodes.iter().any(|n| n.starts_with("rediss://")),
    };
    if tls_ca && !speaks_tls {
        return Err(at(
            &[&"redis", &"tls_ca_file"],
            "is for TLS connections, and none is made: use rediss:// URLs, or `tls = true` in `sentinel`",
        ));
    }
    Ok(())
}

fn validate_sentinel(s: &SentinelSection, inputs: &Inputs) -> Result<SentinelSettings, Invalid> {
    if s.master.is_empty() {
        return Err(at(
            &[&"redis", &"sentinel", &"master"],
            "must name the master the sentinels monitor",
        ));
    }
    if s.nodes.is_empty() {
        return Err(at(
            &[&"redis", &"sentinel", &"nodes"],
            "needs at least one sentinel's \"host:port\"",
        ));
    }
    for (i, node) in s.nodes.iter().enumerate() {
        let port = node
            .rsplit_once(':')
            .map(|(host, port)| (host, port.parse::<u16>()));
        if !matches!(port, Some((host, Ok(p))) if !host.is_empty() && !host.contains('/') && p > 0)
        {
            return Err(at(
                &[&"redis", &"sentinel", &"nodes", &i],
                format!("\"{node}\" must be a sentinel's \"host:port\""),
            ));
        }
    }
    let password = s
        .password_file
        .as_ref()
        .map(|file| read_password(file, "password_file", inputs))
        .transpose()?;
    let sentinel_password = s
        .sentinel_password_file
        .as_ref()
        .map(|file| read_password(file, "sentinel_password_file", inputs))
        .transpose()?;
    Ok(SentinelSettings {
        master: s.master.clone(),
        nodes: s.nodes.clone(),
        password,
        sentinel_password,
        tls: s.tls.unwrap_or(false),
    })
}

/// A password file of `[redis].sentinel`: its text, less a final newline.
fn read_password(file: &Path, key: &str, inputs: &Inputs) -> Result<String, Invalid> {
    let here = [&"redis" as &dyn AsSegment, &"sentinel", &key];
    let bytes = inputs
        .read(file)
        .map_err(|e| at(&here, format!("cannot read {}: {e}", file.display())))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| at(&here, format!("{} is not text", file.display())))?;
    let password = text.trim_end_matches(['\r', '\n']).to_string();
    if password.is_empty() {
        return Err(at(&here, format!("{} is empty", file.display())));
    }
    Ok(password)
}

fn check_redis_url(u: &str, path: &[&dyn AsSegment]) -> Result<(), Invalid> {
    if u.starts_with("redis://") || u.starts_with("rediss://") {
        Ok(())
    } else {
        Err(at(
            path,
            format!("\"{u}\" must start with redis:// or rediss://"),
        ))
    }
}
