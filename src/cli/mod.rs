//! The command line's subcommands: what `floodgate check` prints and what
//! `floodgate simulate` runs.

pub mod simulate;
pub mod summary;
