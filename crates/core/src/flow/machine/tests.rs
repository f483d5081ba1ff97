//! Tests of the flow machine: every command through `decide`, refusals that
//! change nothing, and random command sequences.

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::flow::tests::small_flow;
use crate::flow::{
    Condition, FlowBuilder, HookPoint, MAX_DIALOGUE, StateKind, TemplateRef, TransitionDef,
    queue::{COMPLETE_KIND, ContextRef, INVOKE_KIND},
};
use crate::machine::{ErrorClass, MachineError, Task};

fn now() -> Timestamp {
    Timestamp::from_micros(1_767_225_600_000_000).unwrap()
}

fn key(id: &str) -> FlowKey {
    FlowKey::new(
        ProductId::parse("acme").unwrap(),
        FlowSessionId::parse(id).unwrap(),
    )
}

fn ctx(flow: Flow) -> FlowContext {
    FlowContext::new(Arc::new(flow), RunnerOptions::default())
}

/// `u` (user) --ask--> `i` (invoker) --advance--> `u`; `u` --user_input-->
/// `v` (user) --back--> `u`; `v` --hop--> `i`, then `i` --advance--> ...
fn flow() -> Flow {
    let mut gated = TransitionDef::new("user_input", "u", "v");
    gated.validators = vec!["non_empty_input".into()];
    FlowBuilder::new("t")
        .template("u.j2", "hello {{ actor_input }}")
        .template("v.j2", "v {{ actor_input }}")
        .template("i.j2", "prompt {{ actor_input }}")
        .user_state("u", "u.j2")
        .user_state("v", "v.j2")
        .invoker_state("i", TemplateRef::Name("i.j2".into()), "template")
        .transition(gated)
        .on("back", "v", "u")
        .on("ask", "u", "i")
        .on("advance", "i", "u")
        .build()
        .unwrap()
}

/// `u` --ask--> `i` (invoker) --advance--> `j` (invoker) --advance--> `u`,
/// `i` --on_error--> `oops` (user).
fn chain_flow() -> Flow {
    FlowBuilder::new("t")
        .template("u.j2", "u")
        .template("oops.j2", "sorry: {{ actor_input }}")
        .template("i.j2", "i")
        .template("j.j2", "j")
        .user_state("u", "u.j2")
        .user_state("oops", "oops.j2")
        .invoker_state("i", TemplateRef::Name("i.j2".into()), "template")
        .invoker_state("j", TemplateRef::Name("j.j2".into()), "template")
        .on("ask", "u", "i")
        .on("advance", "i", "j")
        .on("advance", "j", "u")
        .on("on_error", "i", "oops")
        .on("again", "oops", "u")
        .build()
        .unwrap()
}

fn start(c: &FlowContext) -> FlowRecord {
    FlowRecord::create(&key("s1"), c, &FlowCommand::start(), now())
        .unwrap()
        .expect("start creates")
        .0
}

fn fire(event: &str, input: &str, fresh: &str) -> FlowCommand {
    FlowCommand::Fire {
        event: event.into(),
        input: input.into(),
        fresh_id: fresh.into(),
    }
}

fn complete(invocation: &str, result: &str, fresh: &str) -> FlowCommand {
    FlowCommand::Complete {
        invocation_id: invocation.into(),
        result: result.into(),
        fresh_id: fresh.into(),
    }
}

fn fail(invocation: &str, message: &str, fresh: &str) -> FlowCommand {
    FlowCommand::Fail {
        error: TaskError {
            invocation_id: invocation.into(),
            task: "0".into(),
            message: message.into(),
        },
        fresh_id: fresh.into(),
    }
}

/// Decides `cmd`, which must be accepted.
fn ok(r: &mut FlowRecord, c: &FlowContext, cmd: &FlowCommand) -> Decision<FlowRecord> {
    r.decide(c, cmd, now())
        .unwrap_or_else(|e| panic!("{cmd:?} refused: {e}"))
}

/// Decides `cmd`, which must be refused with the record left as it was.
fn refused(r: &mut FlowRecord, c: &FlowContext, cmd: &FlowCommand) -> FlowError {
    let before = r.clone();
    let e = r.decide(c, cmd, now()).expect_err("refused");
    assert_eq!(*r, before, "a refusal changes nothing");
    e
}

fn not_allowed(command: &str, state: &str, reason: Option<&'static str>) -> FlowError {
    FlowError::not_allowed(command.to_owned(), state.to_owned(), reason)
}

/// `(from, to, cause)` of each transition.
fn trail(d: &Decision<FlowRecord>) -> Vec<(Option<String>, String, String)> {
    d.transitions
        .iter()
        .map(|t| {
            (
                t.from.as_deref().map(str::to_owned),
                t.to.to_string(),
                t.cause.to_string(),
            )
        })
        .collect()
}

