//! Runs (docs/api.md): start a run and stream it as SSE, wait for it, list and get.

use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, RawQuery, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use subflow_contracts::api::{
    CancelAction, DisconnectAction, ErrorBody, MultitaskStrategy, Run, RunRequest, StateValues,
    StreamMode,
};
use subflow_contracts::messages::Message;
use subflow_contracts::{Permission, RunStatus};
use subflow_runtime::run::RunResult;
use subflow_runtime::spans::TraceOverrides;
use subflow_store::{NewRun, RunRecord, RunScope};
use tokio_util::sync::CancellationToken;
use utoipa::IntoParams;

use super::threads::owned_or_created;
use super::{RunPath, ThreadPath, paging, parse_body};
use crate::auth::{Caller, authorize_run, authorize_thread};
use crate::extract::{Path, Query};
use crate::stream::follow::RunFrame;
use crate::stream::{
    self, RunLaunch,
    follow::{Follow, OnDisconnect, RejoinParams, check_cursor, last_event_id, sse_response},
};
use crate::trace::RequestTrace;
use crate::usage::ModelFacts;
use crate::{ApiError, AppState};

/// A validated run request.
struct Accepted {
    modes: Vec<StreamMode>,
    messages: Vec<Message>,
    model_name: Option<String>,
    delegation_trace: Option<String>,
    metadata: Map<String, Value>,
    multitask_strategy: MultitaskStrategy,
    cancel_on_disconnect: bool,
    kwargs: Value,
    trace_overrides: TraceOverrides,
}

fn message_from(value: &Value) -> Result<Message, ApiError> {
    if value.get("type").is_some() {
        return serde_json::from_value(value.clone())
            .map_err(|e| ApiError::Unprocessable(format!("Invalid message: {e}")));
    }
    let content = value
        .get("content")
        .cloned()
        .unwrap_or(Value::String(String::new()));
    let kind = match value.get("role").and_then(Value::as_str) {
        Some("user" | "human") => "human",
        Some("assistant" | "ai") => "ai",
        Some("system") => "system",
        other => {
            return Err(ApiError::Unprocessable(format!(
                "Invalid message role: {}",
                other.unwrap_or("missing")
            )));
        }
    };
    serde_json::from_value(json!({"type": kind, "content": content}))
        .map_err(|e| ApiError::Unprocessable(format!("Invalid message: {e}")))
}

/// Whether a run request passes every check of its body (for the document's tests).
#[cfg(test)]
pub(crate) fn accepts(request: RunRequest) -> bool {
    accept(request).is_ok()
}

