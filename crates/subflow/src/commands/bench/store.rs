//! `subflow bench`: speed measurements that print ratios against a baseline taken in
//! the same run. Run them on a release build.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::ValueEnum;
use serde_json::json;
use subflow_contracts::NewEvent;
use subflow_contracts::messages::{AiMessage, Message, ToolCall};
use subflow_contracts::task_events::TaskEvent;
use subflow_contracts::task_result::TokenUsage;
use subflow_store::buffer::{
    BufferKind, BufferPolicy, EventBuffer, EventScope, RetryPolicy, RetryQueue, StoreCounters,
};
use subflow_store::spill::SpillFile;
use subflow_store::{EventQuery, Store};

use super::super::UsageError;
use super::{median, peak_rss_mb};
use crate::storage::Backend;

/// Which backend `bench store` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchBackend {
    /// A fresh SQLite file in a temporary directory.
    Sqlite,
    /// The PostgreSQL server at `--database-url`.
    Postgres,
}

/// Arguments of `subflow bench store`.
#[derive(Debug, clap::Args)]
pub struct StoreArgs {
    /// The backend to measure.
    #[arg(long, value_enum, default_value = "sqlite")]
    backend: BenchBackend,
    /// `subagent.step` records to write; at least 20,000 (one run of 2 × 10,000 steps).
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// PostgreSQL server for `--backend postgres`.
    #[arg(
        long = "database-url",
        env = "SUBFLOW_TEST_PG_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    database_url: String,
}

/// Steps per task: one task of each run is paged through.
const STEPS_PER_TASK: usize = 10_000;
/// Tasks interleaved in each run.
const TASKS_PER_RUN: usize = 2;
/// Page size of the paging phase.
const PAGE_LIMIT: u32 = 500;
/// Passes over the paged task.
const PAGE_PASSES: usize = 5;

