//! The conversation scene of `parlance demo`: two conversations for one
//! contact (the second queued), an agent message, silence and a follow-up, a
//! hand-off to a human, an operator's message, completion, and the queued
//! conversation promoted.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use parlance_memory::{LoopbackChannel, OfflineLlm, Reply, When};
use serde_json::{Value, json};

use super::{Demo, demo_components};
use crate::conversation::sweep_once;
use crate::worker::{Worker, WorkerConfig};

/// A model scripted for the scene: the last contact message decides.
fn model() -> OfflineLlm {
    let send = |text: &str| Reply::tool_call("send_message", json!({ "text": text }));
    OfflineLlm::new()
        .with_rule(
            When::UserContains("tuesday".into()),
            Reply::tool_call(
                "end_conversation",
                json!({"outcome": "demo booked for Tuesday 10:00"}),
            ),
        )
        .with_rule(
            When::Contains("this is Ana".into()),
            send("Thanks, Ana. Which day suits you for the demo?"),
        )
        .with_rule(
            When::UserContains("person".into()),
            Reply::tool_call(
                "request_human",
                json!({"reason": "wants to talk pricing with a person"}),
            ),
        )
        .with_rule(
            When::PromptName("conversation_follow_up".into()),
            send("Just checking in: would a short demo this week help?"),
        )
        .with_rule(
            When::Any,
            send("Hi! I'm reaching out to book a 20-minute demo. When would suit you?"),
        )
}

/// Plays the scene on its own service, so its model can be scripted.
///
/// # Errors
///
/// When writing fails or the scene does not go as scripted.
pub(super) async fn scene<W: Write>(outer: &mut Demo<W>) -> anyhow::Result<()> {
    let (mut c, clock) = demo_components();
    c.llm = Arc::new(model());
    let channel = Arc::new(LoopbackChannel::new());
    c.channel = channel.clone();
    let state = c.build();
    let worker = state.worker(WorkerConfig::default());
    let mut demo = Demo::with_state(state.clone(), clock.clone(), outer.out());
    let base = "/v1/products/default/conversations";
    demo.scene("conversation: one contact, follow-ups, a human hand-off, a queued conversation")?;
    let create = json!({
        "contact_id": "+15550100",
        "objective": "book a product demo",
        "todos": ["find a day", "confirm the time"],
        "heartbeat_interval_s": 1800,
        "max_follow_ups": 2
    });
    let (s, first) = demo
        .request(Method::POST, base, Some(create.clone()))
        .await?;
    anyhow::ensure!(s == StatusCode::CREATED, "create answered {s}");
    let id = first["conversation"]["instance_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    demo.say(&format!(
        "first conversation: {}",
        text(&first["conversation"]["state"])
    ))?;
    let (_, second) = demo.request(Method::POST, base, Some(create)).await?;
    let queued = second["conversation"]["instance_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    demo.say(&format!(
        "second one for the same contact: {}",
        text(&second["conversation"]["state"])
    ))?;

    let mut delivered = 0;
    let mut step = |demo: &mut Demo<_>, note: &str| -> anyhow::Result<()> {
        for m in &channel.sent()[delivered..] {
            demo.say(&format!(
                "   delivered #{} ({:?}): {}",
                m.outbound_seq, m.role, m.text
            ))?;
        }
        delivered = channel.sent().len();
        Ok(demo.say(note)?)
    };
    drain(&worker).await?;
    let state_now = current(&mut demo, &format!("{base}/{id}")).await?;
    step(
        &mut demo,
        &format!("the agent wrote first; now {state_now}"),
    )?;

    clock.advance(Duration::from_secs(1800));
    let fired = sweep_once(&state.conversations).await?;
    drain(&worker).await?;
    let state_now = current(&mut demo, &format!("{base}/{id}")).await?;
    step(
        &mut demo,
        &format!(
            "30 minutes of silence: {fired} heartbeat fired, a follow-up went out; now {state_now}"
        ),
    )?;

    let reply = json!({"text": "Can I talk to a person about pricing first?"});
    demo.request(Method::POST, &format!("{base}/{id}/replies"), Some(reply))
        .await?;
    drain(&worker).await?;
    let state_now = current(&mut demo, &format!("{base}/{id}")).await?;
    step(
        &mut demo,
        &format!("the contact asked for a person; the agent handed off: {state_now}"),
    )?;

    let send =
        json!({"text": "Hi, this is Ana from sales: pricing is per seat, 20% off this month."});
    demo.request(Method::POST, &format!("{base}/{id}/send"), Some(send))
        .await?;
    drain(&worker).await?;
    let state_now = current(&mut demo, &format!("{base}/{id}")).await?;
    step(
        &mut demo,
        &format!("the operator answered and the agent went on: {state_now}"),
    )?;

    let reply = json!({"text": "Great, Tuesday at 10 works."});
    demo.request(Method::POST, &format!("{base}/{id}/replies"), Some(reply))
        .await?;
    drain(&worker).await?;
    let (_, done) = demo
        .request(Method::GET, &format!("{base}/{id}"), None)
        .await?;
    demo.say(&format!(
        "the agent ended it: {} ({})",
        text(&done["conversation"]["state"]),
        text(&done["conversation"]["outcome"])
    ))?;
    let state_now = current(&mut demo, &format!("{base}/{queued}")).await?;
    step(
        &mut demo,
        &format!("the queued conversation was promoted and has begun: {state_now}"),
    )?;
    anyhow::ensure!(
        done["conversation"]["state"] == "COMPLETED" && state_now == "WAITING_FOR_REPLY",
        "the conversation scene did not go as scripted"
    );
    Ok(())
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("-")
}

async fn drain(worker: &Worker) -> anyhow::Result<()> {
    while worker.step().await?.claimed > 0 {}
    Ok(())
}

async fn current<W: Write>(demo: &mut Demo<W>, path: &str) -> anyhow::Result<String> {
    let (_, body) = demo.request(Method::GET, path, None).await?;
    Ok(body["conversation"]["state"]
        .as_str()
        .unwrap_or("?")
        .to_owned())
}
