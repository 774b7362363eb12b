use super::*;

fn rules_with(forwarded_header: ForwardedHeader) -> ClientRules {
    let mut api_keys = HashMap::new();
    let mut tiers = Tiers::default();
    api_keys.insert(b"k-pro".to_vec().into_boxed_slice(), tiers.intern("pro"));
    ClientRules {
        api_key_header: HeaderName::from_static("x-api-key"),
        trusted_proxies: vec!["10.0.0.0/8".parse().unwrap()],
        forwarded_header,
        ipv6_prefix: 64,
        internal: vec!["192.168.0.0/16".parse().unwrap()],
        api_keys,
        run_time: None,
        tiers,
        hasher: IdentityHasher::from_secret(b"test secret of sixteen bytes"),
        jwt: None,
    }
}

fn rules() -> ClientRules {
    rules_with(ForwardedHeader::XForwardedFor)
}

fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            http::HeaderValue::from_bytes(v).unwrap(),
        );
    }
    h
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn client_of(
    r: &ClientRules,
    peer: &str,
    pairs: &[(&str, &[u8])],
) -> Result<IpAddr, IdentityError> {
    r.identify(ip(peer), &headers(pairs)).map(|c| c.ip)
}

#[test]
fn forwarded_for_is_read_only_from_trusted_peers() {
    let r = rules();
    let chain: &[(&str, &[u8])] = &[("x-forwarded-for", b"6.6.6.6, 1.2.3.4, 10.0.0.7")];
    assert_eq!(client_of(&r, "8.8.8.8", chain), Ok(ip("8.8.8.8")));
    assert_eq!(client_of(&r, "10.1.1.1", chain), Ok(ip("1.2.3.4")));
    let c = r.identify(ip("10.1.1.1"), &headers(chain)).unwrap();
    assert_eq!(c.via.as_slice(), [ip("10.0.0.7")]);
    let all_trusted: &[(&str, &[u8])] = &[("x-forwarded-for", b"10.0.0.9, 10.0.0.7")];
    assert_eq!(client_of(&r, "10.1.1.1", all_trusted), Ok(ip("10.0.0.9")));
    let split: &[(&str, &[u8])] = &[
        ("x-forwarded-for", b"5.5.5.5"),
        ("x-forwarded-for", b"10.0.0.2"),
    ];
    assert_eq!(client_of(&r, "10.1.1.1", split), Ok(ip("5.5.5.5")));
    // No header from a trusted peer: the peer is the client.
    assert_eq!(client_of(&r, "10.1.1.1", &[]), Ok(ip("10.1.1.1")));
}

#[test]
fn one_odd_entry_spoils_only_itself() {
    let r = rules();
    // Garbage left of the client is never read.
    for value in [
        &b"\x80x, 198.51.100.11"[..],
        b"bogus, 198.51.100.11, 10.0.0.7",
        b", ,198.51.100.11,,",
        b"\"quoted, 198.51.100.11",
    ] {
        assert_eq!(
            client_of(&r, "10.1.1.1", &[("x-forwarded-for", value)]),
            Ok(ip("198.51.100.11")),
            "{}",
            String::from_utf8_lossy(value)
        );
    }
    // Garbage reached by the walk is never pinned on the proxy.
    for value in [
        &b"1.2.3.4, bogus, 10.0.0.7"[..],
        b"1.2.3.4, \xff",
        b"unknown",
    ] {
        assert_eq!(
            client_of(&r, "10.1.1.1", &[("x-forwarded-for", value)]),
            Err(IdentityError::UnreadableForwardedEntry),
            "{}",
            String::from_utf8_lossy(value)
        );
    }
}

#[test]
fn only_the_configured_header_is_read() {
    let xff = rules();
    let fwd = rules_with(ForwardedHeader::Forwarded);
    let both: &[(&str, &[u8])] = &[
        ("x-forwarded-for", b"7.7.7.7"),
        ("forwarded", b"for=9.9.9.9;proto=https"),
    ];
    assert_eq!(client_of(&xff, "10.1.1.1", both), Ok(ip("7.7.7.7")));
    assert_eq!(client_of(&fwd, "10.1.1.1", both), Ok(ip("9.9.9.9")));
    // A client's own X-Forwarded-For behind a Forwarded-writing proxy.
    let spoof: &[(&str, &[u8])] = &[("x-forwarded-for", b"1.1.1.1")];
    assert_eq!(client_of(&fwd, "10.1.1.1", spoof), Ok(ip("10.1.1.1")));
}

