//! `GET /api/openapi.json`: an OpenAPI 3.1 description of every route and the shapes
//! they exchange. The document is data, built once; a test walks the router's source to
//! keep the two in step.

use std::sync::OnceLock;

use axum::Json;
use serde_json::{Map, Value, json};

/// One operation of the API.
struct Operation {
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    /// `None` for routes that need no authentication.
    permission: Option<&'static str>,
    /// Query parameters: name, JSON schema type, description.
    query: &'static [(&'static str, &'static str, &'static str)],
    /// The request body schema name.
    body: Option<&'static str>,
    /// Success status and its response: a schema name, `sse`, or `empty`.
    success: (u16, &'static str),
}

const RUN_ID: &str = "run_id";

const OPERATIONS: &[Operation] = &[
    Operation {
        method: "get",
        path: "/health",
        summary: "Liveness; needs no authentication",
        permission: None,
        query: &[],
        body: None,
        success: (200, "Health"),
    },
    Operation {
        method: "get",
        path: "/metrics",
        summary: "Prometheus metrics of this process; needs admin in token mode unless metrics.public",
        permission: Some("admin"),
        query: &[],
        body: None,
        success: (200, "metrics"),
    },
    Operation {
        method: "get",
        path: "/api/openapi.json",
        summary: "This document",
        permission: None,
        query: &[],
        body: None,
        success: (200, "OpenApiDocument"),
    },
    Operation {
        method: "get",
        path: "/api/models",
        summary: "Configured models and whether token usage is shown",
        permission: Some("auth"),
        query: &[],
        body: None,
        success: (200, "Models"),
    },
    Operation {
        method: "get",
        path: "/api/features",
        summary: "Optional capabilities of this gateway",
        permission: Some("auth"),
        query: &[],
        body: None,
        success: (200, "Features"),
    },
    Operation {
        method: "get",
        path: "/api/info",
        summary: "The server's version and the flags of what it supports, as LangGraph servers answer",
        permission: Some("auth"),
        query: &[],
        body: None,
        success: (200, "Info"),
    },
    Operation {
        method: "get",
        path: "/api/assistants/lead_agent/graph",
        summary: "The lead agent's graph (nodes model and tools), as LangGraph draws one",
        permission: Some("auth"),
        query: &[],
        body: None,
        success: (200, "AssistantGraph"),
    },
    Operation {
        method: "get",
        path: "/api/assistants/lead_agent/schemas",
        summary: "The lead agent's input, output, state, config and context schemas (LangGraph's GraphSchema)",
        permission: Some("auth"),
        query: &[],
        body: None,
        success: (200, "GraphSchema"),
    },
    Operation {
        method: "get",
        path: "/api/assistants/lead_agent",
        summary: "The one assistant",
        permission: Some("auth"),
        query: &[],
        body: None,
        success: (200, "Assistant"),
    },
    Operation {
        method: "post",
        path: "/api/assistants/search",
        summary: "Lists the one assistant",
        permission: Some("auth"),
        query: &[],
        body: None,
        success: (200, "AssistantList"),
    },
    Operation {
        method: "post",
        path: "/api/threads",
        summary: "Creates a thread owned by the caller (409 if it exists and if_exists=raise)",
        permission: Some("threads:write"),
        query: &[],
        body: Some("ThreadCreate"),
        success: (200, "Thread"),
    },
    Operation {
        method: "post",
        path: "/api/threads/search",
        summary: "The caller's threads, newest first",
        permission: Some("threads:read"),
        query: &[],
        body: Some("ThreadSearch"),
        success: (200, "ThreadList"),
    },
    Operation {
        method: "get",
        path: "/api/threads/{thread_id}",
        summary: "A thread",
        permission: Some("threads:read"),
        query: &[],
        body: None,
        success: (200, "Thread"),
    },
    Operation {
        method: "delete",
        path: "/api/threads/{thread_id}",
        summary: "Cancels the thread's active runs, then deletes all its data",
        permission: Some("threads:write"),
        query: &[],
        body: None,
        success: (204, "empty"),
    },
    Operation {
        method: "get",
        path: "/api/threads/{thread_id}/state",
        summary: "The latest thread state",
        permission: Some("threads:read"),
        query: &[],
        body: None,
        success: (200, "ThreadState"),
    },
    Operation {
        method: "get",
        path: "/api/threads/{thread_id}/history",
        summary: "Thread states, newest first",
        permission: Some("threads:read"),
        query: &[
            ("limit", "integer", "1-1000, default 10"),
            ("before", "string", "A checkpoint id to page before"),
        ],
        body: None,
        success: (200, "ThreadStateList"),
    },
    Operation {
        method: "post",
        path: "/api/threads/{thread_id}/history",
        summary: "Thread states, newest first",
        permission: Some("threads:read"),
        query: &[],
        body: Some("HistoryRequest"),
        success: (200, "ThreadStateList"),
    },
    Operation {
        method: "get",
        path: "/api/threads/{thread_id}/token-usage",
        summary: "Token usage, cost and context usage of the thread's counted runs",
        permission: Some("threads:read"),
        query: &[(
            "include_active",
            "boolean",
            "Also count running runs through their snapshots",
        )],
        body: None,
        success: (200, "TokenUsage"),
    },
    Operation {
        method: "post",
        path: "/api/threads/{thread_id}/runs/stream",
        summary: "Starts a run and streams it as server-sent events",
        permission: Some("runs:write"),
        query: &[],
        body: Some("RunRequest"),
        success: (200, "sse"),
    },
    Operation {
        method: "post",
        path: "/api/threads/{thread_id}/runs/wait",
        summary: "Starts a run and answers with its final state values",
        permission: Some("runs:write"),
        query: &[],
        body: Some("RunRequest"),
        success: (200, "StateValues"),
    },
    Operation {
        method: "post",
        path: "/api/threads/{thread_id}/runs",
        summary: "Starts a run in the background",
        permission: Some("runs:write"),
        query: &[],
        body: Some("RunRequest"),
        success: (200, "Run"),
    },
    Operation {
        method: "get",
        path: "/api/threads/{thread_id}/runs",
        summary: "The thread's runs, newest first",
        permission: Some("runs:read"),
        query: &[
            ("limit", "integer", "1-100, default 10"),
            ("offset", "integer", "Runs to skip"),
            ("status", "string", "Only runs with this status"),
        ],
        body: None,
        success: (200, "RunList"),
    },
    Operation {
        method: "get",
        path: "/api/threads/{thread_id}/runs/{run_id}",
        summary: "A run",
        permission: Some("runs:read"),
        query: &[],
        body: None,
        success: (200, "Run"),
    },
    Operation {
        method: "post",
        path: "/api/threads/{thread_id}/runs/{run_id}/cancel",
        summary: "Cancels a run; rollback also deletes its checkpoints, events and record",
        permission: Some("runs:write"),
        query: &[
            ("wait", "boolean", "Answer once the run has stopped"),
            ("action", "string", "interrupt (default) or rollback"),
        ],
        body: None,
        success: (202, "empty"),
    },
    Operation {
        method: "get",
        path: "/api/threads/{thread_id}/runs/{run_id}/join",
        summary: "Waits for the run, then answers with the final state values",
        permission: Some("runs:read"),
        query: &[],
        body: None,
        success: (200, "StateValues"),
    },
    Operation {
        method: "get",
        path: "/api/threads/{thread_id}/runs/{run_id}/stream",
        summary: "Rejoins a run's stream from its durable log: the frames after Last-Event-ID (all without it), then live ones; a cursor into pruned frames gets one gap frame",
        permission: Some("runs:read"),
        query: &[
            (
                "stream_mode",
                "string",
                "Only these modes' frames (repeated or comma-separated); all when absent",
            ),
            (
                "cancel_on_disconnect",
                "boolean",
                "Cancel the run when this watcher goes (true/false or 1/0), default false",
            ),
            (
                "namespace",
                "string",
                "Accepted and ignored: a run has no subgraph namespaces",
            ),
            (
                "checkpoint_id",
                "string",
                "Accepted and ignored, as LangGraph servers do on a rejoin",
            ),
        ],
        body: None,
        success: (200, "sse"),
    },
    Operation {
        method: "get",
        path: "/api/threads/{thread_id}/runs/{run_id}/events",
        summary: "Persisted run events, ascending by seq, paged by after_seq",
        permission: Some("runs:read"),
        query: &[
            ("event_types", "string", "Comma-separated event types"),
            ("task_id", "string", "Only events of this task"),
            ("limit", "integer", "1-2000, default 500"),
            ("after_seq", "integer", "Only events with a larger seq"),
        ],
        body: None,
        success: (200, "RunEventList"),
    },
    Operation {
        method: "get",
        path: "/api/threads/{thread_id}/runs/{run_id}/tasks",
        summary: "One summary per task of the run, in start order, from its persisted events in one query",
        permission: Some("runs:read"),
        query: &[],
        body: None,
        success: (200, "TaskSummaryList"),
    },
    Operation {
        method: "get",
        path: "/api/threads/{thread_id}/subagent-batches",
        summary: "The caller's batches in the thread, newest first (created_at, id descending)",
        permission: Some("threads:read"),
        query: &[("limit", "integer", "1-100, default 20")],
        body: None,
        success: (200, "BatchList"),
    },
    Operation {
        method: "get",
        path: "/api/subagent-batches/{batch_id}",
        summary: "The caller's batch in any of their threads (additive: find a batch's thread by its id)",
        permission: Some("threads:read"),
        query: &[],
        body: None,
        success: (200, "Batch"),
    },
    Operation {
        method: "get",
        path: "/api/threads/{thread_id}/subagent-batches/{batch_id}",
        summary: "A batch with its counts by item status",
        permission: Some("threads:read"),
        query: &[],
        body: None,
        success: (200, "Batch"),
    },
    Operation {
        method: "get",
        path: "/api/threads/{thread_id}/subagent-batches/{batch_id}/items",
        summary: "A page of the batch's items in position order (no results)",
        permission: Some("threads:read"),
        query: &[
            ("offset", "integer", ">= 0, default 0"),
            ("limit", "integer", "1-500, default 100"),
            (
                "status",
                "string",
                "Only items in this status; an unknown one is 422 Unknown batch item status",
            ),
        ],
        body: None,
        success: (200, "BatchItemList"),
    },
    Operation {
        method: "post",
        path: "/api/threads/{thread_id}/subagent-batches/{batch_id}/pause",
        summary: "Pauses a queued or running batch; a 200 no-op otherwise",
        permission: Some("threads:write"),
        query: &[],
        body: None,
        success: (200, "Batch"),
    },
    Operation {
        method: "post",
        path: "/api/threads/{thread_id}/subagent-batches/{batch_id}/resume",
        summary: "Resumes a paused batch to queued; a 200 no-op otherwise",
        permission: Some("threads:write"),
        query: &[],
        body: None,
        success: (200, "Batch"),
    },
    Operation {
        method: "post",
        path: "/api/threads/{thread_id}/subagent-batches/{batch_id}/cancel",
        summary: "Cancels an active batch and every unfinished item at once (503 when subagent_batches.enabled is false)",
        permission: Some("threads:write"),
        query: &[],
        body: None,
        success: (200, "Batch"),
    },
    Operation {
        method: "post",
        path: "/api/threads/{thread_id}/subagent-batches/{batch_id}/items/{item_id}/retry",
        summary: "Retries a failed item (pending again); a finished batch is queued again",
        permission: Some("threads:write"),
        query: &[],
        body: None,
        success: (200, "BatchItem"),
    },
    Operation {
        method: "get",
        path: "/api/threads/{thread_id}/subagent-batches/{batch_id}/results.jsonl",
        summary: "Every item with its result, one JSON line each in position order",
        permission: Some("threads:read"),
        query: &[],
        body: None,
        success: (200, "ndjson"),
    },
];

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn array_of(name: &str) -> Value {
    json!({"type": "array", "items": schema_ref(name)})
}

