//! What every list route shares: a documented maximum `limit` (422 above it, and below
//! 1), and JSON arrays written item by item, so a list of whole thread states never sits
//! in memory at once.

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::Serialize;

use crate::ApiError;

/// `GET …/runs`: run records, up to 100 per page.
pub const RUNS_MAX_LIMIT: u32 = 100;

/// `POST /api/threads/search`: threads with their latest values, streamed.
pub const SEARCH_MAX_LIMIT: u32 = 1000;

/// `…/history`: whole thread states, streamed. 1000 is what LangGraph clients ask for
/// when they want a thread's whole history.
pub const HISTORY_MAX_LIMIT: u32 = 1000;

/// `limit`, or `default` when absent; outside `1..=max` is 422.
pub fn limit(value: Option<u32>, default: u32, max: u32) -> Result<u32, ApiError> {
    let limit = value.unwrap_or(default);
    if (1..=max).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::Unprocessable(format!(
            "limit must be between 1 and {max}, got {limit}"
        )))
    }
}

/// A 200 JSON array of `items`, serialised one at a time as the client reads them: the
/// server holds one item (and whatever page the stream has fetched) at a time, whatever
/// the array's length. The first item is awaited before answering, so a failing store is
/// a 503 with a body; a failure after that is logged and cuts the body short (the client
/// sees a truncated array, never a complete-looking wrong one).
pub async fn json_array<S, T>(items: S) -> Result<Response, ApiError>
where
    S: Stream<Item = Result<T, ApiError>> + Send + 'static,
    T: Serialize + Send + 'static,
{
    let mut items = Box::pin(items);
    let first = items.next().await.transpose()?;
    let Some(first) = first else {
        return Ok(([(header::CONTENT_TYPE, "application/json")], "[]").into_response());
    };
    let head = futures::stream::once(async move { Ok(element(b'[', &first)) });
    let rest = items.map(|item| match item {
        Ok(value) => Ok(element(b',', &value)),
        Err(error) => {
            tracing::error!(%error, "a streamed list failed part way; its body is cut short");
            Err(std::io::Error::other(error.to_string()))
        }
    });
    let tail = futures::stream::once(async { Ok(Bytes::from_static(b"]")) });
    let body = Body::from_stream(head.chain(rest).chain(tail));
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `value` serialised after `separator`.
fn element<T: Serialize>(separator: u8, value: &T) -> Bytes {
    let mut bytes = vec![separator];
    // The API's bodies are plain data (string keys, finite numbers), which always serialise.
    serde_json::to_writer(&mut bytes, value).expect("an API body always serialises");
    Bytes::from(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_outside_their_range_are_a_422() {
        assert_eq!(limit(None, 10, 100).unwrap(), 10);
        assert_eq!(limit(Some(100), 10, 100).unwrap(), 100);
        for bad in [0, 101, u32::MAX] {
            let Err(ApiError::Unprocessable(detail)) = limit(Some(bad), 10, 100) else {
                panic!("{bad} is a 422")
            };
            assert_eq!(
                detail,
                format!("limit must be between 1 and 100, got {bad}")
            );
        }
    }
}