fn accept(request: RunRequest) -> Result<Accepted, ApiError> {
    for (name, value) in [
        ("webhook", &request.webhook),
        ("after_seconds", &request.after_seconds),
        ("feedback_keys", &request.feedback_keys),
        ("interrupt_before", &request.interrupt_before),
        ("interrupt_after", &request.interrupt_after),
        ("checkpoint", &request.checkpoint),
        ("checkpoint_id", &request.checkpoint_id),
        ("command", &request.command),
    ] {
        if value.is_some() {
            return Err(ApiError::Unprocessable(format!(
                "Run option '{name}' is not supported"
            )));
        }
    }
    if let Some(assistant) = request
        .assistant_id
        .as_deref()
        .filter(|a| *a != "lead_agent")
    {
        return Err(ApiError::Unprocessable(format!(
            "Unknown assistant_id '{assistant}'"
        )));
    }
    let modes = request_stream_modes(request.stream_mode.as_ref())?;
    let cancel_on_disconnect = match request.on_disconnect.as_deref().map(str::parse) {
        None | Some(Ok(DisconnectAction::Cancel)) => true,
        Some(Ok(DisconnectAction::Continue)) => false,
        Some(Err(_)) => {
            return Err(ApiError::Unprocessable(format!(
                "on_disconnect must be 'cancel' or 'continue', got '{}'",
                request.on_disconnect.unwrap_or_default()
            )));
        }
    };
    let multitask_strategy = match request.multitask_strategy.as_deref() {
        None => MultitaskStrategy::Reject,
        Some(text) => text
            .parse()
            .map_err(|_| ApiError::Unprocessable(format!("Unknown multitask_strategy '{text}'")))?,
    };
    if request
        .if_not_exists
        .as_deref()
        .is_some_and(|v| v != "create")
    {
        return Err(ApiError::Unprocessable(
            "if_not_exists must be 'create'".into(),
        ));
    }
    let messages = request
        .input
        .map(|i| i.messages)
        .unwrap_or_default()
        .iter()
        .map(message_from)
        .collect::<Result<Vec<_>, _>>()?;
    let config = request.config.map(Value::Object).unwrap_or(Value::Null);
    let metadata_of_config = config.get("metadata");
    let delegation_trace = metadata_of_config
        .and_then(|m| m.get("trace_id"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let trace_overrides = metadata_of_config
        .and_then(Value::as_object)
        .map(TraceOverrides::from_metadata)
        .unwrap_or_default();
    // Clients may not decide who is a subagent (docs/api.md#run-request).
    let mut context = request.context.unwrap_or_default();
    context.retain(|key, _| key != "is_subagent" && key != "agent_id" && !key.starts_with("__"));
    let model_name = config
        .get("configurable")
        .and_then(|c| c.get("model_name"))
        .or_else(|| context.get("model_name"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let kwargs = json!({"stream_mode": modes, "config": config, "context": context, "stream_subgraphs": request.stream_subgraphs, "stream_resumable": request.stream_resumable});
    Ok(Accepted {
        trace_overrides,
        modes,
        messages,
        model_name,
        delegation_trace,
        metadata: request.metadata.unwrap_or_default(),
        multitask_strategy,
        cancel_on_disconnect,
        kwargs,
    })
}

/// A run request's `stream_mode`: a mode, a list of modes, or nothing (`values`).
fn request_stream_modes(value: Option<&Value>) -> Result<Vec<StreamMode>, ApiError> {
    let not_strings =
        || ApiError::Unprocessable("stream_mode must be a string or a list of strings".into());
    let names: Vec<&str> = match value {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(mode)) => vec![mode.as_str()],
        Some(Value::Array(modes)) => modes
            .iter()
            .map(|m| m.as_str().ok_or_else(not_strings))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(not_strings()),
    };
    // An empty list asks for nothing in particular: the default applies.
    if names.is_empty() {
        return Ok(vec![StreamMode::Values]);
    }
    stream::parse_stream_modes(names)
}

/// Overwrites any client `deerflow_trace_id` in `config.metadata`, `metadata` and
/// `context` with the request's trace id.
fn stamp_trace_id(accepted: &mut Accepted, trace_id: &str) {
    for place in [
        "/config/metadata/deerflow_trace_id",
        "/context/deerflow_trace_id",
    ] {
        if let Some(id) = accepted.kwargs.pointer_mut(place) {
            *id = json!(trace_id);
        }
    }
    if let Some(id) = accepted.metadata.get_mut("deerflow_trace_id") {
        *id = json!(trace_id);
    }
}

/// The Run object (docs/api.md#objects) with the additive fields, `cost` (docs/usage-and-cost.md#cost, the run's
/// own, whatever its status) among them.
fn run_body(run: &RunRecord, models: &[ModelFacts]) -> Run {
    let usage = &run.usage;
    Run {
        run_id: run.run_id.clone(),
        thread_id: run.thread_id.clone(),
        assistant_id: run.assistant_id.clone(),
        status: run.status,
        created_at: run.created_at.clone(),
        updated_at: run.updated_at.clone(),
        metadata: run.metadata.clone(),
        multitask_strategy: run.multitask_strategy.clone(),
        kwargs: run.kwargs.clone(),
        model_name: run.model_name.clone(),
        trace_id: run.trace_id.clone(),
        stop_reason: run.stop_reason,
        error: run.error.clone(),
        total_input_tokens: usage.total_input_tokens,
        total_output_tokens: usage.total_output_tokens,
        total_tokens: usage.total_tokens,
        llm_call_count: usage.llm_call_count,
        lead_agent_tokens: usage.lead_agent_tokens,
        subagent_tokens: usage.subagent_tokens,
        middleware_tokens: usage.middleware_tokens,
        message_count: usage.message_count,
        token_usage_by_model: usage.token_usage_by_model.clone(),
        cost: crate::usage::cost(&[run], models),
    }
}

/// A started run: its record and outcome (resolving once its stream log is stored).
struct Started {
    run: RunRecord,
    outcome: tokio::task::JoinHandle<RunResult>,
    cancel: CancellationToken,
    cancel_on_disconnect: bool,
}

/// Starts a run for `caller`. An unowned thread id becomes the caller's thread.
async fn start(
    state: &AppState,
    caller: &Caller,
    thread_id: &str,
    trace: RequestTrace,
    body: &Result<Bytes, BytesRejection>,
) -> Result<Started, ApiError> {
    let owned = authorize_thread(state, caller, Permission::RunsWrite, thread_id).await?;
    let mut accepted = accept(parse_body(body)?)?;
    if let Some(name) = accepted.model_name.as_deref()
        && !state.runtime.knows_model(name)
    {
        let configured: Vec<&str> = state.models.iter().map(|m| m.name.as_str()).collect();
        return Err(ApiError::Unprocessable(format!(
            "Unknown model '{name}': the configured models are {}",
            configured.join(", ")
        )));
    }
    if owned.is_none() {
        owned_or_created(state, caller, Permission::RunsWrite, thread_id).await?;
    }
    let mut active = state
        .store
        .list_runs(
            RunScope::Thread(thread_id),
            Some(RunStatus::Running),
            100,
            0,
        )
        .await?;
    active.extend(
        state
            .store
            .list_runs(
                RunScope::Thread(thread_id),
                Some(RunStatus::Pending),
                100,
                0,
            )
            .await?,
    );
    if !active.is_empty() {
        // docs/api.md#run-request: reject, or stop the active runs first (rollback also erases them).
        let rollback = match accepted.multitask_strategy {
            MultitaskStrategy::Interrupt => false,
            MultitaskStrategy::Rollback => true,
            MultitaskStrategy::Reject => {
                return Err(ApiError::Conflict(format!(
                    "Thread {thread_id} already has an active run"
                )));
            }
        };
        for run in &active {
            stop_run(state, thread_id, &run.run_id, rollback).await;
        }
    }
    // The request's trace id is the run's: a `deerflow_trace_id` in the body names
    // nothing and is overwritten, in the stored kwargs too (docs/operations.md#trace-ids).
    stamp_trace_id(&mut accepted, &trace.id);
    let run_id = uuid::Uuid::new_v4().to_string();
    let model_name = state.runtime.model_name(accepted.model_name.as_deref());
    let run = state
        .store
        .create_run(NewRun {
            run_id: run_id.clone(),
            thread_id: thread_id.to_owned(),
            owner: caller.user_id.clone(),
            assistant_id: "lead_agent".to_owned(),
            model_name: Some(model_name),
            trace_id: Some(trace.id.clone()),
            metadata: accepted.metadata.clone(),
            multitask_strategy: accepted.multitask_strategy.as_str().to_owned(),
            kwargs: accepted.kwargs,
        })
        .await?;
    let launch = RunLaunch {
        input: accepted.messages,
        model_name: accepted.model_name,
        delegation_trace: accepted.delegation_trace,
        trace,
        trace_overrides: accepted.trace_overrides,
        modes: accepted.modes,
    };
    let (outcome, cancel) = stream::start_run(state, &run, launch).await;
    Ok(Started {
        run,
        outcome,
        cancel,
        cancel_on_disconnect: accepted.cancel_on_disconnect,
    })
}

/// `POST …/runs/stream`: starts a run and streams it as SSE, `metadata` first and `end`
/// last. An unknown thread becomes the caller's.
#[utoipa::path(post, path = "/api/threads/{thread_id}/runs/stream", tag = "runs", params(ThreadPath),
    request_body(content = RunRequest, description = "Every field optional"),
    responses(
        (status = 200, description = "The run's frames: metadata first, end last, heartbeat comments between", content_type = "text/event-stream", body = RunFrame,
            headers(("Content-Location" = String, description = "`/api/threads/{thread_id}/runs/{run_id}`: the new run"))),
        (status = 404, description = "Another user's thread", body = ErrorBody),
        (status = 409, description = "The thread has an active run and multitask_strategy is reject", body = ErrorBody),
        (status = 422, description = "Invalid body, thread id or model", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("runs:write"))))]
pub async fn stream(
    State(state): State<AppState>,
    caller: Caller,
    Path(ThreadPath { thread_id }): Path<ThreadPath>,
    Extension(trace): Extension<RequestTrace>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Started {
        run,
        outcome,
        cancel,
        cancel_on_disconnect,
    } = start(&state, &caller, &thread_id, trace, &body).await?;
    // The creator follows the run's hub from the start, like any watcher; only losing
    // it cancels the run (unless it asked for `continue`).
    drop(outcome);
    let follow = Follow::new(
        &state.streams,
        state.store.clone(),
        &run.thread_id,
        &run.run_id,
        None,
        None,
    );
    let on_disconnect = if cancel_on_disconnect {
        OnDisconnect::Token(cancel)
    } else {
        OnDisconnect::Continue
    };
    // The stream counts as open (`subflow_sse_streams`) until its body ends or is dropped.
    let open = state.metrics.sse_stream();
    let mut response = sse_response(follow, state.heartbeat, on_disconnect, open);
    response.headers_mut().extend([content_location(&run)]);
    Ok(response)
}

/// `Content-Location` of a response that started `run`: the LangGraph JS SDK reads the
/// run and thread ids only from it (its run-created callback, rejoin keys, Stop).
fn content_location(run: &RunRecord) -> (HeaderName, HeaderValue) {
    let path = format!("/api/threads/{}/runs/{}", run.thread_id, run.run_id);
    let value = HeaderValue::try_from(path).expect("thread and run ids are URL-safe");
    (header::CONTENT_LOCATION, value)
}

/// `POST …/runs`: starts a run in the background and answers with its `pending` record.
/// Nobody is attached, so no disconnect cancels it; its frames are kept for rejoins.
#[utoipa::path(post, path = "/api/threads/{thread_id}/runs", tag = "runs", params(ThreadPath),
    request_body(content = RunRequest, description = "Every field optional"),
    responses(
        (status = 200, description = "The new run, pending", body = Run,
            headers(("Content-Location" = String, description = "`/api/threads/{thread_id}/runs/{run_id}`: the new run"))),
        (status = 404, description = "Another user's thread", body = ErrorBody),
        (status = 409, description = "The thread has an active run and multitask_strategy is reject", body = ErrorBody),
        (status = 422, description = "Invalid body, thread id or model", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("runs:write"))))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    Path(ThreadPath { thread_id }): Path<ThreadPath>,
    Extension(trace): Extension<RequestTrace>,
    body: Result<Bytes, BytesRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let Started { run, .. } = start(&state, &caller, &thread_id, trace, &body).await?;
    Ok((
        [content_location(&run)],
        Json(run_body(&run, &state.model_facts)),
    ))
}

