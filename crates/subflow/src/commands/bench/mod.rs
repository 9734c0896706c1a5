//! `subflow bench`: speed measurements that print ratios against a baseline measured in
//! the same run. Run them on a release build.

mod batches;
mod gateway;
mod runtime;
mod sse;
mod store;

use clap::Subcommand;

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum Bench {
    /// Run event ingest through the real buffer and store against the driver's ceiling,
    /// then task-filtered paging.
    Store(store::StoreArgs),
    /// Observability overhead per subagent step: a delegation run with events persisted
    /// to SQLite against the same run on the in-memory store.
    Runtime(runtime::RuntimeArgs),
    /// The gateway's read paths over HTTP against the store, and the idle memory of `serve`.
    Gateway(gateway::GatewayArgs),
    /// Durable batches: the worker on SQLite (and on the in-memory store) against the
    /// executor alone, claim pass times, and with --postgres-url the scaling from 1 to 3
    /// worker processes.
    Batches(batches::BatchesArgs),
}

/// The store under a measurement that is taken on both: the durable one, and the
/// in-memory one whose calls cost next to nothing, which splits the store's cost from
/// the measured path's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backing {
    /// A fresh SQLite file.
    Sqlite,
    /// The in-memory store.
    Memory,
}

/// Runs a benchmark.
pub async fn run(bench: Bench) -> anyhow::Result<()> {
    match bench {
        Bench::Store(args) => store::run(args).await,
        Bench::Runtime(args) => runtime::run(args).await,
        Bench::Gateway(args) => gateway::run(args).await,
        Bench::Batches(args) => batches::run(args).await,
    }
}

/// The middle value of a benchmark's rounds.
/// Creates the record of a bench run, owned by `bench`, as a run request would.
async fn create_run(
    store: &dyn subflow_store::Store,
    thread_id: &str,
    run_id: &str,
) -> anyhow::Result<()> {
    store
        .create_run(subflow_store::NewRun {
            run_id: run_id.to_owned(),
            thread_id: thread_id.to_owned(),
            owner: "bench".into(),
            assistant_id: "lead_agent".into(),
            model_name: None,
            trace_id: None,
            metadata: Default::default(),
            multitask_strategy: "reject".into(),
            kwargs: serde_json::json!({}),
        })
        .await?;
    Ok(())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Peak resident set size of this process, from `/proc/self/status`.
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmHWM:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<f64>()
                        .ok()
                })
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
