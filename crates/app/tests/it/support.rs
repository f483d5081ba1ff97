//! A service on a real listener (port 0) and a client for it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parlance_app::auth::{ApiKey, ApiKeys};
use parlance_app::{AppState, router};
use parlance_core::ProductId;
use parlance_testkit::{ManualClock, SequentialIds};
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// The key every test server accepts, for product `acme`.
pub(crate) const KEY: &str = "pk_test_acme";

/// A running service and a client bound to it.
pub(crate) struct TestServer {
    pub(crate) addr: SocketAddr,
    pub(crate) client: reqwest::Client,
    pub(crate) clock: Arc<ManualClock>,
}

impl TestServer {
    /// A service on the in-memory adapters with a manual clock.
    pub(crate) async fn memory() -> Self {
        let clock = Arc::new(ManualClock::new());
        let state = AppState::memory_with(keys(), clock.clone(), Arc::new(SequentialIds::new()));
        Self::start(state, clock).await
    }

    /// A service on the given state.
    pub(crate) async fn start(state: AppState, clock: Arc<ManualClock>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let options = parlance_app::http::ServeOptions::default();
            parlance_app::http::serve(listener, router(&state), options, std::future::pending())
                .await
                .unwrap();
        });
        Self {
            addr,
            client: reqwest::Client::new(),
            clock,
        }
    }

    /// Sends a request with the test key (when `auth`) and returns status,
    /// content type and JSON body.
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        auth: bool,
    ) -> (StatusCode, String, Value) {
        let mut req = self
            .client
            .request(method, format!("http://{}{}", self.addr, path));
        if auth {
            req = req.bearer_auth(KEY);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let res = req.send().await.unwrap();
        let status = res.status();
        let ctype = res
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let bytes = res.bytes().await.unwrap();
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, ctype, json)
    }
}

/// One key, for product `acme`.
pub(crate) fn keys() -> ApiKeys {
    ApiKeys::single(&ApiKey::new(KEY), ProductId::parse("acme").unwrap())
}

/// `DATABASE_URL` pointed at the test pool's own database.
pub(crate) fn url_for(pool: &parlance_postgres::PgPool) -> String {
    let base = std::env::var("DATABASE_URL").unwrap();
    let db = pool.connect_options().get_database().unwrap().to_owned();
    let (head, _) = base.split_once('?').unwrap_or((&base, ""));
    let (server, _) = head.rsplit_once('/').unwrap();
    format!("{server}/{db}")
}

/// Polls `check` until it holds, failing after `timeout`.
pub(crate) async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Starts a `parlance worker` process on `url` with quick heartbeats and
/// sweeps, plus `extra` arguments; its output is discarded.
pub(crate) fn spawn_worker(url: &str, extra: &[&str]) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_parlance"))
        .args(["worker", "--heartbeat-ms", "200", "--sweep-ms", "250"])
        .args(extra)
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start parlance worker")
}

/// The in-memory components every test server starts from: the test key,
/// `clock` and sequential ids.
pub(crate) fn components(clock: &Arc<ManualClock>) -> parlance_app::Components {
    let mut c = parlance_app::Components::memory(keys());
    c.clock = clock.clone();
    c.ids = Arc::new(SequentialIds::new());
    c
}

/// A `MakeWriter` appending every log line to a shared buffer.
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Captured {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The captured lines, each parsed as JSON.
    pub(crate) fn lines(&self) -> Vec<serde_json::Value> {
        self.text()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    /// A subscriber at `info` (what `serve` logs by default), JSON lines with
    /// every field, spans included.
    pub(crate) fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_max_level(tracing::Level::INFO)
            .with_writer(self.clone())
            .finish()
    }
}

/// Call after installing a capturing subscriber on this thread: registers
/// the request span's and the access line's callsites (one request through
/// a router) and rebuilds tracing's interest cache, so that both count that
/// subscriber. tracing caches a callsite's interest when it is first hit; a
/// test on another thread hitting it at the moment this subscriber is
/// installed may otherwise leave it cached as unwanted.
pub(crate) async fn register_request_callsites() {
    use tower::ServiceExt as _;
    let app = parlance_app::router(&AppState::memory(keys()));
    let req = axum::http::Request::get("/healthz")
        .body(axum::body::Body::empty())
        .unwrap();
    let res = app.oneshot(req).await.unwrap();
    assert!(res.status().is_success());
    tracing::callsite::rebuild_interest_cache();
}