#[test]
fn forwarded_header_is_understood() {
    let r = rules_with(ForwardedHeader::Forwarded);
    let h: &[(&str, &[u8])] = &[(
        "forwarded",
        b"for=9.9.9.9;proto=https, For=\"[2001:db8::5]:4711\";by=\"a,b\"",
    )];
    assert_eq!(client_of(&r, "10.1.1.1", h), Ok(ip("2001:db8::")));
    let v4_port: &[(&str, &[u8])] = &[("forwarded", b"for=\"192.0.2.43:47011\"")];
    assert_eq!(client_of(&r, "10.1.1.1", v4_port), Ok(ip("192.0.2.43")));
    // A quote the client left open cannot swallow the proxy's element.
    let swallow: &[(&str, &[u8])] = &[("forwarded", b"for=10.0.0.1;x=\", for=203.0.113.7")];
    assert_eq!(
        client_of(&r, "10.1.1.1", swallow),
        Err(IdentityError::UnreadableForwardedEntry)
    );
    let two_lines: &[(&str, &[u8])] = &[
        ("forwarded", b"for=10.0.0.1;x=\""),
        ("forwarded", b"for=203.0.113.7"),
    ];
    assert_eq!(client_of(&r, "10.1.1.1", two_lines), Ok(ip("203.0.113.7")));
    for bad in [
        &b"for=unknown"[..],
        b"proto=https",
        b"for=_hidden",
        b"for=1.2.3.4;for=5.6.7.8",
    ] {
        assert_eq!(
            client_of(&r, "10.1.1.1", &[("forwarded", bad)]),
            Err(IdentityError::UnreadableForwardedEntry)
        );
    }
}

#[test]
fn ipv6_is_aggregated_and_mapped_v4_normalised() {
    let r = rules();
    let a = r
        .identify(ip("2001:db8:1:2:aaaa::1"), &HeaderMap::new())
        .unwrap();
    let b = r
        .identify(ip("2001:db8:1:2:bbbb::9"), &HeaderMap::new())
        .unwrap();
    assert_eq!(a.ip, b.ip);
    assert_eq!(a.ip_hash, b.ip_hash);
    assert_eq!(a.ip, ip("2001:db8:1:2::"));
    assert_eq!(client_of(&r, "::ffff:1.2.3.4", &[]), Ok(ip("1.2.3.4")));
}

#[test]
fn tiers_come_from_listed_keys_and_internal_ranges() {
    let r = rules();
    let pro = r
        .identify(ip("1.1.1.1"), &headers(&[("x-api-key", b"k-pro")]))
        .unwrap();
    assert_eq!(pro.tier.name(), "pro");
    assert!(pro.api_key.is_some());
    let made_up = r
        .identify(ip("1.1.1.1"), &headers(&[("x-api-key", b"k-made-up")]))
        .unwrap();
    assert_eq!(made_up.tier.name(), ANONYMOUS);
    assert!(made_up.api_key.is_none());
    let internal = r
        .identify(ip("192.168.3.3"), &headers(&[("x-api-key", b"k-pro")]))
        .unwrap();
    assert_eq!(internal.tier.name(), INTERNAL);
    let label = pro.log_label();
    assert!(
        !label.contains("k-pro") && label.contains("key#"),
        "{label}"
    );
}

#[test]
fn two_api_keys_are_refused() {
    let r = rules();
    let h = headers(&[("x-api-key", b"junk"), ("x-api-key", b"k-pro")]);
    assert_eq!(
        r.identify(ip("1.1.1.1"), &h).map(|c| c.tier),
        Err(IdentityError::AmbiguousApiKey)
    );
}

#[test]
fn hashes_depend_on_the_secret_and_the_kind() {
    let a = rules();
    let mut b = rules();
    b.hasher = IdentityHasher::from_secret(b"another secret, sixteen bytes+");
    let peer = ip("203.0.113.9");
    let ca = a.identify(peer, &HeaderMap::new()).unwrap();
    let cb = b.identify(peer, &HeaderMap::new()).unwrap();
    assert_ne!(ca.ip_hash, cb.ip_hash);
    let name = HeaderName::from_static("x-tenant");
    let twice = headers(&[("x-tenant", b"a"), ("x-tenant", b"b")]);
    assert_eq!(
        a.identity_of(&KeySource::Header(name.clone()), &ca, &inputs(&twice, None)),
        Err(IdentityError::AmbiguousKeyHeader(name))
    );
    assert_ne!(IdentityHasher::per_process(), IdentityHasher::public());
    assert_eq!(IdentityHasher::per_process(), IdentityHasher::per_process());
}

fn inputs<'a>(headers: &'a HeaderMap, query: Option<&'a str>) -> KeyInputs<'a> {
    KeyInputs {
        headers,
        query,
        host: None,
        route: "/users/*",
        fold_case: false,
        body: None,
    }
}

