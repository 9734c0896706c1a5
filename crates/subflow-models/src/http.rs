//! What the HTTP providers share: the client, retries with backoff, and the loop that
//! turns a streamed response body into [`ChatEvent`]s.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Response, StatusCode, Url};
use serde_json::Value;

use crate::sse::{SseEvent, SseParser};
use crate::{ChatEvent, ChatStream, Error};

/// How much of an error response body is kept in [`Error::Status`].
const DETAIL_CHARS: usize = 500;

/// The default of the providers' `timeout`: a stream that stays silent this long is dead.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The default of the providers' `max_retries` (docs/configuration.md#models).
pub const DEFAULT_MAX_RETRIES: u32 = 2;

/// Waits between attempts of one model call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait before the first retry; it doubles for each further one.
    pub initial: Duration,
    /// No wait is longer than this, a server's `retry-after` included.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(8),
        }
    }
}

impl Backoff {
    /// The wait before retry number `retry` (0-based): the server's `retry-after` when it
    /// sent one, else `initial` doubled per retry; never more than `max`.
    pub(crate) fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        let doubled = self
            .initial
            .saturating_mul(2u32.saturating_pow(retry.min(16)));
        retry_after.unwrap_or(doubled).min(self.max)
    }
}

/// Checks a configured `base_url` and returns it without a trailing slash.
pub(crate) fn base_url(raw: &str) -> Result<(String, Url), Error> {
    let trimmed = raw.trim().trim_end_matches('/');
    let url = Url::parse(trimmed)
        .map_err(|error| Error::Config(format!("base_url {trimmed:?}: {error}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(Error::Config(format!(
            "base_url {trimmed:?}: expected an http or https URL"
        )));
    }
    Ok((trimmed.to_owned(), url))
}

/// A header for every request; `sensitive` keeps its value out of reqwest's `Debug`.
pub(crate) fn header(
    name: &'static str,
    value: &str,
    sensitive: bool,
) -> Result<(HeaderName, HeaderValue), Error> {
    let mut value = HeaderValue::from_str(value)
        .map_err(|_| Error::Config(format!("the value for header {name} is not valid")))?;
    value.set_sensitive(sensitive);
    Ok((HeaderName::from_static(name), value))
}

