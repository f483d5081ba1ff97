//! Unit and property tests of the adoption machine: one per command, the
//! refusals, creation, and random command sequences.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::apply::ACTIVITY_SOURCE;
use super::prompts::{
    WelcomeOutput, parse_followup_output, parse_judge_output, parse_welcome_output,
};
use super::*;
use crate::{
    Command, Decision, EntityKey, EntityKind, ErrorClass, Machine, MachineError, NotAllowed,
    ProductId, Timestamp, Transition,
};

fn at(secs: f64) -> Timestamp {
    Timestamp::from_epoch_seconds(secs).unwrap()
}

const T0: f64 = 1_767_225_600.0;

fn uid(u: &str) -> UserId {
    UserId::parse(u).unwrap()
}

fn key(u: &str) -> AdoptionKey {
    AdoptionKey::new(ProductId::parse("acme").unwrap(), uid(u))
}

fn user() -> UserAdoptionState {
    let mut m = Map::new();
    m.insert("role".into(), json!("admin"));
    UserAdoptionState::new(uid("u1"), m, at(T0))
}

fn plan() -> OnboardingPlan {
    let load = OnboardingPlan::from_config(&json!([
        {"workflow_id": "a", "name": "A",
         "activity_signals": {"any_of": [{"event_type": "a_done"}]}},
        {"workflow_id": "b", "name": "B", "prerequisite_workflow_ids": ["a"],
         "steps": [
            {"step_id": "s1", "activity_signals": {"any_of": [{"event_type": "b_s1"}]}},
            {"step_id": "s2", "activity_signals": {"any_of": [{"event_type": "b_s2"}]}}
         ]}
    ]));
    assert!(load.errors.is_empty(), "{:?}", load.errors);
    load.plan
}

fn events(events: Vec<AdoptionEvent>) -> AdoptionCommand {
    AdoptionCommand::Events {
        events,
        metadata: None,
    }
}

fn event(kind: Value) -> AdoptionEvent {
    serde_json::from_value(kind).unwrap()
}

fn action(event_type: &str) -> Activity {
    Activity {
        event_type: Some(event_type.to_owned()),
        ..Activity::default()
    }
}

/// Decides `cmd` and checks the protocol's promises: a refusal changes
/// nothing; an unchanged decision changes nothing; every transition is in
/// the journey table; there is never a deadline.
fn decide(
    s: &mut UserAdoptionState,
    plan: &OnboardingPlan,
    cmd: &AdoptionCommand,
    now: Timestamp,
) -> Result<Decision<UserAdoptionState>, AdoptionError> {
    let before = s.clone();
    let got = s.decide(plan, cmd, now);
    match &got {
        Err(_) => assert_eq!(*s, before, "a refused {} changed the state", cmd.name()),
        Ok(d) => {
            if !d.changed {
                assert_eq!(*s, before, "an unchanged {} changed the state", cmd.name());
                assert!(d.transitions.is_empty());
            }
            for t in &d.transitions {
                assert!(in_table(t), "{t:?} is not in the journey table");
            }
            assert_eq!(d.next_deadline, None);
            assert!(d.tasks.is_empty());
        }
    }
    got
}

fn in_table(t: &Transition) -> bool {
    t.from
        .as_deref()
        .is_some_and(|from| JOURNEY_TABLE.allows(from, &t.to, &t.cause))
}

fn journey(from: &str, to: &str, cause: &str) -> Transition {
    Transition::new(from.to_owned(), to.to_owned(), cause.to_owned())
}

// ---------------------------------------------------------------------------
// Events

#[test]
fn events_apply_in_order_and_a_journey_change_is_a_transition() {
    let mut s = user();
    let cmd = events(vec![
        event(
            json!({"kind": "set_mastery", "rating": 42, "level": "proficient", "description": "ships"}),
        ),
        event(json!({"kind": "set_journey_state", "state": "onboarded"})),
        event(
            json!({"kind": "upsert_workflow_progress", "workflow_id": "w1", "status": "completed", "confidence": 0.9}),
        ),
        event(
            json!({"kind": "upsert_step_progress", "workflow_id": "w1", "step_id": "s1", "status": "in_progress", "confidence": 0.4}),
        ),
        event(json!({"kind": "record_discovered_features", "features": ["/a", "/a", " ", "/b"]})),
        event(json!({"kind": "mark_welcomed"})),
        event(json!({"kind": "mark_judged"})),
        event(json!({"kind": "mark_onboarding_complete"})),
        event(json!({"kind": "set_current_session", "session_id": " ses-9 "})),
        event(
            json!({"kind": "record_session", "session_id": "ses-9", "session_number": 1, "started_at": T0 + 0.5}),
        ),
        event(json!({"kind": "set_metadata", "metadata": {"role": "viewer"}})),
    ]);
    let now = at(T0 + 60.0);
    let d = decide(&mut s, &plan(), &cmd, now).unwrap();
    assert!(d.changed);
    assert!(d.effects.is_empty());
    assert_eq!(
        d.transitions,
        [journey("onboarding", "onboarded", "set_journey_state")]
    );
    assert_eq!(d.transitions[0].detail, json!({}));
    assert_eq!(
        (s.mastery.rating, s.mastery.level),
        (10, MasteryLevel::Proficient)
    );
    assert_eq!(s.journey_state, JourneyState::Onboarded);
    let w1 = s.onboarding.workflow_progress.get("w1").unwrap();
    assert_eq!(
        (w1.status, w1.source.as_str()),
        (WorkflowStatus::Completed, "manual")
    );
    assert_eq!(
        w1.steps.get("s1").unwrap().status,
        WorkflowStatus::InProgress
    );
    assert_eq!(s.discovered_features, ["/a", "/b"]);
    assert_eq!(s.onboarding.proactive_support_count, 1);
    assert_eq!(s.last_judged_at, Some(now));
    assert_eq!(s.onboarding.onboarding_completed_at, Some(now));
    assert_eq!(s.current_session_id.as_deref(), Some("ses-9"));
    assert_eq!(s.sessions_count, 1);
    assert_eq!(s.sessions_index[0].started_at, at(T0 + 0.5));
    assert_eq!(s.sessions_index[0].captured_at, now);
    assert_eq!(s.role(), Some("viewer"));
    assert_eq!(s.last_updated_at, now);
}

