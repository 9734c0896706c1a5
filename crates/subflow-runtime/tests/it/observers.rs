//! Extension observers (docs/events.md#observers): order, isolation, the shared budget, the "no run id"
//! rule, and the signed webhook against a local receiver.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use subflow_runtime::observers::{
    CallResult, Hook, ObserverOutcome, ObserverRegistry, ObserverSet, TaskInfo, TaskObserver,
    WebhookConfig, WebhookObserver,
};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

// ---------------------------------------------------------------- in-process observers

/// Appends `<name>:<hook>[:<outcome>]` to a shared log, optionally after a delay.
#[derive(Debug)]
struct Recorder {
    name: &'static str,
    log: Arc<Mutex<Vec<String>>>,
    delay: Duration,
    panics: bool,
}

impl Recorder {
    fn new(name: &'static str, log: &Arc<Mutex<Vec<String>>>) -> Self {
        Recorder {
            name,
            log: Arc::clone(log),
            delay: Duration::ZERO,
            panics: false,
        }
    }

    fn slow(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    fn panicking(mut self) -> Self {
        self.panics = true;
        self
    }

    async fn act(&self, entry: String) {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if self.panics {
            panic!("observer {} exploded", self.name);
        }
        self.log.lock().unwrap().push(entry);
    }
}

#[async_trait]
impl TaskObserver for Recorder {
    async fn on_task_start(&self, info: &TaskInfo) {
        self.act(format!("{}:start:{}", self.name, info.task_id))
            .await;
    }

    async fn on_task_stop(&self, info: &TaskInfo, outcome: ObserverOutcome) {
        self.act(format!("{}:stop:{}:{}", self.name, info.task_id, outcome))
            .await;
    }
}

fn new_log() -> Arc<Mutex<Vec<String>>> {
    Arc::new(Mutex::new(Vec::new()))
}

fn entries(log: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    log.lock().unwrap().clone()
}

fn subagent_info() -> TaskInfo {
    TaskInfo::subagent("exec-1", "run-1", "thread-1", "researcher", false)
}

fn counts(set: &ObserverSet, hook: Hook) -> (u64, u64, u64) {
    let counters = set.counters();
    (
        counters.get(hook, CallResult::Ok),
        counters.get(hook, CallResult::Error),
        counters.get(hook, CallResult::Skipped),
    )
}

#[tokio::test]
async fn observers_run_in_registration_order() {
    let log = new_log();
    let set = ObserverSet::new()
        .with_observer(Arc::new(Recorder::new("a", &log)))
        .with_observer(Arc::new(Recorder::new("b", &log)))
        .with_observer(Arc::new(Recorder::new("c", &log)));
    let info = subagent_info();

    set.notify_start(&info).await;
    set.notify_stop(&info, ObserverOutcome::Completed).await;

    assert_eq!(
        entries(&log),
        [
            "a:start:exec-1",
            "b:start:exec-1",
            "c:start:exec-1",
            "a:stop:exec-1:completed",
            "b:stop:exec-1:completed",
            "c:stop:exec-1:completed",
        ]
    );
    assert_eq!(counts(&set, Hook::Start), (3, 0, 0));
    assert_eq!(counts(&set, Hook::Stop), (3, 0, 0));
}

#[tokio::test]
async fn a_panicking_observer_is_contained_and_the_next_still_runs() {
    let log = new_log();
    let set = ObserverSet::new()
        .with_named_observer("boom", Arc::new(Recorder::new("boom", &log).panicking()))
        .with_observer(Arc::new(Recorder::new("after", &log)));
    let info = subagent_info();

    set.notify_start(&info).await;
    set.notify_stop(&info, ObserverOutcome::Failed).await;

    assert_eq!(
        entries(&log),
        ["after:start:exec-1", "after:stop:exec-1:failed"]
    );
    assert_eq!(counts(&set, Hook::Start), (1, 1, 0));
    assert_eq!(counts(&set, Hook::Stop), (1, 1, 0));
}

#[tokio::test(start_paused = true)]
async fn the_budget_is_shared_by_all_observers_of_one_call() {
    let log = new_log();
    let set = ObserverSet::new()
        .with_budget(Duration::from_millis(300))
        .with_observer(Arc::new(
            Recorder::new("first", &log).slow(Duration::from_millis(200)),
        ))
        .with_observer(Arc::new(
            Recorder::new("second", &log).slow(Duration::from_millis(200)),
        ))
        .with_observer(Arc::new(Recorder::new("third", &log)));
    let info = subagent_info();

    let began = Instant::now();
    set.notify_start(&info).await;

    // The first fits (200 ms), the second is cut off at the 300 ms mark, and the third
    // finds the budget spent.
    assert_eq!(began.elapsed(), Duration::from_millis(300));
    assert_eq!(entries(&log), ["first:start:exec-1"]);
    assert_eq!(counts(&set, Hook::Start), (1, 1, 1));

    // Each hook call gets a fresh budget.
    log.lock().unwrap().clear();
    set.notify_stop(&info, ObserverOutcome::Aborted).await;
    assert_eq!(entries(&log), ["first:stop:exec-1:aborted"]);
    assert_eq!(counts(&set, Hook::Stop), (1, 1, 1));
    assert_eq!(counts(&set, Hook::Start), (1, 1, 1));
}

#[tokio::test]
async fn no_run_id_means_no_notifications() {
    let log = new_log();
    let receiver = Receiver::start(Answer::Ok).await;
    let set = ObserverSet::new()
        .with_observer(Arc::new(Recorder::new("a", &log)))
        .with_webhook(webhook(&receiver, None));
    let info = TaskInfo::subagent("exec-1", "", "", "batch-worker", false);

    set.notify_start(&info).await;
    set.notify_stop(&info, ObserverOutcome::Completed).await;
    let guard = set.start(info).await;
    drop(guard);
    // A task with a run id goes the same way, after them: once its dropped guard's stop
    // (spawned later, on this single-threaded runtime) has arrived, anything the tasks
    // without a run id had sent would have arrived before it.
    let control = set.start(subagent_info()).await;
    drop(control);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while receiver.requests().len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the control's stop arrives"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    assert_eq!(
        entries(&log),
        ["a:start:exec-1", "a:stop:exec-1:failed"],
        "only the task with a run id was observed"
    );
    assert_eq!(receiver.requests().len(), 2);
    // One observer and one webhook call per hook, all of them the control's.
    assert_eq!(counts(&set, Hook::Start), (2, 0, 0));
    assert_eq!(counts(&set, Hook::Stop), (2, 0, 0));
}