/// The first `DETAIL_CHARS` characters of an error body.
pub(crate) fn truncate(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(DETAIL_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// One provider endpoint: where to POST, with which headers, how often to retry.
pub(crate) struct Endpoint {
    pub provider: &'static str,
    pub url: String,
    client: reqwest::Client,
    headers: HeaderMap,
    max_retries: u32,
    backoff: Backoff,
}

impl std::fmt::Debug for Endpoint {
    // Spelled out so that no header value, redacted or not, is ever printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.url)
            .field("max_retries", &self.max_retries)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

/// Why one attempt failed, and whether another attempt may help.
struct Failure {
    error: Error,
    retryable: bool,
    retry_after: Option<Duration>,
}

impl Endpoint {
    /// An endpoint with its own connection pool.
    pub fn new(
        provider: &'static str,
        url: String,
        headers: Vec<(HeaderName, HeaderValue)>,
        timeout: Option<Duration>,
        max_retries: u32,
        backoff: Backoff,
    ) -> Result<Self, Error> {
        // `no_proxy` because reqwest would otherwise read `HTTP(S)_PROXY` from the
        // environment, and this crate takes its configuration only from its caller.
        let mut builder = reqwest::Client::builder()
            .user_agent(concat!("subflow/", env!("CARGO_PKG_VERSION")))
            .no_proxy();
        if let Some(timeout) = timeout {
            // A total timeout would cut long answers off; these bound silence instead.
            builder = builder.connect_timeout(timeout).read_timeout(timeout);
        }
        let client = builder
            .build()
            .map_err(|error| Error::Config(format!("{provider} HTTP client: {error}")))?;
        Ok(Endpoint {
            provider,
            url,
            client,
            headers: headers.into_iter().collect(),
            max_retries,
            backoff,
        })
    }

    /// POSTs `body` and streams the answer, decoding its events with `D`.
    pub async fn stream<D: Decoder>(self: &Arc<Self>, body: Value) -> Result<ChatStream, Error> {
        let mut attempts = 0;
        let response = self.send(&body, &mut attempts, None).await?;
        let driver = Driver::<D> {
            endpoint: Arc::clone(self),
            body,
            response: Some(response),
            parser: SseParser::default(),
            decoder: D::default(),
            pending: VecDeque::new(),
            failed: None,
            yielded: false,
            attempts,
        };
        Ok(futures::stream::unfold(driver, |mut driver| async move {
            let item = driver.next().await?;
            Some((item, driver))
        })
        .boxed())
    }

    /// Attempts the request until a successful answer starts, a failure is final, or the
    /// retries are used up. `attempts` counts attempts across the whole call, so that a
    /// stream that breaks before its first event retries within the same budget.
    async fn send(
        &self,
        body: &Value,
        attempts: &mut u32,
        mut wait: Option<Duration>,
    ) -> Result<Response, Error> {
        loop {
            if let Some(wait) = wait.take() {
                tokio::time::sleep(wait).await;
            }
            *attempts += 1;
            match self.attempt(body).await {
                Ok(response) => return Ok(response),
                Err(failure) if failure.retryable && *attempts <= self.max_retries => {
                    let delay = self.backoff.delay(*attempts - 1, failure.retry_after);
                    tracing::warn!(
                        provider = self.provider,
                        attempt = *attempts,
                        retry_in_ms = delay.as_millis() as u64,
                        error = %failure.error,
                        "model call failed; retrying"
                    );
                    wait = Some(delay);
                }
                Err(failure) => return Err(failure.error),
            }
        }
    }

    async fn attempt(&self, body: &Value) -> Result<Response, Failure> {
        let response = self
            .client
            .post(&self.url)
            .headers(self.headers.clone())
            .json(body)
            .send()
            .await
            .map_err(|error| Failure {
                retryable: !error.is_builder(),
                error: self.transport(&error),
                retry_after: None,
            })?;
        let status = response.status();
        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("application/json"));
        if status.is_success() && !is_json {
            return Ok(response);
        }
        let retry_after = retry_after(response.headers());
        let text = response.text().await.unwrap_or_default();
        if status.is_success() {
            // A server that ignored `stream: true`; its answer is not an event stream.
            return Err(Failure {
                error: Error::Protocol {
                    provider: self.provider,
                    detail: format!("expected an event stream, got JSON: {}", truncate(&text)),
                },
                retryable: false,
                retry_after: None,
            });
        }
        let detail = if text.trim().is_empty() {
            status.canonical_reason().unwrap_or_default().to_owned()
        } else {
            truncate(&text)
        };
        Err(Failure {
            error: Error::Status {
                provider: self.provider,
                status: status.as_u16(),
                detail,
            },
            retryable: retryable_status(status.as_u16()),
            retry_after,
        })
    }

    fn transport(&self, error: &reqwest::Error) -> Error {
        // reqwest's own message is generic ("error sending request"); the cause says why.
        let mut detail = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            detail.push_str(": ");
            detail.push_str(&cause.to_string());
            source = cause.source();
        }
        Error::Transport {
            provider: self.provider,
            detail,
        }
    }
}

/// 429 and 5xx are worth another attempt; other statuses will not change.
pub(crate) fn retryable_status(status: u16) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS.as_u16() || (500..600).contains(&status)
}

fn retryable(error: &Error) -> bool {
    match error {
        Error::Transport { .. } => true,
        Error::Status { status, .. } => retryable_status(*status),
        _ => false,
    }
}

/// `retry-after-ms` or `retry-after` in seconds; the HTTP-date form is not used by the
/// model providers and falls back to the backoff.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| {
        headers
            .get(name)?
            .to_str()
            .ok()?
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|value| value.is_finite() && *value >= 0.0)
    };
    // `try_from` because a huge value must fall back to the backoff, not panic.
    number("retry-after-ms")
        .and_then(|ms| Duration::try_from_secs_f64(ms / 1000.0).ok())
        .or_else(|| number("retry-after").and_then(|s| Duration::try_from_secs_f64(s).ok()))
}

/// Turns a provider's SSE events into [`ChatEvent`]s.
pub(crate) trait Decoder: Default + Send + 'static {
    /// Reads one event, appending what it means to `out`; `Ok(true)` once the answer is
    /// complete and the rest of the body can be ignored.
    fn event(&mut self, event: SseEvent, out: &mut VecDeque<ChatEvent>) -> Result<bool, Error>;

    /// The body ended before the answer was complete: appends the closing events when what
    /// arrived is a whole answer anyway, else fails.
    fn end(&mut self, out: &mut VecDeque<ChatEvent>) -> Result<(), Error>;
}