#[test]
fn the_journey_transition_is_the_net_change_of_a_batch() {
    let onboarded = event(json!({"kind": "set_journey_state", "state": "onboarded"}));
    let onboarding = event(json!({"kind": "set_journey_state", "state": "onboarding"}));
    let mut s = user();
    let there_and_back = events(vec![onboarded.clone(), onboarding.clone()]);
    let d = decide(&mut s, &plan(), &there_and_back, at(T0 + 1.0)).unwrap();
    assert!(d.changed, "a batch is always stored");
    assert!(d.transitions.is_empty());
    let d = decide(
        &mut s,
        &plan(),
        &events(vec![onboarded.clone()]),
        at(T0 + 2.0),
    )
    .unwrap();
    assert_eq!(
        d.transitions,
        [journey("onboarding", "onboarded", "set_journey_state")]
    );
    let d = decide(&mut s, &plan(), &events(vec![onboarded]), at(T0 + 3.0)).unwrap();
    assert!(
        d.transitions.is_empty(),
        "setting the same journey is no change"
    );
    let d = decide(&mut s, &plan(), &events(vec![onboarding]), at(T0 + 4.0)).unwrap();
    assert_eq!(
        d.transitions,
        [journey("onboarded", "onboarding", "set_journey_state")]
    );
}

#[test]
fn one_refused_event_refuses_the_batch_and_changes_nothing() {
    let p = plan();
    let mut s = user();
    let bad = events(vec![
        event(json!({"kind": "set_journey_state", "state": "onboarded"})),
        event(
            json!({"kind": "upsert_step_progress", "workflow_id": "missing", "step_id": "s", "status": "completed", "confidence": 1}),
        ),
    ]);
    let e = decide(&mut s, &p, &bad, at(T0 + 1.0)).unwrap_err();
    assert_eq!(e.to_string(), "events[1]: no progress for workflow missing");
    assert_eq!((e.class(), e.field()), (ErrorClass::Invalid, None));
    assert_eq!(s.journey_state, JourneyState::Onboarding);

    let cases: Vec<(AdoptionEvent, &str, Option<&str>)> = vec![
        (
            event(
                json!({"kind": "upsert_workflow_progress", "workflow_id": " ", "status": "completed", "confidence": 1}),
            ),
            "events[0]: workflow_id must not be blank",
            Some("workflow_id"),
        ),
        (
            event(
                json!({"kind": "upsert_step_progress", "workflow_id": "w", "step_id": "", "status": "completed", "confidence": 1}),
            ),
            "events[0]: step_id must not be blank",
            Some("step_id"),
        ),
        (
            event(
                json!({"kind": "record_session", "session_id": "\t", "session_number": 1, "started_at": T0}),
            ),
            "events[0]: session_id must not be blank",
            Some("session_id"),
        ),
        (
            event(
                json!({"kind": "record_session", "session_id": "s", "session_number": 1, "started_at": 3e11}),
            ),
            "events[0]: started_at: timestamp 300000000000 is outside the years 1 to 9999",
            None,
        ),
        (
            AdoptionEvent::SetMastery {
                rating: f64::NAN,
                level: MasteryLevel::Novice,
                description: String::new(),
            },
            "events[0]: mastery.rating is not a finite number",
            None,
        ),
        (
            AdoptionEvent::UpsertWorkflowProgress {
                workflow_id: "w".into(),
                status: WorkflowStatus::Completed,
                confidence: f64::INFINITY,
                evidence: String::new(),
                source: None,
            },
            "events[0]: confidence is not a finite number",
            None,
        ),
    ];
    for (ev, message, field) in cases {
        let e = decide(&mut s, &p, &events(vec![ev]), at(T0 + 2.0)).unwrap_err();
        assert_eq!(e.to_string(), message);
        assert_eq!((e.class(), e.field()), (ErrorClass::Invalid, field));
        assert_eq!(e.not_allowed(), None);
    }
}