#[tokio::test]
async fn the_set_is_a_snapshot() {
    let log = new_log();
    let registry = ObserverRegistry::default();
    registry.register("a", Arc::new(Recorder::new("a", &log)));
    let run_set = registry.snapshot();
    registry.register("b", Arc::new(Recorder::new("b", &log)));

    run_set.notify_start(&subagent_info()).await;
    assert_eq!(entries(&log), ["a:start:exec-1"]);

    log.lock().unwrap().clear();
    registry.snapshot().notify_start(&subagent_info()).await;
    assert_eq!(entries(&log), ["a:start:exec-1", "b:start:exec-1"]);
    // Counters are shared by all snapshots.
    assert_eq!(counts(&registry.snapshot(), Hook::Start), (3, 0, 0));
}

#[tokio::test]
async fn the_guard_owes_a_stop_on_every_exit_path() {
    let log = new_log();
    let set = ObserverSet::new().with_observer(Arc::new(Recorder::new("a", &log)));

    let task = tokio::spawn({
        let set = set.clone();
        async move {
            let _guard = set.start(subagent_info()).await;
            panic!("the executor panicked");
        }
    });
    assert!(task.await.unwrap_err().is_panic());
    wait_for(|| entries(&log).len() == 2).await;
    assert_eq!(entries(&log), ["a:start:exec-1", "a:stop:exec-1:failed"]);

    // A recorded cancel followed by an abort of the task gives `aborted`.
    log.lock().unwrap().clear();
    let task = tokio::spawn({
        let set = set.clone();
        async move {
            let mut guard = set.start(subagent_info()).await;
            guard.set_drop_outcome(ObserverOutcome::Aborted);
            std::future::pending::<()>().await;
        }
    });
    wait_for(|| entries(&log).len() == 1).await;
    task.abort();
    wait_for(|| entries(&log).len() == 2).await;
    assert_eq!(entries(&log), ["a:start:exec-1", "a:stop:exec-1:aborted"]);

    log.lock().unwrap().clear();
    let guard = set.start(subagent_info()).await;
    guard.stop(ObserverOutcome::Completed).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        entries(&log),
        ["a:start:exec-1", "a:stop:exec-1:completed"],
        "an explicit stop is sent once"
    );
}

