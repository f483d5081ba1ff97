//! Rules of the conversation machine, one test each, and property tests over
//! random command sequences.

use proptest::prelude::*;
use serde_json::{Map, json};

use super::*;
use crate::machine::{
    Command as _, Decision, EntityKey as _, ErrorClass, Machine, MachineError, NotAllowed,
};
use crate::{ProductId, Timestamp};
use ConversationCommand as C;
use ConversationState as S;

const FREE: ConversationContext = ConversationContext {
    contact_held: false,
};
const HELD: ConversationContext = ConversationContext { contact_held: true };

type D = Decision<Instance>;

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

/// Creates an instance at t(0), the contact held or not.
fn create(new: NewInstance, ctx: ConversationContext) -> Result<(Instance, D), ConversationError> {
    let key = new.key();
    Ok(Instance::create(&key, &ctx, &C::Create(new), t(0))?.expect("create creates"))
}

fn created(max_follow_ups: u32) -> Instance {
    create(new_instance(max_follow_ups), FREE).unwrap().0
}

fn queued() -> Instance {
    create(new_instance(5), HELD).unwrap().0
}

/// Decides `command` at `now` with the contact free.
fn run(i: &mut Instance, command: C, now: Timestamp) -> Result<D, ConversationError> {
    i.decide(&FREE, &command, now)
}

/// Decides `command`, which must be accepted.
fn ok(i: &mut Instance, command: C, now: Timestamp) -> D {
    let name = command.name();
    run(i, command, now).unwrap_or_else(|e| panic!("{name} refused: {e}"))
}

fn send(text: &str) -> C {
    C::AgentSend {
        text: text.into(),
        next_heartbeat_s: None,
    }
}

fn follow_up(text: &str) -> C {
    C::SendFollowUp {
        text: text.into(),
        next_heartbeat_s: None,
    }
}

fn reply(text: &str) -> C {
    C::ContactReply { text: text.into() }
}

fn operator_send(text: &str) -> C {
    C::OperatorSend { text: text.into() }
}

/// An instance waiting for a reply, its timer armed at t(110).
fn waiting(max_follow_ups: u32) -> Instance {
    let mut i = created(max_follow_ups);
    ok(&mut i, C::BeginAgentTurn, t(5));
    ok(&mut i, send("hello"), t(10));
    i
}

fn active() -> Instance {
    let mut i = created(5);
    ok(&mut i, C::BeginAgentTurn, t(1));
    i
}

/// An instance in `state`, reached by accepted commands.
fn in_state(state: S) -> Instance {
    let mut i = match state {
        S::Created => return created(5),
        S::Queued => return queued(),
        S::Active => return active(),
        _ => waiting(5),
    };
    match state {
        S::WaitingForReply => {}
        S::WaitingForAgent => {
            ok(&mut i, reply("hi"), t(20));
        }
        S::HeartbeatScheduled => {
            ok(&mut i, C::TimerFired, t(110));
        }
        S::Paused => {
            ok(&mut i, C::Pause, t(20));
        }
        S::NeedsHumanIntervention => {
            ok(&mut i, reply("hi"), t(20));
            ok(&mut i, C::BeginAgentTurn, t(21));
            ok(
                &mut i,
                C::RequestHuman {
                    reason: "refund".into(),
                },
                t(22),
            );
        }
        S::Completed => {
            ok(&mut i, reply("hi"), t(20));
            ok(&mut i, C::BeginAgentTurn, t(21));
            ok(&mut i, C::EndConversation { outcome: None }, t(22));
        }
        S::Abandoned => {
            let mut i = waiting(1);
            ok(&mut i, C::TimerFired, t(110));
            ok(&mut i, follow_up("ping"), t(110));
            ok(&mut i, C::TimerFired, t(210));
            return i;
        }
        S::Failed => {
            ok(&mut i, C::Cancel, t(20));
        }
        S::Created | S::Queued | S::Active => unreachable!("returned above"),
    }
    assert_eq!(i.state, state);
    i
}

fn transitions(d: &D) -> Vec<(Option<&str>, &str, &str)> {
    d.transitions
        .iter()
        .map(|tr| (tr.from.as_deref(), tr.to.as_ref(), tr.cause.as_ref()))
        .collect()
}

/// The tasks a decision asks for: kind and the delivery's outbound number.
fn tasks(d: &D) -> Vec<(&str, Option<u64>)> {
    d.single_tasks()
        .map(|task| (task.kind.as_str(), task.payload["outbound_seq"].as_u64()))
        .collect()
}

const TURN: (&str, Option<u64>) = (TURN_KIND, None);
const FOLLOW_UP: (&str, Option<u64>) = (FOLLOW_UP_KIND, None);

