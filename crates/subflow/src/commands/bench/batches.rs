//! `subflow bench batches`: what durability costs. A batch of N items (scripted model, no
//! delay) runs to completion through the batch worker on SQLite; the same items through
//! the subagent executor alone, with no store, are the baseline of the same run (three
//! rounds of each, interleaved; the medians are reported). The worker also runs the
//! batch on the in-memory store: what is left of the ratio there is the worker's own
//! work, and the rest is the durable store's. Then one
//! claim pass is timed with 100 and with 5,000 items waiting. With `--postgres-url`, a
//! batch with a 200 ms model delay runs on 1 and then on 3 `subflow worker` processes.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_trait::async_trait;
use futures::StreamExt;
use serde_json::json;
use subflow_batches::{AttemptEnd, Options, WorkerMetrics};
use subflow_contracts::{BatchItemStatus, BatchStatus};
use subflow_models::{ChatModel, ScriptedConfig, ScriptedModel};
use subflow_runtime::admission::AdmissionConfig;
use subflow_runtime::runtime::{Runtime, RuntimeOptions};
use subflow_runtime::subagent::{ExecutionSpec, SubagentDefinition, SubmittedBy};
use subflow_store::{
    AttemptOutcome, BatchItem, BatchQuery, BatchRecord, BatchScope, BatchStore, BatchTotals,
    ClaimPass, ClaimRequest, ItemLease, ItemQuery, NewBatch, NewItem, ReleaseReason, Renewal,
    Result as StoreResult, RetryOutcome, Store, Submitted, WorkerHeartbeat,
};
use subflow_store_postgres::PostgresStore;
use subflow_store_sqlite::SqliteStore;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::super::UsageError;
use super::{Backing, median};

/// Executions at once, for the worker and for the baseline alike: the ceiling of
/// `subagent_runtime.max_running`, and the batch's running cap (the default ceiling of
/// `max_running_items_per_batch`).
const SLOTS: usize = 64;
/// The batch's live cap: the default ceiling of `max_live_items_per_batch`.
const LIVE: usize = 1000;
/// Worker and baseline runs, interleaved so that both see the machine alike; the
/// medians are reported.
const ROUNDS: usize = 3;
/// Slots of each `subflow worker` process in the PostgreSQL run.
const WORKER_SLOTS: usize = 8;
/// Timed claim passes per size.
const CLAIM_SAMPLES: usize = 40;

/// Arguments of `subflow bench batches`.
#[derive(Debug, clap::Args)]
pub struct BatchesArgs {
    /// Items of the SQLite batch (at least 100).
    #[arg(long, default_value_t = 5000)]
    items: usize,
    /// An empty PostgreSQL database for the multi-worker run (skipped without one).
    #[arg(long = "postgres-url")]
    postgres_url: Option<String>,
    /// Items of each PostgreSQL batch (at least 50).
    #[arg(long = "postgres-items", default_value_t = 1500)]
    postgres_items: usize,
}