// ---------------------------------------------------------------- webhooks

#[tokio::test]
async fn the_webhook_gets_the_signed_body() {
    let receiver = Receiver::start(Answer::Ok).await;
    let log = new_log();
    let mut config = WebhookConfig::new(format!("{}/hooks/subflow?source=test", receiver.base));
    config.secret = Some("topsecret".into());
    config.headers.insert("X-Tenant".into(), "acme".into());
    // Reserved headers cannot be overridden by configuration.
    config
        .headers
        .insert("Content-Type".into(), "text/plain".into());
    let set = ObserverSet::new()
        .with_observer(Arc::new(Recorder::new("a", &log)))
        .with_webhook(WebhookObserver::new(config).unwrap());
    let info = subagent_info();

    set.notify_stop(&info, ObserverOutcome::Aborted).await;

    let requests = receiver.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/hooks/subflow?source=test");
    assert_eq!(request.header("x-subflow-event"), Some("task.stop"));
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(request.header("x-tenant"), Some("acme"));

    let mut mac = Hmac::<Sha256>::new_from_slice(b"topsecret").unwrap();
    mac.update(&request.body);
    let expected: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    assert_eq!(
        request.header("x-subflow-signature"),
        Some(format!("sha256={expected}").as_str())
    );

    let body: Value = serde_json::from_slice(&request.body).unwrap();
    let sent_at = body["sent_at"].as_str().expect("sent_at is a string");
    let parsed =
        time::OffsetDateTime::parse(sent_at, &time::format_description::well_known::Rfc3339)
            .expect("sent_at is RFC 3339");
    assert_eq!(parsed.offset(), time::UtcOffset::UTC);
    assert!(sent_at.ends_with('Z'), "{sent_at}");
    assert_eq!(
        body,
        json!({
            "event": "task.stop",
            "task": {
                "task_id": "exec-1",
                "run_id": "run-1",
                "thread_id": "thread-1",
                "kind": "subagent",
                "parent_task_id": "run-1",
                "agent_name": "researcher",
                "resumed": false,
            },
            "outcome": "aborted",
            "sent_at": sent_at,
        })
    );

    // The in-process observer ran too; both calls counted ok.
    assert_eq!(entries(&log), ["a:stop:exec-1:aborted"]);
    assert_eq!(counts(&set, Hook::Stop), (2, 0, 0));
}

#[tokio::test]
async fn without_a_secret_there_is_no_signature() {
    let receiver = Receiver::start(Answer::Ok).await;
    let set = ObserverSet::new().with_webhook(webhook(&receiver, None));

    set.notify_start(&TaskInfo::lead("run-9", "thread-9", true))
        .await;

    let requests = receiver.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.path, "/hook");
    assert_eq!(request.header("x-subflow-event"), Some("task.start"));
    assert_eq!(request.header("x-subflow-signature"), None);
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(body["event"], "task.start");
    assert!(body.get("outcome").is_none(), "a start has no outcome");
    assert_eq!(
        body["task"],
        json!({
            "task_id": "run-9",
            "run_id": "run-9",
            "thread_id": "thread-9",
            "kind": "lead",
            "parent_task_id": null,
            "agent_name": "lead_agent",
            "resumed": true,
        })
    );
    assert_eq!(counts(&set, Hook::Start), (1, 0, 0));
}

