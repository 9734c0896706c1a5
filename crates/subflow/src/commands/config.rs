//! `subflow config`: print the documented example configuration, or check one the way
//! `serve` would load it.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::config::{self, Built, ConfigError};
use crate::storage::{BackendKind, data_dir};

/// `subflow config …`.
#[derive(Debug, clap::Subcommand)]
pub enum ConfigCommand {
    /// Print a documented subflow.toml with every default.
    Default,
    /// Load, validate and build the configuration as `serve` does; print `ok` or the
    /// error (exit code 2).
    Check(ConfigArgs),
}

/// `--config FILE`, for every command that reads the configuration.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigArgs {
    /// Configuration file [default: $SUBFLOW_CONFIG, else ./subflow.toml].
    #[arg(long = "config", value_name = "FILE")]
    pub file: Option<PathBuf>,
}

impl ConfigArgs {
    /// Loads, validates and builds the configuration from the file, the process
    /// environment and `overrides` (dotted key, value) taken from command-line flags.
    pub fn load_and_build(&self, overrides: &[(&str, &str)]) -> Result<Built, ConfigError> {
        config::load_and_build(self.file.as_deref(), &process_env(), overrides)
    }
}

/// The process environment; variables that are not valid Unicode are skipped.
pub fn process_env() -> HashMap<String, String> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .collect()
}

/// Runs `subflow config …`.
pub fn run(command: ConfigCommand) -> anyhow::Result<()> {
    match command {
        ConfigCommand::Default => {
            out!("{}", config::EXAMPLE)?;
            Ok(())
        }
        ConfigCommand::Check(args) => {
            let Built {
                config,
                models,
                observers,
                exporters,
            } = args.load_and_build(&[])?;
            // Building them checked the webhook URLs and secrets; nothing runs here.
            drop(observers);
            BackendKind::of(&config.database.url)?;
            let runtime = config.runtime_config(&data_dir(&config.database.url));
            eprintln!(
                "subflow: {} model(s), lead {:?}; {} subagent type(s); {} webhook(s); {} span exporter(s)",
                models.len(),
                config.lead_model().name,
                runtime.definitions.len(),
                config.observers.webhooks.len(),
                exporters.len(),
            );
            outln!("ok")?;
            Ok(())
        }
    }
}
