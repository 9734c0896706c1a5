//! `subflow bench gateway`: the gateway's read paths over real HTTP on loopback against
//! the same reads straight from the store, the idle memory of `subflow serve`, and the
//! SSE latency of subagent steps with one stream and with many (`sse`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use subflow_contracts::{NewEvent, RunStatus};
use subflow_gateway::{AppOptions, LOCAL_USER, ModelListing, thread_token_usage};
use subflow_models::{ChatModel, ScriptedConfig, ScriptedModel};
use subflow_runtime::runtime::RuntimeOptions;
use subflow_store::{EventQuery, ModelUsage, NewRun, NewThread, RunStatusUpdate, RunUsage, Store};
use subflow_store_sqlite::SqliteStore;

use super::super::UsageError;
use super::{median, sse};

/// Arguments of `subflow bench gateway`.
#[derive(Debug, clap::Args)]
pub struct GatewayArgs {
    /// Requests timed per measurement.
    #[arg(long, default_value_t = 50)]
    requests: usize,
    /// Concurrent streams of the SSE latency measurement (besides the single stream).
    #[arg(long, default_value_t = 100)]
    streams: usize,
    /// AI steps each subagent takes in the SSE latency measurement.
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Milliseconds between a subagent's steps (its model's think time).
    #[arg(long, default_value_t = 10)]
    step_delay_ms: u64,
    /// A PostgreSQL database (it is migrated and gets bench runs) on which to also time
    /// steps of runs executing in one gateway as streamed by another.
    #[arg(long)]
    postgres_url: Option<String>,
}

fn p50(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1000.0
}

