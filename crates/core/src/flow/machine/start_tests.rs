//! Tests of how a session starts: the seed data and the user the initial
//! state's enter hooks and greeting see, and the ephemeral start that
//! creates the session and takes its first event in one decision.

use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::flow::{FlowBuilder, HookContext, HookPoint, HookScope, TemplateRef};

fn now() -> Timestamp {
    Timestamp::from_micros(1_767_225_600_000_000).unwrap()
}

fn key(id: &str) -> FlowKey {
    FlowKey::new(
        ProductId::parse("acme").unwrap(),
        FlowSessionId::parse(id).unwrap(),
    )
}

fn ada() -> User {
    serde_json::from_value(json!({
        "email": "ada@example.com", "firstname": "Ada", "lastname": "Lovelace",
        "custom_properties": {"team": "engines"}
    }))
    .unwrap()
}

/// `greet` (user, initial) --go--> `think` (invoker) --done--> `greet`;
/// `greet` --say--> `said` (user). The initial state's enter hook copies
/// the seed, its parse and the user's email into the model; the greeting
/// and `said` show what the render data holds.
fn ctx() -> FlowContext {
    let flow = FlowBuilder::new("seeded")
        .template(
            "greet.j2",
            "hi {{ user_info.name if user_info else 'nobody' }}, seed={{ seed_data }} \
             parsed={{ parsed_seed_data.n if parsed_seed_data else 'none' }}",
        )
        .template(
            "said.j2",
            "{{ actor_input }} seed={{ seed_data }} user={{ user_info.email }} copied={{ copied }}",
        )
        .template("think.j2", "{{ actor_input }}")
        .field("copied", Value::Null)
        .field("hooks", json!(0))
        .user_state("greet", "greet.j2")
        .user_state("said", "said.j2")
        .invoker_state("think", TemplateRef::Name("think.j2".into()), "template")
        .on("say", "greet", "said")
        .on("go", "greet", "think")
        .on("done", "think", "greet")
        .hook(
            HookPoint::Enter,
            HookScope::State("greet".into()),
            |h: &mut HookContext<'_>| {
                let s = &mut *h.session;
                let n = s.model["hooks"].as_i64().unwrap_or(0);
                s.model.insert("hooks".into(), json!(n + 1));
                if let Some(seed) = s.seed_data.clone() {
                    s.model.insert("copied".into(), Value::String(seed));
                }
                let email = s.user_info.as_ref().map(|u| u.email.to_string());
                s.model.insert("email".into(), json!(email));
                Ok(())
            },
        )
        .build()
        .unwrap();
    FlowContext::new(Arc::new(flow), RunnerOptions::default())
}

fn start_with(seed: Option<&str>, user: Option<User>) -> (FlowRecord, Decision<FlowRecord>) {
    let cmd = FlowCommand::Start {
        seed_data: seed.map(str::to_owned),
        user_info: user,
    };
    FlowRecord::create(&key("s1"), &ctx(), &cmd, now())
        .unwrap()
        .expect("start creates")
}

fn response(d: &Decision<FlowRecord>) -> Option<&str> {
    d.effects.iter().find_map(|e| match e {
        FlowEffect::Respond(t) => Some(t.as_str()),
        _ => None,
    })
}

fn ephemeral(event: &str, input: &str, user: Option<User>) -> FlowCommand {
    FlowCommand::StartEphemeral {
        user_info: user,
        event: event.into(),
        input: input.into(),
        fresh_id: "x".into(),
    }
}

