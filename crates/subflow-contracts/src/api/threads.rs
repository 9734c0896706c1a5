//! Threads (docs/api.md#runs, docs/api.md#objects): create and search requests, the Thread object and the
//! ThreadState of a checkpoint.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ThreadStatus;
use crate::messages::Message;

/// `POST /api/threads`; unknown fields are 422.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ThreadCreate {
    /// `^[A-Za-z0-9_-]{1,64}$`; a fresh UUID when absent.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9_-]{1,64}$"))]
    pub thread_id: Option<String>,
    /// Free-form metadata.
    #[serde(default)]
    pub metadata: Map<String, Value>,
    /// `raise` (409 when the thread exists, the default) or `do_nothing`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<IfExists>))]
    pub if_exists: Option<String>,
}

string_enum! {
    /// `if_exists` of a thread creation.
    pub enum IfExists {
        Raise = "raise",
        DoNothing = "do_nothing",
    }
}

/// `POST /api/threads/search`; unknown fields are 422.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ThreadSearch {
    /// Threads whose metadata holds every one of these pairs.
    #[serde(default)]
    pub metadata: Map<String, Value>,
    /// Only threads with this status.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<ThreadStatus>))]
    pub status: Option<String>,
    /// Page size, default 10, 1-1000 (else 422).
    #[serde(default, deserialize_with = "super::numbers::option_whole_u32")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<i64>, minimum = 1, maximum = 1000))]
    pub limit: Option<u32>,
    /// Threads to skip.
    #[serde(default, deserialize_with = "super::numbers::option_whole_u32")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<i64>, minimum = 0, maximum = 4294967295_i64))]
    pub offset: Option<u32>,
    /// Only these thread ids.
    #[serde(default)]
    pub ids: Option<Vec<String>>,
    /// Threads whose latest state values hold every one of these pairs.
    #[serde(default)]
    pub values: Map<String, Value>,
    /// The order: `updated_at` (the default), `created_at`, `thread_id` or `status`.
    #[serde(default)]
    pub sort_by: Option<ThreadSortBy>,
    /// `desc` (the default) or `asc`.
    #[serde(default)]
    pub sort_order: Option<SortOrder>,
    /// The thread fields to return; all when absent or empty.
    #[serde(default)]
    pub select: Option<Vec<ThreadField>>,
    /// Words to find, case-insensitively, in the thread's id, title or message text
    /// (additive); blank means no filter.
    #[serde(default)]
    pub query: Option<String>,
}

string_enum! {
    /// What a thread search sorts by.
    pub enum ThreadSortBy {
        ThreadId = "thread_id",
        Status = "status",
        CreatedAt = "created_at",
        UpdatedAt = "updated_at",
    }
}

string_enum! {
    /// A sort direction.
    pub enum SortOrder {
        Asc = "asc",
        Desc = "desc",
    }
}

string_enum! {
    /// A top-level field of the Thread object, as a search's `select` names it.
    pub enum ThreadField {
        ThreadId = "thread_id",
        CreatedAt = "created_at",
        UpdatedAt = "updated_at",
        Metadata = "metadata",
        Status = "status",
        Values = "values",
    }
}

/// `PATCH /api/threads/{thread_id}`; unknown fields are 422.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ThreadPatch {
    /// Pairs merged into the thread's metadata (a key's new value replaces its old one).
    #[serde(default)]
    pub metadata: Map<String, Value>,
}

/// `POST /api/threads/{thread_id}/state`; unknown fields are 422.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct StateUpdate {
    /// Keys written over the current state values (`{title}` renames the thread).
    #[serde(default)]
    pub values: Option<Map<String, Value>>,
    /// The node the update is written as; recorded in the checkpoint's metadata.
    #[serde(default)]
    pub as_node: Option<String>,
}

/// The answer to a state update: the checkpoint it wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StateUpdated {
    /// The new checkpoint.
    pub checkpoint: CheckpointRef,
}

