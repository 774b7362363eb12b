//! Who is asking, per request: identifying a client by its API key against
//! identifying it by a bearer token, remembered (the usual case: a client's
//! token is verified once) and verified afresh (a new token each time).
//!
//! The keys are made with openssl when the bench starts.

use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use criterion::{criterion_group, criterion_main, Criterion};
use floodgate::config::{Config, Inputs};
use http::{HeaderMap, HeaderValue};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

/// More than the tokens remembered (4,096), used in turn: none is found.
const FRESH_TOKENS: usize = 5_000;

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn openssl(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(out.status.success(), "openssl {args:?}");
    out.stdout
}

fn identify(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("floodgate-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    openssl(
        &dir,
        &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            "k.pem",
        ],
    );
    let modulus = String::from_utf8(openssl(
        &dir,
        &["rsa", "-in", "k.pem", "-noout", "-modulus"],
    ))
    .expect("modulus");
    let hex = modulus.trim().trim_start_matches("Modulus=");
    let n: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    let jwks = dir.join("jwks.json");
    std::fs::write(
        &jwks,
        format!(
            r#"{{"keys":[{{"kty":"RSA","kid":"k","n":"{}","e":"AQAB"}}]}}"#,
            base64url(&n)
        ),
    )
    .expect("jwks");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:1\"\n[upstream]\nservers = [\"127.0.0.1:2\"]\n\
         [clients.api_keys]\n\"bench-key\" = \"pro\"\n\
         [clients.jwt]\njwks_file = \"{}\"\nalgorithms = [\"RS256\"]\n",
        jwks.display()
    );
    let config = Config::parse(Path::new("bench.toml"), &text, &Inputs::default()).expect("config");
    let clients = &config.policy.clients;
    let private = std::fs::read(dir.join("k.pem")).expect("key");
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
    let one = token(0);
    group.bench_function("jwt_remembered", |b| {
        b.iter(|| clients.identify(black_box(peer), black_box(&one)))
    });
    let fresh: Vec<HeaderMap> = (1..=FRESH_TOKENS).map(token).collect();
    let mut next = 0;
    group.bench_function("jwt_verified", |b| {
        b.iter(|| {
            next = (next + 1) % fresh.len();
            clients.identify(black_box(peer), black_box(&fresh[next]))
        })
    });
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, identify);
criterion_main!(benches);