fn error_response(description: &str) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": schema_ref("Error")}}})
}

fn operation(op: &Operation) -> Value {
    let mut parameters = Vec::new();
    for segment in ["thread_id", RUN_ID, "batch_id", "item_id"] {
        if op.path.contains(&format!("{{{segment}}}")) {
            parameters.push(json!({"name": segment, "in": "path", "required": true, "schema": {"type": "string"}}));
        }
    }
    for (name, kind, description) in op.query {
        parameters.push(json!({"name": name, "in": "query", "required": false, "description": description, "schema": {"type": kind}}));
    }
    if op.success.1 == "sse" {
        parameters.push(json!({"name": "Last-Event-ID", "in": "header", "required": false, "description": "Resume after this frame id; -1 replays from the start; an id past the stream's end is 422", "schema": {"type": "string", "pattern": "^(-1|[0-9]+)$"}}));
    }
    let (status, shape) = op.success;
    let success = match shape {
        "empty" => json!({"description": "No body"}),
        "metrics" => {
            json!({"description": "Prometheus text exposition format 0.0.4", "content": {"text/plain; version=0.0.4": {"schema": {"type": "string"}}}})
        }
        "sse" => {
            json!({"description": "Server-sent events: metadata first, end last", "content": {"text/event-stream": {"schema": {"type": "string"}}}})
        }
        "ndjson" => {
            json!({"description": "One BatchExportLine per line, as an attachment named {batch_id}-results.jsonl", "content": {"application/x-ndjson": {"schema": {"type": "string"}}}})
        }
        name => {
            json!({"description": "OK", "content": {"application/json": {"schema": schema_ref(name)}}})
        }
    };
    let mut responses = Map::new();
    responses.insert(status.to_string(), success);
    if let Some(permission) = op.permission {
        responses.insert(
            "401".into(),
            error_response("Authentication required (token mode)"),
        );
        if permission != "auth" {
            responses.insert(
                "403".into(),
                error_response(&format!("Permission denied: {permission}")),
            );
        }
    }
    if op.path.contains("{batch_id}") {
        responses.insert(
            "404".into(),
            error_response("Thread {thread_id} not found, or Subagent batch not found (also another user's, or another thread's, batch)"),
        );
    } else if op.path.contains("{thread_id}") {
        responses.insert(
            "404".into(),
            error_response("Thread {thread_id} not found (also another user's thread)"),
        );
    }
    if op.path.ends_with("/retry") {
        responses.insert(
            "409".into(),
            error_response(
                "Only failed items can be retried, or Items of a cancelled batch cannot be retried",
            ),
        );
    }
    if op.path.ends_with("/subagent-batches/{batch_id}/cancel") {
        responses.insert(
            "503".into(),
            error_response("Subagent batch worker is not running"),
        );
    }
    if op.body.is_some() || op.path.contains('{') || !op.query.is_empty() {
        responses.insert("422".into(), error_response("Invalid id, body or query"));
    }
    if op.body == Some("RunRequest") {
        responses.insert(
            "409".into(),
            error_response("The thread already has an active run (multitask_strategy=reject)"),
        );
        responses.insert("413".into(), error_response("Request body too large"));
    }
    let mut value = json!({
        "summary": op.summary,
        "operationId": format!("{}_{}", op.method, op.path.trim_start_matches('/').replace(['/', '{', '}', '.', '-'], "_")),
        "parameters": parameters,
        "responses": responses,
    });
    match op.permission {
        None => value["security"] = json!([]),
        Some(permission) if permission != "auth" => {
            value["x-subflow-permission"] = json!(permission);
        }
        Some(_) => {}
    }
    if let Some(body) = op.body {
        value["requestBody"] = json!({"required": false, "content": {"application/json": {"schema": schema_ref(body)}}});
    }
    value
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
}

