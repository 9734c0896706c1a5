//! Serving HTTP/1.1 connections with timeouts (`server.*`), so a client that opens
//! connections and then sends nothing, or sends its headers or body a byte at a time,
//! holds a connection for a bounded time (a slowloris cannot keep them all).
//!
//! Each connection is in one of three phases, kept by a watcher beside it:
//! - **idle** (no request in flight, no byte of the next one): closed after `idle`;
//! - **head** (bytes of a request arrived, its headers are not complete): closed
//!   `header` after the first byte, however slowly the rest trickles in;
//! - **busy** (a request is being answered, a long SSE stream or `/join` included): never
//!   closed by the watcher; the request's body must arrive within `body` of its headers,
//!   else the body read fails and the handler answers 408 (`ApiError::Timeout`), after
//!   which hyper closes the connection because the body was not read to its end.
//!
//! Shutdown stops accepting, asks every connection to finish its request in flight and
//! close, and waits for them, as `axum::serve` does.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::Request;
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

/// How long a connection may wait for its client (`server.*_timeout_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionTimeouts {
    /// No request in flight and no byte of a new one.
    pub idle: Duration,
    /// From a request's first byte to the end of its headers.
    pub header: Duration,
    /// From the end of a request's headers to the end of its body.
    pub body: Duration,
}

impl Default for ConnectionTimeouts {
    /// Defaults a public deployment can keep: a minute idle between requests, ten
    /// seconds for headers (a few KB), a minute for a body (at most 1 MiB).
    fn default() -> Self {
        ConnectionTimeouts {
            idle: Duration::from_secs(60),
            header: Duration::from_secs(10),
            body: Duration::from_secs(60),
        }
    }
}

/// The request body did not arrive within `server.body_timeout_seconds`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} s", .0.as_secs_f64())]
pub struct BodyTimeout(pub Duration);

/// Serves `router` on `listener` until `shutdown` completes, then waits for the
/// connections to finish their requests.
pub async fn run(
    listener: TcpListener,
    router: Router,
    timeouts: ConnectionTimeouts,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    // Dropped to ask connections to shut down gracefully.
    let (stop_tx, stop_rx) = watch::channel(());
    // Every connection holds a receiver; `closed()` resolves when all are gone.
    let (done_tx, done_rx) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => unbuffered(stream),
                Err(error) => {
                    accept_failed(error).await;
                    continue;
                }
            },
        };
        let connection = serve_connection(stream, router.clone(), timeouts, stop_rx.clone());
        let done = done_rx.clone();
        tokio::spawn(async move {
            connection.await;
            drop(done);
        });
    }
    drop(listener);
    drop(stop_rx);
    drop(stop_tx);
    drop(done_rx);
    done_tx.closed().await;
    Ok(())
}

/// `stream` with Nagle's algorithm off. A stream's frames are small writes: with it on,
/// a frame written while the client has not yet acknowledged the previous one waits for
/// that acknowledgement, which the client delays by up to 40 ms.
fn unbuffered(stream: TcpStream) -> TcpStream {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "TCP_NODELAY could not be set");
    }
    stream
}

/// What `accept` failing means: a client that went away is nothing; anything else
/// (out of file descriptors) is logged and waited out, as `axum::serve` does.
async fn accept_failed(error: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        error.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!(%error, "accepting a connection failed; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Where a connection is (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle(Instant),
    Head(Instant),
    Busy(usize),
}

/// Why the watcher closed a connection.
#[derive(Debug, Clone, Copy)]
enum Expired {
    Idle,
    Header,
}

/// One connection, served until it ends, its client stalls past a timeout, or a
/// shutdown lets its request in flight finish.
async fn serve_connection(
    stream: TcpStream,
    router: Router,
    timeouts: ConnectionTimeouts,
    mut stop: watch::Receiver<()>,
) {
    let (phase, mut phase_rx) = watch::channel(Phase::Idle(Instant::now()));
    let phase = Arc::new(phase);
    let io = TokioIo::new(Watched {
        inner: stream,
        phase: phase.clone(),
    });
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let busy = Busy::begin(phase.clone());
        let request = request.map(|body| Body::new(TimedBody::new(body, timeouts.body)));
        let mut router = router.clone();
        async move {
            let response = tower_service::Service::call(&mut router, request).await;
            // The connection stays busy until the response body is dropped: sent, or
            // abandoned with the connection.
            response.map(|response| response.map(|body| Body::new(Guarded { body, _busy: busy })))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.header_read_timeout(None);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "a connection ended with an error");
                }
                return;
            }
            expired = expired(&mut phase_rx, timeouts) => {
                tracing::debug!(?expired, "closing a stalled connection");
                return;
            }
            _ = stop.changed(), if !stopping => {
                stopping = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Resolves when the connection has stayed idle, or in a request's headers, too long.
async fn expired(phase: &mut watch::Receiver<Phase>, timeouts: ConnectionTimeouts) -> Expired {
    loop {
        let current = *phase.borrow_and_update();
        let deadline = match current {
            Phase::Idle(since) => Some((since + timeouts.idle, Expired::Idle)),
            Phase::Head(since) => Some((since + timeouts.header, Expired::Header)),
            Phase::Busy(_) => None,
        };
        match deadline {
            Some((at, why)) => tokio::select! {
                () = tokio::time::sleep_until(at) => return why,
                changed = phase.changed() => if changed.is_err() { std::future::pending::<()>().await },
            },
            None => {
                if phase.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

/// The connection's socket, noting when the first byte of a request arrives.
struct Watched {
    inner: TcpStream,
    phase: Arc<watch::Sender<Phase>>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.phase.send_if_modified(|phase| match *phase {
                Phase::Idle(_) => {
                    *phase = Phase::Head(Instant::now());
                    true
                }
                _ => false,
            });
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request in flight; the connection goes idle when the last one is dropped.
#[derive(Debug)]
struct Busy(Arc<watch::Sender<Phase>>);

impl Busy {
    fn begin(phase: Arc<watch::Sender<Phase>>) -> Self {
        phase.send_modify(|phase| {
            *phase = match *phase {
                Phase::Busy(n) => Phase::Busy(n + 1),
                _ => Phase::Busy(1),
            }
        });
        Busy(phase)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.send_modify(|phase| {
            *phase = match *phase {
                Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
                _ => Phase::Idle(Instant::now()),
            }
        });
    }
}

/// A response body that keeps its request counted as in flight.
struct Guarded {
    body: Body,
    _busy: Busy,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A request body that fails with [`BodyTimeout`] once its deadline passes.
struct TimedBody {
    inner: Incoming,
    limit: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl TimedBody {
    fn new(inner: Incoming, limit: Duration) -> Self {
        TimedBody {
            inner,
            limit,
            deadline: Box::pin(tokio::time::sleep(limit)),
        }
    }
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimeout(self.limit))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Whether a failed body read (as the `Bytes` extractor reports it) was a
/// [`BodyTimeout`].
pub(crate) fn timed_out<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a BodyTimeout> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(timeout) = error.downcast_ref::<BodyTimeout>() {
            return Some(timeout);
        }
        cause = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_connections_send_small_writes_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let _client = TcpStream::connect(address).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        assert!(
            !stream.nodelay().unwrap(),
            "sockets start with Nagle's algorithm on"
        );
        assert!(unbuffered(stream).nodelay().unwrap());
    }
}
