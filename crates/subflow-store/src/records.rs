//! Thread and run records (docs/api.md#objects, docs/usage-and-cost.md#run-buckets) and the trait that stores them.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use subflow_contracts::api::{SortOrder, ThreadSortBy};
use subflow_contracts::{RunStatus, RunStopReason, ThreadStatus};

pub use subflow_contracts::api::ModelUsage;

use crate::Result;

/// A thread to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewThread {
    /// A valid thread id.
    pub thread_id: String,
    /// The owning user id.
    pub owner: String,
    /// Free-form metadata.
    pub metadata: Map<String, Value>,
}

/// A stored thread.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadRecord {
    /// Thread id.
    pub thread_id: String,
    /// Owning user id.
    pub owner: String,
    /// idle, busy, interrupted or error.
    pub status: ThreadStatus,
    /// Free-form metadata.
    pub metadata: Map<String, Value>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

/// A search over one owner's threads, most recently updated first unless it says
/// otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadSearch {
    /// Only this owner's threads.
    pub owner: String,
    /// Only threads with one of these ids.
    pub ids: Option<Vec<String>>,
    /// Threads whose metadata holds every one of these key/value pairs.
    pub metadata: Map<String, Value>,
    /// Only threads with this status.
    pub status: Option<ThreadStatus>,
    /// What the threads are sorted by.
    pub sort_by: ThreadSortBy,
    /// Which way.
    pub sort_order: SortOrder,
    /// Page size.
    pub limit: u32,
    /// Threads to skip.
    pub offset: u32,
}

impl ThreadSearch {
    /// The first `limit` threads of `owner`, most recently updated first.
    pub fn owner(owner: impl Into<String>, limit: u32) -> Self {
        ThreadSearch {
            owner: owner.into(),
            ids: None,
            metadata: Map::new(),
            status: None,
            sort_by: ThreadSortBy::UpdatedAt,
            sort_order: SortOrder::Desc,
            limit,
            offset: 0,
        }
    }

    /// Whether a thread passes the id and metadata filters.
    pub fn matches(&self, thread: &ThreadRecord) -> bool {
        self.ids
            .as_ref()
            .is_none_or(|ids| ids.contains(&thread.thread_id))
            && self
                .metadata
                .iter()
                .all(|(key, value)| thread.metadata.get(key) == Some(value))
    }

    /// Applies the id and metadata filters, the order, offset and limit to an owner's
    /// threads that are already status-filtered and sorted newest first (threads that
    /// tie keep that order, or its reverse when ascending).
    pub fn page(&self, newest_first: Vec<ThreadRecord>) -> Vec<ThreadRecord> {
        let mut threads: Vec<ThreadRecord> = newest_first
            .into_iter()
            .filter(|thread| self.matches(thread))
            .collect();
        if self.sort_order == SortOrder::Asc {
            threads.reverse();
        }
        threads.sort_by(|a, b| {
            let (a, b) = (sort_key(self.sort_by, a), sort_key(self.sort_by, b));
            match self.sort_order {
                SortOrder::Asc => a.cmp(b),
                SortOrder::Desc => b.cmp(a),
            }
        });
        threads
            .into_iter()
            .skip(self.offset as usize)
            .take(self.limit as usize)
            .collect()
    }
}

/// The text a thread sorts by: timestamps are fixed-width RFC 3339, so text order is
/// time order.
fn sort_key(by: ThreadSortBy, thread: &ThreadRecord) -> &str {
    match by {
        ThreadSortBy::ThreadId => &thread.thread_id,
        ThreadSortBy::Status => thread.status.as_str(),
        ThreadSortBy::CreatedAt => &thread.created_at,
        ThreadSortBy::UpdatedAt => &thread.updated_at,
    }
}

/// Whose runs a listing holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunScope<'a> {
    /// The runs of one thread.
    Thread(&'a str),
    /// One owner's runs, in every thread of theirs.
    Owner(&'a str),
}

impl RunScope<'_> {
    /// Whether `run` is in the scope.
    pub fn holds(&self, run: &RunRecord) -> bool {
        match self {
            RunScope::Thread(thread_id) => run.thread_id == *thread_id,
            RunScope::Owner(owner) => run.owner == *owner,
        }
    }

    /// The column the scope filters on, and its value.
    pub fn column(&self) -> (&'static str, &str) {
        match self {
            RunScope::Thread(thread_id) => ("thread_id", thread_id),
            RunScope::Owner(owner) => ("owner", owner),
        }
    }
}

/// A run to create, in status `pending`.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    /// Run id.
    pub run_id: String,
    /// Thread id.
    pub thread_id: String,
    /// The user who started it.
    pub owner: String,
    /// Always `lead_agent` today.
    pub assistant_id: String,
    /// The effective lead model.
    pub model_name: Option<String>,
    /// The request trace id (docs/operations.md#trace-ids).
    pub trace_id: Option<String>,
    /// Request metadata.
    pub metadata: Map<String, Value>,
    /// reject, interrupt or rollback.
    pub multitask_strategy: String,
    /// The run request's remaining arguments.
    pub kwargs: Value,
}

