//! `GET /api/threads/{thread_id}/token-usage?include_active=false` (docs/usage-and-cost.md#thread-token-usage, docs/usage-and-cost.md#cost).

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use subflow_contracts::Permission;
use subflow_contracts::api::{ErrorBody, TokenUsage};
use subflow_contracts::messages::Message;
use subflow_store::batches::{ActivityQuery, BatchScope};
use time::OffsetDateTime;
use utoipa::IntoParams;

use super::ThreadPath;
use crate::auth::{Caller, authorize_thread};
use subflow_runtime::budget::BudgetScope;

use crate::batch_progress::{thread_section, window_start};
use crate::budgets::{day_budget, runs_spent, shown};
use crate::extract::{Path, Query};
use crate::usage::{context_usage, summarise};
use crate::{ApiError, AppState};

/// Runs read per page while summing a thread: large enough that a thread of a few
/// thousand runs takes one query, bounded so a huge thread does not load at once.
const PAGE: u32 = 5_000;

/// The query of `…/token-usage`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// Also count running runs through their snapshots; default false (`true|false|1|0`).
    #[serde(default, deserialize_with = "crate::extract::value")]
    include_active: Option<bool>,
}

/// The thread's usage over counted runs, with cost and context usage.
#[utoipa::path(get, path = "/api/threads/{thread_id}/token-usage", tag = "threads", params(ThreadPath, UsageParams),
    responses(
        (status = 200, description = "Token usage, cost and context usage of the thread's counted runs; zeros for an unknown or deleted thread", body = TokenUsage),
        (status = 404, description = "Another user's thread", body = ErrorBody),
        (status = 422, description = "Invalid query or thread id", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:read"))))]
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(ThreadPath { thread_id }): Path<ThreadPath>,
    Query(params): Query<UsageParams>,
) -> Result<Json<TokenUsage>, ApiError> {
    let owned = authorize_thread(&state, &caller, Permission::ThreadsRead, &thread_id).await?;
    let include_active = params.include_active.unwrap_or(false);
    let usage = thread_token_usage(
        &state,
        &caller.user_id,
        &thread_id,
        owned.is_some(),
        include_active,
    )
    .await?;
    Ok(Json(usage))
}

/// The `/token-usage` body of `thread_id` for `user_id`, once the caller may read it:
/// what the route answers, and what `subflow bench gateway` times in-process. `exists`
/// is false for a thread id nobody owns, whose usage is zeros.
pub async fn thread_token_usage(
    state: &AppState,
    user_id: &str,
    thread_id: &str,
    exists: bool,
    include_active: bool,
) -> Result<TokenUsage, ApiError> {
    let mut runs = Vec::new();
    // An unowned thread id has no runs and no state.
    let mut more = exists;
    while more {
        let page = state
            .store
            .list_runs(
                subflow_store::RunScope::Thread(thread_id),
                None,
                PAGE,
                runs.len() as u32,
            )
            .await?;
        more = page.len() == PAGE as usize;
        runs.extend(page);
    }
    let mut body = summarise(thread_id, &runs, include_active, &state.model_facts);
    // Runs are newest first: the latest run's model sets the window, else the default model.
    let model = runs.first().and_then(|r| r.model_name.clone());
    let facts = model
        .and_then(|m| {
            state
                .model_facts
                .iter()
                .find(|f| f.name == m || f.model == m)
        })
        .or_else(|| state.model_facts.first());
    let latest = if exists {
        state.store.latest_checkpoint(thread_id).await
    } else {
        Ok(None)
    };
    let context = match latest {
        Ok(checkpoint) => {
            let messages: Vec<Message> = checkpoint
                .and_then(|c| c.values.get("messages").cloned())
                .and_then(|m| serde_json::from_value(m).ok())
                .unwrap_or_default();
            Some(context_usage(
                &messages,
                facts.and_then(|f| f.context_window),
            ))
        }
        Err(_) => None,
    };
    body.context_usage = context;
    // Batch items have no parent journal and stay out of every total above (docs/batches.md#observability); their spend is reported beside them.
    let activities = if exists {
        let scope = BatchScope::thread(user_id, thread_id);
        let query = ActivityQuery {
            batch_ids: None,
            completed_since: window_start(OffsetDateTime::now_utc()),
        };
        state.store.batch_activity(&scope, &query).await?
    } else {
        Vec::new()
    };
    body.batches = thread_section(&activities, &state.model_facts);
    if let Some(budgets) = state.runtime.budgets() {
        if exists && budgets.config.limit(BudgetScope::Thread).is_some() {
            let spent = runs_spent(&runs, &state.model_facts)
                + activities
                    .iter()
                    .map(|activity| activity.spent(&state.model_facts))
                    .sum::<f64>();
            body.budgets
                .extend(shown(budgets, BudgetScope::Thread, spent));
        }
        body.budgets
            .extend(day_budget(Some(budgets), &*state.store, user_id).await?);
    }
    Ok(body)
}
