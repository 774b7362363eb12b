//! What a change to the run-time clients can come to.

/// A change that could not be made; nothing of it was.
#[derive(Debug, thiserror::Error)]
pub enum ClientsError {
    #[error("Redis cannot take the change ({0}); nothing was changed")]
    Unavailable(String),
    #[error("cannot write {path}: {source}; nothing was changed")]
    File {
        path: String,
        source: std::io::Error,
    },
}
