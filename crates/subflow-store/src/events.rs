//! The run event store trait (docs/events.md#envelope) and its query (docs/api.md#run-events).

use async_trait::async_trait;
use subflow_contracts::{NewEvent, RunEvent};

use crate::tasks::TaskSummary;
use crate::{Error, Result};

/// The largest page `list_events` returns.
pub const MAX_PAGE_LIMIT: u32 = 2000;

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AppendOutcome {
    /// Rows written.
    pub written: usize,
    /// Records skipped because their `event_id` was already stored.
    pub skipped: usize,
}

/// A page of one run's events: `limit` matches with `seq > after_seq`, ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventQuery {
    /// Thread scope.
    pub thread_id: String,
    /// Run scope.
    pub run_id: String,
    /// Only these event types; `None` or empty means all.
    pub event_types: Option<Vec<String>>,
    /// Only records whose `metadata.task_id` equals this, applied before the limit.
    pub task_id: Option<String>,
    /// Only records with a greater `seq`.
    pub after_seq: Option<i64>,
    /// 1–2000.
    pub limit: u32,
}

impl EventQuery {
    /// The first page (500 records) of a run, unfiltered.
    pub fn run(thread_id: impl Into<String>, run_id: impl Into<String>) -> Self {
        EventQuery {
            thread_id: thread_id.into(),
            run_id: run_id.into(),
            event_types: None,
            task_id: None,
            after_seq: None,
            limit: 500,
        }
    }

    /// Checks the bounds of docs/api.md#run-events: `limit` 1–2000 and `after_seq` ≥ 1.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_PAGE_LIMIT).contains(&self.limit) {
            return Err(Error::InvalidQuery(format!(
                "limit must be between 1 and {MAX_PAGE_LIMIT}, got {}",
                self.limit
            )));
        }
        if let Some(after) = self.after_seq
            && after < 1
        {
            return Err(Error::InvalidQuery(format!(
                "after_seq must be at least 1, got {after}"
            )));
        }
        Ok(())
    }

    /// The type filter with an empty list treated as no filter.
    pub fn type_filter(&self) -> Option<&[String]> {
        self.event_types
            .as_deref()
            .filter(|types| !types.is_empty())
    }

    /// Whether a record matches the filters (scope, types, task, cursor), ignoring the limit.
    pub fn matches(&self, event: &RunEvent) -> bool {
        event.thread_id == self.thread_id
            && event.run_id == self.run_id
            && self.after_seq.is_none_or(|after| event.seq > after)
            && self
                .type_filter()
                .is_none_or(|types| types.contains(&event.event_type))
            && self.task_id.as_deref().is_none_or(|task| {
                event.metadata.get("task_id").and_then(|v| v.as_str()) == Some(task)
            })
    }
}

/// Append-only storage of run events with a thread-global `seq`.
#[async_trait]
pub trait EventStore: Send + Sync + std::fmt::Debug {
    /// Writes a batch atomically: every record of one thread gets the next `seq`
    /// values in batch order, and records whose `event_id` is already stored are
    /// skipped. An invalid batch is rejected whole before anything is written.
    async fn append(&self, batch: &[NewEvent]) -> Result<AppendOutcome>;

    /// One page of a run's events, ascending by `seq`.
    async fn list_events(&self, query: &EventQuery) -> Result<Vec<RunEvent>>;

    /// [`EventStore::list_events`] as the JSON array the API answers with: each event
    /// as serde writes it, without the metadata key
    /// [`crate::codec::HIDDEN_METADATA_KEY`]. The SQL backends write it straight from
    /// their rows ([`crate::codec::EventColumns`]); this default serialises the page.
    async fn list_events_json(&self, query: &EventQuery) -> Result<Vec<u8>> {
        let mut events = self.list_events(query).await?;
        for event in &mut events {
            event.metadata.remove(crate::codec::HIDDEN_METADATA_KEY);
        }
        Ok(serde_json::to_vec(&events).expect("events always serialise"))
    }

    /// The newest `limit` `message`-category records of a thread with a `seq` below
    /// `before_seq` (all of them when `None`), ascending by `seq`.
    async fn list_messages(
        &self,
        thread_id: &str,
        before_seq: Option<i64>,
        limit: u32,
    ) -> Result<Vec<RunEvent>>;

    /// One summary per task of a run, in the order of each task's first record, from
    /// its `subagent.*` records in one query (docs/api.md#task-summaries); `[]` for an unknown run.
    async fn task_summaries(&self, thread_id: &str, run_id: &str) -> Result<Vec<TaskSummary>>;
}