/// The state of one streamed call. It owns the response, so dropping the stream closes
/// the connection; nothing runs in the background.
struct Driver<D> {
    endpoint: Arc<Endpoint>,
    body: Value,
    /// `None` once the body is finished or failed.
    response: Option<Response>,
    parser: SseParser,
    decoder: D,
    /// Decoded events not yet handed out.
    pending: VecDeque<ChatEvent>,
    /// A failure to report after the pending events.
    failed: Option<Error>,
    /// Whether the consumer has seen an event; from then on nothing is retried.
    yielded: bool,
    attempts: u32,
}

impl<D: Decoder> Driver<D> {
    async fn next(&mut self) -> Option<Result<ChatEvent, Error>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                self.yielded = true;
                return Some(Ok(event));
            }
            if let Some(error) = self.failed.take() {
                return Some(Err(error));
            }
            let response = self.response.as_mut()?;
            let chunk = response.chunk().await;
            if let Err(error) = self.read(chunk) {
                self.response = None;
                if !self.yielded && retryable(&error) && self.attempts <= self.endpoint.max_retries
                {
                    if let Err(error) = self.retry(error).await {
                        return Some(Err(error));
                    }
                } else {
                    self.failed = Some(error);
                }
            }
        }
    }

    fn read(&mut self, chunk: reqwest::Result<Option<impl AsRef<[u8]>>>) -> Result<(), Error> {
        let mut events = Vec::new();
        let chunk = chunk.map_err(|error| self.endpoint.transport(&error))?;
        let ended = chunk.is_none();
        match chunk {
            Some(bytes) => self.parser.push(bytes.as_ref(), &mut events),
            None => self.parser.finish(&mut events),
        }
        for event in events {
            if self.decoder.event(event, &mut self.pending)? {
                self.response = None;
                return Ok(());
            }
        }
        if ended {
            self.response = None;
            self.decoder.end(&mut self.pending)?;
        }
        Ok(())
    }

    /// Starts the call again after the stream broke before its first event.
    async fn retry(&mut self, error: Error) -> Result<(), Error> {
        let delay = self
            .endpoint
            .backoff
            .delay(self.attempts.saturating_sub(1), None);
        tracing::warn!(
            provider = self.endpoint.provider,
            attempt = self.attempts,
            retry_in_ms = delay.as_millis() as u64,
            %error,
            "model stream failed before its first event; retrying"
        );
        self.pending.clear();
        self.parser = SseParser::default();
        self.decoder = D::default();
        let endpoint = Arc::clone(&self.endpoint);
        let response = endpoint
            .send(&self.body, &mut self.attempts, Some(delay))
            .await?;
        self.response = Some(response);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_honours_retry_after_and_is_capped() {
        let backoff = Backoff::default();
        let ms = Duration::from_millis;
        assert_eq!(backoff.delay(0, None), ms(500));
        assert_eq!(backoff.delay(1, None), ms(1000));
        assert_eq!(backoff.delay(3, None), ms(4000));
        assert_eq!(backoff.delay(10, None), ms(8000));
        assert_eq!(backoff.delay(u32::MAX, None), ms(8000));
        assert_eq!(backoff.delay(0, Some(ms(2000))), ms(2000));
        assert_eq!(backoff.delay(0, Some(ms(60_000))), ms(8000));
    }

    #[test]
    fn retry_after_reads_seconds_or_milliseconds() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(250)));
        headers.insert(
            "retry-after-ms",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
    }

    #[test]
    fn error_bodies_are_cut_at_a_character_boundary() {
        assert_eq!(truncate(" short "), "short");
        let long = "é".repeat(600);
        let cut = truncate(&long);
        assert_eq!(cut.chars().count(), DETAIL_CHARS + 1);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn base_urls_lose_their_trailing_slash_and_must_be_http() {
        assert_eq!(
            base_url("http://127.0.0.1:8080/v1/").unwrap().0,
            "http://127.0.0.1:8080/v1"
        );
        assert!(matches!(base_url("not a url"), Err(Error::Config(_))));
        assert!(matches!(base_url("ftp://host/"), Err(Error::Config(_))));
    }
}
