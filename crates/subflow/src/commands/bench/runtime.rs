//! `subflow bench runtime`: the cost of observing delegation. A lead run delegates to
//! subagents that each take many scripted steps with no model delay; every step is
//! emitted live and persisted. The same run on the in-memory store is the baseline.
//! Every SQLite run goes to one store, opened before the first and closed after the
//! last, as runs go to a serving gateway's: a store opened per run would count its
//! connections' first schema reads and statement preparations in every run, and one
//! dropped unclosed would checkpoint and close its file during the next baseline run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use subflow_contracts::RunStatus;
use subflow_contracts::messages::Message;
use subflow_contracts::task_events::TaskEvent;
use subflow_models::{ChatModel, ScriptedConfig, ScriptedModel};
use subflow_runtime::output::{OutputSink, RunOutput};
use subflow_runtime::run::RunSpec;
use subflow_runtime::runtime::RuntimeOptions;
use subflow_store::{MemoryStore, Store};
use subflow_store_sqlite::SqliteStore;
use tokio_util::sync::CancellationToken;

use super::super::UsageError;
use super::median;

/// Arguments of `subflow bench runtime`.
#[derive(Debug, clap::Args)]
pub struct RuntimeArgs {
    /// Subagents the lead delegates to in parallel (1–3).
    #[arg(long, default_value_t = 3)]
    subagents: usize,
    /// Tool steps each subagent takes before its answer (even, at least 2).
    #[arg(long, default_value_t = 50)]
    steps: usize,
    /// Runs of each kind, interleaved; the medians are reported. A run takes a few
    /// milliseconds, so fewer leave the ratio to the host's noise.
    #[arg(long, default_value_t = 15)]
    repeat: usize,
}

struct Measured {
    steps: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

/// Runs `subflow bench runtime`.
pub async fn run(args: RuntimeArgs) -> anyhow::Result<()> {
    if !(1..=3).contains(&args.subagents)
        || args.steps < 2
        || !args.steps.is_multiple_of(2)
        || args.repeat == 0
    {
        return Err(UsageError(
            "--subagents must be 1-3, --steps an even number >= 2 and --repeat >= 1".into(),
        )
        .into());
    }
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let script = dir.path().join("bench-script.json");
    std::fs::write(
        &script,
        script_rules(args.subagents, args.steps).to_string(),
    )
    .context("writing the bench script")?;

    let mut persisted = Vec::new();
    let mut baseline = Vec::new();
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let sqlite = Arc::new(SqliteStore::open(&url, 4).await?);
    for attempt in 0..args.repeat {
        persisted.push(measure(sqlite.clone(), dir.path(), &script, attempt).await?);
        baseline.push(measure(Arc::new(MemoryStore::new()), dir.path(), &script, attempt).await?);
    }
    sqlite.close().await;
    let rate = |m: &Measured| m.steps as f64 / m.elapsed.as_secs_f64();
    let steps_per_s = median(persisted.iter().map(rate).collect());
    let baseline_per_s = median(baseline.iter().map(rate).collect());
    let mut latencies: Vec<Duration> = persisted
        .iter()
        .flat_map(|m| m.latencies.iter().copied())
        .collect();
    latencies.sort();
    let percentile = |p: f64| {
        latencies[((latencies.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e6
    };
    eprintln!(
        "bench runtime: {} subagents x {} steps, {} runs each on SQLite and in memory",
        args.subagents, args.steps, args.repeat
    );
    println!(
        "steps={} steps_per_s={:.0} baseline_steps_per_s={:.0} ratio={:.3} event_p50_us={:.1} event_p99_us={:.1}",
        persisted[0].steps,
        steps_per_s,
        baseline_per_s,
        steps_per_s / baseline_per_s,
        percentile(0.5),
        percentile(0.99)
    );
    Ok(())
}

/// The lead delegates `subagents` tasks, then answers; each subagent lists `steps / 2`
/// different directories (an AI step and a tool step each), then answers in one more step.
fn script_rules(subagents: usize, steps: usize) -> serde_json::Value {
    let calls: Vec<_> = (0..subagents)
        .map(|n| json!({"name": "task", "args": {"description": format!("Bench task {n}"), "prompt": format!("Survey area {n}"), "subagent_type": "general-purpose"}}))
        .collect();
    let mut turns: Vec<_> = (0..steps / 2)
        .map(|n| json!({"text": format!("Looking at area {n}."), "tool_calls": [{"name": "ls", "args": {"path": format!("area-{n}")}}]}))
        .collect();
    turns.push(json!({"text": "Survey complete."}));
    json!({"rules": [
        {"agent": "lead_agent", "turns": [{"tool_calls": calls}, {"text": "All surveys are complete."}]},
        {"agent": "subagent:general-purpose", "turns": turns},
    ]})
}

async fn measure(
    store: Arc<dyn Store>,
    dir: &std::path::Path,
    script: &std::path::Path,
    attempt: usize,
) -> anyhow::Result<Measured> {
    let model: Arc<dyn ChatModel> = Arc::new(ScriptedModel::new(ScriptedConfig {
        script: Some(script.to_path_buf()),
        demo_delay_ms: 0,
        ..ScriptedConfig::default()
    })?);
    // Every guard stays on: their bookkeeping is part of each step's cost. The script's
    // calls differ in their arguments and stay under the per-tool frequency limits.
    let runtime = RuntimeOptions::new(store.clone(), vec![model], dir.to_path_buf()).build();
    let retry = runtime.retry_queue().clone();
    let thread = format!("bench-{attempt}");
    let run_id = format!("run-{attempt}");
    super::create_run(&*store, &thread, &run_id).await?;
    let (sink, mut output) = OutputSink::channel();
    // The consumer reads concurrently, as the gateway does, timing each step's event.
    let consumer = tokio::spawn(async move {
        let mut latencies = Vec::new();
        while let Some(item) = output.recv().await {
            if let RunOutput::Custom {
                event: TaskEvent::Running { .. },
                created,
            } = item
            {
                latencies.push(created.elapsed());
            }
        }
        latencies
    });
    let spec = RunSpec {
        lease_owner: None,
        thread_id: thread,
        run_id,
        user_id: Some("bench".into()),
        model_name: None,
        input: vec![Message::human("Survey everything")],
        trace_id: uuid::Uuid::new_v4().simple().to_string(),
        delegation_trace: None,
        cancel: CancellationToken::new(),
        tasks: Default::default(),
        timeout: Duration::from_secs(600),
        trace: Default::default(),
    };
    let started = Instant::now();
    let result = runtime.run(spec, sink).await;
    let elapsed = started.elapsed();
    retry.shutdown().await;
    let latencies = consumer.await.context("the output consumer failed")?;
    if result.status != RunStatus::Success {
        bail!(
            "the bench run ended {:?}: {:?}",
            result.status,
            result.error
        );
    }
    Ok(Measured {
        steps: latencies.len(),
        elapsed,
        latencies,
    })
}
