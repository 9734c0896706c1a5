//! Stopping one delegation of a run without stopping the run: every `task` call of a run
//! registers its cancellation token here under its task id (the tool call id) while it
//! runs. Cancelling it stops that subagent at its next await point; its supervisor then
//! ends it `cancelled` with its usage so far, and the lead gets the contract ToolMessage
//! and goes on with its other tasks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// The tasks of one run, shared between the run and whoever may stop them.
#[derive(Debug, Clone, Default)]
pub struct TaskControls {
    tasks: Arc<Mutex<HashMap<String, TaskState>>>,
}

#[derive(Debug)]
enum TaskState {
    Running(CancellationToken),
    Ended,
}

/// What a cancel found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskCancel {
    /// The task was running; it stops at its next await point.
    Requested,
    /// The task had already ended.
    Ended,
    /// No task of that id started in this run.
    Unknown,
}

impl TaskControls {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, TaskState>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cancels the running task `task_id`.
    pub fn cancel(&self, task_id: &str) -> TaskCancel {
        match self.lock().get(task_id) {
            Some(TaskState::Running(token)) => {
                token.cancel();
                TaskCancel::Requested
            }
            Some(TaskState::Ended) => TaskCancel::Ended,
            None => TaskCancel::Unknown,
        }
    }

    /// Registers a task that starts now; it counts as ended once the registration drops.
    pub(crate) fn start(&self, task_id: &str, token: CancellationToken) -> TaskRegistration {
        self.lock()
            .insert(task_id.to_owned(), TaskState::Running(token));
        TaskRegistration {
            controls: self.clone(),
            task_id: task_id.to_owned(),
        }
    }
}

/// A running task's place in [`TaskControls`]; dropping it marks the task ended.
#[derive(Debug)]
pub(crate) struct TaskRegistration {
    controls: TaskControls,
    task_id: String,
}

impl Drop for TaskRegistration {
    fn drop(&mut self) {
        self.controls
            .lock()
            .insert(std::mem::take(&mut self.task_id), TaskState::Ended);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_is_cancellable_while_registered_and_ended_after() {
        let controls = TaskControls::default();
        assert_eq!(controls.cancel("call_1"), TaskCancel::Unknown);
        let token = CancellationToken::new();
        let registration = controls.start("call_1", token.clone());
        assert_eq!(controls.cancel("call_1"), TaskCancel::Requested);
        assert!(token.is_cancelled());
        drop(registration);
        assert_eq!(controls.cancel("call_1"), TaskCancel::Ended);
        assert_eq!(controls.cancel("call_2"), TaskCancel::Unknown);
    }
}
