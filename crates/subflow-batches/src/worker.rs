//! The batch worker (docs/batches.md#leases-and-fencing, docs/batches.md#claim-pass): it claims items every `poll_interval_seconds`
//! while it has free slots, and as soon as half its slots are free; it runs each claimed
//! attempt as a local execution that renews its lease, heartbeats into the workers
//! table, and stops within 5 s.
//!
//! Shape: [`Options`] → [`Options::build`] → [`Worker::run`] with a shutdown future,
//! and a cheap [`Handle`] for whoever reports on it. [`Worker::claim_and_run_once`] is
//! one step of the loop, for tests and benchmarks that drive the worker themselves.

mod attempt;
mod finisher;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use subflow_contracts::BatchItemStatus;
use subflow_runtime::runtime::Runtime;
use subflow_store::{BatchStore, ClaimRequest, ClaimedItem, ReleaseReason, WorkerHeartbeat};
use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;

use crate::metrics::{AttemptEnd, NoMetrics, WorkerMetrics};
use attempt::{Attempt, StopCause, Stopper};
use finisher::Finisher;

/// The longest a worker takes to stop (docs/batches.md#claim-pass).
pub const SHUTDOWN_LIMIT: Duration = Duration::from_secs(5);

/// Part of [`SHUTDOWN_LIMIT`] left for removing the worker's row.
const FAREWELL: Duration = Duration::from_millis(500);

/// Why a worker cannot start or a step failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An option outside what the worker can run with.
    #[error("invalid batch worker option: {0}")]
    Options(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] subflow_store::Error),
}

/// What a worker is built from; [`Options::new`] has the defaults of docs/batches.md#configuration.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where batches live.
    pub store: Arc<dyn BatchStore>,
    /// The runtime whose executor, models and admission controller items use.
    pub runtime: Runtime,
    /// This machine's name, the first part of every `lease_owner`.
    pub hostname: String,
    /// `subagent_batches.lease_seconds`.
    pub lease: Duration,
    /// `subagent_batches.poll_interval_seconds`.
    pub poll_interval: Duration,
    /// `subagent_batches.max_result_chars`.
    pub max_result_chars: usize,
    /// `subagent_batches.result_preview_max_chars`.
    pub result_preview_max_chars: usize,
    /// Where the worker counts leases and attempts.
    pub metrics: Arc<dyn WorkerMetrics>,
}

impl Options {
    /// A worker on `store` and `runtime` for `hostname`, with the default lease (120 s),
    /// poll interval (1 s) and result caps (100,000 and 2,000 characters).
    pub fn new(store: Arc<dyn BatchStore>, runtime: Runtime, hostname: impl Into<String>) -> Self {
        Options {
            store,
            runtime,
            hostname: hostname.into(),
            lease: Duration::from_secs(120),
            poll_interval: Duration::from_secs(1),
            max_result_chars: 100_000,
            result_preview_max_chars: 2_000,
            metrics: Arc::new(NoMetrics),
        }
    }

    /// A worker with a fresh id, not yet running.
    pub fn build(self) -> Result<Worker, Error> {
        if self.lease < Duration::from_secs(1) {
            return Err(Error::Options(format!(
                "the lease must be at least 1 second, got {:?}",
                self.lease
            )));
        }
        if self.poll_interval.is_zero() {
            return Err(Error::Options("the poll interval must be positive".into()));
        }
        if self.max_result_chars == 0 || self.result_preview_max_chars == 0 {
            return Err(Error::Options("result caps must be positive".into()));
        }
        if self.result_preview_max_chars > self.max_result_chars {
            return Err(Error::Options(format!(
                "the result preview ({}) must not exceed the result cap ({})",
                self.result_preview_max_chars, self.max_result_chars
            )));
        }
        if self.hostname.trim().is_empty() {
            return Err(Error::Options("the hostname must not be empty".into()));
        }
        let worker_id = Uuid::new_v4().simple().to_string();
        let handle = Handle(Arc::new(HandleState {
            worker_id: worker_id.clone(),
            max_running: self.runtime.admission().max_running(),
            running: AtomicBool::new(false),
            executions: Arc::new(AtomicUsize::new(0)),
        }));
        let shared = Arc::new(Shared {
            finisher: Finisher::new(self.store.clone()),
            store: self.store,
            runtime: self.runtime,
            lease: self.lease,
            renew_every: (self.lease / 3).max(Duration::from_secs(1)),
            max_result_chars: self.max_result_chars,
            result_preview_max_chars: self.result_preview_max_chars,
            metrics: self.metrics,
        });
        Ok(Worker {
            shared,
            hostname: self.hostname,
            poll_interval: self.poll_interval,
            started_at: subflow_store::now_rfc3339(),
            stopping: Arc::new(AtomicBool::new(false)),
            local: HashMap::new(),
            handle,
            freed: Arc::new(Notify::new()),
        })
    }
}

