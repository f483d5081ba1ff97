//! Unit tests, one per rule, and property tests of the session machine.

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::{
    Command, Decision, EntityKey, EntityKind, ErrorClass, Machine, MachineError, NotAllowed,
    ProductId, Timestamp,
};

fn t0() -> Timestamp {
    Timestamp::from_secs(1_767_225_600).unwrap()
}

fn at(secs: f64) -> Timestamp {
    t0().plus_seconds(secs)
}

fn session() -> SessionState {
    SessionState::new(
        ProductId::parse("acme").unwrap(),
        SessionId::parse("s-1").unwrap(),
        t0(),
    )
}

fn none() -> TourCatalog {
    TourCatalog::empty()
}

fn catalog() -> TourCatalog {
    TourCatalog::from_value(&json!({
        "default_interaction_timeout_s": 25.0,
        "default_cooldown_period_s": 5.0,
        "tours": [
            {"id": "chip_0", "user_tour_id": "flow_0", "interaction_timeout_s": 40.0, "cooldown_period_s": 200.0},
            {"id": "chip_1", "user_tour_id": "flow_1", "interaction_timeout_s": null, "cooldown_period_s": null},
        ]
    }))
    .unwrap()
}

/// A session in `proactive_assistance` since `t0`.
fn proactive() -> SessionState {
    let mut s = session();
    s.transition_to_proactive("trig", t0()).unwrap();
    s
}

#[test]
fn timeout_fires_only_when_strictly_greater() {
    let mut s = proactive();
    let out = s.tick(at(20.0), &none());
    assert_eq!(out, SessionOutcome::default());
    assert_eq!(s.current_state(), AssistState::Proactive);
    assert_eq!(s.proactive().time_since_last_interaction_s, 20.0);

    let out = s.tick(at(20.000_001), &none());
    let tr = out.transition.expect("timed out");
    assert_eq!(
        (tr.from, tr.to, tr.cause),
        (AssistState::Proactive, AssistState::Thinking, "tick")
    );
    assert_eq!(out.cooldown, CooldownChange::Started);
    assert!(s.thinking().cooldown_active);
    assert_eq!(s.thinking().cooldown_started_at, Some(at(20.000_001)));
    assert_eq!(s.thinking().active_cooldown_period_s, Some(60.0));
    // The sub-record's elapsed value is not refreshed on the timing-out tick.
    assert_eq!(s.proactive().time_since_last_interaction_s, 20.0);
}

#[test]
fn timeout_clears_guidance_and_tour_but_keeps_the_link() {
    let mut s = proactive();
    s.set_visual_guidance(true, Some("flow_9"), at(1.0));
    s.on_conversation_linked(ConversationEvent::New, "c-1")
        .unwrap();
    s.tick(at(30.0), &none());
    assert_eq!(s.current_state(), AssistState::Thinking);
    assert!(!s.visual_guidance_active());
    assert_eq!(s.active_tour_id(), None);
    assert_eq!(s.conversation_id(), Some("c-1"));
}

#[test]
fn cooldown_ends_when_elapsed_is_greater_or_equal() {
    let mut s = proactive();
    s.tick(at(21.0), &none()); // cooldown starts at 21 s for 60 s
    assert_eq!(
        s.tick(at(80.999_999), &none()).cooldown,
        CooldownChange::Unchanged
    );
    assert!(s.thinking().cooldown_active);
    assert_eq!(s.tick(at(81.0), &none()).cooldown, CooldownChange::Cleared);
    assert!(s.thinking().can_go_proactive());
    assert_eq!(s.thinking().cooldown_started_at, None);
    assert_eq!(s.thinking().active_cooldown_period_s, None);
}

#[test]
fn zero_settings_time_out_on_any_elapsed_time() {
    let mut s = session().with_settings(0.0, 0.0).unwrap();
    s.transition_to_proactive("t", t0()).unwrap();
    assert!(
        !s.tick(t0(), &none()).changed_state(),
        "zero elapsed is not > 0"
    );
    assert!(s.tick(at(0.125), &none()).changed_state());
    // A zero cooldown ends on the next tick even with no time elapsed.
    assert_eq!(s.tick(at(0.125), &none()).cooldown, CooldownChange::Cleared);
}

#[test]
fn settings_are_validated() {
    assert_eq!(
        session().with_settings(-1.0, 60.0),
        Err(SessionError::InvalidSeconds {
            field: "interaction_timeout_s",
            value: -1.0
        })
    );
    assert!(session().with_settings(20.0, f64::NAN).is_err());
    assert!(session().with_settings(20.0, f64::INFINITY).is_err());
}

#[test]
fn proactive_is_blocked_by_a_running_cooldown_and_flushes_an_expired_one() {
    let mut s = proactive();
    s.tick(at(21.0), &none());
    let out = s.transition_to_proactive("again", at(50.0)).unwrap();
    assert_eq!(out.ignored, Some("v2_cooldown_active"));
    assert!(!out.changed_state());
    assert_eq!(s.current_state(), AssistState::Thinking);

    let out = s.transition_to_proactive("again", at(81.0)).unwrap();
    assert!(out.changed_state());
    assert_eq!(out.cooldown, CooldownChange::Cleared);
    assert_eq!(s.last_interaction_at(), at(81.0));
    assert_eq!(s.proactive(), &ProactiveState::new(at(81.0)));
}

#[test]
fn reactive_is_always_allowed_from_thinking_and_clears_the_cooldown() {
    let mut s = proactive();
    s.tick(at(21.0), &none());
    let out = s.transition_to_reactive(at(22.0)).unwrap();
    assert_eq!(out.cooldown, CooldownChange::Cleared);
    assert_eq!(s.current_state(), AssistState::Reactive);
    assert_eq!(s.thinking(), &ThinkingState::default());
    assert_eq!(s.reactive(), &ReactiveState::new(at(22.0)));
}

#[test]
fn active_states_never_connect_directly() {
    let mut s = proactive();
    let before = s.clone();
    assert_eq!(
        s.transition_to_reactive(at(1.0)),
        Err(SessionError::NotAllowed(NotAllowed::new(
            "transition_to_reactive",
            "proactive_assistance"
        )))
    );
    assert!(matches!(
        s.transition_to_proactive("x", at(1.0)),
        Err(SessionError::NotAllowed(_))
    ));
    assert_eq!(s, before, "a refused command changes nothing");
    let mut r = session();
    r.transition_to_reactive(t0()).unwrap();
    assert!(r.transition_to_proactive("x", at(1.0)).is_err());
    assert!(r.transition_to_reactive(at(1.0)).is_err());
}

#[test]
fn tour_overrides_apply_while_the_tour_runs() {
    let tours = catalog();
    let mut s = proactive();
    s.set_visual_guidance(true, Some("flow_0"), t0());
    assert_eq!(s.resolved_settings(&tours), (40.0, 200.0));
    assert_eq!(s.next_deadline(&tours), Some(at(40.0)));
    assert!(
        !s.tick(at(30.0), &tours).changed_state(),
        "the tour's 40 s applies, not 20 s"
    );
    assert!(s.tick(at(40.5), &tours).changed_state());
    assert_eq!(s.thinking().active_cooldown_period_s, Some(200.0));
    assert_eq!(s.next_deadline(&tours), Some(at(240.5)));
}

