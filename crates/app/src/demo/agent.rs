//! The support agent's scene of `parlance demo`: a worry remembered across
//! sessions, a grounding exercise, a memory deletion with confirmation, and
//! a crisis message answered with resources from the operator's directory
//! while the model is down (the keyword classifier decides).

use std::io::Write;
use std::sync::Arc;

use axum::http::{Method, StatusCode};
use parlance_memory::{OfflineLlm, Reply, When};
use parlance_ports::LlmError;
use serde_json::{Value, json};

use super::{Demo, demo_components};
use crate::agent::AgentData;

const BASE: &str = "/v1/products/default/agent";

/// A model scripted for the scene.
fn model() -> OfflineLlm {
    let therapeutic = |style: &str, approach: &str, reply: &str| {
        Reply::json(
            &json!({"response_style": style, "therapeutic_approach": approach, "reply": reply}),
        )
    };
    OfflineLlm::new()
        .with_rule(
            When::PromptName("episodic_summary".into()),
            Reply::json(&json!({
                "summary": "Sam shared worries about upcoming exams and feeling unprepared.",
                "primary_themes": ["exams", "stress"],
                "approach_used": "cbt"
            })),
        )
        .with_rule(
            When::UserContains("end my life".into()),
            Reply::Error(LlmError::Unavailable {
                message: "the model server is down".into(),
                retry_after: None,
            }),
        )
        .with_rule(
            When::PromptName("crisis_gate".into()),
            Reply::json(&json!({
                "level": 0, "confidence": 0.9, "reason": "no sign of risk",
                "needs_crisis_response": false, "needs_clarification": false
            })),
        )
        .with_rule(
            When::Contains("User WORRIES_ABOUT exams".into()),
            therapeutic(
                "reflective",
                "cbt",
                "Last time you told me you were worried about your exams, and now they're almost here. \
                 It makes sense that sleep is hard. What thought keeps you awake the most?",
            ),
        )
        .with_rule(
            When::PromptName("therapeutic_reply".into()),
            therapeutic(
                "supportive",
                "cbt",
                "That sounds like a lot to carry. Exams can make everything feel urgent. \
                 What part worries you most?",
            ),
        )
        .with_rule(
            When::UserContains("worried about my exams".into()),
            Reply::json(&json!({"facts": [{
                "category": "school", "subject": "User", "predicate": "WORRIES_ABOUT",
                "object": "exams", "evidence_quote": "worried about my exams"
            }]})),
        )
        .with_rule(
            When::PromptName("memory_extraction".into()),
            Reply::json(&json!({"facts": []})),
        )
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("-")
}

async fn turn<W: Write>(demo: &mut Demo<W>, session: &str, message: &str) -> anyhow::Result<Value> {
    let body =
        json!({"message": message, "user_id": "sam", "session_id": session, "channel": "WEB"});
    let (status, out) = demo
        .request(Method::POST, &format!("{BASE}/turns"), Some(body))
        .await?;
    anyhow::ensure!(status == StatusCode::OK, "turn answered {status}: {out}");
    let style = s(&out["response_style"]).to_owned();
    let reply = s(&out["response_text"]).replace('\n', "\n      ");
    demo.say(&format!("agent ({style}): {reply}"))?;
    Ok(out)
}

/// Plays the scene on its own service, so its model can be scripted.
///
/// # Errors
///
/// When writing fails or the scene does not go as scripted.
pub(super) async fn scene<W: Write>(outer: &mut Demo<W>) -> anyhow::Result<()> {
    let (mut c, clock) = demo_components();
    c.llm = Arc::new(model());
    c.agent_data = AgentData::examples()?;
    let mut demo = Demo::with_state(c.build(), clock, outer.out());
    demo.scene("support agent: a worry remembered, a grounding exercise, a deletion, a crisis")?;
    demo.say("the operator's resource directory is the example file (not complete)")?;

    let first = turn(
        &mut demo,
        "monday",
        "I've been so worried about my exams next week",
    )
    .await?;
    demo.say(&format!(
        "memory extraction stored {} fact(s) with the user's own words as evidence",
        first["diagnostics"]["memory_facts_added"]
    ))?;
    let (status, ended) = demo
        .request(
            Method::POST,
            &format!("{BASE}/threads/monday/end"),
            Some(json!({"user_id": "sam"})),
        )
        .await?;
    anyhow::ensure!(status == StatusCode::CREATED, "end answered {status}");
    demo.say(&format!(
        "session ended; episodic summary: {}",
        s(&ended["entry"]["summary"])
    ))?;

    demo.say("a new session, days later:")?;
    let recalled = turn(
        &mut demo,
        "thursday",
        "My exams start tomorrow and I can't sleep",
    )
    .await?;
    anyhow::ensure!(
        s(&recalled["response_text"]).starts_with("Last time you told me"),
        "the worry was not recalled"
    );

    turn(&mut demo, "thursday", "Can we do a grounding exercise?").await?;
    for answer in [
        "my desk, a lamp, the window, a mug, my phone",
        "my sweater, the chair, the floor, my hair",
        "the fridge, a car outside, my breathing",
        "coffee and soap",
    ] {
        demo.say(&format!("user: {answer}"))?;
        turn(&mut demo, "thursday", answer).await?;
    }
    demo.say("user: toothpaste")?;
    let done = turn(&mut demo, "thursday", "toothpaste").await?;
    anyhow::ensure!(
        done["should_persist_memory"] == true,
        "the exercise did not complete"
    );

    turn(&mut demo, "thursday", "What do you remember about me?").await?;
    turn(
        &mut demo,
        "thursday",
        "Please forget what I said about my exams",
    )
    .await?;
    demo.say("the turn waits for the answer; user: yes")?;
    let (status, deleted) = demo
        .request(
            Method::POST,
            &format!("{BASE}/threads/thursday/resume"),
            Some(json!({"user_id": "sam", "value": "yes"})),
        )
        .await?;
    anyhow::ensure!(
        status == StatusCode::OK,
        "resume answered {status}: {deleted}"
    );
    demo.say(&format!(
        "agent ({}): {}",
        s(&deleted["response_style"]),
        s(&deleted["response_text"])
    ))?;
    let (_, memory) = demo
        .request(Method::GET, &format!("{BASE}/memory/sam"), None)
        .await?;
    let left = memory["entries"].as_array().map_or(0, Vec::len);
    demo.say(&format!(
        "deleted {} memories after the confirmation; {left} left",
        deleted["diagnostics"]["memories_deleted"]
    ))?;
    anyhow::ensure!(left == 0, "the deletion did not happen");

    demo.say("the model goes down; the user writes:")?;
    let crisis = turn(
        &mut demo,
        "thursday",
        "Honestly sometimes I want to end my life. I'm in London.",
    )
    .await?;
    demo.say(&format!(
        "crisis level {} via {}; resources: {}",
        crisis["crisis"]["level"],
        s(&crisis["diagnostics"]["crisis_classifier_path"]),
        s(&crisis["diagnostics"]["resource_lookup_status"])
    ))?;
    anyhow::ensure!(
        crisis["response_type"] == "crisis"
            && s(&crisis["response_text"]).contains("local emergency services")
            && s(&crisis["response_text"]).contains("Samaritans"),
        "the crisis message was not answered with resources"
    );
    let (_, log) = demo
        .request(Method::GET, &format!("{BASE}/crisis-log/sam"), None)
        .await?;
    demo.say(&format!(
        "crisis log: {} assessments recorded",
        log["records"].as_array().map_or(0, Vec::len)
    ))?;
    Ok(())
}