fn step(from: &str, to: &str, cause: &str) -> (Option<String>, String, String) {
    (Some(from.to_owned()), to.to_owned(), cause.to_owned())
}

fn appended(d: &Decision<FlowRecord>) -> Vec<(Actor, Option<String>)> {
    d.effects
        .iter()
        .filter_map(|e| match e {
            FlowEffect::Dialogue(el) => Some((el.actor, el.actor_text.clone())),
            _ => None,
        })
        .collect()
}

fn progress(d: &Decision<FlowRecord>) -> Vec<ProgressUpdate> {
    d.effects
        .iter()
        .filter_map(|e| match e {
            FlowEffect::Progress(p) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

fn response(d: &Decision<FlowRecord>) -> Option<&str> {
    d.effects.iter().find_map(|e| match e {
        FlowEffect::Respond(t) => Some(t.as_str()),
        _ => None,
    })
}

fn dags(d: &Decision<FlowRecord>) -> Vec<&crate::queue::DagSpec> {
    d.tasks
        .iter()
        .map(|t| match t {
            Task::Dag(spec) => spec,
            Task::One(t) => panic!("a flow enqueues DAGs only, not {t:?}"),
        })
        .collect()
}

fn progress_of(chain: &str, total: i64, done: i64, label: Option<&str>) -> ProgressUpdate {
    ProgressUpdate {
        chain_id: chain.into(),
        add_total: total,
        add_done: done,
        label: label.map(str::to_owned),
    }
}

#[test]
fn start_creates_the_session_with_its_greeting() {
    let c = ctx(flow());
    let (r, d) = FlowRecord::create(&key("s1"), &c, &FlowCommand::start(), now())
        .unwrap()
        .unwrap();
    assert_eq!(r.key(), key("s1"));
    assert_eq!(r.session().state, "u");
    assert_eq!(r.session().flow, "t");
    assert_eq!(r.state_name(), "u");
    assert!(d.changed);
    assert_eq!(
        d.transitions,
        [Transition::created("u", "start_session").with_detail(json!({"flow": "t"}))]
    );
    assert_eq!(appended(&d), [(Actor::Assistant, Some("hello ".into()))]);
    assert_eq!(response(&d), Some("hello "));
    assert!(d.tasks.is_empty());
    assert_eq!(r.dialogue().len(), 1);
    assert_eq!(r.last_response(), Some("hello "));
    assert_eq!(d.next_deadline, None);
    assert_eq!(r.next_deadline(&c), None);
}

#[test]
fn only_start_creates_a_session() {
    let c = ctx(flow());
    for cmd in [
        fire("ask", "q", "x"),
        FlowCommand::Cancel,
        FlowCommand::Retry {
            fresh_id: "x".into(),
        },
        complete("i-x", "r", "y"),
        fail("i-x", "boom", "y"),
    ] {
        assert_eq!(
            FlowRecord::create(&key("s1"), &c, &cmd, now()).unwrap(),
            None,
            "{cmd:?}"
        );
    }
}

#[test]
fn start_on_an_existing_session_is_not_allowed() {
    let c = ctx(flow());
    let mut r = start(&c);
    let e = refused(&mut r, &c, &FlowCommand::start());
    assert_eq!(e, not_allowed("start", "u", Some(reason::SESSION_EXISTS)));
    assert_eq!(e.class(), ErrorClass::NotAllowed);
}

#[test]
fn fire_user_to_user_records_both_halves_and_answers() {
    let c = ctx(flow());
    let mut r = start(&c);
    let d = ok(&mut r, &c, &fire("user_input", "hi", "x"));
    assert_eq!(trail(&d), [step("u", "v", "user_input")]);
    assert_eq!(d.transitions[0].detail, json!({"flow": "t"}));
    assert_eq!(
        appended(&d),
        [
            (Actor::User, Some("hi".into())),
            (Actor::Assistant, Some("v hi".into()))
        ]
    );
    assert_eq!(response(&d), Some("v hi"));
    assert!(d.tasks.is_empty() && progress(&d).is_empty());
    assert_eq!(r.session().state, "v");
    assert_eq!(r.dialogue().len(), 3, "the record holds what was appended");
}

#[test]
fn fire_user_to_invoker_enqueues_the_dag_with_its_progress() {
    let c = ctx(flow());
    let mut r = start(&c);
    let d = ok(&mut r, &c, &fire("ask", "q", "x"));
    assert_eq!(trail(&d), [step("u", "i", "ask")]);
    assert_eq!(appended(&d), [(Actor::User, Some("q".into()))]);
    assert_eq!(response(&d), None);
    let running = r.session().running.clone().expect("a DAG runs");
    assert_eq!(running.invocation_id, "i-x");
    assert_eq!(running.dag_id, None, "the store assigns it");
    let [spec] = dags(&d)[..] else {
        panic!("one DAG")
    };
    assert_eq!(spec.product_id.as_str(), "acme");
    let kinds: Vec<&str> = spec.nodes.iter().map(|n| n.kind.as_str()).collect();
    assert_eq!(kinds, [INVOKE_KIND, COMPLETE_KIND]);
    assert_eq!(spec.nodes[0].payload["session_id"], "s1");
    assert_eq!(spec.nodes[0].payload["invocation_id"], "i-x");
    assert_eq!(spec.nodes[0].max_attempts, 3);
    assert_eq!(progress(&d), [progress_of("i-x", 2, 0, Some("i"))]);
}

#[test]
fn runner_options_reach_the_enqueued_nodes() {
    let c = FlowContext::new(
        Arc::new(flow()),
        RunnerOptions {
            attempts: 7,
            task_timeout: std::time::Duration::from_secs(1),
        },
    );
    let mut r = start(&c);
    let d = ok(&mut r, &c, &fire("ask", "q", "x"));
    assert!(dags(&d)[0].nodes.iter().all(|n| n.max_attempts == 7));
    assert_eq!(dags(&d)[0].nodes[0].payload["timeout_ms"], 1000);
}

#[test]
fn fire_refusals_change_nothing() {
    let c = ctx(flow());
    let mut r = start(&c);
    let e = refused(&mut r, &c, &fire("nope", "", "x"));
    assert_eq!(e, not_allowed("nope", "u", None));
    assert_eq!(e.to_string(), "event `nope` is not allowed in state `u`");
    assert_eq!(e.not_allowed().map(|n| n.command.as_ref()), Some("nope"));

    let e = refused(&mut r, &c, &fire("user_input", "  ", "x"));
    assert_eq!(e.class(), ErrorClass::Invalid);
    assert_eq!(e.field(), Some("event_input"));

    ok(&mut r, &c, &fire("ask", "q", "x"));
    let e = refused(&mut r, &c, &fire("advance", "fake", "y"));
    assert_eq!(
        e,
        not_allowed("advance", "i", Some(reason::RESERVED_FOR_ENGINE))
    );
    let e = refused(&mut r, &c, &fire("back", "", "y"));
    assert_eq!(e, not_allowed("back", "i", Some(reason::DAG_RUNNING)));
    assert_eq!(e.class(), ErrorClass::NotAllowed);
}

#[test]
fn a_full_dialogue_is_a_limit() {
    let c = ctx(flow());
    let r = start(&c);
    let (product, session, dialogue) = r.into_parts();
    let full = vec![dialogue[0].clone(); MAX_DIALOGUE];
    let mut r = FlowRecord::from_parts(product, session, full);
    let e = refused(&mut r, &c, &fire("user_input", "hi", "x"));
    assert_eq!(e, FlowError::DialogueFull { len: MAX_DIALOGUE });
    assert_eq!(e.class(), ErrorClass::LimitExceeded);
}

#[test]
fn cancel_returns_to_the_last_user_state_and_stops_the_run() {
    let c = ctx(flow());
    let mut r = start(&c);
    ok(&mut r, &c, &fire("ask", "q", "x"));
    r.set_dag_id(42);
    let running = r.session().running.clone().unwrap();
    assert_eq!(running.dag_id, Some(42));
    let d = ok(&mut r, &c, &FlowCommand::Cancel);
    assert_eq!(trail(&d), [step("i", "u", "cancel")]);
    assert_eq!(
        d.effects,
        [
            FlowEffect::Respond("hello ".into()),
            FlowEffect::CancelRun(running)
        ]
    );
    assert!(d.tasks.is_empty());
    assert_eq!(r.session().running, None);
    assert_eq!(r.session().state, "u");

    let e = refused(&mut r, &c, &FlowCommand::Cancel);
    assert_eq!(e, not_allowed("cancel", "u", Some(reason::NOTHING_RUNNING)));
    // The late result of the cancelled run is refused as stale.
    let e = refused(&mut r, &c, &complete("i-x", "late", "y"));
    assert_eq!(
        e,
        not_allowed("complete", "u", Some(reason::STALE_INVOCATION))
    );
}

#[test]
fn set_dag_id_needs_a_running_dag() {
    let c = ctx(flow());
    let mut r = start(&c);
    let before = r.clone();
    r.set_dag_id(1);
    assert_eq!(r, before);
}

#[test]
fn complete_to_a_user_state_renders_and_counts_the_completion() {
    let c = ctx(flow());
    let mut r = start(&c);
    ok(&mut r, &c, &fire("ask", "q", "x"));
    let d = ok(&mut r, &c, &complete("i-x", "the answer", "y"));
    assert_eq!(trail(&d), [step("i", "u", "dag_completed")]);
    assert_eq!(
        appended(&d),
        [(Actor::Assistant, Some("hello the answer".into()))]
    );
    assert_eq!(response(&d), Some("hello the answer"));
    assert_eq!(progress(&d), [progress_of("i-x", 0, 1, None)]);
    assert!(d.tasks.is_empty());
    assert_eq!(r.session().running, None);
}

#[test]
fn complete_to_an_invoker_state_continues_the_chain() {
    let c = ctx(chain_flow());
    let mut r = start(&c);
    ok(&mut r, &c, &fire("ask", "q", "x"));
    let d = ok(&mut r, &c, &complete("i-x", "r1", "y"));
    assert_eq!(trail(&d), [step("i", "j", "dag_completed")]);
    assert!(appended(&d).is_empty());
    assert_eq!(dags(&d).len(), 1);
    assert_eq!(progress(&d), [progress_of("i-x", 2, 1, Some("j"))]);
    let running = r.session().running.clone().unwrap();
    assert_eq!(
        (running.invocation_id.as_str(), running.chain_id.as_str()),
        ("j-y", "i-x")
    );
    let d = ok(&mut r, &c, &complete("j-y", "r2", "z"));
    assert_eq!(trail(&d), [step("j", "u", "dag_completed")]);
    assert_eq!(progress(&d), [progress_of("i-x", 0, 1, None)]);
}

#[test]
fn a_rejected_result_stays_with_an_error_and_retry_runs_again() {
    let mut only_yes = TransitionDef::new("advance", "i", "u");
    only_yes.cond = vec![Condition::Expr("actor_input == 'yes'".into())];
    let c = ctx(FlowBuilder::new("t")
        .template("u.j2", "u")
        .template("i.j2", "i")
        .user_state("u", "u.j2")
        .invoker_state("i", TemplateRef::Name("i.j2".into()), "template")
        .on("ask", "u", "i")
        .transition(only_yes)
        .build()
        .unwrap());
    let mut r = start(&c);
    ok(&mut r, &c, &fire("ask", "q", "x"));
    let d = ok(&mut r, &c, &complete("i-x", "no", "y"));
    assert_eq!(trail(&d), [step("i", "i", "dag_completed")]);
    assert!(d.tasks.is_empty(), "never re-runs on its own");
    assert_eq!(progress(&d), [progress_of("i-x", 0, 1, None)]);
    assert_eq!(r.session().errors.len(), 1);
    assert_eq!(r.session().errors[0].task, "complete");

    let d = ok(
        &mut r,
        &c,
        &FlowCommand::Retry {
            fresh_id: "z".into(),
        },
    );
    assert_eq!(trail(&d), [step("i", "i", "retry")]);
    assert_eq!(dags(&d).len(), 1);
    assert_eq!(progress(&d), [progress_of("i-z", 2, 0, Some("i"))]);
    assert_eq!(r.session().running.as_ref().unwrap().invocation_id, "i-z");

    let e = refused(
        &mut r,
        &c,
        &FlowCommand::Retry {
            fresh_id: "w".into(),
        },
    );
    assert_eq!(e, not_allowed("retry", "i", Some(reason::DAG_RUNNING)));
    let d = ok(&mut r, &c, &complete("i-z", "yes", "w"));
    assert_eq!(trail(&d), [step("i", "u", "dag_completed")]);
    assert!(r.session().errors.is_empty(), "cleared by the transition");
}

#[test]
fn retry_is_not_offered_in_a_user_state() {
    let c = ctx(flow());
    let mut r = start(&c);
    let e = refused(
        &mut r,
        &c,
        &FlowCommand::Retry {
            fresh_id: "x".into(),
        },
    );
    assert_eq!(
        e,
        not_allowed("retry", "u", Some(reason::RETRY_NOT_OFFERED))
    );
    assert_eq!(e.to_string(), "nothing to retry in state `u`");
}

#[test]
fn fail_follows_on_error_when_declared() {
    let c = ctx(chain_flow());
    let mut r = start(&c);
    ok(&mut r, &c, &fire("ask", "q", "x"));
    let d = ok(&mut r, &c, &fail("i-x", "timed out", "y"));
    assert_eq!(trail(&d), [step("i", "oops", "dag_failed")]);
    assert_eq!(response(&d), Some("sorry: timed out"));
    assert!(progress(&d).is_empty(), "a failed task is not counted done");
    assert_eq!(r.session().errors[0].message, "timed out");
}

#[test]
fn fail_without_on_error_stays_and_offers_retry() {
    let c = ctx(flow());
    let mut r = start(&c);
    ok(&mut r, &c, &fire("ask", "q", "x"));
    let e = refused(&mut r, &c, &fail("i-other", "boom", "y"));
    assert_eq!(e, not_allowed("fail", "i", Some(reason::STALE_INVOCATION)));
    let d = ok(&mut r, &c, &fail("i-x", "boom", "y"));
    assert_eq!(trail(&d), [step("i", "i", "dag_failed")]);
    assert!(d.effects.is_empty() && d.tasks.is_empty());
    assert_eq!(r.session().running, None);
    assert_eq!(c.flow.next_actions(r.session()), ["retry"]);
}

#[test]
fn a_stale_completion_is_not_allowed() {
    let c = ctx(flow());
    let mut r = start(&c);
    let e = refused(&mut r, &c, &complete("i-x", "r", "y"));
    assert_eq!(
        e,
        not_allowed("complete", "u", Some(reason::STALE_INVOCATION))
    );
    ok(&mut r, &c, &fire("ask", "q", "x"));
    refused(&mut r, &c, &complete("i-other", "r", "y"));
}

/// A `cond` on `u --go--> v` and an `assign` on `v --set--> u`, both over
/// the event's input.
fn expression_flow() -> Flow {
    let mut go = TransitionDef::new("go", "u", "v");
    go.cond = vec![Condition::Expr("actor_input + 1 > 0".into())];
    let mut set = TransitionDef::new("set", "v", "u");
    set.assign = vec![("n".into(), "parsed_actor_input.n + 1".into())];
    FlowBuilder::new("t")
        .template("u.j2", "u {{ n }}")
        .template("v.j2", "v")
        .user_state("u", "u.j2")
        .user_state("v", "v.j2")
        .field("n", json!(0))
        .transition(go)
        .transition(set)
        .on("skip", "u", "v")
        .build()
        .unwrap()
}

#[test]
fn an_expression_failing_at_run_time_is_an_invalid_refusal() {
    let c = ctx(expression_flow());
    let mut r = start(&c);
    let e = refused(&mut r, &c, &fire("go", "text", "x"));
    assert!(
        matches!(&e, FlowError::Expression { expr, .. } if expr == "actor_input + 1 > 0"),
        "{e:?}"
    );
    assert_eq!(e.class(), ErrorClass::Invalid);
    ok(&mut r, &c, &fire("skip", "", "x"));
    let e = refused(&mut r, &c, &fire("set", "{\"n\": \"a\"}", "x"));
    assert_eq!(e.class(), ErrorClass::Invalid, "{e:?}");
    let d = ok(&mut r, &c, &fire("set", "{\"n\": 41}", "x"));
    assert_eq!(response(&d), Some("u 42"));
}

#[test]
fn a_template_failing_at_run_time_is_invalid() {
    let c = ctx(FlowBuilder::new("t")
        .template("a.j2", "a")
        .template("b.j2", "{{ [1] | map(actor_input) | list }}")
        .user_state("a", "a.j2")
        .user_state("b", "b.j2")
        .on("go", "a", "b")
        .build()
        .unwrap());
    let mut r = start(&c);
    // A filter named by the input: unknown, found when it runs.
    let e = refused(&mut r, &c, &fire("go", "no_such_filter", "x"));
    assert!(matches!(&e, FlowError::Template { what, .. } if what == "b.j2"));
    assert_eq!(e.class(), ErrorClass::Invalid);
}

#[test]
fn a_session_of_another_flow_is_refused() {
    let c = ctx(flow());
    let mut r = start(&c);
    let other = ctx(FlowBuilder::new("other")
        .template("a.j2", "a")
        .user_state("u", "a.j2")
        .build()
        .unwrap());
    let e = refused(&mut r, &other, &fire("ask", "q", "x"));
    assert_eq!(e.class(), ErrorClass::Internal);
    assert_eq!(e.to_string(), "the session runs flow `t`, not `other`");
}

#[test]
fn every_error_has_its_class() {
    let classes = [
        (FlowError::Invalid(Vec::new()), ErrorClass::Internal),
        (not_allowed("go", "a", None), ErrorClass::NotAllowed),
        (
            FlowError::Validator {
                validator: "v".into(),
                message: "m".into(),
            },
            ErrorClass::Invalid,
        ),
        (
            FlowError::Hook {
                point: HookPoint::Before,
                message: "m".into(),
            },
            ErrorClass::Invalid,
        ),
        (
            FlowError::RenderLimit {
                what: "t".into(),
                limit: "1".into(),
            },
            ErrorClass::LimitExceeded,
        ),
        (
            FlowError::DialogueFull { len: 1 },
            ErrorClass::LimitExceeded,
        ),
        (
            FlowError::Expression {
                expr: "e".into(),
                message: "m".into(),
            },
            ErrorClass::Invalid,
        ),
        (
            FlowError::Render {
                what: "t".into(),
                message: "m".into(),
            },
            ErrorClass::Internal,
        ),
        (
            FlowError::OtherFlow {
                session: "a".into(),
                flow: "b".into(),
            },
            ErrorClass::Internal,
        ),
    ];
    for (e, class) in classes {
        assert_eq!(e.class(), class, "{e:?}");
        assert_eq!(e.not_allowed().is_some(), class == ErrorClass::NotAllowed);
        assert!(!e.to_string().ends_with('.'), "{e}");
    }
}

#[test]
fn not_allowed_messages_name_the_reason() {
    let cases = [
        (
            not_allowed("go", "i", Some(reason::DAG_RUNNING)),
            "a task graph is running in state `i`; poll or cancel",
        ),
        (
            not_allowed("advance", "i", Some(reason::RESERVED_FOR_ENGINE)),
            "event `advance` is fired by the engine when the task graph finishes",
        ),
        (
            not_allowed("cancel", "u", Some(reason::NOTHING_RUNNING)),
            "no task graph is running in state `u`",
        ),
        (
            not_allowed("complete", "u", Some(reason::STALE_INVOCATION)),
            "`complete` names a task graph that is not running in state `u`",
        ),
        (
            not_allowed("start", "u", Some(reason::SESSION_EXISTS)),
            "the session exists already",
        ),
    ];
    for (e, message) in cases {
        assert_eq!(e.to_string(), message);
        assert_eq!(e.reason(), e.not_allowed().and_then(|n| n.reason));
    }
}

#[test]
fn client_events_are_parsed_once() {
    assert_eq!(ClientEvent::parse("poll"), ClientEvent::Poll);
    assert_eq!(ClientEvent::parse("cancel"), ClientEvent::Cancel);
    assert_eq!(ClientEvent::parse("retry"), ClientEvent::Retry);
    assert_eq!(
        ClientEvent::parse("user_input"),
        ClientEvent::Flow("user_input".into())
    );
    for e in ["poll", "cancel", "retry", "user_input"] {
        assert_eq!(ClientEvent::parse(e).as_str(), e);
    }
    assert_eq!(ClientEvent::Poll.into_command("x", "1".into()), None);
    assert_eq!(
        ClientEvent::Cancel.into_command("x", "1".into()),
        Some(FlowCommand::Cancel)
    );
    assert_eq!(
        ClientEvent::Retry.into_command("x", "1".into()),
        Some(FlowCommand::Retry {
            fresh_id: "1".into()
        })
    );
    assert_eq!(
        ClientEvent::parse("go").into_command("x", "1".into()),
        Some(fire("go", "x", "1"))
    );
}

#[test]
fn commands_are_tagged_data() {
    let cmds = [
        FlowCommand::start(),
        fire("go", "x", "1"),
        FlowCommand::Cancel,
        FlowCommand::Retry {
            fresh_id: "1".into(),
        },
        complete("i-1", "r", "2"),
        fail("i-1", "boom", "2"),
    ];
    let names: Vec<&str> = cmds.iter().map(Command::name).collect();
    assert_eq!(
        names,
        ["start", "fire", "cancel", "retry", "complete", "fail"]
    );
    for cmd in cmds {
        let v = serde_json::to_value(&cmd).unwrap();
        assert_eq!(v["type"], cmd.name());
        assert_eq!(serde_json::from_value::<FlowCommand>(v).unwrap(), cmd);
    }
}

#[test]
fn session_ids_are_validated() {
    assert!(FlowSessionId::parse("0b9f-4c_2.x").is_ok());
    assert!(FlowSessionId::parse("").is_err());
    assert!(FlowSessionId::parse("a/b").is_err());
    assert!(FlowSessionId::parse("a b").is_err());
    assert!(FlowSessionId::parse("x".repeat(129)).is_err());
    let id = FlowSessionId::from_uuid(uuid::Uuid::from_u128(2));
    assert_eq!(id.as_str(), "00000000-0000-0000-0000-000000000002");
    assert_eq!(FlowSessionId::parse(id.as_str()), Ok(id));
    assert!(serde_json::from_str::<FlowSessionId>("\"a/b\"").is_err());
}

#[test]
fn the_key_names_product_and_session() {
    let k = key("s1");
    assert_eq!(k.product_id().as_str(), "acme");
    assert_eq!(k.entity_id(), "s1");
    assert_eq!(FlowRecord::KIND, EntityKind::Flow);
}

#[test]
fn the_table_holds_declared_and_engine_edges() {
    let f = chain_flow();
    assert!(f.allows(None, "u", cause::START));
    assert!(!f.allows(None, "i", cause::START));
    assert!(f.allows(Some("u"), "i", "ask"));
    assert!(!f.allows(Some("u"), "j", "ask"));
    assert!(f.allows(Some("i"), "j", cause::DAG_COMPLETED));
    assert!(f.allows(Some("i"), "i", cause::DAG_COMPLETED));
    assert!(!f.allows(Some("i"), "oops", cause::DAG_COMPLETED));
    assert!(f.allows(Some("i"), "oops", cause::DAG_FAILED));
    assert!(f.allows(Some("j"), "j", cause::DAG_FAILED));
    assert!(!f.allows(Some("j"), "oops", cause::DAG_FAILED));
    assert!(f.allows(Some("j"), "u", cause::CANCEL));
    assert!(!f.allows(Some("u"), "u", cause::CANCEL));
    assert!(f.allows(Some("j"), "j", cause::RETRY));
    assert!(!f.allows(Some("u"), "u", cause::RETRY));
}

/// The render data the engine plans `cmd`'s DAG with on `before`, if it
/// plans one.
fn planned_context(
    c: &FlowContext,
    before: &FlowRecord,
    cmd: &FlowCommand,
) -> Option<serde_json::Value> {
    let (s, d, f) = (before.session(), before.dialogue(), &c.flow);
    let fired = match cmd {
        FlowCommand::Fire {
            event,
            input,
            fresh_id,
        } => f.fire(s, d, event, input, fresh_id, now()),
        FlowCommand::Retry { fresh_id } => f.retry(s, d, fresh_id, now()),
        FlowCommand::Complete {
            invocation_id,
            result,
            fresh_id,
        } => f.complete(s, d, invocation_id, result, fresh_id, now()),
        FlowCommand::Fail { error, fresh_id } => f.fail(s, d, error.clone(), fresh_id, now()),
        FlowCommand::Start { .. } | FlowCommand::StartEphemeral { .. } | FlowCommand::Cancel => {
            return None;
        }
    };
    fired.ok()?.dag.map(|plan| plan.context)
}

/// The render data each node of `spec` (and each map's elements) names,
/// rebuilt from the stored record `r` as a worker does.
fn rebuilt_contexts(
    c: &FlowContext,
    r: &FlowRecord,
    spec: &crate::queue::DagSpec,
) -> Vec<serde_json::Value> {
    let payloads = spec
        .nodes
        .iter()
        .flat_map(|n| std::iter::once(&n.payload).chain(n.map.as_ref().map(|m| &m.payload)));
    payloads
        .filter_map(|p| p.get("context_ref"))
        .map(|v| {
            let cr: ContextRef = serde_json::from_value(v.clone()).expect("a context reference");
            let len = usize::try_from(cr.dialogue_len).unwrap();
            assert!(len <= r.dialogue().len(), "the stored dialogue holds it");
            c.flow.render_data(
                r.session(),
                &r.dialogue()[..len],
                cr.planned_at().expect("a time"),
            )
        })
        .collect()
}

#[test]
fn nodes_name_the_planned_context_and_the_record_gives_it_back() {
    let c = ctx(chain_flow());
    let mut r = start(&c);
    let mut commands = vec![fire("ask", "first question", "x")];
    commands.push(complete("i-x", "r1", "y"));
    commands.push(fail("j-y", "down", "z"));
    commands.push(FlowCommand::Retry {
        fresh_id: "w".into(),
    });
    let mut planned_dags = 0;
    for cmd in commands {
        let before = r.clone();
        let d = ok(&mut r, &c, &cmd);
        let Some(planned) = planned_context(&c, &before, &cmd) else {
            assert!(d.tasks.is_empty(), "{cmd:?}");
            continue;
        };
        planned_dags += 1;
        let [spec] = dags(&d)[..] else {
            panic!("one DAG")
        };
        for node in spec.nodes.iter().filter(|n| n.kind == INVOKE_KIND) {
            assert!(node.payload.get("context").is_none(), "no copy of the data");
        }
        let rebuilt = rebuilt_contexts(&c, &r, spec);
        assert_eq!(rebuilt.len(), 1, "{cmd:?}");
        assert_eq!(rebuilt[0], planned, "{cmd:?}");
    }
    assert_eq!(planned_dags, 3, "ask, the hop and the retry");
}

#[test]
fn node_payloads_do_not_grow_with_the_dialogue() {
    let c = ctx(flow());
    let mut r = start(&c);
    let input = "x".repeat(10_000);
    let mut sizes = Vec::new();
    for n in 0..20 {
        let d = ok(&mut r, &c, &fire("ask", &input, &format!("{n:02}")));
        let bytes: usize = dags(&d)[0]
            .nodes
            .iter()
            .map(|node| serde_json::to_vec(&node.payload).unwrap().len())
            .sum();
        sizes.push(bytes);
        ok(&mut r, &c, &complete(&format!("i-{n:02}"), "r", "-"));
    }
    assert!(r.dialogue().len() > 40, "the dialogue grew");
    assert!(sizes[0] < 1_000, "the payloads hold no input: {sizes:?}");
    assert!(
        sizes[19] <= sizes[0] + 8,
        "payloads stay the same size: {sizes:?}"
    );
}

// Random small flows and random command sequences.

const EVENTS: [&str; 4] = ["a", "b", "advance", "on_error"];

/// A random command; `current` picks the running invocation (else a stale one).
fn command(
    choice: usize,
    event: usize,
    input: &str,
    current: bool,
    r: &FlowRecord,
    n: usize,
) -> FlowCommand {
    let fresh = n.to_string();
    let invocation = match (&r.session().running, current) {
        (Some(run), true) => run.invocation_id.clone(),
        _ => format!("s1-{n}"),
    };
    match choice {
        0 => complete(&invocation, input, &fresh),
        1 => fail(&invocation, input, &fresh),
        2 => FlowCommand::Cancel,
        3 => FlowCommand::Retry { fresh_id: fresh },
        4 => FlowCommand::start(),
        _ => fire(
            ["a", "b", "advance", "on_error", "poll", "nope"][event % 6],
            input,
            &fresh,
        ),
    }
}

proptest! {
    #[test]
    fn random_commands_keep_the_machine_contract(
        kinds in prop::collection::vec(any::<bool>(), 1..5),
        edges in prop::collection::vec((0usize..5, 0usize..5, 0usize..4), 0..6),
        steps in prop::collection::vec(
            (0usize..8, 0usize..6, prop::sample::select(vec!["x", "y", "", "{\"k\": 1}"]), any::<bool>()),
            0..30,
        ),
    ) {
        let c = ctx(small_flow(&EVENTS, &kinds, &edges));
        let flow = c.flow.clone();
        let mut r = start(&c);
        for (n, (choice, event, input, current)) in steps.into_iter().enumerate() {
            let cmd = command(choice, event, input, current, &r, n);
            let before = r.clone();
            match r.decide(&c, &cmd, now()) {
                Ok(d) => {
                    prop_assert!(d.changed);
                    prop_assert_eq!(d.transitions.len(), 1);
                    for t in &d.transitions {
                        prop_assert!(
                            flow.allows(t.from.as_deref(), &t.to, &t.cause),
                            "{:?} is not in the table", t
                        );
                        prop_assert_eq!(t.from.as_deref(), Some(before.session().state.as_str()));
                        prop_assert_eq!(&t.to, &r.state_name());
                    }
                    // A DAG is enqueued exactly when the session starts waiting for one.
                    let starts = r.session().running.as_ref().is_some_and(|run| run.dag_id.is_none());
                    prop_assert_eq!(d.tasks.len(), usize::from(starts));
                    // The record holds exactly the elements the store appends.
                    let added: Vec<&DialogueElement> = d.effects.iter().filter_map(|e| match e {
                        FlowEffect::Dialogue(el) => Some(el),
                        _ => None,
                    }).collect();
                    prop_assert_eq!(r.dialogue().len(), before.dialogue().len() + added.len());
                    prop_assert!(r.dialogue()[before.dialogue().len()..].iter().eq(added));
                    prop_assert_eq!(&r.dialogue()[..before.dialogue().len()], before.dialogue());
                    prop_assert!(flow.state(&r.session().state).is_some());
                    if r.session().running.is_some() {
                        prop_assert_eq!(flow.state(&r.session().state).map(|s| s.kind), Some(StateKind::Invoker));
                    }
                    // Every node rebuilds the plan's render data from the
                    // record the decision leaves.
                    if let Some(planned) = planned_context(&c, &before, &cmd) {
                        let [spec] = dags(&d)[..] else { panic!("one DAG") };
                        let rebuilt = rebuilt_contexts(&c, &r, spec);
                        prop_assert!(!rebuilt.is_empty());
                        for data in rebuilt {
                            prop_assert_eq!(&data, &planned);
                        }
                    }
                    // The store assigns the run's id.
                    r.set_dag_id(i64::try_from(n).unwrap());
                }
                Err(e) => {
                    prop_assert_eq!(&r, &before, "{:?} refused with {} changed the record", cmd, e);
                    prop_assert_ne!(e.class(), ErrorClass::Internal, "{}", e);
                }
            }
            let json = serde_json::to_string(&r).unwrap();
            prop_assert_eq!(&serde_json::from_str::<FlowRecord>(&json).unwrap(), &r);
            let session = serde_json::to_value(r.session()).unwrap();
            prop_assert_eq!(&serde_json::from_value::<FlowSession>(session).unwrap(), r.session());
        }
    }
}