/// A run's token rollup columns (docs/usage-and-cost.md#run-buckets).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RunUsage {
    /// Sum of input tokens.
    pub total_input_tokens: i64,
    /// Sum of output tokens.
    pub total_output_tokens: i64,
    /// Sum of total tokens; equals the sum of the caller buckets.
    pub total_tokens: i64,
    /// Own model calls (lead and middleware).
    pub llm_call_count: i64,
    /// Caller bucket `lead_agent`.
    pub lead_agent_tokens: i64,
    /// Caller bucket `subagent:*`.
    pub subagent_tokens: i64,
    /// Caller bucket `middleware:*`.
    pub middleware_tokens: i64,
    /// Messages in the final state.
    pub message_count: i64,
    /// Per-model buckets, keyed by model name or `unknown`.
    pub token_usage_by_model: BTreeMap<String, ModelUsage>,
}

/// A stored run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// Run id.
    pub run_id: String,
    /// Thread id.
    pub thread_id: String,
    /// The user who started it.
    pub owner: String,
    /// `lead_agent`.
    pub assistant_id: String,
    /// Lifecycle status.
    pub status: RunStatus,
    /// The effective lead model.
    pub model_name: Option<String>,
    /// The request trace id.
    pub trace_id: Option<String>,
    /// Why a guard ended the run, if one did.
    pub stop_reason: Option<RunStopReason>,
    /// The failure message of an `error` run.
    pub error: Option<String>,
    /// Request metadata.
    pub metadata: Map<String, Value>,
    /// reject, interrupt or rollback.
    pub multitask_strategy: String,
    /// The run request's remaining arguments.
    pub kwargs: Value,
    /// Token rollups.
    pub usage: RunUsage,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

/// The end of a run: its terminal status and what ended it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunStatusUpdate {
    /// The new status.
    pub status: RunStatus,
    /// Why a guard ended the run.
    pub stop_reason: Option<RunStopReason>,
    /// Failure message.
    pub error: Option<String>,
    /// The run lease's owner the write is made under (docs/api.md#resume-and-rejoin):
    /// refused with [`crate::Error::LeaseLost`] unless it holds the lease; `None` for an
    /// unfenced write.
    pub lease_owner: Option<String>,
}

/// Storage of threads and runs.
#[async_trait]
pub trait RecordStore: Send + Sync + std::fmt::Debug {
    /// Creates a thread in status `idle`; [`crate::Error::ThreadExists`] if the id is taken.
    async fn create_thread(&self, thread: NewThread) -> Result<ThreadRecord>;

    /// The thread, whoever owns it.
    async fn get_thread(&self, thread_id: &str) -> Result<Option<ThreadRecord>>;

    /// One owner's threads, newest first.
    async fn search_threads(&self, search: &ThreadSearch) -> Result<Vec<ThreadRecord>>;

    /// Merges `metadata` into a thread's metadata (a key's new value replaces its old
    /// one) and touches its `updated_at`; `None` when the thread does not exist.
    async fn update_thread_metadata(
        &self,
        thread_id: &str,
        metadata: &Map<String, Value>,
    ) -> Result<Option<ThreadRecord>>;

    /// Sets a thread's status; false when the thread does not exist.
    async fn set_thread_status(&self, thread_id: &str, status: ThreadStatus) -> Result<bool>;

    /// Deletes a thread with its runs and events; false when it did not exist.
    async fn delete_thread(&self, thread_id: &str) -> Result<bool>;

    /// Creates a run in status `pending`; [`crate::Error::RunExists`] if the id is taken.
    async fn create_run(&self, run: NewRun) -> Result<RunRecord>;

    /// A run of a thread.
    async fn get_run(&self, thread_id: &str, run_id: &str) -> Result<Option<RunRecord>>;

    /// The runs of a thread, or of an owner across threads, newest first, optionally of
    /// one status.
    async fn list_runs(
        &self,
        scope: RunScope<'_>,
        status: Option<RunStatus>,
        limit: u32,
        offset: u32,
    ) -> Result<Vec<RunRecord>>;

    /// Moves an active (`pending` or `running`) run to a new status. The first terminal
    /// status written wins: updating a finished run changes nothing and returns false.
    /// Fenced by `update.lease_owner`, checked in the write's transaction.
    async fn update_run_status(&self, run_id: &str, update: &RunStatusUpdate) -> Result<bool>;

    /// Stores the run's token rollups (progress snapshots and completion values); with a
    /// `lease_owner`, only while it holds the run's lease ([`crate::Error::LeaseLost`]).
    async fn save_run_usage(
        &self,
        run_id: &str,
        usage: &RunUsage,
        lease_owner: Option<&str>,
    ) -> Result<bool>;

    /// Deletes a run with its events (`rollback`); false when it did not exist.
    async fn delete_run(&self, thread_id: &str, run_id: &str) -> Result<bool>;
}