#[tokio::test]
async fn a_hanging_webhook_does_not_outlast_the_budget() {
    let receiver = Receiver::start(Answer::Hang).await;
    let set = ObserverSet::new()
        .with_budget(Duration::from_millis(300))
        .with_webhook(webhook(&receiver, Some("k")));

    let began = std::time::Instant::now();
    set.notify_stop(&subagent_info(), ObserverOutcome::Completed)
        .await;
    let took = began.elapsed();

    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(receiver.requests().len(), 1, "the request was sent");
    assert_eq!(counts(&set, Hook::Stop), (0, 1, 0));
}

#[tokio::test]
async fn webhooks_share_the_remaining_budget_concurrently() {
    // Each answers after 400 ms: one after the other would need 800 ms of a 700 ms
    // budget; concurrently both fit.
    let slow = Answer::After(Duration::from_millis(400));
    let first = Receiver::start(slow).await;
    let second = Receiver::start(slow).await;
    let set = ObserverSet::new()
        .with_budget(Duration::from_millis(700))
        .with_webhook(webhook(&first, None))
        .with_webhook(webhook(&second, None));

    set.notify_start(&subagent_info()).await;

    assert_eq!(first.requests().len(), 1);
    assert_eq!(second.requests().len(), 1);
    assert_eq!(counts(&set, Hook::Start), (2, 0, 0));
}

#[tokio::test]
async fn a_failing_webhook_is_logged_not_retried() {
    let receiver = Receiver::start(Answer::Status(500)).await;
    let set = ObserverSet::new().with_webhook(webhook(&receiver, None));

    set.notify_start(&subagent_info()).await;

    assert_eq!(receiver.requests().len(), 1, "no retry");
    assert_eq!(counts(&set, Hook::Start), (0, 1, 0));
}

#[tokio::test(start_paused = true)]
async fn webhooks_after_a_spent_budget_are_skipped() {
    let log = new_log();
    // Never contacted: the observer before it spends the whole budget.
    let unreachable = WebhookObserver::new(WebhookConfig::new("http://127.0.0.1:9/hook")).unwrap();
    let set = ObserverSet::new()
        .with_budget(Duration::from_millis(300))
        .with_observer(Arc::new(
            Recorder::new("hog", &log).slow(Duration::from_secs(10)),
        ))
        .with_webhook(unreachable);

    let began = Instant::now();
    set.notify_start(&subagent_info()).await;

    assert_eq!(began.elapsed(), Duration::from_millis(300));
    assert_eq!(counts(&set, Hook::Start), (0, 1, 1));
}

fn webhook(receiver: &Receiver, secret: Option<&str>) -> WebhookObserver {
    let mut config = WebhookConfig::new(format!("{}/hook", receiver.base));
    config.secret = secret.map(str::to_owned);
    WebhookObserver::new(config).unwrap()
}

async fn wait_for(condition: impl Fn() -> bool) {
    for _ in 0..200 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not met within 2 s");
}

// ---------------------------------------------------------------- local receiver

/// How the receiver answers.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// 200 at once.
    Ok,
    /// 200 after a delay.
    After(Duration),
    /// This status at once.
    Status(u16),
    /// Never; holds the request until the client goes away.
    Hang,
}

/// One request as received; the body is the exact bytes sent.
#[derive(Debug, Clone)]
struct Received {
    method: String,
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// An HTTP receiver on 127.0.0.1:0; stops when dropped.
#[derive(Debug)]
struct Receiver {
    base: String,
    requests: Arc<Mutex<Vec<Received>>>,
    task: JoinHandle<()>,
}

impl Receiver {
    async fn start(answer: Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&requests);
        let app = axum::Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| async move {
                record.lock().unwrap().push(Received {
                    method: method.to_string(),
                    path: uri.to_string(),
                    headers: headers
                        .iter()
                        .map(|(name, value)| {
                            (name.to_string(), value.to_str().unwrap_or("").to_owned())
                        })
                        .collect(),
                    body: body.to_vec(),
                });
                match answer {
                    Answer::Ok => StatusCode::OK,
                    Answer::After(delay) => {
                        tokio::time::sleep(delay).await;
                        StatusCode::OK
                    }
                    Answer::Status(status) => StatusCode::from_u16(status).unwrap(),
                    Answer::Hang => std::future::pending().await,
                }
            },
        );
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver {
            base,
            requests,
            task,
        }
    }

    fn requests(&self) -> Vec<Received> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
