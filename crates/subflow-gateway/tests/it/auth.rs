//! Token auth, permissions and ownership over real HTTP (docs/api.md#auth-and-ownership, docs/api.md#runs).
//!
//! The route list comes from `/api/openapi.json`, which a unit test keeps equal to the
//! router, so a new route is covered here without editing this file; a table of the
//! permissions docs/api.md gives each route checks the document's in turn.

use std::time::Duration;

use serde_json::{Value, json};
use subflow_contracts::auth::token_digest;
use subflow_contracts::{Permission, Permissions};
use subflow_gateway::AuthMode;
use subflow_store::{NewToken, User};
use time::OffsetDateTime;

use crate::{Options, TestApp, spawn_app_with};

/// A gateway in `auth.mode = token`: every `/api` call needs a bearer token.
async fn spawn_token_app() -> TestApp {
    spawn_app_with(Options {
        auth: AuthMode::Token,
        ..Options::default()
    })
    .await
}

/// The permission of each route per docs/api.md#runs, docs/api.md#run-events, docs/usage-and-cost.md#thread-token-usage, docs/batches.md#routes.
const DOCUMENTED_PERMISSIONS: &[(&str, &str, &str)] = &[
    ("post", "/api/threads", "threads:write"),
    ("get", "/api/threads/{thread_id}", "threads:read"),
    ("post", "/api/threads/search", "threads:read"),
    ("delete", "/api/threads/{thread_id}", "threads:write"),
    ("get", "/api/threads/{thread_id}/state", "threads:read"),
    ("get", "/api/threads/{thread_id}/history", "threads:read"),
    ("post", "/api/threads/{thread_id}/history", "threads:read"),
    ("post", "/api/threads/{thread_id}/runs", "runs:write"),
    ("post", "/api/threads/{thread_id}/runs/stream", "runs:write"),
    ("post", "/api/threads/{thread_id}/runs/wait", "runs:write"),
    ("get", "/api/threads/{thread_id}/runs", "runs:read"),
    ("get", "/api/threads/{thread_id}/runs/{run_id}", "runs:read"),
    (
        "post",
        "/api/threads/{thread_id}/runs/{run_id}/cancel",
        "runs:write",
    ),
    (
        "get",
        "/api/threads/{thread_id}/runs/{run_id}/join",
        "runs:read",
    ),
    (
        "get",
        "/api/threads/{thread_id}/runs/{run_id}/events",
        "runs:read",
    ),
    // docs/api.md#task-summaries: the auth of /events.
    (
        "get",
        "/api/threads/{thread_id}/runs/{run_id}/tasks",
        "runs:read",
    ),
    (
        "get",
        "/api/threads/{thread_id}/token-usage",
        "threads:read",
    ),
    // docs/batches.md#routes: GET needs threads:read, POST threads:write.
    ("get", "/api/subagent-batches/{batch_id}", "threads:read"),
    (
        "get",
        "/api/threads/{thread_id}/subagent-batches",
        "threads:read",
    ),
    (
        "get",
        "/api/threads/{thread_id}/subagent-batches/{batch_id}",
        "threads:read",
    ),
    (
        "get",
        "/api/threads/{thread_id}/subagent-batches/{batch_id}/items",
        "threads:read",
    ),
    (
        "get",
        "/api/threads/{thread_id}/subagent-batches/{batch_id}/results.jsonl",
        "threads:read",
    ),
    (
        "post",
        "/api/threads/{thread_id}/subagent-batches/{batch_id}/pause",
        "threads:write",
    ),
    (
        "post",
        "/api/threads/{thread_id}/subagent-batches/{batch_id}/resume",
        "threads:write",
    ),
    (
        "post",
        "/api/threads/{thread_id}/subagent-batches/{batch_id}/cancel",
        "threads:write",
    ),
    (
        "post",
        "/api/threads/{thread_id}/subagent-batches/{batch_id}/items/{item_id}/retry",
        "threads:write",
    ),
    // Additions: the web client's thread routes, per-task cancel, batches without a
    // lead, and the cross-thread lists.
    ("patch", "/api/threads/{thread_id}", "threads:write"),
    ("post", "/api/threads/{thread_id}/state", "threads:write"),
    ("get", "/api/threads/{thread_id}/messages/page", "runs:read"),
    (
        "post",
        "/api/threads/{thread_id}/runs/{run_id}/tasks/{task_id}/cancel",
        "runs:write",
    ),
    (
        "post",
        "/api/threads/{thread_id}/subagent-batches",
        "runs:write",
    ),
    ("get", "/api/runs", "runs:read"),
    ("get", "/api/subagent-batches", "threads:read"),
    ("get", "/api/usage", "threads:read"),
];

