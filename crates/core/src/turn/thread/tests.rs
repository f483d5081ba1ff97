//! Tests of the thread machine: the commit command, its refusals, creation,
//! and properties over random command sequences.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::super::seed::{Channel, SupportInput, SupportLoaded, SupportState};
use super::super::{TurnState as _, begin_turn, finish_turn};
use super::*;
use crate::turn::CheckpointSource;

fn now() -> Timestamp {
    Timestamp::from_secs(1_700_000_000).unwrap()
}

fn thread_key() -> ThreadKey {
    ThreadKey {
        product_id: ProductId::parse("p").unwrap(),
        owner: crate::turn::OwnerId::parse("u1").unwrap(),
        thread: crate::turn::ThreadId::parse("t1").unwrap(),
    }
}

fn delta(appends: &[(&str, &[Value])], objects: &[(&str, Value)]) -> CheckpointDelta {
    CheckpointDelta {
        appends: appends
            .iter()
            .map(|(f, es)| ((*f).to_owned(), es.to_vec()))
            .collect(),
        objects: objects
            .iter()
            .map(|(f, v)| ((*f).to_owned(), v.clone()))
            .collect(),
    }
}

fn turn_write(delta: CheckpointDelta) -> TurnEffect {
    TurnEffect::Write {
        delta,
        source: CheckpointSource::Turn,
    }
}

/// A thread after two turns.
fn two_turns() -> Checkpoint {
    let mut cp = Checkpoint::default();
    cp.apply(&delta(
        &[("transcript", &[json!("hi"), json!("hello")])],
        &[("session_progress", json!({"turn_count": 1}))],
    ));
    cp.apply(&delta(
        &[("transcript", &[json!("sleep?"), json!("badly")])],
        &[("session_progress", json!({"turn_count": 2}))],
    ));
    cp
}

/// Decides `command` on `state`; on a refusal, checks that the state is
/// exactly as it was.
fn check(state: &mut Checkpoint, command: &TurnCommand) -> Result<Decision<Checkpoint>, TurnError> {
    let before = state.clone();
    let result = state.decide(&(), command, now());
    if result.is_err() {
        assert_eq!(*state, before, "a refusal changed the thread");
    }
    result
}

#[test]
fn a_commit_applies_the_delta_and_asks_to_write_only_it() {
    let mut cp = two_turns();
    let d = delta(
        &[("transcript", &[json!("again"), json!("yes")])],
        &[("session_progress", json!({"turn_count": 3}))],
    );
    let decision = check(&mut cp, &TurnCommand::commit(2, d.clone())).unwrap();
    assert_eq!(cp.version, 3);
    assert_eq!(
        cp.lists["transcript"],
        ["hi", "hello", "sleep?", "badly", "again", "yes"]
    );
    assert_eq!(cp.objects["session_progress"], json!({"turn_count": 3}));
    assert_eq!(decision.effects, [turn_write(d)]);
    assert!(decision.changed);
    assert!(decision.transitions.is_empty(), "a turn is not audited");
    assert!(decision.tasks.is_empty());
    assert_eq!(decision.next_deadline, None);
}

#[test]
fn an_empty_turn_still_counts() {
    let mut cp = two_turns();
    let decision = check(&mut cp, &TurnCommand::commit(2, CheckpointDelta::default())).unwrap();
    assert_eq!(cp.version, 3);
    assert!(decision.changed);
    assert_eq!(decision.effects, [turn_write(CheckpointDelta::default())]);
}

#[test]
fn a_list_with_no_entries_is_absent_as_stores_load_it() {
    let mut cp = two_turns();
    check(
        &mut cp,
        &TurnCommand::commit(2, delta(&[("notes", &[])], &[])),
    )
    .unwrap();
    assert!(!cp.lists.contains_key("notes"));
    let cut = cp.windowed(&LoadWindow::all().tail("transcript", 0));
    assert!(cut.lists.is_empty(), "{:?}", cut.lists);
}

