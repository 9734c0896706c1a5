//! Extension observers (docs/events.md#observers): in-process [`TaskObserver`]s and webhooks told when a
//! lead run or a subagent execution starts and stops.
//!
//! Delivery goes through an [`ObserverSet`], an immutable, cheaply cloned snapshot:
//!
//! * observers run one after the other in registration order, then the webhooks
//!   concurrently;
//! * everything is fail-open: a panic or a timeout is logged and counted, never
//!   propagated to the run;
//! * each hook call has one shared budget (3.0 s by default) across all of its
//!   observers and webhooks; whatever is running when it is spent is cut off, and
//!   whatever is reached after it is skipped with a warning;
//! * a [`TaskInfo`] with an empty `run_id` (library embedding, batch items) triggers no
//!   notification at all (docs/events.md#observers).
//!
//! The outcome enum is called [`ObserverOutcome`] rather than the documented `TaskOutcome`,
//! because `subflow_contracts::task_result::TaskOutcome` already names the task tool's
//! result; the variants and strings are those of docs/events.md#observers.

mod webhook;

use std::any::Any;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use subflow_contracts::status::{RunStatus, SubagentStatus};
use tokio::time::{Instant, timeout_at};

use crate::budget::BudgetEvent;

pub use webhook::{
    EVENT_HEADER, SIGNATURE_HEADER, WebhookConfig, WebhookError, WebhookObserver, signature,
};

/// The shared budget of one hook call (docs/events.md#observers).
pub const DEFAULT_HOOK_BUDGET: Duration = Duration::from_millis(3000);

/// The `agent_name` of a lead run's [`TaskInfo`].
pub const LEAD_AGENT_NAME: &str = "lead_agent";

/// Whether a task is a lead run or a delegated subagent execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskKind {
    /// The lead agent's run.
    Lead,
    /// A subagent execution started by the `task` tool.
    Subagent,
}

impl TaskKind {
    /// `"lead"` or `"subagent"`, as in webhook bodies.
    pub const fn as_str(self) -> &'static str {
        match self {
            TaskKind::Lead => "lead",
            TaskKind::Subagent => "subagent",
        }
    }
}

/// How a task ended (the documented `TaskOutcome`, renamed to avoid the contracts clash).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObserverOutcome {
    /// The task finished successfully.
    Completed,
    /// The task was cancelled or interrupted.
    Aborted,
    /// Anything else: errors, timeouts, build failures, panics.
    Failed,
}

impl ObserverOutcome {
    /// `"completed"`, `"aborted"` or `"failed"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ObserverOutcome::Completed => "completed",
            ObserverOutcome::Aborted => "aborted",
            ObserverOutcome::Failed => "failed",
        }
    }

    /// A lead run's outcome: `aborted` when interrupted, `completed` on success,
    /// `failed` otherwise (docs/events.md#observers).
    pub const fn for_lead(status: RunStatus) -> Self {
        match status {
            RunStatus::Interrupted => ObserverOutcome::Aborted,
            RunStatus::Success => ObserverOutcome::Completed,
            _ => ObserverOutcome::Failed,
        }
    }

    /// A subagent's outcome: `aborted` for cancelled, `completed` for completed,
    /// `failed` for everything else (docs/events.md#observers).
    pub const fn for_subagent(status: SubagentStatus) -> Self {
        match status {
            SubagentStatus::Cancelled => ObserverOutcome::Aborted,
            SubagentStatus::Completed => ObserverOutcome::Completed,
            _ => ObserverOutcome::Failed,
        }
    }
}

impl fmt::Display for ObserverOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What observers are told about a task (docs/events.md#observers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskInfo {
    /// The run id for a lead run; the execution id (never the tool_call_id) for a subagent.
    pub task_id: String,
    /// The run's id (the parent run's for a subagent); empty means "no notifications".
    pub run_id: String,
    /// The run's thread id (the parent run's for a subagent).
    pub thread_id: String,
    /// Lead or subagent.
    pub kind: TaskKind,
    /// None for a lead run; the parent run id for a subagent.
    pub parent_task_id: Option<String>,
    /// `lead_agent` for a lead run; the definition name for a subagent.
    pub agent_name: Option<String>,
    /// Whether the run resumed an earlier one.
    pub resumed: bool,
}