/// What every attempt of a worker shares.
#[derive(Debug)]
pub(crate) struct Shared {
    store: Arc<dyn BatchStore>,
    /// Where attempts write their outcomes.
    finisher: Finisher,
    runtime: Runtime,
    lease: Duration,
    renew_every: Duration,
    max_result_chars: usize,
    result_preview_max_chars: usize,
    metrics: Arc<dyn WorkerMetrics>,
}

/// A cheap, cloneable view of a worker for `/api/features` and the metrics.
#[derive(Debug, Clone)]
pub struct Handle(Arc<HandleState>);

#[derive(Debug)]
struct HandleState {
    worker_id: String,
    max_running: usize,
    running: AtomicBool,
    executions: Arc<AtomicUsize>,
}

impl Handle {
    /// Whether [`Worker::run`] is running (`worker_running` of docs/batches.md#capability).
    pub fn is_running(&self) -> bool {
        self.0.running.load(Ordering::SeqCst)
    }

    /// `subagent_runtime.max_running`: the most items this worker runs at once.
    pub fn max_running(&self) -> usize {
        self.0.max_running
    }

    /// The worker's id (32 hex digits), as its `lease_owner`s and heartbeat row carry it.
    pub fn worker_id(&self) -> &str {
        &self.0.worker_id
    }

    /// Local executions now: claimed attempts that have not ended.
    pub fn executions(&self) -> usize {
        self.0.executions.load(Ordering::SeqCst)
    }
}

/// What one [`Worker::claim_and_run_once`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Every slot holds a local execution: no claim pass ran.
    Full,
    /// A claim pass ran.
    Pass {
        /// Items the pass leased to this worker.
        claimed: usize,
        /// Of those, attempts started as local executions.
        started: usize,
        /// Of those, claims handed back at once (the worker is stopping, or a stale
        /// local execution of the item was drained).
        released: usize,
        /// Expired leases the pass recovered.
        recovered: u64,
    },
}

/// One claimed attempt running in this process.
#[derive(Debug)]
struct Local {
    stopper: Stopper,
    task: JoinHandle<()>,
}

/// A batch worker; see the module documentation.
#[derive(Debug)]
pub struct Worker {
    shared: Arc<Shared>,
    hostname: String,
    poll_interval: Duration,
    started_at: String,
    /// Set once the worker stops: claims that land afterwards are handed back.
    stopping: Arc<AtomicBool>,
    /// Local executions by item id.
    local: HashMap<String, Local>,
    handle: Handle,
    /// Told whenever a local execution ends, so a freed slot is refilled at once
    /// instead of at the next poll.
    freed: Arc<Notify>,
}

impl Worker {
    /// The worker's handle.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Free slots: `subagent_runtime.max_running` minus the local executions.
    fn free_slots(&mut self) -> usize {
        self.local.retain(|_, local| !local.task.is_finished());
        // The count drops when an attempt's execution is done, before its outcome is
        // written and its task ends.
        self.handle
            .max_running()
            .saturating_sub(self.handle.executions())
    }

    /// Whether at least half the slots (at least one) hold no execution.
    fn half_free(&self) -> bool {
        let max = self.handle.max_running();
        max.saturating_sub(self.handle.executions()) >= max.div_ceil(2)
    }