/// The query of `GET …/join` and `POST …/runs/wait`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitParams {
    /// Seconds to wait for the run's end, 1-86400; default and ceiling the run timeout
    /// plus one lease (`runs.timeout_seconds` + `runs.lease_seconds`). Past it the answer
    /// is 504 and the run goes on.
    #[param(minimum = 1, maximum = 86400)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    timeout: Option<u32>,
}

/// How long a wait lasts, and the error once it elapsed with the run still going.
struct WaitBound {
    limit: Duration,
    caller_bounded: bool,
}

impl WaitBound {
    /// A run ends within its timeout, and a dead owner's run is recovered within a
    /// lease: the longest wait there is, and the default.
    fn of(state: &AppState, params: &WaitParams) -> Result<Self, ApiError> {
        let longest = state.run_timeout + state.streams.config().lease;
        let Some(seconds) = params.timeout else {
            return Ok(WaitBound {
                limit: longest,
                caller_bounded: false,
            });
        };
        if !(1..=86_400).contains(&seconds) {
            return Err(ApiError::Unprocessable(format!(
                "timeout must be 1-86400 seconds, got {seconds}"
            )));
        }
        let asked = Duration::from_secs(u64::from(seconds));
        Ok(WaitBound {
            limit: asked.min(longest),
            caller_bounded: asked < longest,
        })
    }

