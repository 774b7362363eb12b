//! Limits per verified JWT claim: keys and tokens made by the test
//! (openssl keys, tokens signed with them), the real binary in between.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::keys::{self, base64url, openssl};
use common::{wait_until, ConfigBuilder, Limit, Proxy, Upstream};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;

const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "floodgate-tests";

/// A key pair made with openssl: the private key (PEM) to sign with, and
/// the public key as a JWK.
struct Key {
    private_pem: Vec<u8>,
    jwk: serde_json::Value,
    algorithm: Algorithm,
    kid: String,
}

impl Key {
    fn rsa(dir: &Path, kid: &str) -> Key {
        let (private_pem, jwk) = keys::rsa(dir, kid);
        Key {
            private_pem,
            jwk: serde_json::from_str(&jwk).expect("jwk"),
            algorithm: Algorithm::RS256,
            kid: kid.into(),
        }
    }

    fn ec(dir: &Path, kid: &str) -> Key {
        let file = format!("{kid}.pem");
        openssl(
            dir,
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                &file,
            ],
        );
        // The public key's DER ends with the point: 0x04, x, y.
        let der = openssl(dir, &["pkey", "-in", &file, "-pubout", "-outform", "DER"]);
        let point = &der[der.len() - 64..];
        Key {
            private_pem: std::fs::read(dir.join(&file)).expect("key"),
            jwk: json!({"kty": "EC", "kid": kid, "crv": "P-256", "x": base64url(&point[..32]), "y": base64url(&point[32..])}),
            algorithm: Algorithm::ES256,
            kid: kid.into(),
        }
    }

    fn sign(&self, claims: &serde_json::Value) -> String {
        let mut header = Header::new(self.algorithm);
        header.kid = Some(self.kid.clone());
        let key = match self.algorithm {
            Algorithm::ES256 => EncodingKey::from_ec_pem(&self.private_pem),
            _ => EncodingKey::from_rsa_pem(&self.private_pem),
        }
        .expect("signing key");
        encode(&header, claims, &key).expect("token")
    }

    /// Signed under a header written by hand (fields the library does not
    /// write, such as `crit`).
    fn sign_raw(&self, header: &serde_json::Value, claims: &serde_json::Value) -> String {
        let message = format!(
            "{}.{}",
            base64url(header.to_string().as_bytes()),
            base64url(claims.to_string().as_bytes())
        );
        let key = match self.algorithm {
            Algorithm::ES256 => EncodingKey::from_ec_pem(&self.private_pem),
            _ => EncodingKey::from_rsa_pem(&self.private_pem),
        }
        .expect("signing key");
        let signature =
            jsonwebtoken::crypto::sign(message.as_bytes(), &key, self.algorithm).expect("signed");
        format!("{message}.{signature}")
    }
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("time")
        .as_secs()
}

fn claims(sub: &str) -> serde_json::Value {
    json!({"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": now_s() + 3600, "plan": "basic"})
}

fn write_jwks(path: &Path, keys: &[&Key]) {
    let jwks = json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()});
    std::fs::write(path, jwks.to_string()).expect("jwks");
}

struct Setup {
    dir: PathBuf,
    rsa: Key,
    ec: Key,
    jwks: PathBuf,
}

fn setup() -> Setup {
    let dir = common::temp_dir();
    let rsa = Key::rsa(&dir, "rsa-1");
    let ec = Key::ec(&dir, "ec-1");
    let jwks = dir.join("jwks.json");
    write_jwks(&jwks, &[&rsa, &ec]);
    Setup { dir, rsa, ec, jwks }
}

fn jwt_section(jwks: &Path) -> String {
    format!(
        "[clients.jwt]\njwks_file = \"{}\"\nalgorithms = [\"RS256\", \"ES256\"]\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"\ntier_claim = \"plan\"\n[clients.jwt.tiers]\ngold = \"pro\"\n",
        jwks.display()
    )
}

fn with_token(proxy: &Proxy, path: &str, token: &str) -> common::Response {
    let bearer = format!("Bearer {token}");
    proxy.send("GET", path, &[("Authorization", bearer.as_str())])
}

const VERIFIED: &str = "floodgate_jwt_tokens_total{result=\"verified\"}";

