//! Rules of the conversation machine, one test each, and property tests over
//! random command sequences.

use proptest::prelude::*;
use serde_json::Map;

use super::*;
use crate::{ProductId, Timestamp};
use ConversationState as S;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_secs(1_767_225_600 + secs).unwrap()
}

fn new_instance(max_follow_ups: u32) -> NewInstance {
    NewInstance {
        product_id: ProductId::parse("acme").unwrap(),
        instance_id: InstanceId::from_uuid(uuid::Uuid::from_u128(1)),
        contact_id: ContactId::parse("+56911112222").unwrap(),
        channel: "loopback".into(),
        objective: "book a demo".into(),
        todos: vec![Todo {
            text: "ask for a date".into(),
            done: false,
        }],
        heartbeat_interval_s: 100,
        max_follow_ups,
        metadata: Map::new(),
    }
}

fn created(max_follow_ups: u32) -> Instance {
    Instance::create(new_instance(max_follow_ups), false, t(0))
        .unwrap()
        .0
}

/// An instance waiting for a reply, its timer armed at t(110).
fn waiting(max_follow_ups: u32) -> Instance {
    let mut i = created(max_follow_ups);
    i.begin_agent_turn(t(5)).unwrap();
    i.agent_send("hello".into(), None, t(10)).unwrap();
    i
}

fn transitions(out: &Outcome) -> Vec<(S, S, &'static str)> {
    out.transitions
        .iter()
        .map(|tr| (tr.from, tr.to, tr.cause))
        .collect()
}

#[test]
fn create_is_created_with_an_agent_turn_when_the_contact_is_free() {
    let (i, out) = Instance::create(new_instance(5), false, t(0)).unwrap();
    assert_eq!(i.state, S::Created);
    assert_eq!(out.effects, vec![Effect::EnqueueAgentTurn]);
    assert!(i.holds_contact());
}

#[test]
fn create_is_queued_when_the_contact_is_held() {
    let (i, out) = Instance::create(new_instance(5), true, t(0)).unwrap();
    assert_eq!(i.state, S::Queued);
    assert!(out.is_empty());
    assert!(!i.holds_contact());
}

#[test]
fn create_rejects_an_empty_objective_and_a_zero_interval() {
    let mut n = new_instance(5);
    n.objective = "  ".into();
    assert!(matches!(
        Instance::create(n, false, t(0)),
        Err(ConversationError::Invalid {
            field: "objective",
            ..
        })
    ));
    let mut n = new_instance(5);
    n.heartbeat_interval_s = 0;
    assert!(Instance::create(n, false, t(0)).is_err());
}

#[test]
fn agent_send_delivers_and_arms_the_timer() {
    let mut i = created(5);
    i.begin_agent_turn(t(5)).unwrap();
    let out = i.agent_send("hello".into(), None, t(10)).unwrap();
    assert_eq!(i.state, S::WaitingForReply);
    assert_eq!(i.next_deadline(), Some(t(110)));
    assert!(out.effects.contains(&Effect::Deliver {
        outbound_seq: 1,
        role: Role::Agent,
        text: "hello".into()
    }));
}

#[test]
fn agent_send_honours_the_agents_next_heartbeat() {
    let mut i = created(5);
    i.begin_agent_turn(t(5)).unwrap();
    i.agent_send("hello".into(), Some(30), t(10)).unwrap();
    assert_eq!(i.next_deadline(), Some(t(40)));
}

#[test]
fn no_timer_when_follow_ups_are_off() {
    let i = waiting(0);
    assert_eq!(i.next_deadline(), None);
}

#[test]
fn the_timer_does_not_fire_early() {
    let mut i = waiting(5);
    assert_eq!(
        i.fire_heartbeat(t(109)),
        Err(ConversationError::NotDue {
            due_at: Some(t(110))
        })
    );
    assert_eq!(i.state, S::WaitingForReply);
}

