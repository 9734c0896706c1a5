//! The one assistant, `lead_agent` (SPEC §2.1), in the shapes the LangGraph SDKs read:
//! the assistant itself, its graph (`get_graph`) and its schemas (`get_schemas`).

use std::sync::OnceLock;

use axum::Json;
use serde_json::{Value, json};

/// The assistant object.
fn assistant() -> Value {
    json!({"assistant_id": "lead_agent", "graph_id": "lead_agent", "name": "lead_agent", "config": {}, "metadata": {}})
}

/// `GET /api/assistants/lead_agent`.
pub async fn get() -> Json<Value> {
    Json(assistant())
}

/// `POST /api/assistants/search`.
pub async fn search() -> Json<Value> {
    Json(json!([assistant()]))
}

/// `GET /api/assistants/lead_agent/graph`: the lead loop as LangGraph draws a graph, its
/// nodes named as `langgraph_node` and `updates` name them — `model` calls the model,
/// `tools` runs the tool calls it asked for (tasks included), until it asks for none.
/// The graph has no subgraphs, so `xray` changes nothing.
pub async fn graph() -> Json<&'static Value> {
    static GRAPH: OnceLock<Value> = OnceLock::new();
    Json(GRAPH.get_or_init(|| {
        let runnable = |name: &str| {
            json!({"id": name, "type": "runnable", "data": {"id": ["subflow", "lead_agent", name], "name": name}})
        };
        json!({
            "nodes": [
                {"id": "__start__", "type": "schema", "data": "__start__"},
                runnable("model"),
                runnable("tools"),
                {"id": "__end__", "type": "schema", "data": "__end__"},
            ],
            "edges": [
                {"source": "__start__", "target": "model"},
                {"source": "model", "target": "tools", "conditional": true},
                {"source": "model", "target": "__end__", "conditional": true},
                {"source": "tools", "target": "model"},
            ],
        })
    }))
}

/// `GET /api/assistants/lead_agent/schemas`: LangGraph's `GraphSchema` — the input the
/// runs API takes, the state and output it keeps (SPEC §2.3), the `configurable` keys
/// and the context keys it reads (SPEC §2.2).
pub async fn schemas() -> Json<&'static Value> {
    static SCHEMAS: OnceLock<Value> = OnceLock::new();
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
        json!({
            "graph_id": "lead_agent",
            "input_schema": {"title": "LeadAgentInput", "type": "object",
                "properties": {"messages": messages}},
            "output_schema": state,
            "state_schema": state,
            "config_schema": {"title": "Configurable", "type": "object",
                "properties": {"model_name": {"type": "string", "description": "A configured model's name; the default model when absent"}}},
            "context_schema": {"title": "Context", "type": "object", "additionalProperties": true,
                "properties": {"model_name": {"type": "string", "description": "A configured model's name, when config.configurable has none"}}},
        })
    }))
}
