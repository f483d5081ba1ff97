//! Prometheus metrics: the process's one recorder, the families the service
//! records (their names are the constants below), the `/metrics` route, the
//! router `parlance worker --metrics-bind` serves alone, the HTTP layer that
//! counts requests by route template, and the decorator that meters the
//! language model.
//!
//! Recording goes through the `metrics` facade; the recorder is the
//! Prometheus exporter's, installed once per process by [`install`] (which
//! [`crate::Components::build`] calls), and `/metrics` renders its handle.
//! Only this crate records: core, ports and adapters know nothing of it.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::Router;
use axum::extract::{MatchedPath, Request};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use parlance_core::Timestamp;
use parlance_ports::{
    CompletionChunk, CompletionRequest, CompletionResponse, CompletionStream, LlmClient, LlmError,
    LlmResult, QueueDepth, RecoverReport, Usage,
};

/// HTTP requests answered, by `route` (the matched route template, or
/// `unmatched`), `method` and `status`.
pub const HTTP_REQUESTS: &str = "parlance_http_requests_total";
/// Time from a request's arrival to its response head, by `route`,
/// `method` and `status`.
pub const HTTP_DURATION: &str = "parlance_http_request_duration_seconds";
/// Commits that lost their compare-and-swap, by `machine`.
pub const CAS_CONFLICTS: &str = "parlance_cas_conflicts_total";
/// Commands decided again after a lost compare-and-swap, by `machine`.
pub const CAS_RETRIES: &str = "parlance_cas_retries_total";
/// Commands that lost every attempt (answered as contended), by `machine`.
pub const CAS_EXHAUSTED: &str = "parlance_cas_exhausted_total";
/// Live tasks of a queue, by `queue` and `state` (`ready`, `scheduled`,
/// `running`).
pub const QUEUE_DEPTH: &str = "parlance_queue_depth";
/// Time one claim on the queue takes, by `queue`.
pub const QUEUE_CLAIM_DURATION: &str = "parlance_queue_claim_duration_seconds";
/// Tasks claimed, by `queue`.
pub const QUEUE_CLAIMED: &str = "parlance_queue_claimed_tasks_total";
/// Expired leases recovered by the lease sweep, by `queue`.
pub const QUEUE_EXPIRED_LEASES: &str = "parlance_queue_expired_leases_total";
/// Now minus the oldest due deadline no sweeper has taken, by `sweeper`
/// (`session`, `conversation`); 0 when nothing is overdue.
pub const SWEEPER_LAG: &str = "parlance_sweeper_lag_seconds";
/// Model calls, by `model`.
pub const LLM_CALLS: &str = "parlance_llm_calls_total";
/// Time of a model call (for a stream, until it ends), by `model`.
pub const LLM_DURATION: &str = "parlance_llm_call_duration_seconds";
/// Tokens spent, by `model` and `kind` (`prompt`, `completion`).
pub const LLM_TOKENS: &str = "parlance_llm_tokens_total";
/// Failed model calls, by `model` and `error` (`rate_limited`,
/// `unavailable`, `invalid`, `timeout`, `other`).
pub const LLM_ERRORS: &str = "parlance_llm_errors_total";

/// Histogram buckets of every `_seconds` family, in seconds: from a
/// millisecond (an in-memory claim) to a minute (a slow model).
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// How often histogram samples are folded into their buckets, so that an
/// unscraped process does not hold every sample.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs the process's recorder once and returns its handle; later calls
/// return the same handle. When another recorder was installed first (by an
/// embedding program), this one is not, and `/metrics` renders nothing.
pub fn install() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), LATENCY_BUCKETS)
            .expect("the buckets are not empty")
            .build_recorder();
        let handle = recorder.handle();
        if let Err(e) = metrics::set_global_recorder(recorder) {
            tracing::warn!(error = %e, "a metrics recorder is already installed; /metrics stays empty");
        }
        describe();
        let upkeep = handle.clone();
        // A thread, not a task: the recorder may be installed before (or
        // outside) a runtime, and upkeep is a short synchronous call.
        let spawned = std::thread::Builder::new()
            .name("metrics-upkeep".to_owned())
            .spawn(move || {
                loop {
                    std::thread::sleep(UPKEEP_EVERY);
                    upkeep.run_upkeep();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start the metrics upkeep thread");
        }
        handle
    })
}