/// `POST …/history`; unknown fields are 422.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HistoryRequest {
    /// Page size, default 10, 1-1000 (else 422).
    #[serde(default, deserialize_with = "super::numbers::option_whole_u32")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<i64>, minimum = 1, maximum = 1000))]
    pub limit: Option<u32>,
    /// A checkpoint id, or a checkpoint config `{configurable: {checkpoint_id}}` or
    /// `{checkpoint_id}`, to page before; a config without an id pages from the newest.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = before_schema))]
    pub before: Option<Value>,
}

/// `before`: a checkpoint id, a checkpoint config object, or null.
#[cfg(feature = "openapi")]
fn before_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
    Schema::Object(
        ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::String, Type::Object, Type::Null]))
            .description(Some(
                "A checkpoint id, or a checkpoint config `{configurable: {checkpoint_id}}` or `{checkpoint_id}`, to page before; a config without an id pages from the newest",
            ))
            .build(),
    )
}

/// The Thread object, with the latest checkpoint's values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Thread {
    /// Thread id.
    pub thread_id: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
    /// Free-form metadata.
    pub metadata: Map<String, Value>,
    /// idle, busy, interrupted or error.
    pub status: ThreadStatus,
    /// The latest state values; `{}` before the first checkpoint.
    pub values: Map<String, Value>,
}

/// A thread as `POST /api/threads/search` answers it: every [`Thread`] field, or with
/// `select` only the selected ones, so none is required. It describes the answer in the
/// API document; the gateway writes the answer straight from the store's rows.
#[cfg(feature = "openapi")]
#[derive(Debug, utoipa::ToSchema)]
pub struct SearchedThread {
    /// Thread id.
    pub thread_id: Option<String>,
    /// RFC 3339.
    pub created_at: Option<String>,
    /// RFC 3339.
    pub updated_at: Option<String>,
    /// Free-form metadata.
    pub metadata: Option<Map<String, Value>>,
    /// idle, busy, interrupted or error.
    pub status: Option<ThreadStatus>,
    /// The latest state values.
    pub values: Option<Map<String, Value>>,
}

/// The state values a run leaves: its messages, and a title once one is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StateValues {
    /// The conversation, each message keeping its id from the moment it enters.
    pub messages: Vec<Message>,
    /// The thread's title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

/// Where a checkpoint is: `checkpoint_ns` is always empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CheckpointRef {
    /// Thread id.
    pub thread_id: String,
    /// Always empty: a run has no subgraphs.
    #[cfg_attr(feature = "openapi", schema(pattern = "^$"))]
    pub checkpoint_ns: String,
    /// The checkpoint; null for a thread without one.
    pub checkpoint_id: Option<String>,
}

/// A ThreadState (docs/api.md#objects) of one checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ThreadState {
    /// The checkpoint's values.
    #[cfg_attr(feature = "openapi", schema(value_type = StateValues))]
    pub values: Value,
    /// Always empty: a stopped graph has no next node.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>, max_items = 0))]
    pub next: Vec<Value>,
    /// This checkpoint.
    pub checkpoint: CheckpointRef,
    /// The checkpoint's metadata.
    pub metadata: Map<String, Value>,
    /// RFC 3339; null for a thread without a checkpoint.
    pub created_at: Option<String>,
    /// The previous checkpoint.
    pub parent_checkpoint: Option<CheckpointRef>,
    /// Always empty.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>, max_items = 0))]
    pub tasks: Vec<Value>,
    /// Always empty.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>, max_items = 0))]
    pub interrupts: Vec<Value>,
}

/// One record of a thread's message page: a persisted `message`-category run event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MessageRecord {
    /// The run event.
    #[serde(flatten)]
    pub event: crate::RunEvent,
    /// Whole seconds from the run's creation to its last update, on the last AI record
    /// of each run in the page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_duration: Option<i64>,
    /// Always null: subflow keeps no message feedback.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub feedback: Option<Value>,
}

/// `GET /api/threads/{thread_id}/messages/page`: a page of the lead's messages, oldest
/// first, paging backwards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MessagePage {
    /// The newest `limit` records before the cursor, oldest first.
    pub data: Vec<MessageRecord>,
    /// Whether older records exist.
    pub has_more: bool,
    /// The `before_seq` of the next (older) page: the first record's `seq` when
    /// `has_more`, else null.
    pub next_before_seq: Option<i64>,
}