fn deliver(seq: u64) -> (&'static str, Option<u64>) {
    (DELIVER_KIND, Some(seq))
}

fn not_allowed(command: &'static str, state: S) -> ConversationError {
    ConversationError::NotAllowed(NotAllowed::new(command, state.as_str()))
}

fn appended(d: &D) -> Vec<&Message> {
    d.effects
        .iter()
        .filter_map(|e| match e {
            ConversationEffect::Append(m) => Some(m),
            _ => None,
        })
        .collect()
}

#[test]
fn create_is_created_with_an_agent_turn_when_the_contact_is_free() {
    let (i, d) = create(new_instance(5), FREE).unwrap();
    assert_eq!(i.state, S::Created);
    assert_eq!(tasks(&d), [TURN]);
    assert_eq!(d.effects, []);
    assert!(i.holds_contact());
}

#[test]
fn create_is_queued_when_the_contact_is_held() {
    let (i, d) = create(new_instance(5), HELD).unwrap();
    assert_eq!(i.state, S::Queued);
    assert_eq!(tasks(&d), []);
    assert_eq!(d.effects, []);
    assert!(!i.holds_contact());
}

#[test]
fn creation_is_audited_with_its_contact() {
    for (ctx, state) in [(FREE, "CREATED"), (HELD, "QUEUED")] {
        let (i, d) = create(new_instance(5), ctx).unwrap();
        assert_eq!(transitions(&d), [(None, state, "create")]);
        assert_eq!(
            d.transitions[0].detail,
            json!({"contact_id": "+56911112222"})
        );
        assert!(d.changed);
        assert_eq!(
            (i.created_at, i.updated_at, d.next_deadline),
            (t(0), t(0), None)
        );
    }
}

#[test]
fn create_rejects_an_empty_objective_and_a_zero_interval() {
    let mut n = new_instance(5);
    n.objective = "  ".into();
    assert!(matches!(
        create(n, FREE),
        Err(ConversationError::Invalid {
            field: "objective",
            ..
        })
    ));
    let mut n = new_instance(5);
    n.heartbeat_interval_s = 0;
    assert!(create(n, FREE).is_err());
}

#[test]
fn create_refuses_a_command_for_another_record() {
    let other = ConversationKey {
        instance_id: InstanceId::from_uuid(uuid::Uuid::from_u128(2)),
        ..new_instance(5).key()
    };
    let e = Instance::create(&other, &FREE, &C::Create(new_instance(5)), t(0)).unwrap_err();
    assert_eq!(e.field(), Some("instance_id"));
    assert_eq!(e.class(), ErrorClass::Invalid);
}

#[test]
fn only_create_creates() {
    let key = new_instance(5).key();
    for command in [C::BeginAgentTurn, reply("hi"), C::Promote, C::Cancel] {
        assert_eq!(Instance::create(&key, &FREE, &command, t(0)), Ok(None));
    }
}

#[test]
fn creating_an_existing_instance_is_refused() {
    let mut i = active();
    let before = i.clone();
    let e = run(&mut i, C::Create(new_instance(5)), t(2)).unwrap_err();
    assert_eq!(
        e,
        ConversationError::NotAllowed(
            NotAllowed::new("create", "ACTIVE").because("already_exists")
        )
    );
    assert_eq!(i, before);
}

#[test]
fn begin_agent_turn_starts_from_created_and_waiting_for_agent() {
    for state in [S::Created, S::WaitingForAgent] {
        let mut i = in_state(state);
        let d = ok(&mut i, C::BeginAgentTurn, t(30));
        assert_eq!(i.state, S::Active);
        assert_eq!(
            transitions(&d),
            [(Some(state.as_str()), "ACTIVE", "begin_agent_turn")]
        );
        assert_eq!((tasks(&d), d.effects.len()), (vec![], 0));
    }
}

#[test]
fn agent_send_delivers_and_arms_the_timer() {
    let mut i = active();
    let d = ok(&mut i, send("hello"), t(10));
    assert_eq!(i.state, S::WaitingForReply);
    assert_eq!(i.next_deadline(), Some(t(110)));
    assert_eq!(d.next_deadline, Some(t(110)));
    assert_eq!(
        appended(&d),
        [&Message {
            role: Role::Agent,
            text: "hello".into(),
            at: t(10),
            outbound_seq: Some(1),
        }]
    );
    assert_eq!(tasks(&d), [deliver(1)]);
}

#[test]
fn agent_send_honours_the_agents_next_heartbeat() {
    let mut i = active();
    let command = C::AgentSend {
        text: "hello".into(),
        next_heartbeat_s: Some(30),
    };
    ok(&mut i, command, t(10));
    assert_eq!(i.next_deadline(), Some(t(40)));
}

