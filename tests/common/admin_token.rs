//! The admin API's token, in a file of its own for `[admin].token_file`.

use std::path::PathBuf;

use super::{remove_test_dir, temp_dir};

pub const TOKEN: &str = "test-admin-token-0123456789";

/// A token file in a directory of its own, removed when the test passes.
pub struct TokenFile(pub PathBuf);

impl TokenFile {
    pub fn new() -> TokenFile {
        let path = temp_dir().join("admin.token");
        std::fs::write(&path, format!("{TOKEN}\n")).expect("token file");
        TokenFile(path)
    }

    /// `[admin]` naming the file.
    pub fn section(&self) -> String {
        format!("[admin]\ntoken_file = \"{}\"\n", self.0.display())
    }
}

impl Drop for TokenFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            remove_test_dir(dir);
        }
    }
}