impl TaskInfo {
    /// The info of a lead run, filled in per the table of docs/events.md#observers.
    pub fn lead(run_id: impl Into<String>, thread_id: impl Into<String>, resumed: bool) -> Self {
        let run_id = run_id.into();
        TaskInfo {
            task_id: run_id.clone(),
            run_id,
            thread_id: thread_id.into(),
            kind: TaskKind::Lead,
            parent_task_id: None,
            agent_name: Some(LEAD_AGENT_NAME.to_owned()),
            resumed,
        }
    }

    /// The info of a subagent execution, filled in per the table of docs/events.md#observers.
    pub fn subagent(
        execution_id: impl Into<String>,
        run_id: impl Into<String>,
        thread_id: impl Into<String>,
        agent_name: impl Into<String>,
        resumed: bool,
    ) -> Self {
        let run_id = run_id.into();
        TaskInfo {
            task_id: execution_id.into(),
            parent_task_id: Some(run_id.clone()),
            run_id,
            thread_id: thread_id.into(),
            kind: TaskKind::Subagent,
            agent_name: Some(agent_name.into()),
            resumed,
        }
    }

    /// Whether notifications apply: executions without a run id get none (docs/events.md#observers).
    pub fn is_observable(&self) -> bool {
        !self.run_id.is_empty()
    }
}

/// An in-process extension told when tasks start and stop; both hooks default to no-ops.
#[async_trait]
pub trait TaskObserver: Send + Sync {
    /// Called before the task (for a subagent: before it is built) starts.
    async fn on_task_start(&self, _info: &TaskInfo) {}
    /// Called once on every exit path of a task that got a start.
    async fn on_task_stop(&self, _info: &TaskInfo, _outcome: ObserverOutcome) {}
    /// Called once per scope and fraction when spend crosses a money budget's warn
    /// fraction, and once when it reaches the limit (docs/usage-and-cost.md#budgets).
    async fn on_budget(&self, _notice: &BudgetNotice) {}
}

/// A money budget crossing, as observers and webhooks are told of it.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetNotice {
    /// The run whose call crossed it; empty for a batch item.
    pub run_id: String,
    /// The thread.
    pub thread_id: String,
    /// Whose spend it is.
    pub user_id: String,
    /// The batch, for a batch's budget.
    pub batch_id: Option<String>,
    /// The pricing currency.
    pub currency: String,
    /// The crossing itself.
    pub event: BudgetEvent,
}

/// One hook call: what it is about.
#[derive(Debug, Clone, Copy)]
enum Call<'a> {
    Start(&'a TaskInfo),
    Stop(&'a TaskInfo, ObserverOutcome),
    Budget(&'a BudgetNotice),
}

impl Call<'_> {
    fn hook(self) -> Hook {
        match self {
            Call::Start(_) => Hook::Start,
            Call::Stop(..) => Hook::Stop,
            Call::Budget(_) => Hook::Budget,
        }
    }

    /// How log lines name it.
    fn subject(self) -> String {
        match self {
            Call::Start(info) | Call::Stop(info, _) => {
                format!("task {} (run {})", info.task_id, info.run_id)
            }
            Call::Budget(notice) => match &notice.batch_id {
                Some(batch) => format!("budget {} of batch {batch}", notice.event.scope.as_str()),
                None => format!(
                    "budget {} (run {})",
                    notice.event.scope.as_str(),
                    notice.run_id
                ),
            },
        }
    }

    fn observable(self) -> bool {
        match self {
            Call::Start(info) | Call::Stop(info, _) => info.is_observable(),
            Call::Budget(_) => true,
        }
    }
}

/// Which hook a call was for; [`Hook::as_str`] is the metric's `hook` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    /// `on_task_start`.
    Start,
    /// `on_task_stop`.
    Stop,
    /// `on_budget`.
    Budget,
}