#[test]
fn agent_send_refuses_an_empty_text_and_a_zero_delay() {
    let mut i = active();
    let before = i.clone();
    let e = run(&mut i, send(" "), t(10)).unwrap_err();
    assert_eq!(e.field(), Some("text"));
    let zero = C::AgentSend {
        text: "hello".into(),
        next_heartbeat_s: Some(0),
    };
    let e = run(&mut i, zero, t(10)).unwrap_err();
    assert_eq!(e.field(), Some("next_heartbeat_s"));
    let long = send(&"x".repeat(64 * 1024 + 1));
    assert_eq!(run(&mut i, long, t(10)).unwrap_err().field(), Some("text"));
    assert_eq!(i, before);
}

#[test]
fn a_huge_delay_arms_the_timer_at_the_end_of_time() {
    let mut i = active();
    let command = C::AgentSend {
        text: "see you".into(),
        next_heartbeat_s: Some(u64::MAX),
    };
    let d = ok(&mut i, command, t(10));
    assert!(d.next_deadline.is_some_and(|due| due > t(10)));
    assert_eq!(
        run(&mut i, C::TimerFired, t(20)).unwrap_err().to_string(),
        "timer_fired is not allowed in state WAITING_FOR_REPLY (not_due)"
    );
}

#[test]
fn no_timer_when_follow_ups_are_off() {
    let i = waiting(0);
    assert_eq!(i.next_deadline(), None);
}

#[test]
fn the_timer_does_not_fire_early() {
    let mut i = waiting(5);
    let before = i.clone();
    let e = run(&mut i, C::TimerFired, t(109)).unwrap_err();
    assert_eq!(
        e,
        ConversationError::NotAllowed(
            NotAllowed::new("timer_fired", "WAITING_FOR_REPLY").because("not_due")
        )
    );
    assert_eq!(e.class(), ErrorClass::NotAllowed);
    assert_eq!(i, before);
    let mut off = waiting(0);
    assert_eq!(
        run(&mut off, C::TimerFired, t(10_000))
            .unwrap_err()
            .not_allowed()
            .and_then(|n| n.reason),
        Some("not_due"),
        "a timer that is not armed is never due"
    );
}

#[test]
fn the_timer_fires_once_however_late() {
    let mut i = waiting(5);
    let d = ok(&mut i, C::TimerFired, t(10_000));
    assert_eq!(
        transitions(&d),
        [(
            Some("WAITING_FOR_REPLY"),
            "HEARTBEAT_SCHEDULED",
            "timer_fired"
        )]
    );
    assert_eq!(tasks(&d), [FOLLOW_UP]);
    assert_eq!(d.effects, []);
    assert_eq!((i.next_deadline(), d.next_deadline), (None, None));
    assert!(run(&mut i, C::TimerFired, t(10_001)).is_err());
}

#[test]
fn follow_ups_are_counted_and_rearm_the_timer() {
    let mut i = waiting(5);
    ok(&mut i, C::TimerFired, t(110));
    let d = ok(&mut i, follow_up("still there?"), t(111));
    assert_eq!((i.state, i.follow_ups_sent), (S::WaitingForReply, 1));
    assert_eq!(i.next_deadline(), Some(t(211)));
    assert_eq!(tasks(&d), [deliver(2)]);
}

#[test]
fn the_last_follow_up_unanswered_abandons() {
    let mut i = waiting(2);
    for k in 0..2 {
        let now = i.next_deadline().unwrap();
        ok(&mut i, C::TimerFired, now);
        ok(&mut i, follow_up(&format!("ping {k}")), now);
    }
    let now = i.next_deadline().unwrap();
    let d = ok(&mut i, C::TimerFired, now);
    assert_eq!(
        transitions(&d),
        [
            (
                Some("WAITING_FOR_REPLY"),
                "HEARTBEAT_SCHEDULED",
                "timer_fired"
            ),
            (Some("HEARTBEAT_SCHEDULED"), "ABANDONED", "timer_fired"),
        ]
    );
    assert_eq!(d.effects, [ConversationEffect::PromoteNextQueued]);
    assert_eq!(tasks(&d), []);
    assert_eq!(i.end_reason.as_deref(), Some("abandoned"));
    assert_eq!(i.follow_ups_sent, 2);
}

#[test]
fn a_reply_cancels_the_timer_and_resets_follow_ups() {
    let mut i = waiting(5);
    ok(&mut i, C::TimerFired, t(110));
    ok(&mut i, follow_up("ping"), t(111));
    let d = ok(&mut i, reply("yes, Tuesday"), t(150));
    assert_eq!(i.state, S::WaitingForAgent);
    assert_eq!((i.next_deadline(), i.follow_ups_sent), (None, 0));
    assert_eq!(tasks(&d), [TURN]);
}

