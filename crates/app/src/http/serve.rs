//! The serving loop: accepts connections on a listener and serves a router
//! on each with the connection limits of [`ServeOptions`], until a shutdown
//! future resolves; then drains open connections for at most
//! [`ServeOptions::drain`] and drops the rest.
//!
//! Each connection is in one phase at a time, and each phase but one has a
//! deadline; the connection is closed when its deadline passes:
//!
//! | phase | from | deadline |
//! |---|---|---|
//! | reading a request head | the accept, or the first byte after an idle wait | `header_read_timeout` after that |
//! | handling a request | its head is read | none (the body has its own, below) |
//! | sending the response | the handler answered, and each byte written | `idle_timeout` |
//! | idle (keep-alive) | the response's last byte was written | `idle_timeout` |
//!
//! A request body must arrive within `body_read_timeout` of its head; a
//! handler whose body read runs past it answers 408 `request-timeout` and the
//! connection closes. At most `max_connections` are open at once: further
//! connections wait in the listen backlog until one closes. Accept errors
//! (running out of file descriptors among them) are logged and retried after
//! a short back-off; they never end the loop.
//!
//! hyper's own `header_read_timeout` is not used: it also runs while a
//! keep-alive connection waits for its next request, so it cannot tell a
//! slow request head from an idle connection.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use axum::response::IntoResponse as _;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep, sleep, sleep_until};
use tower::ServiceExt as _;

use super::ApiError;

/// Largest request head hyper buffers, in bytes. A head past it is answered
/// by hyper itself: 431 with an empty body, before any service runs.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Most header lines hyper parses; more are answered by hyper itself: 431
/// with an empty body. [`super::MAX_HEADERS`] lower than this is answered as
/// problem+json.
pub const HYPER_MAX_HEADERS: usize = 200;

/// The shortest and the longest pause after a failed accept.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// The connection limits of [`serve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// How long a client has to send a whole request head, from the accept
    /// or from its first byte after an idle wait.
    pub header_read_timeout: Duration,
    /// How long a client has to send a whole request body, from its head.
    pub body_read_timeout: Duration,
    /// How long a keep-alive connection may wait for its next request, and
    /// how long a response may go without a byte taken by the client.
    pub idle_timeout: Duration,
    /// Most connections open at once; further ones wait to be accepted.
    pub max_connections: usize,
    /// After the shutdown signal, how long open connections may finish
    /// their requests before they are dropped.
    pub drain: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            drain: Duration::from_secs(15),
        }
    }
}

/// Something that hands out connections: a [`TcpListener`], or a test's
/// stand-in that fails on demand.
pub trait Accept: Send {
    /// The next connection.
    fn accept(&mut self) -> impl Future<Output = io::Result<(TcpStream, SocketAddr)>> + Send;
}

impl Accept for TcpListener {
    async fn accept(&mut self) -> io::Result<(TcpStream, SocketAddr)> {
        TcpListener::accept(self).await
    }
}