#[test]
fn the_timer_fires_once_however_late() {
    let mut i = waiting(5);
    let out = i.fire_heartbeat(t(10_000)).unwrap();
    assert_eq!(
        transitions(&out),
        vec![(S::WaitingForReply, S::HeartbeatScheduled, "timer_fired")]
    );
    assert_eq!(out.effects, vec![Effect::ComposeFollowUp]);
    assert_eq!(i.next_deadline(), None);
    assert!(i.fire_heartbeat(t(10_001)).is_err());
}

#[test]
fn follow_ups_are_counted_and_rearm_the_timer() {
    let mut i = waiting(5);
    i.fire_heartbeat(t(110)).unwrap();
    i.send_follow_up("still there?".into(), None, t(111))
        .unwrap();
    assert_eq!((i.state, i.follow_ups_sent), (S::WaitingForReply, 1));
    assert_eq!(i.next_deadline(), Some(t(211)));
}

#[test]
fn the_last_follow_up_unanswered_abandons() {
    let mut i = waiting(2);
    for k in 0..2 {
        let now = i.next_deadline().unwrap();
        i.fire_heartbeat(now).unwrap();
        i.send_follow_up(format!("ping {k}"), None, now).unwrap();
    }
    let out = i.fire_heartbeat(i.next_deadline().unwrap()).unwrap();
    assert_eq!(
        transitions(&out),
        vec![
            (S::WaitingForReply, S::HeartbeatScheduled, "timer_fired"),
            (S::HeartbeatScheduled, S::Abandoned, "timer_fired"),
        ]
    );
    assert_eq!(out.effects, vec![Effect::PromoteNextQueued]);
    assert_eq!(i.end_reason.as_deref(), Some("abandoned"));
    assert_eq!(i.follow_ups_sent, 2);
}

#[test]
fn a_reply_cancels_the_timer_and_resets_follow_ups() {
    let mut i = waiting(5);
    i.fire_heartbeat(t(110)).unwrap();
    i.send_follow_up("ping".into(), None, t(111)).unwrap();
    let out = i.contact_reply("yes, Tuesday".into(), t(150));
    assert_eq!(i.state, S::WaitingForAgent);
    assert_eq!((i.next_deadline(), i.follow_ups_sent), (None, 0));
    assert!(out.effects.contains(&Effect::EnqueueAgentTurn));
}

#[test]
fn a_reply_while_composing_a_follow_up_cancels_it() {
    let mut i = waiting(5);
    i.fire_heartbeat(t(110)).unwrap();
    i.contact_reply("sorry, was away".into(), t(112));
    assert_eq!(i.state, S::WaitingForAgent);
    assert!(i.send_follow_up("ping".into(), None, t(113)).is_err());
}

#[test]
fn a_reply_in_other_live_states_is_kept_without_a_transition() {
    let mut i = created(5);
    i.begin_agent_turn(t(1)).unwrap();
    let out = i.contact_reply("hi?".into(), t(2));
    assert_eq!(i.state, S::Active);
    assert!(out.transitions.is_empty());
    assert!(matches!(&out.effects[..], [Effect::Append(m)] if m.role == Role::Contact));
}

#[test]
fn a_late_reply_is_kept_and_the_state_stays_terminal() {
    let mut i = waiting(5);
    i.cancel(t(20)).unwrap();
    let out = i.contact_reply("too late?".into(), t(30));
    assert_eq!(i.state, S::Failed);
    assert!(matches!(
        &out.effects[..],
        [Effect::Append(_), Effect::LateReply]
    ));
}

#[test]
fn end_conversation_completes_and_promotes() {
    let mut i = created(5);
    i.begin_agent_turn(t(1)).unwrap();
    let out = i.end_conversation(Some("booked".into()), t(2)).unwrap();
    assert_eq!(i.state, S::Completed);
    assert_eq!(
        (i.end_reason.as_deref(), i.outcome.as_deref()),
        (Some("completed"), Some("booked"))
    );
    assert_eq!(i.ended_at, Some(t(2)));
    assert_eq!(out.effects, vec![Effect::PromoteNextQueued]);
}

