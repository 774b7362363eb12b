use super::*;

fn rules() -> JwtRules {
    JwtRules::new(
        http::header::AUTHORIZATION,
        Vec::new(),
        0,
        None,
        HashMap::new(),
    )
}

/// A token with a readable header and claims, and a made-up signature.
fn garbage(i: usize, header: &str) -> String {
    let enc = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    format!(
        "{}.{}.{i:0>64}",
        enc(header),
        enc("{\"sub\":\"x\",\"exp\":9999999999}")
    )
}

#[test]
fn an_address_gets_a_budget_of_failed_checks_and_no_more() {
    let budget = SignatureBudget::default();
    let (one, other): (IpAddr, IpAddr) =
        ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
    let now = 1_000 * 1_000_000;
    let mut allowed = 0;
    for _ in 0..30 {
        if budget.allows(one, now) {
            allowed += 1;
            budget.spend(one, now);
        }
    }
    assert_eq!(allowed, 20);
    assert!(budget.allows(other, now), "the budget is the address's");
    // Two checks a second come back.
    let later: Vec<bool> = (0..3)
        .map(|_| {
            let ok = budget.allows(one, now + 1_000_000);
            if ok {
                budget.spend(one, now + 1_000_000);
            }
            ok
        })
        .collect();
    assert_eq!(later, [true, true, false]);
}

