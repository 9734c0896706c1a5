//! Submitting a batch without a lead: `POST /api/threads/{thread_id}/subagent-batches`
//! with the `batch_task` arguments and a `submission_key`: created once, returned again
//! for the same key in the same thread (409 in another), its items as sent, and every
//! `batch_task` refusal with its text.

use serde_json::{Value, json};

use crate::{TestApp, spawn_app};

async fn submit(app: &TestApp, thread: &str, body: &Value) -> (u16, Value) {
    let response = app
        .client
        .post(app.url(&format!("/api/threads/{thread}/subagent-batches")))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn items(count: usize) -> Vec<Value> {
    (1..=count)
        .map(|n| json!({"key": format!("row-{n}"), "prompt": format!("Summarise row {n}")}))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_submitted_once_per_key_with_the_items_sent() {
    let app = spawn_app().await;
    let body = json!({
        "submission_key": "import-2026-12-03",
        "title": "Rows of the import",
        "subagent_type": "general-purpose",
        "max_running_items": 5,
        "items": items(250),
    });
    let (status, batch) = submit(&app, "submitted", &body).await;
    assert_eq!(status, 201, "{batch}");
    assert_eq!(batch["title"], "Rows of the import");
    assert_eq!(batch["total_items"], 250);
    assert_eq!(batch["max_running_items"], 5);
    assert_eq!(batch["run_id"], Value::Null);
    let id = batch["id"].as_str().unwrap().to_owned();
    // The same key again returns the same batch and stores nothing more.
    let (status, again) = submit(&app, "submitted", &body).await;
    assert_eq!(status, 200);
    assert_eq!(again["id"], id.as_str());
    let (_, _, listed) = app
        .get_json("/api/threads/submitted/subagent-batches")
        .await;
    assert_eq!(listed.as_array().unwrap().len(), 1);
    // The items are the ones sent, in order.
    let mut keys = Vec::new();
    for offset in [0, 100, 200] {
        let (_, _, page) = app
            .get_json(&format!(
                "/api/threads/submitted/subagent-batches/{id}/items?offset={offset}&limit=100"
            ))
            .await;
        keys.extend(
            page.as_array()
                .unwrap()
                .iter()
                .map(|item| item["item_key"].as_str().unwrap().to_owned()),
        );
    }
    let sent: Vec<String> = (1..=250).map(|n| format!("row-{n}")).collect();
    assert_eq!(keys, sent);
    // The thread was created for the caller.
    let (status, _, _) = app.get_json("/api/threads/submitted").await;
    assert_eq!(status, 200);
    // The key in another thread names a batch that thread does not have: 409, nothing stored.
    let (status, error) = submit(&app, "elsewhere", &body).await;
    assert_eq!(status, 409, "{error}");
    assert_eq!(
        error["detail"],
        "submission_key 'import-2026-12-03' was already used for a batch in another thread"
    );
    let (_, _, listed) = app
        .get_json("/api/threads/elsewhere/subagent-batches")
        .await;
    assert_eq!(listed, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_the_batch_task_rules_refuse_is_a_422_with_the_tool_text() {
    let app = spawn_app().await;
    let with = |patch: Value| {
        let mut body = json!({
            "submission_key": "k",
            "subagent_type": "general-purpose",
            "items": items(2),
        });
        for (key, value) in patch.as_object().unwrap() {
            body[key] = value.clone();
        }
        body
    };
    let long_title = "t".repeat(257);
    for (body, text) in [
        (
            with(json!({"items": []})),
            "A batch must contain at least one item.",
        ),
        (
            with(json!({"items": [{"key": "a", "prompt": "x"}, {"key": "a", "prompt": "y"}]})),
            "Batch item keys must be unique.",
        ),
        (
            with(json!({"subagent_type": "nope"})),
            "Unknown or disallowed subagent type 'nope'. Available: general-purpose",
        ),
        (
            with(json!({"title": long_title})),
            "Batch submission failed: title must have at most 256 characters, got 257",
        ),
        (
            with(json!({"items": [{"key": "a\u{0}b", "prompt": "x"}]})),
            "Batch submission failed: item key must not contain NUL (\\u0000) at position 0",
        ),
        (
            with(json!({"max_running_items": 10, "max_live_items": 5})),
            "Batch submission failed: max_running_items (10) must not exceed max_live_items (5)",
        ),
        (
            with(json!({"items": [{"key": "a", "prompt": ""}]})),
            "Batch submission failed: item prompt must have 1-100000 characters, got 0 at position 0",
        ),
    ] {
        let (status, error) = submit(&app, "refused", &body).await;
        assert_eq!(status, 422, "{body}");
        assert!(
            error["detail"].as_str().unwrap().starts_with(text),
            "{}: {error}",
            &body.to_string()[..body.to_string().len().min(120)]
        );
    }
    // The body's own shape: a missing key, an unknown field.
    let (status, error) = submit(
        &app,
        "refused",
        &json!({"items": items(1), "subagent_type": "general-purpose"}),
    )
    .await;
    assert_eq!(status, 422);
    assert!(
        error["detail"].as_str().unwrap().contains("submission_key"),
        "{error}"
    );
    let (status, error) = submit(&app, "refused", &with(json!({"max_items": 3}))).await;
    assert_eq!(status, 422);
    assert!(
        error["detail"].as_str().unwrap().contains("max_items"),
        "{error}"
    );
    let (_, _, listed) = app.get_json("/api/threads/refused/subagent-batches").await;
    assert_eq!(listed, json!([]), "nothing refused was stored");
}
