//! Unit tests of the flow engine: hook order, persistence, errors, examples.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use serde_json::{Value, json};

use super::engine::Fired;
use super::*;
use crate::{MachineError as _, Timestamp};

fn sid(id: &str) -> FlowSessionId {
    FlowSessionId::parse(id).unwrap()
}

fn now() -> Timestamp {
    Timestamp::from_micros(1_767_225_600_000_000).unwrap()
}

fn err(invocation: &str, message: &str) -> TaskError {
    TaskError {
        invocation_id: invocation.to_owned(),
        task: "0".to_owned(),
        message: message.to_owned(),
    }
}

type Log = Arc<Mutex<Vec<String>>>;

fn push(log: &Log, s: impl Into<String>) {
    log.lock().unwrap().push(s.into());
}

fn taken(log: &Log) -> Vec<String> {
    std::mem::take(&mut *log.lock().unwrap())
}

/// A file hook's action that appends `name` to the model's `trace`.
fn traced(name: &str) -> String {
    format!("[{{assign: {{trace: \"trace + ['{name}']\"}}}}]")
}

/// A flow whose every hook point and condition records itself: Rust hooks
/// in the log and, like the hooks declared in its file, in the model's
/// `trace`.
fn recording_flow(log: &Log, internal: bool) -> Flow {
    let text = format!(
        "name: rec
initial: a
model: {{trace: []}}
before_transition: {before_transition}
after_transition: {after_transition}
states:
  - {{id: a, kind: user, template: a.j2, on_enter: {enter_a}, on_exit: {exit_a}}}
  - {{id: b, kind: user, template: b.j2, on_enter: {enter_b}}}
transitions:
  - {{event: go, from: a, to: {to}, internal: {internal}, before: {before_go}, after: {after_go}}}
  - {{event: back, from: b, to: a}}
  - {{event: jump, from: a, to: b}}
",
        before_transition = traced("file:before_transition"),
        after_transition = traced("file:after_transition"),
        enter_a = traced("file:a.on_enter"),
        exit_a = traced("file:a.on_exit"),
        enter_b = traced("file:b.on_enter"),
        to = if internal { "a" } else { "b" },
        before_go = traced("file:go.before"),
        after_go = traced("file:go.after"),
    );
    let templates = BTreeMap::from([
        ("a.j2".to_owned(), "A".to_owned()),
        ("b.j2".to_owned(), "B {{ actor_input }}".to_owned()),
    ]);
    let mut def = FlowDef::from_file_text(&text, templates).unwrap();
    let (l1, l2) = (log.clone(), log.clone());
    let go = &mut def.transitions[0];
    go.validators = vec!["recording".into()];
    go.cond = vec![Condition::Fn(Arc::new(move |_| {
        push(&l1, "cond");
        true
    }))];
    go.unless = vec![Condition::Fn(Arc::new(move |_| {
        push(&l2, "unless");
        false
    }))];
    let l = log.clone();
    let mut b = FlowBuilder::from_def(def).validator("recording", move |c| {
        push(&l, format!("validator:{}", c.session.state));
        Ok(())
    });
    for (point, scope, name) in [
        (HookPoint::Before, HookScope::Any, "before_transition"),
        (
            HookPoint::Before,
            HookScope::Event("go".into()),
            "before_go",
        ),
        (HookPoint::Exit, HookScope::Any, "on_exit_state"),
        (HookPoint::Exit, HookScope::State("a".into()), "on_exit_a"),
        (HookPoint::On, HookScope::Any, "on_transition"),
        (HookPoint::On, HookScope::Event("go".into()), "on_go"),
        (HookPoint::Enter, HookScope::Any, "on_enter_state"),
        (HookPoint::Enter, HookScope::State("b".into()), "on_enter_b"),
        (HookPoint::After, HookScope::Any, "after_transition"),
        (HookPoint::After, HookScope::Event("go".into()), "after_go"),
    ] {
        let l = log.clone();
        b = b.hook(point, scope, move |c| {
            push(
                &l,
                format!(
                    "{name}@{}:{}:{:?}",
                    c.session.state,
                    c.session.actor_input,
                    c.session.actor.map(Actor::as_str)
                ),
            );
            if let Some(Value::Array(trace)) = c.session.model.get_mut("trace") {
                trace.push(Value::String(format!("rust:{name}")));
            }
            Ok(())
        });
    }
    b.build().unwrap()
}

/// The model's `trace` of a session.
fn trace(s: &FlowSession) -> Vec<String> {
    serde_json::from_value(s.model["trace"].clone()).unwrap()
}

#[test]
fn hook_order_is_validators_conditions_before_exit_on_update_enter_after() {
    let log: Log = Arc::default();
    let flow = recording_flow(&log, false);
    let s = flow.start(&sid("s1"), now()).unwrap().session;
    assert_eq!(
        trace(&s),
        ["rust:on_enter_state", "file:a.on_enter"],
        "the initial state's enter hooks run at start"
    );
    taken(&log);
    let fired = flow.fire(&s, &[], "go", "hi", "i1", now()).unwrap();
    assert_eq!(fired.session.state, "b");
    assert_eq!(
        taken(&log),
        [
            "validator:a",
            "cond",
            "unless",
            "before_transition@a:hi:Some(\"user\")",
            "before_go@a:hi:Some(\"user\")",
            "on_exit_state@a:hi:Some(\"user\")",
            "on_exit_a@a:hi:Some(\"user\")",
            "on_transition@a:hi:Some(\"user\")",
            "on_go@a:hi:Some(\"user\")",
            "on_enter_state@b:hi:Some(\"user\")",
            "on_enter_b@b:hi:Some(\"user\")",
            "after_go@b:hi:Some(\"user\")",
            "after_transition@b:hi:Some(\"user\")",
        ]
    );
    // File hooks interleave with Rust ones by scope (every transition, this
    // transition, its event or state; reversed but for the transition's in
    // `after`), and run before Rust hooks of the same scope.
    assert_eq!(
        trace(&fired.session)[2..],
        [
            "file:before_transition",
            "rust:before_transition",
            "file:go.before",
            "rust:before_go",
            "rust:on_exit_state",
            "file:a.on_exit",
            "rust:on_exit_a",
            "rust:on_transition",
            "rust:on_go",
            "rust:on_enter_state",
            "file:b.on_enter",
            "rust:on_enter_b",
            "file:go.after",
            "rust:after_go",
            "file:after_transition",
            "rust:after_transition",
        ]
    );
}