impl Hook {
    /// Every hook, in metric order.
    pub const ALL: [Hook; 3] = [Hook::Start, Hook::Stop, Hook::Budget];

    /// `"on_task_start"`, `"on_task_stop"` or `"on_budget"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Hook::Start => "on_task_start",
            Hook::Stop => "on_task_stop",
            Hook::Budget => "on_budget",
        }
    }

    /// The webhook `event` and `X-Subflow-Event` value.
    pub const fn event(self) -> &'static str {
        match self {
            Hook::Start => "task.start",
            Hook::Stop => "task.stop",
            Hook::Budget => "budget",
        }
    }
}

/// What became of one observer or webhook call; [`CallResult::as_str`] is the metric's
/// `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallResult {
    /// Returned in time (a webhook: answered with a 2xx).
    Ok,
    /// Panicked, timed out, or (a webhook) failed to deliver.
    Error,
    /// Not called because the budget was already spent.
    Skipped,
}

impl CallResult {
    /// All results, in metric order.
    pub const ALL: [CallResult; 3] = [CallResult::Ok, CallResult::Error, CallResult::Skipped];

    /// `"ok"`, `"error"` or `"skipped"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            CallResult::Ok => "ok",
            CallResult::Error => "error",
            CallResult::Skipped => "skipped",
        }
    }
}

/// Call counts by hook and result, the source of `subflow_observer_calls_total`.
#[derive(Debug, Default)]
pub struct ObserverCounters {
    // Indexed [hook][result] in the order of `Hook::ALL` and `CallResult::ALL`.
    counts: [[AtomicU64; 3]; 3],
}

impl ObserverCounters {
    /// Fresh zeroed counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// The count of calls of `hook` that ended as `result`.
    pub fn get(&self, hook: Hook, result: CallResult) -> u64 {
        self.counts[hook as usize][result as usize].load(Ordering::Relaxed)
    }

    /// Every (hook, result, count) triple, zeros included, for a metric exporter.
    pub fn snapshot(&self) -> Vec<(Hook, CallResult, u64)> {
        Hook::ALL
            .iter()
            .flat_map(|&hook| {
                CallResult::ALL
                    .iter()
                    .map(move |&result| (hook, result, self.get(hook, result)))
            })
            .collect()
    }

    fn add(&self, hook: Hook, result: CallResult) {
        self.counts[hook as usize][result as usize].fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Clone)]
struct Registered {
    name: String,
    observer: Arc<dyn TaskObserver>,
}

#[derive(Clone)]
struct Inner {
    observers: Vec<Registered>,
    webhooks: Vec<Arc<WebhookObserver>>,
    budget: Duration,
    counters: Arc<ObserverCounters>,
}

/// An immutable snapshot of the registered observers and webhooks; clone it at run start.
///
/// The `with_*` builders copy on write, so a clone already handed to a run never sees
/// later registrations (docs/events.md#observers "Snapshot"). Counters are shared by all clones.
#[derive(Clone)]
pub struct ObserverSet {
    inner: Arc<Inner>,
}

impl Default for ObserverSet {
    fn default() -> Self {
        ObserverSet {
            inner: Arc::new(Inner {
                observers: Vec::new(),
                webhooks: Vec::new(),
                budget: DEFAULT_HOOK_BUDGET,
                counters: Arc::new(ObserverCounters::new()),
            }),
        }
    }
}

impl fmt::Debug for ObserverSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObserverSet")
            .field(
                "observers",
                &self
                    .inner
                    .observers
                    .iter()
                    .map(|entry| entry.name.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("webhooks", &self.inner.webhooks)
            .field("budget", &self.inner.budget)
            .finish()
    }
}

impl ObserverSet {
    /// An empty set with the default 3 s budget.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an observer after the registered ones; it is logged as `observer#<index>`.
    pub fn with_observer(self, observer: Arc<dyn TaskObserver>) -> Self {
        let name = format!("observer#{}", self.inner.observers.len());
        self.with_named_observer(name, observer)
    }

