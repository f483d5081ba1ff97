//! Contract suite for [`ConversationStore`] adapters.
//!
//! Run it from an adapter's tests with
//! `parlance_testkit::conversation_store_suite!(async { Some(subject) });`.

use std::sync::Arc;
use std::time::Duration;

use parlance_core::conversation::{
    ContactId, ConversationError, ConversationState as S, Instance, InstanceId, NewInstance, Role,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::conversation::{DELIVER_KIND, FOLLOW_UP_KIND, TURN_KIND};
use parlance_ports::{AuditLog, ConversationStore, ListFilter, TaskQueue, WorkerId};
use serde_json::Map;

/// Runs every case of this suite against the adapter the factory builds.
#[macro_export]
macro_rules! conversation_store_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::conversation;
            cases = [
                create_get_and_list_are_scoped,
                concurrent_creates_yield_exactly_one_created,
                apply_saves_appends_and_audits,
                a_refused_command_changes_nothing,
                a_terminal_transition_promotes_the_oldest_queued,
                a_paused_holder_keeps_its_contact,
                claim_due_takes_only_due_instances_once,
                concurrent_sweepers_fire_a_heartbeat_once,
                delivery_keys_are_recorded_once,
                late_replies_are_kept_and_audited,
                concurrent_replies_are_all_kept,
                unknown_ids_are_not_found,
                transitions_enqueue_their_tasks,
            ]
        }
    };
}

/// The subject of this suite: the store, the audit log and the task queue
/// it writes to.
#[derive(Clone)]
pub struct Subject {
    /// The store under test.
    pub store: Arc<dyn ConversationStore>,
    /// The audit log the store writes its transitions to.
    pub audit: Arc<dyn AuditLog>,
    /// The queue the store enqueues its transitions' tasks on (empty at the
    /// start).
    pub queue: Arc<dyn TaskQueue>,
}

fn product(p: &str) -> ProductId {
    ProductId::parse(p).expect("valid product id")
}

fn t(secs: u64) -> Timestamp {
    Timestamp::from_secs(1_767_225_600).expect("in range") + Duration::from_secs(secs)
}

fn id(n: u128) -> InstanceId {
    InstanceId::from_uuid(uuid::Uuid::from_u128(n))
}

fn new(p: &str, n: u128, contact: &str) -> NewInstance {
    NewInstance {
        product_id: product(p),
        instance_id: id(n),
        contact_id: ContactId::parse(contact).expect("valid contact"),
        channel: "loopback".to_owned(),
        objective: "book a demo".to_owned(),
        todos: vec![],
        heartbeat_interval_s: 100,
        max_follow_ups: 2,
        metadata: Map::new(),
    }
}

async fn create(s: &Subject, p: &str, n: u128, contact: &str, at: u64) -> Instance {
    s.store
        .create(new(p, n, contact), t(at))
        .await
        .expect("create")
        .expect("valid instance")
        .0
}

/// Runs a command, expecting the store to accept it.
async fn run(
    s: &Subject,
    p: &str,
    n: u128,
    at: u64,
    command: impl Fn(
        &mut Instance,
        Timestamp,
    ) -> Result<parlance_core::conversation::Outcome, ConversationError>
    + Send
    + Sync
    + 'static,
) -> parlance_ports::Applied {
    let now = t(at);
    s.store
        .apply(&product(p), id(n), now, Box::new(move |i| command(i, now)))
        .await
        .expect("apply")
        .expect("command accepted")
}

/// An instance in `WAITING_FOR_REPLY` with its heartbeat due at `at + 100`.
async fn waiting(s: &Subject, p: &str, n: u128, contact: &str, at: u64) -> Instance {
    create(s, p, n, contact, at).await;
    run(s, p, n, at, |i, now| i.begin_agent_turn(now)).await;
    run(s, p, n, at, |i, now| {
        i.agent_send("hello".into(), None, now)
    })
    .await
    .instance
}

