//! `subflow worker`: a batch worker without the gateway, for more machines sharing one
//! PostgreSQL database (SPEC §1.1, §12.1). On SQLite batches run only inside the single
//! `serve` process, so it refuses to start there with exit code 2.

use super::Exit;
use super::config::ConfigArgs;
use crate::process::{Process, shutdown_on_signal};
use crate::storage::{BackendKind, redact};

/// What `subflow worker` says on SQLite.
pub const REQUIRES_POSTGRES: &str = "subflow worker requires PostgreSQL";

/// Arguments of `subflow worker`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: ConfigArgs,
    /// Database URL (`database.url`), a postgres:// URL.
    #[arg(long = "database-url")]
    database_url: Option<String>,
}

/// Runs `subflow worker` until Ctrl-C or SIGTERM; it stops within 5 s.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut overrides = Vec::new();
    if let Some(url) = &args.database_url {
        overrides.push(("database.url", url.as_str()));
    }
    let built = args.config.load_and_build(&overrides)?;
    if BackendKind::of(&built.config.database.url)? != BackendKind::Postgres {
        return Err(Exit::new(2, REQUIRES_POSTGRES).into());
    }
    if !built.config.subagent_batches.enabled {
        return Err(Exit::new(2, "subflow worker needs subagent_batches.enabled = true").into());
    }
    crate::logging::init(
        &built.config.logging.level,
        crate::logging::LineFormat::of(&built.config.logging),
    );
    let process = Process::start(built).await?;
    let worker = process.batch_worker()?;
    let shutdown = shutdown_on_signal();
    eprintln!(
        "subflow: batch worker {} on database {}",
        worker.handle().worker_id(),
        redact(&process.config.database.url)
    );
    let (_, task) = Process::spawn_worker(worker, shutdown);
    let _ = task.await;
    process.stop().await;
    eprintln!("subflow: stopped");
    Ok(())
}