#[test]
fn hooks_see_transition_type_and_actor_already_set() {
    type Seen = Vec<(Option<StateKind>, Option<StateKind>, Option<Actor>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let s2 = seen.clone();
    let flow = FlowBuilder::new("t")
        .template("u.j2", "u")
        .template("i.j2", "i")
        .user_state("u", "u.j2")
        .invoker_state("i", TemplateRef::Name("i.j2".into()), "template")
        .on("go", "u", "i")
        .on("advance", "i", "u")
        .hook(HookPoint::Before, HookScope::Any, move |c| {
            s2.lock().unwrap().push((
                c.session.source_type,
                c.session.target_type,
                c.session.actor,
            ));
            Ok(())
        })
        .build()
        .unwrap();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let f = flow.fire(&s, &[], "go", "x", "i1", now()).unwrap();
    flow.complete(&f.session, &[], "i-i1", "done", "i2", now())
        .unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (
                Some(StateKind::User),
                Some(StateKind::Invoker),
                Some(Actor::User)
            ),
            (
                Some(StateKind::Invoker),
                Some(StateKind::User),
                Some(Actor::Assistant)
            ),
        ]
    );
}

#[test]
fn internal_self_transition_skips_exit_and_enter() {
    let log: Log = Arc::default();
    let flow = recording_flow(&log, true);
    let s = flow.start(&sid("s1"), now()).unwrap().session;
    taken(&log);
    let fired = flow.fire(&s, &[], "go", "hi", "i1", now()).unwrap();
    assert_eq!(fired.session.state, "a");
    let names: Vec<String> = taken(&log)
        .into_iter()
        .map(|s| s.split('@').next().unwrap().to_owned())
        .collect();
    assert_eq!(
        names,
        [
            "validator:a",
            "cond",
            "unless",
            "before_transition",
            "before_go",
            "on_transition",
            "on_go",
            "after_go",
            "after_transition"
        ]
    );
    assert_eq!(
        trace(&fired.session)[2..],
        [
            "file:before_transition",
            "rust:before_transition",
            "file:go.before",
            "rust:before_go",
            "rust:on_transition",
            "rust:on_go",
            "file:go.after",
            "rust:after_go",
            "file:after_transition",
            "rust:after_transition",
        ],
        "an internal transition skips the declared exit and enter hooks too"
    );
}

#[test]
fn external_self_transition_runs_exit_and_enter() {
    let log: Log = Arc::default();
    let l = log.clone();
    let l2 = log.clone();
    let flow = FlowBuilder::new("t")
        .template("a.j2", "a")
        .user_state("a", "a.j2")
        .on("again", "a", "a")
        .hook(HookPoint::Exit, HookScope::State("a".into()), move |_| {
            push(&l, "exit");
            Ok(())
        })
        .hook(HookPoint::Enter, HookScope::State("a".into()), move |_| {
            push(&l2, "enter");
            Ok(())
        })
        .build()
        .unwrap();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    taken(&log);
    flow.fire(&s, &[], "again", "", "i", now()).unwrap();
    assert_eq!(taken(&log), ["exit", "enter"]);
}

fn two_candidates(first_cond: &str) -> Flow {
    let mut first = TransitionDef::new("go", "a", "b");
    first.cond = vec![Condition::Expr(first_cond.into())];
    FlowBuilder::new("t")
        .template("a.j2", "a")
        .template("b.j2", "b")
        .template("c.j2", "c")
        .user_state("a", "a.j2")
        .user_state("b", "b.j2")
        .user_state("c", "c.j2")
        .transition(first)
        .on("go", "a", "c")
        .on("back", "b", "a")
        .on("back", "c", "a")
        .build()
        .unwrap()
}

#[test]
fn candidates_are_tried_in_declaration_order() {
    let flow = two_candidates("actor_input == 'b'");
    let s = flow.start(&sid("s"), now()).unwrap().session;
    assert_eq!(
        flow.fire(&s, &[], "go", "b", "i", now())
            .unwrap()
            .session
            .state,
        "b"
    );
    assert_eq!(
        flow.fire(&s, &[], "go", "other", "i", now())
            .unwrap()
            .session
            .state,
        "c"
    );
}

#[test]
fn failed_condition_moves_on_and_unless_blocks() {
    let mut t = TransitionDef::new("go", "a", "b");
    t.unless = vec![Condition::Expr("actor_input == 'stop'".into())];
    let flow = FlowBuilder::new("t")
        .template("a.j2", "a")
        .template("b.j2", "b")
        .user_state("a", "a.j2")
        .user_state("b", "b.j2")
        .transition(t)
        .build()
        .unwrap();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    assert_eq!(
        flow.fire(&s, &[], "go", "stop", "i", now()).unwrap_err(),
        FlowError::not_allowed("go", "a", None)
    );
}

#[test]
fn validator_error_aborts_without_trying_later_candidates() {
    let mut first = TransitionDef::new("go", "a", "b");
    first.validators = vec!["non_empty_input".into()];
    let flow = FlowBuilder::new("t")
        .template("a.j2", "a")
        .template("b.j2", "b")
        .template("c.j2", "c")
        .user_state("a", "a.j2")
        .user_state("b", "b.j2")
        .user_state("c", "c.j2")
        .transition(first)
        .on("go", "a", "c")
        .build()
        .unwrap();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    assert_eq!(
        flow.fire(&s, &[], "go", "  ", "i", now()).unwrap_err(),
        FlowError::Validator {
            validator: "non_empty_input".into(),
            message: "the input is empty".into()
        }
    );
}

#[test]
fn transition_not_allowed_for_unknown_event() {
    let flow = two_candidates("true");
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let e = flow.fire(&s, &[], "nope", "", "i", now()).unwrap_err();
    assert_eq!(e.to_string(), "event `nope` is not allowed in state `a`");
}