#[test]
fn a_turn_begun_on_another_version_is_not_allowed() {
    for base in [0, 1, 3, u64::MAX] {
        let mut cp = two_turns();
        let err = check(
            &mut cp,
            &TurnCommand::commit(base, delta(&[("transcript", &[json!("late")])], &[])),
        )
        .unwrap_err();
        assert_eq!(
            err,
            TurnError::NotAllowed(NotAllowed::new("commit_turn", "open").because("stale_turn"))
        );
        assert_eq!(err.class(), ErrorClass::NotAllowed);
        assert_eq!(err.not_allowed().map(|n| n.reason), Some(Some(STALE_TURN)));
        assert_eq!(
            err.to_string(),
            "commit_turn is not allowed in state open (stale_turn)"
        );
    }
}

#[test]
fn a_thread_counts_turns_up_to_its_limit() {
    let mut cp = Checkpoint {
        version: u64::MAX,
        ..two_turns()
    };
    let err = check(
        &mut cp,
        &TurnCommand::commit(u64::MAX, CheckpointDelta::default()),
    )
    .unwrap_err();
    assert_eq!(err, TurnError::TurnLimit { limit: u64::MAX });
    assert_eq!(err.class(), ErrorClass::LimitExceeded);
    assert_eq!(err.not_allowed(), None);
    assert_eq!(
        err.to_string(),
        format!("thread has reached its limit of {} turns", u64::MAX)
    );
}

#[test]
fn the_first_turn_creates_the_thread_and_no_other_does() {
    let key = TurnKey::whole(thread_key());
    let d = delta(&[("transcript", &[json!("hi")])], &[("x", json!(1))]);
    let (cp, decision) = Checkpoint::create(&key, &(), &TurnCommand::commit(0, d.clone()), now())
        .unwrap()
        .expect("created");
    assert_eq!(cp.version, 1);
    assert_eq!(cp.lists["transcript"], [json!("hi")]);
    assert_eq!(cp.objects["x"], json!(1));
    assert_eq!(decision.effects, [turn_write(d.clone())]);
    assert!(decision.changed);
    assert!(decision.transitions.is_empty());
    let created = Checkpoint::create(&key, &(), &TurnCommand::commit(1, d), now()).unwrap();
    assert_eq!(
        created, None,
        "a turn of a thread that is gone creates nothing"
    );
}

#[test]
fn other_refusals_are_internal() {
    let internal = [
        TurnError::ConflictingWrites {
            field: "route",
            first: "a",
            second: "b",
        },
        TurnError::Decode {
            field: "transcript",
            message: "expected a map".to_owned(),
        },
        TurnError::Encode {
            field: "transcript",
            message: "key must be a string".to_owned(),
        },
    ];
    for e in internal {
        assert_eq!(e.class(), ErrorClass::Internal, "{e}");
        assert_eq!(e.not_allowed(), None);
    }
}

#[test]
fn the_key_names_the_product_and_owner_and_thread() {
    let key = TurnKey::new(thread_key(), LoadWindow::all().tail("transcript", 40));
    assert_eq!(key.product_id().as_str(), "p");
    assert_eq!(key.entity_id(), "u1/t1");
    assert_eq!(Checkpoint::KIND, EntityKind::Turn);
    assert_eq!(two_turns().state_name(), "open");
    assert_eq!(two_turns().next_deadline(&()), None);
}

#[test]
fn the_command_is_plain_data() {
    let c = TurnCommand::commit(
        4,
        delta(&[("transcript", &[json!("hi")])], &[("x", json!(1))]),
    );
    assert_eq!(c.name(), "commit_turn");
    let v = serde_json::to_value(&c).unwrap();
    assert_eq!(
        v,
        json!({
            "type": "commit_turn",
            "base": 4,
            "delta": {"appends": {"transcript": ["hi"]}, "objects": {"x": 1}}
        })
    );
    assert_eq!(serde_json::from_value::<TurnCommand>(v).unwrap(), c);
}

#[test]
fn the_table_has_one_state_and_no_transitions() {
    assert_eq!(TABLE.states, [OPEN]);
    assert!(TABLE.edges.is_empty());
    assert_eq!(TABLE.to_mermaid(), "stateDiagram-v2\n    [*] --> open\n");
}

fn input(message: &str) -> SupportInput {
    SupportInput {
        message: message.to_owned(),
        channel: Channel::Web,
        user_id: Some("u1".to_owned()),
        session_id: Some("t1".to_owned()),
        installed_skills: vec![],
    }
}

