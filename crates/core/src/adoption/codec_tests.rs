//! The typed snapshot codec against the value-tree one it replaced
//! ([`super::snapshot_walk`]): the same text written, and on any input the
//! same state or the same error (path and message).

use proptest::prelude::*;
use serde_json::{Value, json};

use super::ordered::OrderedValue as V;
use super::snapshot_walk as walk;
use super::tests::arb_state;
use super::*;
use crate::Timestamp;

fn now() -> Timestamp {
    Timestamp::from_epoch_seconds(1_700_000_000.5).unwrap()
}

/// What a snapshot of `state` becomes after `edits`.
#[derive(Debug, Clone)]
enum Edit {
    /// The value at a node becomes another.
    Replace(V),
    /// The entry or item at a node is removed.
    Remove,
    /// The object entry at a node is repeated with another value, after it.
    Repeat(V),
    /// The object entry at a node moves to the front of its object.
    Front,
}

/// Every node of `v`, as child indices from the root.
fn nodes(v: &V, at: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    out.push(at.clone());
    let children: Vec<&V> = match v {
        V::Array(items) => items.iter().collect(),
        V::Object(pairs) => pairs.iter().map(|(_, v)| v).collect(),
        _ => Vec::new(),
    };
    for (i, c) in children.into_iter().enumerate() {
        at.push(i);
        nodes(c, at, out);
        at.pop();
    }
}

fn node_mut<'a>(v: &'a mut V, at: &[usize]) -> &'a mut V {
    match at.split_first() {
        None => v,
        Some((&i, rest)) => match v {
            V::Array(items) => node_mut(&mut items[i], rest),
            V::Object(pairs) => node_mut(&mut pairs[i].1, rest),
            _ => unreachable!("a path of this value"),
        },
    }
}

fn apply(v: &mut V, pick: prop::sample::Index, edit: &Edit) {
    let mut all = Vec::new();
    nodes(v, &mut Vec::new(), &mut all);
    let at = pick.get(&all).clone();
    if let Edit::Replace(x) = edit {
        *node_mut(v, &at) = x.clone();
        return;
    }
    let Some((&i, parent)) = at.split_last() else {
        return;
    };
    match (node_mut(v, parent), edit) {
        (V::Array(items), Edit::Remove) => {
            items.remove(i);
        }
        (V::Object(pairs), Edit::Remove) => {
            pairs.remove(i);
        }
        (V::Object(pairs), Edit::Repeat(x)) => {
            let key = pairs[i].0.clone();
            pairs.insert(i + 1, (key, x.clone()));
        }
        (V::Object(pairs), Edit::Front) => {
            let entry = pairs.remove(i);
            pairs.insert(0, entry);
        }
        _ => {}
    }
}

/// Numbers at the edges of what the snapshot reads.
fn arb_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_map(|x| serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)),
        prop::sample::select(vec![
            0.0,
            -0.0,
            0.5,
            1.0,
            1.5,
            -1.0,
            -2.5,
            1e-7,
            0.1 + 0.2,
            9.3e18,
            9.223372036854776e18,
            1.8446744073709552e19,
            1e300,
            253_402_300_799.0,
            253_402_300_800.0,
            -62_135_596_800.0,
            -62_135_596_801.0,
            1_700_000_000.123_456_7,
        ])
        .prop_map(|x| json!(x)),
        prop::sample::select(vec![
            json!(0),
            json!(1),
            json!(2),
            json!(-1),
            json!(11),
            json!(i64::MAX),
            json!(i64::MAX as u64 + 1),
            json!(u64::MAX),
            json!(i64::MIN),
        ]),
    ]
}

