//! Retries, failures and cancellation, the same for both providers. Tests that wait for
//! a backoff run on paused time, so they take no real seconds.

use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use subflow_models::{ChatEvent, Error};
use tokio::time::Instant;

use crate::server::{End, Reply, TestServer};
use crate::{PROVIDERS, Provider, call, hello, within};

fn rate_limited(provider: Provider) -> Reply {
    let body = match provider {
        Provider::OpenAi => {
            r#"{"error":{"message":"Rate limit reached for gpt-4o-mini","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#
        }
        Provider::Anthropic => {
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of requests has exceeded your rate limit"}}"#
        }
    };
    Reply::status(429, body).header("retry-after", "3")
}

/// The first pieces of an answer: enough for one text event, not the end.
fn beginning(provider: Provider) -> Vec<String> {
    let pieces = match provider {
        Provider::OpenAi => 2,
        // `message_start` and an empty `content_block_start` yield nothing yet.
        Provider::Anthropic => 3,
    };
    provider.hi().into_iter().take(pieces).collect()
}

#[tokio::test(start_paused = true)]
async fn a_429_is_retried_after_its_retry_after() {
    for provider in PROVIDERS {
        let server =
            TestServer::start(vec![rate_limited(provider), Reply::sse(provider.hi())]).await;
        let model = provider.model(&server, 2);
        let started = Instant::now();

        let (message, _, _) = call(model.as_ref(), hello()).await.unwrap();

        assert_eq!(message.content, json!("Hi!"), "{provider:?}");
        assert_eq!(server.requests().len(), 2, "{provider:?}");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(3) && waited < Duration::from_millis(3500),
            "{provider:?} waited {waited:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_500_is_retried_until_the_retries_run_out() {
    for provider in PROVIDERS {
        for max_retries in [0, 1, 2] {
            let server = TestServer::start(vec![Reply::status(
                500,
                r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error"}}"#,
            )])
            .await;
            let model = provider.model(&server, max_retries);
            let started = Instant::now();

            let error = call(model.as_ref(), hello()).await.unwrap_err();

            let Error::Status { status, detail, .. } = &error else {
                panic!("{provider:?}: {error:?}");
            };
            assert_eq!(*status, 500);
            assert!(detail.contains("The server had an error"), "{detail}");
            assert_eq!(
                server.requests().len(),
                max_retries as usize + 1,
                "{provider:?}"
            );
            // Backoff from 500 ms, doubling: 0, 0.5 s, then 0.5 + 1 s.
            let expected = [0, 500, 1500][max_retries as usize];
            assert_eq!(
                started.elapsed().as_millis(),
                expected,
                "{provider:?} with {max_retries} retries"
            );
        }
    }
}

#[tokio::test]
async fn a_400_fails_at_once_with_the_response_body() {
    for provider in PROVIDERS {
        let message = format!("messages.0: {}", "x".repeat(2000));
        let body = json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}});
        let server = TestServer::start(vec![
            Reply::status(400, &body.to_string()),
            Reply::sse(provider.hi()),
        ])
        .await;
        let model = provider.model(&server, 2);

        let error = within(call(model.as_ref(), hello())).await.unwrap_err();

        let Error::Status { status, detail, .. } = &error else {
            panic!("{provider:?}: {error:?}");
        };
        assert_eq!(*status, 400);
        assert!(detail.contains("invalid_request_error"), "{detail}");
        assert!(detail.chars().count() <= 501, "{}", detail.len());
        assert_eq!(server.requests().len(), 1, "{provider:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_cut_before_its_first_event_is_retried() {
    for provider in PROVIDERS {
        // Only the preamble (a role chunk, `message_start`) arrives, which yields nothing.
        let preamble: Vec<String> = provider.hi().into_iter().take(1).collect();
        let server = TestServer::start(vec![
            Reply::sse(preamble).ending(End::Cut),
            Reply::sse(provider.hi()),
        ])
        .await;
        let model = provider.model(&server, 2);

        let (message, _, _) = call(model.as_ref(), hello()).await.unwrap();

        assert_eq!(message.content, json!("Hi!"), "{provider:?}");
        assert_eq!(server.requests().len(), 2, "{provider:?}");
    }
}

#[tokio::test]
async fn a_stream_cut_after_its_first_event_fails_without_a_retry() {
    for provider in PROVIDERS {
        let server = TestServer::start(vec![
            Reply::sse(beginning(provider)).ending(End::Cut),
            Reply::sse(provider.hi()),
        ])
        .await;
        let model = provider.model(&server, 2);

        let error = within(call(model.as_ref(), hello())).await.unwrap_err();

        assert!(matches!(error, Error::Transport { .. }), "{error:?}");
        assert_eq!(server.requests().len(), 1, "{provider:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn connection_errors_are_retried_then_reported() {
    // A port that was just free: connecting is refused.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    for provider in PROVIDERS {
        let model = provider.model_at(&base, 1);
        let started = Instant::now();

        let error = call(model.as_ref(), hello()).await.unwrap_err();

        assert!(matches!(error, Error::Transport { .. }), "{error:?}");
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(500),
            "{provider:?}"
        );
    }
}

#[tokio::test]
async fn dropping_the_stream_closes_the_connection() {
    for provider in PROVIDERS {
        let server =
            TestServer::start(vec![Reply::sse(beginning(provider)).ending(End::Hang)]).await;
        let model = provider.model(&server, 2);

        let mut stream = within(model.stream(hello())).await.unwrap();
        let first = within(stream.next()).await;
        assert!(
            matches!(first, Some(Ok(ChatEvent::TextDelta(_)))),
            "{provider:?}: {first:?}"
        );
        drop(stream);

        within(server.hung_connection_closed()).await;
        assert_eq!(server.requests().len(), 1);
    }
}
