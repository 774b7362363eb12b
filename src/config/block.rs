//! `[block]`: the clients refused before anything else.

use ipnet::IpNet;

use super::file::BlockSection;
use super::{at, Invalid};
use floodgate_policy::blocklist::Blocklist;
use floodgate_policy::identity::ClientRules;

pub(super) fn validate_block(
    b: &BlockSection,
    clients: &ClientRules,
) -> Result<Blocklist, Invalid> {
    let cidrs = b
        .cidrs
        .iter()
        .enumerate()
        .map(|(i, text)| {
            text.parse::<IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
                .map(ipv4_if_mapped)
                .map_err(|_| {
                    at(
                        &[&"block", &"cidrs", &i],
                        format!("\"{text}\" is not an address or a CIDR like \"203.0.113.0/24\""),
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    if !b.jwt_subjects.is_empty() && clients.jwt.is_none() {
        return Err(at(
            &[&"block", &"jwt_subjects"],
            "a subject is read from a verified token: configure [clients.jwt]",
        ));
    }
    let status = match b.status {
        None => 403,
        Some(code) => u16::try_from(code)
            .ok()
            .filter(|c| (400..=599).contains(c))
            .ok_or_else(|| at(&[&"block", &"status"], "must be a status from 400 to 599"))?,
    };
    Ok(Blocklist {
        cidrs,
        api_keys: b
            .api_keys
            .iter()
            .map(|key| clients.api_key_hash(key.as_bytes()))
            .collect(),
        jwt_subjects: b
            .jwt_subjects
            .iter()
            .map(|subject| clients.subject_hash(subject.as_bytes()))
            .collect(),
        status,
    })
}

/// Clients are matched as IPv4 when they come as IPv4-mapped IPv6
/// (`identity::normalize`): a range written that way is read as IPv4 too.
fn ipv4_if_mapped(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.network().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96)
                .map(IpNet::V4)
                .unwrap_or(net),
            None => net,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_mapped_range_is_read_as_ipv4() {
        let read = |t: &str| ipv4_if_mapped(t.parse().expect("a range"));
        assert_eq!(
            read("::ffff:203.0.113.0/120"),
            "203.0.113.0/24".parse::<IpNet>().unwrap()
        );
        assert_eq!(
            read("2001:db8::/32"),
            "2001:db8::/32".parse::<IpNet>().unwrap()
        );
        assert_eq!(
            read("198.51.100.0/24"),
            "198.51.100.0/24".parse::<IpNet>().unwrap()
        );
    }
}
