//! Path and query extractors whose rejections are the API's own errors: a parameter that
//! does not parse (`?limit=abc`, `?wait=maybe`, a repeated parameter, a path segment
//! that is not UTF-8) is 422 `{"detail": ...}` like every other bad input, never axum's
//! plain-text 400. Handlers take these instead of `axum::extract::{Path, Query}`.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::ApiError;

/// The query string deserialised into `T`; unknown keys are ignored, a repeated or
/// malformed one is 422.
#[derive(Debug, Clone, Copy, Default)]
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Query(value)),
            Err(rejection) => Err(ApiError::Unprocessable(format!(
                "Invalid query: {}",
                rejection.body_text()
            ))),
        }
    }
}

/// The path parameters deserialised into `T`; one that cannot be decoded is 422.
#[derive(Debug, Clone, Copy, Default)]
pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(rejection) => Err(ApiError::Unprocessable(format!(
                "Invalid path: {}",
                rejection.body_text()
            ))),
        }
    }
}

/// 405 for a route that exists without the request's method (axum adds `Allow`).
pub async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
