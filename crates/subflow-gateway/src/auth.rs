//! Who is calling, what they may do, and which threads are theirs (docs/api.md#auth-and-ownership).
//!
//! One layer, [`authenticate`], puts a [`Caller`] into every `/api` request except
//! `/api/openapi.json`: in `local` mode the implicit user `default` with every
//! permission, in `token` mode the owner of the `Authorization: Bearer sf_…` token,
//! looked up by its SHA-256 digest. Routes then check one permission each, and every
//! thread route goes through [`authorize_thread`], the one ownership check: another
//! user's thread is 404 `Thread {thread_id} not found`, never 403. Routes that name a
//! run go through [`authorize_run`], which adds the run's lookup in that thread.

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subflow_contracts::auth::{is_well_formed_token, token_digest};
use subflow_contracts::{Permission, Permissions};
use subflow_store::{RunRecord, ThreadRecord};
use time::OffsetDateTime;

use crate::error::thread_not_found;
use crate::routes::checked_thread_id;
use crate::{ApiError, AppState, LOCAL_USER};

/// How requests are authenticated (`auth.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthMode {
    /// Every request is the implicit user `default` with every permission; the binary
    /// allows it only on loopback addresses.
    #[default]
    Local,
    /// Requests carry `Authorization: Bearer <token>`.
    Token,
}

/// The authenticated caller of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The user id that owns what the caller creates.
    pub user_id: String,
    /// What the caller may do.
    pub permissions: Permissions,
}

impl Caller {
    /// The implicit user of `local` mode.
    pub fn local() -> Self {
        Caller {
            user_id: LOCAL_USER.to_owned(),
            permissions: Permissions::admin(),
        }
    }

    /// 403 `Permission denied: <perm>` unless the caller holds `needed` (or `admin`).
    pub fn require(&self, needed: Permission) -> Result<(), ApiError> {
        if self.permissions.allows(needed) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!("Permission denied: {needed}")))
        }
    }
}

/// Routes take the caller as an argument; a route outside [`authenticate`]'s reach has
/// none and answers 401, so forgetting the layer fails closed.
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or(ApiError::Unauthorized)
    }
}

/// Whether a path needs a caller: everything under `/api` but the OpenAPI document and
/// the setup status (a constant). `/health` and the web UI's pages are public; the UI
/// sends its token with API calls.
pub(crate) fn requires_auth(path: &str) -> bool {
    (path == "/api" || path.starts_with("/api/"))
        && path != "/api/openapi.json"
        && path != "/api/v1/auth/setup-status"
}

/// The middleware: attaches the [`Caller`], or answers 401 `Authentication required`.
pub async fn authenticate(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    if !requires_auth(request.uri().path()) {
        return next.run(request).await;
    }
    let caller = match state.auth {
        AuthMode::Local => Caller::local(),
        AuthMode::Token => match token_caller(&state, request.headers()).await {
            Ok(caller) => caller,
            Err(error) => return error.into_response(),
        },
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// The token of an `Authorization: Bearer <token>` header (the scheme in any case).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_matches(' '))
}

/// The caller a bearer token stands for. A missing, malformed, unknown, revoked or
/// expired token, or one of a disabled user, is 401 with the same body: the response
/// does not tell which.
pub(crate) async fn token_caller(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Caller, ApiError> {
    let token = bearer(headers).ok_or(ApiError::Unauthorized)?;
    if !is_well_formed_token(token) {
        return Err(ApiError::Unauthorized);
    }
    let owner = state
        .store
        .find_token(&token_digest(token))
        .await?
        .ok_or(ApiError::Unauthorized)?;
    let now = OffsetDateTime::now_utc();
    if let Some(refusal) = owner.refusal(now) {
        tracing::debug!(token_id = %owner.token.id, reason = refusal.as_str(), "token refused");
        return Err(ApiError::Unauthorized);
    }
    if owner.token.needs_touch(now) {
        // Off the request path: the answer never waits for, or fails on, this write.
        let (store, token_id) = (state.store.clone(), owner.token.id.clone());
        tokio::spawn(async move {
            if let Err(error) = store.touch_token(&token_id).await {
                tracing::warn!(%error, token_id, "recording a token's last use failed");
            }
        });
    }
    Ok(Caller {
        user_id: owner.user.id,
        permissions: owner.token.permissions,
    })
}

/// The one check every thread route makes, in this order: the caller holds `needed`
/// (else 403), `thread_id` is valid (else 422), and the thread is the caller's (another
/// user's thread is 404 `Thread {thread_id} not found`). `None` means no such thread:
/// it is unowned, so reads answer empty and run creation creates it for the caller.
pub async fn authorize_thread(
    state: &AppState,
    caller: &Caller,
    needed: Permission,
    thread_id: &str,
) -> Result<Option<ThreadRecord>, ApiError> {
    caller.require(needed)?;
    checked_thread_id(thread_id)?;
    match state.store.get_thread(thread_id).await? {
        Some(thread) if thread.owner == caller.user_id => Ok(Some(thread)),
        Some(_) => Err(thread_not_found(thread_id)),
        None => Ok(None),
    }
}

/// [`authorize_thread`], then the run in that thread: an unowned thread or a run it does
/// not hold is 404 `Run {run_id} not found`.
pub async fn authorize_run(
    state: &AppState,
    caller: &Caller,
    needed: Permission,
    thread_id: &str,
    run_id: &str,
) -> Result<RunRecord, ApiError> {
    let run = match authorize_thread(state, caller, needed, thread_id).await? {
        Some(_) => state.store.get_run(thread_id, run_id).await?,
        None => None,
    };
    run.ok_or_else(|| ApiError::NotFound(format!("Run {run_id} not found")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(authorization: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(authorization).unwrap(),
        );
        headers
    }

    #[test]
    fn only_the_bearer_scheme_carries_a_token() {
        assert_eq!(bearer(&headers("Bearer sf_abc")), Some("sf_abc"));
        assert_eq!(bearer(&headers("bearer  sf_abc ")), Some("sf_abc"));
        assert_eq!(bearer(&headers("Basic c2Y6YWJj")), None);
        assert_eq!(bearer(&headers("Bearer")), None);
        assert_eq!(bearer(&headers("sf_abc")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }

    #[test]
    fn everything_under_api_needs_a_caller_but_the_openapi_document() {
        for path in ["/api", "/api/models", "/api/threads/t1/runs", "/api/nope"] {
            assert!(requires_auth(path), "{path}");
        }
        for path in ["/health", "/api/openapi.json", "/", "/index.html", "/apis"] {
            assert!(!requires_auth(path), "{path}");
        }
    }

    #[test]
    fn the_local_user_may_do_everything_and_others_only_what_they_hold() {
        let local = Caller::local();
        assert_eq!(local.user_id, "default");
        assert!(
            Permission::ALL
                .iter()
                .all(|permission| local.require(*permission).is_ok())
        );
        let reader = Caller {
            user_id: "u1".into(),
            permissions: Permissions::from_iter([Permission::RunsRead]),
        };
        assert!(reader.require(Permission::RunsRead).is_ok());
        let Err(ApiError::Forbidden(detail)) = reader.require(Permission::RunsWrite) else {
            panic!("runs:write is refused");
        };
        assert_eq!(detail, "Permission denied: runs:write");
    }
}