#[test]
fn tour_nulls_mean_the_session_settings_and_chip_ids_do_not_match() {
    let tours = catalog();
    let mut s = proactive();
    s.set_visual_guidance(true, Some("flow_1"), t0());
    assert_eq!(s.resolved_settings(&tours), (20.0, 60.0));
    s.set_visual_guidance(true, Some("chip_0"), t0());
    assert_eq!(
        s.resolved_settings(&tours),
        (20.0, 60.0),
        "looked up by flow id only"
    );
    // Without a catalog entry the session settings apply.
    s.set_visual_guidance(true, Some("flow_0"), t0());
    assert_eq!(s.resolved_settings(&none()), (20.0, 60.0));
}

#[test]
fn visual_guidance_is_ignored_in_thinking_with_its_reason() {
    let mut s = session();
    let before = s.clone();
    let out = s.set_visual_guidance(true, Some("flow_0"), at(5.0));
    assert_eq!(out.ignored, Some("v2_state_thinking"));
    assert_eq!(s, before);
}

#[test]
fn visual_guidance_start_resets_the_clock_and_end_clears_both() {
    let mut s = proactive();
    s.set_visual_guidance(true, Some("flow_0"), at(5.0));
    assert!(s.visual_guidance_active());
    assert_eq!(s.active_tour_id(), Some("flow_0"));
    assert_eq!(s.last_interaction_at(), at(5.0));
    assert_eq!(
        s.proactive().last_message_at,
        t0(),
        "the sub-state timer is not reset"
    );
    s.set_visual_guidance(false, Some("ignored"), at(6.0));
    assert!(!s.visual_guidance_active());
    assert_eq!(s.active_tour_id(), None);
    assert_eq!(s.last_interaction_at(), at(5.0));
}

#[test]
fn interactions_reset_the_clock_and_the_current_timer() {
    let mut s = proactive();
    s.tick(at(3.0), &none());
    s.record_tour_step(at(4.0));
    assert_eq!(s.last_interaction_at(), at(4.0));
    assert_eq!(s.proactive().last_message_at, at(4.0));
    assert_eq!(s.proactive().time_since_last_interaction_s, 0.0);
    s.record_option_click(at(5.0));
    assert!(s.proactive().user_clicked_option);

    let mut r = session();
    r.transition_to_reactive(t0()).unwrap();
    r.record_option_click(at(2.0));
    assert_eq!(r.last_interaction_at(), at(2.0));
    assert_eq!(
        r.reactive().last_message_at,
        t0(),
        "clicks do not reset the reactive timer"
    );
    r.record_reaction(at(3.0));
    assert_eq!(r.reactive().last_message_at, at(3.0));

    let mut th = session();
    th.record_user_interaction(at(1.0));
    assert_eq!(th.last_interaction_at(), at(1.0));
    th.record_any_interaction(at(2.0));
    assert_eq!(th.last_interaction_at(), at(2.0));
}

#[test]
fn the_gate_answers_in_order_with_exact_reasons() {
    let mut s = session();
    assert_eq!(s.can_deliver_proactive(), (true, "ok"));
    s.transition_to_proactive("t", t0()).unwrap();
    assert_eq!(
        s.can_deliver_proactive(),
        (false, "v2_state_proactive_assistance")
    );
    s.tick(at(21.0), &none());
    assert_eq!(s.can_deliver_proactive(), (false, "v2_cooldown_active"));
    s.transition_to_reactive(at(22.0)).unwrap();
    assert_eq!(
        s.can_deliver_proactive(),
        (false, "v2_state_reactive_assistance")
    );
}

#[test]
fn conversation_links_follow_new_and_reply_existing() {
    let mut s = session();
    assert_eq!(s.delivery_route(), DeliveryRoute::CreateAndLink);
    s.on_conversation_linked(ConversationEvent::ReplyExisting, "c-1")
        .unwrap();
    assert_eq!(s.delivery_route(), DeliveryRoute::SendTo("c-1"));
    s.on_conversation_linked(ConversationEvent::ReplyExisting, "c-2")
        .unwrap();
    assert_eq!(
        s.conversation_id(),
        Some("c-1"),
        "reply-existing never re-links"
    );
    s.on_conversation_linked(ConversationEvent::New, "c-3")
        .unwrap();
    assert_eq!(s.conversation_id(), Some("c-3"), "new always overwrites");
    assert_eq!(
        s.on_conversation_linked(ConversationEvent::New, ""),
        Err(SessionError::EmptyConversationId)
    );
    s.transition_to_reactive(t0()).unwrap();
    assert_eq!(
        s.delivery_route(),
        DeliveryRoute::SendTo("c-3"),
        "the state never changes the route"
    );
}

#[test]
fn next_deadline_follows_the_state() {
    let mut s = session();
    assert_eq!(s.next_deadline(&none()), None);
    s.transition_to_proactive("t", t0()).unwrap();
    assert_eq!(s.next_deadline(&none()), Some(at(20.0)));
    s.tick(at(21.0), &none());
    assert_eq!(s.next_deadline(&none()), Some(at(81.0)));
    s.tick(at(81.0), &none());
    assert_eq!(s.next_deadline(&none()), None);
}

#[test]
fn transition_table_renders_as_mermaid() {
    insta::assert_snapshot!("session_mermaid", TRANSITIONS.to_mermaid());
}

// ---- snapshot -----------------------------------------------------------

#[test]
fn snapshot_uses_the_seed_keys_and_round_trips() {
    let mut s = proactive().with_metadata(json!({"user_id": "u-1"}).as_object().unwrap().clone());
    s.set_visual_guidance(true, Some("flow_0"), at(1.0));
    s.on_conversation_linked(ConversationEvent::New, "c-1")
        .unwrap();
    let snap = s.to_snapshot();
    assert_eq!(snap["_v"], json!(2));
    assert_eq!(snap["current_state"], json!("proactive_assistance"));
    assert_eq!(snap["last_interaction_at"], json!(1_767_225_601.0));
    assert_eq!(snap["thinking"]["cooldown_started_at"], json!(null));
    assert_eq!(snap["proactive"]["last_message_at"], json!(1_767_225_600.0));
    let text = serde_json::to_vec(&snap).unwrap();
    assert_eq!(SessionState::from_snapshot_slice(&text).unwrap(), s);
}

fn decode_err(mutate: impl FnOnce(&mut serde_json::Value)) -> DecodeError {
    let mut v = proactive().to_snapshot();
    mutate(&mut v);
    SessionState::from_snapshot(&v).unwrap_err()
}

#[test]
fn wrong_or_missing_version_is_an_error() {
    for bad in [
        json!(1),
        json!(3),
        json!(2.0),
        json!("2"),
        json!(true),
        json!(null),
    ] {
        let e = decode_err(|v| v["_v"] = bad.clone());
        assert!(matches!(e, DecodeError::Version { .. }), "{bad}: {e}");
        assert_eq!(e.path(), Some("_v"));
    }
    let e = decode_err(|v| {
        v.as_object_mut().unwrap().remove("_v");
    });
    assert_eq!(e, DecodeError::Missing { path: "_v".into() });
}

