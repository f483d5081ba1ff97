//! A flow declared in YAML, loaded from a string and run in-process on the
//! in-memory flow store: no HTTP service, no worker.
//!
//! The flow asks for a name and an email address (checked by a declared
//! validator) and confirms. Each client event is decided by the flow
//! machine on the stored session and committed with the version it was
//! decided on; a refused event changes nothing. Run with
//! `cargo run -p parlance-examples --example yaml_flow`.

#![allow(clippy::print_stdout)] // an example prints what it shows

use std::collections::BTreeMap;
use std::sync::Arc;

use parlance_core::flow::{
    Actor, Flow, FlowCommand, FlowContext, FlowEffect, FlowKey, FlowRecord, FlowSessionId,
    RunnerOptions,
};
use parlance_core::{Machine, ProductId, Timestamp};
use parlance_memory::{MemoryAuditLog, MemoryFlowStore};
use parlance_ports::{Commit, FlowStore, MachineStore};

const FLOW: &str = r#"
name: signup
description: A name, an email address, then a confirmation.
initial: ask_name
model:
  name: null
  email: null
validators:
  email:
    regex: '^[^@\s]+@[^@\s]+\.[^@\s]+$'
    message: that does not look like an email address
states:
  - {id: ask_name, kind: user, template: ask_name.j2}
  - {id: ask_email, kind: user, template: ask_email.j2}
  - {id: done, kind: user, template: done.j2}
transitions:
  - event: user_input
    from: ask_name
    to: ask_email
    validators: [non_empty_input]
    assign: {name: actor_input}
  - event: user_input
    from: ask_email
    to: done
    validators: [email]
    assign: {email: actor_input}
"#;

/// Decides `command` on the session at `key` (creating it for a start),
/// commits the decision and returns the text the client is answered with.
async fn send(
    store: &MemoryFlowStore,
    ctx: &FlowContext,
    key: &FlowKey,
    command: FlowCommand,
    now: Timestamp,
) -> anyhow::Result<String> {
    let (record, decision, expected) = match store.load(key).await? {
        Some(stored) => {
            let mut record = stored.state;
            let decision = record.decide(ctx, &command, now)?;
            (record, decision, Some(stored.version))
        }
        None => {
            let (record, decision) = FlowRecord::create(key, ctx, &command, now)?
                .ok_or_else(|| anyhow::anyhow!("no session: start it first"))?;
            (record, decision, None)
        }
    };
    store
        .commit(Commit {
            key,
            expected,
            command: &command,
            state: &record,
            decision: &decision,
            now,
        })
        .await?;
    let answer = decision.effects.iter().find_map(|e| match e {
        FlowEffect::Respond(text) => Some(text.clone()),
        _ => None,
    });
    Ok(answer.unwrap_or_default())
}

fn user_input(text: &str, n: u32) -> FlowCommand {
    FlowCommand::Fire {
        event: "user_input".to_owned(),
        input: text.to_owned(),
        fresh_id: format!("run-{n}"),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let templates = BTreeMap::from([
        ("ask_name.j2".to_owned(), "What is your name?".to_owned()),
        (
            "ask_email.j2".to_owned(),
            "Hello {{ name }}! Which email address should we write to?".to_owned(),
        ),
        (
            "done.j2".to_owned(),
            "Thanks, {{ name }}: we will write to {{ email }}.".to_owned(),
        ),
    ]);
    let flow = Arc::new(Flow::from_file_text(FLOW, templates)?);
    let ctx = FlowContext::new(flow, RunnerOptions::default());
    let store = MemoryFlowStore::new(Arc::new(MemoryAuditLog::new()));
    let key = FlowKey::new(ProductId::parse("acme")?, FlowSessionId::parse("signup-1")?);
    let now = Timestamp::from_secs(1_767_225_600).expect("in range");

    let greeting = send(&store, &ctx, &key, FlowCommand::start(), now).await?;
    println!("assistant: {greeting}");
    assert_eq!(greeting, "What is your name?");

    let reply = send(&store, &ctx, &key, user_input("Ada", 1), now).await?;
    println!("user: Ada\nassistant: {reply}");
    assert_eq!(reply, "Hello Ada! Which email address should we write to?");

    // The validator refuses a bad address: nothing is stored.
    let refused = send(&store, &ctx, &key, user_input("ada at home", 2), now).await;
    let err = refused.expect_err("not an email address");
    println!("user: ada at home\nrefused: {err}");
    let session = store.session(&key).await?.expect("the session exists");
    assert_eq!(session.state.state, "ask_email");

    let reply = send(&store, &ctx, &key, user_input("ada@example.com", 3), now).await?;
    println!("user: ada@example.com\nassistant: {reply}");
    assert_eq!(reply, "Thanks, Ada: we will write to ada@example.com.");

    // What the store holds: the session in `done` with its model, and the
    // whole dialogue.
    let session = store.session(&key).await?.expect("the session exists");
    assert_eq!(session.state.state, "done");
    assert_eq!(session.state.model["email"], "ada@example.com");
    let dialogue = store.dialogue(&key).await?;
    let users = dialogue.iter().filter(|d| d.actor == Actor::User).count();
    println!(
        "stored: state {}, {} dialogue elements",
        session.state.state,
        dialogue.len()
    );
    assert_eq!(users, 2, "the refused input was not recorded");
    Ok(())
}