#[test]
fn a_hook_error_aborts_with_nothing_changed() {
    let flow = FlowBuilder::new("t")
        .template("a.j2", "a")
        .template("b.j2", "b")
        .user_state("a", "a.j2")
        .user_state("b", "b.j2")
        .on("go", "a", "b")
        .hook(HookPoint::Enter, HookScope::State("b".into()), |_| {
            Err("boom".into())
        })
        .build()
        .unwrap();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    assert_eq!(
        flow.fire(&s, &[], "go", "x", "i", now()).unwrap_err(),
        FlowError::Hook {
            point: HookPoint::Enter,
            message: "boom".into()
        }
    );
}

fn uiu() -> Flow {
    FlowBuilder::new("t")
        .template("u.j2", "rendered {{ actor_input }}")
        .template("v.j2", "second {{ actor_input }}")
        .template("i.j2", "prompt {{ actor_input }}")
        .template("j.j2", "prompt2 {{ actor_input }}")
        .user_state("u", "u.j2")
        .user_state("v", "v.j2")
        .invoker_state("i", TemplateRef::Name("i.j2".into()), "template")
        .invoker_state("j", TemplateRef::Name("j.j2".into()), "template")
        .on("user_input", "u", "v")
        .on("upload", "v", "u")
        .on("file_upload", "v", "i")
        .on("ask", "u", "i")
        .on("advance", "i", "j")
        .on("advance", "j", "u")
        .build()
        .unwrap()
}

fn texts(f: &Fired) -> Vec<(Actor, Option<String>)> {
    f.appended
        .iter()
        .map(|e| (e.actor, e.actor_text.clone()))
        .collect()
}

#[test]
fn persistence_default_user_to_user_records_raw_input_and_rendered_target() {
    let flow = uiu();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let f = flow
        .fire(&s, &[], "user_input", "hello", "x", now())
        .unwrap();
    assert_eq!(
        texts(&f),
        [
            (Actor::User, Some("hello".into())),
            (Actor::Assistant, Some("second hello".into()))
        ]
    );
    assert_eq!(f.response.as_deref(), Some("second hello"));
}

#[test]
fn persistence_default_user_to_invoker_records_raw_input_and_plans_the_dag() {
    let flow = uiu();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let f = flow.fire(&s, &[], "ask", "question", "x", now()).unwrap();
    assert_eq!(texts(&f), [(Actor::User, Some("question".into()))]);
    assert!(f.dag.is_some());
    assert!(f.response.is_none());
    assert_eq!(flow.next_actions(&f.session), ["poll"]);
}

#[test]
fn persistence_default_invoker_to_invoker_records_nothing_and_invoker_to_user_renders() {
    let flow = uiu();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let f = flow.fire(&s, &[], "ask", "q", "x", now()).unwrap();
    let hop = flow
        .complete(&f.session, &[], "i-x", "r1", "y", now())
        .unwrap();
    assert!(hop.appended.is_empty());
    let plan = hop.dag.clone().unwrap();
    assert_eq!(plan.chain_id, "i-x", "the chain continues across the hop");
    let back = flow
        .complete(&hop.session, &[], &plan.invocation_id, "r2", "z", now())
        .unwrap();
    assert_eq!(
        texts(&back),
        [(Actor::Assistant, Some("rendered r2".into()))]
    );
    assert_eq!(back.session.actor, Some(Actor::Assistant));
}

#[test]
fn persistence_default_file_upload_records_the_event_only() {
    let flow = uiu();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let v = flow
        .fire(&s, &[], "user_input", "x", "x", now())
        .unwrap()
        .session;
    let f = flow
        .fire(&v, &[], "file_upload", "<bytes>", "x", now())
        .unwrap();
    assert_eq!(texts(&f), [(Actor::User, None)]);
}

#[test]
fn persistence_override_on_a_transition_applies_to_that_transition_only() {
    let mut quiet = TransitionDef::new("user_input", "u", "v");
    quiet.persistence = Some(Persistence::NONE);
    let flow = FlowBuilder::new("t")
        .template("u.j2", "u")
        .template("v.j2", "v")
        .user_state("u", "u.j2")
        .user_state("v", "v.j2")
        .transition(quiet)
        .on("user_input", "v", "u")
        .build()
        .unwrap();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let f = flow
        .fire(&s, &[], "user_input", "secret", "x", now())
        .unwrap();
    assert!(f.appended.is_empty());
    assert_eq!(
        f.response.as_deref(),
        Some("v"),
        "the response is still rendered"
    );
    let g = flow
        .fire(&f.session, &[], "user_input", "visible", "x", now())
        .unwrap();
    assert_eq!(
        texts(&g),
        [
            (Actor::User, Some("visible".into())),
            (Actor::Assistant, Some("u".into()))
        ]
    );
}

#[test]
fn persistence_override_set_by_a_hook_is_not_sticky() {
    let flow = FlowBuilder::new("t")
        .template("u.j2", "u")
        .template("v.j2", "v")
        .user_state("u", "u.j2")
        .user_state("v", "v.j2")
        .on("user_input", "u", "v")
        .on("user_input", "v", "u")
        .hook(HookPoint::Enter, HookScope::State("v".into()), |c| {
            *c.persistence = Persistence::TARGET_RAW | Persistence::TARGET_RENDERED;
            Ok(())
        })
        .build()
        .unwrap();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let f = flow.fire(&s, &[], "user_input", "in", "x", now()).unwrap();
    assert_eq!(
        texts(&f),
        [
            (Actor::User, Some("in".into())),
            (Actor::Assistant, Some("in\nv".into()))
        ]
    );
    let g = flow
        .fire(&f.session, &[], "user_input", "again", "x", now())
        .unwrap();
    assert_eq!(
        texts(&g),
        [
            (Actor::User, Some("again".into())),
            (Actor::Assistant, Some("u".into()))
        ]
    );
}

#[test]
fn completion_event_is_reserved_for_the_engine() {
    let flow = uiu();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let f = flow.fire(&s, &[], "ask", "q", "x", now()).unwrap();
    assert_eq!(
        flow.fire(&f.session, &[], "advance", "fake", "y", now())
            .unwrap_err(),
        FlowError::not_allowed("advance", "i", Some(reason::RESERVED_FOR_ENGINE))
    );
}