/// Runs a typed turn with no stages on `cp` and decides its commit.
fn typed_turn(cp: &mut Checkpoint, message: &str) -> Decision<Checkpoint> {
    let s: SupportState = begin_turn(cp, input(message), SupportLoaded::default()).unwrap();
    let base = s.book().base_version;
    let (_, delta) = finish_turn(s).unwrap();
    check(cp, &TurnCommand::commit(base, delta)).unwrap()
}

#[test]
fn typed_turns_commit_through_the_machine() {
    let mut cp = Checkpoint::default();
    let d1 = typed_turn(&mut cp, "one");
    let d2 = typed_turn(&mut cp, "two");
    assert_eq!(cp.version, 2);
    let contents: Vec<_> = cp.lists["transcript"]
        .iter()
        .map(|m| m["content"].clone())
        .collect();
    assert_eq!(contents, [json!("one"), json!("two")]);
    assert_eq!(cp.objects["session_progress"]["turn_count"], json!(2));
    // Each decision writes only its own turn's entry.
    for (d, text) in [(d1, "one"), (d2, "two")] {
        let [TurnEffect::Write { delta: w, .. }] = d.effects.as_slice() else {
            panic!("one write expected: {:?}", d.effects);
        };
        assert_eq!(w.appends["transcript"].len(), 1);
        assert_eq!(w.appends["transcript"][0]["content"], json!(text));
    }
}

// ---- properties ----

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-5i64..5).prop_map(Value::from),
        "[a-z]{0,4}".prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            prop::collection::btree_map("[a-c]", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn list_field() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["transcript", "notes"]).prop_map(str::to_owned)
}

fn object_field() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["session_memory", "progress", "pending"]).prop_map(str::to_owned)
}

fn any_delta() -> impl Strategy<Value = CheckpointDelta> {
    (
        prop::collection::btree_map(list_field(), prop::collection::vec(value(), 0..4), 0..3),
        prop::collection::btree_map(object_field(), value(), 0..3),
    )
        .prop_map(|(appends, objects)| CheckpointDelta { appends, objects })
}

fn any_checkpoint() -> impl Strategy<Value = Checkpoint> {
    (0u64..4, prop::collection::vec(any_delta(), 0..4)).prop_map(|(skip, deltas)| {
        let mut cp = Checkpoint::default();
        for d in &deltas {
            cp.apply(d);
        }
        cp.version += skip;
        cp
    })
}

/// A commit whose base is the thread's version (`None`) or this one.
fn any_command() -> impl Strategy<Value = (Option<u64>, CheckpointDelta)> {
    (
        prop_oneof![
            3 => Just(None),
            1 => (0u64..8).prop_map(Some),
            1 => Just(Some(u64::MAX)),
        ],
        any_delta(),
    )
}

fn any_window() -> impl Strategy<Value = LoadWindow> {
    prop::collection::btree_map(list_field(), 0usize..4, 0..3)
        .prop_map(|tails| LoadWindow { tails })
}

proptest! {
    #[test]
    fn random_commands_keep_the_contract(
        start in any_checkpoint(),
        commands in prop::collection::vec(any_command(), 1..8),
    ) {
        let mut cp = start;
        for (base, delta) in commands {
            let command = TurnCommand::commit(base.unwrap_or(cp.version), delta.clone());
            let before = cp.clone();
            match cp.decide(&(), &command, now()) {
                Ok(decision) => {
                    let mut expected = before.clone();
                    expected.apply(&delta);
                    prop_assert_eq!(&cp, &expected);
                    prop_assert_eq!(cp.version, before.version + 1);
                    for t in &decision.transitions {
                        prop_assert!(
                            TABLE.allows(t.from.as_deref().unwrap_or("[*]"), &t.to, &t.cause),
                            "{:?} is not in the table", t
                        );
                    }
                    prop_assert!(decision.changed);
                    prop_assert!(decision.tasks.is_empty());
                    prop_assert_eq!(decision.effects, vec![turn_write(delta)]);
                }
                Err(e) => {
                    prop_assert_eq!(&cp, &before);
                    prop_assert_ne!(Some(before.version), base);
                    prop_assert_eq!(e.class(), ErrorClass::NotAllowed);
                }
            }
            prop_assert!(cp.lists.values().all(|l| !l.is_empty()), "an empty list: {:?}", cp.lists);
            let snapshot = serde_json::to_value(&cp).unwrap();
            prop_assert_eq!(&serde_json::from_value::<Checkpoint>(snapshot).unwrap(), &cp);
            let wire = serde_json::to_value(&command).unwrap();
            prop_assert_eq!(&serde_json::from_value::<TurnCommand>(wire).unwrap(), &command);
        }
    }

    #[test]
    fn creation_is_a_commit_on_an_empty_thread(command in any_command()) {
        let (base, delta) = command;
        let base = base.unwrap_or(0);
        let command = TurnCommand::commit(base, delta);
        let created = Checkpoint::create(&TurnKey::whole(thread_key()), &(), &command, now()).unwrap();
        let mut empty = Checkpoint::default();
        match created {
            Some((cp, decision)) => {
                prop_assert_eq!(base, 0);
                let decided = empty.decide(&(), &command, now()).unwrap();
                prop_assert_eq!(cp, empty);
                prop_assert_eq!(decision, decided);
            }
            None => prop_assert_ne!(base, 0),
        }
    }

    #[test]
    fn a_windowed_thread_decides_as_the_whole_one(
        whole in any_checkpoint(),
        window in any_window(),
        delta in any_delta(),
    ) {
        let command = TurnCommand::commit(whole.version, delta);
        let mut seen = whole.clone().windowed(&window);
        let mut full = whole;
        let on_window = seen.decide(&(), &command, now());
        let on_whole = full.decide(&(), &command, now());
        prop_assert_eq!(&on_window, &on_whole);
        prop_assert_eq!(seen.windowed(&window), full.windowed(&window));
    }
}