    /// One step of the loop: a claim pass if a slot is free, then every claimed item
    /// started as a local execution (or handed back at once when the worker is stopping,
    /// or after draining a stale execution of the same item). Returns without waiting
    /// for the executions; [`Worker::wait_idle`] waits for them.
    pub async fn claim_and_run_once(&mut self) -> Result<Step, Error> {
        let free = self.free_slots();
        if free == 0 {
            return Ok(Step::Full);
        }
        // Slots free in the admission controller now let the pass start that many
        // claims running in its own transaction, sparing each a write; the other claims
        // stay leased and wait for admission.
        let mut permits: Vec<OwnedSemaphorePermit> = if self.stopping.load(Ordering::SeqCst) {
            Vec::new()
        } else {
            self.shared.runtime.admission().reserve_free(free)
        };
        let request = ClaimRequest {
            hostname: self.hostname.clone(),
            worker_id: self.handle.worker_id().to_owned(),
            free_slots: u32::try_from(free).unwrap_or(u32::MAX),
            lease: self.shared.lease,
            admitted: u32::try_from(permits.len()).unwrap_or(u32::MAX),
        };
        let pass = self.shared.store.claim_pass(&request).await?;
        if pass.expired > 0 {
            self.shared.metrics.lease_expirations(pass.expired);
        }
        let (claimed, mut started, mut released) = (pass.claimed.len(), 0, 0);
        for item in pass.claimed {
            let admitted = if item.item.status == BatchItemStatus::Running {
                permits.pop()
            } else {
                None
            };
            if self.stopping.load(Ordering::SeqCst) {
                self.hand_back(item, ReleaseReason::ShutdownBeforeAdmission)
                    .await;
                released += 1;
            } else if let Some(stale) = self.local.remove(&item.item.id) {
                // The item's lease expired while this process still ran it, and it came
                // back here: stop the old execution before the item runs again.
                stale.stopper.stop(StopCause::Drained);
                drain(stale.task, SHUTDOWN_LIMIT).await;
                self.hand_back(item, ReleaseReason::StaleExecutionDrained)
                    .await;
                released += 1;
            } else {
                self.start(item, admitted);
                started += 1;
            }
        }
        Ok(Step::Pass {
            claimed,
            started,
            released,
            recovered: pass.expired,
        })
    }

    fn start(&mut self, claimed: ClaimedItem, admitted: Option<OwnedSemaphorePermit>) {
        let stopper = Stopper::default();
        let attempt = Attempt {
            shared: self.shared.clone(),
            stopper: stopper.clone(),
            claimed_at: Instant::now(),
            claimed,
        };
        let item_id = attempt.claimed.item.id.clone();
        let executions = self.handle.0.executions.clone();
        executions.fetch_add(1, Ordering::SeqCst);
        let freed = self.freed.clone();
        let counted = Counted {
            executions,
            freed,
            ended: false,
        };
        let task = tokio::spawn(attempt.run(admitted, counted));
        self.local.insert(item_id, Local { stopper, task });
    }

    async fn hand_back(&self, claimed: ClaimedItem, reason: ReleaseReason) {
        let end = match self
            .shared
            .store
            .release_claim(&claimed.lease(), &reason)
            .await
        {
            Ok(Some(_)) => AttemptEnd::Released,
            Ok(None) => AttemptEnd::Fenced,
            Err(error) => {
                tracing::warn!(%error, item_id = %claimed.item.id, "handing a batch item back failed; its lease will expire");
                AttemptEnd::WriteFailed
            }
        };
        self.shared
            .metrics
            .attempt_finished(&claimed.batch.subagent_type, end, Duration::ZERO);
    }

    /// Waits until every local execution has ended.
    pub async fn wait_idle(&mut self) {
        for (_, local) in self.local.drain() {
            let _ = local.task.await;
        }
    }

