//! The local-mode Origin check: a state-changing request whose `Origin` is neither the
//! gateway's own origin, nor a loopback origin (a page on this machine, or a local proxy
//! such as a Next.js dev server forwarding to the gateway), nor in `server.cors_origins`
//! is refused. In token
//! mode a browser never attaches the bearer token by itself, so there is nothing to
//! forge and no check.

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::auth::AuthMode;
use crate::{ApiError, AppState};

/// The middleware.
pub async fn refuse_cross_origin(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let changes_state = state.auth == AuthMode::Local
        && !matches!(
            *request.method(),
            Method::GET | Method::HEAD | Method::OPTIONS
        );
    if changes_state
        && let Some(origin) = request
            .headers()
            .get(header::ORIGIN)
            .and_then(|v| v.to_str().ok())
    {
        let own = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(|host| format!("http://{host}"));
        let allowed = own.as_deref() == Some(origin)
            || is_loopback(origin)
            || state.cors_origins.iter().any(|o| o == origin);
        if !allowed {
            return ApiError::Forbidden("Cross-origin request refused".to_owned()).into_response();
        }
    }
    next.run(request).await
}

/// `http://localhost[:port]`, `http://127.0.0.1[:port]` or `http://[::1][:port]`: local
/// mode already only listens on loopback, so a page of this machine is no stranger.
fn is_loopback(origin: &str) -> bool {
    let Some(rest) = origin.strip_prefix("http://") else {
        return false;
    };
    let host = match rest.strip_prefix("[::1]") {
        Some(port) => return port_only(port),
        None => rest.split_once(':').map_or(rest, |(host, _)| host),
    };
    matches!(host, "localhost" | "127.0.0.1") && port_only(&rest[host.len()..])
}

/// Nothing, or `:` and a port number.
fn port_only(rest: &str) -> bool {
    rest.is_empty()
        || rest
            .strip_prefix(':')
            .is_some_and(|port| !port.is_empty() && port.parse::<u16>().is_ok())
}

#[cfg(test)]
mod tests {
    use super::is_loopback;

    #[test]
    fn loopback_origins_with_any_port_pass_and_lookalikes_do_not() {
        for origin in [
            "http://localhost:3000",
            "http://localhost",
            "http://127.0.0.1:8001",
            "http://[::1]:3000",
        ] {
            assert!(is_loopback(origin), "{origin}");
        }
        for origin in [
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example:80",
            "https://evil.example",
            "http://localhost:",
            "http://localhost:99999",
            "http://[::1]x",
            "null",
        ] {
            assert!(!is_loopback(origin), "{origin}");
        }
    }
}