/// Ids, products and contacts keep instances apart.
pub async fn create_get_and_list_are_scoped(s: Subject) {
    let a = create(&s, "a", 1, "alice", 0).await;
    assert_eq!((a.state, a.version), (S::Created, 1));
    let q = create(&s, "a", 2, "alice", 1).await;
    assert_eq!(q.state, S::Queued);
    let b = create(&s, "a", 3, "bob", 2).await;
    assert_eq!(b.state, S::Created);
    let other = create(&s, "b", 4, "alice", 3).await;
    assert_eq!(
        other.state,
        S::Created,
        "another product's contact is another contact"
    );

    let got = s.store.get(&product("a"), id(1)).await.expect("get");
    assert_eq!(got, Some(a));
    assert_eq!(s.store.get(&product("b"), id(1)).await.expect("get"), None);

    let all = s
        .store
        .list(&product("a"), &ListFilter::default())
        .await
        .expect("list");
    let ids: Vec<_> = all.iter().map(|i| i.instance_id).collect();
    assert_eq!(ids, [id(1), id(2), id(3)], "oldest first, product a only");
    let alice = ListFilter {
        contact_id: Some(ContactId::parse("alice").expect("valid")),
        ..ListFilter::default()
    };
    assert_eq!(
        s.store
            .list(&product("a"), &alice)
            .await
            .expect("list")
            .len(),
        2
    );
    let queued = ListFilter {
        state: Some(S::Queued),
        ..ListFilter::default()
    };
    let got = s.store.list(&product("a"), &queued).await.expect("list");
    assert_eq!(
        got.iter().map(|i| i.instance_id).collect::<Vec<_>>(),
        [id(2)]
    );
    let audit = s
        .audit
        .list(&product("a"), "conversation", &id(2).to_string(), None, 10)
        .await
        .expect("audit");
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (audit[0].entry.from.as_deref(), audit[0].entry.to.as_str()),
        (None, "QUEUED")
    );
}

/// Sixteen creates racing for one contact: one `CREATED`, fifteen `QUEUED`.
pub async fn concurrent_creates_yield_exactly_one_created(s: Subject) {
    let mut tasks = Vec::new();
    for n in 0..16u128 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            create(&s, "p", 100 + n, "carol", 0).await
        }));
    }
    let mut states = Vec::new();
    for task in tasks {
        states.push(task.await.expect("task").state);
    }
    assert_eq!(
        states.iter().filter(|s| **s == S::Created).count(),
        1,
        "{states:?}"
    );
    assert_eq!(states.iter().filter(|s| **s == S::Queued).count(), 15);
}

/// A command's instance, transcript and audit entries are stored together.
pub async fn apply_saves_appends_and_audits(s: Subject) {
    let i = waiting(&s, "p", 1, "dave", 0).await;
    assert_eq!((i.state, i.version), (S::WaitingForReply, 3));
    assert_eq!(i.next_deadline(), Some(t(100)));
    let stored = s
        .store
        .get(&product("p"), id(1))
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(stored, i);
    let transcript = s
        .store
        .transcript(&product("p"), id(1))
        .await
        .expect("transcript");
    assert_eq!(transcript.len(), 1);
    assert_eq!(
        (transcript[0].role, transcript[0].text.as_str()),
        (Role::Agent, "hello")
    );
    assert_eq!(transcript[0].outbound_seq, Some(1));
    let audit = s
        .audit
        .list(&product("p"), "conversation", &id(1).to_string(), None, 10)
        .await
        .expect("audit");
    let steps: Vec<_> = audit
        .iter()
        .map(|r| (r.entry.to.as_str(), r.entry.cause.as_str()))
        .collect();
    assert_eq!(
        steps,
        [
            ("CREATED", "create"),
            ("ACTIVE", "begin_agent_turn"),
            ("WAITING_FOR_REPLY", "agent_send")
        ]
    );
}

/// A refused command leaves instance, version and transcript as they were.
pub async fn a_refused_command_changes_nothing(s: Subject) {
    let before = waiting(&s, "p", 1, "erin", 0).await;
    let refused = s
        .store
        .apply(
            &product("p"),
            id(1),
            t(5),
            Box::new(|i| i.end_conversation(None, t(5))),
        )
        .await
        .expect("apply");
    assert_eq!(
        refused,
        Err(ConversationError::NotAllowed {
            command: "end_conversation",
            state: S::WaitingForReply
        })
    );
    let after = s
        .store
        .get(&product("p"), id(1))
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(after, before);
    assert_eq!(
        s.store
            .transcript(&product("p"), id(1))
            .await
            .expect("transcript")
            .len(),
        1
    );
}

/// Ending the holder promotes the oldest queued instance in the same write.
pub async fn a_terminal_transition_promotes_the_oldest_queued(s: Subject) {
    create(&s, "p", 1, "frank", 0).await;
    create(&s, "p", 2, "frank", 1).await;
    create(&s, "p", 3, "frank", 2).await;
    run(&s, "p", 1, 3, |i, now| i.begin_agent_turn(now)).await;
    let applied = run(&s, "p", 1, 4, |i, now| {
        i.end_conversation(Some("done".into()), now)
    })
    .await;
    assert_eq!(applied.instance.state, S::Completed);
    let (promoted, _) = applied
        .promoted
        .expect("the oldest queued instance is promoted");
    assert_eq!((promoted.instance_id, promoted.state), (id(2), S::Created));
    let third = s
        .store
        .get(&product("p"), id(3))
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(third.state, S::Queued);
    // Cancelling the queued one promotes nothing: the contact is held.
    let applied = run(&s, "p", 3, 5, |i, now| i.cancel(now)).await;
    assert!(applied.promoted.is_none());
}