/// Runs `subflow bench store`.
pub async fn run(args: StoreArgs) -> anyhow::Result<()> {
    let per_run = STEPS_PER_TASK * TASKS_PER_RUN;
    if args.events < per_run {
        return Err(UsageError(format!(
            "--events must be at least {per_run} so that one task has {STEPS_PER_TASK} steps"
        ))
        .into());
    }
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let url = match args.backend {
        BenchBackend::Sqlite => format!("sqlite://{}", dir.path().join("bench.db").display()),
        BenchBackend::Postgres => args.database_url.clone(),
    };
    let backend = Backend::open(&url, 4).await?;
    let store = backend.store();
    // Fresh ids each run, so an existing PostgreSQL database does not matter.
    let tag = uuid::Uuid::new_v4().simple().to_string();

    let runs = args.events / per_run;
    let events = runs * per_run;
    eprintln!(
        "bench store: {events} subagent.step records in {runs} runs per round, {ROUNDS} rounds (ingest and ceiling interleaved), backend {:?}",
        args.backend
    );

    let (mut ingest_eps, mut ceiling_eps, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut page_p50 = Vec::new();
    for round in 0..ROUNDS {
        let thread = format!("bench-{}-{round}", &tag[..12]);
        let ceiling_thread = format!("{thread}-ceiling");
        let ingest_secs = ingest(&store, dir.path(), &thread, runs)
            .await?
            .as_secs_f64();
        let ceiling_secs = ceiling(&backend, &ceiling_thread, runs)
            .await?
            .as_secs_f64();
        page_p50.push(page(&store, &thread).await?.as_secs_f64() * 1000.0);
        let (ingest, ceiling) = (events as f64 / ingest_secs, events as f64 / ceiling_secs);
        eprintln!(
            "round {}: ingest_eps={ingest:.0} ceiling_eps={ceiling:.0} ratio={:.3}",
            round + 1,
            ingest / ceiling
        );
        ingest_eps.push(ingest);
        ceiling_eps.push(ceiling);
        ratios.push(ingest / ceiling);
        let _ = store.delete_thread(&thread).await;
        let _ = store.delete_thread(&ceiling_thread).await;
    }
    if let Backend::Sqlite(sqlite) = &backend {
        sqlite.close().await;
    }

    println!(
        "ingest_eps={:.0} ceiling_eps={:.0} ratio={:.3} page_p50_ms={:.3} rss_mb={:.1}",
        median(ingest_eps),
        median(ceiling_eps),
        median(ratios),
        median(page_p50),
        peak_rss_mb()
    );
    Ok(())
}

/// Rounds of ingest and ceiling, each printed; the last line has their medians.
const ROUNDS: usize = 3;

/// The live task event of one step, as a subagent's emitter holds it: ~360 bytes of
/// content once mapped to its record.
fn step_event(task: &str, index: usize) -> TaskEvent {
    let message = Message::Ai(AiMessage {
        content: json!(format!(
            "Step {index:05}: read the design notes, compared the three storage options and wrote the findings to notes/{task}.md for the summary."
        )),
        id: Some(format!("msg-{task}-{index}")),
        tool_calls: vec![ToolCall::new(
            format!("tc-{index}"),
            "write_file",
            json!({"path": format!("notes/{task}.md")}),
        )],
        ..AiMessage::default()
    });
    let usage = TokenUsage {
        input_tokens: 1200,
        output_tokens: 80,
        total_tokens: 1280,
        ..TokenUsage::default()
    };
    TaskEvent::Running {
        task_id: task.to_owned(),
        message: Box::new(message),
        message_index: index as u64,
        total_messages: index as u64,
        usage: Some(usage),
        model_name: "scripted-1".to_owned(),
    }
}

fn task_ids(run: usize) -> [String; TASKS_PER_RUN] {
    [format!("call_{run:04}a"), format!("call_{run:04}b")]
}

/// Events per timed slice: chunks and rows are built untimed a slice at a time, so the
/// benchmark's own data generation is neither timed nor held in memory all at once.
const SLICE: usize = 2_000;

/// The live task events of one slice of a run: steps `first..first + SLICE / 2` of both tasks.
fn slice_events(run: usize, first: usize) -> Vec<TaskEvent> {
    let tasks = task_ids(run);
    (first..first + SLICE / TASKS_PER_RUN)
        .flat_map(|index| tasks.iter().map(move |task| step_event(task, index)))
        .collect()
}

/// The real path, timed from the live task event to the committed row, as a subagent's
/// emitter records it: mapping to its record, the per-run buffer (batches of 25) and
/// the store. Each slice is timed until its buffer has closed, that is until every
/// record of it is written.
async fn ingest(
    store: &Arc<dyn Store>,
    dir: &std::path::Path,
    thread: &str,
    runs: usize,
) -> anyhow::Result<Duration> {
    let counters = Arc::new(StoreCounters::default());
    let spill = Arc::new(SpillFile::in_dir(dir));
    let retry = RetryQueue::spawn(
        store.clone(),
        spill.clone(),
        RetryPolicy::default(),
        counters.clone(),
    );
    let mut timed = Duration::ZERO;
    for run in 0..runs {
        for first in (1..=STEPS_PER_TASK).step_by(SLICE / TASKS_PER_RUN) {
            let events = slice_events(run, first);
            let started = Instant::now();
            let scope = EventScope {
                thread_id: thread.into(),
                run_id: format!("run-{run}"),
                user_id: Some("bench".into()),
            };
            let policy = BufferPolicy::subagent(Duration::from_millis(250));
            let buffer = EventBuffer::spawn(
                store.clone(),
                scope,
                policy,
                retry.clone(),
                counters.clone(),
            );
            for event in &events {
                buffer.record_mapped(event.record())?;
            }
            buffer.close().await;
            timed += started.elapsed();
        }
    }
    retry.shutdown().await;
    if counters.flush_failures(BufferKind::Subagent) > 0 || spill.path().exists() {
        bail!("the store failed writes during the benchmark; see the log above");
    }
    let flushes = counters.flushes(BufferKind::Subagent).max(1);
    eprintln!(
        "ingest: {} batch writes, {:.1} records per batch (25 unless a backlog was waiting)",
        flushes,
        (runs * STEPS_PER_TASK * TASKS_PER_RUN) as f64 / flushes as f64
    );
    Ok(timed)
}

/// The same rows straight into the driver, timed per slice: one transaction of
/// [`SLICE`] rows through large statements, with no validation or seq allocation.
async fn ceiling(backend: &Backend, thread: &str, runs: usize) -> anyhow::Result<Duration> {
    let mut next_seq = 1;
    let mut timed = Duration::ZERO;
    for run in 0..runs {
        for first in (1..=STEPS_PER_TASK).step_by(SLICE / TASKS_PER_RUN) {
            let rows: Vec<NewEvent> = slice_events(run, first)
                .iter()
                .map(|event| event.record().into_event(thread, &format!("run-{run}")))
                .collect();
            let started = Instant::now();
            match backend {
                Backend::Sqlite(sqlite) => sqlite.insert_rows_unchecked(&rows, next_seq).await?,
                Backend::Postgres(postgres) => {
                    postgres.insert_rows_unchecked(&rows, next_seq).await?
                }
            }
            timed += started.elapsed();
            next_seq += rows.len() as i64;
        }
    }
    Ok(timed)
}

/// Pages through the first run's first task (10,000 steps) with `limit = 500`,
/// filtered by `task_id`; returns the median page time.
async fn page(store: &Arc<dyn Store>, thread: &str) -> anyhow::Result<Duration> {
    let task = task_ids(0)[0].clone();
    let mut times = Vec::new();
    for _ in 0..PAGE_PASSES {
        let mut query = EventQuery::run(thread, "run-0");
        query.task_id = Some(task.clone());
        query.limit = PAGE_LIMIT;
        let mut seen = 0;
        loop {
            let started = Instant::now();
            let page = store.list_events(&query).await?;
            times.push(started.elapsed());
            seen += page.len();
            if page.len() < PAGE_LIMIT as usize {
                break;
            }
            query.after_seq = page.last().map(|e| e.seq);
        }
        if seen != STEPS_PER_TASK {
            bail!("paging returned {seen} steps, expected {STEPS_PER_TASK}");
        }
    }
    times.sort();
    Ok(times[times.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bench_step_is_a_subagent_step_record_of_its_task_of_about_360_bytes() {
        let row = step_event("call_0000a", 7)
            .record()
            .into_event("bench-thread", "run-0");
        assert_eq!(row.event_type, "subagent.step");
        assert_eq!(row.task_id(), Some("call_0000a"));
        let bytes = row.content.get().len();
        assert!((300..=420).contains(&bytes), "{bytes} bytes of content");
        assert!(row.content.get().contains("notes/call_0000a.md"));
    }
}
