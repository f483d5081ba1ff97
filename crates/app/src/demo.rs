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

    /// The service state (for scenes that drive a worker step).
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
    session_scene(&mut demo).await?;
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

/// The session machine: a proactive offer, a click, silence past the
/// timeout (the sweeper notices), a cooldown that blocks, and its end.
async fn session_scene<W: Write>(demo: &mut Demo<W>) -> anyhow::Result<()> {
    demo.scene("session: proactive offer, timeout, cooldown")?;
    let s = "/v1/products/default/sessions/demo-1";
    let events = format!("{s}/events");
    let gate = format!("{s}/proactive-gate");
    let trigger = serde_json::json!({"type": "proactive_trigger", "trigger_id": "pricing-page"});

    demo.say("a proactive trigger fires for a new session")?;
    let (st, v) = demo
        .call(Method::POST, &events, Some(trigger.clone()), true)
        .await?;
    anyhow::ensure!(st == StatusCode::OK, "trigger answered {st}");
    anyhow::ensure!(
        v["snapshot"]["current_state"] == "proactive_assistance",
        "not proactive"
    );

    demo.say("the user clicks a quick reply")?;
    let click = serde_json::json!({"type": "option_click"});
    let (st, _) = demo.call(Method::POST, &events, Some(click), true).await?;
    anyhow::ensure!(st == StatusCode::OK, "click answered {st}");

    demo.say("then silence: 21 s pass, past the 20 s timeout; the sweeper ticks due sessions")?;
    demo.clock().advance(std::time::Duration::from_secs(21));
    let swept = crate::session::sweep_once(demo.state(), 100).await?;
    demo.say(&format!(
        "sweeper: {} due, {} timed out",
        swept.claimed, swept.transitions
    ))?;
    anyhow::ensure!(
        swept.transitions == 1,
        "the sweeper did not time the session out"
    );

    demo.say("back in thinking, a 60 s cooldown blocks proactive offers")?;
    let (_, v) = demo.call(Method::GET, &gate, None, true).await?;
    anyhow::ensure!(v["reason"] == "v2_cooldown_active", "gate: {v}");
    let (st, v) = demo
        .call(Method::POST, &events, Some(trigger.clone()), true)
        .await?;
    anyhow::ensure!(
        st == StatusCode::OK && v["result"]["ignored"] == "v2_cooldown_active",
        "a trigger during the cooldown was not ignored: {v}"
    );

    demo.say("60 s later the cooldown ends, again without traffic")?;
    demo.clock().advance(std::time::Duration::from_secs(60));
    let swept = crate::session::sweep_once(demo.state(), 100).await?;
    demo.say(&format!("sweeper: {} due", swept.claimed))?;
    let (_, v) = demo.call(Method::GET, &gate, None, true).await?;
    anyhow::ensure!(v["allowed"] == true, "gate after the cooldown: {v}");
    let (_, v) = demo
        .call(Method::GET, &format!("{s}/audit"), None, true)
        .await?;
    let n = v["records"].as_array().map_or(0, Vec::len);
    demo.say(&format!(
        "the audit log holds {n} transitions for this session"
    ))?;
    Ok(())
}
