//! Connection hygiene of the serving loop (`parlance_app::http::serve`) on a
//! real listener: slow and silent clients are cut at their deadlines, the
//! connection cap holds without taking the service down, shutdown drains
//! within its deadline, and oversized or malformed request heads get the
//! answers `docs/api.md` documents.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Query;
use axum::routing::get;
use parlance_app::http::{ServeOptions, serve};
use parlance_app::{AppState, router};
use parlance_testkit::{ManualClock, SequentialIds};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::support::{KEY, keys};

/// Options with every deadline long, for a test to shorten the one it checks.
fn options() -> ServeOptions {
    ServeOptions {
        header_read_timeout: Duration::from_secs(30),
        body_read_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        max_connections: 10_000,
        drain: Duration::from_secs(30),
    }
}

/// A service started through `serve` and the means to stop it.
struct Served {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Served {
    /// The whole API on the in-memory adapters.
    async fn api(options: ServeOptions) -> Self {
        let state = AppState::memory_with(
            keys(),
            Arc::new(ManualClock::new()),
            Arc::new(SequentialIds::new()),
        );
        Self::start(router(&state), options).await
    }

    async fn start(app: Router, options: ServeOptions) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, app, options, async move {
            let _ = stopped.await;
        }));
        Self {
            addr,
            stop: Some(stop),
            task,
        }
    }

    fn shutdown(&mut self) {
        let _ = self.stop.take().unwrap().send(());
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An answer read off a socket: status line code, lower-cased headers, body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn problem(&self) -> Value {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// Reads one answer (head and a `content-length` body) from `s`.
async fn read_answer(s: &mut TcpStream) -> Answer {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed before an answer: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap();
    let status: u16 = status.parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed inside the body");
        body.extend_from_slice(&chunk[..n]);
    }
    Answer {
        status,
        headers,
        body,
    }
}

/// Sends `request` on a fresh connection and reads one answer.
async fn exchange(addr: SocketAddr, request: &[u8]) -> Answer {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    read_answer(&mut s).await
}

/// Whether the server closed `s` (end of file or reset) within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut chunk = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n";

/// `GET /healthz` answers 200 on a fresh connection within a second.
async fn healthz_answers(addr: SocketAddr) {
    let answer = tokio::time::timeout(Duration::from_secs(1), exchange(addr, HEALTHZ))
        .await
        .expect("/healthz did not answer within a second");
    assert_eq!(answer.status, 200, "{answer:?}");
}

/// How many half-open connections the test opens: 2000, unless the process
/// may not hold twice as many descriptors (its side and the server's).
fn half_open_count() -> usize {
    let limit = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(1024);
    let wanted = 2_000usize;
    let fits = usize::try_from(limit.saturating_sub(256) / 2).unwrap_or(usize::MAX);
    if fits < wanted {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "note: open-file limit {limit}: opening {fits} half-open connections, not {wanted}"
        );
    }
    wanted.min(fits)
}

#[tokio::test]
async fn half_open_connections_are_closed_at_the_header_timeout() {
    let header_timeout = Duration::from_secs(2);
    let server = Served::api(ServeOptions {
        header_read_timeout: header_timeout,
        ..options()
    })
    .await;
    let count = half_open_count();
    // Half say nothing, half send part of a request line or head.
    let mut held = Vec::with_capacity(count);
    for i in 0..count {
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        match i % 3 {
            0 => {}
            1 => s.write_all(b"GET /heal").await.unwrap(),
            _ => s
                .write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\nx-slow: ")
                .await
                .unwrap(),
        }
        held.push(s);
    }
    let opened = Instant::now();
    healthz_answers(server.addr).await;
    // Every one is closed by the server once its head is overdue.
    let within = header_timeout + Duration::from_secs(5);
    let checks = held
        .into_iter()
        .map(|mut s| async move { closed_within(&mut s, within).await });
    let closed = futures::future::join_all(checks).await;
    let open = closed.iter().filter(|c| !**c).count();
    assert_eq!(
        open,
        0,
        "{open} of {count} half-open connections still open {:?} after the last was opened",
        opened.elapsed()
    );
    healthz_answers(server.addr).await;
}