fn pending(stage: &str) -> PendingInterrupt {
    PendingInterrupt {
        stage: stage.to_owned(),
        step: 3,
        stages: vec![stage.to_owned()],
        join: None,
        payload: json!({"question": "Should I delete it?"}),
        suspended: json!({"message": "forget it"}),
    }
}

#[test]
fn an_interrupted_turn_commits_what_it_gained_and_waits() {
    let mut cp = two_turns();
    let d = delta(&[("transcript", &[json!("forget it")])], &[]);
    let decision = check(
        &mut cp,
        &TurnCommand::interrupt(2, d.clone(), pending("memory_control")),
    )
    .unwrap();
    assert_eq!(cp.version, 3);
    assert_eq!(cp.pending_interrupt(), Some(pending("memory_control")));
    assert!(cp.is_interrupted());
    let [TurnEffect::Write { delta: w, source }] = decision.effects.as_slice() else {
        panic!("one write: {:?}", decision.effects);
    };
    assert_eq!(*source, CheckpointSource::Turn);
    assert_eq!(w.appends, d.appends);
    assert!(w.objects.contains_key(crate::turn::INTERRUPT_KEY));
    assert_eq!(
        cp.field_objects()
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>(),
        ["session_progress"],
        "the interrupt is not a field"
    );

    // No new turn while it waits, on any version.
    let err = check(&mut cp, &TurnCommand::commit(3, CheckpointDelta::default())).unwrap_err();
    assert_eq!(err.not_allowed().unwrap().reason, Some(INTERRUPT_PENDING));
    let err = check(
        &mut cp,
        &TurnCommand::interrupt(3, CheckpointDelta::default(), pending("x")),
    )
    .unwrap_err();
    assert_eq!(err.not_allowed().unwrap().reason, Some(INTERRUPT_PENDING));

    // A resume on another version is stale; on this one it clears the wait.
    let err = check(
        &mut cp,
        &TurnCommand::resume(2, CheckpointDelta::default(), None),
    )
    .unwrap_err();
    assert_eq!(err.not_allowed().unwrap().reason, Some(STALE_TURN));
    let rest = delta(&[("transcript", &[json!("deleted")])], &[]);
    let decision = check(&mut cp, &TurnCommand::resume(3, rest, None)).unwrap();
    let [TurnEffect::Write { source, .. }] = decision.effects.as_slice() else {
        panic!("one write");
    };
    assert_eq!(*source, CheckpointSource::Resume);
    assert_eq!(cp.version, 4);
    assert!(!cp.is_interrupted());
    assert_eq!(cp.pending_interrupt(), None);
    assert_eq!(cp.lists["transcript"].len(), 6);

    // Answered: a second resume finds nothing to resume.
    let err = check(
        &mut cp,
        &TurnCommand::resume(4, CheckpointDelta::default(), None),
    )
    .unwrap_err();
    assert_eq!(err.not_allowed().unwrap().reason, Some(NO_INTERRUPT));
    check(&mut cp, &TurnCommand::commit(4, CheckpointDelta::default())).unwrap();
}

