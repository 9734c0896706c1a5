//! `GET /api/openapi.json`: the OpenAPI 3.1 document, generated from the handlers. Each
//! handler's `#[utoipa::path]` gives its path, parameters (its own path and query types),
//! body and responses (its own body types, from `subflow_contracts::api`); the router
//! registers handlers through `utoipa_axum::routes!`, so whatever is routed is
//! described. What the layers around every handler answer is added here, once, from
//! what the operation declares: 401 and the bearer requirement where `auth` applies (token
//! mode), 403 where a permission (`x-subflow-permission`) or the Origin check applies, 408
//! and 413 for bodies and 503 where the store is read.

use std::sync::OnceLock;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};
use subflow_contracts::api::runs::InputMessage;
use subflow_contracts::api::threads::IfExists;
use subflow_contracts::api::{
    CancelAction, DisconnectAction, ErrorBody, MultitaskStrategy, StateValues, StreamMode,
};
use subflow_contracts::{BatchItemStatus, EventCategory, EventType, RunStatus, ThreadStatus};
use utoipa::OpenApi;

use crate::{AppState, AuthMode};

/// The document's fixed parts; the paths come from the router.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "subflow",
        description = "LangGraph-compatible runs API with subagent task events, run events, token usage and durable batches. In token mode every route except /health and this document needs `Authorization: Bearer sf_…`; every error is `{\"detail\": …}`."
    ),
    // Schemas that operations name only through a `value_type` or a hand-built schema,
    // which utoipa does not collect by itself.
    components(schemas(
        ErrorBody, StreamMode, CancelAction, DisconnectAction, MultitaskStrategy, IfExists,
        RunStatus, ThreadStatus, BatchItemStatus, EventType, EventCategory, StateValues,
        InputMessage
    ))
)]
pub(crate) struct ApiDoc;

/// `GET /api/openapi.json`: this document, as this server authenticates.
#[utoipa::path(get, path = "/api/openapi.json", tag = "server",
    responses((status = 200, description = "This document", body = Object)))]
pub async fn get(State(state): State<AppState>) -> Json<&'static Value> {
    Json(document(state.auth, state.metrics_public))
}

/// The document for an auth mode and `metrics.public`, built once per combination.
pub fn document(auth: AuthMode, metrics_public: bool) -> &'static Value {
    static DOCUMENTS: [OnceLock<Value>; 4] = [const { OnceLock::new() }; 4];
    let index = usize::from(auth == AuthMode::Token) * 2 + usize::from(metrics_public);
    DOCUMENTS[index].get_or_init(|| {
        let (_, api) = crate::api_router().split_for_parts();
        let mut document = serde_json::to_value(api).unwrap_or_default();
        complete(&mut document, auth, metrics_public);
        document
    })
}

/// Whether `auth::authenticate` (or, for `/metrics`, the route itself) asks for a caller.
fn authenticated(path: &str, metrics_public: bool) -> bool {
    if path == "/metrics" {
        return !metrics_public;
    }
    crate::auth::requires_auth(path)
}