/// A fresh well-formed token: `sf_` and 43 base64url characters.
fn fresh_token() -> String {
    format!("sf_{}{}", uuid::Uuid::new_v4().simple(), "Q".repeat(11))
}

async fn add_user(app: &TestApp, name: &str) -> User {
    app.store.add_user(name).await.unwrap()
}

/// Stores a token for `user` and returns its text.
async fn issue_with(
    app: &TestApp,
    user: &User,
    permissions: Permissions,
    expires_at: Option<OffsetDateTime>,
) -> String {
    let token = fresh_token();
    app.store
        .create_token(NewToken {
            user_id: user.id.clone(),
            name: None,
            permissions,
            expires_at,
            digest: token_digest(&token),
        })
        .await
        .unwrap();
    token
}

/// A token of `user` with the comma-separated `permissions`.
async fn issue(app: &TestApp, user: &User, permissions: &str) -> String {
    issue_with(
        app,
        user,
        Permissions::parse_list(permissions).unwrap(),
        None,
    )
    .await
}

/// One answer, read to the end.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    text: String,
    /// The body as JSON, or null.
    body: Value,
}

/// Sends `method path` with an optional bearer token and JSON body.
async fn call(
    app: &TestApp,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Answer {
    let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
    let mut request = app.client.request(method, app.url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        text,
        body,
    }
}

/// Sends a request with a raw `Authorization` header value.
async fn call_with_header(app: &TestApp, path: &str, authorization: &str) -> Answer {
    let response = app
        .client
        .get(app.url(path))
        .header("authorization", authorization)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        text,
        body,
    }
}

fn assert_unauthorized(answer: &Answer, what: &str) {
    assert_eq!(answer.status, 401, "{what}: {}", answer.text);
    assert_eq!(
        answer.body,
        json!({"detail": "Authentication required"}),
        "{what}"
    );
    assert_eq!(answer.headers["www-authenticate"], "Bearer", "{what}");
    assert_eq!(answer.headers.get_all("x-trace-id").iter().count(), 1);
}

fn echo_run() -> Value {
    json!({"input": {"messages": [{"role": "user", "content": "/echo hello"}]}})
}

/// One documented operation.
#[derive(Debug, Clone)]
struct Route {
    method: String,
    path: String,
    /// No authentication at all (`security: []`).
    public: bool,
    /// The permission it needs; `None` when any caller may use it.
    permission: Option<String>,
    /// The request body schema name.
    body: Option<String>,
}

impl Route {
    fn name(&self) -> String {
        format!("{} {}", self.method.to_uppercase(), self.path)
    }

    /// A body the route accepts.
    fn request_body(&self) -> Option<Value> {
        match self.body.as_deref() {
            None => None,
            Some("RunRequest") => Some(echo_run()),
            Some("BatchSubmission") => Some(json!({
                "submission_key": uuid::Uuid::new_v4().to_string(),
                "subagent_type": "general-purpose",
                "items": [{"key": "a", "prompt": "p"}],
            })),
            Some(_) => Some(json!({})),
        }
    }

    fn concrete(&self, thread_id: &str, fixture: &Fixture) -> String {
        self.path
            .replace("{thread_id}", thread_id)
            .replace("{run_id}", &fixture.run)
            .replace("{batch_id}", &fixture.batch)
            .replace("{item_id}", &fixture.item)
            .replace("{task_id}", "call_unknown")
    }
}

/// Every operation of `/api/openapi.json`, which needs no token.
async fn documented_routes(app: &TestApp) -> Vec<Route> {
    let document = call(app, "get", "/api/openapi.json", None, None).await;
    assert_eq!(document.status, 200, "{}", document.text);
    let mut routes = Vec::new();
    for (path, operations) in document.body["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            routes.push(Route {
                method: method.clone(),
                path: path.clone(),
                public: operation["security"] == json!([]),
                permission: operation["x-subflow-permission"]
                    .as_str()
                    .map(str::to_owned),
                body: operation
                    .pointer("/requestBody/content/application~1json/schema/$ref")
                    .and_then(Value::as_str)
                    .and_then(|r| r.rsplit('/').next())
                    .map(str::to_owned),
            });
        }
    }
    assert!(routes.len() >= 20, "{routes:?}");
    routes
}

