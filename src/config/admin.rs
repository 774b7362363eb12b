//! `[admin]`: the bearer token of the admin API and status page.

use super::file::AdminSection;
use super::inputs::Inputs;
use super::{at, AsSegment, Invalid};
use crate::admin::auth::AdminToken;
use floodgate_policy::identity::IdentityKeySource;

/// Shorter tokens are guessable over a network.
const MIN_TOKEN_BYTES: usize = 16;

/// The token, read from its file (again on every reload, so that it can be
/// rotated); none when `token_file` is not set, and the API is off.
pub(super) fn validate_admin(
    a: &AdminSection,
    admin_listen: bool,
    inputs: &Inputs,
) -> Result<Option<AdminToken>, Invalid> {
    let path: [&dyn AsSegment; 2] = [&"admin", &"token_file"];
    let Some(file) = &a.token_file else {
        return Ok(None);
    };
    if !admin_listen {
        return Err(at(
            &path,
            "the admin API is served on server.admin_listen, which is not set",
        ));
    }
    let bytes = inputs
        .read(file)
        .map_err(|e| at(&path, format!("cannot read {}: {e}", file.display())))?;
    let token = token_of(&bytes).map_err(|why| at(&path, why))?;
    Ok(Some(AdminToken::new(token)))
}

/// A bearer token as a file holds it (surrounding spaces and newlines
/// dropped), or why it is none.
pub(super) fn token_of(bytes: &[u8]) -> Result<&str, String> {
    // What a cookie and a header carry as they are: base64, hex, words.
    let token = std::str::from_utf8(bytes.trim_ascii())
        .ok()
        .filter(|t| {
            t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b))
        })
        .ok_or("the token may hold letters, digits and - . _ ~ + / = only")?;
    if token.len() < MIN_TOKEN_BYTES {
        return Err(format!(
            "the token must hold at least {MIN_TOKEN_BYTES} characters (e.g. the output of `openssl rand -hex 32`)"
        ));
    }
    Ok(token)
}

/// `[admin].clients_file`: where the memory store keeps the API keys set
/// at run time, by their keyed hash, which must come out the same after a
/// restart (hence a secret); with `[redis]` they live in Redis.
pub(super) fn validate_clients_file(
    a: &AdminSection,
    admin_api: bool,
    redis: bool,
    identity_key: IdentityKeySource,
) -> Result<Option<std::path::PathBuf>, Invalid> {
    let path: [&dyn AsSegment; 2] = [&"admin", &"clients_file"];
    let Some(file) = &a.clients_file else {
        return Ok(None);
    };
    if !admin_api {
        return Err(at(
            &path,
            "clients are set through the admin API, which is off: set [admin].token_file",
        ));
    }
    if redis {
        return Err(at(
            &path,
            "with [redis], run-time clients live in Redis: drop clients_file",
        ));
    }
    if identity_key != IdentityKeySource::Secret {
        return Err(at(
            &path,
            "keys are kept by their keyed hash, which must survive a restart: set [clients].identity_secret_file (or FLOODGATE_IDENTITY_SECRET)",
        ));
    }
    if file.as_os_str().is_empty() || file.file_name().is_none() {
        return Err(at(
            &path,
            "name a file, e.g. \"/var/lib/floodgate/clients.json\"",
        ));
    }
    Ok(Some(file.clone()))
}