/// A paused holder still holds its contact; a paused queued one does not.
pub async fn a_paused_holder_keeps_its_contact(s: Subject) {
    waiting(&s, "p", 1, "gina", 0).await;
    run(&s, "p", 1, 10, |i, now| i.pause(now)).await;
    assert_eq!(create(&s, "p", 2, "gina", 11).await.state, S::Queued);
    run(&s, "p", 2, 12, |i, now| i.pause(now)).await;
    // The holder ends while the queued one is paused: nothing to promote.
    let applied = run(&s, "p", 1, 13, |i, now| i.cancel(now)).await;
    assert!(applied.promoted.is_none());
    // Resuming the paused queued instance promotes it, the contact being free.
    let applied = run(&s, "p", 2, 14, |i, now| i.resume(now)).await;
    assert_eq!(applied.instance.state, S::Queued);
    let (promoted, _) = applied.promoted.expect("promoted on resume");
    assert_eq!((promoted.instance_id, promoted.state), (id(2), S::Created));
}

/// Only due heartbeats are claimed, and a claimed one is hidden for the lease.
pub async fn claim_due_takes_only_due_instances_once(s: Subject) {
    waiting(&s, "p", 1, "hank", 0).await; // due at 100
    waiting(&s, "p", 2, "ivy", 50).await; // due at 150
    let lease = Duration::from_secs(30);
    assert!(
        s.store
            .claim_due(t(99), 10, lease)
            .await
            .expect("claim")
            .is_empty()
    );
    let claimed = s.store.claim_due(t(120), 10, lease).await.expect("claim");
    assert_eq!(
        claimed.iter().map(|i| i.instance_id).collect::<Vec<_>>(),
        [id(1)]
    );
    assert!(
        s.store
            .claim_due(t(121), 10, lease)
            .await
            .expect("claim")
            .is_empty()
    );
    let both = s.store.claim_due(t(160), 10, lease).await.expect("claim");
    assert_eq!(
        both.iter().map(|i| i.instance_id).collect::<Vec<_>>(),
        [id(1), id(2)]
    );
    let fired = run(&s, "p", 1, 200, |i, now| i.fire_heartbeat(now)).await;
    assert_eq!(fired.instance.state, S::HeartbeatScheduled);
    let later = s.store.claim_due(t(1000), 10, lease).await.expect("claim");
    assert_eq!(
        later.iter().map(|i| i.instance_id).collect::<Vec<_>>(),
        [id(2)]
    );
}

/// Eight sweepers racing on one due heartbeat: it fires exactly once.
pub async fn concurrent_sweepers_fire_a_heartbeat_once(s: Subject) {
    waiting(&s, "p", 1, "jack", 0).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let now = t(500);
            s.store
                .apply(
                    &product("p"),
                    id(1),
                    now,
                    Box::new(move |i| i.fire_heartbeat(now)),
                )
                .await
                .expect("apply")
                .is_ok()
        }));
    }
    let mut fired = 0;
    for task in tasks {
        fired += usize::from(task.await.expect("task"));
    }
    assert_eq!(fired, 1);
}

/// A delivery key is recorded once.
pub async fn delivery_keys_are_recorded_once(s: Subject) {
    waiting(&s, "p", 1, "kate", 0).await;
    let p = product("p");
    assert!(
        s.store
            .record_delivery(&p, id(1), 1, t(1))
            .await
            .expect("record")
    );
    assert!(
        !s.store
            .record_delivery(&p, id(1), 1, t(2))
            .await
            .expect("record")
    );
    assert!(
        s.store
            .record_delivery(&p, id(1), 2, t(3))
            .await
            .expect("record")
    );
}

/// A reply after the end is kept, audited, and changes no state.
pub async fn late_replies_are_kept_and_audited(s: Subject) {
    waiting(&s, "p", 1, "liam", 0).await;
    run(&s, "p", 1, 10, |i, now| i.cancel(now)).await;
    let applied = run(&s, "p", 1, 20, |i, now| {
        Ok(i.contact_reply("too late?".into(), now))
    })
    .await;
    assert_eq!(applied.instance.state, S::Failed);
    let transcript = s
        .store
        .transcript(&product("p"), id(1))
        .await
        .expect("transcript");
    assert_eq!(
        transcript.last().map(|m| m.text.as_str()),
        Some("too late?")
    );
    let audit = s
        .audit
        .list(&product("p"), "conversation", &id(1).to_string(), None, 20)
        .await
        .expect("audit");
    assert_eq!(
        audit.last().map(|r| r.entry.cause.as_str()),
        Some("late_reply")
    );
}

