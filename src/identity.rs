//! Who is asking: the client's address (the TCP peer, or the forwarded client
//! address when the peer is a trusted proxy), its API key and tier.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;
use xxhash_rust::xxh3::xxh3_128_with_seed;

/// A tier name ("anonymous", "internal", or one named in `[clients.api_keys]`).
pub type Tier = Arc<str>;

pub const ANONYMOUS: &str = "anonymous";
pub const INTERNAL: &str = "internal";

/// Validated `[clients]` settings.
#[derive(Debug, Clone)]
pub struct ClientRules {
    pub api_key_header: HeaderName,
    pub trusted_proxies: Vec<IpNet>,
    pub ipv6_prefix: u8,
    pub internal: Vec<IpNet>,
    pub api_keys: HashMap<Box<[u8]>, Tier>,
    pub anonymous: Tier,
    pub internal_tier: Tier,
}

/// A known API key, never kept in the clear beyond the lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// Identity of the key for limit state.
    pub hash: u128,
    pub tier: Tier,
}

impl ApiKey {
    /// What logs show instead of the key: enough to tell keys apart.
    pub fn log_label(&self) -> String {
        format!("key#{:08x}", (self.hash >> 96) as u32)
    }
}

/// The identified client of one request.
#[derive(Debug, Clone)]
pub struct Client {
    /// The client address, aggregated (IPv6 to its prefix).
    pub ip: IpAddr,
    pub ip_prefix: u8,
    pub api_key: Option<ApiKey>,
    pub tier: Tier,
}

impl Client {
    /// For the rejection log: address, key label and tier.
    pub fn log_label(&self) -> String {
        let ip = match self.ip {
            IpAddr::V6(_) => format!("{}/{}", self.ip, self.ip_prefix),
            IpAddr::V4(_) => self.ip.to_string(),
        };
        match &self.api_key {
            Some(k) => format!("ip={ip} {} tier={}", k.log_label(), self.tier),
            None => format!("ip={ip} tier={}", self.tier),
        }
    }
}

/// Seeds keep the hashes of different kinds of identity apart.
pub(crate) mod seed {
    pub const IP: u64 = 1;
    pub const API_KEY: u64 = 2;
    pub const HEADER: u64 = 3;
}

pub(crate) fn hash(seed: u64, bytes: &[u8]) -> u128 {
    xxh3_128_with_seed(bytes, seed)
}

/// An IPv4-mapped IPv6 address is the IPv4 client it carries.
pub fn normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl ClientRules {
    pub fn identify(&self, peer: IpAddr, headers: &HeaderMap) -> Client {
        let client_ip = self.client_ip(normalize(peer), headers);
        let (ip, ip_prefix) = match client_ip {
            IpAddr::V4(_) => (client_ip, 32),
            IpAddr::V6(_) => {
                let net = IpNet::new(client_ip, self.ipv6_prefix)
                    .map(|n| n.trunc())
                    .map_or(client_ip, |n| n.network());
                (net, self.ipv6_prefix)
            }
        };
        let api_key = headers.get(&self.api_key_header).and_then(|value| {
            let tier = self.api_keys.get(value.as_bytes())?;
            Some(ApiKey {
                hash: hash(seed::API_KEY, value.as_bytes()),
                tier: tier.clone(),
            })
        });
        let tier = if self.internal.iter().any(|n| n.contains(&client_ip)) {
            self.internal_tier.clone()
        } else {
            api_key
                .as_ref()
                .map_or_else(|| self.anonymous.clone(), |k| k.tier.clone())
        };
        Client {
            ip,
            ip_prefix,
            api_key,
            tier,
        }
    }

    fn is_trusted(&self, ip: &IpAddr) -> bool {
        self.trusted_proxies.iter().any(|n| n.contains(ip))
    }

    /// The peer itself, unless it is a trusted proxy: then the forwarding
    /// chain is read right to left and the first hop that is not trusted is
    /// the client. An unreadable hop stops the walk at the last trusted one,
    /// so garbage never becomes somebody's identity.
    fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.is_trusted(&peer) {
            return peer;
        }
        let hops = forwarded_hops(headers);
        let mut client = peer;
        for hop in hops.iter().rev() {
            match hop {
                Some(ip) => {
                    client = *ip;
                    if !self.is_trusted(ip) {
                        break;
                    }
                }
                None => break,
            }
        }
        client
    }
}