    fn elapsed(&self, run_id: &str) -> ApiError {
        if self.caller_bounded {
            ApiError::WaitElapsed(format!(
                "Run {run_id} has not ended within {} s; it goes on, join it to wait again",
                self.limit.as_secs()
            ))
        } else {
            ApiError::Unavailable(format!(
                "Run {run_id} has not ended: its final writes are waiting for the store"
            ))
        }
    }
}

/// `POST …/runs/wait?timeout=`: starts a run and answers with its final messages.
#[utoipa::path(post, path = "/api/threads/{thread_id}/runs/wait", tag = "runs", params(ThreadPath, WaitParams),
    request_body(content = RunRequest, description = "Every field optional"),
    responses(
        (status = 200, description = "The run's final messages", body = StateValues,
            headers(("Content-Location" = String, description = "`/api/threads/{thread_id}/runs/{run_id}`: the new run"))),
        (status = 404, description = "Another user's thread", body = ErrorBody),
        (status = 409, description = "The thread has an active run and multitask_strategy is reject", body = ErrorBody),
        (status = 422, description = "Invalid body, thread id, model or timeout", body = ErrorBody),
        (status = 503, description = "The run has not ended within its timeout and one lease: its final writes wait for the store", body = ErrorBody),
        (status = 504, description = "The run has not ended within the requested timeout; it goes on", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("runs:write"))))]