#[test]
fn events_deserialize_as_the_api_sends_them() {
    for bad in [
        json!({"kind": "teleport"}),
        json!({"kind": "set_journey_state", "state": "ONBOARDED"}),
        json!({"kind": "set_mastery", "rating": "7", "level": "novice"}),
        json!({"kind": "set_current_session", "session_id": "s", "extra": 1}),
    ] {
        assert!(
            serde_json::from_value::<AdoptionEvent>(bad.clone()).is_err(),
            "{bad}"
        );
    }
    let ev = event(
        json!({"kind": "upsert_workflow_progress", "workflow_id": "w", "status": "completed", "confidence": 1}),
    );
    assert_eq!(
        ev,
        AdoptionEvent::UpsertWorkflowProgress {
            workflow_id: "w".into(),
            status: WorkflowStatus::Completed,
            confidence: 1.0,
            evidence: String::new(),
            source: None,
        }
    );
}

// ---------------------------------------------------------------------------
// Activity

#[test]
fn activity_detects_progress_and_reports_it() {
    let p = plan();
    let mut s = user();
    let cmd = AdoptionCommand::Activity {
        actions: vec![action("a_done"), action("b_s1")],
        discovered_features: vec!["/x".into(), "/y".into()],
        metadata: None,
    };
    let now = at(T0 + 10.0);
    let d = decide(&mut s, &p, &cmd, now).unwrap();
    assert!(d.changed);
    assert!(d.transitions.is_empty());
    let [AdoptionEffect::Detected(found)] = d.effects.as_slice() else {
        panic!("{:?}", d.effects);
    };
    assert_eq!(
        serde_json::to_value(found).unwrap(),
        json!({
            "workflows": [{"workflow_id": "a", "evidence": found.workflows[0].evidence}],
            "steps": [{"workflow_id": "b", "step_id": "s1", "evidence": found.steps[0].evidence}],
            "onboarding_completed": false
        })
    );
    let a = s.onboarding.workflow_progress.get("a").unwrap();
    assert_eq!(
        (a.status, a.source.as_str()),
        (WorkflowStatus::Completed, ACTIVITY_SOURCE)
    );
    let b = s.onboarding.workflow_progress.get("b").unwrap();
    assert_eq!((b.status, b.confidence), (WorkflowStatus::InProgress, 0.5));
    assert_eq!(s.onboarding.completion_rate, 0.5);
    assert_eq!(s.onboarding.distinct_features_seen, 2);

    let cmd = AdoptionCommand::Activity {
        actions: vec![action("b_s2")],
        discovered_features: vec![],
        metadata: None,
    };
    let d = decide(&mut s, &p, &cmd, at(T0 + 20.0)).unwrap();
    let [AdoptionEffect::Detected(found)] = d.effects.as_slice() else {
        panic!("{:?}", d.effects);
    };
    assert_eq!(found.steps.len(), 1);
    assert!(!found.onboarding_completed, "b's steps are done, b is not");
    let cmd = events(vec![event(json!({
        "kind": "upsert_workflow_progress", "workflow_id": "b", "status": "completed", "confidence": 1
    }))]);
    decide(&mut s, &p, &cmd, at(T0 + 30.0)).unwrap();
    let d = decide(
        &mut s,
        &p,
        &AdoptionCommand::Activity {
            actions: vec![],
            discovered_features: vec![],
            metadata: None,
        },
        at(T0 + 40.0),
    )
    .unwrap();
    let [AdoptionEffect::Detected(found)] = d.effects.as_slice() else {
        panic!("{:?}", d.effects);
    };
    assert!(found.onboarding_completed);
    assert_eq!(s.onboarding.onboarding_completed_at, Some(at(T0 + 40.0)));
    assert_eq!(s.onboarding.completion_rate, 1.0);
}

// ---------------------------------------------------------------------------
// Replacement

#[test]
fn a_replacement_snapshot_replaces_the_state_and_its_journey_change_is_audited() {
    let p = plan();
    let mut s = user();
    let mut next = user();
    next.journey_state = JourneyState::Onboarded;
    next.mastery.rating = 4;
    let cmd = AdoptionCommand::PutState {
        state: next.to_ordered_snapshot(),
    };
    let d = decide(&mut s, &p, &cmd, at(T0 + 5.0)).unwrap();
    assert!(d.changed);
    assert_eq!(
        d.transitions,
        [journey("onboarding", "onboarded", "put_state")]
    );
    assert_eq!(s, next);

    let mut other = user();
    other.user_id = uid("someone-else");
    let e = decide(
        &mut s,
        &p,
        &AdoptionCommand::PutState {
            state: other.to_ordered_snapshot(),
        },
        at(T0 + 6.0),
    )
    .unwrap_err();
    assert_eq!(e, AdoptionError::OtherUser);
    assert_eq!(
        (e.class(), e.field()),
        (ErrorClass::Invalid, Some("$.user_id"))
    );

    let mut bad = next.to_snapshot();
    bad["mastery"]["rating"] = json!("high");
    let e = decide(
        &mut s,
        &p,
        &AdoptionCommand::PutState {
            state: OrderedValue::from(&bad),
        },
        at(T0 + 7.0),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "snapshot rejected: $.mastery.rating: expected a number, found a string"
    );
    assert_eq!(e.field(), Some("$.mastery.rating"));
}

