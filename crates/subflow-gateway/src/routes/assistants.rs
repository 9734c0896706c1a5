//! The one assistant, `lead_agent` (docs/api.md#runs), in the shapes the LangGraph SDKs read:
//! the assistant itself, its graph (`get_graph`) and its schemas (`get_schemas`).

use std::sync::OnceLock;

use axum::Json;
use serde_json::json;
use subflow_contracts::api::Assistant;
use subflow_contracts::api::GraphSchema;
use subflow_contracts::api::meta::{AssistantGraph, GraphEdge, GraphNode};

/// `GET /api/assistants/lead_agent`: the one assistant.
#[utoipa::path(get, path = "/api/assistants/lead_agent", tag = "assistants",
    responses((status = 200, description = "The lead agent", body = Assistant)))]
pub async fn get() -> Json<Assistant> {
    Json(Assistant::lead_agent())
}

/// `POST /api/assistants/search`: lists the one assistant, whatever the body.
#[utoipa::path(post, path = "/api/assistants/search", tag = "assistants",
    responses((status = 200, description = "The lead agent, alone", body = Vec<Assistant>)))]
pub async fn search() -> Json<Vec<Assistant>> {
    Json(vec![Assistant::lead_agent()])
}

/// `GET /api/assistants/lead_agent/graph`: the lead loop as LangGraph draws a graph, its
/// nodes named as `langgraph_node` and `updates` name them — `model` calls the model,
/// `tools` runs the tool calls it asked for (tasks included), until it asks for none.
/// The graph has no subgraphs, so `xray` changes nothing.
#[utoipa::path(get, path = "/api/assistants/lead_agent/graph", tag = "assistants",
    responses((status = 200, description = "The lead loop's nodes and edges", body = AssistantGraph)))]
pub async fn graph() -> Json<&'static AssistantGraph> {
    static GRAPH: OnceLock<AssistantGraph> = OnceLock::new();
    Json(GRAPH.get_or_init(|| {
        let schema = |name: &str| GraphNode {
            id: name.to_owned(),
            kind: "schema".to_owned(),
            data: json!(name),
        };
        let runnable = |name: &str| GraphNode {
            id: name.to_owned(),
            kind: "runnable".to_owned(),
            data: json!({"id": ["subflow", "lead_agent", name], "name": name}),
        };
        let edge = |source: &str, target: &str, conditional: bool| GraphEdge {
            source: source.to_owned(),
            target: target.to_owned(),
            conditional,
        };
        AssistantGraph {
            nodes: vec![
                schema("__start__"),
                runnable("model"),
                runnable("tools"),
                schema("__end__"),
            ],
            edges: vec![
                edge("__start__", "model", false),
                edge("model", "tools", true),
                edge("model", "__end__", true),
                edge("tools", "model", false),
            ],
        }
    }))
}

/// `GET /api/assistants/lead_agent/schemas`: LangGraph's `GraphSchema` — the input the
/// runs API takes, the state and output it keeps (docs/api.md#objects), the `configurable` keys
/// and the context keys it reads (docs/api.md#run-request).
#[utoipa::path(get, path = "/api/assistants/lead_agent/schemas", tag = "assistants",
    responses((status = 200, description = "JSON Schemas of the lead agent's input, output, state, config and context", body = GraphSchema)))]
pub async fn schemas() -> Json<&'static GraphSchema> {
    static SCHEMAS: OnceLock<GraphSchema> = OnceLock::new();
    Json(SCHEMAS.get_or_init(|| {
        let message = json!({
            "type": "object",
            "description": "A LangChain message dict, or a {role, content} pair in input",
            "properties": {
                "type": {"enum": ["human", "ai", "tool", "system"]},
                "role": {"enum": ["user", "human", "assistant", "ai", "system"]},
                "content": {"type": ["string", "array"]},
                "id": {"type": ["string", "null"]},
                "name": {"type": ["string", "null"]},
                "additional_kwargs": {"type": "object"},
                "response_metadata": {"type": "object"},
                "tool_calls": {"type": "array"},
                "tool_call_id": {"type": "string"},
                "status": {"enum": ["success", "error"]},
            },
            "required": ["content"],
        });
        let messages = json!({"type": "array", "items": message});
        let state = json!({"title": "LeadAgentState", "type": "object",
            "properties": {"messages": messages, "title": {"type": "string"}}, "required": ["messages"]});
        GraphSchema {
            graph_id: "lead_agent".to_owned(),
            input_schema: json!({"title": "LeadAgentInput", "type": "object",
                "properties": {"messages": messages}}),
            output_schema: state.clone(),
            state_schema: state,
            config_schema: json!({"title": "Configurable", "type": "object",
                "properties": {"model_name": {"type": "string", "description": "A configured model's name; the default model when absent"}}}),
            context_schema: json!({"title": "Context", "type": "object", "additionalProperties": true,
                "properties": {"model_name": {"type": "string", "description": "A configured model's name, when config.configurable has none"}}}),
        }
    }))
}
