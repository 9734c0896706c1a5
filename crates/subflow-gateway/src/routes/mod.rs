//! Route handlers, one module per resource, each annotated with its OpenAPI operation
//! (`#[utoipa::path]`): the router registers handlers through `utoipa_axum::routes!`, so
//! a routed handler is a documented one. The path and query types here are what the
//! handlers extract, and what the document's parameters are generated from.

pub mod account;
pub mod assistants;
pub mod batches;
pub mod events;
pub mod messages;
pub mod paging;
pub mod runs;
pub mod tasks;
pub mod threads;
pub mod token_usage;
pub mod usage;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use subflow_contracts::api::meta::{
    InfoFlags, InfoHost, ModelListing, ModelPricing, PricedModel, TokenUsageShown,
};
use subflow_contracts::api::{Health, Info, Models};
use subflow_contracts::ids::is_valid_thread_id;
use utoipa::IntoParams;

use crate::{ApiError, AppState};

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Largest accepted batch submission (`POST …/subagent-batches`): a whole file of items.
pub const MAX_BATCH_BODY_BYTES: usize = 64 * 1024 * 1024;

/// `{thread_id}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ThreadPath {
    /// A thread id; another user's thread is 404.
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub thread_id: String,
}

/// `{thread_id}/runs/{run_id}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct RunPath {
    /// A thread id; another user's thread is 404.
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub thread_id: String,
    /// A run of that thread.
    pub run_id: String,
}

/// `GET /health`, without auth.
#[utoipa::path(get, path = "/health", tag = "server", security(()),
    responses((status = 200, description = "The process serves", body = Health)))]
pub async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".to_owned(),
    })
}

/// `GET /api/models` (docs/api.md#token-usage-and-models), each model with its `pricing`.
#[utoipa::path(get, path = "/api/models", tag = "server",
    responses((status = 200, description = "The configured models, the default first, with their prices", body = Models)))]
pub async fn models(State(state): State<AppState>) -> Json<Models> {
    let models = state
        .models
        .iter()
        .map(|listing| PricedModel {
            id: listing.name.clone(),
            listing: ModelListing {
                display_name: Some(
                    listing
                        .display_name
                        .clone()
                        .unwrap_or_else(|| listing.name.clone()),
                ),
                ..listing.clone()
            },
            pricing: state
                .model_facts
                .iter()
                .find(|facts| facts.name == listing.name)
                .and_then(|facts| facts.pricing.as_ref())
                .map(|price| ModelPricing {
                    currency: price.currency.to_uppercase(),
                    input_per_million: price.input_per_million,
                    output_per_million: price.output_per_million,
                    input_cache_hit_per_million: price.input_cache_hit_per_million,
                    input_cache_write_per_million: price.input_cache_write_per_million,
                }),
        })
        .collect();
    Json(Models {
        models,
        token_usage: TokenUsageShown {
            enabled: state.token_usage_enabled,
        },
    })
}

/// `GET /api/info`: what LangGraph servers answer — the version and the flags of what
/// this server supports — for the SDKs and LangGraph tooling that probe it. LangGraph's
/// own flags first (read-only assistants; no crons, no LangSmith), then subflow's:
/// every stream is resumable (docs/api.md#resume-and-rejoin), and whether token usage is shown (docs/api.md#token-usage-and-models).
#[utoipa::path(get, path = "/api/info", tag = "server",
    responses((status = 200, description = "The version and the supported features", body = Info)))]
pub async fn info(State(state): State<AppState>) -> Json<Info> {
    Json(Info {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        flags: InfoFlags {
            assistants: true,
            crons: false,
            langsmith: false,
            langsmith_tracing_replicas: false,
            resumable_streams: true,
            token_usage: state.token_usage_enabled,
        },
        host: InfoHost {
            kind: "self-hosted".to_owned(),
            project_id: None,
            host_revision_id: None,
            revision_id: None,
            tenant_id: None,
        },
        metadata: serde_json::Map::new(),
    })
}

/// Unknown paths.
pub async fn not_found() -> ApiError {
    ApiError::NotFound("Not Found".to_owned())
}

/// Parses a JSON object body (an empty one reads as `{}`); malformed JSON (whitespace
/// alone included), anything but an object, wrong types and unknown fields are 422 with
/// a message that says what is wrong.
pub fn parse_body<T: DeserializeOwned>(
    body: &Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    parse_body_within(body, MAX_BODY_BYTES)
}

/// [`parse_body`] of a route whose body limit is `limit` bytes.
pub fn parse_body_within<T: DeserializeOwned>(
    body: &Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<T, ApiError> {
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(ApiError::TooLarge(format!(
                "Request body too large: the limit is {limit} bytes"
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
    // Only a body with nothing in it is absent: whitespace alone is not JSON.
    let text = if body.is_empty() {
        &b"{}"[..]
    } else {
        &body[..]
    };
    // serde reads a struct from a JSON array too, field by field; the bodies are objects.
    if text.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::Unprocessable(
            "Invalid request body: expected a JSON object".to_owned(),
        ));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Probe {
        limit: Option<u32>,
    }

    fn parse(body: &'static [u8]) -> Result<Probe, ApiError> {
        parse_body(&Ok(Bytes::from_static(body)))
    }

    #[test]
    fn an_empty_body_is_an_empty_object_and_whitespace_alone_is_no_json() {
        assert_eq!(parse(b"").unwrap(), Probe::default());
        assert_eq!(
            parse(b" {\"limit\": 3}\n").unwrap(),
            Probe { limit: Some(3) }
        );
        for body in [&b"\r"[..], b" \n", b"[]", b"{\"other\": 1}", b"{"] {
            assert!(
                matches!(
                    parse_body::<Probe>(&Ok(Bytes::from_static(body))),
                    Err(ApiError::Unprocessable(_))
                ),
                "{body:?} is 422"
            );
        }
    }
}