fn error(description: &str) -> Value {
    json!({"description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}})
}

/// Adds what the layers answer to every operation, and the security requirements.
fn complete(document: &mut Value, auth: AuthMode, metrics_public: bool) {
    document["openapi"] = json!("3.1.0");
    document["components"]["securitySchemes"] =
        json!({"bearer": {"type": "http", "scheme": "bearer"}});
    let Some(paths) = document["paths"].as_object_mut() else {
        return;
    };
    for (path, operations) in paths.iter_mut() {
        let Some(operations) = operations.as_object_mut() else {
            continue;
        };
        for (method, operation) in operations.iter_mut() {
            let secured = auth == AuthMode::Token && authenticated(path, metrics_public);
            if secured {
                operation["security"] = json!([{"bearer": []}]);
                let responses = &mut operation["responses"];
                responses["401"] = error("Authentication required");
                // The token is looked up in the store.
                if responses.get("503").is_none() {
                    responses["503"] = error("Run event store not available");
                }
            } else {
                operation["security"] = json!([]);
            }
            let permission = operation
                .get("x-subflow-permission")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let changes_state = !matches!(method.as_str(), "get" | "head" | "options");
            let refusals: Vec<String> = [
                permission
                    .filter(|_| secured)
                    .map(|p| format!("Permission denied: {p}")),
                (changes_state && auth == AuthMode::Local && path.starts_with("/api/"))
                    .then(|| "Cross-origin request refused (an Origin that is neither this server's nor in server.cors_origins)".to_owned()),
            ]
            .into_iter()
            .flatten()
            .collect();
            let responses = &mut operation["responses"];
            if !refusals.is_empty() && responses.get("403").is_none() {
                responses["403"] = error(&refusals.join("; or "));
            }
            if path.contains("{thread_id}") && responses.get("422").is_none() {
                responses["422"] = error(
                    "Invalid thread_id: expected 1-64 characters from A-Z, a-z, 0-9, '_' and '-'",
                );
            }
            if path.starts_with("/api/threads") && responses.get("503").is_none() {
                responses["503"] = error("Run event store not available");
            }
            if operation.get("requestBody").is_some() {
                operation["responses"]["408"] =
                    error("Request body timed out (server.body_timeout_seconds)");
                operation["responses"]["413"] = error("Request body too large: the limit is 1 MiB");
                operation["requestBody"]["required"] = json!(false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every JSON object within `value`, itself included.
    fn objects<'a>(value: &'a Value, found: &mut Vec<&'a serde_json::Map<String, Value>>) {
        match value {
            Value::Object(map) => {
                found.push(map);
                map.values().for_each(|v| objects(v, found));
            }
            Value::Array(items) => items.iter().for_each(|v| objects(v, found)),
            _ => {}
        }
    }

    fn refs<'a>(value: &'a Value, found: &mut Vec<&'a str>) {
        let mut all = Vec::new();
        objects(value, &mut all);
        found.extend(all.iter().filter_map(|map| map.get("$ref")?.as_str()));
    }

    #[test]
    fn integer_formats_hold_their_bounds() {
        // A client (schemathesis among them) takes `format: int32` as a bound of its own:
        // an offset up to u32::MAX described as int32 would be refused there.
        let document = document(AuthMode::Local, false);
        let mut all = Vec::new();
        objects(document, &mut all);
        let int32: Vec<_> = all
            .iter()
            .filter(|map| map.get("format") == Some(&json!("int32")))
            .collect();
        assert!(int32.len() > 5);
        for schema in int32 {
            let maximum = schema.get("maximum").and_then(Value::as_i64);
            assert!(
                maximum.is_none_or(|m| m <= i64::from(i32::MAX)),
                "{schema:?} is int32 with a larger maximum"
            );
        }
    }

    #[test]
    fn every_reference_resolves_to_a_schema() {
        for (auth, public) in [(AuthMode::Local, false), (AuthMode::Token, true)] {
            let document = document(auth, public);
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
    }

    #[test]
    fn every_operation_answers_errors_as_error_bodies_and_has_a_summary() {
        let document = document(AuthMode::Token, false);
        for (path, operations) in document["paths"].as_object().unwrap() {
            for (method, operation) in operations.as_object().unwrap() {
                assert!(operation["summary"].is_string(), "{method} {path}");
                for (status, response) in operation["responses"].as_object().unwrap() {
                    if status.starts_with('4') || status.starts_with('5') {
                        assert_eq!(
                            response.pointer("/content/application~1json/schema/$ref"),
                            Some(&json!("#/components/schemas/ErrorBody")),
                            "{method} {path} {status}"
                        );
                    }
                }
            }
        }
    }

    /// Whether `value` is valid for the document's schema `name`, whose references are
    /// rewritten to `$defs` so the components resolve within one JSON Schema.
    fn document_accepts(name: &str, value: &Value) -> bool {
        let document = document(AuthMode::Local, false);
        let text = serde_json::to_string(&json!({
            "$ref": format!("#/components/schemas/{name}"),
            "$defs": document["components"]["schemas"],
        }))
        .unwrap()
        .replace("#/components/schemas/", "#/$defs/");
        jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&serde_json::from_str(&text).unwrap())
            .unwrap()
            .is_valid(value)
    }

    /// The document and the server agree on `body`, and `expect` says which way.
    fn check(name: &str, body: Value, server_accepts: fn(&Value) -> bool, expect: bool) {
        assert_eq!(
            document_accepts(name, &body),
            expect,
            "the document on {name} {body}"
        );
        assert_eq!(server_accepts(&body), expect, "the server on {name} {body}");
    }

    fn parses<T: serde::de::DeserializeOwned>(body: &Value) -> Option<T> {
        let bytes = Ok(axum::body::Bytes::from(body.to_string()));
        crate::routes::parse_body::<T>(&bytes).ok()
    }

    #[test]
    fn request_bodies_the_document_allows_are_the_ones_the_server_takes() {
        use crate::routes::paging::{HISTORY_MAX_LIMIT, SEARCH_MAX_LIMIT, limit};
        use subflow_contracts::api::{HistoryRequest, RunRequest, ThreadSearch};
        let search = |b: &Value| {
            parses::<ThreadSearch>(b).is_some_and(|r| limit(r.limit, 10, SEARCH_MAX_LIMIT).is_ok())
        };
        let history = |b: &Value| {
            parses::<HistoryRequest>(b).is_some_and(|r| {
                limit(r.limit, 10, HISTORY_MAX_LIMIT).is_ok()
                    && crate::routes::threads::before_checkpoint(r.before.as_ref()).is_ok()
            })
        };
        let run = |b: &Value| parses::<RunRequest>(b).is_some_and(crate::routes::runs::accepts);
        for (body, expect) in [
            (json!({}), true),
            (json!({"limit": 1000, "offset": 4_294_967_295_u64}), true),
            (json!({"limit": 10.0}), true),
            (json!({"limit": 10.5}), false),
            (json!({"limit": 0}), false),
            (json!({"limit": 1001}), false),
            (json!({"limit": -1}), false),
            (json!({"offset": 4_294_967_296_u64}), false),
            (json!([null]), false),
        ] {
            check("ThreadSearch", body, search, expect);
        }
        for (body, expect) in [
            (json!({"limit": 1, "before": null}), true),
            (json!({"limit": 2_147_483_648_u64}), false),
            (json!({"before": "c1"}), true),
            (
                json!({"before": {"configurable": {"checkpoint_id": "c1"}}}),
                true,
            ),
            (json!({"before": []}), false),
            (json!({"before": 5}), false),
            (json!({"limit": 4_294_967_296_u64}), false),
        ] {
            check("HistoryRequest", body, history, expect);
        }
        for (body, expect) in [
            (
                json!({"assistant_id": "lead_agent", "webhook": null, "checkpoint": null}),
                true,
            ),
            (
                json!({"input": {"messages": [{"role": "user", "content": "hi"}]}}),
                true,
            ),
            (json!({"webhook": {}}), false),
            (json!({"interrupt_before": -1.2}), false),
            (json!({"feedback_keys": "[x]"}), false),
            (json!([null, null]), false),
        ] {
            check("RunRequest", body, run, expect);
        }
    }

    #[test]
    fn run_events_document_every_event_type_the_catalogue_has() {
        let event = |event_type: &str| {
            json!({"thread_id": "t", "run_id": "r", "seq": 1, "event_type": event_type,
                "category": "middleware", "content": {}, "metadata": {},
                "created_at": "2026-01-01T00:00:00Z", "event_id": "01a2349d-e3f8-7494-81ca-28a7788e4988"})
        };
        for (event_type, expect) in [
            ("run.start", true),
            ("middleware:loop_detection", true),
            ("middleware:a", true),
            ("middleware:", false),
            ("middleware:tag_of_twenty_two_chars", false),
            ("run.begin", false),
        ] {
            assert_eq!(
                document_accepts("RunEvent", &event(event_type)),
                expect,
                "{event_type}"
            );
        }
    }

    #[test]
    fn token_mode_secures_what_local_mode_leaves_open() {
        let token = document(AuthMode::Token, false);
        let local = document(AuthMode::Local, false);
        let models = "/paths/~1api~1models/get";
        assert_eq!(
            token.pointer(&format!("{models}/security")),
            Some(&json!([{"bearer": []}]))
        );
        assert!(token.pointer(&format!("{models}/responses/401")).is_some());
        assert_eq!(
            local.pointer(&format!("{models}/security")),
            Some(&json!([]))
        );
        assert!(local.pointer(&format!("{models}/responses/401")).is_none());
        let metrics = "/paths/~1metrics/get/security";
        assert_eq!(token.pointer(metrics), Some(&json!([{"bearer": []}])));
        assert_eq!(
            document(AuthMode::Token, true).pointer(metrics),
            Some(&json!([]))
        );
    }
}
