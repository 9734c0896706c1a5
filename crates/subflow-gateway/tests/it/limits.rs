//! Every list route has a documented maximum `limit`: above it (or below 1) is a 422
//! with a detail that names the range, and at the maximum the route answers. Whole
//! thread states (history, search) are streamed a page at a time, in order.

use serde_json::{Value, json};
use subflow_store::{NewCheckpoint, NewThread};

use crate::{TestApp, spawn_app};

async fn post_json(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_list_route_refuses_a_limit_above_its_maximum() {
    let app = spawn_app().await;
    let (batch, _) = app.submit_batch("t", "default", 1).await;
    let gets = [
        ("/api/threads/t/runs", 100),
        ("/api/threads/t/history", 1000),
        ("/api/threads/t/runs/r/events", 2000),
        ("/api/threads/t/subagent-batches", 100),
        (
            &format!("/api/threads/t/subagent-batches/{batch}/items") as &str,
            500,
        ),
    ];
    for (path, max) in gets {
        for limit in [0, max + 1, 100_000] {
            let (status, _, body) = app.get_json(&format!("{path}?limit={limit}")).await;
            assert_eq!(status, 422, "{path}?limit={limit}: {body}");
            assert_eq!(
                body["detail"],
                format!("limit must be between 1 and {max}, got {limit}"),
                "{path}"
            );
        }
        let (status, _, body) = app.get_json(&format!("{path}?limit={max}")).await;
        assert_eq!(status, 200, "{path}?limit={max}: {body}");
        assert!(body.is_array(), "{path}: {body}");
    }
    for (path, max) in [
        ("/api/threads/search", 1000),
        ("/api/threads/t/history", 1000),
    ] {
        for limit in [0, max + 1, 100_000] {
            let (status, body) = post_json(&app, path, json!({"limit": limit})).await;
            assert_eq!(status, 422, "{path} {limit}: {body}");
            assert_eq!(
                body["detail"],
                format!("limit must be between 1 and {max}, got {limit}")
            );
        }
        let (status, body) = post_json(&app, path, json!({"limit": max})).await;
        assert_eq!((status, body.is_array()), (200, true), "{path}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_history_pages_newest_first_exactly_like_before_cursors() {
    let app = spawn_app().await;
    app.store
        .create_thread(NewThread {
            thread_id: "long".into(),
            owner: "default".into(),
            metadata: Default::default(),
        })
        .await
        .unwrap();
    let mut ids = Vec::new();
    let mut messages = Vec::new();
    for n in 0..21 {
        messages.push(
            json!({"type": "human", "content": format!("message {n}"), "id": format!("m{n}")}),
        );
        let id = format!("cp-{n:02}");
        app.store
            .put_checkpoint(NewCheckpoint {
                lease_owner: None,
                thread_id: "long".into(),
                checkpoint_id: id.clone(),
                parent_checkpoint_id: ids.last().cloned(),
                run_id: Some(format!("run-{}", n / 3)),
                values: json!({"messages": messages}),
                metadata: Default::default(),
            })
            .await
            .unwrap();
        ids.push(id);
    }
    ids.reverse();
    let checkpoint_ids = |states: &Value| -> Vec<String> {
        states
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                s["checkpoint"]["checkpoint_id"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };
    let (_, all) = post_json(&app, "/api/threads/long/history", json!({"limit": 1000})).await;
    assert_eq!(checkpoint_ids(&all), ids);
    for (n, state) in all.as_array().unwrap().iter().enumerate() {
        assert_eq!(
            state["values"]["messages"].as_array().unwrap().len(),
            21 - n
        );
    }
    // Pages of 5 with `before`, by POST and by GET, give the same states.
    let mut paged = Vec::new();
    let mut before: Option<String> = None;
    loop {
        let (_, _, page) = match &before {
            None => app.get_json("/api/threads/long/history?limit=5").await,
            Some(id) => {
                app.get_json(&format!("/api/threads/long/history?limit=5&before={id}"))
                    .await
            }
        };
        let page = page.as_array().unwrap().clone();
        if page.is_empty() {
            break;
        }
        before = page.last().unwrap()["checkpoint"]["checkpoint_id"]
            .as_str()
            .map(str::to_owned);
        paged.extend(page);
    }
    assert_eq!(Value::Array(paged), all);
    let (_, thirteen) = post_json(
        &app,
        "/api/threads/long/history",
        json!({"limit": 13, "before": {"configurable": {"checkpoint_id": ids[2]}}}),
    )
    .await;
    assert_eq!(checkpoint_ids(&thirteen), ids[3..16]);
    let (_, search) = post_json(&app, "/api/threads/search", json!({"limit": 1000})).await;
    let [long] = search.as_array().unwrap().as_slice() else {
        panic!("one thread: {search}")
    };
    assert_eq!(long["values"], all[0]["values"]);
}
