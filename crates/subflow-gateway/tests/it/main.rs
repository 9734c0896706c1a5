//! The gateway over real HTTP on loopback, with the scripted model on a SQLite file.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use subflow_gateway::{AppState, AuthMode, ModelListing};
use subflow_models::{ChatModel, ScriptedConfig, ScriptedModel};
use subflow_runtime::admission::{Admission, AdmissionConfig};
use subflow_runtime::runtime::{Models, Runtime, RuntimeConfig};
use subflow_store::Store;
use subflow_store::batches::{BatchScope, ClaimRequest, ItemFailure, ItemQuery, NewBatch, NewItem};
use subflow_store::buffer::{RetryPolicy, RetryQueue, StoreCounters};
use subflow_store::spill::SpillFile;

mod api;
mod auth;
mod batch_worker;
mod batches;
mod export;
mod lifecycle;
mod metrics;
mod resume;

/// A gateway on a free loopback port.
#[allow(missing_debug_implementations)]
pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub store: Arc<dyn Store>,
    /// The registry behind `/metrics`.
    pub metrics: Arc<subflow_telemetry::Metrics>,
    /// The execution slots its runtime shares between tasks and batch items.
    pub admission: Admission,
    _dir: tempfile::TempDir,
}

/// One SSE frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub event: String,
    pub data: Value,
    pub id: Option<String>,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(0, Duration::from_secs(15)).await
}

/// A gateway whose scripted model paces its text by `delay_ms`, with heartbeats every `heartbeat`.
pub async fn spawn_app_with(delay_ms: u64, heartbeat: Duration) -> TestApp {
    spawn_app_in(AuthMode::Local, delay_ms, heartbeat).await
}

/// A gateway in `auth.mode = token`: every `/api` call needs a bearer token.
pub async fn spawn_token_app() -> TestApp {
    spawn_app_in(AuthMode::Token, 0, Duration::from_secs(15)).await
}

async fn spawn_app_in(auth: AuthMode, delay_ms: u64, heartbeat: Duration) -> TestApp {
    spawn_app_tweaked(auth, delay_ms, heartbeat, |_| {}).await
}

/// A gateway whose state `tweak` adjusts before it serves.
pub async fn spawn_app_tweaked(
    auth: AuthMode,
    delay_ms: u64,
    heartbeat: Duration,
    tweak: impl FnOnce(&mut AppState),
) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("subflow.db").display());
    let store: Arc<dyn Store> = Arc::new(
        subflow_store_sqlite::SqliteStore::open(&url, 4)
            .await
            .unwrap(),
    );
    serve_on(store, dir, auth, delay_ms, heartbeat, tweak).await
}

/// A gateway on `store` with a runtime of its own (spill file and workspaces in `dir`),
/// like one `subflow serve` process; `tweak` adjusts its state before it serves.
pub async fn serve_on(
    store: Arc<dyn Store>,
    dir: tempfile::TempDir,
    auth: AuthMode,
    delay_ms: u64,
    heartbeat: Duration,
    tweak: impl FnOnce(&mut AppState),
) -> TestApp {
    serve_configured(
        store,
        dir,
        auth,
        delay_ms,
        heartbeat,
        AdmissionConfig::default(),
        tweak,
    )
    .await
}

/// A local-mode gateway on `store` whose runtime admits executions by `admission`.
pub async fn serve_admitting(
    store: Arc<dyn Store>,
    dir: tempfile::TempDir,
    admission: AdmissionConfig,
    tweak: impl FnOnce(&mut AppState),
) -> TestApp {
    let heartbeat = Duration::from_secs(15);
    serve_configured(store, dir, AuthMode::Local, 0, heartbeat, admission, tweak).await
}

async fn serve_configured(
    store: Arc<dyn Store>,
    dir: tempfile::TempDir,
    auth: AuthMode,
    delay_ms: u64,
    heartbeat: Duration,
    admission: AdmissionConfig,
    tweak: impl FnOnce(&mut AppState),
) -> TestApp {
    let model: Arc<dyn ChatModel> = Arc::new(
        ScriptedModel::new(ScriptedConfig {
            demo_delay_ms: delay_ms,
            ..ScriptedConfig::default()
        })
        .unwrap(),
    );
    let counters = Arc::new(StoreCounters::default());
    let retry = RetryQueue::spawn(
        store.clone(),
        Arc::new(SpillFile::in_dir(dir.path())),
        RetryPolicy::default(),
        counters.clone(),
    );
    let runtime = Runtime::new(
        RuntimeConfig::with_defaults(dir.path().join("workspaces")),
        store.clone(),
        Models::new(vec![model]),
        Admission::new(admission),
        retry,
        counters,
    );
    let mut state = AppState {
        model_facts: vec![subflow_gateway::usage::ModelFacts {
            name: "scripted".into(),
            model: "scripted-1".into(),
            context_window: Some(128_000),
            pricing: Some(subflow_gateway::usage::Price {
                currency: "USD".into(),
                input_per_million: 2.0,
                output_per_million: 8.0,
                input_cache_hit_per_million: Some(0.5),
            }),
        }],
        run_timeout: Duration::from_secs(600),
        heartbeat,
        cors_origins: vec!["http://ui.example".into()],
        auth,
        ..AppState::new(
            runtime,
            store.clone(),
            vec![ModelListing {
                display_name: Some("Scripted".into()),
                ..ModelListing::named("scripted", "scripted-1")
            }],
        )
    };
    tweak(&mut state);
    let metrics = state.metrics.clone();
    let admission = state.runtime.admission().clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(subflow_gateway::serve(
        listener,
        state,
        std::future::pending(),
    ));
    TestApp {
        base,
        client: reqwest::Client::builder().no_proxy().build().unwrap(),
        store,
        metrics,
        admission,
        _dir: dir,
    }
}

