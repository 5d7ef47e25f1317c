//! The accept loop and one HTTP/1.1 connection under the connection-level
//! bounds: the open-connection cap, the header timeout and the idle timeout.
//!
//! `axum::serve` can set none of these, so the server drives hyper itself. A
//! connection is always in one of three phases, and only the first two have a
//! deadline:
//!
//! - waiting for a request (since it was accepted, or since its last response
//!   was produced): closed after the idle timeout;
//! - reading a request head (since the first byte after waiting): closed after
//!   the header timeout, however slowly the bytes keep coming;
//! - serving a request: bounded by the per-request timeout in the router.
//!
//! Closing on a deadline drops the connection: no request is in the service
//! then, so nothing acknowledged can be lost.

use std::io;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::Limits;

/// The most headers one request head may carry; more is answered 431.
pub const HEADERS_MAX: usize = 100;

/// The largest request head, start line included, in bytes; larger is
/// answered 431. Tollgate's requests carry a few short headers.
pub const HEAD_BYTES_MAX: usize = 64 * 1024;

/// How long the accept loop pauses after an accept error that is not one
/// connection's failure (typically `EMFILE`: the process is out of file
/// descriptors), so that it does not spin while descriptors are released.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Accepts connections on `listener` and serves `router` on each until
/// `shutdown` resolves; then stops accepting, asks every connection to close
/// once its request in flight is answered, and returns when all are closed.
///
/// Beyond `limits.connections_max` open connections, a new connection is
/// accepted and closed at once, before anything is read from it: it costs one
/// descriptor for an instant and no task, which is what the cap protects.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let connections_max = limits.connections_max.get();
    let permits = Arc::new(Semaphore::new(connections_max as usize));
    let (stop, stopping) = watch::channel(false);
    let mut shutdown = pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) if is_connection_error(&error) => continue,
            Err(error) => {
                tracing::error!(%error, "cannot accept a connection");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::debug!(connections_max, "refused a connection: the open-connection cap is reached");
            drop(stream);
            continue;
        };
        tokio::spawn(serve_connection(stream, router.clone(), limits, stopping.clone(), permit));
    }
    drop(listener);
    let _ = stop.send(true);
    // Every open connection holds a permit until it closes.
    let _all_closed = permits.acquire_many(connections_max).await;
    Ok(())
}

fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

/// Where a connection is between requests; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waiting { since: Instant },
    ReadingHead { since: Instant },
    Serving,
}

impl Phase {
    /// When the phase's deadline passes, if it has one.
    fn deadline(self, limits: Limits) -> Option<Instant> {
        match self {
            Phase::Waiting { since } => Some(since + limits.idle_timeout),
            Phase::ReadingHead { since } => Some(since + limits.header_timeout),
            Phase::Serving => None,
        }
    }
}

async fn serve_connection(
    stream: TcpStream,
    router: Router,
    limits: Limits,
    mut stopping: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    let phase = Arc::new(PhaseCell(Mutex::new(Phase::Waiting { since: Instant::now() })));
    let io = TokioIo::new(Watched { stream, phase: phase.clone() });
    let service = Tracked { router, phase: phase.clone() };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.max_headers(HEADERS_MAX).max_header_size(HEAD_BYTES_MAX);
    let mut connection = pin!(builder.serve_connection(io, service));
    let mut asked_to_close = false;
    // One timer, re-armed only when it fires: a phase change costs a store,
    // not a wake-up of this loop. It is armed for the current phase's
    // deadline, or sooner: a head whose first byte arrives after now cannot
    // be due before now plus the header timeout. When it fires before the
    // current phase's deadline, it moves on to that deadline.
    let next_check = |current: Phase| {
        let soonest_new = Instant::now() + limits.header_timeout.min(limits.idle_timeout);
        current.deadline(limits).map_or(soonest_new, |deadline| deadline.min(soonest_new))
    };
    let expired = tokio::time::sleep_until(next_check(phase.get()));
    let mut expired = pin!(expired);
    loop {
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(error) = served {
                    tracing::debug!(%error, "connection ended with an error");
                }
                return;
            }
            () = expired.as_mut() => {
                // The phase may have moved on since the deadline was read; only
                // the current phase's own deadline closes the connection.
                let current = phase.get();
                if current.deadline(limits).is_some_and(|deadline| deadline <= Instant::now()) {
                    tracing::debug!(phase = ?current, "closing a connection past its deadline");
                    return;
                }
                expired.as_mut().reset(next_check(current));
            }
            stopped = stopping.wait_for(|stop| *stop), if !asked_to_close => {
                // An error means the accept loop is gone, which is also a stop.
                let _ = stopped;
                asked_to_close = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The router as a hyper service that moves its connection's phase: to
/// serving when a request head has been read, back to waiting when the
/// response is produced (or the request is dropped).
#[derive(Clone)]
struct Tracked {
    router: Router,
    phase: Arc<PhaseCell>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for Tracked {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Self::Error>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        let serving = ServingGuard::enter(self.phase.clone());
        let router = self.router.clone();
        Box::pin(async move {
            let response = router.oneshot(request.map(Body::new)).await;
            drop(serving);
            response
        })
    }
}

/// Holds a connection in the serving phase while it lives. HTTP/1.1 serves one
/// request at a time on a connection, so entering always starts from waiting
/// or reading a head.
struct ServingGuard {
    phase: Arc<PhaseCell>,
}

impl ServingGuard {
    fn enter(phase: Arc<PhaseCell>) -> Self {
        phase.set(Phase::Serving);
        Self { phase }
    }
}

impl Drop for ServingGuard {
    fn drop(&mut self) {
        self.phase.set(Phase::Waiting { since: Instant::now() });
    }
}

/// A connection's current phase, shared by its stream, its service and its
/// loop. Held only for a copy or a store.
struct PhaseCell(Mutex<Phase>);

impl PhaseCell {
    fn get(&self) -> Phase {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, phase: Phase) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = phase;
    }

    /// Moves a waiting connection to reading a head, from now.
    fn first_byte(&self) {
        let mut phase = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Phase::Waiting { .. } = *phase {
            *phase = Phase::ReadingHead { since: Instant::now() };
        }
    }
}

/// The TCP stream, noting the first byte that arrives while the connection
/// waits for a request: that starts the header timeout.
struct Watched {
    stream: TcpStream,
    phase: Arc<PhaseCell>,
}

impl AsyncRead for Watched {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let filled_before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > filled_before {
            this.phase.first_byte();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
