//! The in-memory store: the reference semantics of every trait, for tests and embedding.
//!
//! One file per trait; this module holds the store value and its locks.

mod auth;
mod checkpoints;
mod events;
mod records;
mod streams;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use subflow_contracts::RunEvent;
use uuid::Uuid;

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
}

#[derive(Debug, Default)]
struct Inner {
    /// Per thread, in `seq` order.
    events: HashMap<String, Vec<RunEvent>>,
    event_ids: HashSet<Uuid>,
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
