//! Unit tests of hooks and validators declared in a flow file: what each
//! action and validator does, refusals that change nothing, and load
//! problems with their locations.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::{ErrorClass, Machine as _, MachineError as _, ProductId, Timestamp};

fn now() -> Timestamp {
    Timestamp::from_micros(1_767_225_600_000_000).unwrap()
}

fn templates() -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "ask.j2".to_owned(),
            "{{ greeting }} ({{ count }})".to_owned(),
        ),
        (
            "done.j2".to_owned(),
            "{{ email }} {{ count }} {{ last }}".to_owned(),
        ),
    ])
}

fn load(text: &str) -> Flow {
    Flow::from_file_text(text, templates()).unwrap_or_else(|e| panic!("{e}"))
}

/// Every problem of a flow that must not load, as `location: message`.
fn problems(text: &str) -> Vec<String> {
    let def = match FlowDef::from_file_text(text, templates()) {
        Ok(def) => def,
        Err(p) => return p.iter().map(ToString::to_string).collect(),
    };
    match Flow::from_def(def) {
        Err(FlowError::Invalid(p)) => p.iter().map(ToString::to_string).collect(),
        other => panic!("must not load: {other:?}"),
    }
}

const HOOKS: &str = r#"
name: hooks
initial: ask
model: {greeting: "", count: 0, email: null, last: null}
states:
  - id: ask
    kind: user
    template: ask.j2
    on_enter:
      - assign: {greeting: "'hello'", count: 1}
  - id: done
    kind: user
    template: done.j2
    on_enter:
      - assign: {count: count + 1}
      - assign: {last: "'count was ' ~ count"}
      - assign: {email: "'nobody'"}
        when: not email
    on_exit:
      - fail: you may not leave
        when: actor_input == 'stay'
        unless: count > 5
transitions:
  - event: give
    from: ask
    to: done
    before:
      - fail: an email is needed
        unless: "'@' in actor_input"
      - assign: {email: actor_input}
  - {event: skip, from: ask, to: done}
  - {event: back, from: done, to: ask}
"#;

fn ctx(flow: Flow) -> FlowContext {
    FlowContext::new(Arc::new(flow), RunnerOptions::default())
}

fn start(c: &FlowContext) -> FlowRecord {
    let key = FlowKey::new(
        ProductId::parse("acme").unwrap(),
        FlowSessionId::parse("s1").unwrap(),
    );
    FlowRecord::create(&key, c, &FlowCommand::start(), now())
        .unwrap()
        .expect("start creates")
        .0
}

fn fire(event: &str, input: &str) -> FlowCommand {
    FlowCommand::Fire {
        event: event.into(),
        input: input.into(),
        fresh_id: "f".into(),
    }
}

/// Decides `cmd`, which must be refused with the record left as it was.
fn refused(r: &mut FlowRecord, c: &FlowContext, cmd: &FlowCommand) -> FlowError {
    let before = r.clone();
    let e = r.decide(c, cmd, now()).expect_err("refused");
    assert_eq!(*r, before, "a refusal changes nothing");
    e
}

#[test]
fn the_initial_states_enter_hooks_run_at_start() {
    let c = ctx(load(HOOKS));
    let r = start(&c);
    assert_eq!(r.session().model["greeting"], "hello");
    assert_eq!(r.session().model["count"], 1);
    assert_eq!(r.dialogue()[0].actor_text.as_deref(), Some("hello (1)"));
}

#[test]
fn assign_actions_change_the_model_and_later_actions_see_earlier_ones() {
    let c = ctx(load(HOOKS));
    let mut r = start(&c);
    let d = r
        .decide(&c, &fire("give", "ann@example.com"), now())
        .unwrap();
    let m = &r.session().model;
    assert_eq!(m["email"], "ann@example.com", "the before hook assigned it");
    assert_eq!(m["count"], 2);
    assert_eq!(m["last"], "count was 2", "the second action saw the first");
    // The target is rendered after the enter hooks: it sees what they set.
    assert!(
        d.effects
            .contains(&FlowEffect::Respond("ann@example.com 2 count was 2".into())),
        "{:?}",
        d.effects
    );
    // `when` skips an action whose condition does not hold.
    let mut r = start(&c);
    r.decide(&c, &fire("skip", ""), now()).unwrap();
    assert_eq!(r.session().model["email"], "nobody");
}