#[test]
fn a_reply_while_composing_a_follow_up_cancels_it() {
    let mut i = waiting(5);
    ok(&mut i, C::TimerFired, t(110));
    ok(&mut i, reply("sorry, was away"), t(112));
    assert_eq!(i.state, S::WaitingForAgent);
    assert!(run(&mut i, follow_up("ping"), t(113)).is_err());
}

#[test]
fn a_reply_in_other_live_states_is_kept_without_a_transition() {
    let mut i = active();
    let d = ok(&mut i, reply("hi?"), t(2));
    assert_eq!(i.state, S::Active);
    assert_eq!(d.transitions, []);
    assert!(matches!(&d.effects[..], [ConversationEffect::Append(m)] if m.role == Role::Contact));
    assert!(d.changed, "the transcript line is stored");
}

#[test]
fn a_late_reply_is_kept_and_audited_and_the_state_stays_terminal() {
    for state in [S::Completed, S::Abandoned, S::Failed] {
        let mut i = in_state(state);
        let d = ok(&mut i, reply("too late?"), t(300));
        assert_eq!(i.state, state);
        assert!(matches!(&d.effects[..], [ConversationEffect::Append(m)] if m.text == "too late?"));
        let s = state.as_str();
        assert_eq!(transitions(&d), [(Some(s), s, "late_reply")]);
        assert_eq!(d.transitions[0].detail, json!({}));
        assert_eq!(tasks(&d), []);
    }
}

#[test]
fn end_conversation_completes_and_promotes() {
    let mut i = active();
    let d = ok(
        &mut i,
        C::EndConversation {
            outcome: Some("booked".into()),
        },
        t(2),
    );
    assert_eq!(i.state, S::Completed);
    assert_eq!(
        (i.end_reason.as_deref(), i.outcome.as_deref()),
        (Some("completed"), Some("booked"))
    );
    assert_eq!(i.ended_at, Some(t(2)));
    assert_eq!(d.effects, [ConversationEffect::PromoteNextQueued]);
}

#[test]
fn an_empty_outcome_is_no_outcome() {
    let mut i = active();
    let command = C::EndConversation {
        outcome: Some(" ".into()),
    };
    ok(&mut i, command, t(2));
    assert_eq!(i.outcome, None);
}

#[test]
fn human_hand_off_and_back_by_resume() {
    let mut i = active();
    let d = ok(
        &mut i,
        C::RequestHuman {
            reason: "asks for a refund".into(),
        },
        t(2),
    );
    assert_eq!(i.state, S::NeedsHumanIntervention);
    assert_eq!(
        d.effects,
        [ConversationEffect::NotifyOperator {
            reason: "asks for a refund".into()
        }]
    );
    assert_eq!(i.human_reason.as_deref(), Some("asks for a refund"));
    let d = ok(&mut i, C::Resume, t(3));
    assert_eq!(i.state, S::Active);
    assert_eq!(i.human_reason, None);
    assert_eq!(tasks(&d), [TURN]);
    assert_eq!(handed_back(&d), [true], "the turn knows it was handed back");
}

/// Whether each agent turn the decision asks for follows a hand-back.
fn handed_back(d: &D) -> Vec<bool> {
    d.single_tasks()
        .filter(|task| task.kind == TURN_KIND)
        .map(|task| task.payload[HANDED_BACK] == json!(true))
        .collect()
}

#[test]
fn only_a_hand_back_marks_the_turn_it_asks_for() {
    let mut i = in_state(S::NeedsHumanIntervention);
    let d = ok(&mut i, operator_send("I refunded you"), t(30));
    assert_eq!(handed_back(&d), [true]);

    let (_, d) = create(new_instance(5), FREE).unwrap();
    assert_eq!(handed_back(&d), [false], "creation");
    let mut i = waiting(5);
    let d = ok(&mut i, reply("hi"), t(20));
    assert_eq!(handed_back(&d), [false], "a contact's reply");
    let mut i = active();
    ok(&mut i, C::Pause, t(2));
    let d = ok(&mut i, C::Resume, t(3));
    assert_eq!(handed_back(&d), [false], "the end of a pause");
}

#[test]
fn request_human_refuses_an_empty_reason() {
    let mut i = active();
    let before = i.clone();
    let e = run(&mut i, C::RequestHuman { reason: "".into() }, t(2)).unwrap_err();
    assert_eq!(e.field(), Some("reason"));
    assert_eq!(i, before);
}