    /// Adds an observer after the registered ones, logged under `name`.
    pub fn with_named_observer(
        mut self,
        name: impl Into<String>,
        observer: Arc<dyn TaskObserver>,
    ) -> Self {
        Arc::make_mut(&mut self.inner).observers.push(Registered {
            name: name.into(),
            observer,
        });
        self
    }

    /// Adds a webhook; webhooks run after all in-process observers.
    pub fn with_webhook(mut self, webhook: WebhookObserver) -> Self {
        Arc::make_mut(&mut self.inner)
            .webhooks
            .push(Arc::new(webhook));
        self
    }

    /// Builds and adds one webhook per configuration, in order.
    pub fn with_webhooks(
        mut self,
        configs: impl IntoIterator<Item = WebhookConfig>,
    ) -> Result<Self, WebhookError> {
        for config in configs {
            self = self.with_webhook(WebhookObserver::new(config)?);
        }
        Ok(self)
    }

    /// Replaces the per-hook-call budget (3 s by default; shorter in tests).
    pub fn with_budget(mut self, budget: Duration) -> Self {
        Arc::make_mut(&mut self.inner).budget = budget;
        self
    }

    /// Counts into `counters`, e.g. ones a metrics registry also holds.
    pub fn with_counters(mut self, counters: Arc<ObserverCounters>) -> Self {
        Arc::make_mut(&mut self.inner).counters = counters;
        self
    }

    /// Whether no observer and no webhook is registered.
    pub fn is_empty(&self) -> bool {
        self.inner.observers.is_empty() && self.inner.webhooks.is_empty()
    }

    /// The per-hook-call budget.
    pub fn budget(&self) -> Duration {
        self.inner.budget
    }

    /// The shared call counters.
    pub fn counters(&self) -> &Arc<ObserverCounters> {
        &self.inner.counters
    }

    /// Tells every observer, then every webhook, that `info` started; a no-op when
    /// `info.run_id` is empty. Returns within the budget; never fails.
    pub async fn notify_start(&self, info: &TaskInfo) {
        self.notify(Call::Start(info)).await;
    }

    /// Tells every observer, then every webhook, that `info` stopped with `outcome`; a
    /// no-op when `info.run_id` is empty. Returns within the budget; never fails.
    pub async fn notify_stop(&self, info: &TaskInfo, outcome: ObserverOutcome) {
        self.notify(Call::Stop(info, outcome)).await;
    }

    /// Tells every observer, then every webhook, of a budget crossing. Returns within
    /// the budget; never fails.
    pub async fn notify_budget(&self, notice: &BudgetNotice) {
        self.notify(Call::Budget(notice)).await;
    }

    /// Notifies the start of `info` and returns a guard that owes its stop: call
    /// [`ObservedTask::stop`]; if the guard is dropped first (a panic unwinding, an
    /// aborted or dropped future), a `failed` stop is sent from a spawned task.
    pub async fn start(&self, info: TaskInfo) -> ObservedTask {
        self.notify_start(&info).await;
        ObservedTask {
            set: self.clone(),
            info,
            stopped: false,
            drop_outcome: ObserverOutcome::Failed,
        }
    }