#[test]
fn unknown_state_is_an_error() {
    let e = decode_err(|v| v["current_state"] = json!("PROACTIVE"));
    assert_eq!(e.to_string(), "current_state: unknown state \"PROACTIVE\"");
    let e = decode_err(|v| v["current_state"] = json!(["thinking"]));
    assert_eq!(e.path(), Some("current_state"));
}

type Mutation = Box<dyn FnOnce(&mut serde_json::Value)>;

#[test]
fn malformed_fields_are_named_by_path() {
    let cases: Vec<(&str, Mutation)> = vec![
        ("thinking", Box::new(|v| v["thinking"] = json!(null))),
        (
            "thinking.cooldown_started_at",
            Box::new(|v| {
                v["thinking"]["cooldown_active"] = json!(true);
            }),
        ),
        (
            "proactive.last_message_at",
            Box::new(|v| v["proactive"] = json!({})),
        ),
        (
            "reactive.last_message_at",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("reactive");
            }),
        ),
        (
            "last_interaction_at",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("last_interaction_at");
            }),
        ),
        (
            "interaction_timeout_s",
            Box::new(|v| v["interaction_timeout_s"] = json!("20")),
        ),
        (
            "cooldown_period_s",
            Box::new(|v| v["cooldown_period_s"] = json!(-1.0)),
        ),
        ("session_id", Box::new(|v| v["session_id"] = json!(""))),
        ("product_id", Box::new(|v| v["product_id"] = json!("a b"))),
        ("metadata", Box::new(|v| v["metadata"] = json!([]))),
        (
            "last_interaction_at",
            Box::new(|v| v["last_interaction_at"] = json!(1e300)),
        ),
        (
            "proactive.user_clicked_option",
            Box::new(|v| {
                v["proactive"]["user_clicked_option"] = json!("false");
            }),
        ),
    ];
    for (path, mutate) in cases {
        let e = decode_err(mutate);
        assert_eq!(e.path(), Some(path), "{e}");
        assert!(e.to_string().starts_with(path), "{e}");
    }
    assert!(matches!(
        SessionState::from_snapshot_slice(b"{not json"),
        Err(DecodeError::Syntax { .. })
    ));
    assert_eq!(
        SessionState::from_snapshot(&json!([])).unwrap_err().path(),
        Some("$")
    );
}

/// `SNAPSHOT_REQUIRED_KEYS` is the decoder's rule, in one place: removing a
/// key (or the object holding it) is refused, naming the key, exactly when
/// the key is listed.
#[test]
fn exactly_the_listed_keys_are_required() {
    let full = proactive().to_snapshot();
    let mut paths: Vec<(String, Option<&str>)> = Vec::new();
    for (k, v) in full.as_object().unwrap() {
        paths.push((k.clone(), None));
        if let Some(sub) = v.as_object() {
            for sk in sub.keys() {
                paths.push((format!("{k}.{sk}"), Some(k.as_str())));
            }
        }
    }
    for (path, parent) in &paths {
        let mut v = full.clone();
        match parent {
            None => v.as_object_mut().unwrap().remove(path),
            Some(p) => v[*p].as_object_mut().unwrap().remove(&path[p.len() + 1..]),
        };
        // The first listed key under the removed one (itself, or a key of
        // the object removed) is the one named.
        let lost = SNAPSHOT_REQUIRED_KEYS
            .iter()
            .find(|r| *r == path || r.starts_with(&format!("{path}.")));
        match (SessionState::from_snapshot(&v), lost) {
            (Ok(_), None) => {}
            (Err(DecodeError::Missing { path: named }), Some(r)) => assert_eq!(&named, r),
            (got, lost) => panic!("removing {path}: {got:?}, listed {lost:?}"),
        }
    }
    for r in SNAPSHOT_REQUIRED_KEYS {
        assert!(paths.iter().any(|(p, _)| p == r), "{r} is not written");
    }
}

#[test]
fn keys_with_a_seed_default_may_be_absent() {
    let mut v = session().to_snapshot();
    let m = v.as_object_mut().unwrap();
    for k in [
        "metadata",
        "interaction_timeout_s",
        "cooldown_period_s",
        "visual_guidance_active",
        "active_tour_id",
        "conversation_linked",
        "conversation_id",
        "thinking",
    ] {
        m.remove(k);
    }
    assert_eq!(SessionState::from_snapshot(&v).unwrap(), session());
}

// ---- tour catalog ---------------------------------------------------------

#[test]
fn catalog_defaults_apply_to_absent_keys_only() {
    let c = TourCatalog::from_value(&json!({
        "default_cooldown_period_s": null,
        "tours": [
            {"id": "a", "user_tour_id": "f"},
            {"id": "b", "interaction_timeout_s": null},
            null, "junk", 3, ["id"], {"user_tour_id": "no-id"},
            {"id": "a", "user_tour_id": "g", "label": "legacy"}
        ]
    }))
    .unwrap();
    assert_eq!(c.default_interaction_timeout_s, Some(20.0));
    assert_eq!(c.default_cooldown_period_s, None);
    assert_eq!(c.tours.len(), 3);
    assert_eq!(c.tours[0].interaction_timeout_s, Some(20.0));
    assert_eq!(c.tours[0].cooldown_period_s, None);
    assert_eq!(c.tours[1].interaction_timeout_s, None);
    assert_eq!(c.get("a").unwrap().user_tour_id.as_deref(), Some("f"));
    assert_eq!(c.get_by_user_tour_id("g").unwrap().id, "a");
    assert!(c.get_by_user_tour_id("").is_none());
    assert_eq!(TourCatalog::from_value(&c.to_value()).unwrap(), c);
}

#[test]
fn catalog_rejects_wrong_types_with_paths() {
    let e = TourCatalog::from_value(&json!({"tours": 5})).unwrap_err();
    assert_eq!(e.path(), Some("tours"));
    let e = TourCatalog::from_value(&json!({"tours": [{"id": 7}]})).unwrap_err();
    assert_eq!(e.path(), Some("tours[0].id"));
    let e = TourCatalog::from_value(&json!({"tours": [{}, {"id": "x", "cooldown_period_s": -2}]}))
        .unwrap_err();
    assert_eq!(e.path(), Some("tours[1].cooldown_period_s"));
    let e = TourRegistry::from_value(&json!({"tours": []})).unwrap_err();
    assert_eq!(
        e,
        DecodeError::Missing {
            path: "product_id".into()
        }
    );
}

// ---- the machine protocol ---------------------------------------------------

/// Decides `command` on `s` at `secs`, with the empty catalog.
fn decide(
    s: &mut SessionState,
    command: impl Into<SessionCommand>,
    secs: f64,
) -> Result<Decision<SessionState>, SessionError> {
    s.decide(&none(), &command.into(), at(secs))
}

/// A decision's audit lines as `(from, to, cause, detail)`.
fn audit(d: &Decision<SessionState>) -> Vec<(&str, &str, &str, serde_json::Value)> {
    d.transitions
        .iter()
        .map(|t| {
            (
                t.from.as_deref().unwrap_or("[*]"),
                t.to.as_ref(),
                t.cause.as_ref(),
                t.detail.clone(),
            )
        })
        .collect()
}

fn trigger(id: &str) -> SessionEvent {
    SessionEvent::ProactiveTrigger {
        trigger_id: id.to_owned(),
    }
}