fn describe() {
    describe_counter!(HTTP_REQUESTS, Unit::Count, "HTTP requests answered");
    describe_histogram!(
        HTTP_DURATION,
        Unit::Seconds,
        "time from a request's arrival to its response head"
    );
    describe_counter!(
        CAS_CONFLICTS,
        Unit::Count,
        "commits that lost their compare-and-swap"
    );
    describe_counter!(
        CAS_RETRIES,
        Unit::Count,
        "commands decided again after a lost compare-and-swap"
    );
    describe_counter!(
        CAS_EXHAUSTED,
        Unit::Count,
        "commands that lost every compare-and-swap attempt"
    );
    describe_gauge!(QUEUE_DEPTH, Unit::Count, "live tasks of a queue");
    describe_histogram!(
        QUEUE_CLAIM_DURATION,
        Unit::Seconds,
        "time one claim on the queue takes"
    );
    describe_counter!(QUEUE_CLAIMED, Unit::Count, "tasks claimed");
    describe_counter!(
        QUEUE_EXPIRED_LEASES,
        Unit::Count,
        "expired leases recovered by the lease sweep"
    );
    describe_gauge!(
        SWEEPER_LAG,
        Unit::Seconds,
        "now minus the oldest due deadline no sweeper has taken"
    );
    describe_counter!(LLM_CALLS, Unit::Count, "model calls");
    describe_histogram!(LLM_DURATION, Unit::Seconds, "time of a model call");
    describe_counter!(LLM_TOKENS, Unit::Count, "tokens spent");
    describe_counter!(LLM_ERRORS, Unit::Count, "failed model calls");
}

/// The process's metrics, in the Prometheus text format (families and
/// labels: docs/api.md, Metrics).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "service",
    security(()),
    responses((
        status = 200,
        description = "Every family, in the Prometheus text exposition format 0.0.4.",
        content_type = "text/plain; version=0.0.4; charset=utf-8",
        body = String,
    )),
)]
pub(crate) async fn render() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        install().render(),
    )
        .into_response()
}

/// The router of a process that serves nothing but `/metrics` (`parlance
/// worker --metrics-bind`); any other path answers a bare 404.
pub fn router() -> Router {
    install();
    let (router, _) = utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(render))
        .split_for_parts();
    router.layer(axum::middleware::from_fn(track_http))
}

/// Counts each request and times it, labelled with the route template that
/// matched (never the raw path, whose ids would make a series per
/// resource), the method and the status.
pub(crate) async fn track_http(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let method = method_label(req.method());
    let started = Instant::now();
    let res = next.run(req).await;
    let labels = [
        ("route", route),
        ("method", method.to_owned()),
        ("status", res.status().as_str().to_owned()),
    ];
    counter!(HTTP_REQUESTS, &labels).increment(1);
    metrics::histogram!(HTTP_DURATION, &labels).record(started.elapsed());
    res
}

/// The standard methods by name; any other (clients may send anything) as
/// `other`, so it cannot add series.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// A commit of `machine` lost its compare-and-swap.
pub(crate) fn cas_conflict(machine: &'static str) {
    counter!(CAS_CONFLICTS, "machine" => machine).increment(1);
}

/// A command of `machine` is decided again after a lost compare-and-swap.
pub(crate) fn cas_retry(machine: &'static str) {
    counter!(CAS_RETRIES, "machine" => machine).increment(1);
}

/// A command of `machine` lost every attempt.
pub(crate) fn cas_exhausted(machine: &'static str) {
    counter!(CAS_EXHAUSTED, "machine" => machine).increment(1);
}

/// A claim on `queue` took `took` and handed out `claimed` tasks.
pub(crate) fn queue_claimed(queue: &str, took: Duration, claimed: usize) {
    let queue = queue.to_owned();
    metrics::histogram!(QUEUE_CLAIM_DURATION, "queue" => queue.clone()).record(took);
    counter!(QUEUE_CLAIMED, "queue" => queue).increment(claimed as u64);
}