#[test]
fn events_while_a_dag_runs_are_refused() {
    let flow = uiu();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let f = flow.fire(&s, &[], "ask", "q", "x", now()).unwrap();
    assert_eq!(
        flow.fire(&f.session, &[], "user_input", "q", "y", now())
            .unwrap_err(),
        FlowError::not_allowed("user_input", "i", Some(reason::DAG_RUNNING))
    );
}

#[test]
fn a_result_no_transition_accepts_records_an_error_and_offers_retry() {
    let mut only_yes = TransitionDef::new("advance", "i", "u");
    only_yes.cond = vec![Condition::Expr("actor_input == 'yes'".into())];
    let flow = FlowBuilder::new("t")
        .template("u.j2", "u")
        .template("i.j2", "i")
        .user_state("u", "u.j2")
        .invoker_state("i", TemplateRef::Name("i.j2".into()), "template")
        .on("ask", "u", "i")
        .transition(only_yes)
        .build()
        .unwrap();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let f = flow.fire(&s, &[], "ask", "q", "x", now()).unwrap();
    let done = flow
        .complete(&f.session, &[], "i-x", "no", "y", now())
        .unwrap();
    assert!(done.dag.is_none(), "never re-runs on its own");
    assert_eq!(done.session.state, "i");
    assert_eq!(done.session.errors.len(), 1);
    assert_eq!(done.session.errors[0].task, "complete");
    assert_eq!(flow.next_actions(&done.session), ["retry"]);
    let again = flow.retry(&done.session, &[], "z", now()).unwrap();
    assert_eq!(again.dag.unwrap().invocation_id, "i-z");
    let ok = flow
        .complete(&again.session, &[], "i-z", "yes", "w", now())
        .unwrap();
    assert_eq!(ok.session.state, "u");
    assert!(
        ok.session.errors.is_empty(),
        "cleared by the next transition"
    );
}

#[test]
fn a_failed_dag_follows_on_error_when_declared() {
    let flow = FlowBuilder::new("t")
        .template("u.j2", "u")
        .template("oops.j2", "sorry: {{ actor_input }}")
        .template("i.j2", "i")
        .user_state("u", "u.j2")
        .user_state("oops", "oops.j2")
        .invoker_state("i", TemplateRef::Name("i.j2".into()), "template")
        .on("ask", "u", "i")
        .on("advance", "i", "u")
        .on("on_error", "i", "oops")
        .on("again", "oops", "u")
        .build()
        .unwrap();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let f = flow.fire(&s, &[], "ask", "q", "x", now()).unwrap();
    let failed = flow
        .fail(&f.session, &[], err("i-x", "timed out"), "y", now())
        .unwrap();
    assert_eq!(failed.session.state, "oops");
    assert_eq!(failed.response.as_deref(), Some("sorry: timed out"));
    assert_eq!(failed.session.errors[0].message, "timed out");
    assert!(
        flow.fire(&f.session, &[], "on_error", "x", "y", now())
            .is_err(),
        "on_error is the engine's"
    );
}

#[test]
fn cancel_returns_to_the_last_user_state() {
    let flow = uiu();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let f = flow.fire(&s, &[], "ask", "q", "x", now()).unwrap();
    let c = flow.cancel(&f.session).unwrap();
    assert_eq!(c.state, "u");
    assert!(c.running.is_none());
    assert!(flow.complete(&c, &[], "i-x", "late", "y", now()).is_err());
}

#[test]
fn loading_reports_every_problem_with_its_location() {
    let text = r#"
name: broken
initial: ask
model: {a: 1}
states:
  - {id: ask, kind: user, template: missing.j2}
  - {id: ask, kind: user, template: ask.j2}
  - {id: run, kind: invoker, template: ask.j2}
  - {id: lost, kind: user}
transitions:
  - {event: go, from: ask, to: run, cond: "a ==", assign: {nope: "1"}}
  - {event: poll, from: ask, to: ask}
"#;
    let templates = BTreeMap::from([("ask.j2".to_owned(), "hi".to_owned())]);
    let Err(FlowError::Invalid(problems)) = Flow::from_file_text(text, templates) else {
        panic!("must fail");
    };
    let locs: Vec<String> = problems.iter().map(ToString::to_string).collect();
    insta::assert_debug_snapshot!(locs);
}

#[test]
fn an_initial_invoker_state_is_refused() {
    let r = FlowBuilder::new("t")
        .template("i.j2", "i")
        .invoker_state("i", TemplateRef::Name("i.j2".into()), "template")
        .initial("i")
        .on("advance", "i", "i")
        .build();
    assert!(
        matches!(r, Err(FlowError::Invalid(p)) if p.iter().any(|p| p.message.contains("must be a user state")))
    );
}

fn example(name: &str) -> Flow {
    let (text, files): (&str, &[(&str, &str)]) = match name {
        "qa" => (
            include_str!("../../../../examples/flows/qa/flow.yaml"),
            &[
                (
                    "ask.j2",
                    include_str!("../../../../examples/flows/qa/templates/ask.j2"),
                ),
                (
                    "answer.j2",
                    include_str!("../../../../examples/flows/qa/templates/answer.j2"),
                ),
                (
                    "followup.j2",
                    include_str!("../../../../examples/flows/qa/templates/followup.j2"),
                ),
                (
                    "goodbye.j2",
                    include_str!("../../../../examples/flows/qa/templates/goodbye.j2"),
                ),
            ],
        ),
        _ => (
            include_str!("../../../../examples/flows/extraction/flow.yaml"),
            &[
                (
                    "intake.j2",
                    include_str!("../../../../examples/flows/extraction/templates/intake.j2"),
                ),
                (
                    "normalize.j2",
                    include_str!("../../../../examples/flows/extraction/templates/normalize.j2"),
                ),
                (
                    "contact.j2",
                    include_str!("../../../../examples/flows/extraction/templates/contact.j2"),
                ),
                (
                    "topics.j2",
                    include_str!("../../../../examples/flows/extraction/templates/topics.j2"),
                ),
                (
                    "topic.j2",
                    include_str!("../../../../examples/flows/extraction/templates/topic.j2"),
                ),
                (
                    "missing.j2",
                    include_str!("../../../../examples/flows/extraction/templates/missing.j2"),
                ),
                (
                    "confirm.j2",
                    include_str!("../../../../examples/flows/extraction/templates/confirm.j2"),
                ),
                (
                    "done.j2",
                    include_str!("../../../../examples/flows/extraction/templates/done.j2"),
                ),
            ],
        ),
    };
    let templates = files
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Flow::from_file_text(text, templates).unwrap()
}