/// Runs `subflow bench batches`.
pub async fn run(args: BatchesArgs) -> anyhow::Result<()> {
    if args.items < 100
        || args.items > subflow_store::batches::MAX_ITEMS
        || args.postgres_items < 50
    {
        return Err(UsageError(
            "--items must be 100-100000 and --postgres-items at least 50".into(),
        )
        .into());
    }
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    eprintln!(
        "bench batches: {} items on SQLite, {SLOTS} at once",
        args.items
    );
    let (mut worker, mut baseline, mut writes) = (Vec::new(), Vec::new(), Vec::new());
    let mut in_memory = Vec::new();
    for round in 1..=ROUNDS {
        let (items_per_s, writes_per_item) =
            worker_run(dir.path(), args.items, round, Backing::Sqlite).await?;
        let baseline_per_s = executor_run(dir.path(), args.items).await?;
        let (memory_per_s, _) = worker_run(dir.path(), args.items, round, Backing::Memory).await?;
        eprintln!(
            "round {round}: worker {items_per_s:.0} items/s (on the in-memory store {memory_per_s:.0}), executor alone {baseline_per_s:.0} items/s"
        );
        worker.push(items_per_s);
        baseline.push(baseline_per_s);
        writes.push(writes_per_item);
        in_memory.push(memory_per_s);
    }
    let (items_per_s, baseline_per_s) = (median(worker), median(baseline));
    let (writes_per_item, memory_per_s) = (median(writes), median(in_memory));
    let claim_100 = claim_p50(dir.path(), 100).await?;
    let claim_5000 = claim_p50(dir.path(), 5000).await?;
    println!(
        "items={} items_per_s={items_per_s:.0} baseline_items_per_s={baseline_per_s:.0} ratio={:.3} store_writes_per_item={writes_per_item:.2} claim_p50_ms_100={claim_100:.3} claim_p50_ms_5000={claim_5000:.3} memory_items_per_s={memory_per_s:.0} memory_ratio={:.3}",
        args.items,
        items_per_s / baseline_per_s,
        memory_per_s / baseline_per_s,
    );
    if let Some(url) = &args.postgres_url {
        eprintln!(
            "bench batches: {} items with a 200 ms model on PostgreSQL, {WORKER_SLOTS} slots per worker",
            args.postgres_items
        );
        let one = postgres_run(dir.path(), url, 1, args.postgres_items).await?;
        let three = postgres_run(dir.path(), url, 3, args.postgres_items).await?;
        println!(
            "workers=1 items_per_s={one:.1} workers=3 items_per_s={three:.1} scale={:.2}",
            three / one
        );
    }
    Ok(())
}

/// A runtime on `store` with the scripted model (subagents echo their prompt at once).
fn runtime(dir: &Path, store: Arc<dyn Store>, slots: usize) -> anyhow::Result<Runtime> {
    let model: Arc<dyn ChatModel> = Arc::new(ScriptedModel::new(ScriptedConfig {
        demo_delay_ms: 0,
        ..ScriptedConfig::default()
    })?);
    Ok(RuntimeOptions {
        admission: AdmissionConfig {
            max_running: slots,
            ..AdmissionConfig::default()
        },
        ..RuntimeOptions::new(store, vec![model], dir.to_path_buf())
    }
    .build())
}

fn spec() -> ExecutionSpec {
    ExecutionSpec::new(
        &SubagentDefinition::general_purpose(600),
        "scripted",
        SubmittedBy {
            user_id: "bench".into(),
            thread_id: "bench".into(),
            run_id: None,
            tool_call_id: None,
            trace_id: uuid::Uuid::new_v4().simple().to_string(),
        },
    )
}

fn items(n: usize) -> Vec<NewItem> {
    (1..=n)
        .map(|i| NewItem {
            item_key: format!("item-{i}"),
            prompt: format!("Summarise part {i} of the report"),
            acceptance_criteria: Vec::new(),
        })
        .collect()
}

/// A batch of `n` items, `live` of them queued or running at once, `running` at a time.
fn new_batch(n: usize, live: usize, running: usize) -> NewBatch {
    NewBatch {
        thread_id: "bench".into(),
        user_id: "bench".into(),
        run_id: None,
        tool_call_id: None,
        submission_key: format!("bench:{}", uuid::Uuid::new_v4()),
        title: "Bench".into(),
        subagent_type: "general-purpose".into(),
        max_live_items: u32::try_from(live).unwrap_or(u32::MAX),
        max_running_items: u32::try_from(running).unwrap_or(u32::MAX),
        max_attempts: 3,
        execution_spec: spec().to_value(),
        items: items(n),
    }
}

async fn sqlite(dir: &Path, name: &str) -> anyhow::Result<SqliteStore> {
    let url = format!("sqlite://{}", dir.join(name).display());
    Ok(SqliteStore::open(&url, 4).await?)
}

/// Counts finished attempts and says when `target` succeeded.
#[derive(Debug)]
struct Finished {
    succeeded: AtomicU64,
    other: AtomicU64,
    target: u64,
    done: Notify,
}