#[test]
fn a_replacement_keeps_the_order_of_its_maps() {
    let text = r#"{"_v": 1, "user_id": "u1", "onboarding": {"workflow_progress": {
        "z": {"workflow_id": "z", "status": "completed", "confidence": 1},
        "a": {"workflow_id": "a", "status": "completed", "confidence": 1}}}}"#;
    let cmd = AdoptionCommand::PutState {
        state: OrderedValue::parse(text).unwrap(),
    };
    let mut s = user();
    decide(&mut s, &plan(), &cmd, at(T0 + 1.0)).unwrap();
    assert_eq!(s.onboarding.completed_workflow_ids(), ["z", "a"]);
    // The command survives the audit's JSON with its order.
    let back: AdoptionCommand =
        serde_json::from_str(&serde_json::to_string(&cmd).unwrap()).unwrap();
    assert_eq!(back, cmd);
}

// ---------------------------------------------------------------------------
// Runner answers

#[test]
fn a_judge_answer_moves_the_journey_and_a_malformed_one_changes_nothing() {
    let p = plan();
    let mut s = user();
    let answer = parse_judge_output(Some(
        r#"{"journey_state": "onboarded", "mastery_rating": 7.8, "mastery_level": "proficient", "mastery_description": "fast"}"#,
    ));
    let now = at(T0 + 100.0);
    let d = decide(&mut s, &p, &AdoptionCommand::JudgeAdoption { answer }, now).unwrap();
    assert_eq!(
        d.transitions,
        [journey("onboarding", "onboarded", "judge_adoption")]
    );
    assert_eq!(
        (s.mastery.rating, s.mastery.level, s.last_judged_at),
        (7, MasteryLevel::Proficient, Some(now))
    );
    let d = decide(
        &mut s,
        &p,
        &AdoptionCommand::JudgeAdoption {
            answer: parse_judge_output(Some("oops")),
        },
        at(T0 + 200.0),
    )
    .unwrap();
    assert_eq!(d, Decision::unchanged());
}

fn welcome_answer() -> WelcomeOutput {
    parse_welcome_output(
        Some(
            r#"{"should_send": true, "message": "Hi! Try B", "timing_assessment": "idle",
                "workflow_completion": [{"workflow_id": "a", "status": "completed", "confidence": 0.9, "evidence": "saw it"}],
                "suggested_flows": [{"tour_id": "b", "flow_name": "B"}], "onboarding_complete": true}"#,
        ),
        &["a", "b"],
        &["b"],
    )
}

fn welcome(seconds_on_app: f64) -> AdoptionCommand {
    AdoptionCommand::OnboardingWelcome {
        seconds_on_app,
        distinct_features_seen: Some(5),
        config: ExplorationGateConfig::default(),
        answer: welcome_answer(),
    }
}

#[test]
fn a_welcome_is_recorded_only_while_the_gate_passes() {
    let p = plan();
    let mut s = user();
    let e = decide(&mut s, &p, &welcome(10.0), at(T0 + 10.0)).unwrap_err();
    assert_eq!(
        e,
        AdoptionError::NotAllowed(
            NotAllowed::new("onboarding_welcome", "onboarding")
                .because("exploring_min_time_not_met")
        )
    );
    assert_eq!(e.class(), ErrorClass::NotAllowed);
    assert_eq!(
        e.not_allowed().unwrap().reason,
        Some("exploring_min_time_not_met")
    );
    assert_eq!(
        e.to_string(),
        "onboarding_welcome is not allowed in state onboarding (exploring_min_time_not_met)"
    );

    let now = at(T0 + 120.0);
    let d = decide(&mut s, &p, &welcome(120.0), now).unwrap();
    assert!(d.changed);
    assert!(d.transitions.is_empty());
    assert_eq!(
        d.effects,
        [AdoptionEffect::SendWelcome {
            message: "Hi! Try B".into(),
            suggested_flows: welcome_answer().suggested_flows,
        }]
    );
    let o = &s.onboarding;
    assert!(o.welcomed && o.explore_gate_passed);
    assert_eq!(o.distinct_features_seen, 5);
    assert_eq!(o.proactive_support_count, 1);
    assert_eq!(o.last_welcome_at, Some(now));
    assert_eq!(o.completed_workflow_ids(), ["a"]);
    assert!(o.last_step_in.as_ref().unwrap().should_step_in);
    assert_eq!(o.onboarding_completed_at, None, "b is outstanding");

    // The first welcome holds the cooldown: a second answer is refused.
    let e = decide(&mut s, &p, &welcome(130.0), at(T0 + 130.0)).unwrap_err();
    assert_eq!(e.not_allowed().unwrap().reason, Some("within_cooldown"));
}

