//! Guards that stop an agent before it runs away (docs/events.md#loop-detection).
//!
//! Everything here is pure, synchronous bookkeeping: the agent loop feeds each model
//! response ([`LoopDetector::after_model`]) and its usage ([`TokenBudget::observe`]) in,
//! queues the warnings it gets back in a [`WarningQueue`] drained at the next model call,
//! replaces the last AI message with [`hard_stop`] on a hard stop, and records
//! [`loop_event_content`] as `middleware:loop_detection`.

mod intervention;
pub mod loop_detection;
pub mod token_budget;

pub use intervention::{
    BUDGET_WARNING_NAME, LOOP_WARNING_NAME, MAX_INJECTED_WARNINGS_PER_RUN, WarningQueue, hard_stop,
};
pub use loop_detection::{
    Detection, DetectionLayer, LoopDetectionConfig, LoopDetector, ToolFreqOverride,
    loop_event_content,
};
pub use token_budget::{BudgetCheck, BudgetReason, TokenBudget, TokenBudgetConfig};
