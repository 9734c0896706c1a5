//! A small HTTP/1.1 server on 127.0.0.1:0 that records each request and answers with
//! scripted replies, streamed in chunked transfer encoding the way the providers do.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// How a reply's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// With the terminating chunk.
    Complete,
    /// The connection drops mid-body, as when a proxy or the provider resets it.
    Cut,
    /// The body stays open until the client goes away.
    Hang,
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    parts: Vec<String>,
    end: End,
}

impl Reply {
    /// A 200 event stream sent in these pieces, each written and flushed on its own.
    pub fn sse<S: Into<String>>(parts: impl IntoIterator<Item = S>) -> Self {
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            parts: parts.into_iter().map(Into::into).collect(),
            end: End::Complete,
        }
    }

    /// An error status with a JSON body.
    pub fn status(status: u16, body: &str) -> Self {
        Reply {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            parts: vec![body.to_owned()],
            end: End::Complete,
        }
    }

    /// Adds a response header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Changes how the body ends.
    pub fn ending(mut self, end: End) -> Self {
        self.end = end;
        self
    }
}

/// What the client sent.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// Header names lower-cased.
    pub headers: HashMap<String, String>,
    pub body: Value,
}

/// A running server; it stops when dropped.
#[derive(Debug)]
pub struct TestServer {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
    closed: Arc<Notify>,
    task: JoinHandle<()>,
}

impl TestServer {
    /// Serves `replies` in order, one per request; the last one repeats.
    pub async fn start(replies: Vec<Reply>) -> Self {
        assert!(!replies.is_empty(), "a server needs a reply");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let closed = Arc::new(Notify::new());
        let replies = Arc::new(replies);
        let task = tokio::spawn({
            let requests = Arc::clone(&requests);
            let closed = Arc::clone(&closed);
            async move {
                while let Ok((socket, _)) = listener.accept().await {
                    let requests = Arc::clone(&requests);
                    let closed = Arc::clone(&closed);
                    let replies = Arc::clone(&replies);
                    tokio::spawn(async move {
                        serve(socket, &requests, &replies, &closed).await;
                    });
                }
            }
        });
        TestServer {
            base,
            requests,
            closed,
            task,
        }
    }

    /// The requests so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    /// Waits until the client closes a connection whose reply was [`End::Hang`].
    pub async fn hung_connection_closed(&self) {
        self.closed.notified().await;
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    mut socket: TcpStream,
    requests: &Mutex<Vec<Recorded>>,
    replies: &[Reply],
    closed: &Notify,
) {
    let Some(request) = read_request(&mut socket).await else {
        return;
    };
    let reply = {
        let mut requests = requests.lock().unwrap();
        requests.push(request);
        replies[(requests.len() - 1).min(replies.len() - 1)].clone()
    };
    let mut head = format!(
        "HTTP/1.1 {} X\r\ntransfer-encoding: chunked\r\nconnection: close\r\n",
        reply.status
    );
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    if socket.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    for part in &reply.parts {
        let chunk = format!("{:x}\r\n{part}\r\n", part.len());
        if socket.write_all(chunk.as_bytes()).await.is_err() || socket.flush().await.is_err() {
            return;
        }
        // Lets the client read each piece separately, as from a real network.
        tokio::task::yield_now().await;
    }
    match reply.end {
        End::Complete => {
            let _ = socket.write_all(b"0\r\n\r\n").await;
            let _ = socket.shutdown().await;
        }
        End::Cut => {}
        End::Hang => {
            let mut sink = [0u8; 1024];
            while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
            closed.notify_one();
        }
    }
}

async fn read_request(socket: &mut TcpStream) -> Option<Recorded> {
    let mut buffer = Vec::new();
    let mut piece = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            break at + 4;
        }
        let read = socket.read(&mut piece).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&piece[..read]);
    };
    let head = String::from_utf8(buffer[..head_end].to_vec()).ok()?;
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_owned();
    let path = request_line.next()?.to_owned();
    let headers: HashMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|value| value.parse().ok())
        .unwrap_or(0);
    let mut body = buffer[head_end..].to_vec();
    while body.len() < length {
        let read = socket.read(&mut piece).await.ok()?;
        if read == 0 {
            return None;
        }
        body.extend_from_slice(&piece[..read]);
    }
    let body = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap()
    };
    Some(Recorded {
        method,
        path,
        headers,
        body,
    })
}