#[test]
fn the_welcome_counts_recorded_features_and_never_lowers_them() {
    let p = plan();
    let mut s = user();
    s.onboarding.distinct_features_seen = 4;
    let cmd = AdoptionCommand::OnboardingWelcome {
        seconds_on_app: 100.0,
        distinct_features_seen: None,
        config: ExplorationGateConfig::default(),
        answer: welcome_answer(),
    };
    decide(&mut s, &p, &cmd, at(T0 + 100.0)).unwrap();
    assert_eq!(s.onboarding.distinct_features_seen, 4);
    let mut s = user();
    s.onboarding.distinct_features_seen = 9;
    let cmd = AdoptionCommand::OnboardingWelcome {
        seconds_on_app: 100.0,
        distinct_features_seen: Some(3),
        config: ExplorationGateConfig::default(),
        answer: welcome_answer(),
    };
    decide(&mut s, &p, &cmd, at(T0 + 100.0)).unwrap();
    assert_eq!(s.onboarding.distinct_features_seen, 9);
}

#[test]
fn welcome_numbers_must_be_finite_and_not_negative() {
    let p = plan();
    let mut s = user();
    for (cmd, field) in [
        (welcome(-1.0), "seconds_on_app"),
        (welcome(f64::NAN), "seconds_on_app"),
        (
            AdoptionCommand::OnboardingWelcome {
                seconds_on_app: 100.0,
                distinct_features_seen: None,
                config: ExplorationGateConfig {
                    min_seconds_on_app: f64::INFINITY,
                    ..ExplorationGateConfig::default()
                },
                answer: welcome_answer(),
            },
            "config.min_seconds_on_app",
        ),
        (
            AdoptionCommand::OnboardingWelcome {
                seconds_on_app: 100.0,
                distinct_features_seen: None,
                config: ExplorationGateConfig {
                    welcome_cooldown_s: -5.0,
                    ..ExplorationGateConfig::default()
                },
                answer: welcome_answer(),
            },
            "config.welcome_cooldown_s",
        ),
    ] {
        let e = decide(&mut s, &p, &cmd, at(T0 + 100.0)).unwrap_err();
        assert_eq!(e, AdoptionError::Negative { field });
        assert_eq!((e.class(), e.field()), (ErrorClass::Invalid, Some(field)));
        assert_eq!(
            e.to_string(),
            format!("{field} must be a finite number, not negative")
        );
    }
}

#[test]
fn the_gate_a_runner_asks_first_is_the_one_the_welcome_is_decided_by() {
    let p = plan();
    let cfg = ExplorationGateConfig::default();
    for seconds in [-1.0, f64::NAN, 10.0, 120.0] {
        let s = user();
        let now = at(T0 + 120.0);
        let asked = s.welcome_gate(seconds, Some(5), &cfg, now);
        let mut decided = s.clone();
        let d = decide(&mut decided, &p, &welcome(seconds), now);
        match (asked, d) {
            (Err(a), Err(d)) => assert_eq!(a, d),
            (Ok((gate, 5)), Err(AdoptionError::NotAllowed(na))) => {
                assert!(!gate.passed);
                assert_eq!(na.reason, Some(gate.reason.code()));
            }
            (Ok((gate, 5)), Ok(_)) => assert!(gate.passed),
            other => panic!("seconds {seconds}: {other:?}"),
        }
    }
    let mut s = user();
    s.discovered_features = vec!["/a".into(), "/b".into()];
    s.onboarding.distinct_features_seen = 1;
    let (_, counted) = s.welcome_gate(100.0, None, &cfg, at(T0)).unwrap();
    assert_eq!(
        counted, 2,
        "the larger of the recorded figure and the features"
    );
}

fn followup(workflow_id: &str, raw: &str) -> AdoptionCommand {
    AdoptionCommand::OnboardingFollowup {
        workflow_id: workflow_id.into(),
        event: TourEvent::Completed,
        abandoned_at_step: None,
        answer: parse_followup_output(Some(raw), &["a", "b"], &["b"]),
    }
}

#[test]
fn a_followup_records_the_tour_with_a_usable_answer() {
    let p = plan();
    let mut s = user();
    let good = r#"{"acknowledgement": "Nice.", "why_it_mattered": "A matters.", "suggested_flows": [{"tour_id": "b"}]}"#;
    let e = decide(&mut s, &p, &followup("zz\nIGNORE", good), at(T0 + 1.0)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "workflow zz IGNORE is not in this user's onboarding plan"
    );
    assert_eq!(
        (e.class(), e.field()),
        (ErrorClass::Invalid, Some("workflow_id"))
    );

    let d = decide(&mut s, &p, &followup("a", "not json"), at(T0 + 2.0)).unwrap();
    assert_eq!(d, Decision::unchanged());

    let d = decide(&mut s, &p, &followup("a", good), at(T0 + 3.0)).unwrap();
    assert!(d.changed);
    let [AdoptionEffect::SendFollowup { message, .. }] = d.effects.as_slice() else {
        panic!("{:?}", d.effects);
    };
    assert_eq!(message, "Nice. A matters.");
    let a = s.onboarding.workflow_progress.get("a").unwrap();
    assert_eq!(
        (a.status, a.source.as_str()),
        (WorkflowStatus::Completed, "tour")
    );
    assert_eq!(s.onboarding.completion_rate, 0.5);
}