    async fn heartbeat(&self) {
        let beat = WorkerHeartbeat {
            worker_id: self.handle.worker_id().to_owned(),
            hostname: self.hostname.clone(),
            started_at: self.started_at.clone(),
        };
        if let Err(error) = self.shared.store.heartbeat(&beat).await {
            tracing::warn!(%error, "the batch worker heartbeat failed");
        }
    }

    /// Runs until `shutdown` completes: a heartbeat now and every third of a lease, a
    /// claim pass every poll interval while a slot is free, executions renewing their
    /// leases. Then stops within [`SHUTDOWN_LIMIT`]: claims landing meanwhile are handed
    /// back, executions are cancelled and awaited, and nothing is finalised.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        tokio::pin!(shutdown);
        self.handle.0.running.store(true, Ordering::SeqCst);
        tracing::info!(
            worker_id = %self.handle.worker_id(),
            max_running = self.handle.max_running(),
            "batch worker started"
        );
        self.heartbeat().await;
        let mut polls = tokio::time::interval(self.poll_interval);
        polls.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let every = self.shared.renew_every;
        let mut beats = tokio::time::interval_at(Instant::now() + every, every);
        beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let freed = self.freed.clone();
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                _ = beats.tick() => self.heartbeat().await,
                // A claim pass every poll interval, and as soon as executions ending have
                // freed half the slots, so a busy worker neither idles slots until the
                // next poll nor runs a pass for every single item.
                by_poll = async {
                    tokio::select! {
                        _ = polls.tick() => true,
                        () = freed.notified() => false,
                    }
                } => {
                    if !by_poll && !self.half_free() {
                        continue;
                    }
                    let stopping = self.stopping.clone();
                    let stopped = {
                        let step = self.claim_and_run_once();
                        tokio::pin!(step);
                        tokio::select! {
                            biased;
                            stepped = &mut step => (stepped, false),
                            () = &mut shutdown => {
                                // The pass cannot be interrupted mid-transaction; what it
                                // claims is handed back.
                                stopping.store(true, Ordering::SeqCst);
                                (step.await, true)
                            }
                        }
                    };
                    if let (Err(error), _) = &stopped {
                        tracing::warn!(%error, "a batch claim pass failed");
                    }
                    if stopped.1 {
                        break;
                    }
                }
            }
        }
        self.stop().await;
        Ok(())
    }

    /// Cancels and awaits every local execution within the shutdown limit, finalising
    /// nothing, and removes the worker's row.
    async fn stop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + SHUTDOWN_LIMIT - FAREWELL;
        for local in self.local.values() {
            local.stopper.stop(StopCause::Shutdown);
        }
        for (_, local) in self.local.drain() {
            let left = deadline.saturating_duration_since(Instant::now());
            drain(local.task, left).await;
        }
        let farewell = self.shared.store.remove_worker(self.handle.worker_id());
        match tokio::time::timeout(FAREWELL, farewell).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "removing the batch worker's row failed"),
            Err(_) => tracing::warn!("removing the batch worker's row timed out"),
        }
        self.handle.0.running.store(false, Ordering::SeqCst);
        tracing::info!(worker_id = %self.handle.worker_id(), "batch worker stopped");
    }
}

/// Awaits a stopped execution for at most `limit`, then aborts it.
async fn drain(mut task: JoinHandle<()>, limit: Duration) {
    if tokio::time::timeout(limit, &mut task).await.is_err() {
        tracing::warn!("a batch item execution did not stop in time; aborting it");
        task.abort();
    }
}

/// An attempt's place in the execution count. The count drops when the execution ends
/// (before its outcome is written, so a claim pass can share the outcome's
/// transaction), or when the attempt's task ends however it ends; the loop is told both
/// times, since a batch's running cap frees only once the outcome is written.
pub(crate) struct Counted {
    executions: Arc<AtomicUsize>,
    freed: Arc<Notify>,
    ended: bool,
}

impl Counted {
    /// The execution is over: its slot is free.
    pub fn execution_ended(&mut self) {
        if !std::mem::replace(&mut self.ended, true) {
            self.executions.fetch_sub(1, Ordering::SeqCst);
        }
        self.freed.notify_one();
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.execution_ended();
    }
}
