//! Outcome writes, gathered: attempts that end while an earlier outcome write is in
//! flight are finalised together by one `finish_attempts` call, so a busy worker pays
//! one store write (one transaction where the backend can) for many items, and an idle
//! one writes each outcome at once.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use subflow_contracts::BatchItemStatus;
use subflow_store::{AttemptOutcome, BatchStore, ItemLease, Result as StoreResult};
use tokio::sync::{mpsc, oneshot};

/// The most outcomes one write carries.
const MAX_GROUP: usize = 256;

/// An outcome write that failed twice (it was logged); the attempt then hands its claim
/// back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WriteFailed;

/// What an outcome write answers: the item's new status, `None` when fenced out.
pub(crate) type Written = Result<Option<BatchItemStatus>, WriteFailed>;

struct Finish {
    lease: ItemLease,
    outcome: AttemptOutcome,
    answer: oneshot::Sender<Written>,
}

/// Gathers a worker's outcome writes; its task starts with the first outcome and ends
/// once the worker and all its attempts are gone.
#[derive(Debug)]
pub(crate) struct Finisher {
    store: Arc<dyn BatchStore>,
    queue: OnceLock<mpsc::UnboundedSender<Finish>>,
}

impl Finisher {
    pub fn new(store: Arc<dyn BatchStore>) -> Self {
        Finisher {
            store,
            queue: OnceLock::new(),
        }
    }

    /// Writes `outcome` with whatever other outcomes are waiting, retrying a failed
    /// write once (docs/batches.md#running-an-item).
    pub async fn finish(&self, lease: &ItemLease, outcome: AttemptOutcome) -> Written {
        let queue = self.queue.get_or_init(|| {
            let (queue, outcomes) = mpsc::unbounded_channel();
            tokio::spawn(write_outcomes(self.store.clone(), outcomes));
            queue
        });
        let (answer, answered) = oneshot::channel();
        let finish = Finish {
            lease: lease.clone(),
            outcome,
            answer,
        };
        if queue.send(finish).is_err() {
            return Err(WriteFailed);
        }
        answered.await.unwrap_or(Err(WriteFailed))
    }
}

/// Writes the waiting outcomes, one call at a time: those that arrive meanwhile wait for
/// the next call.
async fn write_outcomes(store: Arc<dyn BatchStore>, mut queue: mpsc::UnboundedReceiver<Finish>) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    while queue.recv_many(&mut group, MAX_GROUP).await > 0 {
        let (outcomes, answers): (Vec<_>, Vec<_>) = group
            .drain(..)
            .map(|finish| ((finish.lease, finish.outcome), finish.answer))
            .unzip();
        match twice(|| store.finish_attempts(&outcomes)).await {
            Ok(statuses) => {
                for (answer, status) in answers.into_iter().zip(statuses) {
                    let _ = answer.send(Ok(status));
                }
            }
            Err(_) => {
                for answer in answers {
                    let _ = answer.send(Err(WriteFailed));
                }
            }
        }
    }
}

/// Runs a terminal write, and once more if it fails (docs/batches.md#running-an-item).
pub(crate) async fn twice<T, F, W>(write: W) -> StoreResult<T>
where
    W: Fn() -> F,
    F: Future<Output = StoreResult<T>>,
{
    match write().await {
        Ok(done) => Ok(done),
        Err(error) => {
            tracing::warn!(%error, "a batch item write failed; retrying it once");
            tokio::time::sleep(WRITE_RETRY_DELAY).await;
            write().await.inspect_err(|error| {
                tracing::error!(%error, "a batch item write failed twice");
            })
        }
    }
}

/// The pause before a failed terminal write is tried again.
const WRITE_RETRY_DELAY: Duration = Duration::from_millis(200);
