//! `GET /api/usage?from=&to=&group_by=&user_id=` (docs/usage-and-cost.md#usage-across-threads):
//! usage and cost across threads, owner-scoped; an admin sees every user and may pick one.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use subflow_contracts::Permission;
use subflow_contracts::api::ErrorBody;
use subflow_contracts::api::usage::{UsageGrouping, UsageReport};
use subflow_store::batches::BatchScope;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::budgets::{batches_of, day_budget, runs_of};
use crate::extract::Query;
use crate::usage_report::{Window, report};
use crate::{ApiError, AppState, LOCAL_USER};

/// The default window: the last 30 days.
const DEFAULT_DAYS: i64 = 30;

/// The query of `/api/usage`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// Start of the window, RFC 3339 (inclusive); default 30 days before `to`.
    #[param(format = DateTime)]
    from: Option<String>,
    /// End of the window, RFC 3339 (exclusive); default now.
    #[param(format = DateTime)]
    to: Option<String>,
    /// `day` (default), `model`, `caller`, `thread` or `user`.
    group_by: Option<UsageGrouping>,
    /// One user's usage; only an admin may name another user.
    user_id: Option<String>,
}

fn moment(name: &str, value: Option<&str>) -> Result<Option<OffsetDateTime>, ApiError> {
    value
        .map(|text| {
            OffsetDateTime::parse(text, &Rfc3339).map_err(|_| {
                ApiError::Unprocessable(format!("{name} must be an RFC 3339 time, got {text:?}"))
            })
        })
        .transpose()
}

/// Usage and cost of the caller's (or, for an admin, every user's) runs and batches
/// created in the window, grouped.
#[utoipa::path(get, path = "/api/usage", tag = "threads", params(UsageParams),
    responses(
        (status = 200, description = "Usage and cost across threads: counted runs, stopped runs and batch items apart, in at most 1,000 groups", body = UsageReport),
        (status = 403, description = "Another user's usage without `admin`", body = ErrorBody),
        (status = 422, description = "Invalid query", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:read"))))]
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Query(params): Query<UsageParams>,
) -> Result<Json<UsageReport>, ApiError> {
    caller.require(Permission::ThreadsRead)?;
    let admin = caller.permissions.allows(Permission::Admin);
    let to = moment("to", params.to.as_deref())?.unwrap_or_else(OffsetDateTime::now_utc);
    // A window that ends before it starts holds nothing.
    let from = moment("from", params.from.as_deref())?
        .unwrap_or_else(|| {
            to.checked_sub(time::Duration::days(DEFAULT_DAYS))
                .unwrap_or(to)
        })
        .min(to);
    let user_id = match params.user_id {
        Some(user) if user != caller.user_id && !admin => {
            return Err(ApiError::Forbidden("Permission denied: admin".to_owned()));
        }
        Some(user) => Some(user),
        None if admin => None,
        None => Some(caller.user_id.clone()),
    };
    let window = Window {
        from: subflow_store::rfc3339(from),
        to: subflow_store::rfc3339(to),
        group_by: params.group_by.unwrap_or_default(),
        user_id: user_id.clone(),
    };
    let users = match user_id {
        Some(user) => vec![user],
        None => every_user(&state).await?,
    };
    let mut runs = Vec::new();
    let mut batches = Vec::new();
    for user in &users {
        runs.extend(runs_of(&*state.store, user, &window.from, &window.to).await?);
        batches.extend(batches_of(&*state.store, &BatchScope::user(user)).await?);
    }
    let mut report = report(&window, &runs, &batches, &state.model_facts);
    // The day's budget is per user: the reported one's, else the caller's own.
    let budget_user = window.user_id.as_deref().unwrap_or(&caller.user_id);
    report.budgets.extend(
        day_budget(
            state.runtime.budgets().map(|b| &**b),
            &*state.store,
            budget_user,
        )
        .await?,
    );
    Ok(Json(report))
}

/// Every user an admin sees: the registered ones and the implicit local user.
async fn every_user(state: &AppState) -> Result<Vec<String>, ApiError> {
    let mut users: Vec<String> = state
        .store
        .list_users()
        .await?
        .into_iter()
        .map(|user| user.id)
        .collect();
    if !users.iter().any(|user| user == LOCAL_USER) {
        users.push(LOCAL_USER.to_owned());
    }
    Ok(users)
}
