//! The SSE latency part of `subflow bench gateway`: from the moment a subagent step
//! exists (its model answer finished) to the moment a client over loopback has parsed
//! its `custom` frame, with one stream and with many at once. The baseline is the same
//! runs read from the runtime's in-process output channel, which is where the gateway
//! takes the steps from: the ratio is what numbering, storing each frame before it is
//! sent (the persister), the hub, HTTP and the client's parsing add. The same runs are
//! also streamed by a gateway on the in-memory store, where storing a frame costs next
//! to nothing: what is left of the ratio there is the gateway's own path (persister
//! hand-off, hub, HTTP, loopback, parsing), and the rest is the durable commit. With a
//! PostgreSQL database, the same steps are also timed through a second gateway that
//! follows runs executing in the first one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use serde_json::{Value, json};
use subflow_contracts::messages::Message;
use subflow_contracts::task_events::TaskEvent;
use subflow_gateway::{AppOptions, ModelListing};
use subflow_models::{
    ChatEvent, ChatModel, ChatRequest, ChatStream, Error, ModelInfo, ScriptedConfig, ScriptedModel,
};
use subflow_runtime::admission::{AdmissionConfig, AdmissionPolicy};
use subflow_runtime::output::{OutputSink, RunOutput};
use subflow_runtime::run::RunSpec;
use subflow_runtime::runtime::RuntimeOptions;
use subflow_store::{MemoryStore, Store};
use subflow_store_sqlite::SqliteStore;
use tokio_util::sync::CancellationToken;

use super::Backing;

/// When each model answer finished, by run id and answer text.
type Stamps = Arc<Mutex<HashMap<(String, String), Instant>>>;

/// A model that records when each of its answers finished.
#[derive(Debug)]
struct Stamped {
    inner: Arc<dyn ChatModel>,
    stamps: Stamps,
}

#[async_trait::async_trait]
impl ChatModel for Stamped {
    fn info(&self) -> &ModelInfo {
        self.inner.info()
    }

    async fn stream(&self, request: ChatRequest) -> Result<ChatStream, Error> {
        let run_id = request.run_id.clone();
        let stream = self.inner.stream(request).await?;
        let stamps = self.stamps.clone();
        let mut text = String::new();
        Ok(stream
            .map(move |event| {
                match &event {
                    Ok(ChatEvent::TextDelta(delta)) => text.push_str(delta),
                    Ok(ChatEvent::Finish { .. }) => {
                        let key = (run_id.clone(), std::mem::take(&mut text));
                        stamps
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(key, Instant::now());
                    }
                    _ => {}
                }
                event
            })
            .boxed())
    }
}

/// Latency percentiles of one measurement, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct Latency {
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Steps measured.
    pub samples: usize,
}

