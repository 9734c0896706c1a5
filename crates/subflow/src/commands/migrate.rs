//! `subflow migrate`: applies the embedded migrations and re-applies spilled run events.

use std::sync::Arc;

use anyhow::Context;
use subflow_store::spill::SpillFile;

use super::DatabaseArgs;
use crate::storage::{Backend, data_dir, redact};

/// Arguments of `subflow migrate`: the configuration `serve` reads.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    database: DatabaseArgs,
}

/// Opens the database (which migrates it) and writes back any spilled run events.
pub async fn open_and_recover(url: &str, max_connections: u32) -> anyhow::Result<Backend> {
    let backend = Backend::open(url, max_connections).await?;
    let spill = Arc::new(SpillFile::in_dir(&data_dir(url)));
    let recovered = spill
        .reapply(&*backend.store())
        .await
        .context("re-applying spilled run events")?;
    if recovered > 0 {
        tracing::info!(records = recovered, path = %spill.path().display(), "re-applied spilled run events");
    }
    Ok(backend)
}

/// Runs `subflow migrate`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let config = args.database.load()?;
    let url = &config.database.url;
    let backend = open_and_recover(url, config.database.max_connections).await?;
    backend.close().await;
    eprintln!("subflow: database {} is migrated", redact(url));
    Ok(())
}