#[test]
fn mermaid_of_the_qa_example() {
    insta::assert_snapshot!(example("qa").to_mermaid());
}

#[test]
fn mermaid_of_the_extraction_example() {
    insta::assert_snapshot!(example("extraction").to_mermaid());
}

#[test]
fn extraction_templates_produce_the_parsed_result_the_condition_routes_on() {
    let flow = example("extraction");
    let data = json!({
        "actor_input": "name: Ada Lovelace; email: ada@example.com; topics: engines, poetry",
    });
    let normalized = flow.render("normalize.j2", &data).unwrap();
    let parsed: Value = serde_json::from_str(&normalized).unwrap();
    assert_eq!(parsed["email"], "ada@example.com");
    let ctx = dag::task_context(&data, Some(&dag::glue(&normalized)));
    let contact = flow.render("contact.j2", &ctx).unwrap();
    let topics = flow.render("topics.j2", &ctx).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&topics).unwrap(),
        json!(["engines", "poetry"])
    );
    let result = dag::combine(&["contact".into(), "topics".into()], &[contact, topics]);
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let f = flow
        .fire(
            &s,
            &[],
            "user_input",
            data["actor_input"].as_str().unwrap(),
            "x",
            now(),
        )
        .unwrap();
    assert_eq!(f.dag.as_ref().unwrap().counted_tasks(), 6);
    let next = flow
        .complete(&f.session, &[], "extract-x", &result, "y", now())
        .unwrap();
    assert_eq!(next.session.state, "summarize");
    assert_eq!(next.session.model["email"], "ada@example.com");
    assert_eq!(next.session.model["topics"], json!(["engines", "poetry"]));
    let plan = next.dag.unwrap();
    assert_eq!(plan.chain_id, "extract-x");
    assert_eq!(plan.context["topics"], json!(["engines", "poetry"]));
    let missing = flow
        .complete(
            &f.session,
            &[],
            "extract-x",
            "{\"contact\": {\"name\": null, \"email\": null}, \"topics\": []}",
            "y",
            now(),
        )
        .unwrap();
    assert_eq!(missing.session.state, "missing");
}

// Random small flows and random event sequences.

/// A flow of `kinds.len()` states (`true`: an invoker state, except the
/// first), joined in a ring by `advance` and by `edges` (from, to, index
/// into `events`) guarded by a condition.
pub(super) fn small_flow(events: &[&str], kinds: &[bool], edges: &[(usize, usize, usize)]) -> Flow {
    let mut b = FlowBuilder::new("p").template("t.j2", "{{ actor_input }}");
    for (i, invoker) in kinds.iter().enumerate() {
        let id = format!("s{i}");
        b = if *invoker && i > 0 {
            b.invoker_state(&id, TemplateRef::Name("t.j2".into()), "template")
        } else {
            b.user_state(&id, "t.j2")
        };
    }
    // A spine keeps every state reachable and gives invokers a way out.
    for i in 0..kinds.len() {
        b = b.on(
            "advance",
            &format!("s{i}"),
            &format!("s{}", (i + 1) % kinds.len()),
        );
    }
    for (f, t, e) in edges {
        let (f, t) = (f % kinds.len(), t % kinds.len());
        let mut tr =
            TransitionDef::new(events[e % events.len()], &format!("s{f}"), &format!("s{t}"));
        tr.cond = vec![Condition::Expr("actor_input != 'x'".into())];
        b = b.transition(tr);
    }
    b.build().unwrap()
}

proptest! {
    #[test]
    fn random_events_never_panic_and_keep_the_state_declared(
        kinds in prop::collection::vec(any::<bool>(), 1..5),
        edges in prop::collection::vec((0usize..5, 0usize..5, 0usize..3), 0..6),
        steps in prop::collection::vec((0usize..6, prop::sample::select(vec!["x", "y", ""])), 0..25),
    ) {
        let flow = small_flow(&["a", "b", "advance"], &kinds, &edges);
        let mut s = flow.start(&sid("s"), now()).unwrap().session;
        let mut dialogue = Vec::new();
        for (n, (choice, input)) in steps.into_iter().enumerate() {
            let before = dialogue.len();
            let result = match (choice, &s.running) {
                (0, Some(r)) => flow.complete(&s, &dialogue, &r.invocation_id.clone(), input, &n.to_string(), now()),
                (1, Some(r)) => flow.fail(&s, &dialogue, err(&r.invocation_id.clone(), "boom"), &n.to_string(), now()),
                (2, _) => flow.cancel(&s).map(|session| Fired { session, appended: vec![], response: None, dag: None, transition: None }),
                (3, _) => flow.retry(&s, &dialogue, &n.to_string(), now()),
                (c, _) => flow.fire(&s, &dialogue, ["a", "b", "advance", "nope"][c % 4], input, &n.to_string(), now()),
            };
            if let Ok(f) = result {
                prop_assert_eq!(f.dag.is_some(), f.session.running.is_some());
                s = f.session;
                dialogue.extend(f.appended);
            }
            prop_assert!(flow.state(&s.state).is_some());
            prop_assert!(dialogue.len() >= before);
        }
    }
}

#[test]
fn invoker_completion_fires_the_first_declared_event() {
    let flow = FlowBuilder::new("t")
        .template("u.j2", "u {{ actor_input }}")
        .template("v.j2", "v {{ actor_input }}")
        .template("i.j2", "i")
        .user_state("u", "u.j2")
        .user_state("v", "v.j2")
        .invoker_state("i", TemplateRef::Name("i.j2".into()), "template")
        .on("ask", "u", "i")
        .on("first", "i", "u")
        .on("second", "i", "v")
        .build()
        .unwrap();
    assert_eq!(flow.completion_event("i"), Some("first"));
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let f = flow.fire(&s, &[], "ask", "q", "x", now()).unwrap();
    let done = flow
        .complete(&f.session, &[], "i-x", "r", "y", now())
        .unwrap();
    assert_eq!(
        done.transition,
        Some(crate::Transition::new("i", "u", "first"))
    );
}