impl Latency {
    fn of(mut samples: Vec<Duration>) -> anyhow::Result<Self> {
        if samples.is_empty() {
            bail!("no step was measured");
        }
        samples.sort();
        let at = |p: f64| {
            samples[((samples.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
        };
        Ok(Latency {
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            samples: samples.len(),
        })
    }
}

/// The lead delegates one task; the subagent takes `steps` AI steps (each listing a
/// directory, so a tool step follows), `delay_ms` apart, then answers.
fn script(steps: usize, delay_ms: u64) -> Value {
    let mut turns: Vec<Value> = (0..steps)
        .map(|n| json!({"text": format!("Step {n} of the survey."), "tool_calls": [{"name": "ls", "args": {"path": format!("area-{n}")}}], "delay_ms": delay_ms}))
        .collect();
    turns.push(json!({"text": "Survey complete."}));
    json!({"rules": [
        {"agent": "lead_agent", "turns": [
            {"tool_calls": [{"name": "task", "args": {"description": "Survey", "prompt": "Survey the areas", "subagent_type": "general-purpose"}}]},
            {"text": "The survey is complete."},
        ]},
        {"agent": "subagent:general-purpose", "turns": turns},
    ]})
}

/// A runtime on a fresh SQLite file with the stamped scripted model; admission sized
/// so that `streams` runs' subagents all execute at once. The store is for the caller
/// to close once it measured: dropped, it would checkpoint and close its file on its
/// writer thread during the next measurement.
async fn runtime(
    dir: &std::path::Path,
    name: &str,
    script: &std::path::Path,
    streams: usize,
    stamps: Stamps,
) -> anyhow::Result<(RuntimeOptions, Arc<SqliteStore>)> {
    let url = format!("sqlite://{}", dir.join(format!("{name}.db")).display());
    let store = Arc::new(SqliteStore::open(&url, 4).await?);
    let options = runtime_on(store.clone(), dir, name, script, streams, stamps)?;
    Ok((options, store))
}

/// A runtime on `store` with the stamped scripted model.
fn runtime_on(
    store: Arc<dyn Store>,
    dir: &std::path::Path,
    name: &str,
    script: &std::path::Path,
    streams: usize,
    stamps: Stamps,
) -> anyhow::Result<RuntimeOptions> {
    let scripted: Arc<dyn ChatModel> = Arc::new(ScriptedModel::new(ScriptedConfig {
        script: Some(script.to_path_buf()),
        demo_delay_ms: 0,
        ..ScriptedConfig::default()
    })?);
    let model: Arc<dyn ChatModel> = Arc::new(Stamped {
        inner: scripted,
        stamps,
    });
    let spill_dir = dir.join(name);
    std::fs::create_dir_all(&spill_dir).context("creating the spill directory")?;
    Ok(RuntimeOptions {
        admission: AdmissionConfig {
            max_running: streams.clamp(1, 64),
            max_queued: 10_000,
            admission_policy: AdmissionPolicy::Queue,
            queue_timeout_seconds: 600,
        },
        ..RuntimeOptions::new(store, vec![model], spill_dir)
    })
}

/// The latency of an AI step's event, if `payload` (as a client parsed it) is one whose
/// finish was stamped.
fn step_latency(payload: &Value, run_id: &str, stamps: &Stamps) -> Option<Duration> {
    if payload["type"] != "task_running" || payload["message"]["type"] != "ai" {
        return None;
    }
    stamped(payload["message"]["content"].as_str()?, run_id, stamps)
}

/// [`step_latency`] of a task event as the runtime's channel carries it.
fn event_latency(event: &TaskEvent, run_id: &str, stamps: &Stamps) -> Option<Duration> {
    let TaskEvent::Running { message, .. } = event else {
        return None;
    };
    let Message::Ai(ai) = message.as_ref() else {
        return None;
    };
    stamped(ai.content.as_str()?, run_id, stamps)
}

/// How long ago the step of `run_id` that answered `text` finished, if it was stamped.
fn stamped(text: &str, run_id: &str, stamps: &Stamps) -> Option<Duration> {
    let stamps = stamps.lock().unwrap_or_else(|p| p.into_inner());
    stamps
        .get(&(run_id.to_owned(), text.to_owned()))
        .map(|finished| finished.elapsed())
}

/// `turns` times in turn, `streams` runs at once through a gateway on `backing`, each
/// followed by its own SSE client.
async fn over_sse(
    dir: &std::path::Path,
    script: &std::path::Path,
    streams: usize,
    turns: usize,
    backing: Backing,
) -> anyhow::Result<Latency> {
    let stamps = Stamps::default();
    let (runtime, sqlite) = match backing {
        Backing::Sqlite => {
            let name = format!("sse-{streams}");
            let (runtime, sqlite) = runtime(dir, &name, script, streams, stamps.clone()).await?;
            (runtime, Some(sqlite))
        }
        Backing::Memory => {
            let name = format!("sse-memory-{streams}");
            let store = Arc::new(MemoryStore::new());
            let runtime = runtime_on(store, dir, &name, script, streams, stamps.clone())?;
            (runtime, None)
        }
    };
    let (base, server) = serve(runtime).await?;
    let client = reqwest::Client::builder().no_proxy().build()?;
    let mut samples = Vec::new();
    for turn in 0..turns {
        let mut clients = Vec::new();
        for n in 0..streams {
            let (client, base, stamps) = (client.clone(), base.clone(), stamps.clone());
            clients.push(tokio::spawn(async move {
                let thread = format!("bench-sse-{turn}-{n}");
                let response = start_run(&client, &base, &thread).await?;
                time_steps(response, &stamps).await
            }));
        }
        for client in clients {
            samples.extend(client.await.context("an SSE client failed")??);
        }
    }
    server.abort();
    // The gateway (and its handle on the store) is gone once its task ended.
    let _ = server.await;
    if let Some(sqlite) = sqlite {
        sqlite.close().await;
    }
    Latency::of(samples)
}

/// A gateway on a free loopback port; its base URL and server task.
async fn serve(
    runtime: RuntimeOptions,
) -> anyhow::Result<(String, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let app =
        AppOptions::new(runtime, vec![ModelListing::named("scripted", "scripted-1")]).build()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(app.run(listener, tokio_util::sync::CancellationToken::new()));
    Ok((base, server))
}

/// `streams` runs executing in gateway A, each followed through gateway B, both on the
/// PostgreSQL database at `url`.
pub async fn across_processes(
    dir: &std::path::Path,
    url: &str,
    streams: usize,
    steps: usize,
    delay_ms: u64,
) -> anyhow::Result<Latency> {
    let path = dir.join("sse-script-postgres.json");
    std::fs::write(&path, script(steps, delay_ms).to_string()).context("writing the script")?;
    let stamps = Stamps::default();
    let mut bases = Vec::new();
    let mut servers = Vec::new();
    for name in ["pg-a", "pg-b"] {
        let store: Arc<dyn Store> = Arc::new(
            subflow_store_postgres::PostgresStore::connect(url, 8)
                .await
                .context("connecting to PostgreSQL")?,
        );
        let runtime = runtime_on(store, dir, name, &path, streams, stamps.clone())?;
        let (base, server) = serve(runtime).await?;
        bases.push(base);
        servers.push(server);
    }
    let client = reqwest::Client::builder().no_proxy().build()?;
    let batch = uuid::Uuid::new_v4().simple().to_string();
    let mut clients = Vec::new();
    for n in 0..streams {
        let (client, a, b, stamps) = (
            client.clone(),
            bases[0].clone(),
            bases[1].clone(),
            stamps.clone(),
        );
        let thread = format!("bench-pg-{}-{n}", &batch[..8]);
        clients.push(tokio::spawn(async move {
            let mut creator = start_run(&client, &a, &thread).await?;
            let mut first = Vec::new();
            while !first.windows(2).any(|w| w == b"\n\n") {
                let chunk = creator
                    .chunk()
                    .await?
                    .context("the run's stream is empty")?;
                first.extend_from_slice(&chunk);
            }
            let metadata = String::from_utf8_lossy(&first);
            let run_id = metadata
                .split("\"run_id\":\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .context("the stream starts with metadata")?
                .to_owned();
            // The creator keeps reading (and discarding) so that A never waits for it.
            let drain =
                tokio::spawn(async move { while let Ok(Some(_)) = creator.chunk().await {} });
            let watcher = client
                .get(format!("{b}/api/threads/{thread}/runs/{run_id}/stream"))
                .send()
                .await?;
            let latencies = time_steps(watcher, &stamps).await;
            drain.abort();
            latencies
        }));
    }
    let mut samples = Vec::new();
    for client in clients {
        samples.extend(client.await.context("a cross-process client failed")??);
    }
    for server in servers {
        server.abort();
    }
    Latency::of(samples)
}

/// Starts a streamed run that goes on without its client (`on_disconnect=continue`).
async fn start_run(
    client: &reqwest::Client,
    base: &str,
    thread: &str,
) -> anyhow::Result<reqwest::Response> {
    let response = client
        .post(format!("{base}/api/threads/{thread}/runs/stream"))
        .json(&json!({"input": {"messages": [{"role": "user", "content": "Survey everything"}]}, "stream_mode": ["custom"], "on_disconnect": "continue"}))
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("starting a run answered {}", response.status());
    }
    Ok(response)
}

/// Reads a run's stream to `end`, timing every AI step as it is parsed.
async fn time_steps(
    mut response: reqwest::Response,
    stamps: &Stamps,
) -> anyhow::Result<Vec<Duration>> {
    if !response.status().is_success() {
        bail!("following a run answered {}", response.status());
    }
    let mut buffer: Vec<u8> = Vec::new();
    let mut run_id = String::new();
    let mut latencies = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let block: Vec<u8> = buffer.drain(..end + 2).collect();
            let block = String::from_utf8_lossy(&block);
            let (mut event, mut data) = ("", "");
            for line in block.lines() {
                if let Some(name) = line.strip_prefix("event: ") {
                    event = name;
                } else if let Some(text) = line.strip_prefix("data: ") {
                    data = text;
                }
            }
            match event {
                "metadata" => {
                    let metadata: Value = serde_json::from_str(data)?;
                    run_id = metadata["run_id"].as_str().unwrap_or_default().to_owned();
                }
                "custom" => {
                    let payload: Value = serde_json::from_str(data)?;
                    if let Some(latency) = step_latency(&payload, &run_id, stamps) {
                        latencies.push(latency);
                    }
                }
                _ => {}
            }
        }
    }
    Ok(latencies)
}

/// The same runs executed by the runtime directly, each read from its output channel
/// by a task of its own.
async fn over_channel(
    dir: &std::path::Path,
    script: &std::path::Path,
    streams: usize,
    turns: usize,
) -> anyhow::Result<Latency> {
    let stamps = Stamps::default();
    let name = format!("channel-{streams}");
    let (options, sqlite) = runtime(dir, &name, script, streams, stamps.clone()).await?;
    let runtime = options.build();
    let mut samples = Vec::new();
    for turn in 0..turns {
        let mut runs = Vec::new();
        for n in 0..streams {
            let (runtime, store, stamps) = (runtime.clone(), sqlite.clone(), stamps.clone());
            runs.push(tokio::spawn(async move {
                let (thread_id, run_id) = (
                    format!("bench-channel-{turn}-{n}"),
                    format!("run-{turn}-{n}"),
                );
                super::create_run(&*store, &thread_id, &run_id).await?;
                let (sink, mut output) = OutputSink::channel();
                let key = run_id.clone();
                let consumer = tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    while let Some(item) = output.recv().await {
                        if let RunOutput::Custom { event, .. } = item
                            && let Some(latency) = event_latency(&event, &key, &stamps)
                        {
                            latencies.push(latency);
                        }
                    }
                    latencies
                });
                let spec = RunSpec {
                    lease_owner: None,
                    thread_id,
                    run_id,
                    user_id: Some("bench".into()),
                    model_name: None,
                    input: vec![Message::human("Survey everything")],
                    trace_id: uuid::Uuid::new_v4().simple().to_string(),
                    delegation_trace: None,
                    cancel: CancellationToken::new(),
                    tasks: Default::default(),
                    timeout: Duration::from_secs(600),
                    trace: Default::default(),
                };
                runtime.run(spec, sink).await;
                anyhow::Ok(consumer.await?)
            }));
        }
        for run in runs {
            samples.extend(run.await.context("a baseline run failed")??);
        }
    }
    sqlite.close().await;
    Latency::of(samples)
}