/// Serves `app` on `listener` with `options` until `shutdown` resolves, then
/// stops accepting, lets open connections finish their requests for at most
/// `options.drain`, drops those still open and returns.
///
/// # Errors
///
/// None today: accept errors are logged and retried. The `Result` leaves
/// room for set-up errors.
pub async fn serve(
    listener: impl Accept,
    app: Router,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    let mut listener = listener;
    let slots = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut backoff = ACCEPT_BACKOFF.0;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        // Reap finished connections so the set does not grow.
        while connections.try_join_next().is_some() {}
        match accepted {
            Ok((stream, peer)) => {
                backoff = ACCEPT_BACKOFF.0;
                connections.spawn(connection(
                    stream,
                    peer,
                    app.clone(),
                    options,
                    stopping.clone(),
                    permit,
                ));
            }
            Err(e) if is_connection_error(&e) => {
                tracing::debug!(error = %e, "connection closed before it was accepted");
            }
            Err(e) => {
                drop(permit);
                tracing::error!(error = %e, retry_in = ?backoff, "accept failed");
                tokio::select! {
                    () = sleep(backoff) => {}
                    () = &mut shutdown => break,
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF.1);
            }
        }
    }
    drop(listener);
    let _ = stop.send(true);
    let open = connections.len();
    if open > 0 {
        tracing::info!(open, deadline = ?options.drain, "draining connections");
    }
    let drained = tokio::time::timeout(options.drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            dropped = connections.len(),
            "drain deadline passed; dropping open connections"
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// Errors that concern one connection that went away, not the listener.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Serves one connection until it closes, a phase deadline passes, or the
/// drain ends it; the permit frees its slot when it ends.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    options: ServeOptions,
    mut stopping: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            handle(
                app.clone(),
                activity.clone(),
                options.body_read_timeout,
                req,
            )
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(HYPER_MAX_HEADERS);
    let conn = builder.serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let watchdog = watchdog(&activity, options);
    let mut watchdog = std::pin::pin!(watchdog);
    let mut draining = *stopping.borrow();
    if draining {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            phase = &mut watchdog => {
                tracing::debug!(%peer, ?phase, "connection timed out; closing it");
                return;
            }
            changed = stopping.changed(), if !draining => {
                draining = true;
                if changed.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Runs the router on one request: the body gets its read deadline, and a
/// body read past it answers 408 and closes the connection.
async fn handle(
    app: Router,
    activity: Arc<Activity>,
    body_read_timeout: Duration,
    req: Request<Incoming>,
) -> Result<Response<TrackedBody>, Infallible> {
    activity.enter(Phase::Handling);
    let timed_out = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + body_read_timeout;
    let req = req.map(|body| {
        Body::new(DeadlineBody {
            inner: body,
            deadline,
            sleep: None,
            timed_out: timed_out.clone(),
        })
    });
    let res = match app.oneshot(req).await {
        Ok(res) => res,
        Err(never) => match never {},
    };
    let mut res = if timed_out.load(Ordering::Acquire) && res.status().is_client_error() {
        let mut timeout = ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request-timeout",
            format!(
                "the request body did not arrive within {} s",
                body_read_timeout.as_secs_f64()
            ),
        )
        .into_response();
        // The answer replaced keeps what the router's outer layers set: the
        // request id and the CORS allowances.
        for (name, value) in res.headers() {
            if *name == super::REQUEST_ID || name.as_str().starts_with("access-control-") {
                timeout.headers_mut().append(name, value.clone());
            }
        }
        timeout
    } else {
        res
    };
    if timed_out.load(Ordering::Acquire) {
        res.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    activity.enter(Phase::Sending);
    Ok(res.map(|body| TrackedBody {
        inner: body,
        activity,
    }))
}

/// Where a connection is; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for (the rest of) a request head.
    ReadingHead,
    /// A handler runs.
    Handling,
    /// The response is being written.
    Sending,
    /// Waiting for the next request on a kept-alive connection.
    Idle,
}

/// A connection's phase and since when (for `Sending`: since the last byte
/// written), shared by its socket, its service and its watchdog.
#[derive(Debug)]
struct Activity {
    state: Mutex<(Phase, Instant)>,
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            state: Mutex::new((Phase::ReadingHead, Instant::now())),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Phase, Instant)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn enter(&self, phase: Phase) {
        *self.lock() = (phase, Instant::now());
        self.changed.notify_one();
    }

    /// Bytes arrived: an idle connection starts reading a request head.
    fn read(&self) {
        let mut state = self.lock();
        if state.0 == Phase::Idle {
            *state = (Phase::ReadingHead, Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    /// Bytes were taken by the client: a response being sent (or, once its
    /// body is handed over, still being flushed) is not stalled.
    fn wrote(&self) {
        let mut state = self.lock();
        if matches!(state.0, Phase::Sending | Phase::Idle) {
            state.1 = Instant::now();
        }
    }

    fn deadline(&self, options: ServeOptions) -> (Phase, Option<Instant>) {
        let (phase, since) = *self.lock();
        let deadline = match phase {
            Phase::ReadingHead => Some(since + options.header_read_timeout),
            Phase::Handling => None,
            Phase::Sending | Phase::Idle => Some(since + options.idle_timeout),
        };
        (phase, deadline)
    }
}

/// Resolves, with the phase, once a connection has overrun its phase's
/// deadline.
async fn watchdog(activity: &Activity, options: ServeOptions) -> Phase {
    loop {
        let changed = activity.changed.notified();
        match activity.deadline(options) {
            (_, None) => changed.await,
            (phase, Some(deadline)) => {
                if Instant::now() >= deadline {
                    return phase;
                }
                tokio::select! {
                    () = sleep_until(deadline) => {}
                    () = changed => {}
                }
            }
        }
    }
}

/// A socket that reports its reads and writes to the connection's
/// [`Activity`].
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
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

/// The request body read past its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub struct BodyTimeout;

/// A request body that fails with [`BodyTimeout`] once its deadline passes
/// while the handler waits for it.
struct DeadlineBody {
    inner: Incoming,
    deadline: Instant,
    /// Made on the first wait, so bodies that are already there cost none.
    sleep: Option<Pin<Box<Sleep>>>,
    timed_out: Arc<AtomicBool>,
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = self.deadline;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(sleep_until(deadline)));
        if sleep.as_mut().poll(cx).is_ready() {
            self.timed_out.store(true, Ordering::Release);
            return Poll::Ready(Some(Err(Box::new(BodyTimeout))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that marks its connection idle once it is sent (or
/// dropped).
struct TrackedBody {
    inner: Body,
    activity: Arc<Activity>,
}

impl std::fmt::Debug for TrackedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackedBody").finish_non_exhaustive()
    }
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for TrackedBody {
    fn drop(&mut self) {
        self.activity.enter(Phase::Idle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// Fails with "too many open files" `failures` times, then accepts.
    struct Flaky {
        listener: TcpListener,
        failures: Arc<AtomicUsize>,
    }

    impl Accept for Flaky {
        async fn accept(&mut self) -> io::Result<(TcpStream, SocketAddr)> {
            if self
                .failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(io::Error::from_raw_os_error(24));
            }
            self.listener.accept().await
        }
    }

    #[tokio::test]
    async fn accept_errors_are_survived() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let failures = Arc::new(AtomicUsize::new(5));
        let app = Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            Flaky {
                listener,
                failures: failures.clone(),
            },
            app,
            ServeOptions::default(),
            async move {
                let _ = stopped.await;
            },
        ));
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert_eq!(failures.load(Ordering::SeqCst), 0);
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