/// The live tasks of `queue` now.
pub(crate) fn queue_depth(queue: &str, depth: QueueDepth) {
    for (state, n) in [
        ("ready", depth.ready),
        ("scheduled", depth.scheduled),
        ("running", depth.running),
    ] {
        // Gauges are f64; a queue never holds 2^53 tasks.
        #[allow(clippy::cast_precision_loss)]
        gauge!(QUEUE_DEPTH, "queue" => queue.to_owned(), "state" => state).set(n as f64);
    }
}

/// What a lease sweep recovered.
pub(crate) fn leases_recovered(report: &RecoverReport) {
    for (queue, n) in &report.by_queue {
        counter!(QUEUE_EXPIRED_LEASES, "queue" => queue.clone()).increment(*n);
    }
}

/// The `sweeper`'s oldest due deadline not yet taken at `now` (`None`:
/// nothing is due).
pub(crate) fn sweeper_lag(sweeper: &'static str, now: Timestamp, oldest: Option<Timestamp>) {
    let lag = oldest.map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
    gauge!(SWEEPER_LAG, "sweeper" => sweeper).set(lag.as_secs_f64());
}

/// Meters every call of the model it wraps: calls, time, tokens and errors
/// by the model the call asked for (the configured one when it names none).
pub struct MeteredLlm {
    inner: Arc<dyn LlmClient>,
}

impl MeteredLlm {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LlmClient>) -> Self {
        Self { inner }
    }

    fn meter(&self, request: &CompletionRequest) -> CallMeter {
        let model = request
            .model
            .clone()
            .unwrap_or_else(|| self.inner.default_model().to_owned());
        counter!(LLM_CALLS, "model" => model.clone()).increment(1);
        CallMeter {
            model,
            started: Instant::now(),
        }
    }
}

#[async_trait]
impl LlmClient for MeteredLlm {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn default_model(&self) -> &str {
        self.inner.default_model()
    }

    async fn complete(&self, request: &CompletionRequest) -> LlmResult<CompletionResponse> {
        let meter = self.meter(request);
        let result = self.inner.complete(request).await;
        match &result {
            Ok(response) => meter.usage(response.usage),
            Err(e) => meter.failed(e),
        }
        result
    }

    async fn stream(&self, request: &CompletionRequest) -> LlmResult<CompletionStream> {
        let meter = self.meter(request);
        let stream = match self.inner.stream(request).await {
            Ok(stream) => stream,
            Err(e) => {
                meter.failed(&e);
                return Err(e);
            }
        };
        // The meter lives as long as the stream: its time ends when the
        // stream is dropped, finished or not.
        Ok(Box::pin(stream.map(move |item| {
            match &item {
                Ok(CompletionChunk::Usage { usage }) => meter.usage(Some(*usage)),
                Err(e) => meter.failed(e),
                Ok(_) => {}
            }
            item
        })))
    }
}

/// One model call in flight; records its time when dropped.
struct CallMeter {
    model: String,
    started: Instant,
}

impl CallMeter {
    fn usage(&self, usage: Option<Usage>) {
        let Some(usage) = usage else { return };
        for (kind, n) in [
            ("prompt", usage.prompt_tokens),
            ("completion", usage.completion_tokens),
        ] {
            counter!(LLM_TOKENS, "model" => self.model.clone(), "kind" => kind)
                .increment(u64::from(n));
        }
    }

    fn failed(&self, error: &LlmError) {
        let kind = match error {
            LlmError::RateLimited { .. } => "rate_limited",
            LlmError::Unavailable { .. } => "unavailable",
            LlmError::Invalid { .. } => "invalid",
            LlmError::Timeout { .. } => "timeout",
            _ => "other",
        };
        counter!(LLM_ERRORS, "model" => self.model.clone(), "error" => kind).increment(1);
    }
}

impl Drop for CallMeter {
    fn drop(&mut self) {
        metrics::histogram!(LLM_DURATION, "model" => self.model.clone())
            .record(self.started.elapsed());
    }
}