fn schemas() -> Value {
    let string = json!({"type": "string"});
    let nullable_string = json!({"type": ["string", "null"]});
    let integer = json!({"type": "integer"});
    let free = json!({"type": "object"});
    let tokens = json!({"type": "integer", "minimum": 0});
    json!({
        "Error": object(json!({"detail": string}), &["detail"]),
        "Health": object(json!({"status": {"const": "ok"}}), &["status"]),
        "OpenApiDocument": free,
        "Models": object(json!({
            "models": {"type": "array", "items": object(json!({
                "name": string, "model": string, "display_name": nullable_string,
                "description": nullable_string, "supports_thinking": {"type": "boolean"},
                "supports_reasoning_effort": {"type": "boolean"},
                "pricing": {"type": ["object", "null"], "description": "models[].pricing per million tokens (SPEC §7.4); null when unpriced",
                    "properties": {"currency": string, "input_per_million": {"type": "number"},
                    "output_per_million": {"type": "number"}, "input_cache_hit_per_million": {"type": ["number", "null"]}}}}),
                &["name", "model"])},
            "token_usage": object(json!({"enabled": {"type": "boolean"}}), &["enabled"])}), &["models", "token_usage"]),
        "Features": object(json!({"subagent_batches": object(json!({
            "enabled": {"type": "boolean", "description": "An alias of worker_running"},
            "repository_available": {"const": true},
            "worker_running": {"type": "boolean", "description": "This process runs a worker, or (PostgreSQL) a worker heartbeat is younger than lease_seconds"},
            "max_running": {"type": "integer", "minimum": 0, "description": "subagent_runtime.max_running while a worker runs, else 0"}}),
            &["enabled", "repository_available", "worker_running", "max_running"])}), &["subagent_batches"]),
        "BatchCounts": object(json!({"pending": tokens, "queued": tokens, "leased": tokens, "running": tokens,
            "succeeded": tokens, "failed": tokens, "cancelled": tokens}),
            &["pending", "queued", "leased", "running", "succeeded", "failed", "cancelled"]),
        "Batch": object(json!({"id": {"type": "string", "pattern": "^subagent-batch-[0-9a-f]{32}$"},
            "thread_id": string, "title": {"type": "string", "maxLength": 256}, "subagent_type": string,
            "status": {"enum": ["queued", "running", "paused", "completed", "failed", "cancelled"]},
            "total_items": tokens, "max_live_items": tokens, "max_running_items": tokens, "max_attempts": tokens,
            "created_at": string, "updated_at": string, "completed_at": nullable_string,
            "counts": schema_ref("BatchCounts"),
            "usage": object(json!({"input_tokens": tokens, "output_tokens": tokens, "total_tokens": tokens}),
                &["input_tokens", "output_tokens", "total_tokens"]),
            "cost": schema_ref("Cost"),
            "items_per_minute": {"type": "number", "minimum": 0, "description": "Items finished in the last 5 minutes, per minute"},
            "eta_seconds": {"type": ["integer", "null"], "minimum": 0, "description": "Null while paused, ended, or nothing finished in the last 5 minutes"},
            "projected_cost": {"type": ["number", "null"], "description": "The whole batch's expected cost in cost.currency"}}),
            &["id", "thread_id", "title", "subagent_type", "status", "total_items", "max_live_items",
              "max_running_items", "max_attempts", "created_at", "updated_at", "completed_at", "counts",
              "usage", "cost", "items_per_minute", "eta_seconds", "projected_cost"]),
        "BatchList": array_of("Batch"),
        "BatchItem": object(json!({"id": {"type": "string", "pattern": "^batch-item-[0-9a-f]{32}$"},
            "batch_id": string, "item_key": {"type": "string", "minLength": 1, "maxLength": 128},
            "position": tokens,
            "status": {"enum": ["pending", "queued", "leased", "running", "succeeded", "failed", "cancelled"]},
            "attempt": tokens, "model_name": nullable_string, "result_preview": nullable_string,
            "result_truncated": {"type": "boolean"}, "error": nullable_string, "stop_reason": nullable_string,
            "token_usage": {"type": ["object", "null"], "properties": {"input_tokens": tokens,
                "output_tokens": tokens, "total_tokens": tokens}},
            "acceptance_criteria": {"type": "array", "items": string}, "acceptance_verdict": nullable_string,
            "started_at": nullable_string, "completed_at": nullable_string,
            "created_at": string, "updated_at": string}),
            &["id", "batch_id", "item_key", "position", "status", "attempt", "result_truncated",
              "acceptance_criteria", "created_at", "updated_at"]),
        "BatchItemList": array_of("BatchItem"),
        "BatchExportLine": {"allOf": [schema_ref("BatchItem"),
            object(json!({"result": nullable_string}), &["result"])]},
        "Assistant": object(json!({"assistant_id": {"const": "lead_agent"}, "graph_id": {"const": "lead_agent"},
            "name": string, "config": free, "metadata": free}), &["assistant_id", "graph_id"]),
        "AssistantList": array_of("Assistant"),
        "Info": object(json!({"version": string,
            "flags": {"type": "object", "additionalProperties": {"type": "boolean"}, "properties": {
                "assistants": {"type": "boolean"}, "crons": {"type": "boolean"}, "langsmith": {"type": "boolean"},
                "langsmith_tracing_replicas": {"type": "boolean"}, "resumable_streams": {"type": "boolean"},
                "token_usage": {"type": "boolean"}}},
            "host": object(json!({"kind": string, "project_id": nullable_string, "host_revision_id": nullable_string,
                "revision_id": nullable_string, "tenant_id": nullable_string}), &["kind"]),
            "metadata": free}), &["version", "flags"]),
        "AssistantGraph": object(json!({
            "nodes": {"type": "array", "items": object(json!({"id": {"type": ["string", "integer"]}, "type": string,
                "data": {"type": ["object", "string"]}}), &["id"])},
            "edges": {"type": "array", "items": object(json!({"source": string, "target": string,
                "conditional": {"type": "boolean"}, "data": string}), &["source", "target"])}}), &["nodes", "edges"]),
        "GraphSchema": object(json!({"graph_id": {"const": "lead_agent"}, "input_schema": free, "output_schema": free,
            "state_schema": free, "config_schema": free, "context_schema": free}), &["graph_id"]),
        "ThreadCreate": {"type": "object", "additionalProperties": false, "properties": {
            "thread_id": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
            "metadata": free, "if_exists": {"enum": ["raise", "do_nothing"]}}},
        "ThreadSearch": {"type": "object", "properties": {"metadata": free,
            "status": {"enum": ["idle", "busy", "interrupted", "error"]},
            "limit": {"type": "integer", "default": 10, "minimum": 1, "maximum": 1000}, "offset": {"type": "integer", "default": 0}}},
        "Thread": object(json!({"thread_id": string, "created_at": string, "updated_at": string,
            "metadata": free, "status": {"enum": ["idle", "busy", "interrupted", "error"]}, "values": free}),
            &["thread_id", "created_at", "updated_at", "metadata", "status"]),
        "ThreadList": array_of("Thread"),
        "HistoryRequest": {"type": "object", "properties": {"limit": {"type": "integer", "default": 10, "minimum": 1, "maximum": 1000}, "before": {}}},
        "StateValues": object(json!({"messages": {"type": "array", "items": schema_ref("Message")}, "title": string}), &["messages"]),
        "ThreadState": object(json!({"values": schema_ref("StateValues"), "next": {"type": "array"},
            "checkpoint": object(json!({"thread_id": string, "checkpoint_ns": {"const": ""}, "checkpoint_id": string}), &[]),
            "metadata": free, "created_at": nullable_string, "parent_checkpoint": {}, "tasks": {"type": "array"},
            "interrupts": {"type": "array"}}), &["values", "next", "checkpoint", "metadata", "tasks", "interrupts"]),
        "ThreadStateList": array_of("ThreadState"),
        "Message": object(json!({"type": {"enum": ["human", "ai", "tool", "system"]},
            "content": {"type": ["string", "array"]}, "id": {"type": "string", "description": "Kept from the moment the message enters the state"}, "name": nullable_string,
            "additional_kwargs": free, "response_metadata": free, "tool_calls": {"type": "array"},
            "invalid_tool_calls": {"type": "array"}, "usage_metadata": {}, "tool_call_id": string,
            "status": {"enum": ["success", "error"]}, "artifact": {}}), &["type", "content"]),
        "RunRequest": {"type": "object", "additionalProperties": false, "properties": {
            "assistant_id": {"const": "lead_agent"},
            "input": object(json!({"messages": {"type": "array", "items": {"type": "object"}}}), &[]),
            "stream_mode": {"oneOf": [{"$ref": "#/components/schemas/StreamMode"}, {"type": "array", "items": schema_ref("StreamMode")}]},
            "config": free, "context": free, "metadata": free,
            "on_disconnect": {"enum": ["cancel", "continue"]},
            "multitask_strategy": {"enum": ["reject", "interrupt", "rollback"]},
            "if_not_exists": {"const": "create"}, "stream_subgraphs": {"type": ["boolean", "null"]},
            "stream_resumable": {"type": ["boolean", "null"]},
            "webhook": {"type": "null"}, "after_seconds": {"type": "null"}, "feedback_keys": {"type": "null"},
            "interrupt_before": {"type": "null"}, "interrupt_after": {"type": "null"},
            "checkpoint": {"type": "null"}, "checkpoint_id": {"type": "null"}, "command": {"type": "null"}}},
        "StreamMode": {"enum": ["values", "messages-tuple", "updates", "custom"]},
        "Run": object(json!({"run_id": string, "thread_id": string, "assistant_id": string,
            "status": {"enum": ["pending", "running", "success", "error", "timeout", "interrupted"]},
            "created_at": string, "updated_at": string, "metadata": free,
            "multitask_strategy": {"enum": ["reject", "interrupt", "rollback"]}, "kwargs": free,
            "model_name": nullable_string, "trace_id": nullable_string, "stop_reason": nullable_string,
            "error": nullable_string, "total_input_tokens": tokens, "total_output_tokens": tokens,
            "total_tokens": tokens, "llm_call_count": tokens, "lead_agent_tokens": tokens,
            "subagent_tokens": tokens, "middleware_tokens": tokens, "message_count": tokens,
            "token_usage_by_model": free, "cost": schema_ref("Cost")}), &["run_id", "thread_id", "assistant_id", "status", "created_at", "updated_at"]),
        "RunList": array_of("Run"),
        "RunEvent": {"$comment": "contracts/run_event_stream_contract.json describes each event type in full",
            "type": "object", "properties": {"event_id": string, "thread_id": string, "run_id": string,
            "seq": integer, "event_type": string, "category": {"enum": ["trace", "message", "lifecycle", "middleware"]},
            "content": {}, "metadata": free, "created_at": string},
            "required": ["thread_id", "run_id", "seq", "event_type", "category", "content", "metadata", "created_at"]},
        "RunEventList": array_of("RunEvent"),
        "TaskStep": {"type": ["object", "null"], "properties": {"kind": {"enum": ["ai", "tool"]},
            "text": {"type": "string", "maxLength": 2000}, "tool_name": nullable_string},
            "required": ["kind", "text", "tool_name"]},
        "TaskSummary": object(json!({"task_id": string, "subagent_type": nullable_string,
            "description": nullable_string, "model_name": nullable_string,
            "status": {"enum": ["running", "completed", "failed", "cancelled", "timed_out"]},
            "stop_reason": nullable_string,
            "step_count": {"type": "integer", "minimum": 0, "description": "The steps an expanded card lists (SPEC §14.1)"},
            "latest_step": schema_ref("TaskStep"),
            "result_step": {"$ref": "#/components/schemas/TaskStep", "description": "A completed task's trailing answer, which its card does not list; listed by a card shown failed"},
            "usage": {"type": ["object", "null"], "properties": {"input_tokens": tokens, "output_tokens": tokens, "total_tokens": tokens}},
            "cost": {"type": ["object", "null"], "properties": {"currency": string, "total": {"type": "number"}}},
            "started_at": nullable_string, "ended_at": nullable_string,
            "error": nullable_string, "result_brief": nullable_string}),
            &["task_id", "status", "step_count", "latest_step", "usage", "cost", "started_at", "ended_at"]),
        "TaskSummaryList": array_of("TaskSummary"),
        "TokenUsage": object(json!({"thread_id": string, "total_tokens": tokens, "total_input_tokens": tokens,
            "total_output_tokens": tokens, "total_runs": tokens,
            "by_model": {"type": "object", "additionalProperties": object(json!({"tokens": tokens, "runs": tokens}), &["tokens", "runs"])},
            "by_caller": object(json!({"lead_agent": tokens, "subagent": tokens, "middleware": tokens}), &["lead_agent", "subagent", "middleware"]),
            "context_usage": {"type": ["object", "null"], "properties": {"token_count": tokens,
                "max_context_tokens": {"type": ["integer", "null"]}, "percentage": {"type": ["number", "null"]}}},
            "cost": schema_ref("Cost"),
            "stopped_runs": {"description": "Runs that ended interrupted or timeout: never counted above, but their tokens were spent",
                "type": "object", "properties": {"runs": tokens, "total_tokens": tokens, "total_input_tokens": tokens,
                "total_output_tokens": tokens,
                "by_caller": object(json!({"lead_agent": tokens, "subagent": tokens, "middleware": tokens}), &["lead_agent", "subagent", "middleware"]),
                "cost": schema_ref("Cost")},
                "required": ["runs", "total_tokens", "total_input_tokens", "total_output_tokens", "by_caller", "cost"]},
            "batches": {"type": "object", "description": "Batch items' spend, outside every total above (SPEC §12.12)",
                "properties": {"items": tokens, "total_tokens": tokens, "cost": schema_ref("Cost")},
                "required": ["items", "total_tokens", "cost"]}}),
            &["thread_id", "total_tokens", "total_input_tokens", "total_output_tokens", "total_runs", "by_model", "by_caller", "stopped_runs", "batches"]),
        "Cost": {"type": ["object", "null"], "properties": {"currency": string, "total": {"type": "number"},
            "by_model": {"type": "object", "additionalProperties": {"type": "number"}}}},
    })
}