#[test]
fn values_compared_ignoring_case_share_one_identity() {
    let r = rules();
    let client = r.identify(ip("1.1.1.1"), &HeaderMap::new()).unwrap();
    let tenant = KeySource::Header(HeaderName::from_static("x-tenant"));
    let id = |value: &[u8], fold_case: bool| {
        let h = headers(&[("x-tenant", value)]);
        let inputs = KeyInputs {
            fold_case,
            ..inputs(&h, None)
        };
        r.identity_of(&tenant, &client, &inputs).unwrap()
    };
    assert_ne!(id(b"Acme", false), id(b"acme", false));
    assert_eq!(id(b"Acme", true), id(b"acme", true));
    assert_eq!(id(b"ACME", true), id(b"acme", true));
    assert_eq!(id("ÉCOLE".as_bytes(), true), id("école".as_bytes(), true));
    assert_ne!(id(b"acme", true), id(b"acme2", true));
    // The admin API's lookup folds as requests do.
    let part = KnownPart::Header(&HeaderName::from_static("x-tenant"), b"ACME");
    assert_eq!(r.identity_for(&tenant, &part, true), id(b"acme", true));
    // An API key is a secret: its case is kept.
    let key = KnownPart::ApiKey(b"K-Pro");
    assert_ne!(
        r.identity_for(&KeySource::ApiKey, &key, true),
        r.identity_for(&KeySource::ApiKey, &KnownPart::ApiKey(b"k-pro"), true)
    );
}

#[test]
fn cookies_queries_and_composites_are_read_as_applications_read_them() {
    let r = rules();
    let client = r.identify(ip("203.0.113.9"), &HeaderMap::new()).unwrap();
    let none = HeaderMap::new();
    let id = |key: &KeySource, headers: &HeaderMap, query: Option<&str>| {
        r.identity_of(key, &client, &inputs(headers, query))
    };
    let session = KeySource::Cookie("session".into());
    let a = headers(&[("cookie", b"theme=dark; session=abc")]);
    let split = headers(&[("cookie", b"theme=dark"), ("cookie", b"session=abc")]);
    assert!(id(&session, &a, None).unwrap().is_some());
    assert_eq!(id(&session, &a, None), id(&session, &split, None));
    // Quoted or escaped, as frameworks read it: one session.
    for spelling in [
        &b"session=\"abc\""[..],
        b"session=%61bc",
        b"s%65ssion=a%62c",
    ] {
        let spelled = headers(&[("cookie", spelling)]);
        assert_eq!(id(&session, &spelled, None), id(&session, &a, None));
    }
    assert_eq!(id(&session, &none, None), Ok(None));
    let twice = headers(&[("cookie", b"session=abc; session=def")]);
    assert_eq!(
        id(&session, &twice, None),
        Err(IdentityError::AmbiguousKeyCookie("session".into()))
    );
    // One value however it is spelled; a name spelled twice is ambiguous.
    let user = KeySource::Query("user".into());
    let plain = id(&user, &none, Some("user=ann+lee&x=1")).unwrap();
    assert!(plain.is_some());
    assert_eq!(id(&user, &none, Some("x=1&user=ann%20lee")).unwrap(), plain);
    assert_eq!(id(&user, &none, Some("us%65r=ann+lee")).unwrap(), plain);
    assert_eq!(
        id(&user, &none, Some("user=a&us%65r=b")),
        Err(IdentityError::AmbiguousKeyQuery("user".into()))
    );
    assert_eq!(id(&user, &none, Some("username=x")), Ok(None));
    assert_eq!(id(&user, &none, None), Ok(None));
    // A cookie's value and a query parameter's are different identities.
    let same = headers(&[("cookie", b"user=ann")]);
    assert_ne!(
        id(&KeySource::Cookie("user".into()), &same, None),
        id(&user, &none, Some("user=ann"))
    );
    // Composite: all parts or nothing; the route is the pattern.
    let both = KeySource::Composite(vec![session.clone(), KeySource::Route]);
    assert!(id(&both, &a, None).unwrap().is_some());
    assert_ne!(id(&both, &a, None), id(&session, &a, None));
    assert_eq!(id(&both, &none, None), Ok(None));
    let other_route = KeyInputs {
        route: "/orders",
        ..inputs(&a, None)
    };
    assert_ne!(
        r.identity_of(&both, &client, &other_route),
        id(&both, &a, None)
    );
}

#[test]
fn hosts_compare_without_port_case_or_final_dot() {
    for (host, expected) in [
        ("API.Example.com", "api.example.com"),
        ("api.example.com:8443", "api.example.com"),
        ("api.example.com.", "api.example.com"),
        ("[::1]:8080", "[::1]"),
        ("127.0.0.1:80", "127.0.0.1"),
        // An IPv6 literal's last colon is no port's.
        ("[::1]", "[::1]"),
        ("::1", "::1"),
    ] {
        assert_eq!(normalize_host(host), expected, "{host}");
    }
}