/// Fewest steps a latency measurement times, so that its 99th percentile is not simply
/// its slowest step.
const MIN_SAMPLES: usize = 200;

/// The latencies of one SSE measurement.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    /// Through a gateway on SQLite.
    pub sse: Latency,
    /// Through a gateway on the in-memory store.
    pub memory: Latency,
    /// From the runtime's output channel.
    pub channel: Latency,
}

/// SSE (on SQLite and on the in-memory store) and channel latency with `streams`
/// concurrent runs of `steps` AI steps each, repeated in turn until at least
/// [`MIN_SAMPLES`] steps are timed.
pub async fn measure(
    dir: &std::path::Path,
    streams: usize,
    steps: usize,
    delay_ms: u64,
) -> anyhow::Result<Measured> {
    let path = dir.join(format!("sse-script-{streams}.json"));
    std::fs::write(&path, script(steps, delay_ms).to_string()).context("writing the script")?;
    // Every AI step is measured, the subagent's final answer included.
    let per_turn = streams * (steps + 1);
    let turns = MIN_SAMPLES.div_ceil(per_turn);
    let channel = over_channel(dir, &path, streams, turns).await?;
    let sse = over_sse(dir, &path, streams, turns, Backing::Sqlite).await?;
    let memory = over_sse(dir, &path, streams, turns, Backing::Memory).await?;
    let expected = per_turn * turns;
    if [sse, memory, channel].iter().any(|l| l.samples != expected) {
        bail!(
            "expected {expected} steps, measured {} over SSE, {} over SSE on the in-memory store and {} from the channel",
            sse.samples,
            memory.samples,
            channel.samples
        );
    }
    Ok(Measured {
        sse,
        memory,
        channel,
    })
}
