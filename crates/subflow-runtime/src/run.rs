//! Running one lead-agent run end to end: status transitions, the journal, the lead
//! loop under the run timeout, usage snapshots, and the final flushes that precede the
//! terminal status (docs/api.md#objects, docs/events.md#buffering-and-durability, docs/usage-and-cost.md#run-buckets).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use serde_json::json;
use subflow_contracts::messages::Message;
use subflow_contracts::{NewEvent, RunStatus, RunStopReason, ThreadStatus};
use subflow_store::buffer::{BufferKind, BufferPolicy, EventScope};
use subflow_store::{RunStatusUpdate, RunUsage};
use tokio_util::sync::CancellationToken;

use crate::task_control::TaskControls;
use uuid::Uuid;

use crate::guarded::Guards;
use crate::journal::Journal;
use crate::lead::{Lead, LeadEnd};
use crate::observers::{ObserverOutcome, TaskInfo};
use crate::output::OutputSink;
use crate::runtime::{RunContext, Runtime, StoreFault};
use crate::spans::{AgentTrace, TraceIdentity, TraceRequest, trace_tags};
use crate::tool_table::ToolTable;
use crate::tools::Workspace;

/// A run to execute; its record already exists (status `pending`).
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Thread id.
    pub thread_id: String,
    /// Run id.
    pub run_id: String,
    /// The run owner.
    pub user_id: Option<String>,
    /// The requested model, else the default.
    pub model_name: Option<String>,
    /// The new input messages.
    pub input: Vec<Message>,
    /// The run's trace id (docs/operations.md#trace-ids).
    pub trace_id: String,
    /// The caller's `config.metadata.trace_id`, used as the delegation id when it is 8 hex.
    pub delegation_trace: Option<String>,
    /// Cancelled to interrupt the run.
    pub cancel: CancellationToken,
    /// Its tasks, each of which can be cancelled alone.
    pub tasks: TaskControls,
    /// `runs.timeout_seconds`.
    pub timeout: Duration,
    /// A `traceparent` to adopt and caller overrides for the exported trace (docs/operations.md#langfuse-and-otlp).
    pub trace: TraceRequest,
    /// The run lease's owner the run is executed under: its checkpoints, usage and
    /// status are written fenced by it (docs/api.md#resume-and-rejoin); `None` when no
    /// lease is held (an embedded runtime).
    pub lease_owner: Option<String>,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    /// success, error, timeout or interrupted.
    pub status: RunStatus,
    /// Why a guard ended it, if one did.
    pub stop_reason: Option<RunStopReason>,
    /// The failure, for `error` runs.
    pub error: Option<String>,
    /// The thread's messages at the end.
    pub messages: Vec<Message>,
    /// The thread's title at the end.
    pub title: Option<String>,
    /// The run's token rollups.
    pub usage: RunUsage,
}

/// The error of a run whose lead loop panicked; the panic itself is only logged.
pub const RUN_PANICKED: &str = "The run ended unexpectedly";