/// Any JSON, weighted towards the snapshot's keys and values.
fn arb_value() -> impl Strategy<Value = V> {
    let keys = prop::sample::select(vec![
        "_v",
        "_frozen",
        "user_id",
        "session_id",
        "metadata",
        "journey_state",
        "mastery",
        "rating",
        "level",
        "description",
        "onboarding",
        "workflow_progress",
        "steps",
        "step_id",
        "workflow_id",
        "source",
        "confidence",
        "status",
        "sessions",
        "count",
        "index",
        "last_step_in",
        "decided_at",
        "suggested_workflow_ids",
        "discovered_features",
        "completion_rate_denominator",
        "first_seen_at",
        "summary",
        "w1",
        "x",
    ]);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        arb_number(),
        prop::sample::select(vec![
            "",
            " ",
            "u",
            "a/b",
            "completed",
            "in_progress",
            "onboarded",
            "expert",
            "assigned_workflows",
            "w1",
            "\u{e9}\u{1F600}",
            "\\\"",
            "\u{1}",
        ])
        .prop_map(|s| json!(s)),
        "[a-z_]{0,6}".prop_map(Value::String),
        Just(json!([])),
        Just(json!({})),
    ];
    leaf.prop_recursive(3, 24, 4, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((keys.clone(), inner), 0..4).prop_map(|kv| Value::Object(
                kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
            )),
        ]
    })
    .prop_map(|v| V::from(&v))
}

fn arb_edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => arb_value().prop_map(Edit::Replace),
        2 => Just(Edit::Remove),
        1 => arb_value().prop_map(Edit::Repeat),
        1 => Just(Edit::Front),
    ]
}

/// A snapshot of an arbitrary state with arbitrary edits, as a value that
/// may repeat keys (so its text does).
fn arb_edited(base: impl Strategy<Value = V>) -> impl Strategy<Value = V> {
    (
        base,
        prop::collection::vec((any::<prop::sample::Index>(), arb_edit()), 0..5),
    )
        .prop_map(|(mut v, edits)| {
            for (pick, edit) in &edits {
                apply(&mut v, *pick, edit);
            }
            v
        })
}

fn arb_state_doc() -> impl Strategy<Value = V> {
    (arb_state(), prop::option::of(arb_value())).prop_map(|(mut s, meta)| {
        if let Some(V::Object(pairs)) = meta {
            s.metadata = pairs
                .iter()
                .map(|(k, v)| (k.clone(), Value::from(v)))
                .collect();
        }
        walk::encode_state(&s)
    })
}

fn arb_session_doc() -> impl Strategy<Value = V> {
    (arb_state(), any::<bool>(), 0usize..4).prop_map(|(s, assigned, catalog)| {
        let ids = ["a", "b", "w1", "c"];
        let snap = SessionSnapshot::from_adoption_state(
            &s,
            "s1",
            3,
            s.first_seen_at,
            &ids[..catalog],
            if assigned {
                CompletionRateDenominator::AssignedWorkflows
            } else {
                CompletionRateDenominator::AllCatalogWorkflows
            },
            s.last_updated_at,
        );
        walk::encode_session(&snap)
    })
}

/// The old decoder on text: parse to the ordered value, then walk it.
fn old_session_str(text: &str, now: Timestamp) -> Result<SessionSnapshot, DecodeError> {
    let v = V::parse(text).map_err(|e| walk::err("$", format!("not json: {e}")))?;
    walk::decode_session(&v, now)
}

