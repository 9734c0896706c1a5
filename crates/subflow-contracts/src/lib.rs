//! Wire types of subflow: validated ids, the closed status and event enums whose
//! string forms are frozen by the contract files in `contracts/`, run event records,
//! and the mapping from live task events to persisted `subagent.*` records.
//!
//! This crate does no IO and depends on no async, database or HTTP crate.
//!
//! # Map
//!
//! Wire types: LangChain-shaped `messages`, the task tool-result contract (`task_result`:
//! bounded briefs, sha256, text bodies and the card status reader shared with the UI and
//! `subflow tail`), `ThreadId`, the closed enums whose strings are frozen by
//! `contracts/*.json` (`SubagentStatus`, `SubagentStopReason`, `TaskEndStatus`,
//! `RunStatus`, `ThreadStatus`, `RunStopReason`, `BatchStatus`, `BatchItemStatus`,
//! `EventCategory`, `EventType`, `MiddlewareTag`), the `NewEvent`/`RunEvent` records,
//! character caps, and `task_events::map_task_event`, the pure mapping from a live task
//! event to its `subagent.*` record (docs/events.md#subagent-events). Its tests compare
//! every enum with our contract files and the reference ones. `task_card` is the Rust
//! port of the web UI's card rules (docs/workspace.md#task-card) that `subflow tail`
//! uses: reading ToolMessages and task events into card updates, merging them, the
//! pending rule, the steps a card lists, its labels and backfill paging;
//! `task_card/summary.rs` paints a card from its `/tasks` summary and holds
//! `listed_steps`, the one rule for a card's step count and latest step (its steps once
//! any are known, else its summary); `task_card/cost.rs` prices a card's usage at its
//! model's `/api/models` pricing and writes amounts from whole micro-units with integer
//! steps, so the workspace, `tail` and `usage` write every amount alike; `text::js_trim`
//! makes blankness agree with JavaScript. `auth` holds the `Permission` enum, the
//! `Permissions` set (`admin` implies every other) and the token format (`sf_` + 43
//! base64url characters) with `token_digest`, the SHA-256 that is all the store ever sees
//! of a token. `api` holds the HTTP API's request and response bodies (`RunRequest`,
//! `Run`, `Thread`, `ThreadState`, `TokenUsage`, `Batch`, `BatchItem`, `Models`,
//! `Features`, `Info`, `ErrorBody`, …) and the closed enums a run request names
//! (`StreamMode` with the frame each selects, `MultitaskStrategy`, `DisconnectAction`,
//! `CancelAction`). Behind the cargo feature `openapi` (which only the gateway turns on)
//! every API type, message and closed enum also derives or implements `utoipa::ToSchema`;
//! utoipa is a schema-description crate (serde, indexmap and its proc macro), not an IO
//! one, but the feature keeps the store, runtime and CLI from compiling the derives they
//! never use.

#[macro_use]
mod macros;

pub mod api;
pub mod auth;
pub mod cost;
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