#[test]
fn descriptor_keys_read_entries_and_nothing_of_http() {
    let r = rules();
    let entry = |name: &str| KeySource::Entry(name.into());
    let of = |key: &KeySource, entries: &[(&str, &str)]| r.descriptor_identity(key, entries);
    let login = [("remote_address", "10.0.0.1"), ("path", "/login")];
    let address = of(&entry("remote_address"), &login).expect("the entry is there");
    // The value alone is the identity: another path, the same address.
    assert_eq!(
        of(
            &entry("remote_address"),
            &[("remote_address", "10.0.0.1"), ("path", "/x")]
        ),
        Some(address)
    );
    assert_ne!(
        of(&entry("remote_address"), &[("remote_address", "10.0.0.2")]),
        Some(address)
    );
    assert_eq!(of(&entry("user"), &login), None);
    // The whole descriptor, keys and values, with no two joined to one
    // text.
    let whole = of(&KeySource::Descriptor, &[("a", "bc")]);
    assert_ne!(whole, of(&KeySource::Descriptor, &[("ab", "c")]));
    assert_ne!(whole, of(&KeySource::Descriptor, &[("a", "b"), ("c", "")]));
    // A composite of entries, and everyone's key.
    let both = KeySource::Composite(vec![entry("remote_address"), entry("path")]);
    assert!(of(&both, &login).is_some());
    assert_ne!(
        of(&both, &login),
        of(&both, &[("remote_address", "10.0.0.1"), ("path", "/y")])
    );
    assert_eq!(of(&KeySource::Global, &login), Some(0));
    // An HTTP key finds nothing in a descriptor.
    assert_eq!(of(&KeySource::Ip, &login), None);
    assert_eq!(
        of(&KeySource::Header(HeaderName::from_static("path")), &login),
        None
    );
    // The admin API's lookup by one entry finds the state a call keyed.
    assert_eq!(
        r.identity_for(
            &entry("remote_address"),
            &KnownPart::Entry("remote_address", b"10.0.0.1"),
            false
        ),
        Some(address)
    );
}

#[test]
fn a_listener_that_trusts_no_one_groups_addresses_as_the_gateway_does() {
    let mut rules = rules();
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    // Trusted or not, an address is its own group; IPv4-mapped is IPv4.
    assert_eq!(rules.address_group_of(ip("10.1.2.3")), ip("10.1.2.3"));
    assert_eq!(
        rules.address_group_of(ip("::ffff:10.1.2.3")),
        ip("10.1.2.3")
    );
    assert_eq!(
        rules.address_group_of(ip("2001:db8:1:2:aaaa::1")),
        ip("2001:db8:1:2::")
    );
    // The configured prefix, not a fixed /64.
    rules.ipv6_prefix = 48;
    assert_eq!(
        rules.address_group_of(ip("2001:db8:1:2:aaaa::1")),
        ip("2001:db8:1::")
    );
    rules.ipv6_prefix = 128;
    assert_eq!(
        rules.address_group_of(ip("2001:db8:1:2:aaaa::1")),
        ip("2001:db8:1:2:aaaa::1")
    );
}

#[test]
fn remote_address_is_keyed_as_the_client_address_the_gateway_keys() {
    let r = rules();
    let remote = KeySource::Entry("remote_address".into());
    let of =
        |key: &KeySource, value: &str| r.descriptor_identity(key, &[("remote_address", value)]);
    // One IPv4 client in any spelling, and the gateway's `ip` key for it.
    let v4 = of(&remote, "192.0.2.7");
    assert_eq!(v4, Some(r.address_identity("192.0.2.7".parse().unwrap())));
    for spelling in [
        "::ffff:192.0.2.7",
        "::FFFF:C000:207",
        "0:0:0:0:0:ffff:192.0.2.7",
    ] {
        assert_eq!(of(&remote, spelling), v4, "{spelling}");
    }
    // An IPv6 address and every other of its /64 (ipv6_prefix).
    let v6 = of(&remote, "2001:db8:1:2::1");
    for spelling in [
        "2001:DB8:1:2::1",
        "2001:0db8:0001:0002:0000:0000:0000:0001",
        "2001:db8:1:2:ffff:1:2:3",
    ] {
        assert_eq!(of(&remote, spelling), v6, "{spelling}");
    }
    assert_ne!(of(&remote, "2001:db8:1:3::1"), v6);
    // The whole descriptor reads it the same way.
    let whole = |value: &str| {
        r.descriptor_identity(
            &KeySource::Descriptor,
            &[("generic_key", "login"), ("remote_address", value)],
        )
    };
    assert_eq!(whole("::ffff:192.0.2.7"), whole("192.0.2.7"));
    assert_eq!(whole("2001:db8:1:2::9"), whole("2001:DB8:1:2::1"));
    assert_ne!(whole("2001:db8:1:3::1"), whole("2001:db8:1:2::1"));
    // Text that is no address keeps a budget of its own, by its text.
    let pipe = of(&remote, "pipe:/run/envoy.sock");
    assert!(pipe.is_some());
    assert_ne!(pipe, of(&remote, "Pipe:/run/envoy.sock"));
    assert_ne!(pipe, v4);
    // Another entry that holds an address is text like any other.
    let other = KeySource::Entry("x".into());
    assert_ne!(
        r.descriptor_identity(&other, &[("x", "::ffff:192.0.2.7")]),
        r.descriptor_identity(&other, &[("x", "192.0.2.7")])
    );
    // The admin API's lookup by any of its addresses finds the network.
    assert_eq!(
        r.identity_for(
            &remote,
            &KnownPart::Entry("remote_address", b"2001:db8:1:2::abcd"),
            false
        ),
        v6
    );
    assert_eq!(
        r.address_label("::ffff:192.0.2.7".parse().unwrap()),
        "192.0.2.7"
    );
    assert_eq!(
        r.address_label("2001:db8:1:2::9".parse().unwrap()),
        "2001:db8:1:2::/64"
    );
}