#[test]
fn update_todos_rewrites_the_checklist_without_a_transition() {
    let mut i = active();
    let todos = vec![Todo {
        text: "ask for a date".into(),
        done: true,
    }];
    let d = ok(
        &mut i,
        C::UpdateTodos {
            todos: todos.clone(),
        },
        t(2),
    );
    assert_eq!(i.todos, todos);
    assert_eq!((i.state, i.updated_at), (S::Active, t(2)));
    assert_eq!(
        (d.transitions.len(), d.effects.len(), tasks(&d)),
        (0, 0, vec![])
    );
    assert!(d.changed);
    let before = i.clone();
    let blank = vec![Todo {
        text: "".into(),
        done: false,
    }];
    let e = run(&mut i, C::UpdateTodos { todos: blank }, t(3)).unwrap_err();
    assert_eq!(e.field(), Some("todos"));
    assert_eq!(i, before);
}

#[test]
fn operator_send_from_hand_off_delivers_as_human_and_goes_active() {
    let mut i = in_state(S::NeedsHumanIntervention);
    let d = ok(&mut i, operator_send("I refunded you"), t(30));
    assert_eq!(i.state, S::Active);
    let sent = appended(&d);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].role, sent[0].outbound_seq, sent[0].text.as_str()),
        (Role::Human, Some(2), "I refunded you")
    );
    assert_eq!(tasks(&d), [deliver(2), TURN]);
}

#[test]
fn operator_send_while_waiting_rearms_and_keeps_the_count() {
    let mut i = waiting(5);
    ok(&mut i, C::TimerFired, t(110));
    ok(&mut i, follow_up("ping"), t(111));
    ok(&mut i, C::TimerFired, t(211));
    let d = ok(&mut i, operator_send("hello from a human"), t(220));
    assert_eq!(i.state, S::WaitingForReply);
    assert_eq!(i.follow_ups_sent, 1);
    assert_eq!(i.next_deadline(), Some(t(320)));
    assert_eq!(
        transitions(&d),
        [(
            Some("HEARTBEAT_SCHEDULED"),
            "WAITING_FOR_REPLY",
            "operator_send"
        )]
    );
    let d = ok(&mut i, operator_send("anyone?"), t(230));
    assert_eq!(d.transitions, [], "the state stays");
    assert_eq!(i.next_deadline(), Some(t(330)));
    assert_eq!(tasks(&d), [deliver(4)]);
}

#[test]
fn pause_freezes_the_timer_and_resume_restores_its_remaining_time() {
    let mut i = waiting(5);
    let d = ok(&mut i, C::Pause, t(40));
    assert_eq!(d.next_deadline, None);
    assert_eq!(
        (i.state, i.previous_state),
        (S::Paused, Some(S::WaitingForReply))
    );
    assert_eq!(
        (i.next_deadline(), i.paused_remaining_s),
        (None, Some(70.0))
    );
    let d = ok(&mut i, C::Resume, t(1000));
    assert_eq!(i.state, S::WaitingForReply);
    assert_eq!(i.next_deadline(), Some(t(1070)));
    assert_eq!(d.next_deadline, Some(t(1070)));
    assert_eq!((i.previous_state, i.paused_remaining_s), (None, None));
}

#[test]
fn a_reply_while_paused_waits_for_resume() {
    let mut i = waiting(5);
    ok(&mut i, C::Pause, t(40));
    let d = ok(&mut i, reply("here now"), t(50));
    assert_eq!(i.state, S::Paused);
    assert_eq!(d.transitions, []);
    assert_eq!(tasks(&d), []);
    let d = ok(&mut i, C::Resume, t(60));
    assert_eq!(i.state, S::WaitingForAgent);
    assert_eq!(i.next_deadline(), None);
    assert_eq!(tasks(&d), [TURN]);
}

#[test]
fn resume_asks_again_for_the_work_the_pause_interrupted() {
    for (state, expected) in [
        (S::Created, vec![TURN]),
        (S::Active, vec![TURN]),
        (S::WaitingForAgent, vec![TURN]),
        (S::HeartbeatScheduled, vec![FOLLOW_UP]),
        (S::NeedsHumanIntervention, vec![]),
        (S::WaitingForReply, vec![]),
    ] {
        let mut i = in_state(state);
        ok(&mut i, C::Pause, t(200));
        let d = ok(&mut i, C::Resume, t(201));
        assert_eq!(i.state, state);
        assert_eq!(tasks(&d), expected, "resumed to {state}");
        assert_eq!(
            transitions(&d),
            [(Some("PAUSED"), state.as_str(), "resume")]
        );
    }
}

