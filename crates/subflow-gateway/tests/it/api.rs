//! The runs API, `/events`, models and trace ids.

use serde_json::{Value, json};

use crate::{TestApp, spawn_app};

fn trace_ids(headers: &reqwest::header::HeaderMap) -> Vec<String> {
    headers
        .get_all("x-trace-id")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_run_streams_metadata_first_every_task_event_and_end_last() {
    let app = spawn_app().await;
    let streamed = app
        .stream_run("t-demo", json!({"input": {"messages": [{"role": "user", "content": "Compare two queues"}]}, "stream_mode": ["values", "messages-tuple", "custom"]}))
        .await;
    assert_eq!(streamed.status, 200, "{}", streamed.text);
    assert_eq!(streamed.headers["content-type"], "text/event-stream");
    // A compressing or buffering proxy must pass the frames through as they come.
    assert_eq!(streamed.headers["cache-control"], "no-cache, no-transform");
    assert_eq!(streamed.headers["x-accel-buffering"], "no");
    assert_eq!(trace_ids(&streamed.headers).len(), 1);
    let frames = &streamed.frames;
    assert_eq!(frames.first().unwrap().event, "metadata");
    let run_id = frames[0].data["run_id"].as_str().unwrap().to_owned();
    assert_eq!(frames[0].data["thread_id"], "t-demo");
    // The LangGraph JS SDK reads the new run's ids only from Content-Location.
    assert_eq!(
        streamed.headers["content-location"],
        format!("/api/threads/t-demo/runs/{run_id}").as_str()
    );
    assert_eq!(frames.last().unwrap().event, "end");
    assert_eq!(frames.last().unwrap().data, Value::Null);
    let ids: Vec<u64> = frames
        .iter()
        .map(|f| f.id.as_deref().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        ids,
        (1..=frames.len() as u64).collect::<Vec<_>>(),
        "ids are contiguous from 1"
    );
    let custom: Vec<&Value> = frames
        .iter()
        .filter(|f| f.event == "custom")
        .map(|f| &f.data)
        .collect();
    let completed = custom
        .iter()
        .filter(|c| c["type"] == "task_completed")
        .count();
    assert_eq!(completed, 3);
    assert!(
        custom
            .iter()
            .filter(|c| c["type"] == "task_running")
            .count()
            >= 9
    );
    assert!(
        frames
            .iter()
            .any(|f| f.event == "messages" && f.data[1]["langgraph_node"] == "model")
    );
    assert!(frames.iter().any(|f| f.event == "values"));

    let (status, _, run) = app
        .get_json(&format!("/api/threads/t-demo/runs/{run_id}"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(run["status"], "success");
    assert_eq!(run["trace_id"], trace_ids(&streamed.headers)[0].as_str());
    let (_, _, thread) = app.get_json("/api/threads/t-demo").await;
    assert_eq!(thread["status"], "idle");
    assert!(thread["values"]["messages"].as_array().unwrap().len() >= 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_requested_modes_are_streamed_and_wait_returns_the_final_state() {
    let app = spawn_app().await;
    let streamed = app
        .stream_run(
            "t1",
            json!({"input": {"messages": [{"type": "human", "content": "/echo hi"}]}}),
        )
        .await;
    let events: Vec<&str> = streamed.frames.iter().map(|f| f.event.as_str()).collect();
    assert!(
        events
            .iter()
            .all(|e| ["metadata", "values", "end"].contains(e)),
        "{events:?}"
    );
    let response = app
        .client
        .post(app.url("/api/threads/t2/runs/wait"))
        .json(&json!({"input": {"messages": [{"role": "user", "content": "/echo again"}]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let values: Value = response.json().await.unwrap();
    let last = values["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(last["type"], "ai");
    assert_eq!(last["content"], "echo: again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_page_with_filters_and_reject_bad_parameters() {
    let app = spawn_app().await;
    let streamed = app.stream_run("t-ev", json!({"input": {"messages": [{"role": "user", "content": "/task general-purpose Look"}]}})).await;
    let run_id = streamed.frames[0].data["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let base = format!("/api/threads/t-ev/runs/{run_id}/events");
    let (status, headers, all) = app.get_json(&base).await;
    assert_eq!(status, 200);
    assert_eq!(trace_ids(&headers).len(), 1);
    let all = all.as_array().unwrap().clone();
    let seqs: Vec<i64> = all.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    let task_id = all
        .iter()
        .find(|e| e["event_type"] == "subagent.start")
        .unwrap()["metadata"]["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, _, steps) = app
        .get_json(&format!(
            "{base}?event_types=subagent.step,subagent.end&task_id={task_id}&limit=1"
        ))
        .await;
    assert_eq!(steps.as_array().unwrap().len(), 1);
    assert_eq!(steps[0]["event_type"], "subagent.step");
    let after = steps[0]["seq"].as_i64().unwrap();
    let (_, _, rest) = app
        .get_json(&format!(
            "{base}?event_types=subagent.step,subagent.end&task_id={task_id}&after_seq={after}"
        ))
        .await;
    assert!(
        rest.as_array()
            .unwrap()
            .iter()
            .all(|e| e["seq"].as_i64().unwrap() > after)
    );
    assert_eq!(
        rest.as_array().unwrap().last().unwrap()["event_type"],
        "subagent.end"
    );
    let (status, _, unknown) = app.get_json("/api/threads/t-ev/runs/nope/events").await;
    assert_eq!((status, unknown), (200, json!([])));
    for (query, detail) in [
        ("?limit=0", "limit must be between 1 and 2000, got 0"),
        ("?limit=2001", "limit must be between 1 and 2000, got 2001"),
        ("?after_seq=0", "after_seq must be at least 1"),
        ("?limit=abc", "limit must be an integer, got 'abc'"),
    ] {
        let (status, _, body) = app.get_json(&format!("{base}{query}")).await;
        assert_eq!(status, 422, "{query}");
        assert_eq!(body["detail"], detail);
    }
    let (status, _, body) = app.get_json("/api/threads/bad%20id/runs/r/events").await;
    assert_eq!(status, 422);
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .starts_with("Invalid thread_id")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_run_requests_get_a_422_with_a_detail_never_a_500() {
    let app = spawn_app().await;
    let url = app.url("/api/threads/t1/runs/stream");
    for (body, detail) in [
        (
            json!({"stream_mode": ["values", "debug"]}),
            "Unsupported stream mode(s): debug",
        ),
        (
            json!({"webhook": "http://x"}),
            "Run option 'webhook' is not supported",
        ),
        (
            json!({"interrupt_before": ["tools"]}),
            "Run option 'interrupt_before' is not supported",
        ),
    ] {
        let response = app.client.post(&url).json(&body).send().await.unwrap();
        assert_eq!(response.status(), 422, "{body}");
        assert_eq!(response.headers().get_all("x-trace-id").iter().count(), 1);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["detail"], detail);
    }
    for raw in [
        "{not json",
        "[1,2]",
        r#"{"surprise": 1}"#,
        r#"{"stream_mode": 5}"#,
    ] {
        let response = app
            .client
            .post(&url)
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 422, "{raw}");
        let body: Value = response.json().await.unwrap();
        assert!(
            body["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{raw}"
        );
    }
    let oversized = "x".repeat(2 * 1024 * 1024);
    let response = app.client.post(&url).body(oversized).send().await.unwrap();
    assert_eq!(response.status(), 413);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["detail"],
        "Request body too large: the limit is 1048576 bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_carries_exactly_one_trace_id_following_the_precedence_rules() {
    let app = spawn_app().await;
    let echo = app
        .client
        .get(app.url("/health"))
        .header("x-trace-id", "  my-trace  ")
        .send()
        .await
        .unwrap();
    assert_eq!(trace_ids(echo.headers()), ["my-trace"]);
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let adopted = app
        .client
        .get(app.url("/api/nowhere"))
        .header("traceparent", parent)
        .send()
        .await
        .unwrap();
    assert_eq!(adopted.status(), 404);
    assert_eq!(
        trace_ids(adopted.headers()),
        ["4bf92f3577b34da6a3ce929d0e0e4736"]
    );
    let invalid = app
        .client
        .get(app.url("/health"))
        .header("x-trace-id", "x".repeat(600))
        .send()
        .await
        .unwrap();
    let ids = trace_ids(invalid.headers());
    assert_eq!(ids.len(), 1);
    assert_eq!(ids[0].len(), 32, "an invalid id is replaced by a fresh one");
    // A client's deerflow_trace_id names nothing: the request's id overwrites it (docs/operations.md#trace-ids).
    let streamed = app
        .client
        .post(app.url("/api/threads/t-trace/runs/stream"))
        .header("x-trace-id", "the-request")
        .json(
            &json!({"input": {"messages": [{"role": "user", "content": "/echo x"}]},
            "config": {"metadata": {"deerflow_trace_id": "from-body", "keep": 1}},
            "metadata": {"deerflow_trace_id": "from-body"},
            "context": {"deerflow_trace_id": "from-body"}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(trace_ids(streamed.headers()), ["the-request"]);
    let frames = crate::parse_frames(&streamed.text().await.unwrap());
    let run_id = frames[0].data["run_id"].as_str().unwrap();
    let (_, _, run) = app
        .get_json(&format!("/api/threads/t-trace/runs/{run_id}"))
        .await;
    assert_eq!(run["trace_id"], "the-request");
    assert_eq!(run["metadata"]["deerflow_trace_id"], "the-request");
    assert_eq!(
        run["kwargs"]["config"]["metadata"],
        json!({"deerflow_trace_id": "the-request", "keep": 1})
    );
    assert_eq!(run["kwargs"]["context"]["deerflow_trace_id"], "the-request");
    let (_, _, state) = app.get_json("/api/threads/t-trace/state").await;
    assert_eq!(state["metadata"]["deerflow_trace_id"], "the-request");
    let without_header = app.stream_run("t-trace-2", json!({"input": {"messages": [{"role": "user", "content": "/echo x"}]}, "config": {"metadata": {"deerflow_trace_id": "from-body"}}})).await;
    let fresh = trace_ids(&without_header.headers);
    assert_eq!(fresh.len(), 1);
    assert_eq!(fresh[0].len(), 32, "a fresh id, not the body's: {fresh:?}");
    let (_, _, models) = app.get_json("/api/models").await;
    assert_eq!(models["token_usage"]["enabled"], true);
    assert_eq!(models["models"][0]["name"], "scripted");
    assert_eq!(
        models["models"][0]["pricing"],
        json!({"currency": "USD", "input_per_million": 2.0, "output_per_million": 8.0, "input_cache_hit_per_million": 0.5, "input_cache_write_per_million": 2.5}),
        "cards price live usage at these rates"
    );
    let (_, _, health) = app.get_json("/health").await;
    assert_eq!(health, json!({"status": "ok"}));
    let (_, _, assistant) = app.get_json("/api/assistants/lead_agent").await;
    assert_eq!(
        (
            assistant["assistant_id"].as_str(),
            assistant["graph_id"].as_str()
        ),
        (Some("lead_agent"), Some("lead_agent"))
    );
    let found: Value = app
        .client
        .post(app.url("/api/assistants/search"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(found[0]["assistant_id"], "lead_agent");
    let (_, _, features) = app.get_json("/api/features").await;
    assert_eq!(features["subagent_batches"]["worker_running"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_usage_sums_the_demo_run_by_caller_and_model_with_cost_and_context() {
    let app = spawn_app().await;
    app.stream_run(
        "t-usage",
        json!({"input": {"messages": [{"role": "user", "content": "Compare two caches"}]}}),
    )
    .await;
    let (status, headers, usage) = app.get_json("/api/threads/t-usage/token-usage").await;
    assert_eq!(status, 200);
    assert_eq!(headers.get_all("x-trace-id").iter().count(), 1);
    assert_eq!(usage["thread_id"], "t-usage");
    assert_eq!(usage["total_runs"], 1);
    let total = usage["total_tokens"].as_i64().unwrap();
    let by_caller = &usage["by_caller"];
    assert!(
        by_caller["lead_agent"].as_i64().unwrap() > 0
            && by_caller["subagent"].as_i64().unwrap() > 0
    );
    assert_eq!(
        total,
        by_caller["lead_agent"].as_i64().unwrap()
            + by_caller["subagent"].as_i64().unwrap()
            + by_caller["middleware"].as_i64().unwrap()
    );
    let by_model: i64 = usage["by_model"]
        .as_object()
        .unwrap()
        .values()
        .map(|m| m["tokens"].as_i64().unwrap())
        .sum();
    assert_eq!(by_model, total);
    assert_eq!(usage["cost"]["currency"], "USD");
    assert!(usage["cost"]["total"].as_f64().unwrap() > 0.0);
    assert_eq!(usage["context_usage"]["max_context_tokens"], 128_000);
    assert!(usage["context_usage"]["token_count"].as_u64().unwrap() > 0);
    let (_, _, empty) = app.get_json("/api/threads/t-nothing/token-usage").await;
    assert_eq!(
        (empty["total_tokens"].as_i64(), empty["cost"].clone()),
        (Some(0), Value::Null)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_origin_writes_are_refused_in_local_mode() {
    let app = spawn_app().await;
    let body = json!({"thread_id": "t-origin"});
    let foreign = app
        .client
        .post(app.url("/api/threads"))
        .header("origin", "http://evil.example")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status(), 403);
    assert_eq!(foreign.headers().get_all("x-trace-id").iter().count(), 1);
    let detail: Value = foreign.json().await.unwrap();
    assert_eq!(detail["detail"], "Cross-origin request refused");
    let listed = app
        .client
        .post(app.url("/api/threads"))
        .header("origin", "http://ui.example")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200, "configured origins may write");
    let own_origin = app.base.clone();
    let own = app
        .client
        .post(app.url("/api/threads/search"))
        .header("origin", own_origin)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), 200, "the gateway's own origin may write");
    // A local proxy (a Next.js server on another port) keeps its page's origin; a host
    // that only starts like a loopback name is a stranger.
    for (origin, expected) in [
        ("http://localhost:3000", 200),
        ("http://127.0.0.1:5173", 200),
        ("http://[::1]:3000", 200),
        ("http://localhost.evil.example:3000", 403),
    ] {
        let proxied = app
            .client
            .post(app.url("/api/threads/search"))
            .header("origin", origin)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(proxied.status(), expected, "{origin}");
    }
    let read = app
        .client
        .get(app.url("/api/threads/t-origin"))
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200, "reads are not state-changing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_tokens_in_event_metadata_never_leave_the_server() {
    let app = spawn_app().await;
    app.store
        .create_thread(subflow_store::NewThread {
            thread_id: "t-secret".into(),
            owner: subflow_gateway::LOCAL_USER.into(),
            metadata: Default::default(),
        })
        .await
        .unwrap();
    let metadata = serde_json::Map::from_iter([
        ("auth_token".to_owned(), json!("secret")),
        ("caller".to_owned(), json!("lead_agent")),
    ]);
    let event = subflow_contracts::NewEvent::new(
        "t-secret",
        "r1",
        "run.start",
        "trace",
        json!({"chain": "lead_agent"}),
        metadata,
    );
    app.store.append(&[event]).await.unwrap();
    let (status, _, events) = app.get_json("/api/threads/t-secret/runs/r1/events").await;
    assert_eq!(status, 200);
    assert_eq!(events[0]["metadata"], json!({"caller": "lead_agent"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_run_starts_pending_and_join_returns_its_final_state() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(app.url("/api/threads/t-bg/runs"))
        .json(&json!({"input": {"messages": [{"role": "user", "content": "/echo later"}]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let run: Value = response.json().await.unwrap();
    assert_eq!(run["status"], "pending");
    assert_eq!(run["thread_id"], "t-bg");
    let run_id = run["run_id"].as_str().unwrap();
    let (status, _, values) = app
        .get_json(&format!("/api/threads/t-bg/runs/{run_id}/join"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        values["messages"].as_array().unwrap().last().unwrap()["content"],
        "echo: later"
    );
    let (_, _, run) = app
        .get_json(&format!("/api/threads/t-bg/runs/{run_id}"))
        .await;
    assert_eq!(run["status"], "success");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_describes_the_runs_api() {
    let app = spawn_app().await;
    let (status, headers, document) = app.get_json("/api/openapi.json").await;
    assert_eq!(status, 200);
    assert_eq!(trace_ids(&headers).len(), 1);
    assert_eq!(document["openapi"], "3.1.0");
    let stream = &document["paths"]["/api/threads/{thread_id}/runs/stream"]["post"];
    assert_eq!(stream["x-subflow-permission"], "runs:write");
    assert_eq!(
        stream["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/RunRequest"
    );
    let modes = &document["components"]["schemas"]["StreamMode"]["enum"];
    assert_eq!(
        modes,
        &json!(["values", "messages-tuple", "updates", "custom"])
    );
    assert_eq!(document["paths"]["/health"]["get"]["security"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_asking_for_an_unknown_model_is_a_422_that_names_the_configured_ones() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(app.url("/api/threads/t-model/runs/wait"))
        .json(&json!({"input": {"messages": [{"role": "user", "content": "/echo hi"}]}, "config": {"configurable": {"model_name": "gpt-9"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["detail"],
        "Unknown model 'gpt-9': the configured models are scripted"
    );
    let (status, _, _) = app.get_json("/api/threads/t-model").await;
    assert_eq!(status, 404, "nothing was created");
    let response = app
        .client
        .post(app.url("/api/threads/t-model/runs/wait"))
        .json(&json!({"input": {"messages": [{"role": "user", "content": "/echo hi"}]}, "context": {"model_name": "scripted"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

/// The JSON types a schema names.
fn schema_types(schema: &Value) -> Vec<&str> {
    match &schema["type"] {
        Value::String(one) => vec![one.as_str()],
        Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// A value of the wrong type for a typed parameter's schema (a `$ref`, or a nullable
/// `oneOf`, followed); `None` for free text.
fn wrong_value(document: &Value, schema: &Value) -> Option<&'static str> {
    if let Some(reference) = schema["$ref"].as_str() {
        let name = reference.rsplit('/').next().unwrap();
        return wrong_value(document, &document["components"]["schemas"][name]);
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(wrong) = schema[key]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|branch| wrong_value(document, branch))
        {
            return Some(wrong);
        }
    }
    if schema.get("enum").is_some() || schema["items"].get("enum").is_some() {
        return Some("no-such-value");
    }
    let types = schema_types(schema);
    if types.contains(&"integer") {
        Some("1.5x")
    } else if types.contains(&"boolean") {
        Some("maybe")
    } else {
        None
    }
}

/// The largest value an integer query parameter's schema allows: its `maximum`, else the
/// bound of its `format`; `None` when it is not an integer or has no bound below i64's.
fn documented_maximum(schema: &Value) -> Option<i64> {
    if !schema_types(schema).contains(&"integer") {
        return None;
    }
    schema["maximum"]
        .as_i64()
        .or((schema["format"] == "int32").then_some(i64::from(i32::MAX)))
        .filter(|maximum| *maximum < i64::MAX)
}

/// A query parameter of the document: its operation's method and path, its name and
/// its schema.
struct QueryParameter {
    method: String,
    path: String,
    name: String,
    schema: Value,
}

/// Every query parameter of every operation of the document.
fn query_parameters(document: &Value) -> Vec<QueryParameter> {
    let mut found = Vec::new();
    for (path, operations) in document["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            let parameters = operation["parameters"].as_array().into_iter().flatten();
            for parameter in parameters.filter(|p| p["in"] == "query") {
                found.push(QueryParameter {
                    method: method.clone(),
                    path: path.clone(),
                    name: parameter["name"].as_str().unwrap().to_owned(),
                    schema: parameter["schema"].clone(),
                });
            }
        }
    }
    found
}

impl QueryParameter {
    /// Sends the operation with `ids` in its path and this parameter set to `value`:
    /// the status, and whether the answer is a 422 whose detail names the parameter.
    async fn send(&self, app: &TestApp, ids: [&str; 4], value: &str) -> (u16, bool, Value) {
        let path = self
            .path
            .replace("{thread_id}", ids[0])
            .replace("{run_id}", ids[1])
            .replace("{batch_id}", ids[2])
            .replace("{item_id}", ids[3]);
        let url = app.url(&format!("{path}?{}={value}", self.name));
        let response = app
            .client
            .request(self.method.to_uppercase().parse().unwrap(), url)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let named = body["detail"]
            .as_str()
            .is_some_and(|detail| detail.contains(&self.name));
        (status, status == 422 && named, body)
    }

    fn label(&self) -> String {
        format!("{} {} {}", self.method, self.path, self.name)
    }
}

/// Every bounded integer query parameter takes the document's largest value and refuses
/// the next one (422 naming it), so a client and the server agree on the range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bounded_integer_query_parameter_takes_exactly_its_documented_range() {
    let app = spawn_app().await;
    let (_, _, document) = app.get_json("/api/openapi.json").await;
    // Real ids: some bounds are checked only once the resource is found.
    let streamed = app
        .stream_run(
            "t-range",
            json!({"input": {"messages": [{"role": "user", "content": "hello"}]}}),
        )
        .await;
    assert_eq!(streamed.status, 200);
    let (_, _, runs) = app.get_json("/api/threads/t-range/runs").await;
    let run = runs[0]["run_id"].as_str().unwrap().to_owned();
    let (batch, items) = app.submit_batch("t-range", "default", 1).await;
    let ids = ["t-range", run.as_str(), batch.as_str(), items[0].as_str()];
    let mut checked = Vec::new();
    for parameter in query_parameters(&document) {
        let Some(maximum) = documented_maximum(&parameter.schema) else {
            continue;
        };
        for (value, refused) in [(maximum, false), (maximum + 1, true)] {
            let (status, named, body) = parameter.send(&app, ids, &value.to_string()).await;
            assert_eq!(
                named,
                refused,
                "{}={value}: {status} {body}",
                parameter.label()
            );
        }
        checked.push(parameter.label());
    }
    for bounded in [
        "/items offset",
        "/items limit",
        "/api/runs offset",
        "/events limit",
    ] {
        assert!(
            checked.iter().any(|c| c.ends_with(bounded)),
            "{bounded}: {checked:#?}"
        );
    }
}

/// Every query parameter of the document that is a number, a boolean or an enum, on
/// every route: an empty value and a wrong-typed one are both 422 naming the parameter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_typed_query_parameter_refuses_empty_and_wrong_values_by_name() {
    let app = spawn_app().await;
    let (status, _, document) = app.get_json("/api/openapi.json").await;
    assert_eq!(status, 200);
    let ids = [
        "t-query",
        "r-query",
        "subagent-batch-query",
        "batch-item-query",
    ];
    let mut checked = Vec::new();
    for parameter in query_parameters(&document) {
        let Some(wrong) = wrong_value(&document, &parameter.schema) else {
            continue;
        };
        for value in ["", wrong] {
            let (status, named, body) = parameter.send(&app, ids, value).await;
            assert!(named, "{}={value}: {status} {body}", parameter.label());
        }
        checked.push(parameter.label());
    }
    // The document's typed parameters: limits, offsets, cursors, statuses, flags.
    assert!(checked.len() >= 12, "{checked:#?}");
    assert!(
        checked.iter().any(|c| c.ends_with("/cancel wait")),
        "{checked:#?}"
    );
    for typed in ["/runs status", "/cancel action", "/items status"] {
        assert!(
            checked.iter().any(|c| c.ends_with(typed)),
            "{typed}: {checked:#?}"
        );
    }
}