fn link(event: ConversationEvent, id: &str) -> SessionEvent {
    SessionEvent::ConversationLinked {
        event,
        conversation_id: id.to_owned(),
    }
}

fn guidance(active: bool, tour_id: Option<&str>) -> SessionEvent {
    SessionEvent::VisualGuidance {
        active,
        tour_id: tour_id.map(str::to_owned),
    }
}

/// Checks that `command` at `secs` is refused with `expected` and leaves the
/// session exactly as it was.
fn check_refused(
    mut s: SessionState,
    command: impl Into<SessionCommand>,
    secs: f64,
    expected: SessionError,
) {
    let before = s.clone();
    assert_eq!(decide(&mut s, command, secs), Err(expected));
    assert_eq!(s, before, "a refused command changes nothing");
}

#[test]
fn a_tick_that_times_out_is_audited_as_tick() {
    let mut s = proactive();
    let d = decide(&mut s, SessionCommand::Tick, 21.0).unwrap();
    assert_eq!(
        audit(&d),
        [(
            "proactive_assistance",
            "thinking",
            "tick",
            json!({"event": "tick"})
        )]
    );
    assert!(d.changed);
    assert_eq!(d.next_deadline, Some(at(81.0)));
    assert!(d.tasks.is_empty());
    let report = SessionReport::of(&d);
    assert_eq!(report.tick.cooldown, CooldownChange::Started);
    assert_eq!(report.result, SessionOutcome::default());
}

#[test]
fn a_tick_that_only_refreshes_elapsed_times_stores_nothing() {
    let mut s = proactive();
    let d = decide(&mut s, SessionCommand::Tick, 5.0).unwrap();
    assert!(!d.changed && d.transitions.is_empty() && d.effects.is_empty());
    assert_eq!(d.next_deadline, Some(at(20.0)));
    assert_eq!(s.proactive().time_since_last_interaction_s, 5.0);
    assert_eq!(SessionReport::of(&d), SessionReport::default());
}

#[test]
fn a_tick_that_ends_a_cooldown_is_stored_without_a_transition() {
    let mut s = proactive();
    decide(&mut s, SessionCommand::Tick, 21.0).unwrap();
    let d = decide(&mut s, SessionCommand::Tick, 81.0).unwrap();
    assert!(d.changed);
    assert!(d.transitions.is_empty());
    assert_eq!(d.next_deadline, None);
    assert_eq!(SessionReport::of(&d).tick.cooldown, CooldownChange::Cleared);
}

#[test]
fn a_sweep_is_audited_as_sweep_and_always_stored() {
    let mut s = proactive();
    let d = decide(&mut s, SessionCommand::Sweep, 21.0).unwrap();
    assert_eq!(
        audit(&d),
        [(
            "proactive_assistance",
            "thinking",
            "tick",
            json!({"event": "sweep"})
        )]
    );
    assert!(d.changed);
    // At the deadline itself the timeout does not fire yet; the claimed
    // session is still written back, with its deadline.
    let mut s = proactive();
    let d = decide(&mut s, SessionCommand::Sweep, 20.0).unwrap();
    assert!(d.changed && d.transitions.is_empty());
    assert_eq!(d.next_deadline, Some(at(20.0)));
}

#[test]
fn a_proactive_trigger_from_thinking_is_audited_with_its_trigger() {
    let mut s = session();
    let d = decide(&mut s, trigger("t-1"), 1.0).unwrap();
    assert_eq!(
        audit(&d),
        [(
            "thinking",
            "proactive_assistance",
            "transition_to_proactive",
            json!({"event": "proactive_trigger", "trigger_id": "t-1"})
        )]
    );
    assert!(d.changed);
    assert_eq!(s.current_state(), AssistState::Proactive);
    assert_eq!(d.next_deadline, Some(at(21.0)));
    assert!(SessionReport::of(&d).result.changed_state());
}

#[test]
fn a_proactive_trigger_during_a_cooldown_is_ignored_and_stores_nothing() {
    let mut s = proactive();
    decide(&mut s, SessionCommand::Tick, 21.0).unwrap();
    let before = s.clone();
    let d = decide(&mut s, trigger("t-2"), 30.0).unwrap();
    assert!(!d.changed);
    assert!(d.transitions.is_empty());
    assert_eq!(
        SessionReport::of(&d).result.ignored,
        Some("v2_cooldown_active")
    );
    assert_eq!(s, before);
}

#[test]
fn an_event_after_a_timeout_follows_the_tick_in_one_decision() {
    // The tick times out and starts a cooldown; the trigger is then ignored,
    // but the tick is stored.
    let mut s = proactive();
    let d = decide(&mut s, trigger("t-3"), 21.0).unwrap();
    assert!(d.changed);
    assert_eq!(audit(&d).len(), 1);
    let report = SessionReport::of(&d);
    assert_eq!(report.tick.cooldown, CooldownChange::Started);
    assert_eq!(report.result.ignored, Some("v2_cooldown_active"));

    // Opening the chat after a timeout: two transitions, oldest first.
    let mut s = proactive();
    let d = decide(&mut s, SessionEvent::OpenChat, 21.0).unwrap();
    assert_eq!(
        audit(&d),
        [
            (
                "proactive_assistance",
                "thinking",
                "tick",
                json!({"event": "tick"})
            ),
            (
                "thinking",
                "reactive_assistance",
                "transition_to_reactive",
                json!({"event": "open_chat"})
            ),
        ]
    );
    assert_eq!(s.current_state(), AssistState::Reactive);
    assert_eq!(
        SessionReport::of(&d).result.cooldown,
        CooldownChange::Cleared
    );
}

#[test]
fn open_chat_from_thinking_is_audited() {
    let mut s = session();
    let d = decide(&mut s, SessionEvent::OpenChat, 2.0).unwrap();
    assert_eq!(
        audit(&d),
        [(
            "thinking",
            "reactive_assistance",
            "transition_to_reactive",
            json!({"event": "open_chat"})
        )]
    );
    assert_eq!(d.next_deadline, Some(at(22.0)));
}

#[test]
fn refused_commands_leave_the_session_exactly_as_it_was() {
    // 5 s in: the tick before the event would refresh the elapsed time, yet
    // a refusal must not.
    let not_allowed = |command, state| SessionError::NotAllowed(NotAllowed::new(command, state));
    check_refused(
        proactive(),
        trigger("again"),
        5.0,
        not_allowed("proactive_trigger", "proactive_assistance"),
    );
    check_refused(
        proactive(),
        SessionEvent::OpenChat,
        5.0,
        not_allowed("open_chat", "proactive_assistance"),
    );
    let mut reactive = session();
    reactive.transition_to_reactive(t0()).unwrap();
    check_refused(
        reactive.clone(),
        trigger("again"),
        5.0,
        not_allowed("proactive_trigger", "reactive_assistance"),
    );
    check_refused(
        reactive,
        SessionEvent::OpenChat,
        5.0,
        not_allowed("open_chat", "reactive_assistance"),
    );
    // An empty conversation id is refused before the tick, even when the
    // tick would time the session out.
    check_refused(
        proactive(),
        link(ConversationEvent::New, ""),
        30.0,
        SessionError::EmptyConversationId,
    );
}