#[test]
fn pausing_twice_and_resuming_a_live_instance_are_refused() {
    let mut i = waiting(5);
    assert_eq!(
        run(&mut i, C::Resume, t(20)),
        Err(not_allowed("resume", S::WaitingForReply))
    );
    ok(&mut i, C::Pause, t(20));
    let before = i.clone();
    assert_eq!(
        run(&mut i, C::Pause, t(21)),
        Err(not_allowed("pause", S::Paused))
    );
    assert_eq!(i, before);
}

#[test]
fn a_paused_instance_holds_its_contact_unless_it_was_queued() {
    let mut i = waiting(5);
    ok(&mut i, C::Pause, t(20));
    assert!(i.holds_contact());
    let mut q = queued();
    ok(&mut q, C::Pause, t(1));
    assert!(!q.holds_contact());
    let d = ok(&mut q, C::Resume, t(2));
    assert_eq!(q.state, S::Queued);
    assert_eq!(d.effects, [ConversationEffect::PromoteNextQueued]);
    assert_eq!(tasks(&d), []);
}

#[test]
fn cancel_fails_without_a_farewell_and_promotes() {
    let mut i = waiting(5);
    let d = ok(&mut i, C::Cancel, t(20));
    assert_eq!(i.state, S::Failed);
    assert_eq!(i.end_reason.as_deref(), Some("cancelled"));
    assert_eq!(i.next_deadline(), None);
    assert_eq!(d.effects, [ConversationEffect::PromoteNextQueued]);
    assert_eq!(
        transitions(&d),
        [(Some("WAITING_FOR_REPLY"), "FAILED", "cancel")]
    );
}

#[test]
fn fail_keeps_the_error_as_the_end_reason() {
    let mut i = active();
    let d = ok(
        &mut i,
        C::Fail {
            error: "llm unavailable".into(),
        },
        t(2),
    );
    assert_eq!(
        (i.state, i.end_reason.as_deref()),
        (S::Failed, Some("llm unavailable"))
    );
    assert_eq!(transitions(&d), [(Some("ACTIVE"), "FAILED", "fail")]);
    let mut i = in_state(S::Paused);
    ok(&mut i, C::Fail { error: " ".into() }, t(30));
    assert_eq!(i.end_reason.as_deref(), Some("failed"));
    assert_eq!((i.previous_state, i.ended_at), (None, Some(t(30))));
}

#[test]
fn terminal_states_refuse_every_command_naming_the_state() {
    let mut i = waiting(5);
    ok(
        &mut i,
        C::Fail {
            error: "llm unavailable".into(),
        },
        t(20),
    );
    assert_eq!(i.end_reason.as_deref(), Some("llm unavailable"));
    let before = i.clone();
    for command in every_command_but_a_reply() {
        let e = run(&mut i, command.clone(), t(30)).unwrap_err();
        assert_eq!(
            e.not_allowed()
                .map(|n| (n.command.as_ref(), n.state.as_ref())),
            Some((command.name(), "FAILED")),
            "{e}"
        );
        assert_eq!(i, before);
    }
    assert_eq!(
        run(&mut i, C::Cancel, t(30)).unwrap_err().to_string(),
        "cancel is not allowed in state FAILED"
    );
}

fn every_command_but_a_reply() -> Vec<C> {
    vec![
        C::Create(new_instance(5)),
        C::BeginAgentTurn,
        send("x"),
        C::TimerFired,
        follow_up("x"),
        C::EndConversation { outcome: None },
        C::RequestHuman {
            reason: "why".into(),
        },
        C::UpdateTodos { todos: vec![] },
        C::Pause,
        C::Resume,
        operator_send("x"),
        C::Cancel,
        C::Fail {
            error: "again".into(),
        },
        C::Promote,
    ]
}

#[test]
fn every_refusal_leaves_the_instance_exactly_as_it_was() {
    let mut refused = 0;
    for state in S::ALL {
        for command in every_command_but_a_reply() {
            let mut i = in_state(state);
            let before = i.clone();
            // Before any armed heartbeat is due.
            if let Err(e) = run(&mut i, command.clone(), t(100)) {
                refused += 1;
                assert_eq!(i, before, "{} in {state}: {e}", command.name());
            }
        }
    }
    assert!(refused > 100, "{refused} refusals");
}

#[test]
fn promotion_creates_and_enqueues_an_agent_turn() {
    let mut q = queued();
    let d = ok(&mut q, C::Promote, t(5));
    assert_eq!(q.state, S::Created);
    assert_eq!(tasks(&d), [TURN]);
    assert_eq!(transitions(&d), [(Some("QUEUED"), "CREATED", "promote")]);
}

