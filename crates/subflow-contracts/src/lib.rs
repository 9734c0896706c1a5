//! Wire types of subflow: validated ids, the closed status and event enums whose
//! string forms are frozen by the contract files in `contracts/`, run event records,
//! and the mapping from live task events to persisted `subagent.*` records.
//!
//! This crate does no IO and depends on no async, database or HTTP crate.

#[macro_use]
mod macros;

pub mod api;
pub mod auth;
pub mod events;
pub mod ids;
pub mod messages;
pub mod status;
pub mod task_card;
pub mod task_events;
pub mod task_result;
pub mod text;

pub use auth::{Permission, Permissions};
pub use events::{EventCategory, EventType, MiddlewareTag, NewEvent, RunEvent};
pub use ids::{InvalidThreadId, ThreadId};
pub use status::{
    BatchItemStatus, BatchStatus, RunStatus, RunStopReason, SubagentStatus, SubagentStopReason,
    TaskEndStatus, ThreadStatus,
};