#[test]
fn interactions_reset_the_clocks_and_are_stored_without_a_transition() {
    for event in [
        SessionEvent::UserMessage,
        SessionEvent::Reaction,
        SessionEvent::TourStep,
        SessionEvent::OptionClick,
    ] {
        let mut s = proactive();
        let d = decide(&mut s, event.clone(), 5.0).unwrap();
        assert!(d.changed, "{event:?}");
        assert!(
            d.transitions.is_empty() && d.effects.is_empty(),
            "{event:?}"
        );
        assert_eq!(s.last_interaction_at(), at(5.0));
        assert_eq!(s.proactive().last_message_at, at(5.0));
        assert_eq!(d.next_deadline, Some(at(25.0)));
    }
    let mut s = proactive();
    decide(&mut s, SessionEvent::OptionClick, 5.0).unwrap();
    assert!(s.proactive().user_clicked_option);
}

#[test]
fn visual_guidance_is_ignored_in_thinking_and_stored_elsewhere() {
    let mut s = session();
    let before = s.clone();
    let d = decide(&mut s, guidance(true, Some("flow_0")), 1.0).unwrap();
    assert!(!d.changed);
    assert_eq!(
        SessionReport::of(&d).result.ignored,
        Some("v2_state_thinking")
    );
    assert_eq!(s, before);

    let mut s = proactive();
    let d = s
        .decide(&catalog(), &guidance(true, Some("flow_0")).into(), at(1.0))
        .unwrap();
    assert!(d.changed && d.transitions.is_empty());
    assert_eq!(s.active_tour_id(), Some("flow_0"));
    assert_eq!(d.next_deadline, Some(at(41.0)), "the tour's timeout");
    let d = decide(&mut s, guidance(false, None), 2.0).unwrap();
    assert!(d.changed);
    assert_eq!(s.active_tour_id(), None);
}

#[test]
fn conversation_links_are_stored_without_a_transition() {
    let mut s = session();
    let d = decide(&mut s, link(ConversationEvent::ReplyExisting, "c-1"), 1.0).unwrap();
    assert!(d.changed && d.transitions.is_empty() && d.effects.is_empty());
    assert_eq!(s.conversation_id(), Some("c-1"));
    decide(&mut s, link(ConversationEvent::ReplyExisting, "c-2"), 2.0).unwrap();
    assert_eq!(s.conversation_id(), Some("c-1"));
    decide(&mut s, link(ConversationEvent::New, "c-3"), 3.0).unwrap();
    assert_eq!(s.conversation_id(), Some("c-3"));
}

#[test]
fn only_create_creates_a_session() {
    let key = SessionKey::new(
        ProductId::parse("acme").unwrap(),
        SessionId::parse("s-1").unwrap(),
    );
    let events: [SessionCommand; 4] = [
        trigger("t").into(),
        SessionEvent::OpenChat.into(),
        guidance(true, None).into(),
        link(ConversationEvent::New, "").into(),
    ];
    for command in [SessionCommand::Tick, SessionCommand::Sweep]
        .into_iter()
        .chain(events)
    {
        assert_eq!(
            SessionState::create(&key, &none(), &command, t0()),
            Ok(None),
            "{command:?}"
        );
    }
    let (s, d) = SessionState::create(&key, &none(), &SessionCommand::Create, t0())
        .unwrap()
        .unwrap();
    assert!(d.changed);
    assert!(d.transitions.is_empty(), "creation is not audited");
    assert!(d.effects.is_empty() && d.tasks.is_empty());
    assert_eq!(d.next_deadline, None);
    assert_eq!(s, session());
    assert_eq!(s.key(), key);

    // On a session that exists, `create` is a tick.
    let mut s = proactive();
    let d = decide(&mut s, SessionCommand::Create, 21.0).unwrap();
    assert_eq!(audit(&d)[0].2, "tick");
    assert_eq!(d.transitions[0].detail, json!({"event": "tick"}));
    assert_eq!(s.current_state(), AssistState::Thinking);
    let d = decide(&mut s, SessionCommand::Create, 22.0).unwrap();
    assert!(!d.changed, "a tick that changed nothing is not stored");
}

#[test]
fn errors_are_classified() {
    let e = SessionError::refused("open_chat", AssistState::Reactive);
    assert_eq!(e.class(), ErrorClass::NotAllowed);
    assert_eq!(
        e.not_allowed(),
        Some(&NotAllowed::new("open_chat", "reactive_assistance"))
    );
    assert_eq!(
        e.to_string(),
        "open_chat is not allowed in state reactive_assistance"
    );
    let e = SessionError::EmptyConversationId;
    assert_eq!(
        (e.class(), e.field(), e.not_allowed()),
        (ErrorClass::Invalid, Some("conversation_id"), None)
    );
    let e = SessionError::InvalidSeconds {
        field: "cooldown_period_s",
        value: -1.0,
    };
    assert_eq!(
        (e.class(), e.field()),
        (ErrorClass::Invalid, Some("cooldown_period_s"))
    );
}

#[test]
fn commands_are_tagged_by_type_and_named_by_it() {
    let commands: Vec<SessionCommand> = vec![
        SessionCommand::Create,
        SessionCommand::Tick,
        SessionCommand::Sweep,
        trigger("t-1").into(),
        SessionEvent::OpenChat.into(),
        SessionEvent::UserMessage.into(),
        SessionEvent::OptionClick.into(),
        SessionEvent::Reaction.into(),
        SessionEvent::TourStep.into(),
        guidance(true, Some("flow_0")).into(),
        link(ConversationEvent::ReplyExisting, "c-1").into(),
    ];
    for c in &commands {
        let v = serde_json::to_value(c).unwrap();
        assert_eq!(v["type"], json!(c.name()));
        let back: SessionCommand = serde_json::from_value(v).unwrap();
        assert_eq!(&back, c);
    }
    assert_eq!(
        serde_json::to_value(SessionCommand::from(trigger("t-1"))).unwrap(),
        json!({"type": "proactive_trigger", "trigger_id": "t-1"})
    );
    assert!(serde_json::from_value::<SessionCommand>(json!({"type": "teleport"})).is_err());
}

#[test]
fn the_key_and_names_are_the_audit_log_s() {
    let s = proactive();
    assert_eq!(SessionState::KIND, EntityKind::Session);
    assert_eq!(s.key().entity_id(), "s-1");
    assert_eq!(s.key().product_id().as_str(), "acme");
    assert_eq!(s.state_name(), "proactive_assistance");
    assert_eq!(
        Machine::next_deadline(&s, &none()),
        s.next_deadline(&none())
    );
}

#[test]
fn an_ended_tour_leaves_no_trace_of_its_id() {
    let mut s = proactive();
    s.set_visual_guidance(true, Some("flow_long_name"), at(1.0));
    s.set_visual_guidance(false, None, at(2.0));
    assert_eq!(s.active_tour_id(), None);
    s.set_visual_guidance(true, None, at(3.0));
    assert_eq!(s.active_tour_id(), None);
    let mut fresh = proactive();
    fresh.set_visual_guidance(true, None, at(3.0));
    assert_eq!(s, fresh);
    assert_eq!(s.to_snapshot(), fresh.to_snapshot());
    s.set_visual_guidance(true, Some("f"), at(4.0));
    assert_eq!(s.active_tour_id(), Some("f"));
    assert_eq!(SessionState::from_snapshot(&s.to_snapshot()), Ok(s));
}