#[test]
fn a_fail_action_aborts_with_a_typed_error_and_nothing_changed() {
    let c = ctx(load(HOOKS));
    let mut r = start(&c);
    let e = refused(&mut r, &c, &fire("give", "no address"));
    assert_eq!(
        e,
        FlowError::HookFail {
            hook: "transitions[0].before[0]".into(),
            message: "an email is needed".into(),
        }
    );
    assert_eq!(e.class(), ErrorClass::Invalid);
    assert_eq!(
        e.to_string(),
        "hook `transitions[0].before[0]` refused the event: an email is needed"
    );

    r.decide(&c, &fire("give", "a@b"), now()).unwrap();
    let e = refused(&mut r, &c, &fire("back", "stay"));
    assert_eq!(
        e,
        FlowError::HookFail {
            hook: "states[1].on_exit[0]".into(),
            message: "you may not leave".into(),
        }
    );
    // `when` does not hold: the action does not run.
    r.decide(&c, &fire("back", "go"), now()).unwrap();
    assert_eq!(r.session().state, "ask");
}

#[test]
fn a_hook_assign_failing_on_its_data_is_an_invalid_expression() {
    let flow = load(
        r#"
name: t
initial: ask
model: {greeting: "", count: 0}
states:
  - {id: ask, kind: user, template: ask.j2}
transitions:
  - event: go
    from: ask
    to: ask
    before: [{assign: {count: "actor_input | int + 1 // 0"}}]
"#,
    );
    let c = ctx(flow);
    let mut r = start(&c);
    let e = refused(&mut r, &c, &fire("go", "2"));
    assert!(matches!(e, FlowError::Expression { .. }), "{e:?}");
    assert_eq!(e.class(), ErrorClass::Invalid);
}

const VALIDATORS: &str = r#"
name: validated
initial: ask
model: {greeting: "", count: 0}
validators:
  email: {regex: '^[^@\s]+@[^@\s]+$', message: "that is not an email address"}
  short: {length: {min: 1, max: 5}}
  order: {json_schema: {type: object, required: [id]}, message: "an order needs an id"}
  order_plain: {json_schema: {type: object, required: [id], properties: {id: {type: integer}}}}
  colour: {one_of: [red, green, blue]}
  contact: {regex: '@', field: contact.email}
  first_tag: {one_of: [a, b], field: tags.0}
states:
  - {id: ask, kind: user, template: ask.j2}
transitions:
  - {event: email, from: ask, to: ask, validators: [email]}
  - {event: short, from: ask, to: ask, validators: [short]}
  - {event: order, from: ask, to: ask, validators: [order]}
  - {event: order_plain, from: ask, to: ask, validators: [order_plain]}
  - {event: colour, from: ask, to: ask, validators: [colour]}
  - {event: contact, from: ask, to: ask, validators: [contact]}
  - {event: first_tag, from: ask, to: ask, validators: [first_tag, non_empty_input]}
"#;

/// Fires `event` (named as its validator) with `input`: `Ok` or the
/// validator's message.
fn check(c: &FlowContext, event: &str, input: &str) -> Result<(), String> {
    let mut r = start(c);
    match r.decide(c, &fire(event, input), now()) {
        Ok(_) => Ok(()),
        Err(FlowError::Validator { validator, message }) => {
            assert_eq!(validator, event);
            Err(message)
        }
        Err(other) => panic!("{event} {input:?}: {other}"),
    }
}