/// Runs `subflow bench gateway`.
pub async fn run(args: GatewayArgs) -> anyhow::Result<()> {
    if args.requests == 0 || args.streams == 0 || args.steps == 0 {
        return Err(
            UsageError("--requests, --streams and --steps must be at least 1".into()).into(),
        );
    }
    // The single stream is always measured; `--streams 1` adds no second measurement.
    let stream_counts: Vec<usize> = if args.streams == 1 {
        vec![1]
    } else {
        vec![1, args.streams]
    };
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&url, 4).await?);
    seed(&store).await?;
    let model: Arc<dyn ChatModel> = Arc::new(ScriptedModel::new(ScriptedConfig {
        demo_delay_ms: 0,
        ..ScriptedConfig::default()
    })?);
    let app = AppOptions::new(
        RuntimeOptions::new(store.clone(), vec![model], dir.path().to_path_buf()),
        vec![ModelListing::named("scripted", "scripted-1")],
    )
    .build()?;
    let state = app.state().clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(app.run(listener, tokio_util::sync::CancellationToken::new()));
    let bench = Reads {
        client: reqwest::Client::builder().no_proxy().build()?,
        base,
        store,
        state,
        requests: args.requests,
    };
    eprintln!(
        "bench gateway: {ROUNDS} interleaved rounds of {} requests each; /events pages 500 of 10,000 steps; /token-usage sums 1,000 runs; the in-process baselines run in a spawned task, on a runtime worker as a request's handler does",
        args.requests
    );
    let mut rounds = Vec::new();
    for round in 1..=ROUNDS {
        let reads = bench.measure().await?;
        let idle = idle_serve_rss_mb(dir.path()).await?;
        let mut sse = Vec::new();
        // Each round's runs on databases of their own.
        let round_dir = dir.path().join(format!("round-{round}"));
        std::fs::create_dir_all(&round_dir).context("creating a round's directory")?;
        for &streams in &stream_counts {
            sse.push(sse::measure(&round_dir, streams, args.steps, args.step_delay_ms).await?);
        }
        eprintln!(
            "round {round}: /events {:.3} vs {:.3} ms, /token-usage {:.3} vs {:.3} ms, idle serve {idle:.1} MB, SSE p99 {}",
            reads.events_http,
            reads.events_store,
            reads.usage_http,
            reads.usage_inproc,
            stream_counts
                .iter()
                .zip(&sse)
                .map(|(n, m)| format!(
                    "{n} stream(s) {:.3} (in-memory store {:.3}) vs {:.3} ms",
                    m.sse.p99_ms, m.memory.p99_ms, m.channel.p99_ms
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        rounds.push((reads, idle, sse));
    }
    let of = |pick: &dyn Fn(&Round) -> f64| median(rounds.iter().map(pick).collect());
    let (http, direct) = (of(&|r| r.0.events_http), of(&|r| r.0.events_store));
    let (usage_http, usage_direct) = (of(&|r| r.0.usage_http), of(&|r| r.0.usage_inproc));
    println!(
        "events_http_p50_ms={http:.3} events_store_p50_ms={direct:.3} ratio={:.2} token_usage_p50_ms={usage_http:.3} token_usage_inproc_p50_ms={usage_direct:.3} token_usage_ratio={:.2} serve_idle_rss_mb={:.1}",
        http / direct,
        usage_http / usage_direct,
        of(&|r| r.1),
    );
    let (by_day, by_model) = (of(&|r| r.0.usage_all_day), of(&|r| r.0.usage_all_model));
    eprintln!(
        "bench gateway: /api/usage over the 10,000 runs of ten threads, against one thread's /token-usage (1,000 of them)"
    );
    println!(
        "usage_all_day_p50_ms={by_day:.3} usage_all_model_p50_ms={by_model:.3} usage_all_day_over_thread={:.2}",
        by_day / usage_http
    );
    for (index, &streams) in stream_counts.iter().enumerate() {
        let at = |pick: fn(&sse::Measured) -> sse::Latency| {
            (
                of(&|r| pick(&r.2[index]).p50_ms),
                of(&|r| pick(&r.2[index]).p99_ms),
            )
        };
        let (p50, p99) = at(|m| m.sse);
        let (memory_p50, memory_p99) = at(|m| m.memory);
        let (channel_p50, channel_p99) = at(|m| m.channel);
        eprintln!(
            "bench gateway: SSE latency of {} subagent steps a round ({} per run, {} ms apart) with {streams} concurrent stream(s) (groups of runs one after another until at least 200 steps); baseline: the runtime's output channel; memory_*: the same gateway on the in-memory store",
            rounds[0].2[index].sse.samples, args.steps, args.step_delay_ms
        );
        println!(
            "sse_streams={streams} sse_p50_ms={p50:.3} sse_p99_ms={p99:.3} channel_p50_ms={channel_p50:.3} channel_p99_ms={channel_p99:.3} p50_ratio={:.2} p99_ratio={:.2} memory_p50_ms={memory_p50:.3} memory_p99_ms={memory_p99:.3} memory_p99_ratio={:.2}",
            p50 / channel_p50,
            p99 / channel_p99,
            memory_p99 / channel_p99
        );
    }
    if let Some(url) = &args.postgres_url {
        let local = of(&|r| r.2[0].sse.p50_ms);
        let across =
            sse::across_processes(dir.path(), url, 1, args.steps, args.step_delay_ms).await?;
        eprintln!(
            "bench gateway: a run executing in gateway A streamed through gateway B on PostgreSQL (LISTEN/NOTIFY), against the single local stream"
        );
        println!(
            "cross_process_p50_ms={:.3} cross_process_p99_ms={:.3} local_p50_ms={local:.3} p50_ratio={:.2}",
            across.p50_ms,
            across.p99_ms,
            across.p50_ms / local
        );
    }
    Ok(())
}

/// Rounds of every measurement, interleaved; the medians are printed.
const ROUNDS: usize = 3;

/// One round: the read paths, idle serve's memory, and SSE (on SQLite and on the
/// in-memory store) against the channel by stream count.
type Round = (ReadTimes, f64, Vec<sse::Measured>);

/// The gateway under test and what its read paths are timed against.
struct Reads {
    client: reqwest::Client,
    base: String,
    store: Arc<dyn Store>,
    state: subflow_gateway::AppState,
    requests: usize,
}

/// The medians of one round of [`Reads::measure`], in milliseconds.
struct ReadTimes {
    events_http: f64,
    events_store: f64,
    usage_http: f64,
    usage_inproc: f64,
    usage_all_day: f64,
    usage_all_model: f64,
}

impl Reads {
    /// Times each read path `requests` times over HTTP and in-process.
    async fn measure(&self) -> anyhow::Result<ReadTimes> {
        let mut over_http = Vec::new();
        let mut from_store = Vec::new();
        let page = "/api/threads/bench/runs/run-events/events?event_types=subagent.step&task_id=call_a&limit=500";
        let mut query = EventQuery::run("bench", "run-events");
        query.task_id = Some("call_a".into());
        query.event_types = Some(vec!["subagent.step".into()]);
        let query = Arc::new(query);
        for _ in 0..self.requests {
            let (elapsed, body) = self.get(page).await?;
            over_http.push(elapsed);
            if body.len() < 1000 {
                bail!("the events page came back short");
            }
            let (store, query) = (self.store.clone(), query.clone());
            let (elapsed, rows) = on_worker(async move { store.list_events(&query).await }).await?;
            from_store.push(elapsed);
            if rows?.len() != 500 {
                bail!("the store returned a short page");
            }
        }
        let (mut usage, mut usage_direct) = (Vec::new(), Vec::new());
        for _ in 0..self.requests {
            let (elapsed, body) = self.get("/api/threads/bench-usage/token-usage").await?;
            usage.push(elapsed);
            let body: serde_json::Value = serde_json::from_slice(&body)?;
            if body["total_runs"] != 1000 {
                bail!("token-usage counted {} runs", body["total_runs"]);
            }
            let state = self.state.clone();
            let (elapsed, direct) = on_worker(async move {
                thread_token_usage(&state, LOCAL_USER, "bench-usage", true, false)
                    .await
                    .map(|usage| (usage.total_runs, serde_json::to_vec(&usage)))
            })
            .await?;
            usage_direct.push(elapsed);
            match direct {
                Ok((1000, Ok(text))) if text.len() >= 100 => {}
                _ => bail!("the in-process token usage did not count the 1,000 runs"),
            }
        }
        // `/api/usage` over all 10,000 runs of the ten threads, by day and by model.
        let mut across = [Vec::new(), Vec::new()];
        for _ in 0..self.requests {
            for (samples, by) in across.iter_mut().zip(["day", "model"]) {
                let (elapsed, body) = self.get(&format!("/api/usage?group_by={by}")).await?;
                samples.push(elapsed);
                let body: serde_json::Value = serde_json::from_slice(&body)?;
                if body["counted"]["runs"] != USAGE_THREADS * RUNS_PER_THREAD {
                    bail!("/api/usage counted {} runs", body["counted"]["runs"]);
                }
            }
        }
        let [usage_all_day, usage_all_model] = across.map(p50);
        Ok(ReadTimes {
            events_http: p50(over_http),
            events_store: p50(from_store),
            usage_http: p50(usage),
            usage_inproc: p50(usage_direct),
            usage_all_day,
            usage_all_model,
        })
    }
}

impl Reads {
    /// A GET of `path` on the gateway: how long until its whole body arrived, and the body.
    async fn get(&self, path: &str) -> anyhow::Result<(Duration, Vec<u8>)> {
        let started = Instant::now();
        let body = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await?
            .bytes()
            .await?;
        Ok((started.elapsed(), body.to_vec()))
    }
}

/// Runs `work` in a spawned task, on a runtime worker as a request's handler runs: how
/// long it took there, and its output.
async fn on_worker<T: Send + 'static>(
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> anyhow::Result<(Duration, T)> {
    Ok(tokio::spawn(async move {
        let started = Instant::now();
        let output = work.await;
        (started.elapsed(), output)
    })
    .await?)
}

/// Threads of finished runs `/api/usage` sums; the first is the one `/token-usage` sums.
const USAGE_THREADS: u64 = 10;

/// Finished runs in each of them.
const RUNS_PER_THREAD: u64 = 1_000;

/// The name of the `n`th thread of finished runs.
fn usage_thread(n: u64) -> String {
    if n == 0 {
        "bench-usage".to_owned()
    } else {
        format!("bench-usage-{n}")
    }
}

/// 10,000 steps of one task among 20,000 in a run, and ten threads of 1,000 finished
/// runs each, every thread owned by the local user so the gateway serves them.
async fn seed(store: &Arc<dyn Store>) -> anyhow::Result<()> {
    let threads = ["bench".to_owned()]
        .into_iter()
        .chain((0..USAGE_THREADS).map(usage_thread));
    for thread_id in threads {
        store
            .create_thread(NewThread {
                thread_id,
                owner: LOCAL_USER.into(),
                metadata: Default::default(),
            })
            .await?;
    }
    let mut batch = Vec::new();
    for index in 1..=10_000u64 {
        for task in ["call_a", "call_b"] {
            let content = json!({"task_id": task, "message_index": index, "kind": "ai", "text": format!("Step {index} of the survey, with a few findings written to notes."), "truncated": false, "tool_calls": []});
            let metadata = serde_json::Map::from_iter([
                ("task_id".to_owned(), json!(task)),
                ("message_index".to_owned(), json!(index)),
            ]);
            batch.push(NewEvent::new(
                "bench",
                "run-events",
                "subagent.step",
                "subagent",
                content,
                metadata,
            ));
        }
        if batch.len() >= 2000 {
            store.append(&batch).await?;
            batch.clear();
        }
    }
    store.append(&batch).await?;
    for thread in 0..USAGE_THREADS {
        // A hundred runs at a time, so their writes share the store's group commits.
        for first in (0..RUNS_PER_THREAD).step_by(100) {
            let runs = (first..first + 100).map(|n| finished_run(store, thread, n));
            futures::future::try_join_all(runs).await?;
        }
    }
    Ok(())
}

/// One finished run of the `thread`th usage thread, with a bucket of 1,000 tokens.
async fn finished_run(store: &Arc<dyn Store>, thread: u64, n: u64) -> anyhow::Result<()> {
    let run_id = format!("usage-{thread}-{n:04}");
    store
        .create_run(NewRun {
            run_id: run_id.clone(),
            thread_id: usage_thread(thread),
            owner: LOCAL_USER.into(),
            assistant_id: "lead_agent".into(),
            model_name: Some("scripted".into()),
            trace_id: None,
            metadata: Default::default(),
            multitask_strategy: "reject".into(),
            kwargs: json!({}),
        })
        .await?;
    let bucket = ModelUsage {
        input_tokens: 900,
        output_tokens: 100,
        total_tokens: 1000,
        cache_read_tokens: Some(300),
        cache_write_tokens: None,
    };
    let usage = RunUsage {
        total_input_tokens: 900,
        total_output_tokens: 100,
        total_tokens: 1000,
        llm_call_count: 2,
        lead_agent_tokens: 600,
        subagent_tokens: 400,
        token_usage_by_model: [("scripted".to_owned(), bucket)].into(),
        ..RunUsage::default()
    };
    store.save_run_usage(&run_id, &usage, None).await?;
    store
        .update_run_status(
            &run_id,
            &RunStatusUpdate {
                lease_owner: None,
                status: RunStatus::Success,
                stop_reason: None,
                error: None,
            },
        )
        .await?;
    Ok(())
}

/// Starts `subflow serve` on a free port, lets it settle, and reads its resident memory.
async fn idle_serve_rss_mb(dir: &std::path::Path) -> anyhow::Result<f64> {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(dir)
        .env("SUBFLOW_LOG", "warn")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting subflow serve")?;
    let mut lines =
        tokio::io::BufReader::new(child.stderr.take().context("serve's stderr")?).lines();
    while let Some(line) = lines.next_line().await? {
        if line.contains("listening on") {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = child.id().context("serve's pid")?;
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading serve's memory")?;
    child.kill().await.ok();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .context("VmRSS in /proc")?;
    Ok(kb / 1024.0)
}