/// The whole document.
pub fn document() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        let mut paths = Map::new();
        for op in OPERATIONS {
            let entry = paths
                .entry(op.path.to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
            entry[op.method] = operation(op);
        }
        json!({
            "openapi": "3.1.0",
            "info": {"title": "subflow", "version": env!("CARGO_PKG_VERSION"),
                "description": "LangGraph-compatible runs API with subagent task events, run events and token usage. In token mode every route except /health and this document needs `Authorization: Bearer sf_…`."},
            "paths": paths,
            "components": {
                "schemas": schemas(),
                "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            },
            "security": [{"bearer": []}],
        })
    })
}

/// `GET /api/openapi.json`.
pub async fn get() -> Json<&'static Value> {
    Json(document())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs<'a>(value: &'a Value, found: &mut Vec<&'a str>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    found.push(target);
                }
                map.values().for_each(|v| refs(v, found));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, found)),
            _ => {}
        }
    }

    #[test]
    fn every_reference_resolves_to_a_schema() {
        let document = document();
        let mut found = Vec::new();
        refs(document, &mut found);
        assert!(found.len() > 20);
        for target in found {
            let name = target.strip_prefix("#/components/schemas/").unwrap();
            assert!(
                document["components"]["schemas"].get(name).is_some(),
                "{target} does not resolve"
            );
        }
    }

    /// Every `.route("…", method(…))` in the router is described, and every described
    /// operation is routed.
    #[test]
    fn the_document_and_the_router_list_the_same_operations() {
        let source = include_str!("lib.rs");
        let mut routed = Vec::new();
        for chunk in source.split(".route(").skip(1) {
            let path = chunk.split('"').nth(1).unwrap();
            let call = &chunk[..chunk.find("\n        .").unwrap_or(chunk.len())];
            for method in ["get", "post", "delete"] {
                if call.contains(&format!("{method}(")) {
                    routed.push(format!("{method} {path}"));
                }
            }
        }
        routed.sort();
        let mut described: Vec<String> = OPERATIONS
            .iter()
            .map(|op| format!("{} {}", op.method, op.path))
            .collect();
        described.sort();
        assert_eq!(described, routed);
    }
}
