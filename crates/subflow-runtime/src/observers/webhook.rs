//! The webhook observer (docs/events.md#webhooks): one signed JSON `POST` per hook call, never
//! retried.

use std::collections::BTreeMap;
use std::fmt;

use async_trait::async_trait;
use hmac::{Hmac, KeyInit, Mac};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde::Serialize;
use sha2::Sha256;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{BudgetNotice, Call, ObserverOutcome, TaskInfo, TaskObserver};
use crate::budget::BudgetEvent;

/// The header naming the event: `task.start`, `task.stop` or `budget`.
pub const EVENT_HEADER: &str = "x-subflow-event";
/// The header carrying `sha256=<hex HMAC-SHA256(secret, body)>`.
pub const SIGNATURE_HEADER: &str = "x-subflow-signature";

/// One `observers.webhooks` entry, with its `secret_env` already resolved by the caller.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct WebhookConfig {
    /// The `http` or `https` URL that receives the `POST`s.
    pub url: String,
    /// The HMAC key; no signature header is sent without it.
    pub secret: Option<String>,
    /// Extra request headers; they cannot replace the event, signature or content type.
    pub headers: BTreeMap<String, String>,
}

impl WebhookConfig {
    /// A webhook to `url` with no secret and no extra headers.
    pub fn new(url: impl Into<String>) -> Self {
        WebhookConfig {
            url: url.into(),
            ..Self::default()
        }
    }
}

impl fmt::Debug for WebhookConfig {
    // The secret and header values (often tokens) must never reach logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &self.url)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field(
                "headers",
                &self
                    .headers
                    .keys()
                    .map(|name| (name.as_str(), "<redacted>"))
                    .collect::<BTreeMap<_, _>>(),
            )
            .finish()
    }
}

/// Why a webhook could not be built or delivered.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The URL does not parse or is not `http`/`https`.
    #[error("invalid webhook URL '{url}': {reason}")]
    InvalidUrl {
        /// The configured URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configured header name or value is not valid HTTP.
    #[error("invalid webhook header '{0}'")]
    InvalidHeader(String),
    /// The HTTP client could not be built.
    #[error("webhook HTTP client: {0}")]
    Client(String),
    /// The request failed before an answer arrived.
    #[error("webhook request failed: {0}")]
    Request(reqwest::Error),
    /// The receiver answered with a non-2xx status.
    #[error("webhook answered HTTP {0}")]
    Status(u16),
}

/// Posts task events to one URL (docs/events.md#webhooks); register it with
/// [`ObserverSet::with_webhook`](super::ObserverSet::with_webhook).
pub struct WebhookObserver {
    url: reqwest::Url,
    // Scheme, host, port and path only: query strings often carry tokens.
    display: String,
    secret: Option<Vec<u8>>,
    headers: HeaderMap,
    client: reqwest::Client,
}

