//! Runs (docs/api.md): the run request, the Run object and the closed enums a run
//! request names.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ModelUsage;
use super::usage::Cost;
use crate::{RunStatus, RunStopReason};

/// The run request body (docs/api.md#run-request); unknown fields are 422. The gateway parses the
/// string fields into the closed enums their schemas name, so a wrong value is a 422
/// that says which values there are.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// `lead_agent`, the one assistant.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(pattern = "^lead_agent$"))]
    pub assistant_id: Option<String>,
    /// The new messages.
    #[serde(default)]
    pub input: Option<RunInput>,
    /// A mode or a list of modes; `values` when absent or empty.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = stream_mode_schema))]
    pub stream_mode: Option<Value>,
    /// `configurable.model_name` picks a configured model; `metadata` carries trace
    /// attributes.
    #[serde(default)]
    pub config: Option<Map<String, Value>>,
    /// Context keys the run reads (`model_name`); `is_subagent`, `agent_id` and `__`
    /// keys are dropped.
    #[serde(default)]
    pub context: Option<Map<String, Value>>,
    /// Stored with the run.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    /// What losing the creating client does: `cancel` (default) or `continue`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<DisconnectAction>))]
    pub on_disconnect: Option<String>,
    /// What a run does to the thread's active runs; `reject` by default.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<MultitaskStrategy>))]
    pub multitask_strategy: Option<String>,
    /// Only `create`: a run on an unknown thread creates it for the caller.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(pattern = "^create$"))]
    pub if_not_exists: Option<String>,
    /// Stored with the run; there are no subgraphs.
    #[serde(default)]
    pub stream_subgraphs: Option<bool>,
    /// Stored with the run; every stream is resumable.
    #[serde(default)]
    pub stream_resumable: Option<bool>,
    /// Not supported: null or absent.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = unsupported_schema))]
    pub webhook: Option<Value>,
    /// Not supported: null or absent.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = unsupported_schema))]
    pub after_seconds: Option<Value>,
    /// Not supported: null or absent.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = unsupported_schema))]
    pub feedback_keys: Option<Value>,
    /// Not supported: null or absent.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = unsupported_schema))]
    pub interrupt_before: Option<Value>,
    /// Not supported: null or absent.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = unsupported_schema))]
    pub interrupt_after: Option<Value>,
    /// Not supported: null or absent.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = unsupported_schema))]
    pub checkpoint: Option<Value>,
    /// Not supported: null or absent.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = unsupported_schema))]
    pub checkpoint_id: Option<Value>,
    /// Not supported: null or absent.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = unsupported_schema))]
    pub command: Option<Value>,
}

/// A LangGraph run option subflow does not support: only null passes, anything else is 422.
#[cfg(feature = "openapi")]
fn unsupported_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
    Schema::Object(
        ObjectBuilder::new()
            .schema_type(Type::Null)
            .description(Some("Not supported: null or absent"))
            .build(),
    )
}

/// `stream_mode`: one [`StreamMode`], a list of them, or null.
#[cfg(feature = "openapi")]
fn stream_mode_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
    use utoipa::openapi::{Ref, RefOr};
    let mode = || RefOr::Ref(Ref::from_schema_name("StreamMode"));
    Schema::OneOf(
        OneOfBuilder::new()
            .item(mode())
            .item(ArrayBuilder::new().items(mode()))
            .item(ObjectBuilder::new().schema_type(Type::Null))
            .build(),
    )
}

/// An input message as the gateway reads it: a LangChain message dict (it has `type`),
/// or a `{role, content}` pair without one. A schema only: the gateway parses each
/// message from JSON itself, since the two forms are told apart by the `type` key.
#[cfg(feature = "openapi")]
#[derive(Debug)]
pub struct InputMessage;

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for InputMessage {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
        use utoipa::openapi::{Ref, RefOr};
        let role_pair = ObjectBuilder::new()
            .schema_type(Type::Object)
            .property(
                "role",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["user", "human", "assistant", "ai", "system"])),
            )
            .required("role")
            .property(
                "content",
                ObjectBuilder::new().schema_type(utoipa::openapi::schema::SchemaType::AnyValue),
            )
            .description(Some(
                "`{role, content}`; content defaults to an empty string",
            ))
            // `type` decides the form, so a role pair has none: every key but `type`.
            .property_names(Some(
                ObjectBuilder::new().schema_type(Type::String).pattern(Some(
                    r"^(?:(?:[^t]|t[^y]|ty[^p]|typ[^e]|type[\s\S])[\s\S]*|t|ty|typ|)$",
                )),
            ))
            .build();
        OneOfBuilder::new()
            .item(RefOr::Ref(Ref::from_schema_name("Message")))
            .item(role_pair)
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for InputMessage {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        use utoipa::PartialSchema;
        schemas.push(("Message".to_owned(), crate::messages::Message::schema()));
        <crate::messages::Message as utoipa::ToSchema>::schemas(schemas);
    }
}

