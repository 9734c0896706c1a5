//! The embedded web workspace (docs/configuration.md#subagents-and-tools): the files of `web/assets`, compiled into the
//! binary (debug builds too), served at `/` and for every path outside `/api`, `/metrics`
//! and `/health`. A path that names no file gets `index.html`, so the workspace's own
//! paths (`/threads/<id>`) survive a reload.
//!
//! The pages are public: the workspace sends its token with the API calls it makes.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use crate::AppState;

/// The workspace's files.
#[derive(rust_embed::Embed)]
#[folder = "../../web/assets"]
struct Assets;

/// The page every unknown path gets.
const INDEX: &str = "index.html";

/// What the pages may load: only this origin's scripts, styles and API, no inline script.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     frame-ancestors 'none'; form-action 'self'";

/// Paths the workspace never answers: they belong to the API, metrics and health routes.
fn is_reserved(path: &str) -> bool {
    ["/api", "/metrics", "/health"].iter().any(|prefix| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// The `Content-Type` of a file, by its extension.
fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, extension)| extension) {
        Some("html") => "text/html; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("json") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("txt") => "text/plain; charset=utf-8",
        Some("webmanifest") => "application/manifest+json",
        _ => "application/octet-stream",
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut text, byte| {
        // Writing to a String cannot fail.
        let _ = write!(text, "{byte:02x}");
        text
    })
}

/// The router's fallback: a workspace file, `index.html`, or the API's 404.
pub async fn fallback(
    State(state): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let path = uri.path();
    let readable = method == Method::GET || method == Method::HEAD;
    if !state.web_enabled || is_reserved(path) || !readable {
        return crate::routes::not_found().await.into_response();
    }
    let requested = path.trim_start_matches('/');
    let (name, file) = match Assets::get(requested).filter(|_| !requested.is_empty()) {
        Some(file) => (requested, file),
        None => match Assets::get(INDEX) {
            Some(file) => (INDEX, file),
            None => return crate::routes::not_found().await.into_response(),
        },
    };
    let etag = format!("\"{}\"", hex(&file.metadata.sha256_hash()));
    let mut response = if headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|tags| tags.as_bytes() == etag.as_bytes())
    {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut response = Response::new(Body::from(file.data.into_owned()));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(name)),
        );
        response
    };
    let response_headers = response.headers_mut();
    // Names are stable, so every use revalidates; an unchanged file costs a 304.
    response_headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(value) = HeaderValue::from_str(&etag) {
        response_headers.insert(header::ETAG, value);
    }
    response_headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if name == INDEX {
        response_headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        );
        response_headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_metrics_and_health_paths_are_reserved_but_look_alikes_are_not() {
        for path in ["/api", "/api/threads", "/metrics", "/health", "/health/x"] {
            assert!(is_reserved(path), "{path}");
        }
        for path in ["/", "/apis", "/threads/api", "/healthy", "/app.mjs"] {
            assert!(!is_reserved(path), "{path}");
        }
    }

    #[test]
    fn modules_are_javascript_and_unknown_files_are_bytes() {
        assert_eq!(content_type("cards.mjs"), "text/javascript; charset=utf-8");
        assert_eq!(content_type("index.html"), "text/html; charset=utf-8");
        assert_eq!(content_type("style.css"), "text/css; charset=utf-8");
        assert_eq!(content_type("blob"), "application/octet-stream");
    }

    #[test]
    fn the_index_and_the_card_rules_are_embedded() {
        assert!(Assets::get(INDEX).is_some());
        assert!(Assets::get("cards.mjs").is_some());
        // Only the served files: tests and their node_modules stay out of the binary.
        assert!(Assets::iter().all(|name| !name.contains("node_modules")));
    }
}