pub async fn wait(
    State(state): State<AppState>,
    caller: Caller,
    Path(ThreadPath { thread_id }): Path<ThreadPath>,
    Query(params): Query<WaitParams>,
    Extension(trace): Extension<RequestTrace>,
    body: Result<Bytes, BytesRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let bound = WaitBound::of(&state, &params)?;
    let Started {
        run,
        outcome,
        cancel,
        cancel_on_disconnect,
    } = start(&state, &caller, &thread_id, trace, &body).await?;
    // Losing the client cancels the run unless the request said `continue`.
    let guard = cancel_on_disconnect.then(|| cancel.drop_guard());
    let ended = tokio::time::timeout(bound.limit, outcome).await;
    // Answering is not a disconnect: a run past the wait goes on.
    if let Some(guard) = guard {
        guard.disarm();
    }
    let result = ended
        .map_err(|_| bound.elapsed(&run.run_id))?
        .map_err(|_| ApiError::Unavailable("The run ended unexpectedly".into()))?;
    let values = StateValues {
        messages: result.messages,
        title: result.title,
    };
    Ok(([content_location(&run)], Json(values)))
}

/// The query of `GET …/runs`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Page size, default 10, 1-100.
    #[param(minimum = 1, maximum = 100)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    limit: Option<u32>,
    /// Runs to skip.
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295_i64)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    offset: Option<u32>,
    /// Only runs with this status; absent means all.
    #[param(value_type = Option<RunStatus>)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    status: Option<RunStatus>,
}

