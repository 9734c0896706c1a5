//! One module per command.

pub mod admin;
pub mod bench;
pub mod client;
pub mod config;
pub mod migrate;
pub mod run;
pub mod serve;
pub mod tail;
pub mod tokens;
pub mod usage;
pub mod users;
pub mod version;
pub mod worker;

use clap::Args as ClapArgs;

/// Ends the command with a chosen exit code (SPEC §1.1) after printing its message.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Exit {
    /// The process exit code.
    pub code: u8,
    /// What to tell the user on stderr.
    pub message: String,
}

impl Exit {
    /// An exit with `code` and `message`.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Exit {
            code,
            message: message.into(),
        }
    }
}

/// A command-line value that is out of range; exits with code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// The database every command that touches storage opens.
#[derive(Debug, Clone, ClapArgs)]
pub struct DatabaseArgs {
    /// Database URL: sqlite://PATH (default) or postgres://USER@HOST:PORT/DB.
    #[arg(long = "database-url", env = "SUBFLOW__DATABASE__URL", default_value = crate::storage::DEFAULT_DATABASE_URL)]
    pub url: String,
    /// Connections in the pool.
    #[arg(
        long = "database-max-connections",
        env = "SUBFLOW__DATABASE__MAX_CONNECTIONS",
        default_value_t = 10
    )]
    pub max_connections: u32,
}