#[test]
fn human_hand_off_and_back_by_resume() {
    let mut i = created(5);
    i.begin_agent_turn(t(1)).unwrap();
    let out = i.request_human("asks for a refund".into(), t(2)).unwrap();
    assert_eq!(i.state, S::NeedsHumanIntervention);
    assert_eq!(
        out.effects,
        vec![Effect::NotifyOperator {
            reason: "asks for a refund".into()
        }]
    );
    let out = i.resume(t(3)).unwrap();
    assert_eq!(i.state, S::Active);
    assert_eq!(out.effects, vec![Effect::EnqueueAgentTurn]);
}

#[test]
fn operator_send_from_hand_off_delivers_as_human_and_goes_active() {
    let mut i = created(5);
    i.begin_agent_turn(t(1)).unwrap();
    i.request_human("refund".into(), t(2)).unwrap();
    let out = i.operator_send("I refunded you".into(), t(3)).unwrap();
    assert_eq!(i.state, S::Active);
    assert!(out.effects.contains(&Effect::Deliver {
        outbound_seq: 1,
        role: Role::Human,
        text: "I refunded you".into()
    }));
}

#[test]
fn operator_send_while_waiting_rearms_and_keeps_the_count() {
    let mut i = waiting(5);
    i.fire_heartbeat(t(110)).unwrap();
    i.send_follow_up("ping".into(), None, t(111)).unwrap();
    i.fire_heartbeat(t(211)).unwrap();
    let out = i
        .operator_send("hello from a human".into(), t(220))
        .unwrap();
    assert_eq!(i.state, S::WaitingForReply);
    assert_eq!(i.follow_ups_sent, 1);
    assert_eq!(i.next_deadline(), Some(t(320)));
    assert_eq!(
        transitions(&out),
        vec![(S::HeartbeatScheduled, S::WaitingForReply, "operator_send")]
    );
}

#[test]
fn pause_freezes_the_timer_and_resume_restores_its_remaining_time() {
    let mut i = waiting(5);
    i.pause(t(40)).unwrap();
    assert_eq!(
        (i.state, i.previous_state),
        (S::Paused, Some(S::WaitingForReply))
    );
    assert_eq!(
        (i.next_deadline(), i.paused_remaining_s),
        (None, Some(70.0))
    );
    i.resume(t(1000)).unwrap();
    assert_eq!(i.state, S::WaitingForReply);
    assert_eq!(i.next_deadline(), Some(t(1070)));
    assert_eq!((i.previous_state, i.paused_remaining_s), (None, None));
}

#[test]
fn a_reply_while_paused_waits_for_resume() {
    let mut i = waiting(5);
    i.pause(t(40)).unwrap();
    let out = i.contact_reply("here now".into(), t(50));
    assert_eq!(i.state, S::Paused);
    assert!(out.transitions.is_empty());
    let out = i.resume(t(60)).unwrap();
    assert_eq!(i.state, S::WaitingForAgent);
    assert_eq!(i.next_deadline(), None);
    assert!(out.effects.contains(&Effect::EnqueueAgentTurn));
}

#[test]
fn pausing_twice_and_resuming_a_live_instance_are_refused() {
    let mut i = waiting(5);
    assert!(matches!(
        i.resume(t(20)),
        Err(ConversationError::NotAllowed {
            command: "resume",
            state: S::WaitingForReply
        })
    ));
    i.pause(t(20)).unwrap();
    assert!(matches!(
        i.pause(t(21)),
        Err(ConversationError::NotAllowed {
            command: "pause",
            state: S::Paused
        })
    ));
}

