//! The durable-batch routes over real HTTP (docs/batches.md, docs/batches.md#capability): projections,
//! paging, the export, the controls with their exact refusals, ownership, and
//! `/api/features`. A stand-in worker drives items through the store's worker calls.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use subflow_batches::Worker;
use subflow_contracts::BatchItemStatus;
use subflow_gateway::AuthMode;
use subflow_store::Store;
use subflow_store::batches::{
    BatchScope, ClaimRequest, ClaimedItem, ItemSuccess, ItemUsage, Renewal, WorkerHeartbeat,
};
use subflow_store_postgres::PostgresStore;
use subflow_store_postgres::testing::TestDb;

use crate::{Options as AppTestOptions, TestApp, spawn_app, spawn_app_with, spawn_app_with_worker};

/// One answer: status and JSON body (null when the body is not JSON).
async fn send(app: &TestApp, method: &str, path: &str) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let response = app
        .client
        .request(method, app.url(path))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn batches(thread: &str) -> String {
    format!("/api/threads/{thread}/subagent-batches")
}

fn batch_path(thread: &str, batch: &str, rest: &str) -> String {
    format!("/api/threads/{thread}/subagent-batches/{batch}{rest}")
}

fn detail(text: &str) -> Value {
    json!({"detail": text})
}

/// A stand-in worker's claim pass.
async fn claim(app: &TestApp, free_slots: u32) -> Vec<ClaimedItem> {
    app.store
        .claim_pass(&ClaimRequest {
            hostname: "stand-in".into(),
            worker_id: "1".repeat(32),
            free_slots,
            lease: Duration::from_secs(60),
            admitted: 0,
        })
        .await
        .unwrap()
        .claimed
}

fn success(text: &str) -> ItemSuccess {
    ItemSuccess {
        result: text.into(),
        result_preview: text.chars().take(8).collect(),
        result_truncated: false,
        model_name: Some("scripted".into()),
        stop_reason: None,
        token_usage: Some(ItemUsage {
            input_tokens: 3,
            output_tokens: 2,
            total_tokens: 5,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
        }),
    }
}

/// The public batch fields, plus the additive progress and budget ones.
const PUBLIC_BATCH_KEYS: [&str; 20] = [
    "budget",
    "completed_at",
    "cost",
    "counts",
    "created_at",
    "eta_seconds",
    "id",
    "items_per_minute",
    "max_attempts",
    "max_live_items",
    "max_running_items",
    "pause_reason",
    "projected_cost",
    "status",
    "subagent_type",
    "thread_id",
    "title",
    "total_items",
    "updated_at",
    "usage",
];

/// The public item fields, plus the additive `retries`.
const PUBLIC_ITEM_KEYS: [&str; 19] = [
    "acceptance_criteria",
    "acceptance_verdict",
    "attempt",
    "batch_id",
    "completed_at",
    "created_at",
    "error",
    "id",
    "item_key",
    "model_name",
    "position",
    "result_preview",
    "result_truncated",
    "retries",
    "started_at",
    "status",
    "stop_reason",
    "token_usage",
    "updated_at",
];

fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_and_its_items_show_only_their_public_fields_newest_first_and_paged() {
    let app = spawn_app().await;
    let (older, _) = app.submit_batch("t1", "default", 2).await;
    let (newer, items) = app.submit_batch("t1", "default", 5).await;
    app.submit_batch("t2", "default", 1).await;

    let (status, listed) = send(&app, "GET", &batches("t1")).await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [newer.as_str(), older.as_str()],
        "newest first, this thread only"
    );
    let (_, one) = send(&app, "GET", &format!("{}?limit=1", batches("t1"))).await;
    assert_eq!(one.as_array().unwrap().len(), 1);

    let (status, batch) = send(&app, "GET", &batch_path("t1", &newer, "")).await;
    assert_eq!(status, 200);
    assert_eq!(keys(&batch), PUBLIC_BATCH_KEYS);
    assert_eq!(batch["status"], "queued");
    assert_eq!(batch["total_items"], 5);
    assert_eq!(
        batch["counts"],
        json!({"pending": 5, "queued": 0, "leased": 0, "running": 0, "succeeded": 0, "failed": 0, "cancelled": 0})
    );

    let (status, page) = send(
        &app,
        "GET",
        &batch_path("t1", &newer, "/items?offset=1&limit=2"),
    )
    .await;
    assert_eq!(status, 200);
    let page = page.as_array().unwrap();
    assert_eq!(keys(&page[0]), PUBLIC_ITEM_KEYS);
    let positions: Vec<(u64, &str)> = page
        .iter()
        .map(|i| (i["position"].as_u64().unwrap(), i["id"].as_str().unwrap()))
        .collect();
    assert_eq!(positions, [(1, items[1].as_str()), (2, items[2].as_str())]);

    // One item finishes; the status filter finds it, and only it.
    let claimed = claim(&app, 1).await;
    let done = &claimed[0];
    app.store
        .finish_success(&done.lease(), &success("the full result"))
        .await
        .unwrap();
    let filtered = batch_path("t1", &done.item.batch_id, "/items?status=succeeded");
    let (_, succeeded) = send(&app, "GET", &filtered).await;
    let succeeded = succeeded.as_array().unwrap();
    assert_eq!(succeeded.len(), 1);
    assert_eq!(succeeded[0]["id"], done.item.id.as_str());
    assert_eq!(succeeded[0]["result_preview"], "the full");
    assert_eq!(
        succeeded[0]["token_usage"],
        json!({"input_tokens": 3, "output_tokens": 2, "total_tokens": 5})
    );
    assert!(
        !succeeded[0].to_string().contains("the full result"),
        "no result outside the export"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batch_answer_carries_its_progress_and_spend_and_a_paused_batch_no_eta() {
    let app = spawn_app().await;
    let (id, _) = app.submit_batch("t1", "default", 10).await;
    let (_, fresh) = send(&app, "GET", &batch_path("t1", &id, "")).await;
    assert_eq!(
        fresh["usage"],
        json!({"input_tokens": 0, "output_tokens": 0, "total_tokens": 0})
    );
    assert_eq!(
        (
            &fresh["cost"],
            &fresh["eta_seconds"],
            &fresh["projected_cost"]
        ),
        (&Value::Null, &Value::Null, &Value::Null),
        "nothing to estimate before a completion"
    );
    assert_eq!(fresh["items_per_minute"], 0.0);

    let claimed = claim(&app, 4).await;
    for done in &claimed[..2] {
        app.store
            .finish_success(&done.lease(), &success("done"))
            .await
            .unwrap();
    }
    let (_, running) = send(&app, "GET", &batch_path("t1", &id, "")).await;
    assert_eq!(running["status"], "running");
    assert_eq!(
        running["usage"],
        json!({"input_tokens": 6, "output_tokens": 4, "total_tokens": 10})
    );
    // `scripted` costs 2 and 8 per million: 22e-6 an item, 8 items left.
    assert_eq!(
        running["cost"],
        json!({"currency": "USD", "total": 0.000044, "by_model": {"scripted": 0.000044}})
    );
    assert_eq!(running["projected_cost"], 0.00022);
    assert!(running["items_per_minute"].as_f64().unwrap() > 0.0);
    assert!(running["eta_seconds"].as_u64().unwrap() > 0, "{running}");
    let (_, listed) = send(&app, "GET", &batches("t1")).await;
    assert_eq!(
        listed[0]["cost"], running["cost"],
        "the list carries it too"
    );

    let (status, paused) = send(&app, "POST", &batch_path("t1", &id, "/pause")).await;
    assert_eq!(status, 200);
    assert_eq!(paused["status"], "paused");
    assert_eq!(
        paused["eta_seconds"],
        Value::Null,
        "a paused batch does not move"
    );
    assert_eq!(paused["projected_cost"], 0.00022);
    let (_, resumed) = send(&app, "POST", &batch_path("t1", &id, "/resume")).await;
    assert!(resumed["eta_seconds"].as_u64().is_some(), "{resumed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_id_alone_finds_the_callers_batch_in_any_thread_and_nobody_elses() {
    let app = spawn_app().await;
    let (mine, _) = app.submit_batch("t7", "default", 2).await;
    let (theirs, _) = app.submit_batch("t8", "someone-else", 1).await;
    let (status, found) = send(&app, "GET", &format!("/api/subagent-batches/{mine}")).await;
    assert_eq!(status, 200);
    assert_eq!(found["thread_id"], "t7");
    let (_, direct) = send(&app, "GET", &batch_path("t7", &mine, "")).await;
    assert_eq!(found, direct, "the same projection as the thread route");
    for missing in [theirs.as_str(), "subagent-batch-nope"] {
        let answer = send(&app, "GET", &format!("/api/subagent-batches/{missing}")).await;
        assert_eq!(answer, (404, detail("Subagent batch not found")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_export_streams_every_item_with_its_result_in_position_order_across_pages() {
    let app = spawn_app().await;
    let (batch, items) = app.submit_batch("t1", "default", 1201).await;
    // Finish a few, one of them past the first page of 500.
    let mut finished = std::collections::HashMap::new();
    for claimed in claim(&app, 50).await {
        let text = format!("result of {}", claimed.item.item_key);
        app.store
            .finish_success(&claimed.lease(), &success(&text))
            .await
            .unwrap();
        finished.insert(claimed.item.id.clone(), text);
    }
    let response = app
        .client
        .get(app.url(&batch_path("t1", &batch, "/results.jsonl")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    assert_eq!(
        response.headers()["content-disposition"],
        format!("attachment; filename=\"{batch}-results.jsonl\"").as_str()
    );
    let text = response.text().await.unwrap();
    assert!(text.ends_with('\n'));
    let lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 1201, "every item once, no header line");
    for (position, line) in lines.iter().enumerate() {
        assert_eq!(line["position"], position as u64);
        assert_eq!(line["id"], items[position].as_str());
        let mut public = keys(line);
        public.retain(|k| *k != "result");
        assert_eq!(public, PUBLIC_ITEM_KEYS);
        let expected = finished.get(&items[position]).map(String::as_str);
        assert_eq!(line["result"].as_str(), expected, "position {position}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_queries_are_422_with_exact_texts_and_missing_batches_404_on_every_route() {
    let app = spawn_app().await;
    let (batch, _) = app.submit_batch("t1", "default", 1).await;
    for (path, text) in [
        (
            format!("{}?limit=0", batches("t1")),
            "limit must be between 1 and 100, got 0",
        ),
        (
            format!("{}?limit=101", batches("t1")),
            "limit must be between 1 and 100, got 101",
        ),
        (
            format!("{}?limit=abc", batches("t1")),
            "limit must be a non-negative integer, got 'abc'",
        ),
        (
            batch_path("t1", &batch, "/items?status=done"),
            "Unknown batch item status",
        ),
        (
            batch_path("t1", &batch, "/items?limit=501"),
            "limit must be between 1 and 500, got 501",
        ),
        (
            batch_path("t1", &batch, "/items?limit=0"),
            "limit must be between 1 and 500, got 0",
        ),
        (
            batch_path("t1", &batch, "/items?offset=-1"),
            "offset must be a non-negative integer, got '-1'",
        ),
    ] {
        let (status, body) = send(&app, "GET", &path).await;
        assert_eq!((status, body), (422, detail(text)), "{path}");
    }
    // An unknown id, and a real batch under another thread of the same user.
    for (thread, id) in [("t1", "subagent-batch-unknown"), ("t2", batch.as_str())] {
        for (method, rest) in [
            ("GET", ""),
            ("GET", "/items"),
            ("GET", "/results.jsonl"),
            ("POST", "/pause"),
            ("POST", "/resume"),
            ("POST", "/cancel"),
            ("POST", "/items/batch-item-x/retry"),
        ] {
            let path = batch_path(thread, id, rest);
            let (status, body) = send(&app, method, &path).await;
            assert_eq!(
                (status, body),
                (404, detail("Subagent batch not found")),
                "{method} {path}"
            );
        }
    }
    let (status, body) = send(&app, "GET", &batches("bad id!")).await;
    assert_eq!(status, 422, "{body}");
    let (_, listed) = send(&app, "GET", &batches("t-never")).await;
    assert_eq!(listed, json!([]), "an unknown thread lists nothing");
    // Nothing moved.
    let (_, still) = send(&app, "GET", &batch_path("t1", &batch, "")).await;
    assert_eq!(still["status"], "queued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_claims_until_resume_and_both_are_no_ops_where_they_do_not_apply() {
    let app = spawn_app().await;
    let (batch, _) = app.submit_batch("t1", "default", 3).await;
    let (status, paused) = send(&app, "POST", &batch_path("t1", &batch, "/pause")).await;
    assert_eq!((status, paused["status"].as_str()), (200, Some("paused")));
    let (status, again) = send(&app, "POST", &batch_path("t1", &batch, "/pause")).await;
    assert_eq!((status, again["status"].as_str()), (200, Some("paused")));
    assert!(
        claim(&app, 3).await.is_empty(),
        "a paused batch is not claimed"
    );

    let (status, resumed) = send(&app, "POST", &batch_path("t1", &batch, "/resume")).await;
    assert_eq!((status, resumed["status"].as_str()), (200, Some("queued")));
    let (status, noop) = send(&app, "POST", &batch_path("t1", &batch, "/resume")).await;
    assert_eq!((status, noop["status"].as_str()), (200, Some("queued")));
    assert_eq!(claim(&app, 3).await.len(), 3, "claims go on after resume");
    let (_, running) = send(&app, "GET", &batch_path("t1", &batch, "")).await;
    assert_eq!(running["status"], "running");
    assert_eq!(running["counts"]["leased"], 3);

    // Once the batch has ended, pause and resume are refused, not silently ignored.
    let (status, _) = send(&app, "POST", &batch_path("t1", &batch, "/cancel")).await;
    assert_eq!(status, 200);
    for control in ["/pause", "/resume"] {
        let (status, refused) = send(&app, "POST", &batch_path("t1", &batch, control)).await;
        assert_eq!(status, 409, "{control}");
        assert_eq!(
            refused["detail"],
            format!(
                "Batch {batch} has already ended (cancelled): only a queued, running or paused batch can be paused or resumed"
            )
        );
    }
    let (_, still) = send(&app, "GET", &batch_path("t1", &batch, "")).await;
    assert_eq!(still["status"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_cancels_every_unfinished_item_at_once_and_fences_out_the_worker() {
    let app = spawn_app().await;
    let (batch, _) = app.submit_batch("t1", "default", 4).await;
    let claimed = claim(&app, 2).await;
    assert!(app.store.mark_running(&claimed[0].lease()).await.unwrap());
    let (status, cancelled) = send(&app, "POST", &batch_path("t1", &batch, "/cancel")).await;
    assert_eq!(status, 200);
    assert_eq!(cancelled["status"], "cancelled");
    assert!(cancelled["completed_at"].is_string());
    assert_eq!(
        cancelled["counts"],
        json!({"pending": 0, "queued": 0, "leased": 0, "running": 0, "succeeded": 0, "failed": 0, "cancelled": 4})
    );
    // The worker still running item 0 learns at its renewal and can write nothing.
    let lease = claimed[0].lease();
    let renewal = app
        .store
        .renew_lease(&lease, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        matches!(renewal, Renewal::CancelRequested | Renewal::Lost),
        "{renewal:?}"
    );
    assert_eq!(
        app.store
            .finish_success(&lease, &success("late"))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        app.store
            .finish_success(&claimed[1].lease(), &success("late"))
            .await
            .unwrap(),
        None
    );
    let (_, items) = send(&app, "GET", &batch_path("t1", &batch, "/items")).await;
    for item in items.as_array().unwrap() {
        assert_eq!(item["status"], "cancelled");
        assert_eq!(item["error"], "Cancelled by user");
        assert_eq!(item["result_preview"], Value::Null);
    }
    // Cancelling a finished batch changes nothing.
    let (status, again) = send(&app, "POST", &batch_path("t1", &batch, "/cancel")).await;
    assert_eq!((status, &again), (200, &cancelled));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_is_503_when_batches_are_disabled() {
    let app = spawn_app_with(AppTestOptions {
        configure: Box::new(|app| app.batches.enabled = false),
        ..AppTestOptions::default()
    })
    .await;
    let (batch, _) = app.submit_batch("t1", "default", 1).await;
    let (status, body) = send(&app, "POST", &batch_path("t1", &batch, "/cancel")).await;
    assert_eq!(
        (status, body),
        (503, detail("Subagent batch worker is not running"))
    );
    let (_, still) = send(&app, "GET", &batch_path("t1", &batch, "")).await;
    assert_eq!(
        still["status"], "queued",
        "history stays readable, nothing changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrying_a_failed_item_revives_the_batch_and_anything_else_is_409() {
    let app = spawn_app().await;
    let (batch, item) = app.failed_batch("t1", "default").await;
    let (_, failed) = send(&app, "GET", &batch_path("t1", &batch, "")).await;
    assert_eq!(failed["status"], "failed");
    assert!(failed["completed_at"].is_string());

    let retry = |item: &str| batch_path("t1", &batch, &format!("/items/{item}/retry"));
    let (status, retried) = send(&app, "POST", &retry(&item)).await;
    assert_eq!(status, 200);
    assert_eq!(keys(&retried), PUBLIC_ITEM_KEYS);
    assert_eq!(retried["status"], "pending");
    assert_eq!(retried["attempt"], 0);
    assert_eq!(retried["retries"], 1, "the retry is counted");
    assert_eq!(retried["error"], Value::Null);
    let (_, revived) = send(&app, "GET", &batch_path("t1", &batch, "")).await;
    assert_eq!(revived["status"], "queued");
    assert_eq!(revived["completed_at"], Value::Null);
    assert_eq!(revived["counts"]["pending"], 1);

    let only_failed = detail("Only failed items can be retried");
    // Pending now, unknown, and an item of another batch of the same user.
    let (other_batch, other_item) = app.batch_with_failure("t1", "default", 2).await;
    for id in [item.as_str(), "batch-item-unknown", other_item.as_str()] {
        let (status, body) = send(&app, "POST", &retry(id)).await;
        assert_eq!((status, &body), (409, &only_failed), "{id}");
    }
    // A cancelled batch's failed items stay as they are.
    let (_, cancelled) = send(&app, "POST", &batch_path("t1", &other_batch, "/cancel")).await;
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["counts"]["failed"], 1);
    let path = batch_path("t1", &other_batch, &format!("/items/{other_item}/retry"));
    let (status, body) = send(&app, "POST", &path).await;
    assert_eq!(
        (status, body),
        (409, detail("Items of a cancelled batch cannot be retried"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_batch_is_404_on_every_route_even_in_the_callers_own_thread() {
    let app = spawn_app_with(AppTestOptions {
        auth: AuthMode::Token,
        ..AppTestOptions::default()
    })
    .await;
    let alice = app.store.add_user("alice").await.unwrap();
    let bob = app.store.add_user("bob").await.unwrap();
    let token = |user: &subflow_store::User| {
        let store = app.store.clone();
        let user = user.id.clone();
        async move {
            let token = format!("sf_{}{}", uuid::Uuid::new_v4().simple(), "Q".repeat(11));
            store
                .create_token(subflow_store::NewToken {
                    user_id: user,
                    name: None,
                    permissions: subflow_contracts::Permissions::admin(),
                    expires_at: None,
                    digest: subflow_contracts::auth::token_digest(&token),
                })
                .await
                .unwrap();
            token
        }
    };
    let bob_token = token(&bob).await;
    // Alice's batch sits in a thread id bob also uses (threads are owned per id, so the
    // batch names bob's thread while belonging to alice).
    let create = app
        .client
        .post(app.url("/api/threads"))
        .bearer_auth(&bob_token)
        .json(&json!({"thread_id": "t-shared"}))
        .send()
        .await
        .unwrap();
    assert_eq!(create.status(), 200);
    let (batch, item) = app.failed_batch("t-shared", &alice.id).await;
    for (method, rest) in [
        ("GET", String::new()),
        ("GET", "/items".to_owned()),
        ("GET", "/results.jsonl".to_owned()),
        ("POST", "/pause".to_owned()),
        ("POST", "/resume".to_owned()),
        ("POST", "/cancel".to_owned()),
        ("POST", format!("/items/{item}/retry")),
    ] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let response = app
            .client
            .request(
                method.clone(),
                app.url(&batch_path("t-shared", &batch, &rest)),
            )
            .bearer_auth(&bob_token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404, "{method} {rest}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body, detail("Subagent batch not found"), "{method} {rest}");
    }
    let listed = app
        .client
        .get(app.url(&batches("t-shared")))
        .bearer_auth(&bob_token)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.json::<Value>().await.unwrap(), json!([]));
    let kept = app
        .store
        .get_batch(&BatchScope::user(&alice.id), &batch)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        kept.status,
        subflow_contracts::BatchStatus::Failed,
        "nothing changed"
    );
    assert_eq!(kept.counts.get(BatchItemStatus::Failed), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slash_batch_in_a_run_submits_a_batch_the_routes_then_show() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(app.url("/api/threads/t1/runs/wait"))
        .json(&json!({"input": {"messages": [{"role": "user",
            "content": "/batch general-purpose\nSummarise chapter 1\nSummarise chapter 2\nSummarise chapter 3"}]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (_, listed) = send(&app, "GET", &batches("t1")).await;
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["title"], "general-purpose batch of 3 item(s)");
    assert_eq!(listed[0]["total_items"], 3);
    let id = listed[0]["id"].as_str().unwrap();
    let (_, items) = send(&app, "GET", &batch_path("t1", id, "/items")).await;
    let keys: Vec<&str> = items
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["item_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["item-1", "item-2", "item-3"]);
}

/// A gateway with a real batch worker (not yet running) on `store`, else a SQLite file
/// of its own, with a 10 s lease.
async fn gateway_with_worker(store: Option<Arc<dyn Store>>) -> (TestApp, Worker) {
    spawn_app_with_worker(AppTestOptions {
        store,
        configure: Box::new(|app| app.batches.lease = Duration::from_secs(10)),
        ..AppTestOptions::default()
    })
    .await
}

/// Runs `worker` until the returned sender fires; waits until it reports running.
async fn start(
    worker: Worker,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let handle = worker.handle();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        worker
            .run(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    while !handle.is_running() {
        tokio::task::yield_now().await;
    }
    (stop, task)
}

async fn features(app: &TestApp) -> Value {
    send(app, "GET", "/api/features").await.1["subagent_batches"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn features_report_this_processs_worker_only_while_it_runs() {
    let (app, worker) = gateway_with_worker(None).await;
    let stopped = json!({"enabled": false, "repository_available": true, "worker_running": false, "max_running": 0});
    assert_eq!(features(&app).await, stopped);
    // A heartbeat means nothing on SQLite: only this process could run a worker.
    app.store
        .heartbeat(&WorkerHeartbeat {
            worker_id: "2".repeat(32),
            hostname: "elsewhere".into(),
            started_at: subflow_store::now_rfc3339(),
        })
        .await
        .unwrap();
    assert_eq!(features(&app).await, stopped);
    let (stop, task) = start(worker).await;
    assert_eq!(
        features(&app).await,
        json!({"enabled": true, "repository_available": true, "worker_running": true, "max_running": 3})
    );
    stop.send(()).unwrap();
    task.await.unwrap();
    assert_eq!(features(&app).await, stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn features_on_postgres_see_a_live_heartbeat_of_a_worker_elsewhere() {
    let db = TestDb::new().await;
    let store: Arc<dyn Store> = Arc::new(PostgresStore::connect(&db.url, 4).await.unwrap());
    let (app, _idle) = gateway_with_worker(Some(store)).await;
    assert_eq!(features(&app).await["worker_running"], false);
    app.store
        .heartbeat(&WorkerHeartbeat {
            worker_id: "3".repeat(32),
            hostname: "elsewhere".into(),
            started_at: subflow_store::now_rfc3339(),
        })
        .await
        .unwrap();
    assert_eq!(
        features(&app).await,
        json!({"enabled": true, "repository_available": true, "worker_running": true, "max_running": 3}),
        "a live heartbeat on PostgreSQL is a running worker"
    );
    app.store.remove_worker(&"3".repeat(32)).await.unwrap();
    assert_eq!(features(&app).await["worker_running"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_gauges_read_what_the_database_holds() {
    let app = spawn_app().await;
    let (batch, _) = app.batch_with_failure("t1", "default", 3).await;
    app.submit_batch("t2", "default", 2).await;
    send(&app, "POST", &batch_path("t1", &batch, "/pause")).await;
    app.store
        .heartbeat(&WorkerHeartbeat {
            worker_id: "4".repeat(32),
            hostname: "here".into(),
            started_at: subflow_store::now_rfc3339(),
        })
        .await
        .unwrap();
    let text = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "subflow_batch_items{status=\"pending\"} 2\n",
        "subflow_batch_items{status=\"queued\"} 2\n",
        "subflow_batch_items{status=\"failed\"} 1\n",
        "subflow_batch_items{status=\"succeeded\"} 0\n",
        "subflow_batches{status=\"paused\"} 1\n",
        "subflow_batches{status=\"queued\"} 1\n",
        "subflow_batches{status=\"running\"} 0\n",
        "subflow_batch_workers 1\n",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
}
