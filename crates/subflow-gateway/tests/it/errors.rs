//! Every rejection is JSON: a query, path or method the API cannot take gets the same
//! `{"detail": ...}` body as every other bad input (422 for a bad parameter, 405 with a
//! body and `Allow` for a method a route does not have), never a plain-text 400.

use serde_json::Value;

use crate::{TestApp, spawn_app};

/// Sends `method path` and returns its status, `Allow` header and JSON body, checking
/// that the body is JSON with a non-empty `detail`.
async fn rejected(app: &TestApp, method: &str, path: &str) -> (u16, Option<String>, String) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let response = app
        .client
        .request(method.clone(), app.url(path))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    let allow = response
        .headers()
        .get("allow")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = response.text().await.unwrap();
    assert_eq!(content_type, "application/json", "{method} {path}: {text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    let detail = body["detail"].as_str().unwrap_or_default().to_owned();
    assert!(!detail.is_empty(), "{method} {path}: {text}");
    (status, allow, detail)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_query_and_path_parameters_are_a_422_with_a_detail() {
    let app = spawn_app().await;
    for (method, path, says) in [
        ("GET", "/api/threads/t/runs?limit=abc", "limit"),
        ("GET", "/api/threads/t/runs?offset=-1", "offset"),
        (
            "GET",
            "/api/threads/t/runs?limit=1&limit=2",
            "duplicate field `limit`",
        ),
        (
            "GET",
            "/api/threads/t/token-usage?include_active=maybe",
            "include_active",
        ),
        ("POST", "/api/threads/t/runs/r/cancel?wait=maybe", "wait"),
        (
            "POST",
            "/api/threads/t/runs/r/cancel?wait=true&wait=false",
            "duplicate field `wait`",
        ),
        (
            "GET",
            "/api/threads/t/runs/r/events?after_seq=1&after_seq=2",
            "duplicate field `after_seq`",
        ),
        (
            "GET",
            "/api/threads/t/history?limit=1&limit=2",
            "duplicate field `limit`",
        ),
        ("GET", "/api/threads/t/subagent-batches?limit=x", "limit"),
        ("GET", "/api/threads/%FF", "Invalid path"),
        ("GET", "/api/threads/%FF/runs/r", "Invalid path"),
        ("GET", "/api/threads/t/runs/%C3%28/events", "Invalid path"),
        ("DELETE", "/api/threads/%E2%82", "Invalid path"),
    ] {
        let (status, _, detail) = rejected(&app, method, path).await;
        assert_eq!(status, 422, "{method} {path}: {detail}");
        assert!(detail.contains(says), "{method} {path}: {detail}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_a_route_does_not_have_is_a_405_with_a_detail_and_allow() {
    let app = spawn_app().await;
    let (status, allow, detail) = rejected(&app, "DELETE", "/api/threads/search").await;
    assert_eq!((status, allow.as_deref()), (405, Some("POST")));
    assert_eq!(detail, "Method Not Allowed");
    // Every documented route, with a method none of them has.
    let (_, _, openapi) = app.get_json("/api/openapi.json").await;
    let paths = openapi["paths"].as_object().unwrap();
    assert!(paths.len() > 20, "{}", paths.len());
    for (template, operations) in paths {
        let path = template
            .split('/')
            .map(|segment| {
                if segment.starts_with('{') {
                    "x"
                } else {
                    segment
                }
            })
            .collect::<Vec<_>>()
            .join("/");
        let (status, allow, _) = rejected(&app, "PUT", &path).await;
        assert_eq!(status, 405, "PUT {path}");
        let allowed = allow.unwrap_or_default().to_lowercase();
        for method in operations.as_object().unwrap().keys() {
            assert!(
                allowed.contains(method.as_str()),
                "{path}: {allowed} lacks {method}"
            );
        }
    }
}