fn summary(session_id: &str, started_at: f64, raw: &str, now: f64) -> AdoptionCommand {
    AdoptionCommand::SessionSummary {
        session: SessionIndexEntry {
            session_id: session_id.into(),
            session_number: 1,
            started_at: at(started_at),
            captured_at: at(now),
        },
        answer: parse_summary_output(Some(raw)),
    }
}

#[test]
fn a_summary_is_stored_and_its_session_indexed_once() {
    let p = plan();
    let mut s = user();
    let now = T0 + 600.0;
    let e = decide(&mut s, &p, &summary(" ", T0, "text", now), at(now)).unwrap_err();
    assert_eq!(
        (e.class(), e.field()),
        (ErrorClass::Invalid, Some("session_id"))
    );
    let e = decide(&mut s, &p, &summary("s1", now + 1.0, "text", now), at(now)).unwrap_err();
    assert_eq!(e.to_string(), "started_at must not be after now");
    assert_eq!(e.field(), Some("started_at"));
    let d = decide(&mut s, &p, &summary("s1", T0, "  ", now), at(now)).unwrap();
    assert_eq!(d, Decision::unchanged());

    let d = decide(
        &mut s,
        &p,
        &summary("s1", T0, "You made a project.", now),
        at(now),
    )
    .unwrap();
    assert!(d.changed && d.effects.is_empty());
    decide(
        &mut s,
        &p,
        &summary("s1", T0, "Again.", now),
        at(now + 60.0),
    )
    .unwrap();
    assert_eq!(s.sessions_count, 1);
    assert_eq!(s.onboarding.summary.as_deref(), Some("Again."));
    assert_eq!(s.last_updated_at, at(now + 60.0));
}

// ---------------------------------------------------------------------------
// Creation, key, names