    /// One hook call.
    async fn notify(&self, call: Call<'_>) {
        if !call.observable() || self.is_empty() {
            return;
        }
        let hook = call.hook();
        let subject = call.subject();
        let inner = &*self.inner;
        // tokio's clock, so paused-time tests drive the budget deterministically.
        let deadline = Instant::now() + inner.budget;

        for entry in &inner.observers {
            if Instant::now() >= deadline {
                tracing::warn!(
                    "observer {} skipped for {} of {subject}: the {:?} budget is spent",
                    entry.name,
                    hook.as_str(),
                    inner.budget,
                );
                inner.counters.add(hook, CallResult::Skipped);
                continue;
            }
            let hooked = match call {
                Call::Start(info) => entry.observer.on_task_start(info),
                Call::Stop(info, outcome) => entry.observer.on_task_stop(info, outcome),
                Call::Budget(notice) => entry.observer.on_budget(notice),
            };
            let result = timeout_at(deadline, AssertUnwindSafe(hooked).catch_unwind()).await;
            let counted = match result {
                Ok(Ok(())) => CallResult::Ok,
                Ok(Err(panic)) => {
                    tracing::error!(
                        "observer {} panicked in {} of {subject}: {}",
                        entry.name,
                        hook.as_str(),
                        panic_message(&*panic),
                    );
                    CallResult::Error
                }
                Err(_elapsed) => {
                    tracing::warn!(
                        "observer {} cut off in {} of {subject}: the {:?} budget ran out",
                        entry.name,
                        hook.as_str(),
                        inner.budget,
                    );
                    CallResult::Error
                }
            };
            inner.counters.add(hook, counted);
        }

        if inner.webhooks.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            for webhook in &inner.webhooks {
                tracing::warn!(
                    "webhook {} skipped for {} of {subject}: the {:?} budget is spent",
                    webhook.url(),
                    hook.event(),
                    inner.budget,
                );
                inner.counters.add(hook, CallResult::Skipped);
            }
            return;
        }
        // Webhooks are independent network calls, so they share the remaining budget
        // concurrently instead of queueing behind each other.
        let subject = &subject;
        let deliveries = inner.webhooks.iter().map(|webhook| async move {
            let delivery = AssertUnwindSafe(webhook.deliver_call(call)).catch_unwind();
            let counted = match timeout_at(deadline, delivery).await {
                Ok(Ok(Ok(()))) => CallResult::Ok,
                Ok(Ok(Err(error))) => {
                    tracing::warn!(
                        "webhook {} failed for {} of {subject}: {error}",
                        webhook.url(),
                        hook.event(),
                    );
                    CallResult::Error
                }
                Ok(Err(panic)) => {
                    tracing::error!(
                        "webhook {} panicked for {} of {subject}: {}",
                        webhook.url(),
                        hook.event(),
                        panic_message(&*panic),
                    );
                    CallResult::Error
                }
                Err(_elapsed) => {
                    tracing::warn!(
                        "webhook {} cut off for {} of {subject}: the {:?} budget ran out",
                        webhook.url(),
                        hook.event(),
                        inner.budget,
                    );
                    CallResult::Error
                }
            };
            inner.counters.add(hook, counted);
        });
        futures::future::join_all(deliveries).await;
    }
}

/// A started task whose stop is still owed; see [`ObserverSet::start`].
#[derive(Debug)]
pub struct ObservedTask {
    set: ObserverSet,
    info: TaskInfo,
    stopped: bool,
    drop_outcome: ObserverOutcome,
}

impl ObservedTask {
    /// The task's info.
    pub fn info(&self) -> &TaskInfo {
        &self.info
    }

    /// Sets the outcome sent if the guard is dropped without [`stop`](Self::stop)
    /// (`failed` by default), e.g. `aborted` once a cancel is recorded and the task may
    /// be aborted rather than return.
    pub fn set_drop_outcome(&mut self, outcome: ObserverOutcome) {
        self.drop_outcome = outcome;
    }

    /// Notifies the stop with `outcome`.
    pub async fn stop(mut self, outcome: ObserverOutcome) {
        // Marked first: if this future is dropped mid-delivery, Drop must not send a
        // second, contradicting stop.
        self.stopped = true;
        self.set.notify_stop(&self.info, outcome).await;
    }
}

impl Drop for ObservedTask {
    fn drop(&mut self) {
        if self.stopped || !self.info.is_observable() || self.set.is_empty() {
            return;
        }
        // Reached when the task panicked or its future was dropped: the stop is still
        // owed (docs/events.md#observers "every exit path"), and Drop cannot await.
        let set = self.set.clone();
        let info = self.info.clone();
        let outcome = self.drop_outcome;
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move { set.notify_stop(&info, outcome).await });
            }
            Err(_) => tracing::warn!(
                "no runtime to send the failed stop of task {} (run {})",
                info.task_id,
                info.run_id,
            ),
        }
    }
}

