//! `subflow serve`: today it prepares the database; the HTTP gateway builds on it.

use super::DatabaseArgs;
use crate::storage::redact;

/// Arguments of `subflow serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    database: DatabaseArgs,
    /// Address to listen on.
    #[arg(
        long,
        env = "SUBFLOW__SERVER__LISTEN",
        default_value = "127.0.0.1:8001"
    )]
    listen: String,
    /// Do not run the in-process batch worker.
    #[arg(long)]
    no_worker: bool,
}

/// Migrates the database and recovers spilled events, then reports that the gateway is
/// not part of this build yet.
pub async fn run(args: Args) -> anyhow::Result<()> {
    super::migrate::open_and_recover(&args.database).await?;
    eprintln!(
        "subflow: database {} is migrated and ready; serve arrives with the gateway (would listen on {}{})",
        redact(&args.database.url),
        args.listen,
        if args.no_worker {
            ", without a batch worker"
        } else {
            ""
        }
    );
    Ok(())
}