#[tokio::test]
async fn a_connection_may_idle_past_the_header_timeout_until_the_idle_timeout() {
    let server = Served::api(ServeOptions {
        header_read_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(3),
        ..options()
    })
    .await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_answer(&mut s).await.status, 200);
    // Kept alive past the head deadline: idle is not a slow head.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    s.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_answer(&mut s).await.status, 200);
    // Closed once idle for longer than the idle timeout.
    assert!(
        closed_within(&mut s, Duration::from_secs(3 + 5)).await,
        "an idle connection outlived the idle timeout"
    );
}

#[tokio::test]
async fn a_response_the_client_stops_reading_is_dropped_at_the_idle_timeout() {
    const CHUNK: usize = 64 * 1024;
    const SIZE: usize = 1024 * CHUNK;
    // Streamed, so the body is still being produced when the send stalls.
    let big = Router::new().route(
        "/big",
        get(|| async {
            let chunks = futures::stream::iter(
                (0..SIZE / CHUNK)
                    .map(|_| Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![b'x'; CHUNK]))),
            );
            axum::body::Body::from_stream(chunks)
        }),
    );
    let server = Served::start(
        big,
        ServeOptions {
            idle_timeout: Duration::from_secs(1),
            ..options()
        },
    )
    .await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(b"GET /big HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    // Read nothing until the send has stalled past the idle timeout.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut received = 0usize;
    let mut chunk = vec![0u8; 64 * 1024];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received += n,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "a stalled response kept its connection");
    assert!(
        received < SIZE,
        "the whole response was sent ({received} bytes) though the client read none of it in time"
    );
}

/// A request for session events declaring a 100-byte body.
fn event_head() -> Vec<u8> {
    format!(
        "POST /v1/products/acme/sessions/s1/events HTTP/1.1\r\nhost: t\r\n\
         authorization: Bearer {KEY}\r\ncontent-type: application/json\r\n\
         content-length: 100\r\n\r\n"
    )
    .into_bytes()
}

#[tokio::test]
async fn a_stalled_body_is_cut_at_the_body_timeout() {
    let server = Served::api(ServeOptions {
        body_read_timeout: Duration::from_secs(1),
        ..options()
    })
    .await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(&event_head()).await.unwrap();
    s.write_all(b"{\"type\":").await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), read_answer(&mut s))
        .await
        .expect("a stalled body was not cut");
    assert_eq!(answer.status, 408, "{answer:?}");
    assert_eq!(
        answer.problem()["type"],
        "urn:parlance:problem:request-timeout"
    );
    assert_eq!(answer.header("connection"), Some("close"));
    assert!(
        answer
            .header("x-request-id")
            .is_some_and(|id| parlance_app::http::usable_request_id(id.as_bytes())),
        "the 408 keeps the request id: {answer:?}"
    );
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
}