/// Holds registrations that may change while the process runs; each run takes a
/// [`snapshot`](ObserverRegistry::snapshot) at its start.
#[derive(Debug, Default)]
pub struct ObserverRegistry {
    current: RwLock<ObserverSet>,
}

impl ObserverRegistry {
    /// A registry starting from `set`.
    pub fn new(set: ObserverSet) -> Self {
        ObserverRegistry {
            current: RwLock::new(set),
        }
    }

    /// Adds an observer; runs already started keep their snapshot.
    pub fn register(&self, name: impl Into<String>, observer: Arc<dyn TaskObserver>) {
        // A poisoned lock only means a panic elsewhere mid-swap; the set itself is
        // always whole, so keep using it.
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        let set = std::mem::take(&mut *current);
        *current = set.with_named_observer(name, observer);
    }

    /// The set as it is now.
    pub fn snapshot(&self) -> ObserverSet {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    if let Some(text) = panic.downcast_ref::<&str>() {
        text
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text
    } else {
        "non-string panic payload"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_the_spec_values() {
        assert_eq!(TaskKind::Lead.as_str(), "lead");
        assert_eq!(TaskKind::Subagent.as_str(), "subagent");
        assert_eq!(ObserverOutcome::Completed.as_str(), "completed");
        assert_eq!(ObserverOutcome::Aborted.as_str(), "aborted");
        assert_eq!(ObserverOutcome::Failed.as_str(), "failed");
        assert_eq!(Hook::Start.event(), "task.start");
        assert_eq!(Hook::Stop.event(), "task.stop");
    }

    #[test]
    fn outcomes_follow_the_table() {
        use ObserverOutcome::*;
        assert_eq!(ObserverOutcome::for_lead(RunStatus::Success), Completed);
        assert_eq!(ObserverOutcome::for_lead(RunStatus::Interrupted), Aborted);
        assert_eq!(ObserverOutcome::for_lead(RunStatus::Error), Failed);
        assert_eq!(ObserverOutcome::for_lead(RunStatus::Timeout), Failed);
        assert_eq!(
            ObserverOutcome::for_subagent(SubagentStatus::Completed),
            Completed
        );
        assert_eq!(
            ObserverOutcome::for_subagent(SubagentStatus::Cancelled),
            Aborted
        );
        for status in [
            SubagentStatus::Failed,
            SubagentStatus::TimedOut,
            SubagentStatus::PollingTimedOut,
        ] {
            assert_eq!(ObserverOutcome::for_subagent(status), Failed);
        }
    }

    #[test]
    fn task_info_constructors_follow_the_table() {
        let lead = TaskInfo::lead("run-1", "thread-1", true);
        assert_eq!(lead.task_id, "run-1");
        assert_eq!(lead.kind, TaskKind::Lead);
        assert_eq!(lead.parent_task_id, None);
        assert_eq!(lead.agent_name.as_deref(), Some("lead_agent"));
        assert!(lead.resumed);

        let sub = TaskInfo::subagent("exec-1", "run-1", "thread-1", "researcher", false);
        assert_eq!(sub.task_id, "exec-1");
        assert_eq!(sub.run_id, "run-1");
        assert_eq!(sub.parent_task_id.as_deref(), Some("run-1"));
        assert_eq!(sub.agent_name.as_deref(), Some("researcher"));
        assert!(!TaskInfo::subagent("e", "", "t", "a", false).is_observable());
    }

    #[test]
    fn counters_snapshot_lists_every_label_pair() {
        let counters = ObserverCounters::new();
        counters.add(Hook::Stop, CallResult::Skipped);
        let snapshot = counters.snapshot();
        assert_eq!(snapshot.len(), 9);
        assert!(snapshot.contains(&(Hook::Budget, CallResult::Error, 0)));
        assert!(snapshot.contains(&(Hook::Stop, CallResult::Skipped, 1)));
        assert!(snapshot.contains(&(Hook::Start, CallResult::Ok, 0)));
    }
}