/// `GET /api/runs?limit=10&offset=0&status=` (additive): the caller's runs in every
/// thread of theirs, newest first, each with its thread id.
#[utoipa::path(get, path = "/api/runs", tag = "runs", params(ListParams),
    responses(
        (status = 200, description = "The caller's runs across their threads, newest first", body = Vec<Run>),
        (status = 422, description = "Invalid query", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("runs:read"))))]
pub async fn list_all(
    State(state): State<AppState>,
    caller: Caller,
    Query(params): Query<ListParams>,
) -> Result<Json<Vec<Run>>, ApiError> {
    caller.require(Permission::RunsRead)?;
    let limit = paging::limit(params.limit, 10, paging::RUNS_MAX_LIMIT)?;
    let runs = state
        .store
        .list_runs(
            RunScope::Owner(&caller.user_id),
            params.status,
            limit,
            params.offset.unwrap_or(0),
        )
        .await?;
    Ok(Json(
        runs.iter()
            .map(|run| run_body(run, &state.model_facts))
            .collect(),
    ))
}

/// `GET …/runs?limit=10&offset=0&status=`: newest first, at most
/// [`paging::RUNS_MAX_LIMIT`] per page.
#[utoipa::path(get, path = "/api/threads/{thread_id}/runs", tag = "runs", params(ThreadPath, ListParams),
    responses(
        (status = 200, description = "The thread's runs, newest first; none for an unknown or deleted thread (docs/api.md#auth-and-ownership)", body = Vec<Run>),
        (status = 404, description = "Another user's thread", body = ErrorBody),
        (status = 422, description = "Invalid query or thread id", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("runs:read"))))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Path(ThreadPath { thread_id }): Path<ThreadPath>,
    Query(params): Query<ListParams>,
) -> Result<Json<Vec<Run>>, ApiError> {
    let owned = authorize_thread(&state, &caller, Permission::RunsRead, &thread_id).await?;
    let limit = paging::limit(params.limit, 10, paging::RUNS_MAX_LIMIT)?;
    let offset = params.offset.unwrap_or(0);
    let status = params.status;
    if owned.is_none() {
        return Ok(Json(Vec::new()));
    }
    let runs = state
        .store
        .list_runs(RunScope::Thread(&thread_id), status, limit, offset)
        .await?;
    Ok(Json(
        runs.iter()
            .map(|run| run_body(run, &state.model_facts))
            .collect(),
    ))
}

/// `GET …/runs/{run_id}`: a run.
#[utoipa::path(get, path = "/api/threads/{thread_id}/runs/{run_id}", tag = "runs", params(RunPath),
    responses(
        (status = 200, description = "The run", body = Run),
        (status = 404, description = "No such run in a thread of the caller's", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("runs:read"))))]
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(RunPath { thread_id, run_id }): Path<RunPath>,
) -> Result<Json<Run>, ApiError> {
    let run = authorize_run(&state, &caller, Permission::RunsRead, &thread_id, &run_id).await?;
    Ok(Json(run_body(&run, &state.model_facts)))
}

/// The query of a cancel.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CancelParams {
    /// Answer once the run has stopped; default false (`true|false|1|0`).
    #[serde(default, deserialize_with = "crate::extract::value")]
    wait: Option<bool>,
    /// `interrupt` (default) or `rollback`.
    #[param(value_type = Option<CancelAction>)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    action: Option<CancelAction>,
}

/// `POST …/runs/{run_id}/cancel?wait=false&action=interrupt|rollback`: 202, empty body.
/// `rollback` also deletes the run's checkpoints, events and record once it has stopped.
#[utoipa::path(post, path = "/api/threads/{thread_id}/runs/{run_id}/cancel", tag = "runs", params(RunPath, CancelParams),
    responses(
        (status = 202, description = "Cancelling (with wait=true: cancelled); no body"),
        (status = 404, description = "No such run in a thread of the caller's", body = ErrorBody),
        (status = 422, description = "Invalid query or thread id", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("runs:write"))))]
