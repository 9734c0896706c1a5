//! Launching a run in this process: its lease taken, its execution spawned, and the
//! pump that turns the execution's output into frames for its [`Persister`], renews
//! the lease while the run goes on, and sees the log stored to its `end` and the lease
//! released before the run counts as done (`ActiveRun::done`, `join`, `wait`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use subflow_contracts::api::StreamMode;
use subflow_contracts::messages::Message;
use subflow_contracts::{NewEvent, RunStatus};
use subflow_runtime::output::{EventBarrier, OutputSink, RunOutput};
use subflow_runtime::run::{RunResult, RunSpec};
use subflow_runtime::spans::{TraceOverrides, TraceRequest};
use subflow_runtime::task_control::TaskControls;
use subflow_store::{RunRecord, RunStatusUpdate, RunUsage, Store};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::Streams;
use super::hub::{FrameEvent, Hub};
use super::persister::{Fence, Persister};
use super::stored;
use crate::trace::RequestTrace;
use crate::{ActiveRun, ActiveRuns, AppState};

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
        lease_owner: Some(state.streams.lease_owner().to_owned()),
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
/// buffers `barrier` flushes) and pumps the output into its persister. The handle
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
    let fence = Fence {
        owner: streams.lease_owner().to_owned(),
        cancel: cancel.clone(),
    };
    let (persister, writer) =
        Persister::start(hub.clone(), store.clone(), barrier, fence, span.clone()).await;
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
    let pump = Pump {
        hub,
        persister,
        store,
        streams,
        active: state.active.clone(),
        modes: Modes::of(modes),
        cancel,
        done: done_tx,
    };
    tokio::spawn(pump.run(run_task, writer, output).instrument(span))
}

/// Turns one run's output into frames and sees its log stored and its lease released.
struct Pump {
    hub: Arc<Hub>,
    persister: Persister,
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
        mut writer: JoinHandle<()>,
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
        let error = (result.status == RunStatus::Error)
            .then(|| result.error.as_deref().unwrap_or_default());
        self.persister.end(error);
        loop {
            tokio::select! {
                _ = &mut writer => break,
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
                match checkpoint.as_deref() {
                    Some(id) => self.persister.push_stored(
                        FrameEvent::Values,
                        &values,
                        stored::checkpoint_reference(id),
                    ),
                    None => self.persister.push(FrameEvent::Values, &values),
                }
            }
            RunOutput::Message { message, node } if self.modes.messages => {
                let metadata = json!({"run_id": self.hub.run_id, "thread_id": self.hub.thread_id, "langgraph_node": node, "tags": []});
                self.persister
                    .push(FrameEvent::Messages, &json!([message, metadata]));
            }
            RunOutput::Update(update) if self.modes.updates => {
                self.persister.push(FrameEvent::Updates, &update);
            }
            RunOutput::Custom { event, .. } if self.modes.custom => {
                self.persister.push(FrameEvent::Custom, &event);
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
            lease_owner: Some(self.streams.lease_owner().to_owned()),
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