#[test]
fn each_declared_validator_accepts_and_refuses_with_its_message() {
    let c = ctx(load(VALIDATORS));
    let cases: &[(&str, &str, Result<(), &str>)] = &[
        ("email", "ann@example.com", Ok(())),
        ("email", "ann", Err("that is not an email address")),
        (
            "email",
            "a nn@example.com",
            Err("that is not an email address"),
        ),
        ("short", "héllo", Ok(())),
        (
            "short",
            "",
            Err("the input is 0 characters long, fewer than 1"),
        ),
        (
            "short",
            "abcdef",
            Err("the input is 6 characters long, more than 5"),
        ),
        ("order", r#"{"id": "x"}"#, Ok(())),
        ("order", r#"{"di": 1}"#, Err("an order needs an id")),
        ("order", "not json", Err("an order needs an id")),
        ("order_plain", r#"{"id": 7}"#, Ok(())),
        (
            "order_plain",
            r#"{"di": 7}"#,
            Err(r#"the input does not match the schema: "id" is a required property"#),
        ),
        (
            "order_plain",
            r#"{"id": "7"}"#,
            Err(r#"the input does not match the schema at `/id`: "7" is not of type "integer""#),
        ),
        ("colour", "green", Ok(())),
        (
            "colour",
            "Green",
            Err("the input is not one of `red`, `green`, `blue`"),
        ),
        ("contact", r#"{"contact": {"email": "a@b"}}"#, Ok(())),
        (
            "contact",
            r#"{"contact": {"email": "ab"}}"#,
            Err("`contact.email` does not match `@`"),
        ),
        (
            "contact",
            r#"{"contact": {}}"#,
            Err("the input has no `contact.email`"),
        ),
        ("first_tag", r#"{"tags": ["b", "z"]}"#, Ok(())),
        (
            "first_tag",
            r#"{"tags": ["z"]}"#,
            Err("`tags.0` is not one of `a`, `b`"),
        ),
    ];
    for (event, input, want) in cases {
        assert_eq!(
            check(&c, event, input),
            want.map_err(str::to_owned),
            "{event} {input:?}"
        );
    }
    let not_json = check(&c, "order_plain", "{").unwrap_err();
    assert!(
        not_json.starts_with("the input is not json: "),
        "{not_json}"
    );
}

#[test]
fn a_declared_validator_refusal_is_the_validator_refusal_and_changes_nothing() {
    let c = ctx(load(VALIDATORS));
    let mut r = start(&c);
    let e = refused(&mut r, &c, &fire("colour", "mauve"));
    assert_eq!(
        e,
        FlowError::Validator {
            validator: "colour".into(),
            message: "the input is not one of `red`, `green`, `blue`".into(),
        }
    );
    assert_eq!(e.class(), ErrorClass::Invalid);
    assert_eq!(e.field(), Some("event_input"));
}

#[test]
fn loading_reports_bad_declared_hooks_and_validators_with_their_locations() {
    let text = r#"
name: broken
initial: ask
model: {greeting: "", count: 0}
validators:
  non_empty_input: {regex: x}
  bad_re: {regex: "("}
  bad_schema: {json_schema: {type: 12}}
  none_allowed: {one_of: []}
  backwards: {length: {min: 3, max: 1}}
  no_bounds: {length: {}}
  bad_field: {regex: x, field: "a..b"}
before_transition:
  - {assign: {nope: "1"}}
after_transition:
  - {fail: x, when: "a =="}
states:
  - id: ask
    kind: user
    template: ask.j2
    on_enter:
      - {assign: {count: "count +"}}
    on_exit:
      - {fail: x, unless: "(("}
transitions:
  - event: go
    from: ask
    to: ask
    validators: [non_empty_input, bad_re, missing]
    after: [{assign: {missing: "1"}}]
"#;
    let p = problems(text);
    let at =
        |prefix: &str| -> Vec<&String> { p.iter().filter(|l| l.starts_with(prefix)).collect() };
    for (location, message) in [
        (
            "validators.non_empty_input: ",
            "validator `non_empty_input` is defined already",
        ),
        (
            "validators.bad_re: ",
            "bad regex: regex parse error: ( ^ error: unclosed group",
        ),
        (
            "validators.bad_schema: ",
            "bad json schema at `/type`: 12 is not valid",
        ),
        ("validators.none_allowed: ", "`one_of` lists no value"),
        ("validators.backwards: ", "`min` (3) is more than `max` (1)"),
        ("validators.no_bounds: ", "a length needs `min` or `max`"),
        ("validators.bad_field: ", "bad field `a..b`"),
        (
            "before_transition[0].assign.nope: ",
            "unknown model field `nope`",
        ),
        ("after_transition[0].when: ", "bad expression `a ==`"),
        (
            "states[0].on_enter[0].assign.count: ",
            "bad expression `count +`",
        ),
        ("states[0].on_exit[0].unless: ", "bad expression `((`"),
        (
            "transitions[0].after[0].assign.missing: ",
            "unknown model field `missing`",
        ),
        ("transitions[0].validators: ", "unknown validator `missing`"),
    ] {
        assert!(
            at(location).iter().any(|l| l.contains(message)),
            "{location}{message} not in {p:#?}"
        );
    }
    assert_eq!(p.len(), 13, "{p:#?}");
}

#[test]
fn loading_reports_badly_shaped_actions_and_validators_with_their_locations() {
    let text = r#"
name: broken
initial: ask
model: {greeting: "", count: 0}
validators:
  two: {regex: x, one_of: [a]}
  nothing: {message: "?"}
  typo: {regexp: x}
states:
  - id: ask
    kind: user
    template: ask.j2
    on_enter:
      - {fail: x, assign: {count: 1}}
      - {assign: {count: [1]}}
      - {}
transitions:
  - {event: go, from: ask, to: ask, before: [{faill: x}]}
"#;
    let p = problems(text);
    let locations: Vec<&str> = p.iter().map(|l| l.split(": ").next().unwrap()).collect();
    assert_eq!(
        locations,
        [
            "states[0].on_enter[0]",
            "states[0].on_enter[1].assign.count",
            "states[0].on_enter[2]",
            "transitions[0].before[0]",
            "validators.two",
            "validators.nothing",
            "validators.typo",
        ],
        "{p:#?}"
    );
    assert!(p[0].contains("either `assign"), "{p:#?}");
    assert!(p[3].contains("unknown field `faill`"), "{p:#?}");
    assert!(p[6].contains("unknown field `regexp`"), "{p:#?}");
}

#[test]
fn a_declared_validator_may_not_take_a_rust_validators_name() {
    let def = FlowDef::from_file_text(VALIDATORS, templates()).unwrap();
    let Err(FlowError::Invalid(p)) = FlowBuilder::from_def(def)
        .validator("colour", |_| Ok(()))
        .build()
    else {
        panic!("must not load");
    };
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].location, "validators.colour");
}

#[test]
fn assign_values_may_be_literals() {
    let flow = load(
        r#"
name: t
initial: ask
model: {greeting: "", count: 0}
states:
  - id: ask
    kind: user
    template: ask.j2
    on_enter: [{assign: {count: 41, greeting: "'hi'"}}, {assign: {count: count + 1}}]
"#,
    );
    let r = start(&ctx(flow));
    assert_eq!(r.session().model["count"], json!(42));
}

#[test]
fn a_transitions_assign_takes_the_same_values_as_a_hooks() {
    let text = r#"
name: t
initial: ask
model: {done: false, count: 0, note: ""}
states:
  - {id: ask, kind: user, template: ask.j2}
transitions:
  - event: go
    from: ask
    to: ask
    assign: {done: true, count: 7, note: "'seen ' ~ actor_input"}
"#;
    let c = ctx(load(text));
    let mut r = start(&c);
    r.decide(&c, &fire("go", "x"), now()).unwrap();
    let m = &r.session().model;
    assert_eq!(
        (&m["done"], &m["count"], &m["note"]),
        (&json!(true), &json!(7), &json!("seen x"))
    );
    let bad = text.replace("done: true", "done: [true]");
    assert_eq!(
        problems(&bad),
        ["transitions[0].assign.done: an expression must be a string, a number, a boolean or null"]
    );
}

#[test]
fn a_hook_for_a_transition_that_is_not_there_does_not_load() {
    let def = FlowDef::from_file_text(HOOKS, templates()).unwrap();
    let Err(FlowError::Invalid(p)) = FlowBuilder::from_def(def)
        .hook(HookPoint::Before, HookScope::Transition(3), |_| Ok(()))
        .build()
    else {
        panic!("must not load");
    };
    assert_eq!(
        p.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["hooks: a Before hook names no transition at index 3"]
    );
}