pub async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    Path(RunPath { thread_id, run_id }): Path<RunPath>,
    Query(params): Query<CancelParams>,
) -> Result<axum::http::StatusCode, ApiError> {
    authorize_run(&state, &caller, Permission::RunsWrite, &thread_id, &run_id).await?;
    let action = params.action.unwrap_or(CancelAction::Interrupt);
    let rollback = action == CancelAction::Rollback;
    let finish = {
        let state = state.clone();
        async move { stop_run(&state, &thread_id, &run_id, rollback).await }
    };
    if params.wait.unwrap_or(false) {
        finish.await;
    } else {
        tokio::spawn(finish);
    }
    Ok(axum::http::StatusCode::ACCEPTED)
}

/// Cancels a run executing here and waits for it to end; `rollback` then deletes its
/// checkpoints, events and record. Failures to delete are logged, never raised: the
/// caller has already been answered or is about to start the next run.
async fn stop_run(state: &AppState, thread_id: &str, run_id: &str, rollback: bool) {
    // A run executing in another process is cancelled through the store (docs/api.md#cancel).
    stream::cancel_and_wait(state, thread_id, run_id).await;
    if rollback {
        if let Err(error) = state.store.delete_run_checkpoints(thread_id, run_id).await {
            tracing::error!(%error, run_id, "rollback: deleting checkpoints failed");
        }
        if let Err(error) = state.store.delete_run(thread_id, run_id).await {
            tracing::error!(%error, run_id, "rollback: deleting the run failed");
        }
    }
}

/// `GET …/runs/{run_id}/join?timeout=`: waits for the run to end, here or in another
/// process, then returns the final values.
#[utoipa::path(get, path = "/api/threads/{thread_id}/runs/{run_id}/join", tag = "runs", params(RunPath, WaitParams),
    responses(
        (status = 200, description = "The thread's state values once the run has ended", body = StateValues),
        (status = 404, description = "No such run in a thread of the caller's", body = ErrorBody),
        (status = 422, description = "Invalid timeout", body = ErrorBody),
        (status = 503, description = "The run has not ended within its timeout and one lease: its final writes wait for the store", body = ErrorBody),
        (status = 504, description = "The run has not ended within the requested timeout; it goes on", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("runs:read"))))]
pub async fn join(
    State(state): State<AppState>,
    caller: Caller,
    Path(RunPath { thread_id, run_id }): Path<RunPath>,
    Query(params): Query<WaitParams>,
) -> Result<Json<Value>, ApiError> {
    let bound = WaitBound::of(&state, &params)?;
    authorize_run(&state, &caller, Permission::RunsRead, &thread_id, &run_id).await?;
    if !stream::wait_for_end_within(&state, &thread_id, &run_id, bound.limit).await {
        return Err(bound.elapsed(&run_id));
    }
    let values = state
        .store
        .latest_checkpoint(&thread_id)
        .await?
        .map_or_else(|| json!({"messages": []}), |c| c.values);
    Ok(Json(values))
}

/// `GET …/runs/{run_id}/stream?stream_mode=&cancel_on_disconnect=false`: rejoins a run's
/// stream wherever it executes (docs/api.md#resume-and-rejoin). With `Last-Event-ID: N`, every frame after N
/// once, in order, then live frames; without, the retained log from the start. A cursor
/// into pruned frames gets one `gap` frame.
#[utoipa::path(get, path = "/api/threads/{thread_id}/runs/{run_id}/stream", tag = "runs",
    params(RunPath,
        ("stream_mode" = Option<Vec<StreamMode>>, Query, explode, description = "Only these modes' frames (repeated or comma-separated); all when absent"),
        ("cancel_on_disconnect" = Option<bool>, Query, description = "Cancel the run when this watcher goes (true/false or 1/0); default false"),
        ("namespace" = Option<String>, Query, description = "Accepted and ignored: a run has no subgraph namespaces"),
        ("checkpoint_id" = Option<String>, Query, description = "Accepted and ignored, as LangGraph servers do on a rejoin"),
        ("Last-Event-ID" = Option<String>, Header, nullable = false, pattern = "^(-1|[0-9]+)$", description = "Resume after this frame id; -1 replays from the start; an id past the stream's end is 409"),
    ),
    responses(
        (status = 200, description = "The run's frames after the cursor, then live ones until end", content_type = "text/event-stream", body = RunFrame),
        (status = 404, description = "No such run in a thread of the caller's", body = ErrorBody),
        (status = 409, description = "Last-Event-ID is past the end of the run's stream", body = ErrorBody),
        (status = 422, description = "Invalid query, Last-Event-ID or thread id", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("runs:read"))))]
