//! Path and query extractors whose rejections are the API's own errors: a parameter that
//! does not parse (`?limit=abc`, `?wait=maybe`, a repeated parameter, a path segment
//! that is not UTF-8) is 422 `{"detail": ...}` like every other bad input, never axum's
//! plain-text 400. Handlers take these instead of `axum::extract::{Path, Query}`.

use std::borrow::Cow;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use subflow_contracts::api::CancelAction;
use subflow_contracts::{BatchItemStatus, BatchStatus, RunStatus};

use crate::ApiError;

/// The query string deserialised into `T`; unknown keys are ignored, a repeated or
/// malformed one is 422.
///
/// One rule for every route: a typed parameter (a number, a boolean, an enum) is a field
/// read with [`value`], so an empty or unknown value of it is a 422 whose detail names
/// the parameter, whichever route it is on. Plain text parameters stay `Option<String>`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let raw = parts.uri.query().unwrap_or_default();
        let pairs = serde_urlencoded::Deserializer::new(form_urlencoded::parse(raw.as_bytes()));
        serde_path_to_error::deserialize(pairs)
            .map(Query)
            .map_err(|error| {
                let name = error.path().to_string();
                ApiError::Unprocessable(detail(&name, &error.into_inner().to_string()))
            })
    }
}

/// Where a [`QueryValue`]'s refusal puts the parameter's name.
const NAME: &str = "{param}";

/// What [`value`] puts before a [`QueryValue`] refusal on its way through serde, so that
/// [`detail`] tells it from serde's own messages (which never hold a NUL).
const REFUSAL: char = '\0';

/// The 422 detail of a refused parameter: a [`QueryValue`] refusal with the name put in,
/// else the deserialiser's own words (a repeated key) behind the name.
fn detail(name: &str, message: &str) -> String {
    if let Some(refusal) = message.strip_prefix(REFUSAL) {
        refusal.replacen(NAME, name, 1)
    } else if name.is_empty() || name == "." {
        format!("Invalid query: {message}")
    } else {
        format!("Invalid query parameter '{name}': {message}")
    }
}

/// A type a query parameter is read as. A refusal is the whole 422 detail, with
/// `{param}` where the parameter's name goes.
pub trait QueryValue: Sized {
    fn parse(text: &str) -> Result<Self, String>;
}

impl QueryValue for u32 {
    fn parse(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|_| format!("{NAME} must be a non-negative integer, got '{text}'"))
    }
}

impl QueryValue for i64 {
    fn parse(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|_| format!("{NAME} must be an integer, got '{text}'"))
    }
}

/// `true|false|1|0`: the SDKs send `1`/`0`, schema-driven clients `true`/`false`
/// (`True`/`False`, Python's spelling, too).
impl QueryValue for bool {
    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "true" | "True" | "1" => Ok(true),
            "false" | "False" | "0" => Ok(false),
            other => Err(format!("{NAME} must be true, false, 1 or 0, got '{other}'")),
        }
    }
}

/// A closed set of wire strings: anything else, the empty string included, is refused
/// with the set listed.
macro_rules! enum_value {
    ($($kind:ty),+) => {$(
        impl QueryValue for $kind {
            fn parse(text: &str) -> Result<Self, String> {
                text.parse().map_err(|_| {
                    let names: Vec<&str> = <$kind>::ALL.iter().map(|v| v.as_str()).collect();
                    format!("{NAME} must be one of {}, got '{text}'", names.join(", "))
                })
            }
        }
    )+};
}

enum_value!(RunStatus, CancelAction, BatchStatus);

/// 422 of an unknown batch item `status` filter.
pub const UNKNOWN_STATUS: &str = "Unknown batch item status";

/// The batch item filter keeps its fixed text ([`UNKNOWN_STATUS`]).
impl QueryValue for BatchItemStatus {
    fn parse(text: &str) -> Result<Self, String> {
        text.parse().map_err(|_| UNKNOWN_STATUS.to_owned())
    }
}