fn tier_of(r: &ClientRules, key: &[u8]) -> String {
    r.identify(ip("203.0.113.1"), &headers(&[("x-api-key", key)]))
        .unwrap()
        .tier
        .name()
        .to_string()
}

#[test]
fn a_run_time_key_beats_the_file_and_a_revoked_one_is_no_key() {
    let mut r = rules();
    r.tiers.intern("free");
    let table = Arc::new(RunTimeKeys::default());
    r.run_time = Some(table.clone());
    let set = |key: &[u8], tier: Option<&str>| {
        table.set([(
            r.api_key_hash(key),
            KeyEntry {
                tier: tier.map(Arc::from),
                set_at: 0,
                label: None,
            },
        )])
    };
    // Empty table: the file alone.
    assert_eq!(tier_of(&r, b"k-pro"), "pro");
    assert_eq!(tier_of(&r, b"new"), "anonymous");
    set(b"new", Some("free"));
    assert_eq!(tier_of(&r, b"new"), "free");
    let known = r.known_key(b"new").unwrap();
    assert_eq!(known.hash, r.api_key_hash(b"new"));
    set(b"k-pro", Some("free"));
    assert_eq!(tier_of(&r, b"k-pro"), "free");
    set(b"k-pro", None);
    assert_eq!(tier_of(&r, b"k-pro"), "anonymous");
    assert!(r.known_key(b"k-pro").is_none());
    // Dropped from the table: the file's tier again.
    table.remove(r.api_key_hash(b"k-pro"));
    assert_eq!(tier_of(&r, b"k-pro"), "pro");
    // A tier the configuration no longer names: known, anonymous numbers.
    set(b"gone", Some("platinum"));
    assert_eq!(tier_of(&r, b"gone"), "anonymous");
    assert!(r.known_key(b"gone").is_some());
}

#[test]
fn a_clients_log_label_shows_its_address_group_key_label_and_tier() {
    let r = rules();
    let key = r.api_key_hash(b"k-pro");
    assert_eq!(ApiKey::label_of(key), format!("key#{:08x}", key >> 96));
    assert_eq!(ApiKey::label_of(0xabcd_ef01 << 96), "key#abcdef01");
    assert_eq!(ApiKey::label_of(0x1 << 96 | 0xffff), "key#00000001");
    let pro = r
        .identify(ip("1.1.1.1"), &headers(&[("x-api-key", b"k-pro")]))
        .unwrap();
    assert_eq!(
        pro.log_label(),
        format!("ip=1.1.1.1 {} tier=pro", ApiKey::label_of(key))
    );
    let v6 = r.identify(ip("2001:db8:1:2::9"), &headers(&[])).unwrap();
    assert_eq!(v6.address_label(), "2001:db8:1:2::/64");
    assert_eq!(v6.log_label(), "ip=2001:db8:1:2::/64 tier=anonymous");
}

#[test]
fn an_address_alone_is_internal_or_anonymous_and_a_trusted_proxy_is_no_group() {
    let r = rules();
    assert_eq!(r.tier_of_address(ip("192.168.1.1")).name(), INTERNAL);
    assert_eq!(r.tier_of_address(ip("::ffff:192.168.1.1")).name(), INTERNAL);
    assert_eq!(r.tier_of_address(ip("1.1.1.1")).name(), ANONYMOUS);
    assert!(r.is_trusted(&ip("10.9.8.7")));
    assert!(!r.is_trusted(&ip("11.0.0.1")));
    assert_eq!(r.connection_group(ip("10.9.8.7")), None);
    assert_eq!(r.connection_group(ip("::ffff:10.9.8.7")), None);
    assert_eq!(r.connection_group(ip("1.1.1.1")), Some(ip("1.1.1.1")));
    assert_eq!(
        r.connection_group(ip("2001:db8:1:2:aaaa::1")),
        Some(ip("2001:db8:1:2::"))
    );
}

