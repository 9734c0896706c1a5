//! `GET /metrics` (docs/operations.md#metrics): the values against `/token-usage` for the same runs, the
//! exposition format line by line, and who may read it.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use subflow_contracts::Permissions;
use subflow_contracts::auth::token_digest;
use subflow_gateway::AuthMode;
use subflow_store::NewToken;

use crate::{Options, TestApp, spawn_app, spawn_app_with};

/// A sample's labels without `le`, sorted: one histogram series.
type Labels = Vec<(String, String)>;

const DEMO: &str = "Compare SQLite and PostgreSQL for our event store";

/// One sample: metric name, labels, value.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed exposition: families (HELP, TYPE) and samples, in order.
#[derive(Debug, Default)]
pub(crate) struct Exposition {
    help: BTreeMap<String, String>,
    types: BTreeMap<String, String>,
    samples: Vec<Sample>,
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(name: &str) -> bool {
    valid_name(name) && !name.contains(':') && !name.starts_with("__")
}

/// Parses `{a="x",b="y\"z"}`; returns the labels and the rest of the line.
fn parse_labels(text: &str) -> (BTreeMap<String, String>, &str) {
    let mut labels = BTreeMap::new();
    let mut rest = text.strip_prefix('{').expect("labels open with {");
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return (labels, after);
        }
        let (name, after) = rest.split_once("=\"").expect("name=\"value\"");
        assert!(valid_label_name(name), "label name {name:?}");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next().expect("a closing quote");
            match c {
                '\\' => match chars.next().expect("an escaped character").1 {
                    'n' => value.push('\n'),
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    other => panic!("invalid escape \\{other}"),
                },
                '"' => break i,
                '\n' => panic!("raw newline in a label value"),
                c => value.push(c),
            }
        };
        assert!(
            labels.insert(name.to_owned(), value).is_none(),
            "duplicate label {name}"
        );
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

fn parse_value(text: &str) -> f64 {
    match text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        _ => text.parse().unwrap_or_else(|_| panic!("value {text:?}")),
    }
}

/// The family a sample belongs to: histogram samples drop their suffix.
fn family_of<'a>(name: &'a str, types: &BTreeMap<String, String>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && types.get(base).map(String::as_str) == Some("histogram")
        {
            return base;
        }
    }
    name
}

/// Parses every line, failing on anything that is not HELP, TYPE or a sample of a
/// family already described.
pub(crate) fn parse(text: &str) -> Exposition {
    let mut exposition = Exposition::default();
    assert!(text.ends_with('\n'), "the exposition ends with a newline");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP name text");
            assert!(valid_name(name), "{line}");
            assert!(!help.is_empty(), "{line}");
            assert!(
                exposition
                    .help
                    .insert(name.to_owned(), help.to_owned())
                    .is_none(),
                "one HELP per family: {line}"
            );
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name type");
            assert!(
                exposition.help.contains_key(name),
                "HELP before TYPE: {line}"
            );
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            if kind == "counter" {
                assert!(name.ends_with("_total"), "counters end in _total: {line}");
            }
            assert!(
                exposition
                    .types
                    .insert(name.to_owned(), kind.to_owned())
                    .is_none(),
                "one TYPE per family: {line}"
            );
        } else {
            assert!(!line.starts_with('#'), "unexpected comment {line}");
            let name_end = line.find(['{', ' ']).expect("a sample line");
            let name = &line[..name_end];
            assert!(valid_name(name), "{line}");
            let (labels, rest) = if line[name_end..].starts_with('{') {
                parse_labels(&line[name_end..])
            } else {
                (BTreeMap::new(), &line[name_end..])
            };
            let value = rest.strip_prefix(' ').expect("a space before the value");
            assert!(!value.contains(' '), "no timestamps: {line}");
            let family = family_of(name, &exposition.types);
            assert!(
                exposition.types.contains_key(family),
                "sample of an undescribed family: {line}"
            );
            exposition.samples.push(Sample {
                name: name.to_owned(),
                labels,
                value: parse_value(value),
            });
        }
    }
    exposition
}

impl Exposition {
    /// The sum of `name` samples whose labels include every pair of `filter`.
    pub(crate) fn sum(&self, name: &str, filter: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                filter
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .sum()
    }

    /// The label values of `label` on `name` samples.
    fn values_of(&self, name: &str, label: &str) -> BTreeSet<String> {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter_map(|s| s.labels.get(label).cloned())
            .collect()
    }
}

pub(crate) async fn scrape(app: &TestApp) -> String {
    let response = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    response.text().await.unwrap()
}

