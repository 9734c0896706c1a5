//! Route handlers, one module per resource.

pub mod batches;
pub mod events;
pub mod runs;
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

/// `GET /api/models` (SPEC §7.5).
pub async fn models(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"models": state.models, "token_usage": {"enabled": state.token_usage_enabled}}))
}

/// The one assistant (SPEC §2.1).
fn assistant() -> Value {
    json!({"assistant_id": "lead_agent", "graph_id": "lead_agent", "name": "lead_agent", "config": {}, "metadata": {}})
}

/// `GET /api/assistants/lead_agent`.
pub async fn get_assistant() -> Json<Value> {
    Json(assistant())
}

/// `POST /api/assistants/search`.
pub async fn search_assistants() -> Json<Value> {
    Json(json!([assistant()]))
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
