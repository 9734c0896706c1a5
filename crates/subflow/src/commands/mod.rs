//! One module per command.

pub mod admin;
pub mod batches;
pub mod bench;
pub mod client;
pub mod config;
pub mod migrate;
pub mod run;
pub mod serve;
pub mod tail;
pub mod tasks;
pub mod tokens;
pub mod usage;
pub mod users;
pub mod version;
pub mod worker;

use clap::Args as ClapArgs;

/// Ends the command with a chosen exit code (docs/operations.md#commands) after printing its message.
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

/// The configuration of every command that opens the database, read as `serve` reads
/// it: `--config` / `$SUBFLOW_CONFIG` / `./subflow.toml`, `SUBFLOW__…` variables, then
/// `--database-url`.
#[derive(Debug, Clone, ClapArgs)]
pub struct DatabaseArgs {
    #[command(flatten)]
    config: config::ConfigArgs,
    /// Database URL (`database.url`), overriding the configuration.
    #[arg(long = "database-url", value_name = "URL")]
    database_url: Option<String>,
}

impl DatabaseArgs {
    /// The configuration file named by `--config`, if any.
    pub fn config(&self) -> &config::ConfigArgs {
        &self.config
    }

    /// The overrides these flags make, as (dotted key, value).
    pub fn overrides(&self) -> Vec<(&'static str, &str)> {
        self.database_url
            .iter()
            .map(|url| ("database.url", url.as_str()))
            .collect()
    }

    /// Loads and validates the configuration (models are not built).
    pub fn load(&self) -> Result<crate::config::Config, crate::config::ConfigError> {
        crate::config::Config::load(
            self.config.file.as_deref(),
            &config::process_env(),
            &self.overrides(),
        )
    }
}
