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
use crate::{AppState, Components, router};

mod agent;
mod conversation;

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
        let (state, clock) = demo_state();
        Self::with_state(state, clock, out)
    }

    /// A demo on `state`, whose clock is `clock`.
    pub fn with_state(state: AppState, clock: Arc<ManualClock>, out: W) -> Self {
        Self {
            app: router(&state),
            state,
            clock,
            out,
        }
    }

    /// The clock the scenes move.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// Writes to the transcript's output.
    pub fn out(&mut self) -> &mut W {
        &mut self.out
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
        self.exchange(method, path, body, auth, true).await
    }

    /// Like [`Demo::call`] with the key, printing the status but not the
    /// answer's body (scenes summarise it themselves).
    pub async fn request(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(StatusCode, Value)> {
        self.exchange(method, path, body, true, false).await
    }

    async fn exchange(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Value>,
        auth: bool,
        show_answer: bool,
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
        if show_answer {
            writeln!(self.out, "<- {} {json}", status.as_u16())?;
        } else {
            writeln!(self.out, "<- {}", status.as_u16())?;
        }
        Ok((status, json))
    }
}

/// The components of a service on the in-memory adapters with sequential
/// ids and a manual clock at [`ManualClock::START`], opened by the demo key,
/// serving the example flows.
pub(crate) fn demo_components() -> (Components, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new());
    let keys = ApiKeys::single(&ApiKey::new(DEMO_KEY), ProductId::default_product());
    let mut c = Components::memory(keys);
    c.clock = clock.clone();
    c.ids = Arc::new(SequentialIds::new());
    if let Ok(catalog) = crate::flow::example_catalog() {
        c.flows = catalog;
    }
    (c, clock)
}