/// The message of a panic payload, when it has one.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// The 8-hex delegation id of log lines (docs/operations.md#trace-ids): `candidate` when it has that form,
/// else a fresh one.
pub(crate) fn short_trace(candidate: Option<&str>) -> String {
    candidate
        .filter(|id| {
            id.len() == 8
                && id
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
        .map_or_else(
            || Uuid::new_v4().simple().to_string()[..8].to_owned(),
            str::to_owned,
        )
}

impl Runtime {
    /// The lead trace of a run (docs/operations.md#langfuse-and-otlp), when spans are exported: caller overrides
    /// win over the session, user, name and tags.
    fn lead_trace(&self, spec: &RunSpec, user_id: &str, model_name: &str) -> Option<AgentTrace> {
        let sink = self.spans.clone()?;
        let overrides = &spec.trace.overrides;
        let identity = TraceIdentity {
            session_id: overrides
                .session_id
                .clone()
                .unwrap_or_else(|| spec.thread_id.clone()),
            user_id: overrides
                .user_id
                .clone()
                .unwrap_or_else(|| user_id.to_owned()),
            trace_name: overrides
                .trace_name
                .clone()
                .unwrap_or_else(|| "lead_agent".to_owned()),
            tags: overrides
                .tags
                .clone()
                .unwrap_or_else(|| trace_tags(self.environment.as_deref(), Some(model_name))),
            metadata: vec![
                ("deerflow_trace_id".to_owned(), spec.trace_id.clone()),
                ("run_id".to_owned(), spec.run_id.clone()),
            ],
            conversation_id: spec.thread_id.clone(),
        };
        Some(AgentTrace::start(
            sink,
            &identity,
            "lead_agent",
            spec.trace.parent,
            None,
        ))
    }

    /// Executes a run to its end, streaming its output to `sink`.
    pub async fn run(&self, spec: RunSpec, sink: OutputSink) -> RunResult {
        let started = Instant::now();
        let scope = EventScope {
            thread_id: spec.thread_id.clone(),
            run_id: spec.run_id.clone(),
            user_id: spec.user_id.clone(),
        };
        let config = self.config();
        let model_name = self
            .models
            .get(spec.model_name.as_deref())
            .info()
            .name
            .clone();
        let user_id = spec
            .user_id
            .clone()
            .unwrap_or_else(|| crate::spans::DEFAULT_USER.to_owned());
        let trace = self.lead_trace(&spec, &user_id, &model_name);
        let journal_buffer = self.buffer(&scope, BufferPolicy::journal(config.flush_interval));
        let subagent_buffer = self.buffer(&scope, BufferPolicy::subagent(config.flush_interval));
        sink.barrier().register(journal_buffer.clone());
        sink.barrier().register(subagent_buffer.clone());
        let (spend, currency) = match &self.budgets {
            Some(budgets) => {
                let spend = budgets
                    .for_run(&user_id, &spec.thread_id, &spec.run_id)
                    .await;
                (
                    crate::budget::SharedSpend::new(budgets.clone(), spend),
                    budgets.currency(),
                )
            }
            None => (None, String::new()),
        };
        let run = Arc::new(RunContext {
            thread_id: spec.thread_id.clone(),
            run_id: spec.run_id.clone(),
            trace_id: spec.trace_id.clone(),
            short_trace: short_trace(spec.delegation_trace.as_deref()),
            journal: Journal::new(
                journal_buffer,
                config.track_token_usage,
                config.max_trace_content,
            )
            .with_metrics(self.metrics.clone()),
            subagent_buffer,
            sink,
            cancel: spec.cancel.clone(),
            tasks: spec.tasks.clone(),
            workspace: Workspace::for_thread(&config.workspace_root, &spec.thread_id),
            model_name,
            observers: self.observers.clone(),
            user_id,
            trace,
            store_fault: StoreFault::default(),
            lease_owner: spec.lease_owner.clone(),
            budget_notices: spend
                .as_ref()
                .map(|_| RunContext::budget_queue(&self.observers)),
            spend,
            currency,
        });
        let observed = run
            .observers
            .start(TaskInfo::lead(&spec.run_id, &spec.thread_id, false))
            .await;
        let running = RunStatusUpdate {
            lease_owner: run.lease_owner.clone(),
            status: RunStatus::Running,
            stop_reason: None,
            error: None,
        };
        // `run.start` is stored before any other event of the run; if that write fails it
        // leads the journal's buffer, ahead of every later journal record. The status
        // writes, `run.start` and the checkpoint read do not depend on one another and go
        // to the store together: at once on PostgreSQL's pool, and in one commit on SQLite
        // when they queue behind a busy writer (an idle one commits each in place).
        let start = run.journal.run_start();
        let (marked, _, start_written, latest) = tokio::join!(
            self.store.update_run_status(&run.run_id, &running),
            self.store
                .set_thread_status(&run.thread_id, ThreadStatus::Busy),
            self.store.append(std::slice::from_ref(&start)),
            self.store.latest_checkpoint(&run.thread_id),
        );
        if let Err(error) = marked {
            // The terminal status, written until the store takes it, still ends the run.
            tracing::error!(%error, run_id = %run.run_id, "marking the run running failed");
        }
        if let Err(error) = start_written {
            tracing::warn!(%error, "writing run.start failed; it goes through the journal buffer");
            if let Err(error) = run.journal.buffer().record_event(start) {
                tracing::error!(%error, "run.start refused");
            }
        }
        let latest = match latest {
            Ok(latest) => latest.map(|checkpoint| checkpoint.values),
            Err(error) => {
                tracing::error!(%error, "loading the thread's checkpoint failed");
                None
            }
        };
        let mut history = latest
            .as_ref()
            .and_then(|values| values.get("messages").cloned())
            .and_then(|m| serde_json::from_value::<Vec<Message>>(m).ok())
            .unwrap_or_default();
        let title = latest
            .as_ref()
            .and_then(|values| values.get("title"))
            .and_then(|title| title.as_str())
            .map(str::to_owned);
        // Messages checkpointed before every message had an id get theirs now.
        history.iter_mut().for_each(|message| {
            message.ensure_id();
        });
        let snapshots = self.spawn_usage_snapshots(run.clone());
        let mut lead = Lead {
            runtime: self,
            run: &run,
            guards: Guards::for_lead(
                self.lead_loops.clone(),
                &config.token_budget,
                self.metrics.clone(),
            )
            .with_money(run.spend.clone()),
            messages: history,
            title,
            stop_reason: None,
            checkpoint_id: None,
            unstored: None,
            tasks_started: 0,
            step: 0,
            tools: ToolTable::for_lead(config),
        };
        let mut first_human = true;
        for mut message in spec.input {
            // Input messages keep a client's id and get one otherwise (docs/api.md#objects).
            message.ensure_id();
            if let Message::Human(human) = &message
                && first_human
            {
                run.journal.human_input(human);
                first_human = false;
            }
            lead.messages.push(message);
        }
        lead.checkpoint().await;

        let mut timed_out = false;
        let end = {
            // A panic anywhere in the loop (a provider, a tool, a task's supervisor) ends
            // the run `error` through the same final flushes as any other ending.
            let lead_run = AssertUnwindSafe(lead.run()).catch_unwind();
            tokio::pin!(lead_run);
            tokio::select! {
                end = &mut lead_run => end,
                () = tokio::time::sleep(spec.timeout) => {
                    timed_out = true;
                    run.cancel.cancel();
                    lead_run.await
                }
            }
        };
        let end = end.unwrap_or_else(|panic| {
            tracing::error!(
                run_id = %run.run_id,
                "the lead loop panicked: {}",
                panic_text(panic.as_ref())
            );
            // Its tasks' executions outlive the dropped loop unless told to stop.
            run.cancel.cancel();
            LeadEnd::Panicked
        });
        let (status, error, error_type) = match end {
            _ if timed_out => (
                RunStatus::Timeout,
                Some(format!(
                    "Run timed out after {} seconds",
                    spec.timeout.as_secs()
                )),
                "TimeoutError",
            ),
            LeadEnd::Cancelled => (RunStatus::Interrupted, None, ""),
            LeadEnd::ModelFailed(detail) => (RunStatus::Error, Some(detail), "ModelError"),
            LeadEnd::Panicked => (
                RunStatus::Error,
                Some(RUN_PANICKED.to_owned()),
                "InternalError",
            ),
            LeadEnd::Finished => (RunStatus::Success, None, ""),
        };
        if let Some(text) = &error {
            run.journal.run_error(text, error_type);
        }
        snapshots.abort();
        let usage = run.journal.usage(lead.messages.len() as i64);
        // Persisted history first, then the terminal status (docs/events.md#buffering-and-durability). What the store
        // refuses now is retried until it takes it: a run ends in the store, never stays
        // active for good, and keeps its messages. The final flushes, a refused checkpoint
        // and the usage go to the store together.
        let (subagent_flushed, journal_flushed, (), _) = tokio::join!(
            run.subagent_buffer.close(),
            run.journal.buffer().close(),
            lead.store_unstored(),
            crate::store_retry::until_stored("the run's usage", &run.run_id, || {
                self.store
                    .save_run_usage(&run.run_id, &usage, run.lease_owner.as_deref())
            }),
        );
        if !(subagent_flushed && journal_flushed) {
            run.store_fault.note("run events", "the final flush failed");
        }
        let (status, stop_reason, error) = match run.store_fault.first() {
            None => (status, lead.stop_reason, error),
            // A cancelled run ends as the cancel asked, once the store takes its status;
            // what the store refused meanwhile is reported here.
            Some(fault) if status == RunStatus::Interrupted => {
                tracing::error!(run_id = %run.run_id, %fault, "the store refused writes of the cancelled run");
                (status, lead.stop_reason, error)
            }
            Some(fault) => {
                let text = format!("The store refused the run's writes ({fault})");
                tracing::error!(run_id = %run.run_id, "{text}");
                if status != RunStatus::Error {
                    // The journal is closed: the record goes through the retry queue.
                    run.journal.run_error(&text, "StoreUnavailable");
                }
                (
                    RunStatus::Error,
                    Some(RunStopReason::StoreUnavailable),
                    error.or(Some(text)),
                )
            }
        };
        let update = RunStatusUpdate {
            lease_owner: run.lease_owner.clone(),
            status,
            stop_reason,
            error: error.clone(),
        };
        let ended = crate::store_retry::until_stored("the run's status", &run.run_id, || {
            self.store.update_run_status(&run.run_id, &update)
        })
        .await
        .unwrap_or(false);
        // Only the write that ended the run mirrors its status, so `run.end` is written at
        // most once, and only once the status is durable (docs/events.md#catalogue); whoever
        // else ended the run (a recovery in another process, a rollback) set the thread's
        // status with it. The two writes go to the store together.
        if ended {
            let output = match status {
                RunStatus::Success => json!({"messages": lead.messages.len()}),
                _ => json!({}),
            };
            let end = NewEvent::run_end(&run.thread_id, &run.run_id, status, output, false)
                .with_user(spec.user_id.clone());
            let thread_status = match status {
                RunStatus::Error | RunStatus::Timeout => ThreadStatus::Error,
                RunStatus::Interrupted => ThreadStatus::Interrupted,
                _ => ThreadStatus::Idle,
            };
            tokio::join!(
                self.write_through(end),
                crate::store_retry::until_stored("the thread's status", &run.run_id, || {
                    self.store.set_thread_status(&run.thread_id, thread_status)
                }),
            );
        }
        observed.stop(ObserverOutcome::for_lead(status)).await;
        self.metrics.run_finished(status, started.elapsed());
        if let Some(trace) = run.trace.clone() {
            let failure = match status {
                RunStatus::Success => None,
                RunStatus::Interrupted => Some("Interrupted".to_owned()),
                _ => Some(error.clone().unwrap_or_else(|| status.as_str().to_owned())),
            };
            trace.finish(failure);
        }
        RunResult {
            status,
            stop_reason,
            error,
            messages: lead.messages,
            title: lead.title,
            usage,
        }
    }

    /// Writes one event now; a failed write goes to the retry queue (docs/events.md#buffering-and-durability).
    pub(crate) async fn write_through(&self, event: NewEvent) {
        if let Err(error) = self.store.append(std::slice::from_ref(&event)).await {
            tracing::warn!(%error, event_type = %event.event_type, "event write failed; queued for retry");
            self.retry.push(BufferKind::Journal, vec![event]);
        }
    }

    /// Saves the run's usage every `usage_snapshot_interval` while it runs.
    fn spawn_usage_snapshots(&self, run: Arc<RunContext>) -> tokio::task::JoinHandle<()> {
        let store = self.store.clone();
        let every = self.config().usage_snapshot_interval;
        tokio::spawn(async move {
            let mut last = None;
            loop {
                tokio::time::sleep(every).await;
                let usage = run.journal.usage(0);
                if last.as_ref() != Some(&usage) {
                    let owner = run.lease_owner.as_deref();
                    if let Err(error) = store.save_run_usage(&run.run_id, &usage, owner).await {
                        tracing::warn!(%error, "usage snapshot failed");
                    }
                    last = Some(usage);
                }
            }
        })
    }
}
