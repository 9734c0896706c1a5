//! The HTTP client of the client commands (`tail`, `usage`, `batches`): the gateway at `SUBFLOW_URL`
//! (default `http://127.0.0.1:8001`), with `Authorization: Bearer $SUBFLOW_TOKEN` when the
//! variable is set (docs/operations.md#commands, docs/api.md#auth-and-ownership).

use std::time::Duration;

use anyhow::{Context, anyhow};
use serde_json::Value;

/// Where the gateway is.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// The gateway's base URL.
    #[arg(long, env = "SUBFLOW_URL", default_value = "http://127.0.0.1:8001", value_parser = gateway_url)]
    pub url: String,
}

/// `--url`: an absolute `http://` or `https://` URL, else a usage error that says so.
fn gateway_url(text: &str) -> Result<String, String> {
    match reqwest::Url::parse(text) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => {
            Ok(text.to_owned())
        }
        Ok(url) => Err(format!(
            "expected an http:// or https:// URL of the gateway, got scheme '{}'",
            url.scheme()
        )),
        Err(error) => Err(format!(
            "expected the gateway's URL, such as http://127.0.0.1:8001 ({error})"
        )),
    }
}

/// A gateway client.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

/// A response the gateway refused.
#[derive(Debug, thiserror::Error)]
#[error("{method} {path}: HTTP {status}: {detail}")]
pub struct HttpError {
    /// The method.
    pub method: &'static str,
    /// The path asked for.
    pub path: String,
    /// The status code.
    pub status: u16,
    /// The gateway's `detail`, or the body.
    pub detail: String,
}

impl HttpError {
    /// Whether the gateway refused what the command asked for (exit code 2): a thread,
    /// run or model that does not exist (404, 422), a bad value (400), or a missing or
    /// insufficient `SUBFLOW_TOKEN` (401, 403). Conflicts, limits and server errors are
    /// runtime errors.
    pub fn is_usage_error(&self) -> bool {
        matches!(self.status, 400 | 401 | 403 | 404 | 422)
    }
}

impl Client {
    /// A client for `args.url`, with the token from `SUBFLOW_TOKEN` if it is set.
    pub fn new(args: &ClientArgs) -> anyhow::Result<Client> {
        let token = std::env::var("SUBFLOW_TOKEN")
            .ok()
            .map(|token| token.trim().to_owned())
            .filter(|token| !token.is_empty());
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .context("building the HTTP client")?;
        Ok(Client {
            http,
            base: args.url.trim_end_matches('/').to_owned(),
            token,
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Sends a request; non-2xx answers become [`HttpError`].
    async fn send(
        &self,
        method: &'static str,
        path: &str,
        request: reqwest::RequestBuilder,
    ) -> anyhow::Result<reqwest::Response> {
        let response = request
            .send()
            .await
            .with_context(|| format!("cannot reach the gateway at {}", self.base))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.text().await.unwrap_or_default();
        let detail = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v.get("detail").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or(body);
        let detail = if status.as_u16() == 401 {
            format!("{detail} (set SUBFLOW_TOKEN to a token from `subflow tokens create`)")
        } else {
            detail
        };
        Err(anyhow!(HttpError {
            method,
            path: path.to_owned(),
            status: status.as_u16(),
            detail,
        }))
    }

    /// The text of a GET answered within a minute.
    pub async fn get_text(&self, path: &str) -> anyhow::Result<String> {
        self.get_text_within(path, Some(Duration::from_secs(60)))
            .await
    }

    /// The text of a GET; `timeout` bounds the exchange, `None` waits as long as the
    /// gateway does (a join lasts as long as its run).
    pub async fn get_text_within(
        &self,
        path: &str,
        timeout: Option<Duration>,
    ) -> anyhow::Result<String> {
        let mut request = self.request(reqwest::Method::GET, path);
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        let response = self.send("GET", path, request).await?;
        response
            .text()
            .await
            .with_context(|| format!("reading GET {path}"))
    }

    /// A GET's answer as it arrives, for bodies too large to hold (the batch export);
    /// no timeout, the body streams as long as the gateway sends it.
    pub async fn get_streamed(&self, path: &str) -> anyhow::Result<reqwest::Response> {
        let request = self.request(reqwest::Method::GET, path);
        self.send("GET", path, request).await
    }

    /// The JSON of a GET.
    pub async fn get_json(&self, path: &str) -> anyhow::Result<Value> {
        let text = self.get_text(path).await?;
        serde_json::from_str(&text).with_context(|| format!("GET {path} did not answer JSON"))
    }

    /// The thread's record; a thread that does not exist, or is another user's, is the
    /// gateway's 404 `Thread … not found`.
    pub async fn thread(&self, thread: &str) -> anyhow::Result<Value> {
        self.get_json(&format!("/api/threads/{}", encode(thread)))
            .await
    }

    /// POSTs `body` as JSON and returns the JSON answer (`null` for an empty body).
    /// `timeout` bounds the whole exchange; `None` waits as long as the gateway does.
    pub async fn post_json(
        &self,
        path: &str,
        body: &Value,
        timeout: Option<Duration>,
    ) -> anyhow::Result<Value> {
        let mut request = self.request(reqwest::Method::POST, path).json(body);
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        let response = self.send("POST", path, request).await?;
        let text = response
            .text()
            .await
            .with_context(|| format!("reading POST {path}"))?;
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).with_context(|| format!("POST {path} did not answer JSON"))
    }

    /// POSTs `body` (JSON bytes) in pieces, calling `sent(bytes so far)` as each piece
    /// goes out, and returns the status and the JSON answer.
    pub async fn post_json_bytes(
        &self,
        path: &str,
        body: Vec<u8>,
        sent: impl Fn(usize) + Send + Sync + 'static,
    ) -> anyhow::Result<(u16, Value)> {
        const PIECE: usize = 64 * 1024;
        let total = body.len();
        let pieces = (0..total.div_ceil(PIECE)).map(move |n| {
            let end = ((n + 1) * PIECE).min(total);
            sent(end);
            Ok::<_, std::io::Error>(body[n * PIECE..end].to_vec())
        });
        let request = self
            .request(reqwest::Method::POST, path)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::CONTENT_LENGTH, total)
            .body(reqwest::Body::wrap_stream(futures::stream::iter(pieces)));
        let response = self.send("POST", path, request).await?;
        let status = response.status().as_u16();
        let text = response
            .text()
            .await
            .with_context(|| format!("reading POST {path}"))?;
        let answer = serde_json::from_str(&text)
            .with_context(|| format!("POST {path} did not answer JSON"))?;
        Ok((status, answer))
    }

    /// Opens an SSE stream, resuming after `last_event_id` when given.
    pub async fn stream(
        &self,
        path: &str,
        last_event_id: Option<&str>,
    ) -> anyhow::Result<reqwest::Response> {
        let mut request = self
            .request(reqwest::Method::GET, path)
            .header("Accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        self.send("GET", path, request).await
    }
}

/// `encodeURIComponent` for path segments and query values.
pub fn encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// A thread id from the command line, checked as the gateway checks it (exit 2 if bad).
pub fn thread_arg(thread: &str) -> Result<&str, super::UsageError> {
    if subflow_contracts::ids::is_valid_thread_id(thread) {
        Ok(thread)
    } else {
        Err(super::UsageError(format!(
            "invalid thread id '{thread}': expected 1-64 characters from A-Z, a-z, 0-9, '_' and '-'"
        )))
    }
}