impl fmt::Debug for WebhookObserver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookObserver")
            .field("url", &self.display)
            .field("signed", &self.secret.is_some())
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl WebhookObserver {
    /// Validates `config` and builds the HTTP client.
    pub fn new(config: WebhookConfig) -> Result<Self, WebhookError> {
        let invalid = |reason: String| WebhookError::InvalidUrl {
            url: config.url.clone(),
            reason,
        };
        let url = reqwest::Url::parse(&config.url).map_err(|error| invalid(error.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(format!("unsupported scheme '{}'", url.scheme())));
        }
        if url.host_str().is_none() {
            return Err(invalid("no host".to_owned()));
        }
        let shown = format!(
            "{}://{}{}",
            url.scheme(),
            url.host_str().unwrap_or_default(),
            url.port()
                .map(|port| format!(":{port}"))
                .unwrap_or_default(),
        ) + url.path();

        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| WebhookError::InvalidHeader(name.clone()))?;
            if header == CONTENT_TYPE || header == EVENT_HEADER || header == SIGNATURE_HEADER {
                tracing::warn!("webhook {shown}: configured header '{name}' is ignored");
                continue;
            }
            let mut value = HeaderValue::from_str(value)
                .map_err(|_| WebhookError::InvalidHeader(name.clone()))?;
            value.set_sensitive(true);
            headers.append(header, value);
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));

        // No proxy from the environment (configuration comes from the caller) and no
        // redirects: a redirected POST would lose its body or reach an unsigned target.
        let client = reqwest::Client::builder()
            .user_agent(concat!("subflow/", env!("CARGO_PKG_VERSION")))
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| WebhookError::Client(error.to_string()))?;

        Ok(WebhookObserver {
            url,
            display: shown,
            secret: config.secret.map(String::into_bytes),
            headers,
            client,
        })
    }

    /// The URL without its query, for logs.
    pub fn url(&self) -> &str {
        &self.display
    }

    /// Posts one event: a start when `outcome` is `None`, else a stop. No retry and no
    /// timeout of its own; the caller bounds it with the hook budget.
    pub async fn deliver(
        &self,
        info: &TaskInfo,
        outcome: Option<ObserverOutcome>,
    ) -> Result<(), WebhookError> {
        match outcome {
            Some(outcome) => self.deliver_call(Call::Stop(info, outcome)).await,
            None => self.deliver_call(Call::Start(info)).await,
        }
    }

    /// Posts one budget crossing (`X-Subflow-Event: budget`), signed like the others.
    pub async fn deliver_budget(&self, notice: &BudgetNotice) -> Result<(), WebhookError> {
        self.deliver_call(Call::Budget(notice)).await
    }

    pub(super) async fn deliver_call(&self, call: Call<'_>) -> Result<(), WebhookError> {
        let event = call.hook().event();
        let body = body(call, OffsetDateTime::now_utc());
        let mut request = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .header(EVENT_HEADER, event);
        if let Some(secret) = &self.secret {
            request = request.header(SIGNATURE_HEADER, signature(secret, &body));
        }
        let response = request
            .body(body)
            .send()
            .await
            .map_err(|error| WebhookError::Request(error.without_url()))?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(WebhookError::Status(status.as_u16()))
        }
    }
}

#[async_trait]
impl TaskObserver for WebhookObserver {
    // For use as a plain in-process observer; `ObserverSet` calls `deliver` directly
    // to count and run webhooks concurrently.
    async fn on_task_start(&self, info: &TaskInfo) {
        if let Err(error) = self.deliver(info, None).await {
            tracing::warn!("webhook {} failed for task.start: {error}", self.display);
        }
    }

    async fn on_task_stop(&self, info: &TaskInfo, outcome: ObserverOutcome) {
        if let Err(error) = self.deliver(info, Some(outcome)).await {
            tracing::warn!("webhook {} failed for task.stop: {error}", self.display);
        }
    }

    async fn on_budget(&self, notice: &BudgetNotice) {
        if let Err(error) = self.deliver_budget(notice).await {
            tracing::warn!("webhook {} failed for budget: {error}", self.display);
        }
    }
}

/// `sha256=<lowercase hex HMAC-SHA256(secret, body)>`, the `X-Subflow-Signature` value.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut text = String::with_capacity(7 + 2 * digest.len());
    text.push_str("sha256=");
    for byte in digest.iter() {
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

#[derive(Serialize)]
struct Body<'a> {
    event: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    task: Option<TaskBody<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    budget: Option<BudgetBody<'a>>,
    sent_at: String,
}

#[derive(Serialize)]
struct TaskBody<'a> {
    task_id: &'a str,
    run_id: &'a str,
    thread_id: &'a str,
    kind: &'static str,
    parent_task_id: Option<&'a str>,
    agent_name: Option<&'a str>,
    resumed: bool,
}

#[derive(Serialize)]
struct BudgetBody<'a> {
    #[serde(flatten)]
    event: &'a BudgetEvent,
    currency: &'a str,
    run_id: Option<&'a str>,
    thread_id: &'a str,
    user_id: &'a str,
    batch_id: Option<&'a str>,
}