#[test]
fn the_initial_enter_hooks_and_the_greeting_see_the_seed_which_is_then_cleared() {
    let (r, d) = start_with(Some(r#"{"n": 7}"#), Some(ada()));
    let s = r.session();
    assert_eq!(
        s.model["hooks"], 1,
        "the initial state's enter hook ran once"
    );
    assert_eq!(s.model["copied"], r#"{"n": 7}"#, "the hook saw the seed");
    assert_eq!(s.model["email"], "ada@example.com", "and the user");
    assert_eq!(
        response(&d),
        Some(r#"hi Ada Lovelace, seed={"n": 7} parsed=7"#),
        "the greeting sees the seed, its parse and the user's computed name"
    );
    assert_eq!(s.seed_data, None, "the seed is cleared after the start");
    assert_eq!(s.user_info, Some(ada()), "the user is kept");
    assert!(!s.ephemeral);
    let stored = serde_json::to_value(s).unwrap();
    assert!(stored.get("seed_data").is_none(), "never stored: {stored}");
    assert_eq!(stored["user_info"]["email"], "ada@example.com");
    let back: FlowSession = serde_json::from_value(stored).unwrap();
    assert_eq!(&back, s, "the session round-trips with its user");
}

#[test]
fn after_the_start_the_render_data_shows_the_user_and_no_seed() {
    let c = ctx();
    let (mut r, _) = start_with(Some("plain text"), Some(ada()));
    let data = c.flow.render_data(r.session(), r.dialogue(), now());
    assert_eq!(data["seed_data"], Value::Null);
    assert_eq!(data["parsed_seed_data"], Value::Null);
    assert_eq!(data["user_info"]["name"], "Ada Lovelace");
    assert_eq!(data["user_info"]["custom_properties"]["team"], "engines");
    let d = r
        .decide(
            &c,
            &FlowCommand::Fire {
                event: "say".into(),
                input: "yo".into(),
                fresh_id: "x".into(),
            },
            now(),
        )
        .unwrap();
    assert_eq!(
        response(&d),
        Some("yo seed=None user=ada@example.com copied=plain text")
    );
}

#[test]
fn without_seed_or_user_the_render_data_holds_nulls() {
    let (r, d) = start_with(None, None);
    assert_eq!(response(&d), Some("hi nobody, seed=None parsed=none"));
    assert_eq!(r.session().model["copied"], Value::Null);
    let data = ctx().flow.render_data(r.session(), r.dialogue(), now());
    for k in ["user_info", "seed_data", "parsed_seed_data"] {
        assert_eq!(data.get(k), Some(&Value::Null), "{k} is always there");
    }
    let stored = serde_json::to_value(r.session()).unwrap();
    assert!(stored.get("user_info").is_none() && stored.get("ephemeral").is_none());
}

#[test]
fn a_start_command_without_data_keeps_its_wire_form() {
    let v = serde_json::to_value(FlowCommand::start()).unwrap();
    assert_eq!(v, json!({"type": "start"}));
    let back: FlowCommand = serde_json::from_value(v).unwrap();
    assert_eq!(back, FlowCommand::start());
    let with = FlowCommand::Start {
        seed_data: Some("s".into()),
        user_info: Some(ada()),
    };
    let back: FlowCommand = serde_json::from_value(serde_json::to_value(&with).unwrap()).unwrap();
    assert_eq!(back, with);
    assert_eq!(ephemeral("go", "", None).name(), "start_ephemeral");
}

#[test]
fn an_ephemeral_start_runs_the_enter_hooks_then_takes_the_event_in_one_decision() {
    let c = ctx();
    let (r, d) = FlowRecord::create(&key("s1"), &c, &ephemeral("say", "yo", Some(ada())), now())
        .unwrap()
        .expect("creates");
    let s = r.session();
    assert_eq!(s.state, "said");
    assert!(s.ephemeral);
    assert_eq!(s.user_info, Some(ada()));
    assert_eq!(s.model["hooks"], 1, "the initial enter hook ran first");
    assert_eq!(s.model["email"], "ada@example.com");
    let trail: Vec<_> = d
        .transitions
        .iter()
        .map(|t| (t.from.as_deref(), t.to.as_ref(), t.cause.as_ref()))
        .collect();
    assert_eq!(
        trail,
        [
            (None, "greet", "start_session"),
            (Some("greet"), "said", "say")
        ]
    );
    assert_eq!(
        d.transitions[0].detail,
        json!({"flow": "seeded", "ephemeral": true})
    );
    for t in &d.transitions {
        assert!(
            c.flow.allows(t.from.as_deref(), &t.to, &t.cause),
            "{t:?} is in the table"
        );
    }
    // No greeting: the dialogue holds the event's two halves only.
    let events: Vec<(Actor, &str)> = r
        .dialogue()
        .iter()
        .map(|e| (e.actor, e.event.as_str()))
        .collect();
    assert_eq!(events, [(Actor::User, "say"), (Actor::Assistant, "say")]);
    assert_eq!(
        response(&d),
        Some("yo seed=None user=ada@example.com copied=None")
    );
}

#[test]
fn an_ephemeral_start_into_an_invoker_state_plans_its_dag() {
    let c = ctx();
    let (r, d) = FlowRecord::create(&key("s1"), &c, &ephemeral("go", "q", None), now())
        .unwrap()
        .expect("creates");
    assert_eq!(r.session().state, "think");
    assert!(r.session().running.is_some());
    assert_eq!(c.flow.next_actions(r.session()), ["poll"]);
    assert_eq!(d.tasks.len(), 1, "the DAG is enqueued with the creation");
    assert!(
        d.effects
            .iter()
            .any(|e| matches!(e, FlowEffect::Progress(p) if p.add_total > 0)),
        "its progress is written in the same commit"
    );
    assert_eq!(response(&d), None);
}

#[test]
fn a_refused_ephemeral_event_creates_nothing() {
    let c = ctx();
    for (event, input) in [("nope", ""), ("done", "x"), ("poll", "")] {
        let e = FlowRecord::create(&key("s1"), &c, &ephemeral(event, input, None), now())
            .expect_err("refused");
        assert_eq!(
            e,
            FlowError::not_allowed(event.to_owned(), "greet".to_owned(), None),
            "{event}"
        );
    }
}

#[test]
fn an_ephemeral_start_on_an_existing_session_is_not_allowed() {
    let c = ctx();
    let (mut r, _) = start_with(None, None);
    let before = r.clone();
    let e = r
        .decide(&c, &ephemeral("say", "x", None), now())
        .expect_err("refused");
    assert_eq!(e.reason(), Some(reason::SESSION_EXISTS));
    assert_eq!(r, before);
}