#[test]
fn an_on_complete_event_is_the_completion_event_wherever_declared() {
    let flow = FlowBuilder::new("t")
        .template("u.j2", "u")
        .template("i.j2", "i")
        .user_state("u", "u.j2")
        .invoker_state("i", TemplateRef::Name("i.j2".into()), "template")
        .on("ask", "u", "i")
        .on("skip", "i", "u")
        .on("on_complete", "i", "u")
        .build()
        .unwrap();
    assert_eq!(flow.completion_event("i"), Some("on_complete"));
}

#[test]
fn next_actions_follow_declaration_order_and_are_not_filtered_by_conditions() {
    let mut blocked = TransitionDef::new("zeta", "a", "b");
    blocked.cond = vec![Condition::Expr("false".into())];
    let flow = FlowBuilder::new("t")
        .template("a.j2", "a")
        .template("b.j2", "b")
        .user_state("a", "a.j2")
        .user_state("b", "b.j2")
        .transition(blocked)
        .on("alpha", "a", "b")
        .on("zeta", "a", "a")
        .build()
        .unwrap();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    assert_eq!(flow.next_actions(&s), ["zeta", "alpha"]);
    let b = flow.fire(&s, &[], "alpha", "", "x", now()).unwrap().session;
    assert!(
        flow.next_actions(&b).is_empty(),
        "a terminal state offers nothing"
    );
}

#[test]
fn render_data_holds_model_fields_input_state_time_and_chat_history() {
    let flow = FlowBuilder::new("t")
        .template("a.j2", "a")
        .user_state("a", "a.j2")
        .field("topic", json!("rust"))
        .build()
        .unwrap();
    let mut s = flow.start(&sid("s1"), now()).unwrap().session;
    s.actor_input = "{\"k\": [1]}".into();
    let dialogue = [DialogueElement {
        actor: Actor::User,
        event: "user_input".into(),
        actor_text: Some("two\nlines".into()),
        timestamp: now(),
    }];
    let data = flow.render_data(&s, &dialogue, now());
    assert_eq!(data["topic"], "rust");
    assert_eq!(data["actor_input"], "{\"k\": [1]}");
    assert_eq!(data["parsed_actor_input"], json!({"k": [1]}));
    assert_eq!(data["state_id"], "a");
    assert_eq!(data["session_id"], "s1");
    assert_eq!(data["current_datetime"], now().to_string());
    assert_eq!(
        data["chat_history"],
        "- role: user\n  content: |2-\n    two\n    lines\n"
    );
}

#[test]
fn chat_history_ends_with_a_newline_as_in_the_reference() {
    let flow = two_states("{{ chat_history }}END");
    let started = flow.start(&sid("s"), now()).unwrap();
    let f = flow
        .fire(&started.session, &started.appended, "go", "hi", "x", now())
        .unwrap();
    assert_eq!(
        f.response.as_deref(),
        Some(
            "- role: assistant\n  content: |2-\n    a\n\n- role: user\n  content: |2-\n    hi\nEND"
        )
    );
    // No dialogue, no text.
    assert_eq!(
        flow.render_data(&started.session, &[], now())["chat_history"],
        ""
    );
}

#[test]
fn map_over_list_plans_one_task_before_expansion() {
    let flow = FlowBuilder::new("t")
        .template("u.j2", "u")
        .template("m.j2", "{{ map_value }}")
        .user_state("u", "u.j2")
        .invoker_state(
            "i",
            TemplateRef::MapOver {
                map: "m.j2".into(),
                over: "items".into(),
            },
            "template",
        )
        .field("items", json!([1, 2, 3]))
        .on("go", "u", "i")
        .on("advance", "i", "u")
        .build()
        .unwrap();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let plan = flow
        .fire(&s, &[], "go", "", "x", now())
        .unwrap()
        .dag
        .unwrap();
    assert_eq!(plan.counted_tasks(), 2);
    assert_eq!(flow.eval("items", &plan.context).unwrap(), json!([1, 2, 3]));
}

#[test]
fn retry_is_refused_outside_an_idle_invoker_state() {
    let flow = uiu();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    assert_eq!(
        flow.retry(&s, &[], "x", now()).unwrap_err(),
        FlowError::not_allowed("retry", "u", Some(reason::RETRY_NOT_OFFERED))
    );
    let running = flow.fire(&s, &[], "ask", "q", "x", now()).unwrap().session;
    assert_eq!(
        flow.retry(&running, &[], "y", now()).unwrap_err(),
        FlowError::not_allowed("retry", "i", Some(reason::DAG_RUNNING))
    );
}

#[test]
fn a_stale_invocation_is_refused() {
    let flow = uiu();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let running = flow.fire(&s, &[], "ask", "q", "x", now()).unwrap().session;
    assert_eq!(
        flow.complete(&running, &[], "i-other", "r", "y", now())
            .unwrap_err(),
        FlowError::not_allowed("complete", "i", Some(reason::STALE_INVOCATION))
    );
}

#[test]
fn a_flow_naming_an_unknown_filter_or_test_does_not_load() {
    let text = r#"
name: t
initial: a
model: {items: []}
states:
  - {id: a, kind: user, template: a.j2}
  - {id: b, kind: user, template: b.j2}
  - {id: i, kind: invoker, template: {map: a.j2, over: "items | nosuch_over"}}
transitions:
  - {event: go, from: a, to: b, cond: "actor_input | nosuch_cond", unless: "actor_input is nosuch_unless"}
  - {event: back, from: b, to: a, assign: {items: "[actor_input] | nosuch_assign"}}
  - {event: run, from: b, to: i}
  - {event: advance, from: i, to: a}
"#;
    let templates = BTreeMap::from([
        ("a.j2".to_owned(), "a {{ actor_input | upper }}".to_owned()),
        (
            "b.j2".to_owned(),
            "{{ actor_input | no_such_filter }}{% if 1 is nosuch_test %}{% endif %}\
             {% filter nosuch_block %}x{% endfilter %}"
                .to_owned(),
        ),
    ]);
    let Err(FlowError::Invalid(problems)) = Flow::from_file_text(text, templates) else {
        panic!("the flow loads");
    };
    let found: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        found,
        [
            "templates/b.j2: unknown filter `no_such_filter`",
            "templates/b.j2: unknown test `nosuch_test`",
            "templates/b.j2: unknown filter `nosuch_block`",
            "states[2].template.over: bad expression `items | nosuch_over`: invalid operation: unknown filter `nosuch_over`",
            "transitions[0].cond: bad expression `actor_input | nosuch_cond`: invalid operation: unknown filter `nosuch_cond`",
            "transitions[0].unless: bad expression `actor_input is nosuch_unless`: invalid operation: unknown test `nosuch_unless`",
            "transitions[1].assign.items: bad expression `[actor_input] | nosuch_assign`: invalid operation: unknown filter `nosuch_assign`",
        ]
    );
}

