//! Signing keys made with openssl for the token tests and the identity
//! bench: the private key to sign with, the public key as a JWK.

use std::path::Path;
use std::process::Command;

pub fn openssl(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
    out.stdout
}

/// Base64url without padding, as JWKs write numbers.
pub fn base64url(bytes: &[u8]) -> String {
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

/// A 2048-bit RSA key written to `dir/<kid>.pem`: its PEM and its public
/// JWK (as JSON text).
pub fn rsa(dir: &Path, kid: &str) -> (Vec<u8>, String) {
    let file = format!("{kid}.pem");
    openssl(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            &file,
        ],
    );
    let modulus = String::from_utf8(openssl(dir, &["rsa", "-in", &file, "-noout", "-modulus"]))
        .expect("modulus");
    let hex = modulus.trim().trim_start_matches("Modulus=");
    let n: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    let jwk = format!(
        r#"{{"kty":"RSA","kid":"{kid}","use":"sig","n":"{}","e":"AQAB"}}"#,
        base64url(&n)
    );
    (std::fs::read(dir.join(&file)).expect("key"), jwk)
}
