//! A local OTLP/HTTP receiver on 127.0.0.1:0 that records every request, and answers
//! 200, 500, or never.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use tokio::sync::Notify;

/// How the receiver answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// 200 with an empty body.
    Ok,
    /// 500.
    Fail,
    /// Reads the request, then never answers.
    Hang,
}

/// One recorded request.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub request: ExportTraceServiceRequest,
}

#[derive(Clone)]
struct Shared {
    behaviour: Behaviour,
    received: Arc<Mutex<Vec<Received>>>,
    arrived: Arc<Notify>,
}

/// A running receiver.
pub struct Receiver {
    pub base: String,
    received: Arc<Mutex<Vec<Received>>>,
    arrived: Arc<Notify>,
}

async fn record(
    State(shared): State<Shared>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let request = ExportTraceServiceRequest::decode(body).expect("a valid OTLP protobuf body");
    shared.received.lock().unwrap().push(Received {
        path: uri.path().to_owned(),
        headers,
        request,
    });
    shared.arrived.notify_waiters();
    match shared.behaviour {
        Behaviour::Ok => StatusCode::OK,
        Behaviour::Fail => StatusCode::INTERNAL_SERVER_ERROR,
        Behaviour::Hang => std::future::pending().await,
    }
}

impl Receiver {
    /// Starts a receiver accepting POSTs on any path.
    pub async fn start(behaviour: Behaviour) -> Receiver {
        let shared = Shared {
            behaviour,
            received: Arc::default(),
            arrived: Arc::default(),
        };
        let app = Router::new()
            .route("/{*path}", post(record))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver {
            base,
            received: shared.received,
            arrived: shared.arrived,
        }
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Waits until at least one request has arrived.
    pub async fn wait_for_request(&self) {
        loop {
            let notified = self.arrived.notified();
            if !self.received.lock().unwrap().is_empty() {
                return;
            }
            notified.await;
        }
    }
}