#[test]
fn junk_that_needs_no_signature_spends_no_budget() {
    let jwt = rules();
    let addr: IpAddr = "192.0.2.1".parse().unwrap();
    for i in 0..50 {
        let r = jwt.verify_fresh(&garbage(i, r#"{"alg":"ES256","typ":"JWT"}"#), addr, 1_000);
        assert!(
            matches!(r, TokenCheck::Rejected(Rejection::WrongAlgorithm)),
            "{r:?}"
        );
    }
}

#[test]
fn refused_tokens_are_remembered_as_hashes_and_forgotten_when_stale() {
    let jwt = rules();
    let header = r#"{"alg":"ES256"}"#;
    let now = 2_000;
    for i in 0..2 * REFUSED {
        // A different address each time: no budget runs out.
        let addr = IpAddr::from([10, 0, (i / 256) as u8, (i % 256) as u8]);
        let token = format!("{}{}", garbage(i, header), "A".repeat(60_000));
        jwt.verify_fresh(&token, addr, now);
    }
    assert_eq!(jwt.held().1, REFUSED, "the cache is bounded");
    let token = garbage(0, header) + &"A".repeat(60_000);
    assert!(jwt.known(&token, now).is_none(), "evicted");
    let last = garbage(2 * REFUSED - 1, header) + &"A".repeat(60_000);
    assert!(matches!(
        jwt.known(&last, now + 1),
        Some(TokenCheck::Rejected(Rejection::WrongAlgorithm))
    ));
    // Past their time, they go as soon as something new comes.
    let fresh = garbage(7, r#"{"alg":"RS256"}"#);
    jwt.verify_fresh(&fresh, IpAddr::from([10, 9, 9, 9]), now + REFUSED_FOR_S);
    assert_eq!(jwt.held().1, 1);
    // Each entry is a hash and a verdict, whatever the token's size.
    assert!(std::mem::size_of::<(u128, (Rejection, u64))>() <= 48);
}

#[test]
fn a_critical_header_fails_before_any_signature_is_checked() {
    let enc = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let token = |h: &str| format!("{}.e30.sig", enc(h));
    assert_eq!(
        names_critical_extensions(&token(r#"{"alg":"ES256"}"#)),
        Ok(false)
    );
    assert_eq!(
        names_critical_extensions(&token(r#"{"alg":"ES256","crit":["exp"],"exp":1}"#)),
        Ok(true)
    );
    assert_eq!(
        names_critical_extensions(&token(r#"{"alg":"ES256","crit":[]}"#)),
        Ok(true)
    );
    assert_eq!(
        names_critical_extensions("@@@.e30.sig"),
        Err(Rejection::Malformed)
    );
}

#[test]
fn numeric_dates_are_numbers() {
    assert_eq!(seconds(&serde_json::json!(1767225600)), Some(1767225600));
    assert_eq!(seconds(&serde_json::json!(1767225600.9)), Some(1767225600));
    assert_eq!(seconds(&serde_json::json!("1767225600")), None);
    assert_eq!(seconds(&serde_json::json!(-1)), None);
    assert_eq!(seconds(&serde_json::json!(null)), None);
}

const SECRET: &[u8] = b"a test key";
/// An `exp` far off: the library checks it against the real clock.
const LATER: u64 = 4_000_000_000;

fn hs256(kid: Option<&str>, secret: &[u8]) -> VerifyingKey {
    VerifyingKey {
        kid: kid.map(str::to_string),
        key: DecodingKey::from_secret(secret),
        validation: Validation::new(Algorithm::HS256),
    }
}

fn rules_of(keys: Vec<VerifyingKey>) -> JwtRules {
    JwtRules::new(http::header::AUTHORIZATION, keys, 0, None, HashMap::new())
}

fn signed(kid: Option<&str>, secret: &[u8], claims: &str) -> String {
    let mut header = jsonwebtoken::Header::new(Algorithm::HS256);
    header.kid = kid.map(str::to_string);
    let claims: Value = serde_json::from_str(claims).unwrap();
    let key = jsonwebtoken::EncodingKey::from_secret(secret);
    jsonwebtoken::encode(&header, &claims, &key).unwrap()
}

fn good(sub: &str) -> String {
    signed(None, SECRET, &format!(r#"{{"sub":"{sub}","exp":{LATER}}}"#))
}

fn forged(i: u64) -> String {
    let claims = format!(r#"{{"sub":"x","exp":{LATER},"i":{i}}}"#);
    signed(None, b"another key", &claims)
}

fn address(last: u8) -> IpAddr {
    IpAddr::from([192, 0, 2, last])
}

#[test]
fn a_claim_is_read_by_its_path_as_a_string_a_number_or_a_boolean() {
    let path = |p: &str| ClaimPath::parse(p);
    assert_eq!(
        path("org.id").map(|p| p.describe()).as_deref(),
        Some("org.id")
    );
    for bad in ["", ".", "a..b", "a.", ".a"] {
        assert_eq!(path(bad), None, "{bad}");
    }
    let claims = Claims(serde_json::json!({
        "sub": "alice", "n": 42, "ok": true, "org": {"id": "o-1"}, "list": [1], "none": null
    }));
    let get = |p: &str| claims.get(&ClaimPath::parse(p).unwrap());
    assert_eq!(get("sub"), Some(b"alice".to_vec()));
    assert_eq!(get("n"), Some(b"42".to_vec()));
    assert_eq!(get("ok"), Some(b"true".to_vec()));
    assert_eq!(get("org.id"), Some(b"o-1".to_vec()));
    for absent in ["org", "list", "none", "missing", "sub.x"] {
        assert_eq!(get(absent), None, "{absent}");
    }
}

#[test]
fn each_rejection_has_its_label_and_each_library_error_its_rejection() {
    let labels: Vec<&str> = Rejection::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        labels,
        [
            "expired",
            "not_yet_valid",
            "bad_signature",
            "wrong_algorithm",
            "wrong_issuer",
            "wrong_audience",
            "unknown_key",
            "missing_claim",
            "malformed",
            "unknown_critical",
            "throttled"
        ]
    );
    for (kind, rejection) in [
        (ErrorKind::ExpiredSignature, Rejection::Expired),
        (ErrorKind::ImmatureSignature, Rejection::NotYetValid),
        (ErrorKind::InvalidSignature, Rejection::BadSignature),
        (ErrorKind::InvalidAlgorithm, Rejection::WrongAlgorithm),
        (ErrorKind::MissingAlgorithm, Rejection::WrongAlgorithm),
        (ErrorKind::InvalidIssuer, Rejection::WrongIssuer),
        (ErrorKind::InvalidAudience, Rejection::WrongAudience),
        (
            ErrorKind::MissingRequiredClaim("exp".into()),
            Rejection::MissingClaim,
        ),
        (ErrorKind::InvalidToken, Rejection::Malformed),
    ] {
        assert_eq!(Rejection::of(&kind), rejection, "{kind:?}");
    }
}

#[test]
fn rules_describe_their_keys_and_each_key_kind_its_algorithms() {
    let mut two = rules_of(vec![hs256(Some("a"), SECRET), hs256(Some("b"), SECRET)]);
    let keys = "2 key(s) verifying HS256 from authorization; leeway 0s";
    assert_eq!(two.describe(), keys);
    two.tier_claim = ClaimPath::parse("plan");
    assert_eq!(two.describe(), format!("{keys}; tier from claim plan"));
    assert_eq!(
        format!("{two:?}"),
        r#"JwtRules { header: "authorization", keys: 2 }"#
    );
    assert_eq!(
        family_of(&DecodingKeyKind::Ec),
        [Algorithm::ES256, Algorithm::ES384]
    );
    assert_eq!(family_of(&DecodingKeyKind::Ed), [Algorithm::EdDSA]);
    let rsa = family_of(&DecodingKeyKind::Rsa);
    assert_eq!(rsa.len(), 6);
    assert!(rsa.contains(&Algorithm::RS256) && rsa.contains(&Algorithm::PS512));
}

#[test]
fn a_token_is_read_from_a_bearer_authorization_or_the_named_header_alone() {
    let bearer = rules_of(Vec::new());
    let mut custom = rules_of(Vec::new());
    custom.header = HeaderName::from_static("x-token");
    let read = |rules: &JwtRules, name: &'static str, values: &[&[u8]]| {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(name, http::HeaderValue::from_bytes(value).unwrap());
        }
        rules.token_in(&headers).map(|t| t.map(str::to_string))
    };
    let auth = |values: &[&[u8]]| read(&bearer, "authorization", values);
    assert_eq!(auth(&[]), Ok(None));
    assert_eq!(auth(&[b"Bearer abc"]), Ok(Some("abc".into())));
    assert_eq!(auth(&[b"bEaReR  abc "]), Ok(Some("abc".into())));
    assert_eq!(auth(&[b"Basic abc"]), Ok(None));
    assert_eq!(auth(&[b"Bearer"]), Ok(None));
    assert_eq!(auth(&[b"Bearer a", b"Bearer b"]), Err(Rejection::Malformed));
    assert_eq!(auth(&[b"Bearer \xff"]), Err(Rejection::Malformed));
    let own = read(&custom, "x-token", &[b" Bearer abc "]);
    assert_eq!(
        own,
        Ok(Some("Bearer abc".into())),
        "the header holds the token alone"
    );
    assert_eq!(read(&custom, "authorization", &[b"Bearer abc"]), Ok(None));
}

#[test]
fn a_verified_token_is_remembered_until_it_expires_and_a_refused_one_for_a_while() {
    let jwt = rules_of(vec![hs256(None, SECRET)]);
    let token = good("alice");
    assert!(jwt.known(&token, 100).is_none());
    let fresh = jwt.verify_fresh(&token, address(1), 100);
    assert!(matches!(fresh, TokenCheck::Verified(_)), "{fresh:?}");
    let sub = fresh
        .claims()
        .and_then(|c| c.get(&ClaimPath::parse("sub").unwrap()));
    assert_eq!(sub, Some(b"alice".to_vec()));
    for i in 0..2 {
        let refused = jwt.verify_fresh(&forged(i), address(1), 100);
        assert!(matches!(
            refused,
            TokenCheck::Rejected(Rejection::BadSignature)
        ));
        assert!(refused.claims().is_none());
    }
    assert_eq!(jwt.held(), (1, 2));
    assert!(matches!(
        jwt.known(&token, LATER),
        Some(TokenCheck::Remembered(_))
    ));
    assert!(jwt.known(&good("bob"), LATER).is_none(), "another token");
    assert!(jwt.known(&token, LATER + 1).is_none(), "expired since");
    for now in [100, 100 + REFUSED_FOR_S - 1] {
        let known = jwt.known(&forged(0), now);
        assert!(
            matches!(known, Some(TokenCheck::Rejected(Rejection::BadSignature))),
            "{now}"
        );
    }
    assert!(jwt.known(&forged(0), 100 + REFUSED_FOR_S).is_none());
    assert_eq!(jwt.held(), (0, 1));
}

#[test]
fn room_for_a_verified_token_is_made_from_expired_ones_first() {
    let jwt = rules_of(vec![hs256(None, SECRET)]);
    jwt.verify_fresh(&good("a"), address(1), 100);
    jwt.verify_fresh(&good("b"), address(1), LATER);
    assert_eq!(jwt.held().0, 2, "neither has expired");
    jwt.verify_fresh(&good("c"), address(1), LATER + 1);
    assert_eq!(jwt.held().0, 1, "both have");
}

#[test]
fn an_address_that_spent_its_budget_on_bad_signatures_is_refused_unchecked() {
    let jwt = rules_of(vec![hs256(None, SECRET)]);
    for i in 0..FAILED_CHECKS_BURST {
        let check = jwt.verify_fresh(&forged(i), address(1), 100);
        assert!(
            matches!(check, TokenCheck::Rejected(Rejection::BadSignature)),
            "{i}"
        );
    }
    let spent = jwt.verify_fresh(&forged(99), address(1), 100);
    assert!(matches!(spent, TokenCheck::Rejected(Rejection::Throttled)));
    let good_but_late = jwt.verify_fresh(&good("x"), address(1), 100);
    assert!(matches!(
        good_but_late,
        TokenCheck::Rejected(Rejection::Throttled)
    ));
    let neighbour = jwt.verify_fresh(&good("x"), address(2), 100);
    assert!(matches!(neighbour, TokenCheck::Verified(_)));
}

#[test]
fn a_token_is_checked_with_the_key_it_names_or_the_only_one_its_algorithm_fits() {
    let jwt = rules_of(vec![hs256(Some("a"), b"key a"), hs256(Some("b"), b"key b")]);
    let claims = format!(r#"{{"sub":"x","exp":{LATER}}}"#);
    let check =
        |kid: Option<&str>| jwt.verify_fresh(&signed(kid, b"key b", &claims), address(1), 100);
    assert!(matches!(check(Some("b")), TokenCheck::Verified(_)));
    assert!(matches!(
        check(Some("a")),
        TokenCheck::Rejected(Rejection::BadSignature)
    ));
    assert!(matches!(
        check(Some("c")),
        TokenCheck::Rejected(Rejection::UnknownKey)
    ));
    assert!(
        matches!(check(None), TokenCheck::Rejected(Rejection::UnknownKey)),
        "two keys fit HS256"
    );
    // An issuer is a string, a time a number.
    let one = rules_of(vec![hs256(None, SECRET)]);
    let verdict = |claims: &str| one.verify_fresh(&signed(None, SECRET, claims), address(1), 100);
    let issued = verdict(&format!(r#"{{"iss":"me","exp":{LATER}}}"#));
    assert!(matches!(issued, TokenCheck::Verified(_)), "{issued:?}");
    let issuers = verdict(&format!(r#"{{"iss":["me"],"exp":{LATER}}}"#));
    assert!(
        matches!(issuers, TokenCheck::Rejected(Rejection::Malformed)),
        "{issuers:?}"
    );
    let worded = verdict(&format!(r#"{{"exp":{LATER},"iat":"now"}}"#));
    assert!(
        matches!(worded, TokenCheck::Rejected(Rejection::Malformed)),
        "{worded:?}"
    );
    let expired = verdict(r#"{"exp":1000}"#);
    assert!(
        matches!(expired, TokenCheck::Rejected(Rejection::Expired)),
        "{expired:?}"
    );
}

#[test]
fn a_requests_token_is_checked_once_then_known() {
    let jwt = rules_of(vec![hs256(None, SECRET)]);
    let mut headers = HeaderMap::new();
    assert!(matches!(
        jwt.check(&headers, address(1)),
        TokenCheck::Absent
    ));
    let bearer = format!("Bearer {}", good("a"));
    headers.insert(http::header::AUTHORIZATION, bearer.parse().unwrap());
    assert!(matches!(
        jwt.check(&headers, address(1)),
        TokenCheck::Verified(_)
    ));
    assert!(matches!(
        jwt.check(&headers, address(1)),
        TokenCheck::Remembered(_)
    ));
    headers.append(http::header::AUTHORIZATION, "Bearer b".parse().unwrap());
    let twice = jwt.check(&headers, address(1));
    assert!(matches!(twice, TokenCheck::Rejected(Rejection::Malformed)));
    assert!(unix_now_s() > 1_700_000_000, "seconds since the epoch");
}