impl WorkerMetrics for Finished {
    fn attempt_finished(&self, _agent: &str, end: AttemptEnd, _duration: Duration) {
        if end == AttemptEnd::Finished(BatchItemStatus::Succeeded) {
            if self.succeeded.fetch_add(1, Ordering::SeqCst) + 1 == self.target {
                self.done.notify_one();
            }
        } else {
            self.other.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The batch through the worker on `backing`: items per second from the first claim to
/// the last outcome, and the store writes it made per item.
async fn worker_run(
    dir: &Path,
    n: usize,
    round: usize,
    backing: Backing,
) -> anyhow::Result<(f64, f64)> {
    let file = match backing {
        Backing::Sqlite => {
            let name = format!("bench-worker-{round}.db");
            Some(Arc::new(sqlite(dir, &name).await?))
        }
        Backing::Memory => None,
    };
    let store: Arc<dyn Store> = match &file {
        Some(file) => file.clone(),
        None => Arc::new(subflow_store::MemoryStore::new()),
    };
    let counted = Arc::new(CountingStore::new(store.clone()));
    let runtime = runtime(dir, store, SLOTS)?;
    counted.submit_batch(new_batch(n, LIVE, SLOTS)).await?;
    let finished = Arc::new(Finished {
        succeeded: AtomicU64::new(0),
        other: AtomicU64::new(0),
        target: n as u64,
        done: Notify::new(),
    });
    let mut options = Options::new(counted.clone(), runtime, "bench");
    options.metrics = finished.clone();
    let worker = options.build()?;
    let stop = CancellationToken::new();
    let started = Instant::now();
    let task = tokio::spawn(worker.run(stop.clone().cancelled_owned()));
    tokio::time::timeout(Duration::from_secs(3600), finished.done.notified())
        .await
        .context("the batch did not finish within an hour")?;
    let elapsed = started.elapsed();
    stop.cancel();
    task.await.context("the worker task failed")??;
    // Closed here, not dropped: a dropped store checkpoints and closes its file on the
    // writer thread while the baseline that follows runs.
    if let Some(file) = file {
        file.close().await;
    }
    let other = finished.other.load(Ordering::SeqCst);
    if other > 0 {
        bail!("{other} attempts did not succeed");
    }
    let writes = counted.writes.load(Ordering::SeqCst) as f64;
    Ok((n as f64 / elapsed.as_secs_f64(), writes / n as f64))
}

/// The same items through the executor alone, `SLOTS` at a time, with no store.
async fn executor_run(dir: &Path, n: usize) -> anyhow::Result<f64> {
    let runtime = runtime(dir, Arc::new(subflow_store::MemoryStore::new()), SLOTS)?;
    let spec = spec();
    let started = Instant::now();
    let completed = futures::stream::iter(items(n).into_iter().enumerate())
        .map(|(i, item)| {
            let execution = spec.execution(
                subflow_batches::item::item_prompt(&item.item_key, &item.prompt),
                format!("baseline-{i}"),
                format!("batch item {}", item.item_key),
                Vec::new(),
            );
            let runtime = runtime.clone();
            async move {
                runtime
                    .execute_detached(execution, CancellationToken::new())
                    .await
            }
        })
        .buffer_unordered(SLOTS)
        .filter(|report| {
            futures::future::ready(report.status == subflow_contracts::SubagentStatus::Completed)
        })
        .count()
        .await;
    let elapsed = started.elapsed();
    if completed != n {
        bail!("{} baseline executions did not complete", n - completed);
    }
    Ok(n as f64 / elapsed.as_secs_f64())
}

/// The median time of one claim pass (one free slot) with `waiting` items queued; each
/// claim is handed back untimed, so every pass sees the same queue.
async fn claim_p50(dir: &Path, waiting: usize) -> anyhow::Result<f64> {
    let store = sqlite(dir, &format!("bench-claim-{waiting}.db")).await?;
    store
        .submit_batch(new_batch(waiting, waiting, SLOTS))
        .await?;
    let request = ClaimRequest {
        hostname: "bench".into(),
        worker_id: uuid::Uuid::new_v4().simple().to_string(),
        free_slots: 1,
        lease: Duration::from_secs(120),
        admitted: 0,
    };
    let mut samples = Vec::with_capacity(CLAIM_SAMPLES);
    // The first pass promotes every pending item; it is not timed.
    for sample in 0..=CLAIM_SAMPLES {
        let started = Instant::now();
        let pass = store.claim_pass(&request).await?;
        let elapsed = started.elapsed();
        let Some(claimed) = pass.claimed.first() else {
            bail!("a claim pass with {waiting} items waiting claimed nothing");
        };
        store
            .release_claim(&claimed.lease(), &ReleaseReason::ShutdownBeforeAdmission)
            .await?;
        if sample > 0 {
            samples.push(elapsed);
        }
    }
    samples.sort();
    Ok(samples[samples.len() / 2].as_secs_f64() * 1000.0)
}

/// A `subflow worker` process of this binary.
struct WorkerProcess(Child);

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a `subflow worker` on `config` and returns once it runs.
fn spawn_worker(config: &Path) -> anyhow::Result<WorkerProcess> {
    let exe = std::env::current_exe().context("finding this binary")?;
    let mut child = Command::new(exe)
        .args(["worker", "--config"])
        .arg(config)
        .env_remove("SUBFLOW_CONFIG")
        .stderr(Stdio::piped())
        .spawn()
        .context("starting subflow worker")?;
    let stderr = child.stderr.take().context("the worker's stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let started = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|line| line.contains("batch worker "));
    if !started {
        bail!("subflow worker did not start");
    }
    // Keep draining, so the worker never blocks on a full pipe.
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
    Ok(WorkerProcess(child))
}

/// One batch with a 200 ms model on `workers` worker processes: items per second from
/// the submission to completion.
async fn postgres_run(dir: &Path, url: &str, workers: usize, n: usize) -> anyhow::Result<f64> {
    let store = PostgresStore::connect(url, 4)
        .await
        .with_context(|| format!("connecting to {}", crate::storage::redact(url)))?;
    let script = dir.join("bench-pg-script.json");
    let rules = json!({"rules": [{"agent": "subagent:general-purpose",
        "turns": [{"text": "done", "delay_ms": 200}]}]});
    std::fs::write(&script, rules.to_string()).context("writing the bench script")?;
    let config = dir.join("bench-pg.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = \"{url}\"\n\n[logging]\nlevel = \"warn\"\n\n[[models]]\nname = \"scripted\"\nprovider = \"scripted\"\nmodel = \"scripted-1\"\nscript = \"{}\"\n\n[subagent_runtime]\nmax_running = {WORKER_SLOTS}\n\n[subagent_batches]\npoll_interval_seconds = 0.1\n\n[tools]\nworkspace_root = \"{}\"\n",
            script.display(),
            dir.join("workspaces").display()
        ),
    )
    .context("writing the worker configuration")?;
    let processes: Vec<WorkerProcess> = (0..workers)
        .map(|_| spawn_worker(&config))
        .collect::<anyhow::Result<_>>()?;
    let started = Instant::now();
    let batch = store
        .submit_batch(new_batch(n, n, WORKER_SLOTS * 3))
        .await?
        .batch;
    let scope = BatchScope::user("bench");
    loop {
        let now = store
            .get_batch(&scope, &batch.id)
            .await?
            .context("the bench batch vanished")?;
        if !now.status.is_active() {
            if now.status != BatchStatus::Completed || now.counts.succeeded != n as u64 {
                bail!("the batch ended {} with {:?}", now.status, now.counts);
            }
            break;
        }
        if started.elapsed() > Duration::from_secs(3600) {
            bail!("the PostgreSQL batch did not finish within an hour");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    for mut process in processes {
        let _ = Command::new("kill")
            .args(["-TERM", &process.0.id().to_string()])
            .status();
        let _ = process.0.wait();
    }
    Ok(n as f64 / elapsed.as_secs_f64())
}

/// A [`BatchStore`] that counts the writes passing through it.
#[derive(Debug)]
struct CountingStore {
    inner: Arc<dyn Store>,
    writes: AtomicU64,
}

impl CountingStore {
    fn new(inner: Arc<dyn Store>) -> Self {
        CountingStore {
            inner,
            writes: AtomicU64::new(0),
        }
    }

    fn write(&self) {
        self.writes.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl BatchStore for CountingStore {
    async fn submit_batch(&self, batch: NewBatch) -> StoreResult<Submitted> {
        self.write();
        self.inner.submit_batch(batch).await
    }
    async fn get_batch(&self, scope: &BatchScope, id: &str) -> StoreResult<Option<BatchRecord>> {
        self.inner.get_batch(scope, id).await
    }
    async fn list_batches(
        &self,
        scope: &BatchScope,
        query: &BatchQuery,
    ) -> StoreResult<Vec<BatchRecord>> {
        self.inner.list_batches(scope, query).await
    }
    async fn list_items(
        &self,
        scope: &BatchScope,
        id: &str,
        query: &ItemQuery,
    ) -> StoreResult<Vec<BatchItem>> {
        self.inner.list_items(scope, id, query).await
    }
    async fn get_item(
        &self,
        scope: &BatchScope,
        id: &str,
        item: &str,
    ) -> StoreResult<Option<BatchItem>> {
        self.inner.get_item(scope, id, item).await
    }
    async fn export_items(
        &self,
        scope: &BatchScope,
        id: &str,
        after: Option<u32>,
    ) -> StoreResult<Vec<BatchItem>> {
        self.inner.export_items(scope, id, after).await
    }
    async fn pause_batch(&self, scope: &BatchScope, id: &str) -> StoreResult<Option<BatchRecord>> {
        self.write();
        self.inner.pause_batch(scope, id).await
    }
    async fn mark_budget(
        &self,
        scope: &BatchScope,
        id: &str,
        level: u32,
        pause: bool,
    ) -> StoreResult<Option<(BatchRecord, u32)>> {
        self.write();
        self.inner.mark_budget(scope, id, level, pause).await
    }
    async fn resume_batch(&self, scope: &BatchScope, id: &str) -> StoreResult<Option<BatchRecord>> {
        self.write();
        self.inner.resume_batch(scope, id).await
    }
    async fn cancel_batch(&self, scope: &BatchScope, id: &str) -> StoreResult<Option<BatchRecord>> {
        self.write();
        self.inner.cancel_batch(scope, id).await
    }
    async fn retry_item(
        &self,
        scope: &BatchScope,
        id: &str,
        item: &str,
    ) -> StoreResult<RetryOutcome> {
        self.write();
        self.inner.retry_item(scope, id, item).await
    }
    async fn claim_pass(&self, request: &ClaimRequest) -> StoreResult<ClaimPass> {
        self.write();
        self.inner.claim_pass(request).await
    }
    async fn mark_running(&self, lease: &ItemLease) -> StoreResult<bool> {
        self.write();
        self.inner.mark_running(lease).await
    }
    async fn renew_lease(&self, lease: &ItemLease, ttl: Duration) -> StoreResult<Renewal> {
        self.write();
        self.inner.renew_lease(lease, ttl).await
    }
    async fn finish_attempts(
        &self,
        outcomes: &[(ItemLease, AttemptOutcome)],
    ) -> StoreResult<Vec<Option<BatchItemStatus>>> {
        self.write();
        self.inner.finish_attempts(outcomes).await
    }
    async fn release_claim(
        &self,
        lease: &ItemLease,
        reason: &ReleaseReason,
    ) -> StoreResult<Option<BatchItemStatus>> {
        self.write();
        self.inner.release_claim(lease, reason).await
    }
    async fn heartbeat(&self, worker: &WorkerHeartbeat) -> StoreResult<()> {
        self.write();
        self.inner.heartbeat(worker).await
    }
    async fn remove_worker(&self, worker_id: &str) -> StoreResult<bool> {
        self.write();
        self.inner.remove_worker(worker_id).await
    }
    async fn live_workers(&self, max_age: Duration) -> StoreResult<u64> {
        self.inner.live_workers(max_age).await
    }
    async fn batch_totals(&self) -> StoreResult<BatchTotals> {
        self.inner.batch_totals().await
    }
    async fn batch_activity(
        &self,
        scope: &BatchScope,
        query: &subflow_store::ActivityQuery,
    ) -> StoreResult<Vec<subflow_store::BatchActivity>> {
        self.inner.batch_activity(scope, query).await
    }
}
