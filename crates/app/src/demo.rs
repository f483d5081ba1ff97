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
    clock: Arc<ManualClock>,
    out: W,
}

impl<W: Write> Demo<W> {
    /// A fresh service on the in-memory adapters at [`ManualClock::START`].
    pub fn new(out: W) -> Self {
        let clock = Arc::new(ManualClock::new());
        let keys = ApiKeys::single(&ApiKey::new(DEMO_KEY), ProductId::default_product());
        let mut state = AppState::memory_with(keys, clock.clone(), Arc::new(SequentialIds::new()));
        if let Ok(catalog) = crate::flow::example_catalog() {
            state.flow_catalog = Arc::new(catalog);
        }
        Self {
            app: router(state),
            clock,
            out,
        }
    }

    /// The clock the scenes move.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
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
    flow_scene(&mut demo).await?;
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

impl<W: Write> Demo<W> {
    /// Polls a flow session without printing until its task graph is done,
    /// then prints that last poll.
    async fn poll_until_ready(&mut self, flow: &str, session: &str) -> anyhow::Result<Value> {
        let path = format!("/v1/ai/{flow}/event");
        let body = serde_json::json!({"session_id": session, "event": "poll", "event_input": ""});
        for _ in 0..2000 {
            let req = Request::builder()
                .method(Method::POST)
                .uri(&path)
                .header("authorization", format!("Bearer {DEMO_KEY}"))
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&body)?))?;
            let res = self.app.clone().oneshot(req).await?;
            let bytes = axum::body::to_bytes(res.into_body(), usize::MAX).await?;
            let json: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            if json["next_actions"] != serde_json::json!(["poll"]) {
                let (_, last) = self.call(Method::POST, &path, Some(body), true).await?;
                return Ok(last);
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        anyhow::bail!("the task graph of {flow} never finished")
    }
}

/// Both example flows, on the offline model: a question answered, then an
/// extraction routed on its parsed result.
async fn flow_scene<W: Write>(demo: &mut Demo<W>) -> anyhow::Result<()> {
    use serde_json::json;
    demo.scene("flows: a question, the offline model's answer, a follow-up")?;
    let (s, start) = demo
        .call(Method::POST, "/v1/ai/qa/start_session", None, true)
        .await?;
    anyhow::ensure!(s == StatusCode::OK, "start_session answered {s}");
    let sid = start["session_id"].as_str().unwrap_or_default().to_owned();
    let event = |event: &str, input: &str| {
        Some(json!({"session_id": sid, "event": event, "event_input": input}))
    };
    demo.call(
        Method::POST,
        "/v1/ai/qa/event",
        event("user_input", "What is a flow?"),
        true,
    )
    .await?;
    demo.say("the answer runs as a task graph; the client polls")?;
    demo.poll_until_ready("qa", &sid).await?;
    demo.say("`done` ends the conversation")?;
    let (s, _) = demo
        .call(Method::POST, "/v1/ai/qa/event", event("done", ""), true)
        .await?;
    anyhow::ensure!(s == StatusCode::OK, "done answered {s}");

    demo.scene("flows: extraction through a chain, a map and a map over a list")?;
    let (_, start) = demo
        .call(Method::POST, "/v1/ai/extraction/start_session", None, true)
        .await?;
    let sid = start["session_id"].as_str().unwrap_or_default().to_owned();
    let event = |event: &str, input: &str| {
        Some(json!({"session_id": sid, "event": event, "event_input": input}))
    };
    demo.say("no email: the condition on the parsed result routes to `missing`")?;
    demo.call(
        Method::POST,
        "/v1/ai/extraction/event",
        event("user_input", "name: Ada; topics: engines"),
        true,
    )
    .await?;
    demo.poll_until_ready("extraction", &sid).await?;
    demo.call(
        Method::POST,
        "/v1/ai/extraction/event",
        event(
            "user_input",
            "name: Ada Lovelace; email: ada@example.com; topics: engines, poetry",
        ),
        true,
    )
    .await?;
    let done = demo.poll_until_ready("extraction", &sid).await?;
    anyhow::ensure!(
        done["next_actions"] == json!(["accept", "restart"]),
        "extraction ended with {done}"
    );
    demo.call(
        Method::GET,
        &format!("/v1/ai/extraction/model/{sid}"),
        None,
        true,
    )
    .await?;
    Ok(())
}
