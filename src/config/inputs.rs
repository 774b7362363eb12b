//! What a configuration depends on besides its text: two environment
//! variables, the machine's core count and the files it names. The binary
//! reads the process's once (`Inputs::from_process`) and keeps them for
//! reloads, so that `Config::parse` depends on its arguments alone and tests
//! can give it any environment without touching the process's.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use floodgate_policy::identity::RunTimeKeys;
use floodgate_policy::overrides::RunTimeOverrides;

#[derive(Clone)]
pub struct Inputs {
    /// `REDIS_URL`: beats `[redis].url`.
    pub(super) redis_url: Option<String>,
    /// `FLOODGATE_IDENTITY_SECRET`: beats `[clients].identity_secret_file`.
    pub(super) identity_secret: Option<String>,
    /// What `[server].threads` defaults to.
    pub(super) cores: usize,
    files: Files,
    /// The process's run-time API keys: every generation's `ClientRules`
    /// reads this one table, so that a reload keeps them.
    pub(super) run_time_keys: Option<Arc<RunTimeKeys>>,
    /// Its clients' own numbers set at run time, kept across reloads alike.
    pub(super) run_time_overrides: Option<Arc<RunTimeOverrides>>,
}

#[derive(Clone)]
enum Files {
    /// Read when asked rather than at start, so that a reload sees the
    /// certificates and secrets as they are then.
    Disk,
    /// Only these; any other path is not found.
    Memory(Arc<HashMap<PathBuf, Vec<u8>>>),
}

/// An unset variable and an empty one mean the same: `VAR= floodgate ...`
/// is how a shell unsets one for a single command.
fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

impl Default for Inputs {
    /// Nothing from the environment, one core, files from disk.
    fn default() -> Inputs {
        Inputs {
            redis_url: None,
            identity_secret: None,
            cores: 1,
            files: Files::Disk,
            run_time_keys: None,
            run_time_overrides: None,
        }
    }
}

impl Inputs {
    /// The process's environment and core count; files read from disk.
    pub fn from_process() -> Inputs {
        Inputs {
            redis_url: non_empty(std::env::var("REDIS_URL").ok()),
            identity_secret: non_empty(std::env::var("FLOODGATE_IDENTITY_SECRET").ok()),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            files: Files::Disk,
            run_time_keys: None,
            run_time_overrides: None,
        }
    }

    /// The table of run-time API keys that configurations with the admin
    /// API read (the running proxy's; `floodgate check` has none).
    pub fn with_run_time_keys(mut self, table: Arc<RunTimeKeys>) -> Inputs {
        self.run_time_keys = Some(table);
        self
    }

    /// The table of clients' own numbers that configurations with the
    /// admin API read.
    pub fn with_run_time_overrides(mut self, table: Arc<RunTimeOverrides>) -> Inputs {
        self.run_time_overrides = Some(table);
        self
    }

    pub fn with_redis_url(mut self, url: impl Into<String>) -> Inputs {
        self.redis_url = non_empty(Some(url.into()));
        self
    }

    pub fn with_identity_secret(mut self, secret: impl Into<String>) -> Inputs {
        self.identity_secret = non_empty(Some(secret.into()));
        self
    }

    pub fn with_cores(mut self, cores: usize) -> Inputs {
        self.cores = cores.max(1);
        self
    }

    /// Files from `files` instead of the disk; any other path is not found.
    pub fn with_files(mut self, files: impl IntoIterator<Item = (PathBuf, Vec<u8>)>) -> Inputs {
        self.files = Files::Memory(Arc::new(files.into_iter().collect()));
        self
    }

    /// The bytes of a file the configuration names.
    pub fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        match &self.files {
            Files::Disk => std::fs::read(path),
            Files::Memory(files) => files
                .get(path)
                .cloned()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound)),
        }
    }

    /// A file as text (the configuration itself).
    pub fn read_to_string(&self, path: &Path) -> io::Result<String> {
        match &self.files {
            // std's own reader, so that its errors read as they always did.
            Files::Disk => std::fs::read_to_string(path),
            Files::Memory(_) => String::from_utf8(self.read(path)?)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        }
    }

    /// Whether a file is there, without reading it: for files that another
    /// component reads itself later (Pingora, the upstream's CA).
    pub fn check(&self, path: &Path) -> io::Result<()> {
        match &self.files {
            Files::Disk => std::fs::metadata(path).map(|_| ()),
            Files::Memory(files) if files.contains_key(path) => Ok(()),
            Files::Memory(_) => Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    }
}

/// Says which inputs are set, never their values: the URL may hold a
/// password and the secret is one.
impl fmt::Debug for Inputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inputs")
            .field("redis_url", &self.redis_url.as_ref().map(|_| ".."))
            .field(
                "identity_secret",
                &self.identity_secret.as_ref().map(|_| ".."),
            )
            .field("cores", &self.cores)
            .field(
                "files",
                &match &self.files {
                    Files::Disk => "disk".to_string(),
                    Files::Memory(files) => format!("{} in memory", files.len()),
                },
            )
            .finish()
    }
}
