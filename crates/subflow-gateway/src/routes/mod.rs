//! Route handlers, one module per resource.

pub mod assistants;
pub mod batches;
pub mod events;
pub mod paging;
pub mod runs;
pub mod tasks;
pub mod threads;
pub mod token_usage;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use subflow_contracts::ids::is_valid_thread_id;

use crate::{ApiError, AppState};

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// `GET /health`, without auth.
pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /api/models` (SPEC §7.5), each model with its `pricing` (additive: clients price
/// live usage, such as a running task card's, at the rates `/token-usage` uses).
pub async fn models(State(state): State<AppState>) -> Json<Value> {
    let models: Vec<Value> = state
        .models
        .iter()
        .map(|listing| {
            let mut model = json!(listing);
            let pricing = state
                .model_facts
                .iter()
                .find(|facts| facts.name == listing.name)
                .and_then(|facts| facts.pricing.as_ref())
                .map(|price| {
                    json!({"currency": price.currency.to_uppercase(), "input_per_million": price.input_per_million,
                           "output_per_million": price.output_per_million,
                           "input_cache_hit_per_million": price.input_cache_hit_per_million})
                });
            model["pricing"] = pricing.unwrap_or(Value::Null);
            model
        })
        .collect();
    Json(json!({"models": models, "token_usage": {"enabled": state.token_usage_enabled}}))
}

/// `GET /api/info`: what LangGraph servers answer — the version and the flags of what
/// this server supports — for the SDKs and LangGraph tooling that probe it. LangGraph's
/// own flags first (read-only assistants; no crons, no LangSmith), then subflow's:
/// every stream is resumable (SPEC §2.5), and whether token usage is shown (SPEC §7.5).
pub async fn info(State(state): State<AppState>) -> Json<Value> {
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "flags": {
            "assistants": true, "crons": false, "langsmith": false, "langsmith_tracing_replicas": false,
            "resumable_streams": true, "token_usage": state.token_usage_enabled,
        },
        "host": {"kind": "self-hosted", "project_id": null, "host_revision_id": null, "revision_id": null, "tenant_id": null},
        "metadata": {},
    }))
}

/// Unknown paths.
pub async fn not_found() -> ApiError {
    ApiError::NotFound("Not Found".to_owned())
}

/// Parses a JSON body; malformed JSON, wrong types and unknown fields are 422 with a
/// message that says what is wrong.
pub fn parse_body<T: DeserializeOwned>(
    body: &Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(ApiError::TooLarge(format!(
                "Request body too large: the limit is {MAX_BODY_BYTES} bytes"
            )));
        }
        Err(rejection) => {
            if let Some(timeout) = crate::server::timed_out(rejection) {
                return Err(ApiError::Timeout(format!(
                    "Request body timed out: {timeout}"
                )));
            }
            return Err(ApiError::Unprocessable(format!(
                "Invalid request body: {rejection}"
            )));
        }
    };
    let text = if body.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        &body[..]
    };
    serde_json::from_slice(text)
        .map_err(|error| ApiError::Unprocessable(format!("Invalid request body: {error}")))
}

/// Checks a path thread id (`^[A-Za-z0-9_-]{1,64}$`), else 422.
pub fn checked_thread_id(thread_id: &str) -> Result<&str, ApiError> {
    if is_valid_thread_id(thread_id) {
        Ok(thread_id)
    } else {
        Err(ApiError::Unprocessable(format!(
            "Invalid thread_id '{thread_id}': expected 1-64 characters from A-Z, a-z, 0-9, '_' and '-'"
        )))
    }
}