// ---- properties -------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Advance(u32),
    Tick(bool),
    Proactive,
    Reactive,
    Any,
    User,
    Click,
    Reaction,
    TourStep,
    Guidance(bool, Option<u8>),
    Link(bool, u8),
    Roundtrip,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..400).prop_map(Op::Advance), // eighths of a second, up to 50 s
        3 => any::<bool>().prop_map(Op::Tick),
        2 => Just(Op::Proactive),
        2 => Just(Op::Reactive),
        1 => Just(Op::Any),
        1 => Just(Op::User),
        1 => Just(Op::Click),
        1 => Just(Op::Reaction),
        1 => Just(Op::TourStep),
        2 => (any::<bool>(), proptest::option::of(0u8..4)).prop_map(|(a, t)| Op::Guidance(a, t)),
        1 => (any::<bool>(), 0u8..3).prop_map(|(n, c)| Op::Link(n, c)),
        1 => Just(Op::Roundtrip),
    ]
}

fn apply(
    s: &mut SessionState,
    op: &Op,
    now: &mut Timestamp,
    tours: &TourCatalog,
) -> Option<SessionOutcome> {
    let flows = ["flow_0", "flow_1", "chip_0", "flow_x"];
    match op {
        Op::Advance(eighths) => {
            *now = now.plus_seconds(f64::from(*eighths) / 8.0);
            None
        }
        Op::Tick(with) => Some(s.tick(*now, if *with { tours } else { TourCatalog::none() })),
        Op::Proactive => s.transition_to_proactive("t", *now).ok(),
        Op::Reactive => s.transition_to_reactive(*now).ok(),
        Op::Any => Some(s.record_any_interaction(*now)),
        Op::User => Some(s.record_user_interaction(*now)),
        Op::Click => Some(s.record_option_click(*now)),
        Op::Reaction => Some(s.record_reaction(*now)),
        Op::TourStep => Some(s.record_tour_step(*now)),
        Op::Guidance(a, t) => {
            Some(s.set_visual_guidance(*a, t.map(|i| flows[usize::from(i)]), *now))
        }
        Op::Link(new, c) => {
            let ev = if *new {
                ConversationEvent::New
            } else {
                ConversationEvent::ReplyExisting
            };
            s.on_conversation_linked(ev, ["c-0", "c-1", "c-2"][usize::from(*c)])
                .ok()
        }
        Op::Roundtrip => {
            *s = SessionState::from_snapshot(&s.to_snapshot()).expect("own snapshot decodes");
            None
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_walks_stay_in_the_table(
        timeout in 0u32..200, cooldown in 0u32..600,
        ops in proptest::collection::vec(op(), 0..60),
    ) {
        let tours = catalog();
        let mut s = session()
            .with_settings(f64::from(timeout) / 8.0, f64::from(cooldown) / 8.0)
            .unwrap();
        let mut now = t0();
        for op in &ops {
            let before = s.current_state();
            let out = apply(&mut s, op, &mut now, &tours);
            match out.as_ref().and_then(|o| o.transition.as_ref()) {
                Some(tr) => {
                    prop_assert_eq!(tr.from, before);
                    prop_assert_eq!(tr.to, s.current_state());
                    prop_assert!(TRANSITIONS.allows(tr.from.as_str(), tr.to.as_str(), tr.cause),
                        "{:?} is not in the table", tr);
                }
                None => prop_assert_eq!(before, s.current_state(), "state changed without a transition"),
            }
            prop_assert_eq!(s.thinking().can_go_proactive(), !s.thinking().cooldown_active);
            let (allowed, reason) = s.can_deliver_proactive();
            prop_assert_eq!(allowed, reason == "ok");
            if s.thinking().cooldown_active {
                prop_assert!(s.thinking().cooldown_started_at.is_some());
            }
            let back = SessionState::from_snapshot(&s.to_snapshot());
            prop_assert_eq!(back.as_ref(), Ok(&s));
            // The deadline is exact: nothing is due before it, the timeout
            // fires just after it, and a cooldown ends at it.
            if let Some(d) = s.next_deadline(&tours) {
                let mut early = s.clone();
                let out = early.tick(d.plus_seconds(-0.000_001), &tours);
                prop_assert!(!out.changed_state() && out.cooldown == CooldownChange::Unchanged);
                let mut late = s.clone();
                let out = late.tick(d.plus_seconds(0.000_001), &tours);
                prop_assert!(out.changed_state() || out.cooldown == CooldownChange::Cleared);
                prop_assert_eq!(late.next_deadline(&tours).is_some_and(|n| n <= d), false);
            }
        }
    }

    #[test]
    fn arbitrary_bytes_decode_to_what_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(s) = SessionState::from_snapshot_slice(&bytes) {
            prop_assert_eq!(SessionState::from_snapshot(&s.to_snapshot()).ok(), Some(s));
        }
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
            let _ = TourCatalog::from_value(&v);
        }
    }

    #[test]
    fn mutated_snapshots_decode_to_what_round_trips(
        key in prop_oneof![
            Just("_v"), Just("current_state"), Just("last_interaction_at"), Just("thinking"),
            Just("proactive"), Just("reactive"), Just("session_id"), Just("product_id"),
            Just("interaction_timeout_s"), Just("metadata"), Just("conversation_id"),
        ],
        value in prop_oneof![
            Just(json!(null)), Just(json!(true)), Just(json!(-1)), Just(json!(1e308)),
            Just(json!("x")), Just(json!([])), Just(json!({})), Just(json!(2)),
            any::<f64>().prop_map(|x| json!(x)),
        ],
    ) {
        let mut v = proactive().to_snapshot();
        v[key] = value;
        // What decodes encodes back to a snapshot that decodes to it.
        if let Ok(s) = SessionState::from_snapshot(&v) {
            prop_assert_eq!(SessionState::from_snapshot(&s.to_snapshot()).ok(), Some(s));
        }
    }
}

fn command() -> impl Strategy<Value = SessionCommand> {
    let flows = ["flow_0", "flow_1", "chip_0", "flow_x"];
    prop_oneof![
        3 => Just(SessionCommand::Tick),
        1 => Just(SessionCommand::Sweep),
        1 => Just(SessionCommand::Create),
        2 => Just(trigger("t").into()),
        2 => Just(SessionEvent::OpenChat.into()),
        1 => Just(SessionEvent::UserMessage.into()),
        1 => Just(SessionEvent::OptionClick.into()),
        1 => Just(SessionEvent::Reaction.into()),
        1 => Just(SessionEvent::TourStep.into()),
        2 => (any::<bool>(), proptest::option::of(0usize..4))
            .prop_map(move |(a, t)| guidance(a, t.map(|i| flows[i])).into()),
        1 => (any::<bool>(), 0usize..4).prop_map(|(new, c)| {
            let event = if new { ConversationEvent::New } else { ConversationEvent::ReplyExisting };
            link(event, ["", "c-0", "c-1", "c-2"][c]).into()
        }),
    ]
}

