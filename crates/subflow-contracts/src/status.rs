//! Closed status and stop-reason enums (docs/api.md#objects, docs/events.md#tool-result-contract, docs/events.md#other-guards, docs/batches.md#batch-states, docs/batches.md#item-states).

/// A string that is not one of an enum's frozen values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} value '{value}'")]
pub struct UnknownValue {
    /// The enum that rejected the value.
    pub kind: &'static str,
    /// The rejected text.
    pub value: String,
}

string_enum! {
    /// `subagent_status` of a terminal task ToolMessage (contract `valid_status_values`).
    pub enum SubagentStatus {
        Completed = "completed",
        Failed = "failed",
        Cancelled = "cancelled",
        TimedOut = "timed_out",
        PollingTimedOut = "polling_timed_out",
    }
}

string_enum! {
    /// `subagent_stop_reason`: why a guard cap ended a subagent (contract `valid_stop_reason_values`).
    pub enum SubagentStopReason {
        TokenCapped = "token_capped",
        TurnCapped = "turn_capped",
        LoopCapped = "loop_capped",
    }
}

impl SubagentStopReason {
    /// The display label used in task result text bodies (docs/events.md#text-body).
    pub const fn label(self) -> &'static str {
        match self {
            SubagentStopReason::TokenCapped => "token budget",
            SubagentStopReason::TurnCapped => "turn budget",
            SubagentStopReason::LoopCapped => "repeated tool-call loop",
        }
    }
}

string_enum! {
    /// The status of a persisted `subagent.end` record (docs/events.md#catalogue).
    pub enum TaskEndStatus {
        Completed = "completed",
        Failed = "failed",
        Cancelled = "cancelled",
        TimedOut = "timed_out",
    }
}

impl From<SubagentStatus> for TaskEndStatus {
    /// The safety-net status is persisted as `timed_out` (docs/events.md#the-safety-net).
    fn from(status: SubagentStatus) -> Self {
        match status {
            SubagentStatus::Completed => TaskEndStatus::Completed,
            SubagentStatus::Failed => TaskEndStatus::Failed,
            SubagentStatus::Cancelled => TaskEndStatus::Cancelled,
            SubagentStatus::TimedOut | SubagentStatus::PollingTimedOut => TaskEndStatus::TimedOut,
        }
    }
}

string_enum! {
    /// The lifecycle status of a run (docs/api.md#objects).
    pub enum RunStatus {
        Pending = "pending",
        Running = "running",
        Success = "success",
        Error = "error",
        Timeout = "timeout",
        Interrupted = "interrupted",
    }
}

impl RunStatus {
    /// Whether the run can still change status.
    pub const fn is_active(self) -> bool {
        matches!(self, RunStatus::Pending | RunStatus::Running)
    }
}

string_enum! {
    /// The status of a thread (docs/api.md#objects).
    pub enum ThreadStatus {
        Idle = "idle",
        Busy = "busy",
        Interrupted = "interrupted",
        Error = "error",
    }
}

string_enum! {
    /// A run's `stop_reason` (docs/events.md#other-guards).
    pub enum RunStopReason {
        LoopCapped = "loop_capped",
        TokenCapped = "token_capped",
        SafetyCapped = "safety_capped",
        SubagentLimitCapped = "subagent_limit_capped",
        ModelLengthCapped = "model_length_capped",
        OrphanRecovered = "orphan_recovered",
        /// The store refused the run's writes (additive): the run ended `error` once it
        /// took them again.
        StoreUnavailable = "store_unavailable",
    }
}

string_enum! {
    /// The status of a durable batch (docs/batches.md#batch-states).
    pub enum BatchStatus {
        Queued = "queued",
        Running = "running",
        Paused = "paused",
        Completed = "completed",
        Failed = "failed",
        Cancelled = "cancelled",
    }
}

impl BatchStatus {
    /// Whether the batch can still change: `queued`, `running` or `paused`.
    pub const fn is_active(self) -> bool {
        matches!(
            self,
            BatchStatus::Queued | BatchStatus::Running | BatchStatus::Paused
        )
    }
}

string_enum! {
    /// The status of one item of a durable batch (docs/batches.md#item-states).
    pub enum BatchItemStatus {
        Pending = "pending",
        Queued = "queued",
        Leased = "leased",
        Running = "running",
        Succeeded = "succeeded",
        Failed = "failed",
        Cancelled = "cancelled",
    }
}

impl BatchItemStatus {
    /// Whether a worker may hold or be about to take the item: `queued`, `leased` or `running`.
    pub const fn is_active(self) -> bool {
        matches!(
            self,
            BatchItemStatus::Queued | BatchItemStatus::Leased | BatchItemStatus::Running
        )
    }

    /// Whether the item is done: `succeeded`, `failed` or `cancelled`.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            BatchItemStatus::Succeeded | BatchItemStatus::Failed | BatchItemStatus::Cancelled
        )
    }

    /// Whether a worker holds the item's lease: `leased` or `running`.
    pub const fn is_leased(self) -> bool {
        matches!(self, BatchItemStatus::Leased | BatchItemStatus::Running)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_round_trips_through_its_wire_string() {
        for status in SubagentStatus::ALL {
            assert_eq!(status.as_str().parse::<SubagentStatus>(), Ok(*status));
            let json = serde_json::to_string(status).unwrap();
            assert_eq!(
                serde_json::from_str::<SubagentStatus>(&json).unwrap(),
                *status
            );
        }
        for status in BatchItemStatus::ALL {
            assert_eq!(status.as_str().parse::<BatchItemStatus>(), Ok(*status));
        }
        for status in BatchStatus::ALL {
            assert_eq!(status.as_str().parse::<BatchStatus>(), Ok(*status));
        }
        for reason in RunStopReason::ALL {
            assert_eq!(reason.to_string().parse::<RunStopReason>(), Ok(*reason));
        }
    }

    #[test]
    fn unknown_values_are_rejected_with_the_enum_named() {
        let err = "max_turns_reached".parse::<SubagentStatus>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown SubagentStatus value 'max_turns_reached'"
        );
        assert!(serde_json::from_str::<RunStatus>("\"done\"").is_err());
    }

    #[test]
    fn polling_timeouts_persist_as_timed_out() {
        assert_eq!(
            TaskEndStatus::from(SubagentStatus::PollingTimedOut),
            TaskEndStatus::TimedOut
        );
        assert_eq!(
            TaskEndStatus::from(SubagentStatus::Cancelled),
            TaskEndStatus::Cancelled
        );
    }
}
