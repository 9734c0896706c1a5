//! `GET /api/v1/auth/me` and `GET /api/v1/auth/setup-status`: the account routes the
//! DeerFlow web app asks before it renders. subflow has no sign-up flow to set up (users
//! and tokens come from `subflow users` and `subflow tokens`), so setup is never needed.

use axum::Json;
use serde::Serialize;
use subflow_contracts::Permission;
use subflow_contracts::api::ErrorBody;
use utoipa::ToSchema;

use crate::auth::Caller;

/// The signed-in user, in the DeerFlow web app's shape.
#[derive(Debug, Serialize, ToSchema)]
pub struct Me {
    /// The user id (`default` in local mode).
    id: String,
    /// `<id>@test.local`: subflow keeps no e-mail addresses.
    email: String,
    /// `admin` for local mode and for tokens with `admin`, else `user`.
    system_role: String,
    /// Always false.
    needs_setup: bool,
    /// Always null: no OAuth sign-in.
    #[schema(value_type = Option<String>)]
    oauth_provider: Option<String>,
}

/// Whether the first admin still has to be created.
#[derive(Debug, Serialize, ToSchema)]
pub struct SetupStatus {
    /// Always false.
    needs_setup: bool,
}

/// `GET /api/v1/auth/me`: the caller (401 without a valid token in token mode).
#[utoipa::path(get, path = "/api/v1/auth/me", tag = "server",
    responses(
        (status = 200, description = "The caller", body = Me),
        (status = 401, description = "No valid bearer token (token mode)", body = ErrorBody),
    ))]
pub async fn me(caller: Caller) -> Json<Me> {
    let role = if caller.permissions.allows(Permission::Admin) {
        "admin"
    } else {
        "user"
    };
    Json(Me {
        email: format!("{}@test.local", caller.user_id),
        id: caller.user_id,
        system_role: role.to_owned(),
        needs_setup: false,
        oauth_provider: None,
    })
}

/// `GET /api/v1/auth/setup-status`: never needs setup; public, like `/health`.
#[utoipa::path(get, path = "/api/v1/auth/setup-status", tag = "server",
    responses((status = 200, description = "Setup is never needed", body = SetupStatus)))]
pub async fn setup_status() -> Json<SetupStatus> {
    Json(SetupStatus { needs_setup: false })
}