#[test]
fn a_json_flow_file_loads_like_yaml() {
    let text = r#"{
        "name": "j",
        "initial": "a",
        "model": {"n": 0},
        "states": [
            {"id": "a", "kind": "user", "template": "a.j2"},
            {"id": "i", "kind": "invoker", "template": {"x": "a.j2", "y": ["a.j2", "a.j2"]}}
        ],
        "transitions": [
            {"event": "go", "from": "a", "to": "i", "persistence": ["source_event"]},
            {"event": "advance", "from": "i", "to": "a", "assign": {"n": "n + 1"}}
        ]
    }"#;
    let templates = BTreeMap::from([("a.j2".to_owned(), "a".to_owned())]);
    let flow = Flow::from_file_text(text, templates).unwrap();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let f = flow.fire(&s, &[], "go", "x", "1", now()).unwrap();
    assert_eq!(f.appended[0].actor_text, None);
    // map of (1) and (chain of 2 + 1 glue), + combine + completion
    assert_eq!(f.dag.unwrap().counted_tasks(), 1 + 3 + 1 + 1);
    let back = flow
        .complete(&f.session, &[], "i-1", "{}", "2", now())
        .unwrap();
    assert_eq!(back.session.model["n"], 1);
}

fn two_states(b: &str) -> Flow {
    FlowBuilder::new("t")
        .template("a.j2", "a")
        .template("b.j2", b)
        .user_state("a", "a.j2")
        .user_state("b", "b.j2")
        .on("go", "a", "b")
        .build()
        .unwrap()
}

#[test]
fn a_template_that_never_ends_runs_out_of_fuel() {
    let flow = two_states(
        "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}{% endfor %}{% endfor %}{% endfor %}",
    );
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let e = flow.fire(&s, &[], "go", "", "x", now()).unwrap_err();
    assert!(
        matches!(&e, FlowError::RenderLimit { what, limit } if what == "b.j2" && limit.contains("instructions")),
        "{e:?}"
    );
}

#[test]
fn a_template_writing_too_much_is_stopped_at_the_output_limit() {
    let flow = two_states("{% for a in range(3000) %}{{ '0123456789' * 50 }}{% endfor %}");
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let e = flow.fire(&s, &[], "go", "", "x", now()).unwrap_err();
    assert!(
        matches!(&e, FlowError::RenderLimit { what, limit } if what == "b.j2" && limit == &format!("{MAX_RENDER_BYTES} bytes of output")),
        "{e:?}"
    );
    // Just under the limit renders.
    let ok = two_states("{% for a in range(2000) %}{{ '0123456789' * 50 }}{% endfor %}");
    let s = ok.start(&sid("s"), now()).unwrap().session;
    let f = ok.fire(&s, &[], "go", "", "x", now()).unwrap();
    assert_eq!(f.response.unwrap().len(), 1_000_000);
}

#[test]
fn a_full_dialogue_takes_no_more_user_events() {
    let flow = two_states("b");
    let started = flow.start(&sid("s"), now()).unwrap();
    let element = started.appended[0].clone();
    let full = vec![element; MAX_DIALOGUE];
    let e = flow
        .fire(&started.session, &full, "go", "", "x", now())
        .unwrap_err();
    assert_eq!(e, FlowError::DialogueFull { len: MAX_DIALOGUE });
    assert!(
        flow.fire(&started.session, &full[1..], "go", "", "x", now())
            .is_ok()
    );
}

#[test]
fn a_condition_failing_on_its_data_is_an_invalid_expression_not_an_internal_error() {
    let mut go = TransitionDef::new("go", "a", "b");
    go.cond = vec![Condition::Expr("actor_input + 1 > 0".into())];
    let flow = FlowBuilder::new("t")
        .template("a.j2", "a")
        .template("b.j2", "b")
        .user_state("a", "a.j2")
        .user_state("b", "b.j2")
        .transition(go)
        .build()
        .unwrap();
    let s = flow.start(&sid("s"), now()).unwrap().session;
    let e = flow.fire(&s, &[], "go", "text", "x", now()).unwrap_err();
    assert!(
        matches!(&e, FlowError::Expression { expr, .. } if expr == "actor_input + 1 > 0"),
        "{e:?}"
    );
    assert_eq!(e.class(), crate::ErrorClass::Invalid);
}

/// A user state `a` with `go` to `b`, where `go` carries `cond`, `unless`
/// and `assign` as given, and `b` renders `b`.
fn failing_at_run_time(
    cond: Option<&str>,
    unless: Option<&str>,
    assign: Option<&str>,
    b: &str,
) -> Result<Flow, FlowError> {
    let mut go = TransitionDef::new("go", "a", "b");
    go.cond = cond
        .map(|c| Condition::Expr(c.into()))
        .into_iter()
        .collect();
    go.unless = unless
        .map(|c| Condition::Expr(c.into()))
        .into_iter()
        .collect();
    go.assign = assign
        .map(|e| ("x".to_owned(), e.to_owned()))
        .into_iter()
        .collect();
    FlowBuilder::new("t")
        .template("a.j2", "a")
        .template("b.j2", b)
        .user_state("a", "a.j2")
        .user_state("b", "b.j2")
        .field("x", json!(null))
        .transition(go)
        .build()
}