/// The exact body bytes, which are also what gets signed.
fn body<'a>(call: Call<'a>, now: OffsetDateTime) -> Vec<u8> {
    // Millisecond precision: plenty for receivers, and parseable by the strictest ones.
    let now = now
        .replace_nanosecond(now.millisecond() as u32 * 1_000_000)
        .unwrap_or(now);
    let task = |info: &'a TaskInfo| TaskBody {
        task_id: &info.task_id,
        run_id: &info.run_id,
        thread_id: &info.thread_id,
        kind: info.kind.as_str(),
        parent_task_id: info.parent_task_id.as_deref(),
        agent_name: info.agent_name.as_deref(),
        resumed: info.resumed,
    };
    let (task, outcome, budget) = match call {
        Call::Start(info) => (Some(task(info)), None, None),
        Call::Stop(info, outcome) => (Some(task(info)), Some(outcome.as_str()), None),
        Call::Budget(notice) => (
            None,
            None,
            Some(BudgetBody {
                event: &notice.event,
                currency: &notice.currency,
                run_id: Some(notice.run_id.as_str()).filter(|id| !id.is_empty()),
                thread_id: &notice.thread_id,
                user_id: &notice.user_id,
                batch_id: notice.batch_id.as_deref(),
            }),
        ),
    };
    let body = Body {
        event: call.hook().event(),
        task,
        outcome,
        budget,
        sent_at: now.format(&Rfc3339).unwrap_or_default(),
    };
    serde_json::to_vec(&body).expect("a struct of strings, numbers and bools serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_shape_of_a_stop() {
        let info = TaskInfo::subagent("exec", "run", "thread", "coder", false);
        let now = time::macros::datetime!(2025-01-02 03:04:05.123456789 UTC);
        let bytes = body(Call::Stop(&info, ObserverOutcome::Aborted), now);
        let text = String::from_utf8(bytes).unwrap();
        assert_eq!(
            text,
            r#"{"event":"task.stop","task":{"task_id":"exec","run_id":"run","thread_id":"thread","kind":"subagent","parent_task_id":"run","agent_name":"coder","resumed":false},"outcome":"aborted","sent_at":"2025-01-02T03:04:05.123Z"}"#
        );
    }

    #[test]
    fn a_start_has_no_outcome_and_null_parent() {
        let info = TaskInfo::lead("run", "thread", true);
        let now = time::macros::datetime!(2025-01-02 03:04:05 UTC);
        let value: serde_json::Value =
            serde_json::from_slice(&body(Call::Start(&info), now)).unwrap();
        assert!(value.get("outcome").is_none());
        assert_eq!(value["task"]["parent_task_id"], serde_json::Value::Null);
        assert_eq!(value["task"]["kind"], "lead");
        assert_eq!(value["sent_at"], "2025-01-02T03:04:05Z");
    }

    #[test]
    fn body_shape_of_a_budget_crossing() {
        let notice = BudgetNotice {
            run_id: String::new(),
            thread_id: "thread".into(),
            user_id: "ada".into(),
            batch_id: Some("subagent-batch-1".into()),
            currency: "USD".into(),
            event: BudgetEvent {
                action: crate::budget::BudgetAction::Warn,
                scope: crate::budget::BudgetScope::Batch,
                limit: 2.0,
                spent: 1.7,
                fraction: 0.8,
            },
        };
        let now = time::macros::datetime!(2025-01-02 03:04:05 UTC);
        let text = String::from_utf8(body(Call::Budget(&notice), now)).unwrap();
        assert_eq!(
            text,
            r#"{"event":"budget","budget":{"action":"warn","scope":"batch","limit":2.0,"spent":1.7,"fraction":0.8,"currency":"USD","run_id":null,"thread_id":"thread","user_id":"ada","batch_id":"subagent-batch-1"},"sent_at":"2025-01-02T03:04:05Z"}"#
        );
    }

    #[test]
    fn signature_matches_rfc_4231_case_2() {
        // RFC 4231 test case 2: key "Jefe".
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn debug_redacts_the_secret_and_header_values() {
        let mut config = WebhookConfig::new("https://example.test/hook?token=abc");
        config.secret = Some("s3cr3t".into());
        config
            .headers
            .insert("Authorization".into(), "Bearer xyz".into());
        let text = format!("{config:?}");
        assert!(!text.contains("s3cr3t") && !text.contains("xyz"), "{text}");
        let observer = WebhookObserver::new(config).unwrap();
        let text = format!("{observer:?}");
        assert!(!text.contains("s3cr3t") && !text.contains("xyz"), "{text}");
        assert!(!text.contains("token=abc"), "{text}");
        assert_eq!(observer.url(), "https://example.test/hook");
    }

    #[test]
    fn bad_configs_are_rejected() {
        assert!(matches!(
            WebhookObserver::new(WebhookConfig::new("ftp://example.test/")),
            Err(WebhookError::InvalidUrl { .. })
        ));
        assert!(matches!(
            WebhookObserver::new(WebhookConfig::new("not a url")),
            Err(WebhookError::InvalidUrl { .. })
        ));
        let mut config = WebhookConfig::new("http://127.0.0.1:1/");
        config.headers.insert("bad header".into(), "v".into());
        assert!(matches!(
            WebhookObserver::new(config),
            Err(WebhookError::InvalidHeader(_))
        ));
    }
}
