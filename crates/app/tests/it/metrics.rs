//! `GET /metrics`: the families `serve` exposes and that they move, and the
//! listener `parlance worker --metrics-bind` serves.
//!
//! The recorder is one per process and every test of this binary records
//! into it, so the checks compare values before and after what a test does,
//! on label values no other test uses where they can.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use parlance_app::execute::Executor;
use parlance_app::worker::WorkerConfig;
use parlance_core::ProductId;
use parlance_core::session::{SessionCommand, SessionKey, SessionState, TourCatalog};
use parlance_ports::{
    Commit, Committed, CompletionRequest, MachineStore, Message, PortError, PortResult,
    QueueConfig, Stored, SystemClock, TaskQueue as _, TaskSpec, WorkerId,
};
use parlance_postgres::PgTaskQueue;
use parlance_postgres::testing::test_pool;
use parlance_testkit::ManualClock;
use reqwest::StatusCode;
use serde_json::json;

use crate::load::{Proc, free_port};
use crate::support::{TestServer, components, spawn_worker, url_for};

/// The sum of the samples of `name` whose labels include every pair of
/// `labels` (0 when there is none).
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
            (n == name
                && labels
                    .iter()
                    .all(|(k, val)| rest.contains(&format!("{k}=\"{val}\""))))
            .then(|| v.parse::<f64>().ok())?
        })
        .sum()
}

async fn scrape(client: &reqwest::Client, addr: &str) -> String {
    let res = client
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let ctype = res.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ctype.starts_with("text/plain"), "{ctype}");
    res.text().await.unwrap()
}

