//! `parlance demo`: a scripted scenario played through the real HTTP API, in
//! process, on the in-memory adapters with a manual clock, so the transcript
//! is the same on every run.

use std::io::Write;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use parlance_core::ProductId;
use parlance_ports::{Clock as _, ManualClock, SequentialIds};
use serde_json::Value;
use tower::ServiceExt as _;

use crate::auth::{ApiKey, ApiKeys};
use crate::http::router;
use crate::state::AppState;

/// The key the demo's product uses (the demo never listens on a socket).
const DEMO_KEY: &str = "pk_demo";

/// Drives the service and writes what happens.
pub struct Demo<W: Write> {
    app: Router,
    state: AppState,
    clock: Arc<ManualClock>,
    out: W,
}

impl<W: Write> Demo<W> {
    /// A fresh service on the in-memory adapters at [`ManualClock::START`].
    pub fn new(out: W) -> Self {
        let clock = Arc::new(ManualClock::new());
        let keys = ApiKeys::single(&ApiKey::new(DEMO_KEY), ProductId::default_product());
        let state = AppState::memory_with(keys, clock.clone(), Arc::new(SequentialIds::new()));
        Self {
            app: router(state.clone()),
            state,
            clock,
            out,
        }
    }

    /// The clock the scenes move.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// The service's state, for scenes that drive a port directly.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Starts a scene with a heading.
    pub fn scene(&mut self, title: &str) -> std::io::Result<()> {
        writeln!(self.out, "\n== {title}")
    }

    /// Writes a narration line.
    pub fn say(&mut self, line: &str) -> std::io::Result<()> {
        writeln!(self.out, "   {line}")
    }

    /// Sends a request (with the demo key unless `auth` is false), prints the
    /// exchange and returns the status and JSON body.
    pub async fn call(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Value>,
        auth: bool,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let mut req = Request::builder().method(method.clone()).uri(path);
        if auth {
            req = req.header("authorization", format!("Bearer {DEMO_KEY}"));
        }
        let req = match &body {
            Some(b) => req
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(b)?))?,
            None => req.body(Body::empty())?,
        };
        let res = self.app.clone().oneshot(req).await?;
        let status = res.status();
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX).await?;
        let json: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let sent = body.map(|b| format!(" {b}")).unwrap_or_default();
        writeln!(self.out, "-> {method} {path}{sent}")?;
        writeln!(self.out, "<- {} {json}", status.as_u16())?;
        Ok((status, json))
    }
}

/// Plays every scene into `out`.
///
/// # Errors
///
/// When writing fails or a scene does not go as scripted.
pub async fn run(out: impl Write) -> anyhow::Result<()> {
    let mut demo = Demo::new(out);
    service_scene(&mut demo).await?;
    queue_scene(&mut demo).await?;
    Ok(())
}

/// The service itself: probes, and what `/v1` asks of a caller.
async fn service_scene<W: Write>(demo: &mut Demo<W>) -> anyhow::Result<()> {
    demo.scene("service: probes and authentication")?;
    let now = demo.clock().now();
    demo.say(&format!("the clock reads {now}"))?;
    let (s, _) = demo.call(Method::GET, "/healthz", None, false).await?;
    anyhow::ensure!(s == StatusCode::OK, "healthz answered {s}");
    let (s, _) = demo.call(Method::GET, "/readyz", None, false).await?;
    anyhow::ensure!(s == StatusCode::OK, "readyz answered {s}");
    demo.say("every /v1 route needs a bearer key")?;
    let path = "/v1/products/default/sessions/s-1";
    let (s, _) = demo.call(Method::GET, path, None, false).await?;
    anyhow::ensure!(
        s == StatusCode::UNAUTHORIZED,
        "unauthenticated call answered {s}"
    );
    Ok(())
}

/// The task queue: a DAG with a fan-out, run by a worker one step at a time.
async fn queue_scene<W: Write>(demo: &mut Demo<W>) -> anyhow::Result<()> {
    use crate::worker::{Handlers, RECORD_KIND, Worker, WorkerConfig, register_test_handlers};
    use parlance_ports::{DagSpec, NodeSpec, WorkerId};

    demo.scene("task queue: a DAG with a fan-out, run by a worker")?;
    let state = demo.state().clone();
    let node = |key: &str, label: &str| {
        NodeSpec::new(key, RECORD_KIND, serde_json::json!({})).label(label)
    };
    let dag = DagSpec::new(ProductId::default_product())
        .node(node("outline", "outlining"))
        .node(node("draft-a", "drafting"))
        .node(node("draft-b", "drafting"))
        .node(node("merge", "merging"))
        .edge("outline", "draft-a")
        .edge("outline", "draft-b")
        .edge("draft-a", "merge")
        .edge("draft-b", "merge");
    let id = state.queue.enqueue_dag(&dag).await?;
    let status = state.queue.dag_status(id).await?;
    demo.say(&format!(
        "enqueued: {}/{} done, now {:?}",
        status.done, status.total, status.labels
    ))?;
    let mut handlers = Handlers::new();
    register_test_handlers(&mut handlers);
    let worker = Worker::new(
        WorkerId(state.ids.new_uuid()),
        state.queue.clone(),
        handlers,
        state.clock.clone(),
        WorkerConfig {
            slots: 2,
            ..WorkerConfig::default()
        },
    );
    loop {
        let step = worker.step().await?;
        if step.claimed == 0 {
            break;
        }
        let status = state.queue.dag_status(id).await?;
        demo.say(&format!(
            "worker step ran {} task(s): {}/{} done, now {:?}",
            step.completed, status.done, status.total, status.labels
        ))?;
    }
    let status = state.queue.dag_status(id).await?;
    anyhow::ensure!(status.state.is_finished(), "the DAG did not finish");
    let merged = state
        .queue
        .dag_results(id)
        .await?
        .into_iter()
        .find(|n| n.key == "merge")
        .and_then(|n| n.result)
        .unwrap_or_default();
    demo.say(&format!("{:?}; merge saw {merged}", status.state))?;
    Ok(())
}