fn check_state_text(text: &str) -> Result<(), TestCaseError> {
    let old = walk::decode_state_str(text, now());
    prop_assert_eq!(
        &UserAdoptionState::from_snapshot_str(text, now()),
        &old,
        "{}",
        text
    );
    prop_assert_eq!(
        &UserAdoptionState::from_snapshot_slice(text.as_bytes(), now()),
        &old,
        "{}",
        text
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn state_encodes_as_the_tree_did(doc in arb_state_doc()) {
        let state = walk::decode_state(&doc, now()).unwrap();
        let tree = walk::encode_state(&state);
        prop_assert_eq!(state.to_snapshot_string(), serde_json::to_string(&tree).unwrap());
        prop_assert_eq!(state.to_ordered_snapshot(), tree.clone());
        prop_assert_eq!(state.to_snapshot(), Value::from(&tree));
        for (k, w) in state.onboarding.workflow_progress.iter() {
            let V::Object(pairs) = walk::workflow_value(w) else { unreachable!() };
            prop_assert_eq!(w.to_snapshot(), Value::from(&V::Object(pairs)), "{}", k);
            for (_, st) in w.steps.iter() {
                prop_assert_eq!(st.to_snapshot(), Value::from(&walk::step_value(st)));
            }
        }
        let back = UserAdoptionState::from_snapshot_str(&state.to_snapshot_string(), now());
        prop_assert_eq!(back.as_ref(), Ok(&state));
    }

    #[test]
    fn session_snapshot_encodes_as_the_tree_did(doc in arb_session_doc()) {
        let snap = walk::decode_session(&doc, now()).unwrap();
        let tree = walk::encode_session(&snap);
        prop_assert_eq!(snap.to_snapshot_string(), serde_json::to_string(&tree).unwrap());
        prop_assert_eq!(snap.to_ordered_snapshot(), tree.clone());
        prop_assert_eq!(snap.to_snapshot(), Value::from(&tree));
        let back = SessionSnapshot::from_snapshot_str(&snap.to_snapshot_string(), now());
        prop_assert_eq!(back.as_ref(), Ok(&snap));
    }

    #[test]
    fn state_decodes_as_the_tree_did(doc in arb_edited(arb_state_doc())) {
        // The text may repeat keys; the ordered value read from it does not.
        let text = serde_json::to_string(&doc).unwrap();
        check_state_text(&text)?;
        let v = V::parse(&text).unwrap();
        let old = walk::decode_state(&v, now());
        prop_assert_eq!(&UserAdoptionState::from_ordered_snapshot(&v, now()), &old, "{}", text);
        prop_assert_eq!(
            &UserAdoptionState::from_snapshot(&Value::from(&v), now()),
            &old,
            "{}",
            text
        );
        if let Some(V::Object(onboarding)) = v.get("onboarding")
            && let Some(V::Object(progress)) =
                onboarding.iter().find(|(k, _)| k == "workflow_progress").map(|(_, v)| v)
        {
            for (_, w) in progress {
                prop_assert_eq!(
                    WorkflowProgress::from_snapshot(w, now()),
                    walk::decode_workflow_entry(w, now())
                );
            }
        }
    }

    #[test]
    fn session_snapshot_decodes_as_the_tree_did(doc in arb_edited(arb_session_doc())) {
        let text = serde_json::to_string(&doc).unwrap();
        let old = old_session_str(&text, now());
        prop_assert_eq!(&SessionSnapshot::from_snapshot_str(&text, now()), &old, "{}", text);
        let v = V::parse(&text).unwrap();
        prop_assert_eq!(&SessionSnapshot::from_ordered_snapshot(&v, now()), &old, "{}", text);
    }

    #[test]
    fn any_value_decodes_as_the_tree_did(v in arb_value(), versioned in any::<bool>()) {
        let mut v = v;
        if versioned && let V::Object(pairs) = &mut v {
            pairs.insert(0, ("_v".into(), V::Number(1.into())));
            pairs.insert(1, ("user_id".into(), V::String("u".into())));
            pairs.insert(2, ("session_id".into(), V::String("s".into())));
        }
        let text = serde_json::to_string(&v).unwrap();
        check_state_text(&text)?;
        let old = old_session_str(&text, now());
        prop_assert_eq!(&SessionSnapshot::from_snapshot_str(&text, now()), &old, "{}", text);
        prop_assert_eq!(
            WorkflowProgress::from_snapshot(&V::parse(&text).unwrap(), now()),
            walk::decode_workflow_entry(&V::parse(&text).unwrap(), now())
        );
    }

    #[test]
    fn cut_or_spliced_text_is_refused_as_the_tree_did(
        doc in arb_state_doc(),
        cut in any::<prop::sample::Index>(),
        junk in "[\\[\\]{}\",:0-9a-z \\\\.eE+-]{0,6}",
    ) {
        let text = serde_json::to_string(&doc).unwrap();
        let mut at = cut.index(text.len() + 1);
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        check_state_text(&text[..at])?;
        check_state_text(&format!("{}{junk}{}", &text[..at], &text[at..]))?;
    }

    #[test]
    fn arbitrary_text_is_read_as_the_tree_did(text in "[\\[\\]{}\",:0-9a-z_ \\\\.eE+-]{0,48}") {
        check_state_text(&text)?;
    }
}

/// Values a tree would refuse to read, wherever they are: nesting deeper
/// than serde_json's limit and numbers out of the f64 range, under known and
/// unknown keys.
#[test]
fn unreadable_values_are_refused_as_the_tree_did() {
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    for bad in [
        deep.as_str(),
        "1e400",
        "-1e400",
        "[1, 2e999]",
        "{\"a\": 1e309}",
    ] {
        for key in [
            "x",
            "metadata",
            "mastery",
            "discovered_features",
            "onboarding",
            "sessions",
            "_v",
        ] {
            let text = format!(r#"{{"_v": 1, "user_id": "u", "{key}": {bad}}}"#);
            let old = walk::decode_state_str(&text, now());
            assert!(old.is_err(), "{text}");
            assert_eq!(
                UserAdoptionState::from_snapshot_str(&text, now()),
                old,
                "{text}"
            );
        }
    }
}

/// Non-finite numbers a state built in code may hold are written as `null`,
/// as the tree wrote them.
#[test]
fn non_finite_numbers_are_written_as_the_tree_did() {
    let mut state = walk::decode_state_str(r#"{"_v": 1, "user_id": "u"}"#, now()).unwrap();
    state.onboarding.completion_rate = f64::NAN;
    let mut w = WorkflowProgress::new("w", now());
    w.confidence = f64::INFINITY;
    state.onboarding.workflow_progress.insert("w".into(), w);
    assert_eq!(
        state.to_snapshot_string(),
        serde_json::to_string(&walk::encode_state(&state)).unwrap()
    );
}

/// Metadata nested deeper than a parser reads is kept in the snapshot value.
#[test]
fn deep_metadata_is_kept_in_the_value() {
    let mut state = walk::decode_state_str(r#"{"_v": 1, "user_id": "u"}"#, now()).unwrap();
    let mut deep = json!(1);
    for _ in 0..200 {
        deep = json!([deep]);
    }
    state.metadata.insert("deep".into(), deep);
    let tree = walk::encode_state(&state);
    assert_eq!(state.to_snapshot(), Value::from(&tree));
    assert_eq!(state.to_ordered_snapshot(), tree);
    assert_eq!(
        state.to_snapshot_string(),
        serde_json::to_string(&tree).unwrap()
    );
}

/// Representative values of every JSON type, at the edges the decoders read.
fn samples() -> Vec<V> {
    [
        json!(null),
        json!(true),
        json!(false),
        json!(0),
        json!(-0.0),
        json!(-1),
        json!(1),
        json!(2.5),
        json!(1e19),
        json!(u64::MAX),
        json!(1e12),
        json!(""),
        json!(" "),
        json!("x"),
        json!("completed"),
        json!([]),
        json!([1]),
        json!(["a", 2, "b", null]),
        json!({}),
        json!({"x": 1}),
        json!({"rating": "x"}),
    ]
    .iter()
    .map(V::from)
    .collect()
}

/// A state whose snapshot holds every field, optional ones set.
fn full_state() -> UserAdoptionState {
    let text = r#"{"_v": 1, "user_id": "u1", "metadata": {"role": "admin", "n": [1, {"a": null}]},
        "journey_state": "exploring", "mastery": {"rating": 4, "level": "novice", "description": "d"},
        "discovered_features": ["f1", "f2"],
        "onboarding": {"welcomed": true, "exploration_started_at": 1000.5,
            "distinct_features_seen": 3, "explore_gate_passed": true,
            "workflow_progress": {
                "w1": {"workflow_id": "w1", "status": "in_progress", "confidence": 0.3,
                    "evidence": "e", "source": "detector", "first_detected_at": 1001.0,
                    "completed_at": null, "last_evaluated_at": 1002.0,
                    "steps": {"s1": {"step_id": "s1", "status": "completed", "confidence": 1.0,
                        "evidence": "clicked", "completed_at": 1003.0, "last_evaluated_at": 1003.0},
                        "s2": {"step_id": "s2"}}},
                "w2": {"workflow_id": "w2", "status": "completed", "completed_at": 1004.0}},
            "last_step_in": {"decided_at": 1005.0, "should_step_in": true,
                "timing_assessment": "now", "reason": "r", "suggested_workflow_ids": ["w1"]},
            "last_reasoned_at": 1006.0, "last_welcome_at": 1007.0, "proactive_support_count": 2,
            "onboarding_completed_at": 1008.0, "summary": "s", "completion_rate": 0.5},
        "first_seen_at": 999.0, "last_updated_at": 1009.0, "last_judged_at": 1010.0,
        "sessions": {"count": 2, "current_session_id": "c",
            "index": [{"session_id": "a", "session_number": 1, "started_at": 1.0, "captured_at": 2.0},
                      {"session_id": "b", "session_number": 2, "started_at": 3.0, "captured_at": 4.0}]}}"#;
    walk::decode_state_str(text, now()).unwrap()
}

/// Every edit of one node of `doc`: each sample in its place, the entry
/// removed, the entry repeated with each sample before and after it.
fn every_edit(doc: &V, mut check: impl FnMut(&V)) {
    let mut all = Vec::new();
    nodes(doc, &mut Vec::new(), &mut all);
    for at in &all {
        for x in samples() {
            let mut v = doc.clone();
            *node_mut(&mut v, at) = x.clone();
            check(&v);
            let Some((&i, parent)) = at.split_last() else {
                continue;
            };
            if let V::Object(pairs) = node_mut(&mut doc.clone(), parent) {
                let key = pairs[i].0.clone();
                let len = pairs.len();
                for place in [i, i + 1, len] {
                    let mut v = doc.clone();
                    if let V::Object(pairs) = node_mut(&mut v, parent) {
                        pairs.insert(place, (key.clone(), x.clone()));
                    }
                    check(&v);
                }
            }
        }
        // Two entries of one object wrong at once, in either order: the
        // first refused is the one the fixed order checks first.
        if let V::Object(pairs) = node_mut(&mut doc.clone(), at) {
            let len = pairs.len();
            for i in 0..len {
                for j in i + 1..len {
                    for x in [
                        json!([1]),
                        json!({"x": 1}),
                        json!("x"),
                        json!(2.5),
                        json!(true),
                    ] {
                        let x = V::from(&x);
                        for reversed in [false, true] {
                            let mut v = doc.clone();
                            if let V::Object(pairs) = node_mut(&mut v, at) {
                                pairs[i].1 = x.clone();
                                pairs[j].1 = x.clone();
                                if reversed {
                                    pairs.reverse();
                                }
                            }
                            check(&v);
                        }
                    }
                }
            }
        }
        if let Some((&i, parent)) = at.split_last() {
            let mut v = doc.clone();
            match node_mut(&mut v, parent) {
                V::Object(pairs) => {
                    pairs.remove(i);
                }
                V::Array(items) => {
                    items.remove(i);
                }
                _ => {}
            }
            check(&v);
        }
    }
}

#[test]
fn every_field_of_every_type_decodes_as_the_tree_did() {
    let mut errors = std::collections::BTreeSet::new();
    every_edit(&walk::encode_state(&full_state()), |v| {
        let text = serde_json::to_string(v).unwrap();
        let old = walk::decode_state_str(&text, now());
        assert_eq!(
            UserAdoptionState::from_snapshot_str(&text, now()),
            old,
            "{text}"
        );
        let parsed = V::parse(&text).unwrap();
        assert_eq!(
            UserAdoptionState::from_ordered_snapshot(&parsed, now()),
            old,
            "{text}"
        );
        if let Err(e) = old {
            errors.insert(e.to_string());
        }
    });
    // The edits reach the decoder's refusals, not only its first check.
    assert!(errors.len() > 40, "{errors:#?}");
}

#[test]
fn every_session_snapshot_field_of_every_type_decodes_as_the_tree_did() {
    let state = full_state();
    let snap = SessionSnapshot::from_adoption_state(
        &state,
        "s1",
        2,
        state.first_seen_at,
        &["w1", "w2", "w3"],
        CompletionRateDenominator::AssignedWorkflows,
        state.last_updated_at,
    );
    let mut errors = std::collections::BTreeSet::new();
    every_edit(&walk::encode_session(&snap), |v| {
        let text = serde_json::to_string(v).unwrap();
        let old = old_session_str(&text, now());
        assert_eq!(
            SessionSnapshot::from_snapshot_str(&text, now()),
            old,
            "{text}"
        );
        if let Err(e) = old {
            errors.insert(e.to_string());
        }
    });
    assert!(errors.len() > 15, "{errors:#?}");
}
