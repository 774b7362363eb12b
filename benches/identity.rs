//! Who is asking, per request: identifying a client by its API key against
//! identifying it by a bearer token, remembered (the usual case: a client's
//! token is verified once) and verified afresh (a new token each time).
//!
//! The keys are made with openssl when the bench starts.

use std::hint::black_box;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use criterion::{criterion_group, criterion_main, Criterion};

#[path = "../tests/common/keys.rs"]
mod keys;
use floodgate::config::{Config, Inputs};
use http::{HeaderMap, HeaderValue};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

/// More than the tokens remembered (4,096), used in turn: none is found.
const FRESH_TOKENS: usize = 5_000;

fn identify(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("floodgate-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (private, jwk) = keys::rsa(&dir, "k");
    let jwks = dir.join("jwks.json");
    std::fs::write(&jwks, format!(r#"{{"keys":[{jwk}]}}"#)).expect("jwks");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:1\"\n[upstream]\nservers = [\"127.0.0.1:2\"]\n\
         [clients.api_keys]\n\"bench-key\" = \"pro\"\n\
         [clients.jwt]\njwks_file = \"{}\"\nalgorithms = [\"RS256\"]\n",
        jwks.display()
    );
    let config = Config::parse(Path::new("bench.toml"), &text, &Inputs::default()).expect("config");
    let clients = &config.policy.clients;
    let signing = EncodingKey::from_rsa_pem(&private).expect("signing key");
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("time")
        .as_secs()
        + 3600;
    let token = |sub: usize| {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some("k".into());
        let claims = serde_json::json!({"sub": format!("user-{sub}"), "exp": exp});
        let token = encode(&header, &claims, &signing).expect("token");
        let mut headers = HeaderMap::new();
        let value = HeaderValue::from_str(&format!("Bearer {token}")).expect("header");
        headers.insert(http::header::AUTHORIZATION, value);
        headers
    };
    let peer = "198.51.100.7".parse().expect("address");
    let mut group = c.benchmark_group("identify");
    let mut with_key = HeaderMap::new();
    with_key.insert("x-api-key", HeaderValue::from_static("bench-key"));
    group.bench_function("api_key", |b| {
        b.iter(|| clients.identify(black_box(peer), black_box(&with_key)))
    });
    // Who asks, then what its token says (as a request that needs a claim).
    let with_token = |headers: &HeaderMap| {
        let mut client = clients.identify(peer, headers).expect("identified");
        if let Some(jwt) = &clients.jwt {
            let token = jwt.check(headers, client.ip);
            clients.apply_token(&mut client, token);
        }
        client
    };
    let one = token(0);
    group.bench_function("jwt_remembered", |b| b.iter(|| with_token(black_box(&one))));
    let fresh: Vec<HeaderMap> = (1..=FRESH_TOKENS).map(token).collect();
    let mut next = 0;
    group.bench_function("jwt_verified", |b| {
        b.iter(|| {
            next = (next + 1) % fresh.len();
            with_token(black_box(&fresh[next]))
        })
    });
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, identify);
criterion_main!(benches);