#[test]
fn an_expression_or_template_failing_at_run_time_is_invalid_not_internal() {
    // Filters and tests named by the data (`map`, `select`) are looked up
    // when they run; so are templates included by a name from the data.
    // (cond, unless, assign, template of `b`, what the error names)
    type Case<'a> = (
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
        &'a str,
        &'a str,
    );
    let cases: [Case<'_>; 9] = [
        (None, None, Some("nosuch(1)"), "b", "nosuch(1)"),
        (
            Some("nosuch(actor_input)"),
            None,
            None,
            "b",
            "nosuch(actor_input)",
        ),
        (None, Some("actor_input(1)"), None, "b", "actor_input(1)"),
        (
            Some("[1] | map(actor_input) | list"),
            None,
            None,
            "b",
            "[1] | map(actor_input) | list",
        ),
        (
            None,
            None,
            Some("[1] | select(actor_input) | list"),
            "b",
            "[1] | select(actor_input) | list",
        ),
        (None, None, None, "{{ nosuch(1) }}", "b.j2"),
        (None, None, None, "{% include actor_input %}", "b.j2"),
        (
            None,
            None,
            None,
            "{{ [1] | map(actor_input) | list }}",
            "b.j2",
        ),
        (
            None,
            None,
            None,
            "{{ [1] | select(actor_input) | list }}",
            "b.j2",
        ),
    ];
    for (cond, unless, assign, b, what) in cases {
        let flow = failing_at_run_time(cond, unless, assign, b).unwrap();
        let s = flow.start(&sid("s"), now()).unwrap().session;
        let e = flow
            .fire(&s, &[], "go", "nosuch.j2", "x", now())
            .unwrap_err();
        match &e {
            FlowError::Expression { expr, .. } => assert_eq!(expr, what),
            FlowError::Template { what: t, .. } => assert_eq!(t, what),
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(e.class(), crate::ErrorClass::Invalid, "{what}: {e:?}");
    }
}

#[test]
fn dict_templates_model_fields_and_parsed_objects_keep_their_order() {
    let text = r#"
name: order
initial: a
model:
  zeta: 1
  alpha: {y: 1, x: 2}
  obj: null
states:
  - {id: a, kind: user, template: a.j2}
  - {id: i, kind: invoker, template: {zeta: a.j2, alpha: a.j2, mid: a.j2}}
transitions:
  - {event: go, from: a, to: i}
  - {event: advance, from: i, to: a, assign: {obj: parsed_actor_input}}
"#;
    let templates = BTreeMap::from([(
        "a.j2".to_owned(),
        "{% for k, v in alpha | items %}{{ k }}{% endfor %}".to_owned(),
    )]);
    let flow = Flow::from_file_text(text, templates).unwrap();
    let keys = |v: &Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    let started = flow.start(&sid("s"), now()).unwrap();
    assert_eq!(started.response.as_deref(), Some("yx"), "templates see it");
    let model = Value::Object(started.session.model.clone());
    assert_eq!(keys(&model), ["zeta", "alpha", "obj"]);
    let fired = flow
        .fire(&started.session, &[], "go", "", "1", now())
        .unwrap();
    let plan = fired.dag.unwrap();
    let combine = plan.tasks.iter().find_map(|t| match &t.kind {
        TaskKind::Combine { keys, .. } => Some(keys.clone()),
        _ => None,
    });
    assert_eq!(combine.unwrap(), ["zeta", "alpha", "mid"]);
    let back = flow
        .complete(
            &fired.session,
            &[],
            "i-1",
            r#"{"b": 1, "a": {"d": 1, "c": 2}}"#,
            "2",
            now(),
        )
        .unwrap();
    let obj = &back.session.model["obj"];
    assert_eq!(keys(obj), ["b", "a"]);
    assert_eq!(keys(&obj["a"]), ["d", "c"]);
}

#[test]
fn states_show_their_value_in_render_data() {
    let text = r#"
name: valued
initial: ask
states:
  - {id: ask, kind: user, template: show.j2, value: 1}
  - {id: answer, kind: user, template: show.j2, value: answered}
  - {id: done, kind: user, template: show.j2}
transitions:
  - {event: go, from: ask, to: answer}
  - {event: end, from: answer, to: done}
"#;
    let templates = BTreeMap::from([(
        "show.j2".to_owned(),
        "{{ state }}|{{ state_id }}|{{ state_name }}".to_owned(),
    )]);
    let flow = Flow::from_file_text(text, templates).unwrap();
    let started = flow.start(&sid("s"), now()).unwrap();
    assert_eq!(started.response.as_deref(), Some("1|1|ask"));
    let data = flow.render_data(&started.session, &[], now());
    assert_eq!((&data["state"], &data["state_id"]), (&json!(1), &json!(1)));
    assert_eq!(started.session.state, "ask", "addressed by id");
    let answered = flow
        .fire(&started.session, &[], "go", "", "x", now())
        .unwrap();
    assert_eq!(
        answered.response.as_deref(),
        Some("answered|answered|answer")
    );
    let done = flow
        .fire(&answered.session, &[], "end", "", "x", now())
        .unwrap();
    assert_eq!(
        done.response.as_deref(),
        Some("done|done|done"),
        "the id by default"
    );
    assert_eq!(flow.state_value("done"), json!("done"));
}

#[test]
fn state_values_are_strings_or_integers_unique_in_the_flow() {
    let text = r#"
name: clash
initial: a
states:
  - {id: a, kind: user, template: t.j2, value: 1}
  - {id: b, kind: user, template: t.j2, value: 1}
  - {id: c, kind: user, template: t.j2, value: a}
  - {id: d, kind: user, template: t.j2, value: 1.5}
  - {id: e, kind: user, template: t.j2, value: "1"}
transitions:
  - {event: go, from: a, to: b}
  - {event: go, from: b, to: c}
  - {event: go, from: c, to: d}
  - {event: go, from: d, to: e}
"#;
    let templates = BTreeMap::from([("t.j2".to_owned(), "t".to_owned())]);
    let Err(FlowError::Invalid(problems)) = Flow::from_file_text(text, templates) else {
        panic!("the flow loads");
    };
    let found: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        found,
        [
            "states[1].value: duplicate state value 1 (state `b`)",
            "states[3].value: a state value must be a string or an integer, not 1.5",
        ]
    );
}