/// The forwarding chain, leftmost first: X-Forwarded-For when present, else
/// the `for=` parameters of Forwarded. `None` marks a hop that is not an address.
fn forwarded_hops(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let xff: Vec<Option<IpAddr>> = headers
        .get_all("x-forwarded-for")
        .iter()
        .flat_map(|v| split_list(v.as_bytes()))
        .map(|hop| parse_hop(hop.trim()))
        .collect();
    if !xff.is_empty() {
        return xff;
    }
    headers
        .get_all("forwarded")
        .iter()
        .flat_map(|v| split_list(v.as_bytes()))
        .filter_map(|element| {
            element.split(';').find_map(|pair| {
                let (name, value) = pair.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| parse_hop(value.trim().trim_matches('"')))
            })
        })
        .collect()
}

fn split_list(value: &[u8]) -> Vec<&str> {
    match std::str::from_utf8(value) {
        Ok(text) => text.split(',').collect(),
        // Not text at all: one unreadable hop.
        Err(_) => vec![""],
    }
}

/// `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]:80`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(normalize(ip));
    }
    if let Ok(sa) = hop.parse::<std::net::SocketAddr>() {
        return Some(normalize(sa.ip()));
    }
    let inner = hop.strip_prefix('[')?.split(']').next()?;
    inner.parse::<IpAddr>().ok().map(normalize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> ClientRules {
        let mut api_keys = HashMap::new();
        api_keys.insert(b"k-pro".to_vec().into_boxed_slice(), Tier::from("pro"));
        ClientRules {
            api_key_header: HeaderName::from_static("x-api-key"),
            trusted_proxies: vec!["10.0.0.0/8".parse().unwrap()],
            ipv6_prefix: 64,
            internal: vec!["192.168.0.0/16".parse().unwrap()],
            api_keys,
            anonymous: Tier::from(ANONYMOUS),
            internal_tier: Tier::from(INTERNAL),
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn forwarded_for_is_read_only_from_trusted_peers() {
        let r = rules();
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 1.2.3.4, 10.0.0.7")]);
        assert_eq!(r.identify(ip("8.8.8.8"), &h).ip, ip("8.8.8.8"));
        assert_eq!(r.identify(ip("10.1.1.1"), &h).ip, ip("1.2.3.4"));
        let all_trusted = headers(&[("x-forwarded-for", "10.0.0.9, 10.0.0.7")]);
        assert_eq!(r.identify(ip("10.1.1.1"), &all_trusted).ip, ip("10.0.0.9"));
        let garbage = headers(&[("x-forwarded-for", "1.2.3.4, bogus, 10.0.0.7")]);
        assert_eq!(r.identify(ip("10.1.1.1"), &garbage).ip, ip("10.0.0.7"));
        let split = headers(&[
            ("x-forwarded-for", "5.5.5.5"),
            ("x-forwarded-for", "10.0.0.2"),
        ]);
        assert_eq!(r.identify(ip("10.1.1.1"), &split).ip, ip("5.5.5.5"));
    }

    #[test]
    fn forwarded_header_is_understood() {
        let r = rules();
        let h = headers(&[(
            "forwarded",
            "for=9.9.9.9;proto=https, for=\"[2001:db8::5]:4711\"",
        )]);
        assert_eq!(r.identify(ip("10.1.1.1"), &h).ip, ip("2001:db8::"));
    }

    #[test]
    fn ipv6_is_aggregated_and_mapped_v4_normalised() {
        let r = rules();
        let a = r.identify(ip("2001:db8:1:2:aaaa::1"), &HeaderMap::new());
        let b = r.identify(ip("2001:db8:1:2:bbbb::9"), &HeaderMap::new());
        assert_eq!(a.ip, b.ip);
        assert_eq!(a.ip, ip("2001:db8:1:2::"));
        assert_eq!(
            r.identify(ip("::ffff:1.2.3.4"), &HeaderMap::new()).ip,
            ip("1.2.3.4")
        );
    }

    #[test]
    fn tiers_come_from_listed_keys_and_internal_ranges() {
        let r = rules();
        let pro = r.identify(ip("1.1.1.1"), &headers(&[("x-api-key", "k-pro")]));
        assert_eq!(&*pro.tier, "pro");
        assert!(pro.api_key.is_some());
        let made_up = r.identify(ip("1.1.1.1"), &headers(&[("x-api-key", "k-made-up")]));
        assert_eq!(&*made_up.tier, ANONYMOUS);
        assert!(made_up.api_key.is_none());
        let internal = r.identify(ip("192.168.3.3"), &headers(&[("x-api-key", "k-pro")]));
        assert_eq!(&*internal.tier, INTERNAL);
        let label = pro.log_label();
        assert!(
            !label.contains("k-pro") && label.contains("key#"),
            "{label}"
        );
    }
}
