//! What the server tells about itself: models, features, info and the one assistant.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A configured model, as `/api/models` lists it (docs/api.md#token-usage-and-models).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelListing {
    /// Configured name.
    pub name: String,
    /// Provider model id.
    pub model: String,
    /// Display name.
    pub display_name: Option<String>,
    /// Description.
    pub description: Option<String>,
    /// Whether it supports thinking.
    pub supports_thinking: bool,
    /// Whether it supports reasoning effort.
    pub supports_reasoning_effort: bool,
}

impl ModelListing {
    /// A listing with just its names.
    pub fn named(name: impl Into<String>, model: impl Into<String>) -> Self {
        ModelListing {
            name: name.into(),
            model: model.into(),
            display_name: None,
            description: None,
            supports_thinking: false,
            supports_reasoning_effort: false,
        }
    }
}

/// `GET /api/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Models {
    /// The configured models, the default first.
    pub models: Vec<PricedModel>,
    /// Whether the UI shows token usage.
    pub token_usage: TokenUsageShown,
}

/// A configured model with its prices (additive: clients price live usage, such as a
/// running task card's, at the rates `/token-usage` uses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PricedModel {
    /// The configured name again, as LangGraph-style clients key models by `id`.
    pub id: String,
    /// The listing; its `display_name` is never null here (the name when none is set).
    #[serde(flatten)]
    pub listing: ModelListing,
    /// `models[].pricing` (docs/usage-and-cost.md#cost); null when unpriced.
    pub pricing: Option<ModelPricing>,
}

/// A model's prices per million tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelPricing {
    /// Upper-case currency code.
    pub currency: String,
    /// Uncached input.
    pub input_per_million: f64,
    /// Output.
    pub output_per_million: f64,
    /// Cached input; the input price applies when null.
    pub input_cache_hit_per_million: Option<f64>,
    /// Input written to the cache; the input price applies when null.
    pub input_cache_write_per_million: Option<f64>,
}

/// `token_usage.enabled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenUsageShown {
    /// `token_usage.enabled`.
    pub enabled: bool,
}

/// `GET /api/features` (docs/batches.md#capability).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Features {
    /// Durable batches.
    pub subagent_batches: super::BatchFeatures,
}

/// `GET /api/info`: what LangGraph servers answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Info {
    /// The server's version.
    pub version: String,
    /// What it supports.
    pub flags: InfoFlags,
    /// Where it runs.
    pub host: InfoHost,
    /// Always empty.
    pub metadata: Map<String, Value>,
}

/// The flags of `/api/info`: LangGraph's, then subflow's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InfoFlags {
    /// Read-only assistants.
    pub assistants: bool,
    /// No crons.
    pub crons: bool,
    /// No LangSmith.
    pub langsmith: bool,
    /// No LangSmith tracing replicas.
    pub langsmith_tracing_replicas: bool,
    /// Every stream is resumable (docs/api.md#resume-and-rejoin).
    pub resumable_streams: bool,
    /// Whether token usage is shown (docs/api.md#token-usage-and-models).
    pub token_usage: bool,
}

/// The host of `/api/info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InfoHost {
    /// `self-hosted`.
    pub kind: String,
    /// Null.
    pub project_id: Option<String>,
    /// Null.
    pub host_revision_id: Option<String>,
    /// Null.
    pub revision_id: Option<String>,
    /// Null.
    pub tenant_id: Option<String>,
}

/// The one assistant, `lead_agent` (docs/api.md#runs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Assistant {
    /// `lead_agent`.
    #[cfg_attr(feature = "openapi", schema(pattern = "^lead_agent$"))]
    pub assistant_id: String,
    /// `lead_agent`.
    #[cfg_attr(feature = "openapi", schema(pattern = "^lead_agent$"))]
    pub graph_id: String,
    /// `lead_agent`.
    pub name: String,
    /// Empty.
    pub config: Map<String, Value>,
    /// Empty.
    pub metadata: Map<String, Value>,
}

impl Assistant {
    /// `lead_agent`.
    pub fn lead_agent() -> Self {
        Assistant {
            assistant_id: "lead_agent".to_owned(),
            graph_id: "lead_agent".to_owned(),
            name: "lead_agent".to_owned(),
            config: Map::new(),
            metadata: Map::new(),
        }
    }
}

/// The lead agent's graph as LangGraph draws one (`get_graph`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AssistantGraph {
    /// `__start__`, `model`, `tools`, `__end__`.
    pub nodes: Vec<GraphNode>,
    /// The loop between model and tools.
    pub edges: Vec<GraphEdge>,
}

/// A node of [`AssistantGraph`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GraphNode {
    /// Its name.
    pub id: String,
    /// `schema` (start and end) or `runnable`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The name of a schema node, or a runnable's `{id, name}`.
    pub data: Value,
}

/// An edge of [`AssistantGraph`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GraphEdge {
    /// From.
    pub source: String,
    /// To.
    pub target: String,
    /// Whether the model's answer decides it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub conditional: bool,
}

/// LangGraph's `GraphSchema` of the lead agent (`get_schemas`): JSON Schemas of its input,
/// output, state, `configurable` keys and context keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GraphSchema {
    /// `lead_agent`.
    pub graph_id: String,
    /// What a run takes.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub input_schema: Value,
    /// What a run leaves.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub output_schema: Value,
    /// The thread state.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub state_schema: Value,
    /// `config.configurable`.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub config_schema: Value,
    /// `context`.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub context_schema: Value,
}