#[test]
fn first_seen_commands_create_the_record_and_answers_do_not() {
    let p = plan();
    let k = key("u-new");
    let now = at(T0);
    let mut meta = Map::new();
    meta.insert("role".into(), json!("admin"));
    let cmd = AdoptionCommand::Events {
        events: vec![event(
            json!({"kind": "set_journey_state", "state": "onboarded"}),
        )],
        metadata: Some(meta),
    };
    let (s, d) = UserAdoptionState::create(&k, &p, &cmd, now)
        .unwrap()
        .unwrap();
    assert_eq!(s.user_id, k.user_id);
    assert_eq!(s.role(), Some("admin"));
    assert_eq!(
        (s.first_seen_at, s.journey_state),
        (now, JourneyState::Onboarded)
    );
    assert!(d.changed);
    assert_eq!(
        d.transitions,
        [journey("onboarding", "onboarded", "set_journey_state")]
    );

    let cmd = AdoptionCommand::Activity {
        actions: vec![action("a_done")],
        discovered_features: vec![],
        metadata: None,
    };
    let (s, d) = UserAdoptionState::create(&k, &p, &cmd, now)
        .unwrap()
        .unwrap();
    assert_eq!(s.onboarding.completed_workflow_ids(), ["a"]);
    assert_eq!(d.effects.len(), 1);

    let bad = events(vec![event(
        json!({"kind": "record_session", "session_id": "", "session_number": 1, "started_at": T0}),
    )]);
    assert!(UserAdoptionState::create(&k, &p, &bad, now).is_err());

    let mut snap = UserAdoptionState::new(k.user_id.clone(), Map::new(), at(T0 - 50.0));
    snap.journey_state = JourneyState::Onboarded;
    let put = AdoptionCommand::PutState {
        state: snap.to_ordered_snapshot(),
    };
    let (s, d) = UserAdoptionState::create(&k, &p, &put, now)
        .unwrap()
        .unwrap();
    assert_eq!(s, snap);
    assert!(d.changed && d.transitions.is_empty());
    assert_eq!(
        UserAdoptionState::create(&key("other"), &p, &put, now).unwrap_err(),
        AdoptionError::OtherUser
    );

    for answer in [
        AdoptionCommand::JudgeAdoption {
            answer: parse_judge_output(Some(r#"{"journey_state": "onboarded"}"#)),
        },
        welcome(120.0),
        followup("a", r#"{"acknowledgement": "ok"}"#),
        summary("s1", T0, "text", T0),
    ] {
        assert_eq!(UserAdoptionState::create(&k, &p, &answer, now), Ok(None));
    }
}

#[test]
fn the_key_names_product_and_user_and_the_state_its_journey() {
    let k = key("u-1");
    assert_eq!(k.product_id().as_str(), "acme");
    assert_eq!(k.entity_id(), "u-1");
    assert_eq!(UserAdoptionState::KIND, EntityKind::Adoption);
    let mut s = user();
    assert_eq!(s.state_name(), "onboarding");
    s.journey_state = JourneyState::Onboarded;
    assert_eq!(s.state_name(), "onboarded");
    assert_eq!(s.next_deadline(&plan()), None);
}

fn every_command() -> Vec<AdoptionCommand> {
    vec![
        events(vec![event(json!({"kind": "mark_judged"}))]),
        AdoptionCommand::Activity {
            actions: vec![action("a_done")],
            discovered_features: vec!["/x".into()],
            metadata: Some(Map::new()),
        },
        AdoptionCommand::PutState {
            state: user().to_ordered_snapshot(),
        },
        AdoptionCommand::JudgeAdoption {
            answer: parse_judge_output(Some(
                r#"{"journey_state": "onboarded", "mastery_rating": 3, "mastery_level": "beginner"}"#,
            )),
        },
        welcome(120.0),
        AdoptionCommand::OnboardingFollowup {
            workflow_id: "a".into(),
            event: TourEvent::Abandoned,
            abandoned_at_step: Some("2".into()),
            answer: parse_followup_output(Some(r#"{"acknowledgement": "ok"}"#), &[], &[]),
        },
        summary("s1", T0, "text", T0),
    ]
}

#[test]
fn commands_are_data_named_as_their_wire_tag() {
    let names: Vec<&str> = every_command().iter().map(Command::name).collect();
    assert_eq!(
        names,
        [
            "events",
            "activity",
            "put_state",
            "judge_adoption",
            "onboarding_welcome",
            "onboarding_followup",
            "session_summary"
        ]
    );
    for cmd in every_command() {
        let v = serde_json::to_value(&cmd).unwrap();
        assert_eq!(v["command"], cmd.name());
        // As text, so a snapshot keeps the order of its maps.
        let back: AdoptionCommand =
            serde_json::from_str(&serde_json::to_string(&cmd).unwrap()).unwrap();
        assert_eq!(back, cmd);
    }
    assert!(
        serde_json::from_value::<AdoptionCommand>(
            json!({"command": "events", "events": [], "x": 1})
        )
        .is_err()
    );
}

// ---------------------------------------------------------------------------
// Random command sequences

fn arb_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => -2.0f64..12.0,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(1e300),
    ]
}

fn arb_id() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b", "c", " ", "", "s1", "s2"]).prop_map(str::to_owned)
}

fn arb_event() -> impl Strategy<Value = AdoptionEvent> {
    let status = prop::sample::select(WorkflowStatus::ALL.to_vec());
    prop_oneof![
        prop::sample::select(JourneyState::ALL.to_vec())
            .prop_map(|state| AdoptionEvent::SetJourneyState { state }),
        (
            arb_f64(),
            prop::sample::select(MasteryLevel::ALL.to_vec()),
            "[a-z ]{0,6}"
        )
            .prop_map(|(rating, level, description)| AdoptionEvent::SetMastery {
                rating,
                level,
                description
            }),
        prop::collection::vec("[a-z/ ]{0,4}", 0..3)
            .prop_map(|features| AdoptionEvent::RecordDiscoveredFeatures { features }),
        (
            arb_id(),
            status.clone(),
            arb_f64(),
            "[a-z]{0,4}",
            prop::option::of("[a-z]{0,4}")
        )
            .prop_map(|(workflow_id, status, confidence, evidence, source)| {
                AdoptionEvent::UpsertWorkflowProgress {
                    workflow_id,
                    status,
                    confidence,
                    evidence,
                    source,
                }
            }),
        (arb_id(), arb_id(), status, arb_f64(), "[a-z]{0,4}").prop_map(
            |(workflow_id, step_id, status, confidence, evidence)| {
                AdoptionEvent::UpsertStepProgress {
                    workflow_id,
                    step_id,
                    status,
                    confidence,
                    evidence,
                }
            }
        ),
        Just(AdoptionEvent::MarkWelcomed),
        Just(AdoptionEvent::MarkJudged),
        Just(AdoptionEvent::MarkOnboardingComplete),
        arb_id().prop_map(|session_id| AdoptionEvent::SetCurrentSession { session_id }),
        (
            arb_id(),
            0u64..5,
            prop_oneof![
                4 => (0i64..100_000).prop_map(|s| T0 - s as f64),
                1 => Just(1e300),
                1 => Just(f64::NAN),
            ]
        )
            .prop_map(|(session_id, session_number, started_at)| {
                AdoptionEvent::RecordSession {
                    session_id,
                    session_number,
                    started_at,
                }
            }),
        prop::option::of("[a-z]{0,5}").prop_map(|role| {
            let mut metadata = Map::new();
            if let Some(r) = role {
                metadata.insert("role".into(), Value::String(r));
            }
            AdoptionEvent::SetMetadata { metadata }
        }),
    ]
}

fn arb_answer_json() -> impl Strategy<Value = String> {
    let word = prop::sample::select(vec![
        "onboarded",
        "onboarding",
        "graduated",
        "proficient",
        "novice",
        "completed",
        "in_progress",
        "a",
        "b",
        "zz",
    ]);
    prop_oneof![
        1 => Just("not json".to_owned()),
        1 => Just(String::new()),
        6 => (
            word.clone(),
            -3.0f64..14.0,
            word.clone(),
            any::<bool>(),
            any::<bool>(),
            word.clone(),
            word,
            0.0f64..1.0,
        )
            .prop_map(|(journey, rating, level, send, complete, wf, status, conf)| {
                json!({
                    "journey_state": journey, "mastery_rating": rating, "mastery_level": level,
                    "mastery_description": "d", "reasoning": "r",
                    "should_send": send, "message": "hello", "timing_assessment": "t",
                    "workflow_completion": [{"workflow_id": wf, "status": status, "confidence": conf}],
                    "onboarding_complete": complete,
                    "acknowledgement": "ack", "why_it_mattered": "why",
                    "suggested_flows": [{"tour_id": wf}],
                })
                .to_string()
            }),
    ]
}

fn arb_command(t: f64) -> impl Strategy<Value = AdoptionCommand> {
    let features = prop::collection::vec(
        prop::sample::select(vec!["/x", "/y", "/z", " "]).prop_map(str::to_owned),
        0..3,
    );
    let actions = prop::collection::vec(
        prop::sample::select(vec!["a_done", "b_s1", "b_s2", "other"]).prop_map(action),
        0..4,
    );
    prop_oneof![
        3 => prop::collection::vec(arb_event(), 0..4).prop_map(events),
        2 => (actions, features).prop_map(|(actions, discovered_features)| {
            AdoptionCommand::Activity {
                actions,
                discovered_features,
                metadata: None,
            }
        }),
        1 => (super::tests::arb_state(), any::<bool>()).prop_map(|(mut s, same)| {
            if same {
                s.user_id = uid("u1");
            }
            AdoptionCommand::PutState {
                state: s.to_ordered_snapshot(),
            }
        }),
        1 => Just(AdoptionCommand::PutState { state: OrderedValue::Null }),
        2 => arb_answer_json().prop_map(|raw| AdoptionCommand::JudgeAdoption {
            answer: parse_judge_output(Some(&raw)),
        }),
        2 => (
            prop_oneof![Just(-1.0), Just(f64::NAN), 0.0f64..200.0],
            prop::option::of(0u64..6),
            any::<bool>(),
            arb_answer_json(),
        )
            .prop_map(|(seconds_on_app, distinct_features_seen, strict, raw)| {
                AdoptionCommand::OnboardingWelcome {
                    seconds_on_app,
                    distinct_features_seen,
                    config: if strict {
                        ExplorationGateConfig::default()
                    } else {
                        ExplorationGateConfig {
                            min_seconds_on_app: 0.0,
                            min_distinct_features: 0,
                            welcome_cooldown_s: 0.0,
                            max_proactive_support: 100,
                            ..ExplorationGateConfig::default()
                        }
                    },
                    answer: parse_welcome_output(Some(&raw), &["a", "b"], &["a", "b"]),
                }
            }),
        2 => (
            prop::sample::select(vec!["a", "b", "zz"]),
            any::<bool>(),
            prop::option::of("[a-z0-9 ]{0,3}"),
            arb_answer_json(),
        )
            .prop_map(|(wf, done, step, raw)| AdoptionCommand::OnboardingFollowup {
                workflow_id: wf.to_owned(),
                event: if done { TourEvent::Completed } else { TourEvent::Abandoned },
                abandoned_at_step: step,
                answer: parse_followup_output(Some(&raw), &[], &["a", "b"]),
            }),
        2 => (arb_id(), -100.0f64..10_000.0, prop::sample::select(vec!["", "summary"]))
            .prop_map(move |(id, ago, raw)| summary(&id, t - ago, raw, t)),
    ]
}

/// A sequence of (seconds since the start, command) with times increasing.
fn arb_run() -> impl Strategy<Value = Vec<(f64, AdoptionCommand)>> {
    prop::collection::vec(0u32..5_000, 1..12).prop_flat_map(|gaps| {
        let mut t = T0;
        let times: Vec<f64> = gaps
            .into_iter()
            .map(|g| {
                t += f64::from(g);
                t
            })
            .collect();
        times
            .into_iter()
            .map(|t| arb_command(t).prop_map(move |c| (t, c)))
            .collect::<Vec<_>>()
    })
}

fn round_trips(s: &UserAdoptionState) -> bool {
    UserAdoptionState::from_snapshot_str(&s.to_snapshot_string(), at(1.0)).as_ref() == Ok(s)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_commands_keep_the_protocol(run in arb_run(), start_fresh in any::<bool>()) {
        let p = plan();
        let k = key("u1");
        let mut state = (!start_fresh).then(user);
        for (t, cmd) in &run {
            let now = at(*t);
            match &mut state {
                None => {
                    if let Ok(Some((s, d))) = UserAdoptionState::create(&k, &p, cmd, now) {
                        prop_assert_eq!(&s.user_id, &k.user_id);
                        prop_assert!(d.changed);
                        prop_assert!(d.transitions.iter().all(in_table));
                        state = Some(s);
                    }
                }
                Some(s) => {
                    // `decide` asserts the protocol: unchanged on Err and on
                    // an unchanged decision, transitions in the table.
                    let _ = decide(s, &p, cmd, now);
                }
            }
            if let Some(s) = &state {
                prop_assert!(round_trips(s), "snapshot does not round-trip: {}", s.to_snapshot_string());
            }
        }
    }
}
