//! What the reference's web client asks of threads: search with ids, values, sort and
//! select; metadata merges; renames through a state update; the fallback title; and the
//! backward message page a reloaded chat reads its history from.

use serde_json::{Value, json};

use crate::{Options, TestApp, spawn_app, spawn_app_with};

/// Runs `text` to its end on `thread` (created by the run when new).
async fn run(app: &TestApp, thread: &str, text: &str) -> Value {
    let response = app
        .client
        .post(app.url(&format!("/api/threads/{thread}/runs/wait")))
        .json(&json!({"input": {"messages": [{"type": "human", "content": text}]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

async fn post(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    let response = app
        .client
        .post(app.url(path))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn patch(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    let response = app
        .client
        .patch(app.url(path))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get(app: &TestApp, path: &str) -> (u16, Value) {
    let (status, _, body) = app.get_json(path).await;
    (status, body)
}

fn thread_ids(found: &Value) -> Vec<&str> {
    found
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["thread_id"].as_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_takes_ids_values_sort_and_select() {
    let app = spawn_app().await;
    for (thread, text) in [
        ("s-b", "/echo bee"),
        ("s-c", "/echo sea"),
        ("s-a", "/echo ay"),
    ] {
        run(&app, thread, text).await;
    }
    // Most recently updated first by default; created order and ids either way.
    let (status, found) = post(&app, "/api/threads/search", json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(thread_ids(&found), ["s-a", "s-c", "s-b"]);
    let (_, found) = post(
        &app,
        "/api/threads/search",
        json!({"sort_by": "thread_id", "sort_order": "asc"}),
    )
    .await;
    assert_eq!(thread_ids(&found), ["s-a", "s-b", "s-c"]);
    let (_, found) = post(
        &app,
        "/api/threads/search",
        json!({"sort_by": "created_at", "sort_order": "asc", "ids": ["s-a", "s-b", "nope"]}),
    )
    .await;
    assert_eq!(thread_ids(&found), ["s-b", "s-a"]);
    // The state values' title is the fallback of each thread's first message.
    let (_, found) = post(
        &app,
        "/api/threads/search",
        json!({"values": {"title": "/echo sea"}}),
    )
    .await;
    assert_eq!(thread_ids(&found), ["s-c"]);
    let (_, found) = post(
        &app,
        "/api/threads/search",
        json!({"values": {"title": "/echo sea"}, "offset": 1}),
    )
    .await;
    assert_eq!(found, json!([]));
    // `select` returns exactly the named fields, as the web client's sidebar asks.
    let (_, found) = post(
        &app,
        "/api/threads/search",
        json!({"select": ["thread_id", "updated_at", "values", "metadata"], "limit": 1}),
    )
    .await;
    let thread = found[0].as_object().unwrap();
    let mut keys: Vec<&str> = thread.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["metadata", "thread_id", "updated_at", "values"]);
    assert_eq!(thread["values"]["title"], "/echo ay");
    let (_, found) = post(
        &app,
        "/api/threads/search",
        json!({"select": ["thread_id"], "sort_by": "thread_id"}),
    )
    .await;
    assert_eq!(
        found,
        json!([{"thread_id": "s-c"}, {"thread_id": "s-b"}, {"thread_id": "s-a"}])
    );
    for (body, named) in [
        (json!({"select": ["thread_id", "owner"]}), "owner"),
        (json!({"sort_by": "title"}), "title"),
        (json!({"sort_order": "up"}), "up"),
        (json!({"ids": "s-a"}), "expected a sequence"),
    ] {
        let (status, error) = post(&app, "/api/threads/search", body.clone()).await;
        assert_eq!(status, 422, "{body}");
        let detail = error["detail"].as_str().unwrap();
        assert!(detail.contains(named), "{body}: {detail}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_merges_metadata_and_a_state_update_renames_the_thread() {
    let app = spawn_app().await;
    let (status, _) = post(
        &app,
        "/api/threads",
        json!({"thread_id": "r1", "metadata": {"keep": 1, "agent_name": "old"}}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, thread) = patch(
        &app,
        "/api/threads/r1",
        json!({"metadata": {"agent_name": "writer"}}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        thread["metadata"],
        json!({"keep": 1, "agent_name": "writer"})
    );
    let (_, found) = post(
        &app,
        "/api/threads/search",
        json!({"metadata": {"agent_name": "writer"}}),
    )
    .await;
    assert_eq!(thread_ids(&found), ["r1"]);
    let (status, _) = patch(&app, "/api/threads/nope", json!({"metadata": {}})).await;
    assert_eq!(status, 404);
    let (status, _) = patch(&app, "/api/threads/r1", json!({"metadata": 3})).await;
    assert_eq!(status, 422);

    let answer = run(&app, "r1", "/echo a first question").await;
    assert_eq!(answer["title"], "/echo a first question");
    let (status, written) = post(
        &app,
        "/api/threads/r1/state",
        json!({"values": {"title": "Renamed"}, "as_node": "title"}),
    )
    .await;
    assert_eq!(status, 200, "{written}");
    let checkpoint_id = written["checkpoint"]["checkpoint_id"].as_str().unwrap();
    assert_eq!(written["checkpoint"]["thread_id"], "r1");
    let (_, state) = get(&app, "/api/threads/r1/state").await;
    assert_eq!(state["values"]["title"], "Renamed");
    assert_eq!(state["checkpoint"]["checkpoint_id"], checkpoint_id);
    // The update keeps the conversation.
    assert_eq!(state["values"]["messages"].as_array().unwrap().len(), 2);
    let (_, found) = post(&app, "/api/threads/search", json!({"ids": ["r1"]})).await;
    assert_eq!(found[0]["values"]["title"], "Renamed");
    // A later run keeps the title it was given.
    let answer = run(&app, "r1", "/echo again").await;
    assert_eq!(answer["title"], "Renamed");
    let (_, thread) = get(&app, "/api/threads/r1").await;
    assert_eq!(thread["values"]["title"], "Renamed");

    for (body, named) in [
        (json!({"values": {"title": 7}}), "title"),
        (json!({"values": {"messages": "hi"}}), "messages"),
        (json!({"values": {}, "checkpoint_id": "c"}), "checkpoint_id"),
    ] {
        let (status, error) = post(&app, "/api/threads/r1/state", body.clone()).await;
        assert_eq!(status, 422, "{body}");
        assert!(error["detail"].as_str().unwrap().contains(named), "{error}");
    }
    let (status, _) = post(&app, "/api/threads/nope/state", json!({"values": {}})).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_update_while_a_run_is_in_progress_is_a_409() {
    let app = spawn_app_with(Options {
        delay_ms: 60,
        ..Options::default()
    })
    .await;
    let (status, started) = post(
        &app,
        "/api/threads/busy/runs",
        json!({"input": {"messages": [{"type": "human", "content": "Compare Rust and Go"}]}}),
    )
    .await;
    assert_eq!(status, 200, "{started}");
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    let (status, error) = post(
        &app,
        "/api/threads/busy/state",
        json!({"values": {"title": "Now"}}),
    )
    .await;
    assert_eq!(status, 409, "{error}");
    assert!(error["detail"].as_str().unwrap().contains("in progress"));
    let (status, _) = get(&app, &format!("/api/threads/busy/runs/{run_id}/join")).await;
    assert_eq!(status, 200);
    let (status, _) = post(
        &app,
        "/api/threads/busy/state",
        json!({"values": {"title": "Now"}}),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_title_falls_back_to_the_first_message_cut_at_50_characters() {
    let app = spawn_app().await;
    let long = format!("/echo {}", "word ".repeat(20));
    let answer = run(&app, "long", &long).await;
    let expected = format!("{}...", long[..50].trim_end());
    assert_eq!(answer["title"], expected.as_str());
    assert_eq!(expected.chars().count(), 53);
    let (_, state) = get(&app, "/api/threads/long/state").await;
    assert_eq!(state["values"]["title"], expected.as_str());
}

/// The lead's message events of a thread, as `/events` has them run by run.
async fn message_events(app: &TestApp, thread: &str, runs: &[String]) -> Vec<Value> {
    let mut all = Vec::new();
    for run_id in runs {
        let (_, events) = get(app, &format!(
                "/api/threads/{thread}/runs/{run_id}/events?event_types=llm.human.input,llm.ai.response,llm.tool.result"
            ))
            .await;
        all.extend(events.as_array().unwrap().iter().cloned());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_message_page_runs_back_to_the_start_of_a_three_run_thread() {
    let app = spawn_app().await;
    let mut runs = Vec::new();
    for text in ["Compare Rust and Go for a CLI", "/echo two", "/echo three"] {
        run(&app, "pages", text).await;
        let (_, listed) = get(&app, "/api/threads/pages/runs?limit=1").await;
        runs.push(listed[0]["run_id"].as_str().unwrap().to_owned());
    }
    let expected = message_events(&app, "pages", &runs).await;
    assert!(expected.len() > 6, "the demo run has tool results too");

    // Page back 3 at a time; pages come newest first, each one oldest first.
    let mut pages = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let path = match before {
            Some(seq) => format!("/api/threads/pages/messages/page?limit=3&before_seq={seq}"),
            None => "/api/threads/pages/messages/page?limit=3".to_owned(),
        };
        let (status, page) = get(&app, &path).await;
        assert_eq!(status, 200, "{page}");
        let data = page["data"].as_array().unwrap().clone();
        let has_more = page["has_more"].as_bool().unwrap();
        if has_more {
            assert_eq!(data.len(), 3);
            assert_eq!(page["next_before_seq"], data[0]["seq"]);
            before = data[0]["seq"].as_i64();
        } else {
            assert_eq!(page["next_before_seq"], Value::Null);
        }
        pages.push(data);
        if !has_more {
            break;
        }
    }
    let mut records: Vec<Value> = pages.into_iter().rev().flatten().collect();
    assert_eq!(records.len(), expected.len());
    for record in &records {
        assert_eq!(record["feedback"], Value::Null);
    }
    // Each run's last AI response in its page carries the run's duration in seconds.
    let last_ai = |records: &[Value], run_id: &str| {
        records
            .iter()
            .rposition(|r| r["run_id"] == run_id && r["event_type"] == "llm.ai.response")
            .unwrap()
    };
    let stamped = last_ai(&records, &runs[2]);
    assert!(records[stamped]["turn_duration"].is_i64());
    for record in &mut records {
        let object = record.as_object_mut().unwrap();
        object.remove("feedback");
        object.remove("turn_duration");
    }
    assert_eq!(records, expected);
    // Each record names the message it projects by the id it has in the thread state, so
    // a client merging loaded pages with live messages sees one message, not two.
    let (_, state) = get(&app, "/api/threads/pages/state").await;
    let state_ids: Vec<&Value> = state["values"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["id"])
        .collect();
    let record_ids: Vec<&Value> = records.iter().map(|r| &r["content"]["id"]).collect();
    assert_eq!(record_ids, state_ids);

    // A page exactly the thread's size has nothing more; one short of it has.
    let size = expected.len();
    let (_, page) = get(
        &app,
        &format!("/api/threads/pages/messages/page?limit={size}"),
    )
    .await;
    assert_eq!(page["has_more"], false);
    let (_, page) = get(
        &app,
        &format!("/api/threads/pages/messages/page?limit={}", size - 1),
    )
    .await;
    assert_eq!(page["has_more"], true);
    assert_eq!(page["next_before_seq"], expected[1]["seq"]);
    let first = expected[0]["seq"].as_i64().unwrap();
    let (_, page) = get(
        &app,
        &format!("/api/threads/pages/messages/page?before_seq={first}"),
    )
    .await;
    assert_eq!(
        page,
        json!({"data": [], "has_more": false, "next_before_seq": null})
    );

    for (query, named) in [
        ("after_seq=1", "after_seq"),
        ("limit=0", "limit"),
        ("limit=201", "limit"),
        ("before_seq=0", "before_seq"),
    ] {
        let (status, error) = get(&app, &format!("/api/threads/pages/messages/page?{query}")).await;
        assert_eq!(status, 422, "{query}");
        assert!(error["detail"].as_str().unwrap().contains(named), "{error}");
    }
    // An unknown thread has an empty page.
    let (status, page) = get(&app, "/api/threads/unknown/messages/page").await;
    assert_eq!(status, 200);
    assert_eq!(page["data"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_finds_words_in_titles_and_message_text_on_the_server() {
    let app = spawn_app().await;
    run(&app, "q-alpha", "/echo Alpha beta").await;
    run(&app, "q-alpha", "/echo delta later").await;
    run(&app, "q-gamma", "/echo gamma").await;
    run(&app, "q-other", "/echo nothing here").await;
    let found = |query: &str| {
        let app = &app;
        let query = query.to_owned();
        async move {
            let (status, threads) = post(
                app,
                "/api/threads/search",
                json!({"query": query, "sort_by": "thread_id", "sort_order": "asc"}),
            )
            .await;
            assert_eq!(status, 200, "{threads}");
            thread_ids(&threads)
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(found("ALPHA").await, ["q-alpha"], "the title, any case");
    assert_eq!(found("delta").await, ["q-alpha"], "a later message's text");
    assert_eq!(found("echo: gamma").await, ["q-gamma"], "an answer's text");
    assert_eq!(found("q-oth").await, ["q-other"], "the id");
    assert_eq!(found("echo").await, ["q-alpha", "q-gamma", "q-other"]);
    assert_eq!(found("   ").await.len(), 3, "blank is no filter");
    assert!(found("zebra").await.is_empty());
    // Paged after the filter.
    let (_, page) = post(
        &app,
        "/api/threads/search",
        json!({"query": "echo", "sort_by": "thread_id", "limit": 1, "offset": 1}),
    )
    .await;
    assert_eq!(thread_ids(&page), ["q-gamma"]);
}