#[test]
fn a_resumed_turn_may_stop_again() {
    let mut cp = two_turns();
    check(
        &mut cp,
        &TurnCommand::interrupt(2, CheckpointDelta::default(), pending("first")),
    )
    .unwrap();
    check(
        &mut cp,
        &TurnCommand::resume(3, CheckpointDelta::default(), Some(pending("second"))),
    )
    .unwrap();
    assert_eq!(cp.pending_interrupt().unwrap().stage, "second");
}

#[test]
fn an_update_is_a_checkpoint_of_its_own_and_cannot_touch_the_runtimes_keys() {
    let mut cp = two_turns();
    let patch = delta(&[], &[("session_progress", json!({"turn_count": 9}))]);
    let decision = check(&mut cp, &TurnCommand::update(None, patch.clone())).unwrap();
    assert_eq!(
        decision.effects,
        [TurnEffect::Write {
            delta: patch.clone(),
            source: CheckpointSource::Update
        }]
    );
    assert_eq!(cp.version, 3);
    let err = check(&mut cp, &TurnCommand::update(Some(2), patch.clone())).unwrap_err();
    assert_eq!(err.not_allowed().unwrap().reason, Some(STALE_TURN));
    check(&mut cp, &TurnCommand::update(Some(3), patch)).unwrap();
    let forged = delta(&[], &[(crate::turn::INTERRUPT_KEY, json!(null))]);
    let err = check(&mut cp, &TurnCommand::update(None, forged)).unwrap_err();
    assert_eq!(err.not_allowed().unwrap().reason, Some(RESERVED_KEY));
    // Neither an update nor a resume creates a thread.
    let key = TurnKey::whole(thread_key());
    for command in [
        TurnCommand::update(None, CheckpointDelta::default()),
        TurnCommand::resume(0, CheckpointDelta::default(), None),
    ] {
        assert_eq!(
            Checkpoint::create(&key, &(), &command, now()).unwrap(),
            None
        );
    }
}

#[test]
fn objects_at_a_checkpoint_fold_from_the_nearest_copy() {
    let snapshot: std::collections::BTreeMap<String, Value> =
        [("a".to_owned(), json!(1)), ("b".to_owned(), json!(1))].into();
    let p1 = [("a".to_owned(), json!(2))].into();
    let p2 = [("c".to_owned(), json!(3)), ("a".to_owned(), json!(4))].into();
    let folded = crate::turn::fold_objects(snapshot, [&p1, &p2]);
    assert_eq!(
        folded,
        [
            ("a".to_owned(), json!(4)),
            ("b".to_owned(), json!(1)),
            ("c".to_owned(), json!(3))
        ]
        .into()
    );
    assert!(crate::turn::keeps_snapshot(1, 32));
    assert!(!crate::turn::keeps_snapshot(31, 32));
    assert!(crate::turn::keeps_snapshot(64, 32));
    assert!(crate::turn::keeps_snapshot(7, 1));
}

#[test]
fn no_delta_writes_the_runtimes_keys() {
    let forged = delta(&[], &[(crate::turn::INTERRUPT_KEY, json!({"stage": "x"}))]);
    let listed = delta(&[("__notes", &[json!(1)])], &[]);
    for d in [forged, listed] {
        let mut cp = two_turns();
        let err = check(&mut cp, &TurnCommand::commit(2, d.clone())).unwrap_err();
        assert_eq!(err.not_allowed().unwrap().reason, Some(RESERVED_KEY));
        check(
            &mut cp,
            &TurnCommand::interrupt(2, CheckpointDelta::default(), pending("s")),
        )
        .unwrap();
        let err = check(&mut cp, &TurnCommand::resume(3, d.clone(), None)).unwrap_err();
        assert_eq!(err.not_allowed().unwrap().reason, Some(RESERVED_KEY));
        let key = TurnKey::whole(thread_key());
        let err = Checkpoint::create(&key, &(), &TurnCommand::commit(0, d), now()).unwrap_err();
        assert_eq!(err.not_allowed().unwrap().reason, Some(RESERVED_KEY));
    }
}
