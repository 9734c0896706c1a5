//! Run streams (docs/api.md): the process executing a run holds its lease
//! ([`launch`]); its [`persister`] numbers the run's frames, stores them in the durable
//! log under that lease, and only then publishes them to the run's process-local
//! [`hub`], so every id a client receives names a frame the log holds (commit before
//! send). Watchers anywhere follow a run from a cursor ([`follow`]), from the hub here
//! or from the log elsewhere; [`upkeep`] prunes old logs, recovers orphaned runs and
//! relays remote cancel requests. A run counts as done (`ActiveRun::done`, `join`,
//! `wait`) only once its whole log is stored and its lease released.

pub(crate) mod follow;
pub(crate) mod hub;
mod launch;
mod persister;
pub(crate) mod stored;
pub(crate) mod upkeep;

pub(crate) use launch::{RunLaunch, start_run};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use subflow_contracts::api::StreamMode;
use subflow_store::StreamNotice;
use tokio::sync::broadcast;

use crate::{ApiError, AppState};
use hub::Hub;

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
/// 422, all named at once (an empty one as `''`).
pub(crate) fn parse_stream_modes<'a>(
    names: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<StreamMode>, ApiError> {
    let (mut modes, mut unknown) = (Vec::new(), Vec::new());
    for name in names {
        match name.parse::<StreamMode>() {
            Ok(mode) => modes.push(mode),
            Err(_) if name.is_empty() => unknown.push("''"),
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