pub async fn rejoin(
    State(state): State<AppState>,
    caller: Caller,
    Path(RunPath { thread_id, run_id }): Path<RunPath>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    // The query is checked first, as the shared extractor checks every other route's.
    let params = RejoinParams::parse(query.as_deref())?;
    authorize_run(&state, &caller, Permission::RunsRead, &thread_id, &run_id).await?;
    let cursor = last_event_id(&headers)?;
    if let Some(cursor) = cursor {
        check_cursor(&state.streams, &*state.store, &run_id, cursor).await?;
    }
    let follow = Follow::new(
        &state.streams,
        state.store.clone(),
        &thread_id,
        &run_id,
        cursor,
        params.events,
    );
    let on_disconnect = if params.cancel_on_disconnect {
        OnDisconnect::Run {
            active: state.active.clone(),
            store: state.store.clone(),
            run_id,
        }
    } else {
        OnDisconnect::Continue
    };
    let open = state.metrics.sse_stream();
    Ok(sse_response(follow, state.heartbeat, on_disconnect, open))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const FIELDS: [&str; 22] = [
        "assistant_id",
        "input",
        "stream_mode",
        "config",
        "context",
        "metadata",
        "on_disconnect",
        "multitask_strategy",
        "if_not_exists",
        "stream_subgraphs",
        "stream_resumable",
        "webhook",
        "after_seconds",
        "feedback_keys",
        "interrupt_before",
        "interrupt_after",
        "checkpoint",
        "checkpoint_id",
        "command",
        "messages",
        "surprise",
        "__proto__",
    ];

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[a-z/\\- ]{0,12}".prop_map(Value::from),
            prop::sample::select(vec![
                "values",
                "custom",
                "messages-tuple",
                "debug",
                "cancel",
                "continue",
                "reject",
                "rollback",
                "lead_agent",
                "user",
                "human"
            ])
            .prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop::sample::select(vec![
                        "messages",
                        "role",
                        "content",
                        "type",
                        "metadata",
                        "configurable",
                        "model_name"
                    ]),
                    inner,
                    0..4
                )
                .prop_map(|m| Value::Object(
                    m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
                )),
            ]
        })
    }

    fn run_body() -> impl Strategy<Value = Value> {
        prop::collection::btree_map(prop::sample::select(FIELDS.to_vec()), json_value(), 0..6)
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever a client sends, the parser accepts it or answers 422 with a reason; it never panics.
        #[test]
        fn any_run_request_is_accepted_or_a_422(body in run_body()) {
            let bytes: Result<Bytes, BytesRejection> = Ok(Bytes::from(body.to_string()));
            match parse_body::<RunRequest>(&bytes).and_then(accept) {
                Ok(accepted) => prop_assert!(!accepted.modes.is_empty()),
                Err(ApiError::Unprocessable(detail)) => prop_assert!(!detail.is_empty()),
                Err(other) => prop_assert!(false, "unexpected {other:?}"),
            }
        }

        /// Arbitrary bytes never panic the parser either.
        #[test]
        fn arbitrary_bytes_are_a_422(raw in prop::collection::vec(any::<u8>(), 0..64)) {
            let bytes: Result<Bytes, BytesRejection> = Ok(Bytes::from(raw));
            if let Err(error) = parse_body::<RunRequest>(&bytes).and_then(accept) {
                prop_assert!(matches!(error, ApiError::Unprocessable(_)));
            }
        }
    }
}
