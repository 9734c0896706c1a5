//! Run streams (docs/api.md): every run's frames are numbered once, in a
//! process-local [`hub`], sent to this process's watchers at once, and written behind
//! to the store's durable log; watchers anywhere follow a run from a cursor
//! ([`follow`]); the executing process holds the run's lease; [`upkeep`] prunes old
//! logs, recovers orphaned runs and relays remote cancel requests.
//!
//! Persistence order: a frame is numbered and visible in the hub before it is stored;
//! the store receives frames in id order, contiguous, each batch after the previous one
//! succeeded; a frame leaves the hub only once it is stored; the final `end` goes in the
//! batch that ends the log. A run counts as done (`ActiveRun::done`, `join`, `wait`)
//! only once its whole log is stored and its lease released.

pub(crate) mod follow;
pub(crate) mod hub;
pub(crate) mod stored;
pub(crate) mod upkeep;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use subflow_runtime::task_control::TaskControls;

use serde_json::{Value, json};
use subflow_contracts::api::StreamMode;
use subflow_contracts::messages::Message;
use subflow_contracts::{NewEvent, RunStatus};
use subflow_runtime::output::{EventBarrier, OutputSink, RunOutput};
use subflow_runtime::run::{RunResult, RunSpec};
use subflow_runtime::spans::{TraceOverrides, TraceRequest};
use subflow_store::{
    FrameBatch, RunRecord, RunStatusUpdate, RunUsage, Store, StreamFrame, StreamNotice,
};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::trace::RequestTrace;
use crate::{ActiveRun, ActiveRuns, ApiError, AppState};
use hub::Hub;

/// Frames per store write; more pending frames go in the next write.
const PERSIST_BATCH: usize = 256;

/// The first and the longest wait before a failed write is retried.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// How often a watcher re-reads a remote run when no notice woke it.
pub(crate) const POLL: Duration = Duration::from_secs(1);

/// Notices buffered for this process's watchers.
const NOTICE_CAPACITY: usize = 4096;

/// `streams.retention_seconds` and `runs.lease_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamConfig {
    /// How long a log is kept after its run ended.
    pub retention: Duration,
    /// How long a run lease lasts without renewal; renewed every third of it.
    pub lease: Duration,
}

impl Default for StreamConfig {
    /// docs/configuration.md#sources: a one-hour retention and a 30 s lease.
    fn default() -> Self {
        StreamConfig {
            retention: Duration::from_secs(3600),
            lease: Duration::from_secs(30),
        }
    }
}

/// The run streams of this gateway: its hubs, its lease owner id and the store notices
/// relayed to its watchers. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Streams {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    config: StreamConfig,
    owner: String,
    hubs: Mutex<HashMap<String, Arc<Hub>>>,
    notices: broadcast::Sender<StreamNotice>,
}

impl Default for Streams {
    fn default() -> Self {
        Streams::new(StreamConfig::default())
    }
}

