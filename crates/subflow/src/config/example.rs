//! The documented example printed by `subflow config default`, kept as
//! `docs/subflow.toml` so the configuration reference and the command are one file. A test
//! loads it back and compares it with `Config::default()`, so it cannot drift from the
//! defaults.

/// A `subflow.toml` that sets every key to its default, with one comment per key.
/// Optional keys without a default are shown commented out.
pub const EXAMPLE: &str = include_str!("../../../../docs/subflow.toml");