/// `[clients.jwt]` with one HMAC key (any key the verifier takes), the
/// tier named by claim `plan` (`gold` is tier pro), and a token of
/// `claims` signed with it, verified.
fn verified(r: &mut ClientRules, claims: &str) -> TokenCheck {
    use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
    let key = crate::jwt::VerifyingKey {
        kid: None,
        key: DecodingKey::from_secret(b"a test key"),
        validation: Validation::new(Algorithm::HS256),
    };
    let tiers = HashMap::from([("gold".to_string(), "pro".to_string())]);
    let jwt = JwtRules::new(
        HeaderName::from_static("authorization"),
        vec![key],
        0,
        ClaimPath::parse("plan"),
        tiers,
    );
    let claims: serde_json::Value = serde_json::from_str(claims).unwrap();
    let token = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(b"a test key"),
    )
    .unwrap();
    let check = jwt.verify_fresh(&token, ip("1.1.1.1"), 1_000);
    r.jwt = Some(Arc::new(jwt));
    check
}

#[test]
fn a_verified_token_names_the_tier_and_subject_and_an_internal_address_stays_internal() {
    let mut r = rules();
    let gold = verified(&mut r, r#"{"sub":"alice","plan":"gold","exp":9999999999}"#);
    assert!(gold.claims().is_some(), "{gold:?}");
    let mut client = r.identify(ip("1.1.1.1"), &headers(&[])).unwrap();
    r.apply_token(&mut client, gold.clone());
    assert_eq!(client.tier.name(), "pro");
    assert_eq!(client.subject_hash, Some(r.subject_hash(b"alice")));
    assert_ne!(r.subject_hash(b"alice"), r.subject_hash(b"bob"));
    assert!(client.token.as_ref().is_some_and(|t| t.claims().is_some()));
    let mut internal = r.identify(ip("192.168.1.1"), &headers(&[])).unwrap();
    r.apply_token(&mut internal, gold);
    assert_eq!(internal.tier.name(), INTERNAL);
    assert_eq!(internal.subject_hash, Some(r.subject_hash(b"alice")));
    // A plan no tier is named for leaves the tier as it was.
    let bronze = verified(&mut r, r#"{"sub":"bob","plan":"bronze","exp":9999999999}"#);
    let mut client = r.identify(ip("1.1.1.1"), &headers(&[])).unwrap();
    r.apply_token(&mut client, bronze.clone());
    assert_eq!(client.tier.name(), ANONYMOUS);
    assert_eq!(client.subject_hash, Some(r.subject_hash(b"bob")));
    // No token, or no [clients.jwt]: nothing but the token's outcome.
    let mut client = r.identify(ip("1.1.1.1"), &headers(&[])).unwrap();
    r.apply_token(&mut client, TokenCheck::Absent);
    assert_eq!((client.tier.name(), client.subject_hash), (ANONYMOUS, None));
    assert!(matches!(client.token, Some(TokenCheck::Absent)));
    r.jwt = None;
    let mut client = r.identify(ip("1.1.1.1"), &headers(&[])).unwrap();
    r.apply_token(&mut client, bronze);
    assert_eq!((client.tier.name(), client.subject_hash), (ANONYMOUS, None));
    assert!(client.token.is_some());
}

fn every_key_source() -> Vec<KeySource> {
    vec![
        KeySource::Ip,
        KeySource::ApiKey,
        KeySource::Header(HeaderName::from_static("x-tenant")),
        KeySource::Global,
        KeySource::Cookie("session".into()),
        KeySource::Query("user".into()),
        KeySource::Host,
        KeySource::Route,
        KeySource::Jwt(ClaimPath::parse("org.id").unwrap()),
        KeySource::Entry("remote_address".into()),
        KeySource::Body("model".into()),
        KeySource::Descriptor,
    ]
}

#[test]
fn a_key_describes_itself_as_the_configuration_spells_it() {
    let spelled: Vec<String> = every_key_source().iter().map(KeySource::describe).collect();
    assert_eq!(
        spelled,
        [
            "ip",
            "api_key",
            "header:x-tenant",
            "global",
            "cookie:session",
            "query:user",
            "host",
            "route",
            "jwt:org.id",
            "descriptor:remote_address",
            "body:model",
            "descriptor",
        ]
    );
    let both = KeySource::Composite(vec![KeySource::Ip, KeySource::Route]);
    assert_eq!(both.describe(), "[ip, route]");
}

#[test]
fn what_a_key_reads_says_whether_it_is_omittable_per_client_unforgeable_or_a_descriptors() {
    // (omittable, per_client, unforgeable, reads_descriptor), in the order
    // of every_key_source.
    let expected = [
        (false, true, true, false),   // ip
        (true, true, true, false),    // api_key
        (true, true, false, false),   // header
        (false, false, false, false), // global
        (true, true, false, false),   // cookie
        (true, true, false, false),   // query
        (false, false, false, false), // host
        (false, false, false, false), // route
        (true, true, true, false),    // jwt
        (false, true, false, true),   // descriptor:<key>
        (true, true, false, false),   // body
        (false, true, false, true),   // descriptor
    ];
    for (key, want) in every_key_source().iter().zip(expected) {
        let got = (
            key.omittable(),
            key.per_client(),
            key.unforgeable(),
            key.reads_descriptor(),
        );
        assert_eq!(got, want, "{}", key.describe());
    }
    // A composite is each of these when some part is.
    let host_route = KeySource::Composite(vec![KeySource::Host, KeySource::Route]);
    assert!(!host_route.per_client() && !host_route.omittable());
    let with_cookie = KeySource::Composite(vec![KeySource::Route, KeySource::Cookie("s".into())]);
    assert!(with_cookie.per_client() && with_cookie.omittable() && !with_cookie.unforgeable());
    let with_ip = KeySource::Composite(vec![KeySource::Host, KeySource::Ip]);
    assert!(with_ip.unforgeable() && !with_ip.omittable() && !with_ip.reads_descriptor());
    let entries = KeySource::Composite(vec![KeySource::Global, KeySource::Entry("a".into())]);
    assert!(entries.reads_descriptor());
}

#[test]
fn escapes_decode_only_where_they_are_whole_and_plus_is_a_space_in_queries_only() {
    let cookie = |value: &str| {
        let h = headers(&[("cookie", format!("s={value}").as_bytes())]);
        keys::cookie(&h, "s").unwrap().unwrap()
    };
    let query = |value: &str| {
        keys::query_parameter(Some(&format!("q={value}")), "q")
            .unwrap()
            .unwrap()
    };
    assert_eq!(form_decode("a%41"), b"aA");
    assert_eq!(form_decode("%4a%4A"), b"JJ");
    assert_eq!(form_decode("%41%4"), b"A%4");
    assert_eq!(form_decode("%4"), b"%4");
    assert_eq!(form_decode("%"), b"%");
    assert_eq!(form_decode("%zz%g1"), b"%zz%g1");
    assert_eq!(form_decode("a+b"), b"a b");
    assert_eq!(cookie("a+b%2B"), b"a+b+");
    assert_eq!(query("a+b%2B"), b"a b+");
    assert_eq!(query("%ff"), [0xff]);
    // A pair without '=' is no cookie; a parameter without one is empty.
    let flag = headers(&[("cookie", b"s; s=v")]);
    assert_eq!(keys::cookie(&flag, "s"), Ok(Some(b"v".to_vec())));
    assert_eq!(
        keys::query_parameter(Some("q&x=1"), "q"),
        Ok(Some(Vec::new()))
    );
}

#[test]
fn a_lookup_by_one_part_finds_what_a_request_keyed_on_that_part_found() {
    let mut r = rules();
    let token = verified(&mut r, r#"{"sub":"alice","plan":"gold","exp":9999999999}"#);
    let mut client = r
        .identify(ip("1.1.1.1"), &headers(&[("x-api-key", b"k-pro")]))
        .unwrap();
    r.apply_token(&mut client, token);
    let h = headers(&[("x-tenant", b"Acme"), ("cookie", b"session=abc")]);
    let request = inputs(&h, Some("user=ann"));
    let (sub, plan) = (
        ClaimPath::parse("sub").unwrap(),
        ClaimPath::parse("plan").unwrap(),
    );
    let (tenant, other) = (
        HeaderName::from_static("x-tenant"),
        HeaderName::from_static("x-other"),
    );
    let nowhere = KnownPart::Ip(ip("9.9.9.9"));
    // Each key, the part that names the request's value, and a part that
    // names another thing.
    let cases = [
        (
            KeySource::Ip,
            KnownPart::Ip(ip("1.1.1.1")),
            KnownPart::ApiKey(b"k-pro"),
        ),
        (KeySource::ApiKey, KnownPart::ApiKey(b"k-pro"), nowhere),
        (
            KeySource::ApiKey,
            KnownPart::ApiKeyHash(r.api_key_hash(b"k-pro")),
            nowhere,
        ),
        (
            KeySource::Header(tenant.clone()),
            KnownPart::Header(&tenant, b"Acme"),
            KnownPart::Header(&other, b"Acme"),
        ),
        (
            KeySource::Cookie("session".into()),
            KnownPart::Cookie("session", b"abc"),
            KnownPart::Cookie("other", b"abc"),
        ),
        (
            KeySource::Query("user".into()),
            KnownPart::Query("user", b"ann"),
            KnownPart::Query("other", b"ann"),
        ),
        (
            KeySource::Jwt(sub.clone()),
            KnownPart::Claim(&sub, b"alice"),
            KnownPart::Claim(&plan, b"alice"),
        ),
    ];
    for (key, part, wrong) in &cases {
        let found = r.identity_of(key, &client, &request).unwrap();
        assert!(found.is_some(), "{}", key.describe());
        assert_eq!(
            r.identity_for(key, part, false),
            found,
            "{}",
            key.describe()
        );
        assert_eq!(
            r.identity_for(key, wrong, false),
            None,
            "{}",
            key.describe()
        );
    }
    // A request is everyone's and carries every part; one part alone is
    // neither, nor a descriptor.
    let of = |key: &KeySource| r.identity_of(key, &client, &request).unwrap();
    assert_eq!(of(&KeySource::Global), Some(0));
    assert_eq!(of(&KeySource::Entry("remote_address".into())), None);
    assert_eq!(of(&KeySource::Descriptor), None);
    let address = KnownPart::Ip(ip("1.1.1.1"));
    assert_eq!(r.identity_for(&KeySource::Global, &address, false), None);
    let composite = KeySource::Composite(vec![KeySource::Ip]);
    assert!(of(&composite).is_some());
    assert_eq!(r.identity_for(&composite, &address, false), None);
    // One part's value is folded only when asked to.
    let spelled = |value: &'static [u8]| {
        r.identity_for(
            &KeySource::Header(tenant.clone()),
            &KnownPart::Header(&tenant, value),
            false,
        )
    };
    assert_ne!(spelled(b"ACME"), spelled(b"acme"));
    // An entry is found by its own key only.
    let entry = KeySource::Entry("remote_address".into());
    assert_eq!(
        r.identity_for(&entry, &KnownPart::Entry("path", b"10.0.0.1"), false),
        None
    );
}

#[test]
fn a_descriptor_carries_no_cookie_query_claim_host_route_or_body() {
    let r = rules();
    let entries = [("remote_address", "10.0.0.1"), ("cookie", "session=abc")];
    for key in [
        KeySource::Cookie("session".into()),
        KeySource::Query("remote_address".into()),
        KeySource::Jwt(ClaimPath::parse("remote_address").unwrap()),
        KeySource::ApiKey,
        KeySource::Host,
        KeySource::Route,
        KeySource::Body("remote_address".into()),
    ] {
        assert_eq!(
            r.descriptor_identity(&key, &entries),
            None,
            "{}",
            key.describe()
        );
    }
}

#[test]
fn tiers_are_interned_once_and_compared_by_id() {
    let mut tiers = Tiers::default();
    let pro = tiers.intern("pro");
    assert_eq!(tiers.intern("pro"), pro);
    assert_eq!(tiers.get("pro"), Some(pro.clone()));
    assert_eq!(tiers.get("gold"), None);
    assert_ne!(tiers.anonymous(), tiers.internal());
    assert_ne!(pro, tiers.anonymous());
    assert_eq!(tiers.anonymous().name(), ANONYMOUS);
    assert_eq!(tiers.internal().name(), INTERNAL);
    assert_eq!(
        tiers.names().collect::<Vec<_>>(),
        [ANONYMOUS, INTERNAL, "pro"]
    );
    assert_eq!(format!("[{pro:>5}]"), "[  pro]", "padded as a str is");
}

#[test]
fn a_hasher_shows_no_key_and_each_drawn_key_is_new() {
    let hasher = IdentityHasher::from_secret(b"test secret of sixteen bytes");
    assert_eq!(format!("{hasher:?}"), "IdentityHasher(..)");
    assert_ne!(random_key(), random_key());
}

#[test]
fn each_identity_error_has_its_code() {
    let codes: Vec<&str> = [
        IdentityError::AmbiguousApiKey,
        IdentityError::UnreadableForwardedEntry,
        IdentityError::AmbiguousKeyHeader(HeaderName::from_static("x-tenant")),
        IdentityError::AmbiguousKeyCookie("session".into()),
        IdentityError::AmbiguousKeyQuery("user".into()),
        IdentityError::MissingKey("per-user".into()),
    ]
    .iter()
    .map(IdentityError::code)
    .collect();
    assert_eq!(
        codes,
        [
            "ambiguous_api_key",
            "bad_forwarded_header",
            "ambiguous_key_header",
            "ambiguous_key_cookie",
            "ambiguous_key_query",
            "missing_key",
        ]
    );
}
