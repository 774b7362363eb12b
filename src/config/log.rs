//! `[log]`: where the access log goes.

use std::path::PathBuf;

use super::file::LogSection;
use super::{at, Invalid};
use crate::proxy::access_log::AccessLogTarget;

pub(super) fn validate_log(l: &LogSection) -> Result<AccessLogTarget, Invalid> {
    match l.access.as_deref() {
        None | Some("off") => Ok(AccessLogTarget::Off),
        Some("stdout") => Ok(AccessLogTarget::Stdout),
        Some("") => Err(at(
            &[&"log", &"access"],
            "\"off\", \"stdout\" or a file path",
        )),
        Some(path) => Ok(AccessLogTarget::File(PathBuf::from(path))),
    }
}