/// What the service did before `decide`: tick, then the seed's operation.
fn tick_then_operation(
    s: &mut SessionState,
    command: &SessionCommand,
    now: Timestamp,
    tours: &TourCatalog,
) -> (SessionOutcome, Result<SessionOutcome, SessionError>) {
    let tick = s.tick(now, tours);
    let result = match command.event() {
        None => Ok(SessionOutcome::default()),
        Some(SessionEvent::ProactiveTrigger { trigger_id }) => {
            s.transition_to_proactive(trigger_id, now)
        }
        Some(SessionEvent::OpenChat) => s.transition_to_reactive(now),
        Some(SessionEvent::UserMessage) => Ok(s.record_user_interaction(now)),
        Some(SessionEvent::OptionClick) => Ok(s.record_option_click(now)),
        Some(SessionEvent::Reaction) => Ok(s.record_reaction(now)),
        Some(SessionEvent::TourStep) => Ok(s.record_tour_step(now)),
        Some(SessionEvent::VisualGuidance { active, tour_id }) => {
            Ok(s.set_visual_guidance(*active, tour_id.as_deref(), now))
        }
        Some(SessionEvent::ConversationLinked {
            event,
            conversation_id,
        }) => s.on_conversation_linked(*event, conversation_id),
    };
    (tick, result)
}

#[test]
fn a_timeout_that_ends_a_tour_times_the_next_command_by_the_session_settings() {
    // The tour's 40 s timeout is in force while it runs; the tick that
    // times it out ends the tour, so a chat opened by the same command
    // times out by the session's own 37 s.
    let tours = catalog();
    let mut s = session().with_settings(37.0, 0.0).unwrap();
    let proactive: SessionCommand = SessionEvent::ProactiveTrigger {
        trigger_id: "t".into(),
    }
    .into();
    let guided: SessionCommand = SessionEvent::VisualGuidance {
        active: true,
        tour_id: Some("flow_0".into()),
    }
    .into();
    s.decide(&tours, &proactive, t0()).unwrap();
    let d = s.decide(&tours, &guided, t0()).unwrap();
    assert_eq!(d.next_deadline, Some(at(40.0)));
    let d = s
        .decide(&tours, &SessionEvent::OpenChat.into(), at(40.125))
        .unwrap();
    assert_eq!(s.state_name(), "reactive_assistance");
    assert_eq!(s.active_tour_id(), None);
    assert_eq!(d.next_deadline, Some(at(40.125 + 37.0)));
    assert_eq!(d.next_deadline, s.next_deadline(&tours));
}

/// The session without the elapsed times a tick refreshes (derived data
/// that is not worth a write).
fn without_elapsed(s: &SessionState) -> SessionState {
    let mut s = s.clone();
    s.proactive.time_since_last_interaction_s = 0.0;
    s.reactive.time_since_last_interaction_s = 0.0;
    s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn decide_stays_in_the_table_and_refusals_change_nothing(
        timeout in 0u32..200, cooldown in 0u32..600,
        steps in proptest::collection::vec((0u32..400, command(), any::<bool>()), 0..60),
    ) {
        let catalog = catalog();
        let mut s = session()
            .with_settings(f64::from(timeout) / 8.0, f64::from(cooldown) / 8.0)
            .unwrap();
        let mut now = t0();
        for (eighths, command, with_tours) in &steps {
            now = now.plus_seconds(f64::from(*eighths) / 8.0);
            let tours = if *with_tours { &catalog } else { TourCatalog::none() };
            let before = s.clone();
            let mut expected = s.clone();
            let (tick, result) = tick_then_operation(&mut expected, command, now, tours);
            match s.decide(tours, command, now) {
                Err(e) => {
                    prop_assert_eq!(&s, &before, "a refusal changed the session");
                    prop_assert!(result.is_err() || e == SessionError::EmptyConversationId);
                    prop_assert!(e.class() != ErrorClass::Internal);
                    prop_assert_eq!(e.class() == ErrorClass::NotAllowed, e.not_allowed().is_some());
                }
                Ok(d) => {
                    // Exactly the tick, then the seed's operation.
                    prop_assert_eq!(&s, &expected);
                    let result = result.expect("decide accepted what the operation refused");
                    let report = SessionReport { tick: tick.clone(), result: result.clone() };
                    prop_assert_eq!(SessionReport::of(&d), report.clone());
                    prop_assert_eq!(d.effects.is_empty(), report == SessionReport::default());
                    // Every transition is in the table, and they chain from
                    // the state before to the state after.
                    let mut state = before.state_name();
                    for t in &d.transitions {
                        prop_assert_eq!(t.from.as_ref(), Some(&state));
                        prop_assert!(TRANSITIONS.allows(&state, &t.to, &t.cause), "{:?} is not in the table", t);
                        prop_assert!(t.detail.get("event").is_some());
                        state = t.to.clone();
                    }
                    prop_assert_eq!(state, s.state_name());
                    let ticked = tick.changed_state() || tick.cooldown != CooldownChange::Unchanged;
                    let changed = match command {
                        SessionCommand::Create | SessionCommand::Tick => ticked,
                        SessionCommand::Sweep => true,
                        SessionCommand::Event(_) => ticked || result.ignored.is_none(),
                    };
                    prop_assert_eq!(d.changed, changed);
                    if !d.changed {
                        prop_assert_eq!(without_elapsed(&s), without_elapsed(&before), "a change left unstored");
                    }
                    prop_assert_eq!(d.next_deadline, s.next_deadline(tours));
                    prop_assert!(d.tasks.is_empty());
                }
            }
            let back = SessionState::from_snapshot(&s.to_snapshot());
            prop_assert_eq!(back.as_ref(), Ok(&s));
        }
    }

    #[test]
    fn only_create_creates_and_it_is_a_new_session_then_decide(
        secs in 0u32..400, command in command(), with_tours in any::<bool>(),
    ) {
        let catalog = catalog();
        let tours = if with_tours { &catalog } else { TourCatalog::none() };
        let now = at(f64::from(secs) / 8.0);
        let key = session().key();
        let created = SessionState::create(&key, tours, &command, now);
        let mut fresh = SessionState::new(key.product_id.clone(), key.session_id.clone(), now);
        let decided = fresh.decide(tours, &command, now);
        match (created, &command) {
            (Ok(Some((s, d))), SessionCommand::Create) => {
                let decided = decided.expect("create accepted what decide refused");
                prop_assert_eq!(&s, &fresh);
                prop_assert!(d.changed);
                prop_assert!(d.transitions.is_empty());
                prop_assert_eq!(d.transitions, decided.transitions);
                prop_assert_eq!(s.key(), key);
            }
            (Ok(None), c) => prop_assert!(!matches!(c, SessionCommand::Create)),
            (other, _) => prop_assert!(false, "unexpected {:?}", other),
        }
    }
}

#[test]
fn the_machine_page_shows_the_generated_diagram() {
    let page =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/machines/session.md");
    let text = std::fs::read_to_string(&page).expect("docs/machines/session.md exists");
    let block = format!("```mermaid\n{}```", TRANSITIONS.to_mermaid());
    assert!(
        text.contains(&block),
        "paste the generated diagram into {}",
        page.display()
    );
}

// ---- the typed codec against the value walk it replaced ---------------------