#[test]
fn promotion_is_refused_while_the_contact_is_held() {
    let mut q = queued();
    let before = q.clone();
    let e = q.decide(&HELD, &C::Promote, t(5)).unwrap_err();
    assert_eq!(
        e,
        ConversationError::NotAllowed(NotAllowed::new("promote", "QUEUED").because("contact_held"))
    );
    assert_eq!(q, before);
}

#[test]
fn outbound_messages_number_their_idempotency_keys() {
    let mut i = waiting(5);
    ok(&mut i, C::TimerFired, t(110));
    let d = ok(&mut i, follow_up("ping"), t(111));
    assert_eq!(tasks(&d), [deliver(2)]);
    assert_eq!(appended(&d)[0].outbound_seq, Some(2));
    assert_eq!(i.outbound_seq, 2);
}

#[test]
fn an_instance_out_of_outbound_numbers_refuses_to_send() {
    let mut i = active();
    i.outbound_seq = u32::MAX;
    let before = i.clone();
    let e = run(&mut i, send("one more"), t(2)).unwrap_err();
    assert_eq!(e, ConversationError::LimitExceeded { sent: u32::MAX });
    assert_eq!(e.class(), ErrorClass::LimitExceeded);
    assert_eq!(i, before);
}

#[test]
fn tasks_name_their_instance_and_agent_work_is_one_per_instance() {
    let (i, d) = create(new_instance(5), FREE).unwrap();
    let turn = d.single_tasks().next().unwrap();
    assert_eq!(turn.product_id, i.product_id);
    assert_eq!(
        turn.payload,
        json!({"instance_id": "00000000-0000-0000-0000-000000000001"})
    );
    assert_eq!(
        turn.dedup_key.as_deref(),
        Some("conversation.agent_turn:acme:00000000-0000-0000-0000-000000000001")
    );
    let mut i = active();
    let d = ok(&mut i, send("hi"), t(2));
    let delivery = d.single_tasks().next().unwrap();
    assert_eq!(
        delivery.payload,
        json!({"instance_id": "00000000-0000-0000-0000-000000000001", "outbound_seq": 1})
    );
    assert_eq!(delivery.dedup_key, None, "every message is delivered");
}

#[test]
fn commands_are_named_as_they_are_tagged_and_round_trip_through_json() {
    for command in every_command_but_a_reply().into_iter().chain([reply("hi")]) {
        let json = serde_json::to_value(&command).unwrap();
        assert_eq!(json["type"], command.name());
        let back: C = serde_json::from_value(json).unwrap();
        assert_eq!(back, command);
    }
    let parsed: C = serde_json::from_value(json!({"type": "agent_send", "text": "hi"})).unwrap();
    assert_eq!(parsed, send("hi"));
}

#[test]
fn the_state_name_is_the_wire_value_and_the_deadline_the_heartbeat() {
    let i = waiting(5);
    assert_eq!(i.state_name(), "WAITING_FOR_REPLY");
    assert_eq!(Machine::next_deadline(&i, &FREE), Some(t(110)));
    assert_eq!(
        i.key(),
        ConversationKey {
            product_id: i.product_id.clone(),
            instance_id: i.instance_id
        }
    );
    assert_eq!(i.key().entity_id(), "00000000-0000-0000-0000-000000000001");
}

#[test]
fn the_diagram_is_generated_from_the_table() {
    insta::assert_snapshot!("conversation_diagram", TABLE.to_mermaid());
}

/// A step of the property tests: a command, or time passing.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // test data, built once per step
enum Step {
    Do(C),
    Advance(u32),
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => "[a-z]{1,8}",
        1 => Just(String::new()),
        1 => Just("  ".to_owned()),
    ]
}

fn delay() -> impl Strategy<Value = Option<u64>> {
    proptest::option::of(prop_oneof![9 => 1u64..500, 1 => Just(0u64)])
}

fn command() -> impl Strategy<Value = C> {
    prop_oneof![
        4 => Just(C::BeginAgentTurn),
        4 => (text(), delay()).prop_map(|(text, next_heartbeat_s)| C::AgentSend { text, next_heartbeat_s }),
        4 => Just(C::TimerFired),
        4 => (text(), delay()).prop_map(|(text, next_heartbeat_s)| C::SendFollowUp { text, next_heartbeat_s }),
        4 => any::<u16>().prop_map(|n| reply(&format!("reply {n}"))),
        1 => proptest::option::of(text()).prop_map(|outcome| C::EndConversation { outcome }),
        1 => text().prop_map(|reason| C::RequestHuman { reason }),
        2 => Just(C::Resume),
        2 => Just(C::Pause),
        2 => text().prop_map(|text| C::OperatorSend { text }),
        1 => Just(C::Cancel),
        1 => text().prop_map(|error| C::Fail { error }),
        1 => Just(C::Promote),
        1 => proptest::collection::vec(text(), 0..3).prop_map(|texts| C::UpdateTodos {
            todos: texts.into_iter().map(|text| Todo { text, done: false }).collect(),
        }),
        1 => Just(C::Create(new_instance(1))),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        34 => command().prop_map(Step::Do),
        6 => (0u32..400).prop_map(Step::Advance),
    ]
}

