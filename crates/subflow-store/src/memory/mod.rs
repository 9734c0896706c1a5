//! The in-memory store: the reference semantics of every trait, for tests and embedding.
//!
//! One file per trait; this module holds the store value and its locks.

mod auth;
mod batches;
mod checkpoints;
mod events;
mod records;
mod streams;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use subflow_contracts::RunEvent;
use uuid::Uuid;

use crate::batches::{Clock, SharedClock};
use crate::checkpoints::Checkpoint;
use crate::records::{RunRecord, ThreadRecord};

/// A store that keeps everything in process memory.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    /// Users and tokens, under a lock of their own.
    auth: auth::MemoryAuth,
    /// Stream logs, run leases and cancel requests, locked after `inner`.
    streams: streams::MemoryStreams,
    /// Batches, items and worker heartbeats, locked after `inner`.
    batches: batches::MemoryBatches,
    /// The clock of batch leases and heartbeats.
    clock: SharedClock,
}

#[derive(Debug, Default)]
struct Inner {
    /// Per thread, in `seq` order.
    events: HashMap<String, Vec<RunEvent>>,
    event_ids: HashSet<Uuid>,
    /// Runs whose `run.end` is stored: nothing is appended for them any more.
    ended_runs: HashSet<String>,
    /// In creation order.
    threads: Vec<ThreadRecord>,
    /// In creation order.
    runs: Vec<RunRecord>,
    /// In creation order.
    checkpoints: Vec<Checkpoint>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose batch leases and heartbeats read `clock`, so tests can let
    /// leases expire without waiting.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryStore {
            clock: SharedClock::new(clock),
            ..Self::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied batch: every
        // mutation below is prepared first and applied without fallible steps.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `work` on the run records under the store's lock.
    fn with_runs<T>(&self, work: impl FnOnce(&mut Vec<RunRecord>) -> T) -> T {
        work(&mut self.lock().runs)
    }
}
