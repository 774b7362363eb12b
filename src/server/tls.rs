//! TLS for clients: the certificates floodgate serves, chosen by SNI, and
//! swapped whole on SIGHUP (a set that fails to load never replaces the one
//! serving).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// One certificate as configured: the default one has no names; the others
/// serve the SNI names they list (`*.example.org` covers one label).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSource {
    pub server_names: Vec<String>,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// `[server.tls]`: the TLS listeners and what they serve.
#[derive(Debug, Clone)]
pub struct TlsListeners {
    pub listen: Vec<SocketAddr>,
    pub http2: bool,
    pub sources: Vec<CertSource>,
    pub certs: Arc<CertSet>,
}

/// Why a certificate cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {file}: {reason}")]
    Read { file: String, reason: String },
    #[error("{file} holds no certificate")]
    NoCertificate { file: String },
    #[error("{file} holds no private key")]
    NoKey { file: String },
    #[error("the key in {key} does not belong to the certificate in {cert}: {reason}")]
    Mismatch {
        cert: String,
        key: String,
        reason: String,
    },
}

/// What `floodgate check` shows of one certificate.
#[derive(Debug, Clone)]
pub struct CertSummary {
    /// The names in the certificate (subject alternative names, else the CN).
    pub names: Vec<String>,
    /// `notAfter`, as the certificate writes it (RFC 2822 style, UTC).
    pub expires: String,
}

/// The loaded certificates: a default and the SNI-selected ones.
#[derive(Debug)]
pub struct CertSet {
    default: Arc<CertifiedKey>,
    named: Vec<(String, Arc<CertifiedKey>)>,
    pub summaries: Vec<CertSummary>,
}

/// How certificate and key files are read: the configuration's inputs (the
/// disk, for a running process and its reloads).
pub type ReadFile<'a> = &'a dyn Fn(&Path) -> std::io::Result<Vec<u8>>;

fn read_pem(read: ReadFile<'_>, file: &Path) -> Result<Vec<u8>, TlsError> {
    read(file).map_err(|e| TlsError::Read {
        file: file.display().to_string(),
        reason: e.to_string(),
    })
}

fn load_one(
    source: &CertSource,
    read: ReadFile<'_>,
) -> Result<(Arc<CertifiedKey>, CertSummary), TlsError> {
    let cert_name = source.cert_file.display().to_string();
    let key_name = source.key_file.display().to_string();
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&read_pem(read, &source.cert_file)?)
            .filter_map(Result::ok)
            .collect();
    let leaf = chain.first().ok_or_else(|| TlsError::NoCertificate {
        file: cert_name.clone(),
    })?;
    let summary = summarise(leaf);
    let key = PrivateKeyDer::from_pem_slice(&read_pem(read, &source.key_file)?).map_err(|_| {
        TlsError::NoKey {
            file: key_name.clone(),
        }
    })?;
    let provider = rustls::crypto::ring::default_provider();
    let certified =
        CertifiedKey::from_der(chain, key, &provider).map_err(|e| TlsError::Mismatch {
            cert: cert_name,
            key: key_name,
            reason: e.to_string(),
        })?;
    Ok((Arc::new(certified), summary))
}

fn summarise(leaf: &CertificateDer<'_>) -> CertSummary {
    use x509_parser::prelude::*;
    match X509Certificate::from_der(leaf.as_ref()) {
        Ok((_, cert)) => {
            let mut names: Vec<String> =
                cert.subject_alternative_name()
                    .ok()
                    .flatten()
                    .map(|san| {
                        san.value
                            .general_names
                            .iter()
                            .map(|n| match n {
                                GeneralName::DNSName(d) => d.to_string(),
                                GeneralName::IPAddress(ip) => match ip.len() {
                                    4 => std::net::Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])
                                        .to_string(),
                                    _ => format!("{ip:?}"),
                                },
                                other => other.to_string(),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
            if names.is_empty() {
                names.extend(
                    cert.subject()
                        .iter_common_name()
                        .filter_map(|cn| cn.as_str().ok().map(str::to_string)),
                );
            }
            CertSummary {
                names,
                expires: cert.validity().not_after.to_string(),
            }
        }
        Err(_) => CertSummary {
            names: Vec::new(),
            expires: "unreadable".into(),
        },
    }
}

/// Whether an SNI name matches a configured one (`*.example.org` matches
/// exactly one label in front of `example.org`). Names compare ignoring case.
fn name_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => name
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest.eq_ignore_ascii_case(suffix)),
        None => pattern.eq_ignore_ascii_case(name),
    }
}

impl CertSet {
    /// Loads every certificate; the first source is the default.
    pub fn load(
        default: &CertSource,
        others: &[CertSource],
        read: ReadFile<'_>,
    ) -> Result<CertSet, TlsError> {
        let (default_key, default_summary) = load_one(default, read)?;
        let mut summaries = vec![default_summary];
        let mut named = Vec::new();
        for source in others {
            let (key, summary) = load_one(source, read)?;
            summaries.push(summary);
            for name in &source.server_names {
                named.push((name.clone(), key.clone()));
            }
        }
        Ok(CertSet {
            default: default_key,
            named,
            summaries,
        })
    }

    fn choose(&self, server_name: Option<&str>) -> Arc<CertifiedKey> {
        server_name
            .and_then(|name| {
                // An exact name beats a wildcard.
                self.named
                    .iter()
                    .find(|(p, _)| !p.starts_with("*.") && name_matches(p, name))
                    .or_else(|| self.named.iter().find(|(p, _)| name_matches(p, name)))
            })
            .map_or_else(|| self.default.clone(), |(_, key)| key.clone())
    }
}

/// What the TLS listeners ask for a certificate; `replace` swaps the set.
#[derive(Debug)]
pub struct CertResolver {
    current: ArcSwap<CertSet>,
}

impl CertResolver {
    pub fn new(set: Arc<CertSet>) -> Arc<Self> {
        Arc::new(CertResolver {
            current: ArcSwap::new(set),
        })
    }

    pub fn replace(&self, set: Arc<CertSet>) {
        self.current.store(set);
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load().choose(hello.server_name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_cover_one_label() {
        assert!(name_matches("*.example.org", "api.example.org"));
        assert!(name_matches("*.example.org", "API.Example.org"));
        assert!(!name_matches("*.example.org", "example.org"));
        assert!(!name_matches("*.example.org", "a.b.example.org"));
        assert!(name_matches("api.example.org", "api.example.org"));
        assert!(!name_matches("api.example.org", "www.example.org"));
    }
}
