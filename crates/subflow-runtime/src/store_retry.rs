//! Writes a run cannot end without (its final checkpoint, usage and status), retried
//! until the store takes them.

use std::future::Future;
use std::time::Duration;

/// The first and the longest wait between attempts of a write the run cannot end without.
const STORE_RETRY_MIN: Duration = Duration::from_millis(100);
const STORE_RETRY_MAX: Duration = Duration::from_secs(5);

/// Runs `write` until the store takes it, waiting longer after each refusal (up to
/// [`STORE_RETRY_MAX`]); `None` when the store refuses its input for good (the run or
/// thread was deleted), which no retry can change.
pub(crate) async fn until_stored<T, F, W>(what: &str, run_id: &str, write: W) -> Option<T>
where
    W: Fn() -> F,
    F: Future<Output = subflow_store::Result<T>>,
{
    let mut delay = STORE_RETRY_MIN;
    loop {
        match write().await {
            Ok(done) => return Some(done),
            Err(error) if error.is_invalid_input() => {
                tracing::warn!(%error, run_id, "the store refused {what} for good");
                return None;
            }
            Err(error) => {
                tracing::warn!(%error, run_id, retry_in = ?delay, "the store refused {what}; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(STORE_RETRY_MAX);
            }
        }
    }
}
