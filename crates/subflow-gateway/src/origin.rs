//! The local-mode Origin check (SPEC §13): a state-changing request whose `Origin` is
//! neither the gateway's own origin nor in `server.cors_origins` is refused. In token
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
        let allowed =
            own.as_deref() == Some(origin) || state.cors_origins.iter().any(|o| o == origin);
        if !allowed {
            return ApiError::Forbidden("Cross-origin request refused".to_owned()).into_response();
        }
    }
    next.run(request).await
}