async fn wait_run(app: &TestApp, thread: &str, prompt: &str) {
    let response = app
        .client
        .post(app.url(&format!("/api/threads/{thread}/runs/wait")))
        .json(&json!({"input": {"messages": [{"role": "user", "content": prompt}]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_agree_with_token_usage_for_the_same_runs() {
    let app = spawn_app().await;
    wait_run(&app, "t-metrics", DEMO).await;
    wait_run(&app, "t-metrics", "Now the same for queues").await;
    let (_, _, usage) = app.get_json("/api/threads/t-metrics/token-usage").await;
    let text = scrape(&app).await;
    let m = parse(&text);

    let total = |filter: &[(&str, &str)]| m.sum("subflow_tokens_total", filter);
    let int = |v: &Value| v.as_f64().unwrap();
    assert!(int(&usage["total_tokens"]) > 0.0);
    assert_eq!(
        total(&[("kind", "input")]),
        int(&usage["total_input_tokens"])
    );
    assert_eq!(
        total(&[("kind", "output")]),
        int(&usage["total_output_tokens"])
    );
    for (caller, key) in [("lead_agent", "lead_agent"), ("subagent", "subagent")] {
        let tokens = total(&[("caller", caller), ("kind", "input")])
            + total(&[("caller", caller), ("kind", "output")]);
        assert_eq!(tokens, int(&usage["by_caller"][key]), "{caller}");
    }
    assert_eq!(
        m.values_of("subflow_tokens_total", "agent"),
        BTreeSet::from(["lead_agent".to_owned(), "general-purpose".to_owned()])
    );
    assert!(
        total(&[("kind", "cache_read")]) > 0.0,
        "the demo reads from cache"
    );
    for (model, entry) in usage["by_model"].as_object().unwrap() {
        let tokens = total(&[("model", model), ("kind", "input")])
            + total(&[("model", model), ("kind", "output")]);
        assert_eq!(tokens, int(&entry["tokens"]), "{model}");
    }

    // Cost by the same price math (rounded to 6 decimals in /token-usage).
    let cost = &usage["cost"];
    assert_eq!(cost["currency"], "USD");
    for (model, amount) in cost["by_model"].as_object().unwrap() {
        let metric = m.sum(
            "subflow_cost_total",
            &[("model", model), ("currency", "USD")],
        );
        assert!(
            (metric - int(amount)).abs() < 2e-6,
            "{model}: {metric} against {amount}"
        );
    }

    // Runs, tasks and requests.
    assert_eq!(m.sum("subflow_runs_total", &[("status", "success")]), 2.0);
    assert_eq!(int(&usage["total_runs"]), 2.0);
    assert_eq!(
        m.sum(
            "subflow_run_duration_seconds_count",
            &[("status", "success")]
        ),
        2.0
    );
    let completed = [("agent", "general-purpose"), ("status", "completed")];
    assert_eq!(m.sum("subflow_subagent_tasks_total", &completed), 6.0);
    assert_eq!(
        m.sum("subflow_subagent_duration_seconds_count", &completed),
        6.0
    );
    assert_eq!(
        m.sum(
            "subflow_http_requests_total",
            &[
                ("route", "/api/threads/{thread_id}/runs/wait"),
                ("method", "POST"),
                ("code", "200")
            ]
        ),
        2.0
    );
    assert_eq!(
        m.sum(
            "subflow_http_requests_total",
            &[("route", "/api/threads/{thread_id}/token-usage")]
        ),
        1.0
    );
}

/// Every family of docs/operations.md#metrics.
const FAMILIES: &[(&str, &str)] = &[
    ("subflow_tokens_total", "counter"),
    ("subflow_cost_total", "counter"),
    ("subflow_subagent_tasks_total", "counter"),
    ("subflow_subagent_duration_seconds", "histogram"),
    ("subflow_runs_total", "counter"),
    ("subflow_run_duration_seconds", "histogram"),
    ("subflow_event_store_flush_failures_total", "counter"),
    ("subflow_event_store_pending_events", "gauge"),
    ("subflow_event_store_spilled_events_total", "counter"),
    ("subflow_batch_items", "gauge"),
    ("subflow_batches", "gauge"),
    ("subflow_batch_lease_expirations_total", "counter"),
    ("subflow_batch_workers", "gauge"),
    ("subflow_loop_detection_total", "counter"),
    ("subflow_observer_calls_total", "counter"),
    ("subflow_otlp_spans_dropped_total", "counter"),
    ("subflow_sse_streams", "gauge"),
    ("subflow_http_requests_total", "counter"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exposition_is_valid_prometheus_text_with_every_family() {
    let app = spawn_app().await;
    // An exporter's drop counter exists once one is configured.
    let _dropped = app.metrics.otlp_dropped("otlp");
    let streamed = app
        .stream_run(
            "t-format",
            json!({"input": {"messages": [{"role": "user", "content": DEMO}]}, "stream_mode": ["custom"]}),
        )
        .await;
    assert_eq!(streamed.status, 200);
    let missing = app
        .client
        .get(app.url("/api/nowhere"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    // A label value that needs escaping: a model name with a quote, a backslash and a newline.
    app.metrics.add_cost("odd \"model\\\n", "USD", 0.5);

    let text = scrape(&app).await;
    let m = parse(&text);
    for (family, kind) in FAMILIES {
        assert_eq!(
            m.types.get(*family).map(String::as_str),
            Some(*kind),
            "{family} is described as a {kind}"
        );
        assert!(
            m.samples
                .iter()
                .any(|s| family_of(&s.name, &m.types) == *family),
            "{family} has samples"
        );
    }
    assert_eq!(
        m.sum("subflow_cost_total", &[("model", "odd \"model\\\n")]),
        0.5,
        "escaped label values read back"
    );
    assert_eq!(
        m.sum("subflow_sse_streams", &[]),
        0.0,
        "the stream has ended"
    );
    assert_eq!(
        m.sum(
            "subflow_http_requests_total",
            &[("route", "unmatched"), ("code", "404")]
        ),
        1.0
    );
    assert_eq!(m.sum("subflow_batch_workers", &[]), 0.0);

    // Histograms: per label set, cumulative buckets ending at +Inf = count, and a sum.
    for (family, kind) in &m.types {
        if kind != "histogram" {
            continue;
        }
        let mut series: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
        for sample in m
            .samples
            .iter()
            .filter(|s| s.name == format!("{family}_bucket"))
        {
            let mut key: Vec<(String, String)> = sample.labels.clone().into_iter().collect();
            key.retain(|(k, _)| k != "le");
            let le = parse_value(&sample.labels["le"]);
            series.entry(key).or_default().push((le, sample.value));
        }
        assert!(!series.is_empty(), "{family} has buckets");
        for (key, buckets) in series {
            let labels: Vec<(&str, &str)> =
                key.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            assert!(
                buckets
                    .windows(2)
                    .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
                "{family}{key:?}: bounds increase and counts never decrease: {buckets:?}"
            );
            let (last_bound, last_count) = *buckets.last().unwrap();
            assert_eq!(last_bound, f64::INFINITY, "{family}{key:?} ends at +Inf");
            assert_eq!(last_count, m.sum(&format!("{family}_count"), &labels));
            assert!(m.sum(&format!("{family}_sum"), &labels) >= 0.0);
            assert!(
                m.samples.iter().any(|s| s.name == format!("{family}_sum")),
                "{family} has a _sum"
            );
        }
    }
}

fn fresh_token() -> String {
    format!("sf_{}{}", uuid::Uuid::new_v4().simple(), "Q".repeat(11))
}

async fn token(app: &TestApp, user: &str, permissions: &str) -> String {
    let user = app.store.add_user(user).await.unwrap();
    let token = fresh_token();
    app.store
        .create_token(NewToken {
            user_id: user.id,
            name: None,
            permissions: Permissions::parse_list(permissions).unwrap(),
            expires_at: None,
            digest: token_digest(&token),
        })
        .await
        .unwrap();
    token
}

async fn status(app: &TestApp, token: Option<&str>) -> u16 {
    let mut request = app.client.get(app.url("/metrics"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_mode_needs_admin_unless_public_and_disabled_metrics_are_not_found() {
    let app = spawn_app_with(Options {
        auth: AuthMode::Token,
        ..Options::default()
    })
    .await;
    let reader = token(&app, "ana", "threads:read,runs:read").await;
    let admin = token(&app, "root", "admin").await;
    assert_eq!(status(&app, None).await, 401);
    assert_eq!(status(&app, Some(&fresh_token())).await, 401);
    assert_eq!(status(&app, Some(&reader)).await, 403);
    assert_eq!(status(&app, Some(&admin)).await, 200);

    let public = spawn_app_with(Options {
        auth: AuthMode::Token,
        configure: Box::new(|app| app.metrics_public = true),
        ..Options::default()
    })
    .await;
    assert_eq!(status(&public, None).await, 200);

    let off = spawn_app_with(Options {
        configure: Box::new(|app| app.metrics_enabled = false),
        ..Options::default()
    })
    .await;
    assert_eq!(status(&off, None).await, 404);
}