#[test]
fn a_paused_instance_holds_its_contact_unless_it_was_queued() {
    let mut i = waiting(5);
    i.pause(t(20)).unwrap();
    assert!(i.holds_contact());
    let (mut q, _) = Instance::create(new_instance(5), true, t(0)).unwrap();
    q.pause(t(1)).unwrap();
    assert!(!q.holds_contact());
    let out = q.resume(t(2)).unwrap();
    assert_eq!(q.state, S::Queued);
    assert_eq!(out.effects, vec![Effect::PromoteNextQueued]);
}

#[test]
fn cancel_fails_without_a_farewell_and_promotes() {
    let mut i = waiting(5);
    let out = i.cancel(t(20)).unwrap();
    assert_eq!(i.state, S::Failed);
    assert_eq!(i.end_reason.as_deref(), Some("cancelled"));
    assert_eq!(i.next_deadline(), None);
    assert_eq!(out.effects, vec![Effect::PromoteNextQueued]);
}

#[test]
fn terminal_states_refuse_every_command_naming_the_state() {
    let mut i = waiting(5);
    i.fail("llm unavailable".into(), t(20)).unwrap();
    assert_eq!(i.end_reason.as_deref(), Some("llm unavailable"));
    let before = i.clone();
    let refusals = [
        i.clone().begin_agent_turn(t(30)).unwrap_err(),
        i.clone().agent_send("x".into(), None, t(30)).unwrap_err(),
        i.clone().pause(t(30)).unwrap_err(),
        i.clone().resume(t(30)).unwrap_err(),
        i.clone().cancel(t(30)).unwrap_err(),
        i.clone().fail("again".into(), t(30)).unwrap_err(),
        i.clone().operator_send("x".into(), t(30)).unwrap_err(),
        i.clone().promote(t(30)).unwrap_err(),
    ];
    for e in refusals {
        assert!(
            matches!(
                e,
                ConversationError::NotAllowed {
                    state: S::Failed,
                    ..
                }
            ),
            "{e}"
        );
    }
    assert_eq!(i, before);
    assert_eq!(
        i.cancel(t(30)).unwrap_err().to_string(),
        "cancel is not allowed in state FAILED"
    );
}

#[test]
fn promotion_creates_and_enqueues_an_agent_turn() {
    let (mut q, _) = Instance::create(new_instance(5), true, t(0)).unwrap();
    let out = q.promote(t(5)).unwrap();
    assert_eq!(q.state, S::Created);
    assert_eq!(out.effects, vec![Effect::EnqueueAgentTurn]);
}

#[test]
fn outbound_messages_number_their_idempotency_keys() {
    let mut i = waiting(5);
    i.fire_heartbeat(t(110)).unwrap();
    let out = i.send_follow_up("ping".into(), None, t(111)).unwrap();
    assert!(out.effects.iter().any(|e| matches!(
        e,
        Effect::Deliver {
            outbound_seq: 2,
            ..
        }
    )));
    assert_eq!(i.outbound_seq, 2);
}

#[test]
fn the_diagram_is_generated_from_the_table() {
    insta::assert_snapshot!("conversation_diagram", TABLE.to_mermaid());
}

/// A command the property tests apply.
#[derive(Debug, Clone)]
enum Cmd {
    Begin,
    Send(Option<u64>),
    Fire,
    FollowUp,
    Reply(u16),
    End,
    Human,
    Resume,
    Pause,
    OperatorSend,
    Cancel,
    Fail,
    Promote,
    Todos,
    Advance(u32),
}