/// Both decoders on one document, as a value and as text: the same state or
/// the same error. Text decoding also meets every key in document order
/// (a value's object order is its insertion order), so a document with its
/// keys reversed must decode the same way too.
fn assert_decoders_agree(v: &serde_json::Value) {
    use super::snapshot_walk::from_snapshot_walk;
    let walked = from_snapshot_walk(v);
    assert_eq!(SessionState::from_snapshot(v), walked, "value: {v}");
    let text = serde_json::to_vec(v).unwrap();
    assert_eq!(
        SessionState::from_snapshot_slice(&text),
        walked,
        "text: {v}"
    );
    if let Some(m) = v.as_object() {
        let reversed: serde_json::Map<_, _> = m
            .iter()
            .rev()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let reversed = serde_json::Value::Object(reversed);
        assert_eq!(
            SessionState::from_snapshot(&reversed),
            walked,
            "reversed: {v}"
        );
    }
}

#[test]
fn typed_decoding_matches_the_value_walk_on_the_recorded_snapshots() {
    let corpus = include_str!("../../tests/conformance/session_state_from_dict.jsonl");
    let mut checked = 0;
    for line in corpus.lines().filter(|l| !l.trim().is_empty()) {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let mut snap = case["input"]["snapshot"].clone();
        assert_decoders_agree(&snap);
        // In our layout (`_v` one up, a product id), so that intact ones
        // decode and the refusals come from the fields, not the version.
        if let Some(m) = snap.as_object_mut() {
            if let Some(n) = m.get("_v").and_then(serde_json::Value::as_u64) {
                m.insert("_v".into(), json!(n + 1));
            }
            m.entry("product_id").or_insert(json!("prod-1"));
        }
        assert_decoders_agree(&snap);
        checked += 1;
    }
    assert!(checked > 0, "no recorded snapshot");
}

#[test]
fn typed_decoding_matches_the_value_walk_on_every_field() {
    let mut s = proactive().with_metadata(json!({"user_id": "u-1"}).as_object().unwrap().clone());
    s.set_visual_guidance(true, Some("flow_0"), at(1.0));
    s.on_conversation_linked(ConversationEvent::New, "c-1")
        .unwrap();
    let full = s.to_snapshot();
    let values = [
        json!(null),
        json!(true),
        json!(false),
        json!(0),
        json!(-1),
        json!(2),
        json!(2.0),
        json!(-0.5),
        json!(1e300),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(""),
        json!("x"),
        json!("thinking"),
        json!("sess \u{0007}"),
        json!([]),
        json!([1, {"a": []}]),
        json!({}),
        json!({"last_message_at": 5.0}),
        json!({"cooldown_active": true}),
    ];
    let mut paths: Vec<(String, Option<String>)> = Vec::new();
    for (k, v) in full.as_object().unwrap() {
        paths.push((k.clone(), None));
        if let Some(sub) = v.as_object() {
            for sk in sub.keys() {
                paths.push((sk.clone(), Some(k.clone())));
            }
        }
    }
    paths.push(("unknown".into(), None));
    for (key, parent) in &paths {
        for value in values.iter().map(Some).chain([None]) {
            let mut v = full.clone();
            let obj = match parent {
                None => v.as_object_mut().unwrap(),
                Some(p) => v[p.as_str()].as_object_mut().unwrap(),
            };
            match value {
                Some(x) => {
                    obj.insert(key.clone(), x.clone());
                }
                None => {
                    obj.remove(key);
                }
            }
            assert_decoders_agree(&v);
        }
    }
    for doc in [json!(null), json!([]), json!("x"), json!(2), json!({})] {
        assert_decoders_agree(&doc);
    }
}

#[test]
fn repeated_keys_keep_the_last_value_as_in_a_json_object() {
    let text = session().to_snapshot_string();
    let body = text.strip_prefix('{').unwrap();
    for (dup, expect_ok) in [
        (r#""current_state":"PROACTIVE","#, true),
        (r#""reactive":{"last_message_at":"x"},"#, true),
    ] {
        // The repeat comes first, so the written value wins.
        let doubled = format!("{{{dup}{body}");
        let typed = SessionState::from_snapshot_slice(doubled.as_bytes());
        let value: serde_json::Value = serde_json::from_str(&doubled).unwrap();
        assert_eq!(typed, super::snapshot_walk::from_snapshot_walk(&value));
        assert_eq!(typed.is_ok(), expect_ok, "{doubled}");
    }
    let last_wins = format!(
        "{},\"current_state\":\"PROACTIVE\"}}",
        text.strip_suffix('}').unwrap()
    );
    assert_eq!(
        SessionState::from_snapshot_slice(last_wins.as_bytes())
            .unwrap_err()
            .to_string(),
        "current_state: unknown state \"PROACTIVE\""
    );
}

#[test]
fn snapshot_text_is_the_snapshot_value_written_out() {
    let mut s = proactive().with_metadata(
        json!({"b": 1, "a": [2.5, null]})
            .as_object()
            .unwrap()
            .clone(),
    );
    s.set_visual_guidance(true, Some("flow_0"), at(1.0));
    s.on_conversation_linked(ConversationEvent::New, "c-\"1\"")
        .unwrap();
    for s in [s, session(), proactive()] {
        let text = s.to_snapshot_string();
        assert_eq!(text, serde_json::to_string(&s.to_snapshot()).unwrap());
        assert_eq!(SessionState::from_snapshot_slice(text.as_bytes()), Ok(s));
    }
}

#[test]
fn syntax_errors_read_as_before() {
    for bad in [
        &b"{not json"[..],
        b"",
        b"{\"_v\": 2",
        b"[1,]",
        b"{} x",
        b"\"\\uD800\"",
        b"1e400",
    ] {
        let typed = SessionState::from_snapshot_slice(bad);
        let before = serde_json::from_slice::<serde_json::Value>(bad)
            .map_err(|e| DecodeError::Syntax {
                message: e.to_string(),
            })
            .and_then(|v| super::snapshot_walk::from_snapshot_walk(&v));
        assert_eq!(typed, before, "{}", String::from_utf8_lossy(bad));
    }
}

proptest! {
    #[test]
    fn typed_decoding_matches_the_value_walk_on_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let before = serde_json::from_slice::<serde_json::Value>(&bytes)
            .map_err(|e| DecodeError::Syntax { message: e.to_string() })
            .and_then(|v| super::snapshot_walk::from_snapshot_walk(&v));
        prop_assert_eq!(SessionState::from_snapshot_slice(&bytes), before);
    }

    #[test]
    fn typed_decoding_matches_the_value_walk_on_mutated_snapshots(
        key in prop_oneof![
            Just("_v"), Just("current_state"), Just("last_interaction_at"), Just("thinking"),
            Just("proactive"), Just("reactive"), Just("session_id"), Just("product_id"),
            Just("interaction_timeout_s"), Just("metadata"), Just("conversation_id"),
        ],
        value in prop_oneof![
            Just(json!(null)), Just(json!(true)), Just(json!(-1)), Just(json!(1e308)),
            Just(json!("x")), Just(json!([])), Just(json!({})), Just(json!(2)),
            any::<f64>().prop_map(|x| json!(x)),
            any::<i64>().prop_map(|x| json!(x)),
            ".{0,8}".prop_map(|x| json!(x)),
        ],
    ) {
        let mut v = proactive().to_snapshot();
        v[key] = value;
        assert_decoders_agree(&v);
    }
}