#[test]
fn a_limit_per_subject_follows_the_verified_token_not_the_address() {
    let s = setup();
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .raw(&jwt_section(&s.jwks))
        .limit(
            Limit::fixed_window("per-user", "jwt:sub", 2, "1h")
                .line("on_missing = \"deny\"")
                .line("[limits.tiers.pro]\nlimit = 4"),
        )
        .start();
    // RS256 and ES256, one budget per subject, whatever key signed it.
    let alice = s.rsa.sign(&claims("alice"));
    let alice_ec = s.ec.sign(&claims("alice"));
    assert_eq!(with_token(&proxy, "/", &alice).status, 200);
    assert_eq!(with_token(&proxy, "/", &alice_ec).status, 200);
    assert_eq!(with_token(&proxy, "/", &alice).status, 429);
    assert_eq!(
        with_token(&proxy, "/", &s.ec.sign(&claims("bob"))).status,
        200
    );
    // A tier from a claim: plan "gold" is the pro tier, 4 per hour.
    let mut gold = claims("carol");
    gold["plan"] = json!("gold");
    let carol = s.rsa.sign(&gold);
    let first = with_token(&proxy, "/", &carol);
    assert_eq!(
        first.header("RateLimit-Limit"),
        Some("4"),
        "{:?}",
        first.headers
    );

    // Tokens that prove nothing are no token: 400 missing_key here.
    let mut expired = claims("alice");
    expired["exp"] = json!(now_s() - 3600);
    // HS256 "signed" with the configured public key: the classic confusion.
    let public_pem = openssl(&s.dir, &["pkey", "-in", "rsa-1.pem", "-pubout"]);
    let stranger = Key::rsa(&s.dir, "rsa-1"); // the right kid, another key
    let mut wrong_issuer = claims("dave");
    wrong_issuer["iss"] = json!("https://evil.test");
    let payload = base64url(claims("eve").to_string().as_bytes());
    let unsigned = format!("{}.{payload}.", base64url(br#"{"alg":"none","typ":"JWT"}"#));
    let mut hs_header = Header::new(Algorithm::HS256);
    hs_header.kid = Some("rsa-1".into());
    let confused = encode(
        &hs_header,
        &claims("eve"),
        &EncodingKey::from_secret(&public_pem),
    )
    .expect("token");
    let mut early = claims("frank");
    early["nbf"] = json!(now_s() + 3600);
    let mut endless = claims("gina");
    endless.as_object_mut().expect("claims").remove("exp");
    let mut elsewhere = claims("hank");
    elsewhere["aud"] = json!("another-api");
    for (token, why) in [
        (s.rsa.sign(&early), "not_yet_valid"),
        (s.rsa.sign(&endless), "missing_claim"),
        (s.rsa.sign(&elsewhere), "wrong_audience"),
        (s.rsa.sign(&expired), "expired"),
        (stranger.sign(&claims("eve")), "bad_signature"),
        (s.rsa.sign(&wrong_issuer), "wrong_issuer"),
        (unsigned, "malformed"),
        (confused, "wrong_algorithm"),
    ] {
        let r = with_token(&proxy, "/", &token);
        assert_eq!(r.status, 400, "{why}: {}", r.body);
        assert!(r.body.contains("missing_key"), "{why}: {}", r.body);
        let counted = proxy.metric(&format!("floodgate_jwt_tokens_total{{result=\"{why}\"}}"));
        assert_eq!(counted, 1.0, "{why}");
    }
    // Another scheme is no token; two tokens are none either.
    let basic = proxy.send("GET", "/", &[("Authorization", "Basic YWxpY2U6cHc=")]);
    assert_eq!(basic.status, 400);
    let bearer = format!("Bearer {alice}");
    let twice = proxy.send(
        "GET",
        "/",
        &[
            ("Authorization", bearer.as_str()),
            ("Authorization", bearer.as_str()),
        ],
    );
    assert_eq!(twice.status, 400, "{}", twice.body);
    assert!(!proxy.log().contains(&alice), "tokens are never logged");
}

#[test]
fn per_user_per_endpoint_and_blocked_subjects() {
    let s = setup();
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .raw(&jwt_section(&s.jwks))
        .raw("[block]\njwt_subjects = [\"mallory\"]\n")
        .limit(
            Limit::fixed_window("per-user-route", "[\"jwt:sub\", \"route\"]", 2, "1h")
                .matching("paths = [\"/users/*\", \"/orders\"]"),
        )
        .start();
    let ann = s.rsa.sign(&claims("ann"));
    assert_eq!(with_token(&proxy, "/users/1", &ann).status, 200);
    assert_eq!(with_token(&proxy, "/users/2", &ann).status, 200);
    assert_eq!(
        with_token(&proxy, "/users/3", &ann).status,
        429,
        "one budget for /users/*"
    );
    assert_eq!(with_token(&proxy, "/orders", &ann).status, 200, "its own");
    let blocked = with_token(&proxy, "/orders", &s.ec.sign(&claims("mallory")));
    assert_eq!(blocked.status, 403);
    assert!(blocked.body.contains("blocked"), "{}", blocked.body);
}

#[test]
fn a_new_key_set_is_read_on_sighup() {
    let s = setup();
    let upstream = Upstream::start();
    let config = ConfigBuilder::new(upstream.addr)
        .admin()
        .raw(&jwt_section(&s.jwks))
        .limit(Limit::fixed_window("per-user", "jwt:sub", 100, "1h").line("on_missing = \"deny\""));
    let proxy = config.start();
    let rotated = Key::rsa(&s.dir, "rsa-2");
    let old = s.rsa.sign(&claims("ann"));
    let new = rotated.sign(&claims("ann"));
    assert_eq!(with_token(&proxy, "/", &old).status, 200);
    assert_eq!(with_token(&proxy, "/", &new).status, 400, "not yet known");
    write_jwks(&s.jwks, &[&rotated, &s.ec]);
    proxy.signal("-HUP");
    assert!(wait_until(Duration::from_secs(5), || proxy
        .log()
        .contains("reloaded")));
    assert_eq!(with_token(&proxy, "/", &new).status, 200);
    assert_eq!(with_token(&proxy, "/", &old).status, 400, "the retired key");
}

/// A busy client's token is verified once: 10,000 requests, one check of
/// its signature.
#[test]
fn a_token_is_verified_once_for_many_requests() {
    let s = setup();
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .raw(&jwt_section(&s.jwks))
        .limit(Limit::fixed_window("per-user", "jwt:sub", 100_000, "1h"))
        .start();
    let bearer = format!("Bearer {}", s.rsa.sign(&claims("ann")));
    let requests = vec![vec![("Authorization".to_string(), bearer)]; 10_000];
    let statuses = common::keepalive_gets(proxy.addr, "/", requests);
    assert_eq!(common::count_status(statuses.iter().copied(), 200), 10_000);
    assert_eq!(proxy.metric(VERIFIED), 1.0);
    assert_eq!(
        proxy.metric("floodgate_jwt_tokens_total{result=\"remembered\"}"),
        9_999.0
    );
}

/// Tokens signed by the right key but looser than the standards: a
/// critical extension nobody here implements, times that are not numbers,
/// issuers in a list. Each is no token; a float `exp` is remembered like
/// any other.
#[test]
fn tokens_looser_than_the_standards_are_refused() {
    let s = setup();
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .raw(&jwt_section(&s.jwks))
        .limit(Limit::fixed_window("per-user", "jwt:sub", 100, "1h").line("on_missing = \"deny\""))
        .start();
    let header = json!({"alg": "RS256", "typ": "JWT", "kid": "rsa-1"});
    let mut critical = header.clone();
    critical["crit"] = json!(["exp-policy"]);
    critical["exp-policy"] = json!("strict");
    let mut nbf_text = claims("ivy");
    nbf_text["nbf"] = json!((now_s() + 3600).to_string());
    let mut iat_text = claims("ivy");
    iat_text["iat"] = json!("yesterday");
    let mut issuers = claims("ivy");
    issuers["iss"] = json!([ISSUER, "https://evil.test"]);
    let mut exp_text = claims("ivy");
    exp_text["exp"] = json!((now_s() + 3600).to_string());
    for (token, why) in [
        (
            s.rsa.sign_raw(&critical, &claims("ivy")),
            "unknown_critical",
        ),
        (s.rsa.sign_raw(&header, &nbf_text), "malformed"),
        (s.rsa.sign_raw(&header, &iat_text), "malformed"),
        (s.rsa.sign_raw(&header, &issuers), "malformed"),
        (s.rsa.sign_raw(&header, &exp_text), "missing_claim"),
    ] {
        let before = proxy.metric(&format!("floodgate_jwt_tokens_total{{result=\"{why}\"}}"));
        let r = with_token(&proxy, "/", &token);
        assert_eq!(r.status, 400, "{why}: {}", r.body);
        assert!(r.body.contains("missing_key"), "{why}: {}", r.body);
        let after = proxy.metric(&format!("floodgate_jwt_tokens_total{{result=\"{why}\"}}"));
        assert_eq!(after - before, 1.0, "{why}");
    }
    // The same header without `crit` is a good token: the key is right.
    assert_eq!(
        with_token(&proxy, "/", &s.rsa.sign_raw(&header, &claims("ivy"))).status,
        200
    );
    let mut float_exp = claims("jay");
    float_exp["exp"] = json!(now_s() as f64 + 3600.5);
    let token = s.rsa.sign_raw(&header, &float_exp);
    let verified = proxy.metric(VERIFIED);
    for _ in 0..5 {
        assert_eq!(with_token(&proxy, "/", &token).status, 200);
    }
    assert_eq!(
        proxy.metric(VERIFIED) - verified,
        1.0,
        "verified once, then remembered"
    );
}

/// A well-formed ES256 token under the configured key's id, with a
/// signature made up: checking it costs a real verification.
fn garbage_token(i: usize) -> String {
    let header = base64url(br#"{"alg":"ES256","typ":"JWT","kid":"ec-1"}"#);
    let payload = base64url(claims(&format!("nobody-{i}")).to_string().as_bytes());
    let signature: Vec<u8> = (0..64).map(|b| (b * 7 + i * 13) as u8).collect();
    format!("{header}.{payload}.{}", base64url(&signature))
}

/// The signature checks a proxy has made: every result but the ones that
/// need none.
fn tokens_checked(proxy: &Proxy) -> f64 {
    [
        "verified",
        "bad_signature",
        "expired",
        "wrong_issuer",
        "unknown_key",
    ]
    .iter()
    .map(|r| proxy.metric(&format!("floodgate_jwt_tokens_total{{result=\"{r}\"}}")))
    .sum()
}

/// Signatures are the dearest thing a request can make floodgate do: a
/// blocked or banned address gets its refusal without one, a request no
/// limit needs a claim for gets none, and an address that keeps sending
/// bad tokens gets a budget of checks, then refusals without a check.
#[test]
fn signatures_are_checked_last_and_within_a_budget() {
    let s = setup();
    let upstream = Upstream::start();
    let by_user = || Limit::fixed_window("per-user", "jwt:sub", 100, "1h");
    let blocked = ConfigBuilder::new(upstream.addr)
        .admin()
        .raw(&jwt_section(&s.jwks))
        .raw("[block]\ncidrs = [\"127.0.0.0/8\"]\n")
        .limit(by_user())
        .start();
    for i in 0..20 {
        assert_eq!(with_token(&blocked, "/", &garbage_token(i)).status, 403);
    }
    assert_eq!(
        tokens_checked(&blocked),
        0.0,
        "a blocked address cost no signature"
    );

    let banning = ConfigBuilder::new(upstream.addr)
        .admin()
        .raw(&jwt_section(&s.jwks))
        .limit(
            Limit::fixed_window("login", "ip", 1, "1h")
                .matching("paths = [\"/login\"]")
                .line("ban = { after = 2, within = \"10m\", duration = \"1h\" }"),
        )
        .limit(by_user())
        .start();
    for _ in 0..3 {
        banning.send("POST", "/login", &[]);
    }
    assert!(wait_until(Duration::from_secs(5), || banning
        .metric("floodgate_bans_total{limit=\"login\"}")
        == 1.0));
    for i in 0..20 {
        let r = with_token(&banning, "/", &garbage_token(i));
        assert_eq!(r.status, 429, "{}", r.body);
        assert!(r.body.contains("\"banned\""), "{}", r.body);
    }
    assert_eq!(
        tokens_checked(&banning),
        0.0,
        "a banned address cost no signature"
    );

    // Nothing here keys on a claim: a token is never looked at.
    let by_address = ConfigBuilder::new(upstream.addr)
        .admin()
        .raw(&jwt_section(&s.jwks))
        .limit(Limit::fixed_window("per-ip", "ip", 1000, "1h"))
        .start();
    for i in 0..10 {
        assert_eq!(with_token(&by_address, "/", &garbage_token(i)).status, 200);
    }
    assert_eq!(
        tokens_checked(&by_address),
        0.0,
        "no limit needed the token"
    );

    let open = ConfigBuilder::new(upstream.addr)
        .admin()
        .raw(&jwt_section(&s.jwks))
        .limit(by_user())
        .start();
    let good = s.ec.sign(&claims("alice"));
    assert_eq!(with_token(&open, "/", &good).status, 200);
    for i in 0..60 {
        with_token(&open, "/", &garbage_token(i));
    }
    let throttled = open.metric("floodgate_jwt_tokens_total{result=\"throttled\"}");
    let failed = tokens_checked(&open) - 1.0;
    assert!(
        (20.0..=24.0).contains(&failed) && failed + throttled == 60.0,
        "{failed} checked and failed, {throttled} refused unchecked"
    );
    // A token verified before is remembered: the budget costs it nothing.
    assert_eq!(with_token(&open, "/", &good).status, 200);
    assert_eq!(open.metric(VERIFIED), 1.0);
}
