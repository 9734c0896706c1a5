//! The process-wide FIFO admission controller (docs/events.md#the-task-tool, `subagent_runtime.*`), shared
//! by subagent tasks and batch items.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What to do when every slot is busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AdmissionPolicy {
    /// Wait in FIFO order, up to the queue limit and timeout.
    #[default]
    Queue,
    /// Fail at once.
    Reject,
}

/// `subagent_runtime.*`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Executions running at once (1–64).
    pub max_running: usize,
    /// Executions waiting at once (0–10,000).
    pub max_queued: usize,
    /// queue or reject.
    pub admission_policy: AdmissionPolicy,
    /// Longest wait for a slot.
    pub queue_timeout_seconds: u64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            max_running: 3,
            max_queued: 64,
            admission_policy: AdmissionPolicy::Queue,
            queue_timeout_seconds: 300,
        }
    }
}

impl AdmissionConfig {
    /// Checks the documented ranges; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=64).contains(&self.max_running) {
            return Err(format!(
                "subagent_runtime.max_running must be between 1 and 64, got {}",
                self.max_running
            ));
        }
        if self.max_queued > 10_000 {
            return Err(format!(
                "subagent_runtime.max_queued must be between 0 and 10000, got {}",
                self.max_queued
            ));
        }
        Ok(())
    }
}

/// Why an execution was not admitted; the task ends `failed` with this text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// Policy `reject` and no free slot.
    #[error("Subagent admission rejected: all {0} execution slots are busy")]
    Rejected(usize),
    /// The queue is full.
    #[error("Subagent admission rejected: the queue of {0} waiting executions is full")]
    QueueFull(usize),
    /// Waited longer than `queue_timeout_seconds`.
    #[error("Subagent admission timed out after {0} seconds in the queue")]
    TimedOut(u64),
}

/// A cheap-to-clone handle onto the process's execution slots.
#[derive(Debug, Clone)]
pub struct Admission {
    config: AdmissionConfig,
    slots: Arc<Semaphore>,
    queued: Arc<AtomicUsize>,
}

impl Admission {
    /// The controller for this process.
    pub fn new(config: AdmissionConfig) -> Self {
        Admission {
            slots: Arc::new(Semaphore::new(config.max_running)),
            queued: Arc::new(AtomicUsize::new(0)),
            config,
        }
    }

    /// Waits for a slot in FIFO order (tokio's semaphore is fair); the permit frees it.
    pub async fn admit(&self) -> Result<OwnedSemaphorePermit, AdmissionError> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(permit);
        }
        if self.config.admission_policy == AdmissionPolicy::Reject {
            return Err(AdmissionError::Rejected(self.config.max_running));
        }
        if self.queued.fetch_add(1, Ordering::SeqCst) >= self.config.max_queued {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(AdmissionError::QueueFull(self.config.max_queued));
        }
        let timeout = Duration::from_secs(self.config.queue_timeout_seconds);
        let waited = tokio::time::timeout(timeout, self.slots.clone().acquire_owned()).await;
        self.queued.fetch_sub(1, Ordering::SeqCst);
        match waited {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) | Err(_) => Err(AdmissionError::TimedOut(self.config.queue_timeout_seconds)),
        }
    }

    /// Up to `max` slots free now, taken without queueing, for a batch claim pass to
    /// start its claims on (what it does not use it drops at once). None from a
    /// controller that refuses executions while full (`reject`, or a queue of 0):
    /// holding its slots even for the moment of a pass could make a task fail.
    pub fn reserve_free(&self, max: usize) -> Vec<OwnedSemaphorePermit> {
        if self.config.admission_policy == AdmissionPolicy::Reject || self.config.max_queued == 0 {
            return Vec::new();
        }
        std::iter::from_fn(|| self.slots.clone().try_acquire_owned().ok())
            .take(max)
            .collect()
    }

    /// `subagent_runtime.max_running`: executions running at once in this process.
    pub fn max_running(&self) -> usize {
        self.config.max_running
    }

    /// Executions waiting now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(max_running: usize, max_queued: usize, policy: AdmissionPolicy) -> Admission {
        Admission::new(AdmissionConfig {
            max_running,
            max_queued,
            admission_policy: policy,
            queue_timeout_seconds: 5,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_admitted_in_arrival_order() {
        let admission = admission(1, 8, AdmissionPolicy::Queue);
        let first = admission.admit().await.unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for n in 0..3 {
            let (admission, order) = (admission.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let _permit = admission.admit().await.unwrap();
                order.lock().unwrap().push(n);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }));
            tokio::task::yield_now().await;
        }
        assert_eq!(admission.queued(), 3);
        drop(first);
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
    }

    #[tokio::test]
    async fn free_slots_are_reserved_only_from_a_controller_that_queues() {
        let queue = admission(4, 8, AdmissionPolicy::Queue);
        let _held = queue.admit().await.unwrap();
        let reserved = queue.reserve_free(8);
        assert_eq!(reserved.len(), 3, "every free slot, no more");
        assert!(queue.reserve_free(8).is_empty());
        drop(reserved);
        assert_eq!(queue.reserve_free(2).len(), 2);
        assert!(
            admission(4, 8, AdmissionPolicy::Reject)
                .reserve_free(4)
                .is_empty()
        );
        assert!(
            admission(4, 0, AdmissionPolicy::Queue)
                .reserve_free(4)
                .is_empty()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn reject_policy_full_queue_and_timeout_each_say_why() {
        let reject = admission(1, 8, AdmissionPolicy::Reject);
        let _held = reject.admit().await.unwrap();
        assert_eq!(
            reject.admit().await.unwrap_err(),
            AdmissionError::Rejected(1)
        );

        let queue = admission(1, 0, AdmissionPolicy::Queue);
        let _held = queue.admit().await.unwrap();
        assert_eq!(
            queue.admit().await.unwrap_err(),
            AdmissionError::QueueFull(0)
        );

        let slow = admission(1, 4, AdmissionPolicy::Queue);
        let _held = slow.admit().await.unwrap();
        let error = slow.admit().await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "Subagent admission timed out after 5 seconds in the queue"
        );
        assert_eq!(slow.queued(), 0);
    }

    #[test]
    fn ranges_are_checked_with_the_key_named() {
        let bad = AdmissionConfig {
            max_running: 0,
            ..AdmissionConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .starts_with("subagent_runtime.max_running")
        );
        assert!(AdmissionConfig::default().validate().is_ok());
    }
}