fn cmd() -> impl Strategy<Value = Cmd> {
    prop_oneof![
        4 => Just(Cmd::Begin),
        4 => proptest::option::of(1u64..500).prop_map(Cmd::Send),
        4 => Just(Cmd::Fire),
        4 => Just(Cmd::FollowUp),
        4 => any::<u16>().prop_map(Cmd::Reply),
        1 => Just(Cmd::End),
        1 => Just(Cmd::Human),
        2 => Just(Cmd::Resume),
        2 => Just(Cmd::Pause),
        2 => Just(Cmd::OperatorSend),
        1 => Just(Cmd::Cancel),
        1 => Just(Cmd::Fail),
        1 => Just(Cmd::Promote),
        1 => Just(Cmd::Todos),
        6 => (0u32..400).prop_map(Cmd::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_commands_stay_in_the_table_and_keep_every_reply(
        queued in any::<bool>(),
        max in 0u32..4,
        cmds in proptest::collection::vec(cmd(), 0..80),
    ) {
        let (mut i, _) = Instance::create(new_instance(max), queued, t(0)).unwrap();
        let mut now = t(0);
        let mut transcript: Vec<Message> = Vec::new();
        let mut replies_sent = Vec::new();
        for c in cmds {
            let before = i.clone();
            let result = match c {
                Cmd::Begin => i.begin_agent_turn(now),
                Cmd::Send(d) => i.agent_send("msg".into(), d, now),
                Cmd::Fire => i.fire_heartbeat(now),
                Cmd::FollowUp => i.send_follow_up("ping".into(), None, now),
                Cmd::Reply(n) => {
                    let text = format!("reply {n}");
                    replies_sent.push(text.clone());
                    Ok(i.contact_reply(text, now))
                }
                Cmd::End => i.end_conversation(None, now),
                Cmd::Human => i.request_human("why".into(), now),
                Cmd::Resume => i.resume(now),
                Cmd::Pause => i.pause(now),
                Cmd::OperatorSend => i.operator_send("op".into(), now),
                Cmd::Cancel => i.cancel(now),
                Cmd::Fail => i.fail("boom".into(), now),
                Cmd::Promote => i.promote(now),
                Cmd::Todos => i.update_todos(vec![], now),
                Cmd::Advance(s) => {
                    now = now + std::time::Duration::from_secs(u64::from(s));
                    Ok(Outcome::none())
                }
            };
            match result {
                Ok(out) => {
                    for tr in &out.transitions {
                        prop_assert!(
                            TABLE.allows(tr.from.as_str(), tr.to.as_str(), tr.cause),
                            "{} -> {} by {} is not in the table", tr.from, tr.to, tr.cause
                        );
                    }
                    for e in out.effects {
                        if let Effect::Append(m) = e {
                            transcript.push(m);
                        }
                    }
                }
                Err(_) => prop_assert_eq!(&i, &before, "a refused command changed the instance"),
            }
            prop_assert!(i.follow_ups_sent <= i.max_follow_ups);
            prop_assert_eq!(i.heartbeat_due_at.is_some() && i.state != S::WaitingForReply, false);
            prop_assert_eq!(i.previous_state.is_some(), i.state == S::Paused);
            prop_assert_eq!(i.ended_at.is_some(), i.state.is_terminal());
            if before.state.is_terminal() {
                prop_assert_eq!(i.state, before.state, "left a terminal state");
            }
        }
        let kept: Vec<_> = transcript
            .iter()
            .filter(|m| m.role == Role::Contact)
            .map(|m| m.text.clone())
            .collect();
        prop_assert_eq!(kept, replies_sent);
    }

    #[test]
    fn records_round_trip_through_json(
        max in 0u32..4,
        cmds in proptest::collection::vec(cmd(), 0..30),
    ) {
        let (mut i, _) = Instance::create(new_instance(max), false, t(0)).unwrap();
        let mut now = t(0);
        for c in cmds {
            let _ = match c {
                Cmd::Begin => i.begin_agent_turn(now),
                Cmd::Send(d) => i.agent_send("m".into(), d, now),
                Cmd::Fire => i.fire_heartbeat(now),
                Cmd::Pause => i.pause(now),
                Cmd::Resume => i.resume(now),
                Cmd::Advance(s) => { now = now + std::time::Duration::from_secs(u64::from(s)); Ok(Outcome::none()) }
                _ => Ok(Outcome::none()),
            };
        }
        let json = serde_json::to_value(&i).unwrap();
        let back: Instance = serde_json::from_value(json).unwrap();
        prop_assert_eq!(back, i);
    }
}