/// `#[serde(default, deserialize_with = "value")]` on an `Option<T>` query field.
pub fn value<'de, D: Deserializer<'de>, T: QueryValue>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    let text = <Cow<'de, str>>::deserialize(deserializer)?;
    T::parse(&text)
        .map(Some)
        .map_err(|refusal| serde::de::Error::custom(format!("{REFUSAL}{refusal}")))
}

/// One parameter of a query a route reads by hand (repeated keys), by the same rule.
pub fn parse_value<T: QueryValue>(name: &str, text: &str) -> Result<T, ApiError> {
    T::parse(text).map_err(|refusal| ApiError::Unprocessable(refusal.replacen(NAME, name, 1)))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal<T: QueryValue + std::fmt::Debug>(name: &str, text: &str) -> String {
        match parse_value::<T>(name, text) {
            Err(ApiError::Unprocessable(detail)) => detail,
            other => panic!("{text} is a 422, got {other:?}"),
        }
    }

    #[test]
    fn every_typed_value_refuses_empty_and_wrong_text_naming_the_parameter() {
        assert_eq!(parse_value::<u32>("offset", "7").unwrap(), 7);
        for bad in ["-1", "abc", "1.5", "", "99999999999"] {
            assert_eq!(
                refusal::<u32>("offset", bad),
                format!("offset must be a non-negative integer, got '{bad}'")
            );
        }
        assert_eq!(parse_value::<i64>("after_seq", "-3").unwrap(), -3);
        assert_eq!(
            refusal::<i64>("after_seq", ""),
            "after_seq must be an integer, got ''"
        );
        for (text, flag) in [("true", true), ("1", true), ("false", false), ("0", false)] {
            assert_eq!(parse_value::<bool>("wait", text).unwrap(), flag, "{text}");
        }
        for bad in ["", "yes", "2"] {
            assert_eq!(
                refusal::<bool>("wait", bad),
                format!("wait must be true, false, 1 or 0, got '{bad}'")
            );
        }
        assert_eq!(
            parse_value::<RunStatus>("status", "success").unwrap(),
            RunStatus::Success
        );
        let detail = refusal::<RunStatus>("status", "");
        assert!(
            detail.starts_with("status must be one of pending, running,"),
            "{detail}"
        );
        assert_eq!(
            refusal::<BatchItemStatus>("status", "done"),
            "Unknown batch item status"
        );
        // A value that spells the placeholder is quoted, not substituted.
        assert_eq!(
            refusal::<u32>("limit", "{param}"),
            "limit must be a non-negative integer, got '{param}'"
        );
    }

    #[derive(Debug, serde::Deserialize)]
    struct Params {
        #[serde(default, deserialize_with = "value")]
        limit: Option<u32>,
        #[serde(default, deserialize_with = "value")]
        wait: Option<bool>,
        #[allow(dead_code)]
        text: Option<String>,
    }

    async fn query(uri: &str) -> Result<Params, String> {
        let request = axum::http::Request::get(uri).body(()).unwrap();
        let (mut parts, ()) = request.into_parts();
        match Query::<Params>::from_request_parts(&mut parts, &()).await {
            Ok(Query(params)) => Ok(params),
            Err(ApiError::Unprocessable(detail)) => Err(detail),
            Err(other) => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn the_extractor_names_the_parameter_and_ignores_unknown_keys() {
        let params = query("/x?limit=5&wait=1&text=&other=").await.unwrap();
        assert_eq!((params.limit, params.wait), (Some(5), Some(true)));
        let params = query("/x").await.unwrap();
        assert_eq!((params.limit, params.wait), (None, None));
        assert_eq!(
            query("/x?wait=").await.unwrap_err(),
            "wait must be true, false, 1 or 0, got ''"
        );
        assert_eq!(
            query("/x?limit=%31%32x").await.unwrap_err(),
            "limit must be a non-negative integer, got '12x'"
        );
        let repeated = query("/x?limit=1&limit=2").await.unwrap_err();
        assert!(repeated.contains("limit"), "{repeated}");
    }
}