/// Scrapes `addr` until `done` holds for the text, failing after `timeout`;
/// returns the last text.
async fn scrape_until(
    client: &reqwest::Client,
    addr: &str,
    what: &str,
    timeout: Duration,
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let text = match client.get(format!("http://{addr}/metrics")).send().await {
            Ok(res) if res.status().is_success() => res.text().await.unwrap_or_default(),
            _ => String::new(),
        };
        if done(&text) {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Loses the compare-and-swap of its first commit, as when another process
/// wrote the record in between.
struct ConflictOnce {
    inner: Arc<dyn MachineStore<SessionState>>,
    armed: AtomicBool,
}

#[async_trait]
impl MachineStore<SessionState> for ConflictOnce {
    async fn load(&self, key: &SessionKey) -> PortResult<Option<Stored<SessionState>>> {
        self.inner.load(key).await
    }

    async fn commit(
        &self,
        commit: Commit<'_, SessionState>,
    ) -> PortResult<Committed<SessionState>> {
        if self.armed.swap(false, Ordering::SeqCst) {
            return Err(PortError::conflict("another writer committed first"));
        }
        self.inner.commit(commit).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_exposes_every_family_and_they_move() {
    let clock = Arc::new(ManualClock::new());
    let state = components(&clock).build();
    let server = TestServer::start(state.clone(), clock.clone()).await;
    let addr = server.addr.to_string();
    let before = scrape(&server.client, &addr).await;

    // A request on a route with ids: counted under its template.
    let (status, _, _) = server
        .send(
            reqwest::Method::GET,
            "/v1/products/acme/sessions/metrics-probe-7f3a",
            None,
            true,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = server
        .send(reqwest::Method::GET, "/no/such/route-91c2", None, false)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A lost compare-and-swap, decided again and committed.
    let store = ConflictOnce {
        inner: state.sessions.store.clone(),
        armed: AtomicBool::new(true),
    };
    let key = SessionKey::new(
        ProductId::parse("acme").unwrap(),
        "metrics-cas".parse().unwrap(),
    );
    let done = Executor::<SessionState>::new(&store, clock.as_ref())
        .run(&key, &TourCatalog::default(), &SessionCommand::Create)
        .await
        .unwrap();
    assert_eq!(done.attempts, 2);

    // A queue claim, and the depth read before it.
    let queue = "metrics-serve";
    state
        .shared
        .queue
        .enqueue(&[
            TaskSpec::new(ProductId::parse("acme").unwrap(), "metrics.none", json!({}))
                .queue(queue),
        ])
        .await
        .unwrap();
    let worker = state.worker(WorkerConfig {
        queue: queue.to_owned(),
        ..WorkerConfig::default()
    });
    worker.observe_depth().await.unwrap();
    let report = worker.step().await.unwrap();
    assert_eq!(report.claimed, 1);

    // A model call through the service's client (the offline model).
    let llm = &state.shared.llm;
    let model = llm.default_model().to_owned();
    let answer = llm
        .complete(&CompletionRequest::new(vec![Message::user("hello there")]))
        .await
        .unwrap();
    let usage = answer.usage.expect("the offline model reports usage");

    // The sweepers set their lag on their first tick.
    let sweepers = state.spawn_sweepers();
    let after = scrape_until(
        &server.client,
        &addr,
        "the sweepers' lag",
        Duration::from_secs(10),
        |t| {
            t.contains("parlance_sweeper_lag_seconds{sweeper=\"session\"}")
                && t.contains("parlance_sweeper_lag_seconds{sweeper=\"conversation\"}")
        },
    )
    .await;
    for s in sweepers {
        s.abort();
    }

    for family in [
        "parlance_http_requests_total",
        "parlance_http_request_duration_seconds",
        "parlance_cas_conflicts_total",
        "parlance_cas_retries_total",
        "parlance_queue_depth",
        "parlance_queue_claim_duration_seconds",
        "parlance_queue_claimed_tasks_total",
        "parlance_sweeper_lag_seconds",
        "parlance_llm_calls_total",
        "parlance_llm_call_duration_seconds",
        "parlance_llm_tokens_total",
    ] {
        assert!(
            after.contains(&format!("# TYPE {family} ")),
            "{family} missing from:\n{after}"
        );
    }
    let moved = |name: &str, labels: &[(&str, &str)]| {
        value(&after, name, labels) - value(&before, name, labels)
    };
    let session_route = [
        ("route", "/v1/products/{product_id}/sessions/{session_id}"),
        ("method", "GET"),
        ("status", "404"),
    ];
    assert_eq!(moved("parlance_http_requests_total", &session_route), 1.0);
    assert_eq!(
        moved(
            "parlance_http_request_duration_seconds_count",
            &session_route
        ),
        1.0
    );
    assert!(
        moved(
            "parlance_http_requests_total",
            &[("route", "unmatched"), ("status", "404")]
        ) >= 1.0
    );
    assert!(
        !after.contains("metrics-probe-7f3a") && !after.contains("route-91c2"),
        "a raw path became a label:\n{after}"
    );
    // The scrape before counts too, under its own route.
    assert!(moved("parlance_http_requests_total", &[("route", "/metrics")]) >= 1.0);
    let session = [("machine", "session")];
    assert!(moved("parlance_cas_conflicts_total", &session) >= 1.0);
    assert!(moved("parlance_cas_retries_total", &session) >= 1.0);
    let q = [("queue", queue)];
    assert_eq!(moved("parlance_queue_claimed_tasks_total", &q), 1.0);
    assert_eq!(
        moved("parlance_queue_claim_duration_seconds_count", &q),
        1.0
    );
    // Only this test uses the queue, so its depth is known.
    assert_eq!(
        value(
            &after,
            "parlance_queue_depth",
            &[("queue", queue), ("state", "ready")]
        ),
        1.0
    );
    let m = [("model", model.as_str())];
    assert!(moved("parlance_llm_calls_total", &m) >= 1.0);
    assert!(moved("parlance_llm_call_duration_seconds_count", &m) >= 1.0);
    assert!(
        moved(
            "parlance_llm_tokens_total",
            &[("model", model.as_str()), ("kind", "prompt")]
        ) >= f64::from(usage.prompt_tokens)
    );
    assert!(
        moved(
            "parlance_llm_tokens_total",
            &[("model", model.as_str()), ("kind", "completion")]
        ) >= f64::from(usage.completion_tokens)
    );
}

/// An expired lease recovered by a running worker's sweep is counted under
/// its queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_leases_are_counted_by_queue() {
    let clock = Arc::new(ManualClock::new());
    let state = components(&clock).build();
    let server = TestServer::start(state.clone(), clock.clone()).await;
    let addr = server.addr.to_string();
    let queue = "metrics-expiry";
    let q = [("queue", queue)];
    let before = value(
        &scrape(&server.client, &addr).await,
        "parlance_queue_expired_leases_total",
        &q,
    );
    state
        .shared
        .queue
        .enqueue(&[
            TaskSpec::new(ProductId::parse("acme").unwrap(), "metrics.none", json!({}))
                .queue(queue)
                .timeout(Duration::from_secs(1)),
        ])
        .await
        .unwrap();
    let gone = WorkerId(uuid::Uuid::from_u128(0x5ee));
    let held = state
        .shared
        .queue
        .claim(&gone, queue, 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(held.len(), 1);
    let worker = state.start_worker(WorkerConfig {
        queue: queue.to_owned(),
        sweep_every: Duration::from_millis(20),
        poll_every: Duration::from_millis(20),
        ..WorkerConfig::default()
    });
    clock.advance(Duration::from_secs(2));
    scrape_until(
        &server.client,
        &addr,
        "the expired lease to be counted",
        Duration::from_secs(10),
        |t| value(t, "parlance_queue_expired_leases_total", &q) - before == 1.0,
    )
    .await;
    worker.stop().await;
}

/// `parlance worker --metrics-bind` serves `/metrics` on its own listener,
/// and its queue families move when it claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_serves_metrics_on_its_own_address() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let url = url_for(&pool);
    let addr = format!("127.0.0.1:{}", free_port());
    let _worker = Proc::from(spawn_worker(&url, &["--metrics-bind", &addr]));
    let client = reqwest::Client::new();
    let ready = [("queue", "default"), ("state", "ready")];
    let text = scrape_until(
        &client,
        &addr,
        "the worker's metrics",
        Duration::from_secs(60),
        |t| t.contains("parlance_queue_depth{"),
    )
    .await;
    let claimed = |text: &str| {
        value(
            text,
            "parlance_queue_claimed_tasks_total",
            &[("queue", "default")],
        )
    };
    let before = claimed(&text);
    assert_eq!(value(&text, "parlance_queue_depth", &ready), 0.0);
    assert!(text.contains("# TYPE parlance_queue_claim_duration_seconds histogram"));
    let queue = PgTaskQueue::new(pool.clone(), Arc::new(SystemClock), QueueConfig::default());
    queue
        .enqueue(&[TaskSpec::new(
            ProductId::parse("acme").unwrap(),
            "metrics.none",
            json!({}),
        )])
        .await
        .unwrap();
    scrape_until(
        &client,
        &addr,
        "the worker to claim",
        Duration::from_secs(30),
        |t| claimed(t) - before == 1.0,
    )
    .await;
    let res = client
        .get(format!("http://{addr}/v1/anything"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::NOT_FOUND,
        "only /metrics is served"
    );
}