impl Streams {
    /// Streams with `config` and a fresh lease owner id.
    pub fn new(config: StreamConfig) -> Self {
        Streams {
            shared: Arc::new(Shared {
                config,
                owner: format!("{}:{}", std::process::id(), uuid::Uuid::new_v4().simple()),
                hubs: Mutex::new(HashMap::new()),
                notices: broadcast::channel(NOTICE_CAPACITY).0,
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> StreamConfig {
        self.shared.config
    }

    /// The owner id this gateway's run leases carry.
    pub fn lease_owner(&self) -> &str {
        &self.shared.owner
    }

    fn hubs(&self) -> MutexGuard<'_, HashMap<String, Arc<Hub>>> {
        self.shared.hubs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The hub of a run executing here.
    pub(crate) fn hub(&self, run_id: &str) -> Option<Arc<Hub>> {
        self.hubs().get(run_id).cloned()
    }

    /// A receiver of the store notices this gateway relays.
    pub(crate) fn notices(&self) -> broadcast::Receiver<StreamNotice> {
        self.shared.notices.subscribe()
    }

    /// Relays a store notice to this gateway's watchers.
    pub(crate) fn announce(&self, notice: StreamNotice) {
        let _ = self.shared.notices.send(notice);
    }
}

/// Stream mode names, as a run request or a rejoin query lists them; unknown ones are
/// 422, all named at once.
pub(crate) fn parse_stream_modes<'a>(
    names: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<StreamMode>, ApiError> {
    let (mut modes, mut unknown) = (Vec::new(), Vec::new());
    for name in names {
        match name.parse::<StreamMode>() {
            Ok(mode) => modes.push(mode),
            Err(_) => unknown.push(name),
        }
    }
    if unknown.is_empty() {
        Ok(modes)
    } else {
        Err(ApiError::Unprocessable(format!(
            "Unsupported stream mode(s): {}",
            unknown.join(", ")
        )))
    }
}

/// Which frames a run's output becomes (the request's `stream_mode`).
#[derive(Debug, Clone, Copy)]
struct Modes {
    values: bool,
    messages: bool,
    updates: bool,
    custom: bool,
}

impl Modes {
    fn of(modes: &[StreamMode]) -> Self {
        let wants = |mode: StreamMode| modes.contains(&mode);
        Modes {
            values: wants(StreamMode::Values),
            messages: wants(StreamMode::MessagesTuple),
            updates: wants(StreamMode::Updates),
            custom: wants(StreamMode::Custom),
        }
    }
}

/// What a run whose `pending` record exists is started with.
#[derive(Debug)]
pub(crate) struct RunLaunch {
    /// The input messages.
    pub input: Vec<Message>,
    /// The requested model, or the default.
    pub model_name: Option<String>,
    /// A delegating run's trace id (`config.metadata.trace_id`).
    pub delegation_trace: Option<String>,
    /// The request's trace: the run's trace id and exported parent.
    pub trace: RequestTrace,
    /// Langfuse attributes from `config.metadata`.
    pub trace_overrides: TraceOverrides,
    /// The frames the run's output becomes.
    pub modes: Vec<StreamMode>,
}

/// Starts `run` on the runtime with its stream (docs/api.md#sse-frames, docs/api.md#resume-and-rejoin): the execution, which
/// prices its usage into the metrics whatever its status (as `/token-usage` prices it,
/// docs/usage-and-cost.md#cost), and [`launch`]. Returns the outcome, resolving once the run's log is
/// stored, and the token that cancels the run.
pub(crate) async fn start_run(
    state: &AppState,
    run: &RunRecord,
    launch_with: RunLaunch,
) -> (JoinHandle<RunResult>, CancellationToken) {
    let RunLaunch {
        input,
        model_name,
        delegation_trace,
        trace,
        trace_overrides,
        modes,
    } = launch_with;
    let cancel = CancellationToken::new();
    let tasks = TaskControls::default();
    let span = tracing::info_span!("run", trace_id = %trace.id, run_id = %run.run_id);
    let spec = RunSpec {
        thread_id: run.thread_id.clone(),
        run_id: run.run_id.clone(),
        user_id: Some(run.owner.clone()),
        model_name,
        input,
        trace_id: trace.id,
        delegation_trace,
        cancel: cancel.clone(),
        tasks: tasks.clone(),
        timeout: state.run_timeout,
        trace: TraceRequest {
            parent: trace.parent,
            overrides: trace_overrides,
        },
    };
    let (sink, output) = OutputSink::channel();
    let barrier = sink.barrier().clone();
    let runtime = state.runtime.clone();
    let (metrics, prices, run_model) = (
        state.metrics.clone(),
        state.model_facts.clone(),
        run.model_name.clone(),
    );
    let execution = async move {
        let result = runtime.run(spec, sink).await;
        for (model, currency, amount) in
            crate::usage::run_costs(&result.usage, run_model.as_deref(), &prices)
        {
            metrics.add_cost(&model, &currency, amount);
        }
        result
    };
    // The run's frames are numbered and logged whoever watches (docs/api.md#resume-and-rejoin).
    let outcome = launch(
        state,
        &run.run_id,
        &run.thread_id,
        (cancel.clone(), tasks),
        (execution, output, barrier),
        &modes,
        span,
    )
    .await;
    (outcome, cancel)
}

/// Starts a run whose record exists: leases it, spawns its `execution` (the runtime
/// executing it, writing into the sink whose receiver is `output` and whose event
/// buffers `barrier` flushes) and pumps the output into a hub and the store. The handle
/// resolves once the run's log is stored.
async fn launch(
    state: &AppState,
    run_id: &str,
    thread_id: &str,
    (cancel, tasks): (CancellationToken, TaskControls),
    (execution, output, barrier): (
        impl Future<Output = RunResult> + Send + 'static,
        mpsc::UnboundedReceiver<RunOutput>,
        EventBarrier,
    ),
    modes: &[StreamMode],
    span: tracing::Span,
) -> JoinHandle<RunResult> {
    let streams = state.streams.clone();
    let store = state.store.clone();
    let lease = streams.config().lease;
    match store
        .acquire_run_lease(run_id, streams.lease_owner(), lease)
        .await
    {
        Ok(true) => {}
        Ok(false) => tracing::warn!(run_id, "the new run's lease is held by another process"),
        Err(error) => tracing::error!(%error, run_id, "taking the run lease failed"),
    }
    let hub = Hub::new(run_id, thread_id);
    hub.push(
        "metadata",
        &json!({"run_id": run_id, "thread_id": thread_id}),
        false,
    );
    // `metadata` is stored before the run starts, so a run without a log is one that
    // ended before logs existed, never one whose first write is still pending.
    let fence = Fence {
        owner: streams.lease_owner().to_owned(),
        cancel: cancel.clone(),
    };
    store_first_frames(&hub, &*store, &fence).await;
    streams.hubs().insert(run_id.to_owned(), hub.clone());
    let (done_tx, done) = watch::channel(false);
    state.active.insert(
        run_id,
        ActiveRun {
            cancel: cancel.clone(),
            tasks,
            done,
        },
    );
    let run_task = tokio::spawn(execution.instrument(span.clone()));
    let persister =
        tokio::spawn(persist(hub.clone(), store.clone(), barrier, fence).instrument(span.clone()));
    let pump = Pump {
        hub,
        store,
        streams,
        active: state.active.clone(),
        modes: Modes::of(modes),
        cancel,
        done: done_tx,
    };
    tokio::spawn(pump.run(run_task, persister, output).instrument(span))
}

/// Turns one run's output into frames and sees its log stored and its lease released.
struct Pump {
    hub: Arc<Hub>,
    store: Arc<dyn Store>,
    streams: Streams,
    active: ActiveRuns,
    modes: Modes,
    cancel: CancellationToken,
    done: watch::Sender<bool>,
}

impl Pump {
    async fn run(
        self,
        mut run_task: JoinHandle<RunResult>,
        mut persister: JoinHandle<()>,
        mut output: mpsc::UnboundedReceiver<RunOutput>,
    ) -> RunResult {
        let run_id = self.hub.run_id.clone();
        let every = (self.streams.config().lease / 3).max(Duration::from_millis(100));
        let mut renew = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let joined = loop {
            tokio::select! {
                item = output.recv() => match item {
                    Some(item) => self.frame(item),
                    None => break (&mut run_task).await,
                },
                joined = &mut run_task => {
                    // Output sent before the run returned is already queued.
                    while let Ok(item) = output.try_recv() {
                        self.frame(item);
                    }
                    break joined;
                }
                _ = renew.tick() => self.renew().await,
            }
        };
        let result = match joined {
            Ok(result) => result,
            Err(error) => self.failed(&error.to_string()).await,
        };
        if result.status == RunStatus::Error {
            self.hub.push(
                "error",
                &json!({"message": result.error.clone().unwrap_or_default(), "name": "RunError"}),
                false,
            );
        }
        self.hub.push("end", &Value::Null, true);
        loop {
            tokio::select! {
                _ = &mut persister => break,
                _ = renew.tick() => self.renew().await,
            }
        }
        let owner = self.streams.lease_owner();
        if let Err(error) = self.store.release_run_lease(&run_id, owner).await {
            tracing::warn!(%error, "releasing the run lease failed; it will expire");
        }
        {
            let mut hubs = self.streams.hubs();
            if hubs
                .get(&run_id)
                .is_some_and(|hub| Arc::ptr_eq(hub, &self.hub))
            {
                hubs.remove(&run_id);
            }
        }
        self.active.remove(&run_id);
        let _ = self.done.send(true);
        result
    }

    fn frame(&self, item: RunOutput) {
        match item {
            RunOutput::Values { values, checkpoint } if self.modes.values => {
                let stored = checkpoint.as_deref().map(stored::checkpoint_reference);
                self.hub.push_stored("values", &values, stored, false);
            }
            RunOutput::Message { message, node } if self.modes.messages => {
                let metadata = json!({"run_id": self.hub.run_id, "thread_id": self.hub.thread_id, "langgraph_node": node, "tags": []});
                self.hub
                    .push("messages", &json!([message, metadata]), false);
            }
            RunOutput::Update(update) if self.modes.updates => {
                self.hub.push("updates", &update, false);
            }
            RunOutput::Custom { payload, .. } if self.modes.custom => {
                self.hub.push("custom", &payload, false);
            }
            _ => {}
        }
    }

    /// Renews the lease; a lease taken over means another process recovered the run,
    /// so this execution stops.
    async fn renew(&self) {
        let (run_id, owner, lease) = (
            &self.hub.run_id,
            self.streams.lease_owner(),
            self.streams.config().lease,
        );
        match self.store.renew_run_lease(run_id, owner, lease).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(run_id, "the run lease was lost; cancelling the run");
                self.cancel.cancel();
            }
            Err(error) => tracing::warn!(%error, run_id, "renewing the run lease failed"),
        }
    }

    /// The result of a run whose task panicked; its record is marked `error`.
    async fn failed(&self, reason: &str) -> RunResult {
        tracing::error!(reason, "the run task failed");
        let error = "The run ended unexpectedly".to_owned();
        let update = RunStatusUpdate {
            status: RunStatus::Error,
            stop_reason: None,
            error: Some(error.clone()),
        };
        let (run_id, thread_id) = (&self.hub.run_id, &self.hub.thread_id);
        match self.store.update_run_status(run_id, &update).await {
            Ok(true) => {
                // The run never wrote its `run.end`: this write ended it (docs/events.md#catalogue).
                let owner = match self.store.get_run(thread_id, run_id).await {
                    Ok(run) => run.map(|r| r.owner),
                    Err(_) => None,
                };
                let end = NewEvent::run_end(thread_id, run_id, RunStatus::Error, json!({}), false)
                    .with_user(owner);
                if let Err(store_error) = self.store.append(&[end]).await {
                    tracing::error!(%store_error, "recording the failed run's run.end failed");
                }
            }
            Ok(false) => {}
            Err(store_error) => tracing::error!(%store_error, "marking the failed run failed"),
        }
        RunResult {
            status: RunStatus::Error,
            stop_reason: None,
            error: Some(error),
            messages: Vec::new(),
            title: None,
            usage: RunUsage::default(),
        }
    }
}

/// What fences a run's frame writes: the lease owner they are written under, and the
/// run's cancel, pulled when the store says another process recovered the run.
struct Fence {
    owner: String,
    cancel: CancellationToken,
}

impl Fence {
    /// The store refused a write because the lease is another's: the run stops here,
    /// and its watchers get `lease_lost` once they have read what was stored.
    fn lost(&self, hub: &Hub) {
        tracing::warn!(run_id = %hub.run_id, "another process recovered the run; it stops here");
        hub.lease_lost();
        self.cancel.cancel();
    }
}

/// Stores the frames a hub holds now, once; a failure is left to the write-behind.
async fn store_first_frames(hub: &Hub, store: &dyn Store, fence: &Fence) {
    let (frames, ends) = hub.unpersisted(PERSIST_BATCH);
    let Some(last) = frames.last().map(|f| f.id) else {
        return;
    };
    match store
        .append_frames(&batch_of(hub, &frames, ends, fence))
        .await
    {
        Ok(_) => hub.persisted(last),
        Err(subflow_store::Error::LeaseLost(_)) => fence.lost(hub),
        Err(error) => {
            tracing::warn!(%error, run_id = %hub.run_id, "storing the first frames failed; retrying behind")
        }
    }
}

/// The store batch of `frames` of `hub`, written under the fence's lease.
fn batch_of(hub: &Hub, frames: &[Arc<hub::Frame>], ends: bool, fence: &Fence) -> FrameBatch {
    FrameBatch {
        run_id: hub.run_id.clone(),
        thread_id: hub.thread_id.clone(),
        frames: frames
            .iter()
            .map(|f| {
                let (event, data) = f.stored();
                StreamFrame {
                    id: f.id as i64,
                    event: event.to_owned(),
                    data: data.to_owned(),
                }
            })
            .collect(),
        ends,
        lease_owner: Some(fence.owner.clone()),
    }
}

/// Writes a hub's frames, in order, until the final frame is stored; each write first
/// flushes the run's event buffers, so the records of what a frame shows are stored
/// before it, and a frame is shown to watchers only once it is stored. A failed write is
/// retried with backoff for as long as the process lives: frames stay in the hub
/// meanwhile, so none is lost and none is written twice (the store skips stored ids).
/// Frames that arrive while a write is under way go in the next one. Every write is
/// fenced by the run's lease: once another process recovered the run, nothing more is
/// written or shown here.
async fn persist(hub: Arc<Hub>, store: Arc<dyn Store>, barrier: EventBarrier, fence: Fence) {
    let mut changes = hub.subscribe();
    let mut backoff = RETRY_MIN;
    loop {
        changes.borrow_and_update();
        let (frames, ends) = hub.unpersisted(PERSIST_BATCH);
        let Some(last) = frames.last().map(|f| f.id) else {
            if hub.is_flushed() || changes.changed().await.is_err() {
                return;
            }
            // Let the frames a step pushes at once go in one write.
            tokio::task::yield_now().await;
            continue;
        };
        if !barrier.flush().await {
            tracing::warn!(retry_in = ?backoff, "storing the run's events failed; its frames wait");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RETRY_MAX);
            continue;
        }
        match store
            .append_frames(&batch_of(&hub, &frames, ends, &fence))
            .await
        {
            Ok(_) => {
                hub.persisted(last);
                backoff = RETRY_MIN;
                if ends {
                    return;
                }
            }
            Err(subflow_store::Error::LeaseLost(_)) => {
                fence.lost(&hub);
                return;
            }
            Err(error) if error.is_invalid_input() => {
                // The run was deleted, or a bug made the frames unacceptable: retrying
                // cannot help, and watchers here still have the hub.
                tracing::error!(%error, "the run's stream frames cannot be stored; its log stops here");
                hub.unstorable();
                return;
            }
            Err(error) => {
                tracing::warn!(%error, retry_in = ?backoff, "storing stream frames failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}

/// Waits until a run has ended in the store — no longer active and its log closed — or is
/// gone: woken by the store's notices for it, and re-reading it every [`POLL`] regardless.
/// Its owner stops writing then, so deleting it (rollback) races with nothing.
pub(crate) async fn wait_for_end(state: &AppState, thread_id: &str, run_id: &str) {
    let mut notices = state.streams.notices();
    loop {
        match ended(state, thread_id, run_id).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(error) => tracing::warn!(%error, run_id, "reading the run failed"),
        }
        follow::wait_for_notice(&mut notices, run_id, POLL).await;
    }
}

async fn ended(state: &AppState, thread_id: &str, run_id: &str) -> subflow_store::Result<bool> {
    match state.store.get_run(thread_id, run_id).await? {
        None => Ok(true),
        Some(run) if run.status.is_active() => Ok(false),
        Some(_) => Ok(state
            .store
            .stream_log(run_id)
            .await?
            .is_none_or(|log| log.ended)),
    }
}

/// How long a cancel with `wait=true` (and a multitask interrupt or rollback) waits for
/// the run to end before it answers anyway: the cancel was delivered, and a run whose
/// final writes wait for the store ends once the store takes them.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// Cancels a run wherever it executes: here through its token, elsewhere through a
/// stored request its owner acts on. Then waits for it to end, at most [`STOP_WAIT`].
pub(crate) async fn cancel_and_wait(state: &AppState, thread_id: &str, run_id: &str) {
    match state.active.get(run_id) {
        Some(active) => active.cancel.cancel(),
        None => match state.store.request_cancel(run_id).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(error) => {
                tracing::error!(%error, run_id, "storing the cancel request failed");
                return;
            }
        },
    }
    if !wait_for_end_within(state, thread_id, run_id, STOP_WAIT).await {
        tracing::warn!(
            run_id,
            "the cancelled run has not ended yet; answering anyway"
        );
    }
}

/// Waits for a run to end, here or in another process, for at most `limit`: false when
/// it still has not ended (its final writes wait for the store).
pub(crate) async fn wait_for_end_within(
    state: &AppState,
    thread_id: &str,
    run_id: &str,
    limit: Duration,
) -> bool {
    let ended = async {
        match state.active.get(run_id) {
            Some(active) => active.ended().await,
            None => wait_for_end(state, thread_id, run_id).await,
        }
    };
    tokio::time::timeout(limit, ended).await.is_ok()
}