/// A run's input.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunInput {
    /// LangChain message dicts (with `type`), or `{role, content}` pairs.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<InputMessage>))]
    pub messages: Vec<Value>,
}

/// The Run object (docs/api.md#objects) with the additive usage fields (docs/usage-and-cost.md#run-buckets).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Run {
    /// Run id.
    pub run_id: String,
    /// Thread id.
    pub thread_id: String,
    /// `lead_agent`.
    pub assistant_id: String,
    /// Lifecycle status.
    pub status: RunStatus,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
    /// The request's metadata.
    pub metadata: Map<String, Value>,
    /// reject, interrupt or rollback.
    #[cfg_attr(feature = "openapi", schema(value_type = MultitaskStrategy))]
    pub multitask_strategy: String,
    /// The request's remaining arguments.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub kwargs: Value,
    /// The effective lead model.
    pub model_name: Option<String>,
    /// The request's trace id.
    pub trace_id: Option<String>,
    /// Why a guard ended the run.
    pub stop_reason: Option<RunStopReason>,
    /// The failure of an `error` run.
    pub error: Option<String>,
    /// Sum of input tokens.
    pub total_input_tokens: i64,
    /// Sum of output tokens.
    pub total_output_tokens: i64,
    /// Sum of total tokens.
    pub total_tokens: i64,
    /// Own model calls.
    pub llm_call_count: i64,
    /// Caller bucket `lead_agent`.
    pub lead_agent_tokens: i64,
    /// Caller bucket `subagent:*`.
    pub subagent_tokens: i64,
    /// Caller bucket `middleware:*`.
    pub middleware_tokens: i64,
    /// Messages in the final state.
    pub message_count: i64,
    /// Per-model buckets.
    pub token_usage_by_model: BTreeMap<String, ModelUsage>,
    /// The run's own cost (docs/usage-and-cost.md#cost), whatever its status; null when unpriced.
    pub cost: Option<Cost>,
}

string_enum! {
    /// A run request's `stream_mode`: which of the run's outputs become frames.
    pub enum StreamMode {
        Values = "values",
        MessagesTuple = "messages-tuple",
        Updates = "updates",
        Custom = "custom",
    }
}

impl StreamMode {
    /// The SSE event name of the frames this mode selects.
    pub const fn event(self) -> &'static str {
        match self {
            StreamMode::Values => "values",
            StreamMode::MessagesTuple => "messages",
            StreamMode::Updates => "updates",
            StreamMode::Custom => "custom",
        }
    }
}

string_enum! {
    /// `multitask_strategy`: what a new run does to the thread's active runs.
    pub enum MultitaskStrategy {
        /// 409 while a run is active.
        Reject = "reject",
        /// Stop the active runs first.
        Interrupt = "interrupt",
        /// Stop them and delete their checkpoints, events and records.
        Rollback = "rollback",
    }
}

string_enum! {
    /// `on_disconnect`: what losing the creating client does to the run.
    pub enum DisconnectAction {
        Cancel = "cancel",
        Continue = "continue",
    }
}

string_enum! {
    /// The `action` of a cancel request.
    pub enum CancelAction {
        /// Stop the run, keeping what it wrote.
        Interrupt = "interrupt",
        /// Stop it, then delete its checkpoints, events and record.
        Rollback = "rollback",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stream_mode_selects_its_own_frames() {
        let events: Vec<&str> = StreamMode::ALL.iter().map(|m| m.event()).collect();
        assert_eq!(events, ["values", "messages", "updates", "custom"]);
        assert_eq!(
            "messages-tuple".parse::<StreamMode>(),
            Ok(StreamMode::MessagesTuple)
        );
        assert!("messages".parse::<StreamMode>().is_err());
    }
}
