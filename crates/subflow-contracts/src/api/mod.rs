//! The HTTP API's request and response bodies (docs/api.md#runs, docs/api.md#run-events, docs/usage-and-cost.md, docs/batches.md), as the gateway
//! reads and writes them. With feature `openapi` every type also describes itself as a
//! JSON Schema (`utoipa::ToSchema`), which the gateway's OpenAPI document is built from;
//! without it this module is plain serde types.

pub mod batches;
pub mod meta;
pub mod numbers;
pub mod runs;
pub mod tasks;
pub mod threads;
pub mod usage;

use serde::{Deserialize, Serialize};

pub use batches::{
    Batch, BatchCounts, BatchExportLine, BatchFeatures, BatchItem, BatchSubmission,
    BatchSubmissionItem, ItemUsage,
};
pub use meta::{Assistant, Features, GraphSchema, Info, ModelListing, Models};
pub use runs::{
    CancelAction, DisconnectAction, MultitaskStrategy, Run, RunInput, RunRequest, StreamMode,
};
pub use tasks::{TaskCancelAccepted, TaskStatus, TaskStep, TaskSummary};
pub use threads::{
    HistoryRequest, MessagePage, MessageRecord, SortOrder, StateUpdate, StateUpdated, StateValues,
    Thread, ThreadCreate, ThreadField, ThreadPatch, ThreadSearch, ThreadSortBy, ThreadState,
};
pub use usage::{ModelUsage, TokenUsage};

/// Every failed request's body: what was wrong, in a sentence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// What was wrong.
    pub detail: String,
}

/// `GET /health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Health {
    /// Always `ok`.
    #[cfg_attr(feature = "openapi", schema(pattern = "^ok$"))]
    pub status: String,
}
