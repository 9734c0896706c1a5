//! The gateway over real HTTP on loopback, with the scripted model on a SQLite file.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use subflow_gateway::{AppOptions, AuthMode, ModelListing, WorkerOptions};
use subflow_models::{ChatModel, ScriptedConfig, ScriptedModel};
use subflow_runtime::admission::Admission;
use subflow_runtime::runtime::RuntimeOptions;
use subflow_store::Store;
use subflow_store::batches::{BatchScope, ClaimRequest, ItemFailure, ItemQuery, NewBatch, NewItem};
use tokio_util::sync::CancellationToken;

mod api;
mod auth;
mod batch_submit;
mod batch_worker;
mod batches;
mod errors;
mod export;
mod langgraph;
mod lifecycle;
mod limits;
mod metrics;
mod money;
mod outage;
mod resume;
mod storage;
mod task_cancel;
mod tasks;
mod threads;
mod timeouts;

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
    /// The SQLite file of its own store (none when the store was given).
    pub sqlite: Option<std::path::PathBuf>,
    _dir: tempfile::TempDir,
}

/// One SSE frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub event: String,
    pub data: Value,
    pub id: Option<String>,
}

/// How a test gateway differs from the default one: a SQLite file of its own, the
/// scripted model unpaced, heartbeats every 15 s, `auth.mode = local`.
#[allow(missing_debug_implementations)]
pub struct Options {
    /// Milliseconds between the scripted model's streamed pieces.
    pub delay_ms: u64,
    /// `streams.heartbeat_seconds`.
    pub heartbeat: Duration,
    /// `auth.mode`; in token mode every `/api` call needs a bearer token.
    pub auth: AuthMode,
    /// A store shared with other gateways, like a second `subflow serve` on one
    /// database; the spill file and workspaces still get a directory of their own.
    pub store: Option<Arc<dyn Store>>,
    /// Last changes to the app's options before it is built.
    pub configure: Box<dyn FnOnce(&mut AppOptions) + Send>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            delay_ms: 0,
            heartbeat: Duration::from_secs(15),
            auth: AuthMode::Local,
            store: None,
            configure: Box::new(|_| {}),
        }
    }
}

/// A default gateway: `spawn_app_with(Options::default())`.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(Options::default()).await
}

/// A gateway built from `options` with a batch worker as `serve` builds one (on the
/// gateway's store, runtime and metrics, its handle in the state); the worker is
/// returned, not yet running, for the test to drive.
pub async fn spawn_app_with_worker(options: Options) -> (TestApp, subflow_batches::Worker) {
    let configure = options.configure;
    let (app, worker) = start(Options {
        configure: Box::new(move |app: &mut AppOptions| {
            app.worker = Some(WorkerOptions {
                hostname: "test-host".into(),
                lease: Duration::from_secs(120),
                poll_interval: Duration::from_secs(1),
                max_result_chars: 100_000,
                result_preview_max_chars: 2_000,
            });
            configure(app);
        }),
        ..options
    })
    .await;
    (app, worker.expect("the options ask for a worker"))
}

/// A gateway built from `options` on a free loopback port.
pub async fn spawn_app_with(options: Options) -> TestApp {
    start(options).await.0
}

/// Builds and serves the application; its batch worker, if the options asked for one,
/// is taken out for the caller.
async fn start(options: Options) -> (TestApp, Option<subflow_batches::Worker>) {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = options
        .store
        .is_none()
        .then(|| dir.path().join("subflow.db"));
    let store: Arc<dyn Store> = match options.store {
        Some(store) => store,
        None => {
            let url = format!("sqlite://{}", dir.path().join("subflow.db").display());
            Arc::new(
                subflow_store_sqlite::SqliteStore::open(&url, 4)
                    .await
                    .unwrap(),
            )
        }
    };
    let model: Arc<dyn ChatModel> = Arc::new(
        ScriptedModel::new(ScriptedConfig {
            demo_delay_ms: options.delay_ms,
            ..ScriptedConfig::default()
        })
        .unwrap(),
    );
    let mut app = AppOptions {
        model_facts: vec![subflow_gateway::usage::ModelFacts {
            name: "scripted".into(),
            model: "scripted-1".into(),
            context_window: Some(128_000),
            pricing: Some(subflow_gateway::usage::Price {
                currency: "USD".into(),
                input_per_million: 2.0,
                output_per_million: 8.0,
                input_cache_hit_per_million: Some(0.5),
                input_cache_write_per_million: Some(2.5),
            }),
        }],
        run_timeout: Duration::from_secs(600),
        heartbeat: options.heartbeat,
        cors_origins: vec!["http://ui.example".into()],
        auth: options.auth,
        ..AppOptions::new(
            RuntimeOptions::new(store.clone(), vec![model], dir.path().to_path_buf()),
            vec![ModelListing {
                display_name: Some("Scripted".into()),
                ..ModelListing::named("scripted", "scripted-1")
            }],
        )
    };
    (options.configure)(&mut app);
    let mut app = app.build().unwrap();
    let worker = app.take_worker();
    let metrics = app.state().metrics.clone();
    let admission = app.state().runtime.admission().clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(app.run(listener, CancellationToken::new()));
    let app = TestApp {
        base,
        client: reqwest::Client::builder().no_proxy().build().unwrap(),
        store,
        metrics,
        admission,
        sqlite,
        _dir: dir,
    };
    (app, worker)
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
                admitted: 0,
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