/// What a thread route's path ids point at: a finished run and a batch with a failed
/// item, both of the thread's owner.
#[derive(Debug, Clone)]
struct Fixture {
    run: String,
    batch: String,
    item: String,
}

impl Fixture {
    /// Ids that exist nowhere.
    fn none() -> Self {
        Fixture {
            run: "no-run".into(),
            batch: "subagent-batch-none".into(),
            item: "batch-item-none".into(),
        }
    }
}

/// A thread of `owner` with one `/echo` run (through `token`) and one batch whose only
/// item has failed, so every batch route has something to act on.
async fn thread_with_run(app: &TestApp, token: &str, owner: &User, thread_id: &str) -> Fixture {
    let run = echo_run_on(app, token, thread_id).await;
    let (batch, item) = app.failed_batch(thread_id, &owner.id).await;
    Fixture { run, batch, item }
}

/// Runs one `/echo` run on `thread_id` with `token`; returns its run id.
async fn echo_run_on(app: &TestApp, token: &str, thread_id: &str) -> String {
    let path = format!("/api/threads/{thread_id}/runs/wait");
    let waited = call(app, "post", &path, Some(token), Some(echo_run())).await;
    assert_eq!(waited.status, 200, "{}", waited.text);
    let listed = call(
        app,
        "get",
        &format!("/api/threads/{thread_id}/runs"),
        Some(token),
        None,
    )
    .await;
    listed.body[0]["run_id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_gives_each_route_the_permission_of_the_spec() {
    let app = spawn_token_app().await;
    let routes = documented_routes(&app).await;
    for (method, path, permission) in DOCUMENTED_PERMISSIONS {
        let route = routes
            .iter()
            .find(|r| r.method == *method && r.path == *path)
            .unwrap_or_else(|| panic!("{method} {path} is documented"));
        assert_eq!(
            route.permission.as_deref(),
            Some(*permission),
            "{}",
            route.name()
        );
    }
    for route in &routes {
        // `/metrics` needs `admin` too, unless `metrics.public` (docs/operations.md#metrics).
        let public = ["/api/openapi.json", "/api/v1/auth/setup-status"];
        let needs_auth = (route.path.starts_with("/api/")
            && !public.contains(&route.path.as_str()))
            || route.path == "/metrics";
        assert_eq!(!route.public, needs_auth, "{}", route.name());
        if let Some(permission) = &route.permission {
            assert!(
                permission.parse::<Permission>().is_ok(),
                "{}: {permission}",
                route.name()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_malformed_unknown_revoked_expired_and_disabled_tokens_get_401() {
    let app = spawn_token_app().await;
    let health = call(&app, "get", "/health", None, None).await;
    assert_eq!(health.status, 200);
    assert_eq!(health.body, json!({"status": "ok"}));

    let ana = add_user(&app, "ana").await;
    let good = issue(&app, &ana, "threads:read").await;
    let search = "/api/threads/search";
    assert_eq!(
        call(&app, "post", search, Some(&good), Some(json!({})))
            .await
            .status,
        200
    );

    for path in ["/api/models", "/api/threads/t1", "/api/nowhere"] {
        assert_unauthorized(&call(&app, "get", path, None, None).await, path);
    }
    assert_unauthorized(
        &call(&app, "post", search, None, Some(json!({}))).await,
        "no header",
    );
    for (what, header) in [
        ("wrong scheme", format!("Basic {good}")),
        ("token scheme", format!("Token {good}")),
        ("no scheme", good.clone()),
        ("empty bearer", "Bearer ".to_owned()),
        ("malformed", "Bearer sf_short".to_owned()),
        ("not a token", format!("Bearer {}", "x".repeat(46))),
        (
            "digest instead of token",
            format!("Bearer {}", token_digest(&good)),
        ),
        ("unknown", format!("Bearer {}", fresh_token())),
    ] {
        assert_unauthorized(&call_with_header(&app, "/api/models", &header).await, what);
    }
    assert_eq!(
        call_with_header(&app, "/api/models", &format!("bearer {good}"))
            .await
            .status,
        200,
        "the scheme is case-insensitive"
    );

    // Revoked.
    let revoked = issue(&app, &ana, "threads:read").await;
    assert_eq!(
        call(&app, "get", "/api/models", Some(&revoked), None)
            .await
            .status,
        200
    );
    let record = app
        .store
        .find_token(&token_digest(&revoked))
        .await
        .unwrap()
        .unwrap();
    assert!(app.store.revoke_token(&record.token.id).await.unwrap());
    assert_unauthorized(
        &call(&app, "get", "/api/models", Some(&revoked), None).await,
        "revoked",
    );

    // Expired, next to one that is not yet.
    let read = Permissions::from_iter([Permission::ThreadsRead]);
    let now = OffsetDateTime::now_utc();
    let expired = issue_with(&app, &ana, read.clone(), Some(now - Duration::from_secs(1))).await;
    assert_unauthorized(
        &call(&app, "get", "/api/models", Some(&expired), None).await,
        "expired",
    );
    let current = issue_with(&app, &ana, read, Some(now + Duration::from_secs(3600))).await;
    assert_eq!(
        call(&app, "get", "/api/models", Some(&current), None)
            .await
            .status,
        200
    );

    // A disabled user's every token.
    let bo = add_user(&app, "bo").await;
    let of_bo = issue(&app, &bo, "admin").await;
    assert_eq!(
        call(&app, "get", "/api/models", Some(&of_bo), None)
            .await
            .status,
        200
    );
    assert!(app.store.disable_user(&bo.id).await.unwrap());
    assert_unauthorized(
        &call(&app, "get", "/api/models", Some(&of_bo), None).await,
        "disabled user",
    );
    assert_eq!(
        call(&app, "get", "/api/models", Some(&good), None)
            .await
            .status,
        200,
        "other users' tokens still work"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successful_request_records_the_tokens_last_use() {
    let app = spawn_token_app().await;
    let ana = add_user(&app, "ana").await;
    let token = issue(&app, &ana, "runs:read").await;
    let digest = token_digest(&token);
    let before = app.store.find_token(&digest).await.unwrap().unwrap();
    assert_eq!(before.token.last_used_at, None);
    assert_eq!(
        call(&app, "get", "/api/models", Some(&token), None)
            .await
            .status,
        200
    );
    // The write is off the request path: wait for it, boundedly.
    let mut last_used = None;
    for _ in 0..250 {
        last_used = app
            .store
            .find_token(&digest)
            .await
            .unwrap()
            .unwrap()
            .token
            .last_used_at;
        if last_used.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(last_used.is_some(), "last_used_at is recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_needs_its_permission_and_admin_holds_them_all() {
    let app = spawn_token_app().await;
    let ana = add_user(&app, "ana").await;
    let admin = issue(&app, &ana, "admin").await;
    let routes = documented_routes(&app).await;
    let mut checked = 0;
    for (index, route) in routes.iter().enumerate() {
        if route.public {
            let answer = call(&app, &route.method, &route.path, None, None).await;
            assert_eq!(answer.status, 200, "{}: {}", route.name(), answer.text);
            continue;
        }
        let fixture = |who: &str| format!("t-perm-{index}-{who}");
        let (thread, run) = (fixture("none"), Fixture::none());
        let anonymous = call(
            &app,
            &route.method,
            &route.concrete(&thread, &run),
            None,
            route.request_body(),
        )
        .await;
        assert_unauthorized(&anonymous, &route.name());

        let Some(needed) = &route.permission else {
            // Any authenticated caller: a token with one unrelated permission will do.
            let token = issue(&app, &ana, "runs:read").await;
            let answer = call(&app, &route.method, &route.path, Some(&token), None).await;
            assert_eq!(answer.status, 200, "{}: {}", route.name(), answer.text);
            continue;
        };
        let needed: Permission = needed.parse().unwrap();
        let all_but = Permissions::from_iter(
            Permission::ALL
                .iter()
                .copied()
                .filter(|p| *p != needed && *p != Permission::Admin),
        );
        let lacking = issue_with(&app, &ana, all_but, None).await;
        let thread = fixture("lacking");
        let run = thread_with_run(&app, &admin, &ana, &thread).await;
        let refused = call(
            &app,
            &route.method,
            &route.concrete(&thread, &run),
            Some(&lacking),
            route.request_body(),
        )
        .await;
        assert_eq!(refused.status, 403, "{}: {}", route.name(), refused.text);
        assert_eq!(
            refused.body,
            json!({"detail": format!("Permission denied: {needed}")}),
            "{}",
            route.name()
        );

        let only = issue(&app, &ana, needed.as_str()).await;
        for (who, token) in [("only", &only), ("admin", &admin)] {
            let thread = fixture(who);
            let run = thread_with_run(&app, &admin, &ana, &thread).await;
            let answer = call(
                &app,
                &route.method,
                &route.concrete(&thread, &run),
                Some(token),
                route.request_body(),
            )
            .await;
            // A task cancel needs a running task and pause or resume an active batch,
            // which no fixture has (its batch has failed): the route's own refusal shows
            // the request got past the permission check.
            let reached = if route.path.ends_with("/tasks/{task_id}/cancel") {
                answer.status == 404 && answer.text.contains("Task call_unknown not found")
            } else if route.path.ends_with("/pause") || route.path.ends_with("/resume") {
                answer.status == 409 && answer.text.contains("has already ended (failed)")
            } else {
                (200..300).contains(&answer.status)
            };
            assert!(
                reached,
                "{} with {who}: {} {}",
                route.name(),
                answer.status,
                answer.text
            );
        }
        checked += 1;
    }
    assert!(
        checked >= DOCUMENTED_PERMISSIONS.len(),
        "{checked} routes checked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_thread_is_404_on_every_route_and_nothing_of_it_leaks() {
    let app = spawn_token_app().await;
    let alice = add_user(&app, "alice").await;
    let bob = add_user(&app, "bob").await;
    let alice_token = issue(&app, &alice, "admin").await;
    let bob_token = issue(&app, &bob, "admin").await;

    let created = call(
        &app,
        "post",
        "/api/threads",
        Some(&alice_token),
        Some(json!({"thread_id": "t-alice", "metadata": {"project": "apollo"}})),
    )
    .await;
    assert_eq!(created.status, 200, "{}", created.text);
    let alice_fixture = thread_with_run(&app, &alice_token, &alice, "t-alice").await;
    let alice_run = alice_fixture.run.clone();
    let bob_run = thread_with_run(&app, &bob_token, &bob, "t-bob").await.run;

    // Every documented thread route: 404 with exactly the not-found body.
    let routes = documented_routes(&app).await;
    let thread_routes: Vec<&Route> = routes
        .iter()
        .filter(|r| r.path.contains("{thread_id}"))
        .collect();
    let in_spec = DOCUMENTED_PERMISSIONS
        .iter()
        .filter(|(_, path, _)| path.contains("{thread_id}"))
        .count();
    assert!(thread_routes.len() >= in_spec, "{thread_routes:?}");
    for route in &thread_routes {
        let answer = call(
            &app,
            &route.method,
            &route.concrete("t-alice", &alice_fixture),
            Some(&bob_token),
            route.request_body(),
        )
        .await;
        assert_eq!(answer.status, 404, "{}: {}", route.name(), answer.text);
        assert_eq!(
            answer.body,
            json!({"detail": "Thread t-alice not found"}),
            "{}",
            route.name()
        );
        assert!(!answer.text.contains(&alice_run), "{}", route.name());
        assert!(
            !answer.text.contains(&alice_fixture.batch),
            "{}",
            route.name()
        );
    }
    // Nothing of alice's batch changed either.
    let batch = app
        .store
        .get_batch(
            &subflow_store::BatchScope::user(&alice.id),
            &alice_fixture.batch,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(batch.status, subflow_contracts::BatchStatus::Failed);
    // Nothing changed: alice still has her thread and exactly her one run.
    let runs = app
        .store
        .list_runs(subflow_store::RunScope::Thread("t-alice"), None, 100, 0)
        .await
        .unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].run_id, alice_run);
    assert_eq!(runs[0].status, subflow_contracts::RunStatus::Success);
    let thread = call(
        &app,
        "get",
        "/api/threads/t-alice",
        Some(&alice_token),
        None,
    )
    .await;
    assert_eq!(thread.status, 200);
    assert_eq!(thread.body["metadata"], json!({"project": "apollo"}));

    // Creating a thread with alice's id is 404 too, whatever if_exists says.
    for if_exists in ["raise", "do_nothing"] {
        let answer = call(
            &app,
            "post",
            "/api/threads",
            Some(&bob_token),
            Some(json!({"thread_id": "t-alice", "if_exists": if_exists})),
        )
        .await;
        assert_eq!(answer.status, 404, "{if_exists}: {}", answer.text);
        assert_eq!(answer.body, json!({"detail": "Thread t-alice not found"}));
    }
    let own_again = call(
        &app,
        "post",
        "/api/threads",
        Some(&alice_token),
        Some(json!({"thread_id": "t-alice"})),
    )
    .await;
    assert_eq!(own_again.status, 409, "the owner still gets the conflict");

    // Search shows only the caller's threads, whatever the filter.
    let bob_search = call(
        &app,
        "post",
        "/api/threads/search",
        Some(&bob_token),
        Some(json!({"limit": 100})),
    )
    .await;
    let ids: Vec<&str> = bob_search
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["thread_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["t-bob"]);
    let filtered = call(
        &app,
        "post",
        "/api/threads/search",
        Some(&bob_token),
        Some(json!({"metadata": {"project": "apollo"}})),
    )
    .await;
    assert_eq!(filtered.body, json!([]));
    assert!(!bob_search.text.contains("t-alice"));

    // Alice's run id under bob's own thread finds nothing of hers.
    let scoped = |suffix: &str| format!("/api/threads/t-bob/runs/{alice_run}{suffix}");
    let get = call(&app, "get", &scoped(""), Some(&bob_token), None).await;
    assert_eq!(get.status, 404);
    assert_eq!(
        get.body,
        json!({"detail": format!("Run {alice_run} not found")})
    );
    let events = call(&app, "get", &scoped("/events"), Some(&bob_token), None).await;
    assert_eq!((events.status, events.body), (200, json!([])));
    let tasks = call(&app, "get", &scoped("/tasks"), Some(&bob_token), None).await;
    assert_eq!(
        (tasks.status, tasks.body),
        (404, json!({"detail": format!("Run {alice_run} not found")}))
    );
    assert_eq!(
        call(&app, "get", &scoped("/join"), Some(&bob_token), None)
            .await
            .status,
        404
    );
    assert_eq!(
        call(&app, "post", &scoped("/cancel"), Some(&bob_token), None)
            .await
            .status,
        404
    );
    let own = call(
        &app,
        "get",
        &format!("/api/threads/t-bob/runs/{bob_run}"),
        Some(&bob_token),
        None,
    )
    .await;
    assert_eq!(own.status, 200, "bob's own run is there");

    // A bad id is 422, never 404 or 403.
    let bad = call(&app, "get", "/api/threads/bad%20id", Some(&bob_token), None).await;
    assert_eq!(bad.status, 422, "{}", bad.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_thread_reads_empty_and_a_run_makes_it_the_callers() {
    let app = spawn_token_app().await;
    let alice = add_user(&app, "alice").await;
    let bob = add_user(&app, "bob").await;
    let alice_token = issue(&app, &alice, "admin").await;
    let bob_token = issue(&app, &bob, "admin").await;
    let read = |path: &'static str| {
        let token = bob_token.clone();
        let app = &app;
        async move { call(app, "get", path, Some(&token), None).await }
    };
    let thread = read("/api/threads/t-new").await;
    assert_eq!(thread.status, 404);
    assert_eq!(thread.body, json!({"detail": "Thread t-new not found"}));
    let state = read("/api/threads/t-new/state").await;
    assert_eq!(state.status, 200);
    assert_eq!(state.body["values"], json!({"messages": []}));
    assert_eq!(read("/api/threads/t-new/history").await.body, json!([]));
    assert_eq!(read("/api/threads/t-new/runs").await.body, json!([]));
    assert_eq!(
        read("/api/threads/t-new/runs/r1/events").await.body,
        json!([])
    );
    let usage = read("/api/threads/t-new/token-usage").await;
    assert_eq!(usage.status, 200);
    assert_eq!(usage.body["total_runs"], 0);
    assert_eq!(read("/api/threads/t-new/runs/r1").await.status, 404);

    // Bob's run creates the thread for bob; alice then finds nothing there.
    let streamed = call(
        &app,
        "post",
        "/api/threads/t-new/runs/stream",
        Some(&bob_token),
        Some(echo_run()),
    )
    .await;
    assert_eq!(streamed.status, 200, "{}", streamed.text);
    assert!(streamed.text.contains("event: end"));
    let owner = app.store.get_thread("t-new").await.unwrap().unwrap().owner;
    assert_eq!(owner, bob.id);
    let runs = app
        .store
        .list_runs(subflow_store::RunScope::Thread("t-new"), None, 10, 0)
        .await
        .unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].owner, bob.id);
    let by_alice = call(
        &app,
        "get",
        "/api/threads/t-new/runs",
        Some(&alice_token),
        None,
    )
    .await;
    assert_eq!(by_alice.status, 404);
    let rerun = call(
        &app,
        "post",
        "/api/threads/t-new/runs/wait",
        Some(&alice_token),
        Some(echo_run()),
    )
    .await;
    assert_eq!(rerun.status, 404, "{}", rerun.text);
    assert_eq!(
        app.store
            .list_runs(subflow_store::RunScope::Thread("t-new"), None, 10, 0)
            .await
            .unwrap()
            .len(),
        1
    );
    let events = app
        .store
        .list_events(&subflow_store::EventQuery::run("t-new", &runs[0].run_id))
        .await
        .unwrap();
    assert!(!events.is_empty());
    assert!(
        events
            .iter()
            .all(|e| e.user_id.as_deref() == Some(bob.id.as_str())),
        "events carry the caller as their user"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_mode_does_not_check_the_origin_of_writes() {
    let app = spawn_token_app().await;
    let ana = add_user(&app, "ana").await;
    let token = issue(&app, &ana, "threads:write").await;
    let response = app
        .client
        .post(app.url("/api/threads"))
        .bearer_auth(&token)
        .header("origin", "http://elsewhere.example")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cross_thread_lists_hold_only_the_callers_runs_and_batches() {
    let app = spawn_token_app().await;
    let alice = add_user(&app, "alice").await;
    let bob = add_user(&app, "bob").await;
    let alice_token = issue(&app, &alice, "runs:read,runs:write,threads:read").await;
    let bob_token = issue(&app, &bob, "admin").await;
    let mut alice_runs = Vec::new();
    for thread in ["t-a1", "t-a2"] {
        alice_runs.push((thread, echo_run_on(&app, &alice_token, thread).await));
        app.failed_batch(thread, &alice.id).await;
    }
    let bob_run = echo_run_on(&app, &bob_token, "t-b1").await;
    app.failed_batch("t-b1", &bob.id).await;

    let runs = call(&app, "get", "/api/runs", Some(&alice_token), None).await;
    assert_eq!(runs.status, 200, "{}", runs.text);
    let listed: Vec<(String, String)> = runs
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["thread_id"].as_str().unwrap().to_owned(),
                r["run_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = alice_runs
        .iter()
        .rev()
        .map(|(thread, run)| ((*thread).to_owned(), run.clone()))
        .collect();
    assert_eq!(listed, expected, "hers, newest first");
    assert!(!runs.text.contains(&bob_run));
    let paged = call(
        &app,
        "get",
        "/api/runs?limit=1&offset=1&status=success",
        Some(&alice_token),
        None,
    )
    .await;
    assert_eq!(paged.body.as_array().unwrap().len(), 1);
    assert_eq!(paged.body[0]["run_id"], alice_runs[0].1.as_str());

    let batches = call(
        &app,
        "get",
        "/api/subagent-batches",
        Some(&alice_token),
        None,
    )
    .await;
    assert_eq!(batches.status, 200, "{}", batches.text);
    let threads: Vec<&str> = batches
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["thread_id"].as_str().unwrap())
        .collect();
    assert_eq!(threads, ["t-a2", "t-a1"]);
    let bobs = call(
        &app,
        "get",
        "/api/subagent-batches?status=failed",
        Some(&bob_token),
        None,
    )
    .await;
    assert_eq!(bobs.body.as_array().unwrap().len(), 1);
    assert_eq!(bobs.body[0]["thread_id"], "t-b1");
    // Without a token, neither list answers.
    for path in ["/api/runs", "/api/subagent-batches"] {
        assert_eq!(
            call(&app, "get", path, None, None).await.status,
            401,
            "{path}"
        );
    }
}

/// `/api/usage` over 3 users × 4 threads × 2 days: each user's report equals the sum of
/// their threads' `/token-usage`, a user sees only their own (403 for another's), and an
/// admin sees everyone's, grouped by day, user and thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_across_threads_is_the_sum_of_each_threads_token_usage() {
    let app = spawn_token_app().await;
    let root = add_user(&app, "root").await;
    let admin = issue(&app, &root, "admin").await;
    let mut users = Vec::new();
    for name in ["ana", "bo", "cy"] {
        let user = add_user(&app, name).await;
        let token = issue(
            &app,
            &user,
            "threads:read,threads:write,runs:read,runs:write",
        )
        .await;
        for thread in 0..4 {
            let body = json!({"input": {"messages": [{"role": "user", "content": format!("/echo {name} {thread}")}]}});
            let path = format!("/api/threads/t-{name}-{thread}/runs/wait");
            let answer = call(&app, "post", &path, Some(&token), Some(body)).await;
            assert_eq!(answer.status, 200, "{}", answer.text);
        }
        users.push((user, token));
    }
    // Threads 0 and 1 ran yesterday.
    let today = subflow_store::now_rfc3339()[..10].to_owned();
    let yesterday =
        subflow_store::rfc3339(time::OffsetDateTime::now_utc() - time::Duration::days(1))[..10]
            .to_owned();
    let db = rusqlite::Connection::open(app.sqlite.as_ref().unwrap()).unwrap();
    let moved = db
        .execute(
            "UPDATE runs SET created_at = replace(created_at, ?1, ?2) \
             WHERE thread_id LIKE '%-0' OR thread_id LIKE '%-1'",
            [&today, &yesterday],
        )
        .unwrap();
    assert_eq!(moved, 6);

    let mut everyone = 0;
    for (user, token) in &users {
        let (mut tokens, mut cost) = (0, 0.0);
        for thread in 0..4 {
            let path = format!("/api/threads/t-{}-{thread}/token-usage", user.name);
            let usage = call(&app, "get", &path, Some(token), None).await;
            tokens += usage.body["total_tokens"].as_i64().unwrap();
            cost += usage.body["cost"]["total"].as_f64().unwrap();
        }
        let report = call(&app, "get", "/api/usage", Some(token), None).await;
        assert_eq!(report.status, 200, "{}", report.text);
        let report = report.body;
        assert_eq!(report["user_id"], user.id.as_str());
        assert_eq!(report["counted"]["runs"], 4);
        assert_eq!(report["counted"]["total_tokens"], tokens);
        // The same price function: equal to the micro-unit, up to each thread's rounding.
        let reported = report["counted"]["cost"]["total"].as_f64().unwrap();
        assert!(
            cost > 0.0 && (reported - cost).abs() <= 2e-6,
            "{reported} against {cost}"
        );
        let days: Vec<(&str, i64)> = report["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                (
                    g["key"].as_str().unwrap(),
                    g["counted"]["runs"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(days, [(yesterday.as_str(), 2), (today.as_str(), 2)]);
        let by_day: i64 = report["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["counted"]["total_tokens"].as_i64().unwrap())
            .sum();
        assert_eq!(by_day, tokens);
        everyone += tokens;
        // Another user's usage is the admin's to read.
        let other = users.iter().find(|(u, _)| u.id != user.id).unwrap();
        let path = format!("/api/usage?user_id={}", other.0.id);
        let refused = call(&app, "get", &path, Some(token), None).await;
        assert_eq!(refused.status, 403, "{}", refused.text);
        assert_eq!(refused.body, json!({"detail": "Permission denied: admin"}));
    }
    let all = call(&app, "get", "/api/usage?group_by=user", Some(&admin), None).await;
    assert_eq!(all.status, 200, "{}", all.text);
    assert_eq!(all.body["user_id"], Value::Null);
    assert_eq!(all.body["counted"]["runs"], 12);
    assert_eq!(all.body["counted"]["total_tokens"], everyone);
    assert_eq!(all.body["groups"].as_array().unwrap().len(), 3);
    let by_thread = call(
        &app,
        "get",
        "/api/usage?group_by=thread",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(by_thread.body["groups"].as_array().unwrap().len(), 12);
    let one = format!("/api/usage?group_by=thread&user_id={}", users[1].0.id);
    let one = call(&app, "get", &one, Some(&admin), None).await;
    assert_eq!(one.body["counted"]["runs"], 4);
    // Yesterday alone, and bad windows.
    let from = format!("{yesterday}T00:00:00Z");
    let to = format!("{today}T00:00:00Z");
    let window = format!("/api/usage?from={from}&to={to}");
    let yesterdays = call(&app, "get", &window, Some(&admin), None).await;
    assert_eq!(yesterdays.body["counted"]["runs"], 6);
    let reversed = format!("/api/usage?from={to}&to={from}");
    let empty = call(&app, "get", &reversed, Some(&admin), None).await;
    assert_eq!(
        (empty.status, &empty.body["counted"]["runs"]),
        (200, &json!(0))
    );
    let blank = call(&app, "get", "/api/usage?to=", Some(&admin), None).await;
    assert_eq!(
        (blank.status, blank.body["detail"].as_str()),
        (422, Some("to must be an RFC 3339 time, got \"\""))
    );
    let bad = call(&app, "get", "/api/usage?from=yesterday", Some(&admin), None).await;
    assert_eq!(
        (bad.status, bad.body["detail"].as_str()),
        (
            422,
            Some("from must be an RFC 3339 time, got \"yesterday\"")
        )
    );
    let bad = call(&app, "get", "/api/usage?group_by=week", Some(&admin), None).await;
    assert_eq!(bad.status, 422, "{}", bad.text);
}