#[tokio::test]
async fn a_trickled_body_is_cut_at_the_body_timeout() {
    let server = Served::api(ServeOptions {
        body_read_timeout: Duration::from_secs(1),
        ..options()
    })
    .await;
    let s = TcpStream::connect(server.addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    wr.write_all(&event_head()).await.unwrap();
    // One byte every 200 ms: each arrives well within any per-read timeout,
    // the whole body never within the deadline.
    let trickle = tokio::spawn(async move {
        for _ in 0..100 {
            if wr.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let mut head = vec![0u8; 12];
    tokio::time::timeout(Duration::from_secs(10), rd.read_exact(&mut head))
        .await
        .expect("a trickled body was not cut")
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 408", "{}", String::from_utf8_lossy(&head));
    trickle.abort();
}

#[tokio::test]
async fn the_connection_cap_holds_and_healthz_answers_once_a_slot_frees() {
    let server = Served::api(ServeOptions {
        max_connections: 2,
        ..options()
    })
    .await;
    let first = TcpStream::connect(server.addr).await.unwrap();
    let second = TcpStream::connect(server.addr).await.unwrap();
    // Both slots are held by silent connections: a third waits.
    let mut third = TcpStream::connect(server.addr).await.unwrap();
    third.write_all(HEALTHZ).await.unwrap();
    let waited = tokio::time::timeout(Duration::from_millis(500), read_answer(&mut third)).await;
    assert!(
        waited.is_err(),
        "a connection over the cap was served: {waited:?}"
    );
    // A slot frees: the waiting connection is accepted and answered.
    drop(first);
    let answer = tokio::time::timeout(Duration::from_secs(5), read_answer(&mut third))
        .await
        .expect("the waiting connection was not served once a slot freed");
    assert_eq!(answer.status, 200);
    drop(third);
    // The service goes on serving within the cap.
    tokio::time::timeout(Duration::from_secs(5), exchange(server.addr, HEALTHZ))
        .await
        .expect("/healthz did not answer under the cap");
    drop(second);
}

#[derive(serde::Deserialize)]
struct Sleep {
    ms: u64,
}

/// A router whose `/sleep?ms=N` answers after `N` ms.
fn sleepy() -> Router {
    Router::new().route(
        "/sleep",
        get(|Query(q): Query<Sleep>| async move {
            tokio::time::sleep(Duration::from_millis(q.ms)).await;
            "slept"
        }),
    )
}

#[tokio::test]
async fn shutdown_drains_in_flight_requests_and_drops_what_outlives_the_deadline() {
    let drain = Duration::from_secs(2);
    let mut server = Served::start(sleepy(), ServeOptions { drain, ..options() }).await;
    let mut quick = TcpStream::connect(server.addr).await.unwrap();
    quick
        .write_all(b"GET /sleep?ms=700 HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    let mut stalled = TcpStream::connect(server.addr).await.unwrap();
    stalled
        .write_all(b"GET /sleep?ms=600000 HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    // An idle kept-alive connection is closed at once.
    let mut idle = TcpStream::connect(server.addr).await.unwrap();
    idle.write_all(HEALTHZ_SLEEPY).await.unwrap();
    assert_eq!(read_answer(&mut idle).await.status, 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let signalled = Instant::now();
    server.shutdown();
    // The in-flight request finishes within the deadline.
    let answer = tokio::time::timeout(drain, read_answer(&mut quick))
        .await
        .expect("the in-flight request did not finish during the drain");
    assert_eq!(answer.status, 200);
    assert!(
        closed_within(&mut idle, drain).await,
        "an idle connection was kept"
    );
    // The stalled one is dropped at the deadline and serve returns.
    assert!(
        closed_within(&mut stalled, drain + Duration::from_secs(5)).await,
        "a request outliving the drain deadline was kept"
    );
    let task = &mut server.task;
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("serve did not return after the drain deadline")
        .unwrap()
        .unwrap();
    assert!(signalled.elapsed() >= drain, "dropped before the deadline");
    // Nothing is accepted any more.
    assert!(TcpStream::connect(server.addr).await.is_err());
}

const HEALTHZ_SLEEPY: &[u8] = b"GET /sleep?ms=0 HTTP/1.1\r\nhost: t\r\n\r\n";

#[tokio::test]
async fn a_long_request_target_answers_414_problem_json() {
    let server = Served::api(options()).await;
    let path = format!("/v1/products/acme/sessions/{}", "a".repeat(10 * 1024));
    let req = format!("GET {path} HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {KEY}\r\n\r\n");
    let answer = exchange(server.addr, req.as_bytes()).await;
    assert_eq!(answer.status, 414, "{answer:?}");
    let problem = answer.problem();
    assert_eq!(problem["type"], "urn:parlance:problem:uri-too-long");
    assert_eq!(problem["max"], 8 * 1024);
}

#[tokio::test]
async fn large_headers_answer_431_problem_json() {
    let server = Served::api(options()).await;
    // 40 KiB of headers in ten lines.
    let big = format!("x-big: {}\r\n", "b".repeat(4 * 1024)).repeat(10);
    let req = format!("GET /healthz HTTP/1.1\r\nhost: t\r\n{big}\r\n");
    let answer = exchange(server.addr, req.as_bytes()).await;
    assert_eq!(answer.status, 431, "{answer:?}");
    assert_eq!(
        answer.problem()["type"],
        "urn:parlance:problem:headers-too-large"
    );
    // 150 short lines: over our count, under hyper's.
    let many: String = (0..150).map(|i| format!("x-h{i}: v\r\n")).collect();
    let req = format!("GET /healthz HTTP/1.1\r\nhost: t\r\n{many}\r\n");
    let answer = exchange(server.addr, req.as_bytes()).await;
    assert_eq!(answer.status, 431, "{answer:?}");
    assert_eq!(
        answer.problem()["type"],
        "urn:parlance:problem:headers-too-large"
    );
}

/// What `docs/api.md` documents for heads hyper refuses before any service
/// runs: the status alone, with an empty body, and the connection closed.
#[tokio::test]
async fn heads_hyper_refuses_answer_an_empty_body_as_documented() {
    let server = Served::api(options()).await;
    let huge = format!(
        "GET /healthz HTTP/1.1\r\nhost: t\r\nx-huge: {}\r\n\r\n",
        "h".repeat(200 * 1024)
    );
    let too_many: String = (0..250).map(|i| format!("x-h{i}: v\r\n")).collect();
    let too_many = format!("GET /healthz HTTP/1.1\r\nhost: t\r\n{too_many}\r\n");
    let long_uri = format!(
        "GET /{} HTTP/1.1\r\nhost: t\r\n\r\n",
        "u".repeat(200 * 1024)
    );
    let cases: [(&str, &[u8], u16); 5] = [
        ("a head over 128 KiB", huge.as_bytes(), 431),
        ("more than 200 header lines", too_many.as_bytes(), 431),
        ("a request target over 128 KiB", long_uri.as_bytes(), 431),
        ("a malformed request line", b"GET / HTTP/1.1 x\r\n\r\n", 400),
        (
            "a malformed header",
            b"GET / HTTP/1.1\r\nbad header: x\r\n\r\n",
            400,
        ),
    ];
    for (what, req, status) in cases {
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        // hyper may answer and close before the whole head is written.
        let _ = s.write_all(req).await;
        let answer = read_answer(&mut s).await;
        assert_eq!(answer.status, status, "{what}: {answer:?}");
        assert!(answer.body.is_empty(), "{what}: {answer:?}");
        assert_eq!(answer.header("content-length"), Some("0"), "{what}");
        assert!(
            closed_within(&mut s, Duration::from_secs(5)).await,
            "{what}"
        );
    }
    healthz_answers(server.addr).await;
}

/// `parlance serve` takes its limits from the configuration: a silent
/// connection is closed at `--header-read-timeout`, and on SIGTERM a request
/// stalled on its body is dropped at `--drain-secs` and the process exits.
#[tokio::test]
async fn parlance_serve_applies_the_configured_limits() {
    /// Killed and reaped when dropped, so a failing test leaves none behind.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let port = crate::load::free_port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_parlance"))
        .args([
            "serve",
            "--no-worker",
            "--bind",
            &format!("127.0.0.1:{port}"),
        ])
        .args(["--header-read-timeout", "1", "--body-read-timeout", "600"])
        .args(["--drain-secs", "1"])
        .env("PARLANCE_API_KEY", KEY)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start parlance serve");
    let pid = child.id();
    let mut proc = Killed(child);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    crate::support::wait_until(
        "parlance serve to listen",
        Duration::from_secs(60),
        || async { TcpStream::connect(addr).await.is_ok() },
    )
    .await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed_within(&mut silent, Duration::from_secs(1 + 5)).await,
        "a silent connection outlived --header-read-timeout"
    );
    let mut stalled = TcpStream::connect(addr).await.unwrap();
    stalled.write_all(&event_head()).await.unwrap();
    stalled.write_all(b"{").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let term = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    assert!(
        closed_within(&mut stalled, Duration::from_secs(1 + 5)).await,
        "a stalled request outlived --drain-secs"
    );
    crate::support::wait_until("parlance serve to exit", Duration::from_secs(10), || {
        let exited = proc.0.try_wait().unwrap().is_some();
        async move { exited }
    })
    .await;
}