/// [`demo_components`], built.
pub(crate) fn demo_state() -> (AppState, Arc<ManualClock>) {
    let (c, clock) = demo_components();
    (c.build(), clock)
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
    queue_scene(&mut demo).await?;
    adoption_scene(&mut demo).await?;
    conversation::scene(&mut demo).await?;
    agent::scene(&mut demo).await?;
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

/// The task queue: a DAG with a fan-out, run by a worker one step at a time.
async fn queue_scene<W: Write>(demo: &mut Demo<W>) -> anyhow::Result<()> {
    use crate::worker::{Handlers, RECORD_KIND, Worker, WorkerConfig, register_test_handlers};
    use parlance_ports::{DagSpec, NodeSpec, WorkerId};

    demo.scene("task queue: a DAG with a fan-out, run by a worker")?;
    let state = demo.state().clone();
    let node = |key: &str, label: &str| {
        NodeSpec::new(key, RECORD_KIND, serde_json::json!({})).label(label)
    };
    let product = ProductId::default_product();
    let dag = DagSpec::new(product.clone())
        .node(node("outline", "outlining"))
        .node(node("draft-a", "drafting"))
        .node(node("draft-b", "drafting"))
        .node(node("merge", "merging"))
        .edge("outline", "draft-a")
        .edge("outline", "draft-b")
        .edge("draft-a", "merge")
        .edge("draft-b", "merge");
    let id = state.shared.queue.enqueue_dag(&dag).await?;
    let status = state.shared.queue.dag_status(&product, id).await?;
    demo.say(&format!(
        "enqueued: {}/{} done, now {:?}",
        status.done, status.total, status.labels
    ))?;
    let mut handlers = Handlers::new();
    register_test_handlers(&mut handlers);
    let worker = Worker::new(
        WorkerId(state.shared.ids.new_uuid()),
        state.shared.queue.clone(),
        handlers,
        state.shared.clock.clone(),
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
        let status = state.shared.queue.dag_status(&product, id).await?;
        demo.say(&format!(
            "worker step ran {} task(s): {}/{} done, now {:?}",
            step.completed, status.done, status.total, status.labels
        ))?;
    }
    let status = state.shared.queue.dag_status(&product, id).await?;
    anyhow::ensure!(status.state.is_finished(), "the DAG did not finish");
    let merged = state
        .shared
        .queue
        .dag_results(&product, id)
        .await?
        .into_iter()
        .find(|n| n.key == "merge")
        .and_then(|n| n.result)
        .unwrap_or_default();
    demo.say(&format!("{:?}; merge saw {merged}", status.state))?;
    Ok(())
}

/// The offline model of the adoption scene, scripted per prompt so its
/// answers read like a real model's (the schema fallback is conservative:
/// it never speaks and never promotes).
fn adoption_model() -> parlance_memory::OfflineLlm {
    use parlance_memory::{OfflineLlm, Reply, When};
    use serde_json::json;
    let prompt = |name: &str| When::PromptName(name.to_owned());
    OfflineLlm::new()
        .with_rule(
            prompt("onboarding_welcome"),
            Reply::json(&json!({
                "should_send": true,
                "timing_assessment": "Maya paused on the projects list after exploring.",
                "reasoning": "She has looked around but not created anything yet.",
                "workflow_completion": [{"workflow_id": "create_project", "status": "in_progress",
                    "confidence": 0.3, "evidence": "opened the new-project form"}],
                "onboarding_complete": false,
                "message": "You have found your way around the projects list. Create a project [TOUR:create_project] to get started. Ask me anything.",
                "suggested_flows": [{"tour_id": "create_project", "flow_name": "Create a project",
                    "short_description": "everything hangs off a project"}]
            })),
        )
        .with_rule(
            prompt("tour_match"),
            Reply::json(&json!({"primary_tour_id": "create_project", "related_tour_ids": ["invite_team"],
                "reasoning": "She wants to start a new project."})),
        )
        .with_rule(
            prompt("onboarding_followup"),
            Reply::json(&json!({
                "acknowledgement": "Your first project is ready.",
                "why_it_mattered": "Reports and invites build on it.",
                "suggested_flows": [{"tour_id": "invite_team", "flow_name": "Invite your team",
                    "short_description": "work on it together"}],
                "onboarding_complete": false,
                "reasoning": "invite_team is still outstanding."
            })),
        )
        .with_rule(
            prompt("adoption_judge"),
            Reply::json(&json!({"journey_state": "onboarded", "mastery_rating": 4,
                "mastery_level": "intermediate",
                "mastery_description": "Creates projects and shares reports on her own.",
                "reasoning": "She completed the core workflow and works without help."})),
        )
        .with_rule(
            prompt("session_summary"),
            Reply::text("You created your first project and shared a report. Inviting your team is the most useful next step."),
        )
}

/// User adoption: a new user explores, the explore-first gate opens, the
/// welcome suggests a tour, the tour completes and the judge promotes her.
/// The scene runs on its own service whose model is scripted.
async fn adoption_scene<W: Write>(demo: &mut Demo<W>) -> anyhow::Result<()> {
    use parlance_ports::Clock as _;
    use serde_json::json;
    let (mut c, clock) = demo_components();
    c.llm = Arc::new(adoption_model());
    let mut d = Demo::with_state(c.build(), clock, &mut demo.out);
    let base = "/v1/products/default";
    let user = format!("{base}/users/maya/adoption");
    d.scene("adoption: a new user, the explore-first gate, a welcome, a tour, the judge")?;
    d.say("the product's onboarding plan and tour catalog")?;
    let plan = json!({"workflows": [
        {"workflow_id": "create_project", "name": "Create a project", "why": "everything hangs off a project",
         "activity_signals": {"any_of": [{"event_type": "project_created"}]}},
        {"workflow_id": "invite_team", "name": "Invite your team", "why": "work together",
         "prerequisite_workflow_ids": ["create_project"]}
    ]});
    let (s, _) = d
        .call(
            Method::PUT,
            &format!("{base}/onboarding-plan"),
            Some(plan),
            true,
        )
        .await?;
    anyhow::ensure!(s == StatusCode::OK, "plan answered {s}");
    let tours = json!({"tours": [
        {"tour_id": "create_project", "name": "Create a project", "use_when": "start a new project"},
        {"tour_id": "invite_team", "name": "Invite your team", "use_when": "add colleagues"}
    ]});
    let (s, _) = d
        .call(
            Method::PUT,
            &format!("{base}/tour-catalog"),
            Some(tours),
            true,
        )
        .await?;
    anyhow::ensure!(s == StatusCode::OK, "catalog answered {s}");

    d.say("maya, an admin, explores three features")?;
    let batch = json!({"metadata": {"role": "admin"},
        "discovered_features": ["/dashboard", "/projects", "/reports"],
        "actions": [{"event_type": "$pageview", "canonical_url": "/projects/new", "title": "New project"}]});
    let (s, _) = d
        .call(Method::POST, &format!("{user}/activity"), Some(batch), true)
        .await?;
    anyhow::ensure!(s == StatusCode::OK, "activity answered {s}");

    d.say("20 s in, the gate is closed: the model is not asked")?;
    let (_, b) = d
        .call(
            Method::POST,
            &format!("{user}/welcome"),
            Some(json!({"seconds_on_app": 20})),
            true,
        )
        .await?;
    anyhow::ensure!(
        b["gate"]["code"] == "exploring_min_time_not_met" && b["llm"].is_null(),
        "gate: {b}"
    );

    d.clock().advance(std::time::Duration::from_secs(90));
    d.say("90 s later the gate opens and the welcome suggests a tour")?;
    let (_, b) = d
        .call(
            Method::POST,
            &format!("{user}/welcome"),
            Some(json!({"seconds_on_app": 110})),
            true,
        )
        .await?;
    anyhow::ensure!(
        b["applied"] == true
            && b["effects"][0]["suggested_flows"][0]["tour_id"] == "create_project",
        "welcome: {b}"
    );

    d.say("she asks how to start; tour matching picks from the catalog")?;
    let q = json!({"query": "how do I start a new project?", "user_id": "maya", "current_page": "/projects"});
    let (_, b) = d
        .call(Method::POST, &format!("{base}/tours/match"), Some(q), true)
        .await?;
    anyhow::ensure!(b["primary_tour_id"] == "create_project", "tour match: {b}");

    d.clock().advance(std::time::Duration::from_secs(120));
    d.say("she completes the tour; the follow-up suggests the next one")?;
    let (_, b) = d
        .call(
            Method::POST,
            &format!("{user}/followup"),
            Some(json!({"workflow_id": "create_project", "event": "completed"})),
            true,
        )
        .await?;
    anyhow::ensure!(
        b["state"]["onboarding"]["workflow_progress"]["create_project"]["status"] == "completed",
        "followup: {b}"
    );

    d.clock().advance(std::time::Duration::from_secs(600));
    d.say("the judge reads her activity and promotes her")?;
    let judge =
        json!({"activity": [{"event_type": "project_created"}, {"event_type": "report_shared"}]});
    let (_, b) = d
        .call(Method::POST, &format!("{user}/judge"), Some(judge), true)
        .await?;
    anyhow::ensure!(
        b["state"]["journey_state"] == "onboarded"
            && b["transitions"][0]["cause"] == "judge_adoption",
        "judge: {b}"
    );
    let (_, b) = d
        .call(Method::GET, &format!("{user}/prompt-block"), None, true)
        .await?;
    anyhow::ensure!(
        b["prompt_block"]
            .as_str()
            .is_some_and(|p| p.contains("journey: onboarded")),
        "block: {b}"
    );

    d.say("the session ends with a handover note for next time")?;
    let started = d.clock().now().as_epoch_seconds() - 810.0;
    let (_, b) = d
        .call(
            Method::POST,
            &format!("{user}/session-summary"),
            Some(json!({"session_id": "ses-1", "started_at": started})),
            true,
        )
        .await?;
    anyhow::ensure!(
        b["state"]["onboarding"]["summary"].is_string(),
        "summary: {b}"
    );
    d.say("an onboarded user is never interrupted by the welcome again")?;
    let (_, b) = d
        .call(
            Method::POST,
            &format!("{user}/welcome"),
            Some(json!({"seconds_on_app": 900})),
            true,
        )
        .await?;
    anyhow::ensure!(b["gate"]["code"] == "already_onboarded", "gate: {b}");
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
    let swept = crate::session::sweep_once(&demo.state().sessions, 100).await?;
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
    let swept = crate::session::sweep_once(&demo.state().sessions, 100).await?;
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
    // A worker runs the flows' task graphs off the durable queue.
    let worker = crate::worker::EmbeddedWorker::spawn(crate::worker::Worker::new(
        parlance_ports::WorkerId(uuid::Uuid::from_u128(1)),
        Arc::clone(&demo.state().shared.queue),
        demo.state().handlers(),
        Arc::clone(&demo.state().shared.clock),
        crate::worker::WorkerConfig {
            poll_every: std::time::Duration::from_millis(10),
            ..crate::worker::WorkerConfig::default()
        },
    ));
    let played = flow_steps(demo).await;
    worker.stop().await;
    played
}

async fn flow_steps<W: Write>(demo: &mut Demo<W>) -> anyhow::Result<()> {
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
