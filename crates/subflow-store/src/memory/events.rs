//! [`EventStore`] for [`MemoryStore`].

use async_trait::async_trait;
use subflow_contracts::{EventCategory, NewEvent, RunEvent};

use crate::events::{AppendOutcome, EventQuery, EventStore};
use crate::tasks::{self, TaskSummary};
use crate::{MemoryStore, Result, validate_batch};

#[async_trait]
impl EventStore for MemoryStore {
    async fn append(&self, batch: &[NewEvent]) -> Result<AppendOutcome> {
        validate_batch(batch)?;
        let Some(first) = batch.first() else {
            return Ok(AppendOutcome::default());
        };
        let mut inner = self.lock();
        let inner = &mut *inner;
        let rows = inner.events.entry(first.thread_id.clone()).or_default();
        let mut next_seq = rows.last().map_or(0, |row| row.seq) + 1;
        let mut outcome = AppendOutcome::default();
        for event in batch {
            // Nothing follows a run's end, whoever still writes for it.
            if inner.ended_runs.contains(&event.run_id) || !inner.event_ids.insert(event.event_id) {
                outcome.skipped += 1;
                continue;
            }
            if event.event_type == subflow_contracts::EventType::RunEnd.as_str() {
                inner.ended_runs.insert(event.run_id.clone());
            }
            rows.push(RunEvent {
                thread_id: event.thread_id.clone(),
                run_id: event.run_id.clone(),
                seq: next_seq,
                event_type: event.event_type.clone(),
                category: event.category.clone(),
                content: event.content_value(),
                metadata: event.metadata_map(),
                created_at: event.created_at.clone(),
                user_id: event.user_id.clone(),
                event_id: event.event_id,
            });
            next_seq += 1;
            outcome.written += 1;
        }
        Ok(outcome)
    }

    async fn list_events(&self, query: &EventQuery) -> Result<Vec<RunEvent>> {
        query.validate()?;
        let inner = self.lock();
        let rows = inner
            .events
            .get(&query.thread_id)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let start = query
            .after_seq
            .map_or(0, |after| rows.partition_point(|row| row.seq <= after));
        Ok(rows[start..]
            .iter()
            .filter(|row| query.matches(row))
            .take(query.limit as usize)
            .cloned()
            .collect())
    }

    async fn task_summaries(&self, thread_id: &str, run_id: &str) -> Result<Vec<TaskSummary>> {
        let inner = self.lock();
        let rows = inner
            .events
            .get(thread_id)
            .map(Vec::as_slice)
            .unwrap_or_default();
        Ok(tasks::summarize_all(tasks::task_rows(rows, run_id)))
    }

    async fn list_messages(
        &self,
        thread_id: &str,
        before_seq: Option<i64>,
        limit: u32,
    ) -> Result<Vec<RunEvent>> {
        let inner = self.lock();
        let message = EventCategory::Message.as_str();
        let mut newest_first: Vec<RunEvent> = inner
            .events
            .get(thread_id)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .rev()
            .filter(|row| row.category == message && before_seq.is_none_or(|b| row.seq < b))
            .take(limit as usize)
            .cloned()
            .collect();
        newest_first.reverse();
        Ok(newest_first)
    }
}