/// A streamed run as the client saw it.
#[derive(Debug)]
pub struct Streamed {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub frames: Vec<Frame>,
    pub text: String,
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Submits a batch of `items` for `user` in `thread` straight into the store, with
    /// one attempt per item; returns its id and its items' ids in position order.
    pub async fn submit_batch(
        &self,
        thread: &str,
        user: &str,
        items: usize,
    ) -> (String, Vec<String>) {
        let batch = self
            .store
            .submit_batch(NewBatch {
                thread_id: thread.into(),
                user_id: user.into(),
                run_id: None,
                tool_call_id: None,
                submission_key: format!("{thread}:{}", uuid::Uuid::new_v4()),
                title: "Fixture".into(),
                subagent_type: "general-purpose".into(),
                max_live_items: 100,
                max_running_items: 50,
                max_attempts: 1,
                execution_spec: serde_json::json!({}),
                items: (0..items)
                    .map(|i| NewItem {
                        item_key: format!("item-{}", i + 1),
                        prompt: format!("prompt {}", i + 1),
                        acceptance_criteria: vec![],
                    })
                    .collect(),
            })
            .await
            .unwrap()
            .batch;
        let scope = BatchScope::thread(user, thread);
        let mut ids = Vec::with_capacity(items);
        while ids.len() < items {
            let query = ItemQuery {
                status: None,
                offset: ids.len() as u32,
                limit: 500,
            };
            let page = self
                .store
                .list_items(&scope, &batch.id, &query)
                .await
                .unwrap();
            ids.extend(page.into_iter().map(|item| item.id));
        }
        (batch.id, ids)
    }

    /// A one-item batch of `user` in `thread` whose item has failed; returns the batch
    /// and item ids.
    pub async fn failed_batch(&self, thread: &str, user: &str) -> (String, String) {
        self.batch_with_failure(thread, user, 1).await
    }

    /// A batch of `items` items of `user` in `thread` whose first item has failed
    /// (claimed by a stand-in worker and finalised as a failure); the other items are
    /// still unfinished. Other items the stand-in claims meanwhile are handed back
    /// (queued, attempt restored). Returns the batch and the failed item's ids.
    pub async fn batch_with_failure(
        &self,
        thread: &str,
        user: &str,
        items: usize,
    ) -> (String, String) {
        let (batch, items) = self.submit_batch(thread, user, items).await;
        let claimed = self
            .store
            .claim_pass(&ClaimRequest {
                hostname: "fixture".into(),
                worker_id: "0".repeat(32),
                free_slots: 64,
                lease: Duration::from_secs(60),
            })
            .await
            .unwrap()
            .claimed;
        for other in claimed.iter().filter(|c| c.item.id != items[0]) {
            let reason = subflow_store::batches::ReleaseReason::ShutdownBeforeAdmission;
            self.store
                .release_claim(&other.lease(), &reason)
                .await
                .unwrap();
        }
        let mine = claimed
            .iter()
            .find(|c| c.item.id == items[0])
            .expect("the new item is claimed");
        let failure = ItemFailure {
            error: "boom".into(),
            model_name: None,
            stop_reason: None,
            token_usage: None,
        };
        let status = self
            .store
            .finish_failure(&mine.lease(), &failure)
            .await
            .unwrap();
        assert_eq!(status, Some(subflow_contracts::BatchItemStatus::Failed));
        (batch, items[0].clone())
    }

    /// Posts a run request to `…/runs/stream` and reads the whole event stream.
    pub async fn stream_run(&self, thread: &str, body: Value) -> Streamed {
        let response = self
            .client
            .post(self.url(&format!("/api/threads/{thread}/runs/stream")))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        Streamed {
            status,
            headers,
            frames: parse_frames(&text),
            text,
        }
    }

    /// GET returning status, headers and JSON body.
    pub async fn get_json(&self, path: &str) -> (u16, reqwest::header::HeaderMap, Value) {
        let response = self.client.get(self.url(path)).send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        (
            status,
            headers,
            response.json().await.unwrap_or(Value::Null),
        )
    }
}

/// Parses `event:`/`data:`/`id:` frames separated by blank lines.
pub fn parse_frames(text: &str) -> Vec<Frame> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty() && !block.starts_with(':'))
        .map(|block| {
            let mut frame = Frame {
                event: String::new(),
                data: Value::Null,
                id: None,
            };
            for line in block.lines() {
                if let Some(event) = line.strip_prefix("event: ") {
                    frame.event = event.to_owned();
                } else if let Some(data) = line.strip_prefix("data: ") {
                    frame.data = serde_json::from_str(data).unwrap();
                } else if let Some(id) = line.strip_prefix("id: ") {
                    frame.id = Some(id.to_owned());
                }
            }
            frame
        })
        .collect()
}
