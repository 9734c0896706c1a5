//! The one place where failures become HTTP status codes and `{"detail": ...}` bodies.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A failed request.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 401: no caller could be authenticated (docs/api.md#auth-and-ownership).
    #[error("Authentication required")]
    Unauthorized,
    /// 403.
    #[error("{0}")]
    Forbidden(String),
    /// 404.
    #[error("{0}")]
    NotFound(String),
    /// 405: the route exists, but not for this method.
    #[error("Method Not Allowed")]
    MethodNotAllowed,
    /// 408: the request body did not arrive in time (`server.body_timeout_seconds`).
    #[error("{0}")]
    Timeout(String),
    /// 409.
    #[error("{0}")]
    Conflict(String),
    /// 413: the body is over the limit.
    #[error("{0}")]
    TooLarge(String),
    /// 422: the request is well-formed JSON but not acceptable.
    #[error("{0}")]
    Unprocessable(String),
    /// 503: storage is not available.
    #[error("{0}")]
    Unavailable(String),
    /// 504: a wait the caller bounded (`timeout`) ended before the run did.
    #[error("{0}")]
    WaitElapsed(String),
}

/// 404 `Thread {thread_id} not found`: an unknown thread, or another user's.
pub fn thread_not_found(thread_id: &str) -> ApiError {
    ApiError::NotFound(format!("Thread {thread_id} not found"))
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::WaitElapsed(_) => StatusCode::GATEWAY_TIMEOUT,
        }
    }
}

impl From<subflow_store::Error> for ApiError {
    fn from(error: subflow_store::Error) -> Self {
        if error.is_invalid_input() {
            ApiError::Unprocessable(error.to_string())
        } else {
            tracing::error!(%error, "store call failed");
            ApiError::Unavailable("Run event store not available".to_owned())
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response =
            (self.status(), Json(json!({"detail": self.to_string()}))).into_response();
        if matches!(self, ApiError::Unauthorized) {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}