/// Sixteen writers appending replies at once: every reply is kept and every
/// write bumped the version once.
pub async fn concurrent_replies_are_all_kept(s: Subject) {
    let start = waiting(&s, "p", 1, "mia", 0).await;
    let mut tasks = Vec::new();
    for w in 0..16 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            for k in 0..10 {
                run(&s, "p", 1, 10, move |i, now| {
                    Ok(i.contact_reply(format!("w{w} r{k}"), now))
                })
                .await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let end = s
        .store
        .get(&product("p"), id(1))
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(end.version, start.version + 160);
    let transcript = s
        .store
        .transcript(&product("p"), id(1))
        .await
        .expect("transcript");
    let replies = transcript
        .iter()
        .filter(|m| m.role == Role::Contact)
        .count();
    assert_eq!(replies, 160);
    for w in 0..16 {
        let mine: Vec<_> = transcript
            .iter()
            .filter(|m| m.text.starts_with(&format!("w{w} ")))
            .map(|m| m.text.clone())
            .collect();
        let expected: Vec<_> = (0..10).map(|k| format!("w{w} r{k}")).collect();
        assert_eq!(mine, expected);
    }
}

/// Unknown ids, and ids of another product, are `NotFound`.
pub async fn unknown_ids_are_not_found(s: Subject) {
    create(&s, "a", 1, "nina", 0).await;
    let e = s
        .store
        .apply(&product("b"), id(1), t(1), Box::new(|i| i.cancel(t(1))))
        .await
        .expect_err("another product's id");
    assert!(e.is_not_found(), "{e}");
    let e = s
        .store
        .transcript(&product("a"), id(9))
        .await
        .expect_err("unknown id");
    assert!(e.is_not_found(), "{e}");
}

/// Takes every runnable task off the queue: `(kind, instance, outbound_seq)`
/// in queue order.
async fn drain_tasks(s: &Subject) -> Vec<(String, u128, Option<u64>)> {
    let worker = WorkerId(uuid::Uuid::from_u128(7));
    let leases = s
        .queue
        .claim(&worker, "default", 100, Duration::from_secs(60))
        .await
        .expect("claim");
    let mut seen = Vec::new();
    for lease in leases {
        let instance: uuid::Uuid = lease.payload["instance_id"]
            .as_str()
            .expect("instance id")
            .parse()
            .expect("uuid");
        seen.push((
            lease.kind.clone(),
            instance.as_u128(),
            lease.payload["outbound_seq"].as_u64(),
        ));
        s.queue
            .complete(&lease, serde_json::Value::Null)
            .await
            .expect("complete");
    }
    seen
}

/// The tasks an outcome asks for are on the queue once it is stored, and
/// only then: an agent turn for a created holder and after a reply, a
/// delivery per outbound message, a follow-up when a heartbeat fires, the
/// promoted instance's turn with the terminal transition, nothing for a
/// refused command or a queued creation.
pub async fn transitions_enqueue_their_tasks(s: Subject) {
    let turn = |n| (TURN_KIND.to_owned(), n, None);
    create(&s, "p", 1, "olga", 0).await;
    create(&s, "p", 2, "olga", 1).await;
    assert_eq!(drain_tasks(&s).await, [turn(1)], "the queued one waits");
    run(&s, "p", 1, 2, |i, now| i.begin_agent_turn(now)).await;
    run(&s, "p", 1, 2, |i, now| i.agent_send("hi".into(), None, now)).await;
    assert_eq!(
        drain_tasks(&s).await,
        [(DELIVER_KIND.to_owned(), 1, Some(1))]
    );
    let refused = s
        .store
        .apply(
            &product("p"),
            id(1),
            t(3),
            Box::new(|i| i.begin_agent_turn(t(3))),
        )
        .await
        .expect("apply");
    assert!(refused.is_err());
    assert_eq!(drain_tasks(&s).await, []);
    run(&s, "p", 1, 102, |i, now| i.fire_heartbeat(now)).await;
    assert_eq!(
        drain_tasks(&s).await,
        [(FOLLOW_UP_KIND.to_owned(), 1, None)]
    );
    run(&s, "p", 1, 103, |i, now| {
        Ok(i.contact_reply("yes".into(), now))
    })
    .await;
    assert_eq!(drain_tasks(&s).await, [turn(1)]);
    let applied = run(&s, "p", 1, 104, |i, now| i.cancel(now)).await;
    assert_eq!(applied.promoted.expect("promoted").0.state, S::Created);
    assert_eq!(drain_tasks(&s).await, [turn(2)]);
}