/// Every transition is an edge of the table, or a late reply: an event
/// recorded from and to the terminal state, which changes no state.
fn in_table(tr: &crate::machine::Transition) -> bool {
    let from = tr.from.as_deref().unwrap_or(CREATION);
    TABLE.allows(from, &tr.to, &tr.cause)
        || (tr.cause == "late_reply" && from == tr.to && TABLE.terminal.contains(&from))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_commands_stay_in_the_table_and_keep_every_reply(
        held in any::<bool>(),
        max in 0u32..4,
        steps in proptest::collection::vec(step(), 0..80),
    ) {
        let ctx = ConversationContext { contact_held: held };
        let (mut i, d) = create(new_instance(max), ctx).unwrap();
        prop_assert!(d.transitions.iter().all(in_table));
        let mut now = t(0);
        let mut transcript: Vec<Message> = Vec::new();
        let mut replies_sent = Vec::new();
        for s in steps {
            let command = match s {
                Step::Advance(secs) => {
                    now = now + std::time::Duration::from_secs(u64::from(secs));
                    continue;
                }
                Step::Do(c) => c,
            };
            if let C::ContactReply { text } = &command {
                replies_sent.push(text.clone());
            }
            let before = i.clone();
            match i.decide(&FREE, &command, now) {
                Ok(d) => {
                    for tr in &d.transitions {
                        prop_assert!(
                            in_table(tr),
                            "{:?} -> {} by {} is not in the table", tr.from, tr.to, tr.cause
                        );
                    }
                    prop_assert!(d.changed);
                    prop_assert_eq!(d.next_deadline, i.heartbeat_due_at);
                    let sent: Vec<_> = appended(&d).iter().filter_map(|m| m.outbound_seq).map(u64::from).collect();
                    let delivered: Vec<_> = tasks(&d).iter().filter(|t| t.0 == DELIVER_KIND).filter_map(|t| t.1).collect();
                    prop_assert_eq!(sent, delivered, "one delivery per outbound message");
                    for kind in [TURN_KIND, FOLLOW_UP_KIND] {
                        prop_assert!(tasks(&d).iter().filter(|t| t.0 == kind).count() <= 1);
                    }
                    for e in d.effects {
                        if let ConversationEffect::Append(m) = e {
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
    fn creation_never_panics_and_starts_on_a_creation_edge(
        held in any::<bool>(),
        objective in text(),
        channel in text(),
        interval in 0u64..3,
        max in any::<u32>(),
        other_id in any::<bool>(),
    ) {
        let mut new = new_instance(max);
        (new.objective, new.channel, new.heartbeat_interval_s) = (objective, channel, interval);
        let mut key = new.key();
        if other_id {
            key.instance_id = InstanceId::from_uuid(uuid::Uuid::from_u128(9));
        }
        let ctx = ConversationContext { contact_held: held };
        match Instance::create(&key, &ctx, &C::Create(new), t(0)) {
            Ok(Some((i, d))) => {
                prop_assert_eq!(i.key(), key);
                prop_assert!(d.transitions.iter().all(in_table));
                prop_assert_eq!(d.transitions.len(), 1);
            }
            Ok(None) => prop_assert!(false, "a create command created nothing"),
            Err(e) => prop_assert_eq!(e.class(), ErrorClass::Invalid),
        }
    }

    #[test]
    fn records_round_trip_through_json(
        max in 0u32..4,
        steps in proptest::collection::vec(step(), 0..30),
    ) {
        let mut i = created(max);
        let mut now = t(0);
        for s in steps {
            match s {
                Step::Do(c) => { let _ = i.decide(&FREE, &c, now); }
                Step::Advance(secs) => now = now + std::time::Duration::from_secs(u64::from(secs)),
            }
        }
        let json = serde_json::to_value(&i).unwrap();
        let back: Instance = serde_json::from_value(json).unwrap();
        prop_assert_eq!(back, i);
    }

    #[test]
    fn commands_round_trip_through_json(c in command()) {
        let json = serde_json::to_value(&c).unwrap();
        let back: C = serde_json::from_value(json).unwrap();
        prop_assert_eq!(back, c);
    }
}
