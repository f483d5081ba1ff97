//! Contract suite for conversation stores: a [`MachineStore<Instance>`] and
//! the [`ConversationStore`] beside it.
//!
//! Run it from an adapter's tests with
//! `parlance_testkit::conversation_store_suite!(async { Some(subject) });`,
//! and the storage protocol's suite with
//! `parlance_testkit::machine_store_suite!(async { Some(subject) });` on the
//! same [`Subject`], which is a [`StoreFixture`].
//!
//! Every case decides a command on the instance as loaded and commits it
//! once, as the executor does on its first attempt: what the store must do
//! with a commit (decide a creation again under the contact's lock, promote,
//! write the transcript lines, refuse a stale version) is checked here; a
//! lost commit decided again is the executor's, checked in the app.

use std::sync::Arc;
use std::time::Duration;

use parlance_core::conversation::{
    ContactId, ConversationCommand as C, ConversationContext, ConversationError, ConversationKey,
    ConversationState as S, Instance, InstanceId, NewInstance, Role,
};
use parlance_core::{Decision, EntityKind, Machine as _, NotAllowed, ProductId, Timestamp};
use parlance_ports::conversation::{DELIVER_KIND, FOLLOW_UP_KIND, TURN_KIND};
use parlance_ports::{
    AuditLog, AuditRecord, Commit, ConversationPage, ConversationStore, ErrorKind, ListFilter,
    ListOrder, MachineStore, PortError, Stored, TaskQueue, Version, WorkerId,
};
use serde_json::Map;

use crate::store::StoreFixture;

/// Runs every case of this suite against the adapter the factory builds.
///
/// See how [the in-memory adapters](https://github.com/parlance-rs/parlance/blob/main/crates/memory/tests/it/main.rs) and [the PostgreSQL adapters](https://github.com/parlance-rs/parlance/blob/main/crates/postgres/tests/it/main.rs) run it.
///
/// ```
/// # use std::sync::Arc;
/// # use parlance_memory::{MemoryAuditLog, MemoryConversationStore, MemoryTaskQueue};
/// # use parlance_ports::{QueueConfig, SystemClock};
/// use parlance_testkit::conversation::Subject;
///
/// /// The in-memory conversation store with its audit log and queue.
/// fn subject() -> Subject {
///     let audit = Arc::new(MemoryAuditLog::new());
///     let queue = Arc::new(MemoryTaskQueue::new(Arc::new(SystemClock), QueueConfig::default()));
///     let store = Arc::new(MemoryConversationStore::new(audit.clone(), queue.clone()));
///     Subject { store: store.clone(), index: store, audit, queue }
/// }
///
/// // In the adapter's `tests/it/main.rs`, one `#[tokio::test]` per case:
/// mod conversation {
///     parlance_testkit::conversation_store_suite!(async { Some(super::subject()) });
/// }
///
/// // What some of those tests run:
/// #[tokio::main]
/// async fn main() {
///     use parlance_testkit::conversation::*;
///
///     create_get_and_list_are_scoped(subject()).await;
///     a_commit_saves_appends_and_audits(subject()).await;
///     a_terminal_transition_promotes_the_oldest_queued(subject()).await;
///     unknown_ids_are_not_found(subject()).await;
/// }
/// ```
#[macro_export]
macro_rules! conversation_store_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::conversation;
            cases = [
                create_get_and_list_are_scoped,
                listings_filter_by_states_and_page_either_way,
                a_cursor_goes_on_past_instances_created_meanwhile,
                a_creation_is_decided_again_under_the_contact_lock,
                concurrent_creates_yield_exactly_one_created,
                a_commit_saves_appends_and_audits,
                a_refused_command_changes_nothing,
                a_stale_commit_writes_no_line_audit_entry_or_task,
                a_command_decided_again_on_the_winner_keeps_both_replies,
                a_terminal_transition_promotes_the_oldest_queued,
                a_paused_holder_keeps_its_contact,
                claim_due_takes_only_due_instances_once,
                oldest_due_skips_claimed_instances,
                concurrent_sweepers_fire_a_heartbeat_once,
                delivery_keys_are_recorded_once,
                late_replies_are_kept_and_audited,
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
    /// The instances, through the storage protocol.
    pub store: Arc<dyn MachineStore<Instance>>,
    /// The same store's listings, transcripts, claims and delivery keys.
    pub index: Arc<dyn ConversationStore>,
    /// The audit log the store writes its transitions to.
    pub audit: Arc<dyn AuditLog>,
    /// The queue the store enqueues its transitions' tasks on (empty at the
    /// start).
    pub queue: Arc<dyn TaskQueue>,
}

/// With the contact free: what the executor decides with; the store
/// decides a creation again with what it finds under the contact's lock.
const FREE: ConversationContext = ConversationContext {
    contact_held: false,
};

/// The storage protocol's suite on conversations. Record `n` of a product
/// is an instance with a contact of its own, so it is created `CREATED` as
/// decided; the change is `begin_agent_turn`.
impl StoreFixture for Subject {
    type M = Instance;

    fn store(&self) -> Arc<dyn MachineStore<Instance>> {
        self.store.clone()
    }
    fn audit(&self) -> Arc<dyn AuditLog> {
        self.audit.clone()
    }
    fn queue(&self) -> Arc<dyn TaskQueue> {
        self.queue.clone()
    }
    fn context(&self) -> &ConversationContext {
        &FREE
    }
    fn key(&self, product: &ProductId, n: u32) -> ConversationKey {
        ConversationKey {
            product_id: product.clone(),
            instance_id: id(u128::from(n)),
        }
    }
    fn create(&self, key: &ConversationKey) -> C {
        let contact = ContactId::parse(format!("contact-{}", key.instance_id)).expect("valid");
        C::Create(new_instance(key, contact))
    }
    fn change(&self, _: &Instance) -> C {
        C::BeginAgentTurn
    }
    /// No command on a just-created instance both records a transition and
    /// asks for a task (`begin_agent_turn` does the first, nothing the
    /// second); this suite's cases check tasks and lost commits with
    /// commands that do both.
    fn audits_and_enqueues(&self) -> bool {
        false
    }
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

fn key(p: &str, n: u128) -> ConversationKey {
    ConversationKey {
        product_id: product(p),
        instance_id: id(n),
    }
}

fn new(p: &str, n: u128, contact: &str) -> NewInstance {
    new_instance(
        &key(p, n),
        ContactId::parse(contact).expect("valid contact"),
    )
}

fn new_instance(key: &ConversationKey, contact_id: ContactId) -> NewInstance {
    NewInstance {
        product_id: key.product_id.clone(),
        instance_id: key.instance_id,
        contact_id,
        channel: "loopback".to_owned(),
        objective: "book a demo".to_owned(),
        todos: vec![],
        heartbeat_interval_s: 100,
        max_follow_ups: 2,
        metadata: Map::new(),
    }
}

/// What a commit stored: the instance as written, its version and
/// decision, and what was promoted with it.
#[derive(Debug)]
pub struct Done {
    /// The instance as written.
    pub state: Instance,
    /// Its version.
    pub version: Version,
    /// The decision written.
    pub decision: Decision<Instance>,
    /// Instances promoted in the same commit.
    pub also: Vec<(Stored<Instance>, Decision<Instance>)>,
}

/// Creates instance `n`, decided with the contact free; the store decides
/// again under the contact's lock.
async fn create(s: &Subject, p: &str, n: u128, contact: &str, at: u64) -> Done {
    let command = C::Create(new(p, n, contact));
    let key = key(p, n);
    let (state, decision) = Instance::create(&key, &FREE, &command, t(at))
        .expect("valid instance")
        .expect("create creates");
    let done = s
        .store
        .commit(Commit {
            key: &key,
            expected: None,
            command: &command,
            state: &state,
            decision: &decision,
            now: t(at),
        })
        .await
        .expect("create");
    let (state, decision) = done.written.unwrap_or((state, decision));
    Done {
        state,
        version: done.version,
        decision,
        also: done.also,
    }
}

/// Why a command did not land.
#[derive(Debug)]
enum NotDone {
    /// The machine refused it on the loaded instance.
    Refused(ConversationError),
    /// The commit failed.
    Port(PortError),
}

/// Decides `command` on the instance as loaded before and commits it once.
async fn commit_on(
    s: &Subject,
    loaded: &Stored<Instance>,
    at: u64,
    command: C,
) -> Result<Done, NotDone> {
    let mut state = loaded.state.clone();
    let decision = state
        .decide(&FREE, &command, t(at))
        .map_err(NotDone::Refused)?;
    let key = state.key();
    let done = s
        .store
        .commit(Commit {
            key: &key,
            expected: Some(loaded.version),
            command: &command,
            state: &state,
            decision: &decision,
            now: t(at),
        })
        .await
        .map_err(NotDone::Port)?;
    let (state, decision) = done.written.unwrap_or((state, decision));
    Ok(Done {
        state,
        version: done.version,
        decision,
        also: done.also,
    })
}

async fn load(s: &Subject, p: &str, n: u128) -> Stored<Instance> {
    s.store
        .load(&key(p, n))
        .await
        .expect("load")
        .expect("the instance exists")
}

/// Loads instance `n`, decides `command` on it and commits it once.
async fn try_run(s: &Subject, p: &str, n: u128, at: u64, command: C) -> Result<Done, NotDone> {
    let loaded = load(s, p, n).await;
    commit_on(s, &loaded, at, command).await
}

/// Runs a command, expecting the machine to accept it and the store to
/// commit it.
async fn run(s: &Subject, p: &str, n: u128, at: u64, command: C) -> Done {
    try_run(s, p, n, at, command)
        .await
        .unwrap_or_else(|e| panic!("command not committed: {e:?}"))
}

fn send(text: &str) -> C {
    C::AgentSend {
        text: text.into(),
        next_heartbeat_s: None,
    }
}

fn reply(text: impl Into<String>) -> C {
    C::ContactReply { text: text.into() }
}

/// An instance in `WAITING_FOR_REPLY` with its heartbeat due at `at + 100`.
async fn waiting(s: &Subject, p: &str, n: u128, contact: &str, at: u64) -> Done {
    create(s, p, n, contact, at).await;
    run(s, p, n, at, C::BeginAgentTurn).await;
    run(s, p, n, at, send("hello")).await
}

async fn audit_of(s: &Subject, p: &str, n: u128) -> Vec<AuditRecord> {
    s.audit
        .list(
            &product(p),
            EntityKind::Conversation,
            &id(n).to_string(),
            None,
            1000,
        )
        .await
        .expect("audit")
}

async fn transcript(s: &Subject, p: &str, n: u128) -> Vec<parlance_core::conversation::Message> {
    s.index.transcript(&key(p, n)).await.expect("transcript")
}

/// Ids, products and contacts keep instances apart.
pub async fn create_get_and_list_are_scoped(s: Subject) {
    let a = create(&s, "a", 1, "alice", 0).await;
    assert_eq!((a.state.state, a.version), (S::Created, Version::FIRST));
    let q = create(&s, "a", 2, "alice", 1).await;
    assert_eq!(q.state.state, S::Queued);
    let b = create(&s, "a", 3, "bob", 2).await;
    assert_eq!(b.state.state, S::Created);
    let other = create(&s, "b", 4, "alice", 3).await;
    assert_eq!(
        other.state.state,
        S::Created,
        "another product's contact is another contact"
    );

    let got = s.store.load(&key("a", 1)).await.expect("load");
    assert_eq!(
        got,
        Some(Stored {
            state: a.state,
            version: a.version
        })
    );
    assert_eq!(s.store.load(&key("b", 1)).await.expect("load"), None);

    let all = s
        .index
        .list(&product("a"), &ListFilter::default())
        .await
        .expect("list");
    assert_eq!(all.next, None, "one page holds them all");
    let ids: Vec<_> = all.items.iter().map(|i| i.state.instance_id).collect();
    assert_eq!(ids, [id(1), id(2), id(3)], "oldest first, product a only");
    assert!(all.items.iter().all(|i| i.version == Version::FIRST));
    let alice = ListFilter {
        contact_id: Some(ContactId::parse("alice").expect("valid")),
        ..ListFilter::default()
    };
    assert_eq!(
        s.index
            .list(&product("a"), &alice)
            .await
            .expect("list")
            .items
            .len(),
        2
    );
    let queued = ListFilter {
        states: vec![S::Queued],
        ..ListFilter::default()
    };
    let got = s.index.list(&product("a"), &queued).await.expect("list");
    assert_eq!(listed(&got), [2]);
    let audit = audit_of(&s, "a", 2).await;
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (audit[0].entry.from.as_deref(), audit[0].entry.to.as_str()),
        (None, "QUEUED")
    );
}

/// The instance numbers of a page, in its order.
fn listed(page: &ConversationPage) -> Vec<u128> {
    page.items
        .iter()
        .map(|i| {
            (1..=64)
                .find(|n| id(*n) == i.state.instance_id)
                .expect("an instance of the suite")
        })
        .collect()
}

/// Every page of a listing, following each page's cursor.
async fn pages(s: &Subject, p: &str, mut filter: ListFilter) -> Vec<Vec<u128>> {
    let mut pages = Vec::new();
    loop {
        let page = s.index.list(&product(p), &filter).await.expect("list");
        pages.push(listed(&page));
        match page.next {
            Some(next) => filter.after = Some(next),
            None => return pages,
        }
        assert!(pages.len() < 64, "a listing that never ends");
    }
}

/// Listings take any set of states, either order, and go on from the
/// cursor of the page before, a page at a time, until a page says it is
/// the last; they see one product only.
pub async fn listings_filter_by_states_and_page_either_way(s: Subject) {
    for n in 1..=7 {
        create(&s, "a", n, &format!("c{n}"), n as u64).await;
    }
    create(&s, "b", 8, "c1", 8).await;
    for n in [2, 5] {
        run(&s, "a", n, 10, C::BeginAgentTurn).await;
        let reason = "asks for a person".to_owned();
        run(&s, "a", n, 11, C::RequestHuman { reason }).await;
    }
    run(&s, "a", 3, 12, C::Pause).await;
    run(&s, "a", 6, 12, C::Cancel).await;
    let newest = |states: Vec<S>, limit: Option<usize>| ListFilter {
        states,
        order: ListOrder::NewestFirst,
        limit,
        ..ListFilter::default()
    };

    let human = s
        .index
        .list(
            &product("a"),
            &newest(vec![S::NeedsHumanIntervention], None),
        )
        .await
        .expect("list");
    assert_eq!((listed(&human), human.next), (vec![5, 2], None));
    let two = newest(vec![S::Paused, S::NeedsHumanIntervention], None);
    let got = s.index.list(&product("a"), &two).await.expect("list");
    assert_eq!(listed(&got), [5, 3, 2], "any of the states, newest first");
    let two = newest(vec![S::Paused, S::NeedsHumanIntervention], Some(2));
    assert_eq!(pages(&s, "a", two).await, [vec![5, 3], vec![2]]);
    let two_oldest = ListFilter {
        states: vec![S::NeedsHumanIntervention, S::Paused],
        limit: Some(1),
        ..ListFilter::default()
    };
    assert_eq!(
        pages(&s, "a", two_oldest).await,
        [vec![2], vec![3], vec![5]]
    );
    let twice = newest(vec![S::Paused, S::Paused], None);
    let got = s.index.list(&product("a"), &twice).await.expect("list");
    assert_eq!(listed(&got), [3], "a state named twice is listed once");
    let created = newest(vec![S::Created], Some(2));
    assert_eq!(pages(&s, "a", created).await, [vec![7, 4], vec![1]]);
    let none = newest(vec![S::Completed], None);
    let got = s.index.list(&product("a"), &none).await.expect("list");
    assert_eq!((got.items.len(), got.next), (0, None));

    let oldest = |limit| ListFilter {
        limit: Some(limit),
        ..ListFilter::default()
    };
    assert_eq!(
        pages(&s, "a", oldest(3)).await,
        [vec![1, 2, 3], vec![4, 5, 6], vec![7]]
    );
    assert_eq!(
        pages(&s, "a", oldest(7)).await,
        [vec![1, 2, 3, 4, 5, 6, 7]],
        "a page that holds the rest is the last"
    );
    assert_eq!(
        pages(&s, "a", newest(Vec::new(), Some(3))).await,
        [vec![7, 6, 5], vec![4, 3, 2], vec![1]]
    );
    let empty = s.index.list(&product("a"), &oldest(0)).await.expect("list");
    assert_eq!((empty.items.len(), empty.next), (0, None));
    assert_eq!(pages(&s, "b", oldest(1)).await, [vec![8]]);

    let c5 = ListFilter {
        contact_id: Some(ContactId::parse("c5").expect("valid")),
        states: vec![S::NeedsHumanIntervention, S::Created],
        ..ListFilter::default()
    };
    assert_eq!(pages(&s, "a", c5).await, [vec![5]]);
}

/// A cursor is a position, not an instance: pages newest first go on to
/// older instances whatever is created meanwhile, and pages oldest first
/// reach the new ones.
pub async fn a_cursor_goes_on_past_instances_created_meanwhile(s: Subject) {
    for n in 1..=4 {
        create(&s, "a", n, &format!("c{n}"), n as u64).await;
    }
    let first = |order| ListFilter {
        order,
        limit: Some(2),
        ..ListFilter::default()
    };
    let newest = s
        .index
        .list(&product("a"), &first(ListOrder::NewestFirst))
        .await
        .expect("list");
    let oldest = s
        .index
        .list(&product("a"), &first(ListOrder::OldestFirst))
        .await
        .expect("list");
    assert_eq!((listed(&newest), listed(&oldest)), (vec![4, 3], vec![1, 2]));
    create(&s, "a", 5, "c5", 5).await;
    let mut after = first(ListOrder::NewestFirst);
    after.after = newest.next;
    let got = s.index.list(&product("a"), &after).await.expect("list");
    assert_eq!((listed(&got), got.next), (vec![2, 1], None));
    let mut after = first(ListOrder::OldestFirst);
    after.after = oldest.next;
    let got = s.index.list(&product("a"), &after).await.expect("list");
    assert_eq!(listed(&got), [3, 4]);
    after.after = got.next;
    let got = s.index.list(&product("a"), &after).await.expect("list");
    assert_eq!((listed(&got), got.next), (vec![5], None));
}

/// A creation decided with the contact free is decided again by the store
/// with the contact held: it writes and reports `QUEUED`, with no agent
/// turn.
pub async fn a_creation_is_decided_again_under_the_contact_lock(s: Subject) {
    create(&s, "p", 1, "ann", 0).await;
    drain_tasks(&s).await;
    let command = C::Create(new("p", 2, "ann"));
    let (state, decision) = Instance::create(&key("p", 2), &FREE, &command, t(1))
        .expect("valid")
        .expect("created");
    assert_eq!(state.state, S::Created, "decided with the contact free");
    let done = s
        .store
        .commit(Commit {
            key: &key("p", 2),
            expected: None,
            command: &command,
            state: &state,
            decision: &decision,
            now: t(1),
        })
        .await
        .expect("create");
    let (written, written_decision) = done.written.expect("the store reports its own decision");
    assert_eq!(written.state, S::Queued);
    assert!(written_decision.tasks.is_empty(), "a queued instance waits");
    assert_eq!(load(&s, "p", 2).await.state, written);
    assert_eq!(drain_tasks(&s).await, []);
    let audit = audit_of(&s, "p", 2).await;
    assert_eq!(
        audit
            .iter()
            .map(|r| r.entry.to.as_str())
            .collect::<Vec<_>>(),
        ["QUEUED"]
    );
}

/// Sixteen creates racing for one contact: one `CREATED`, fifteen `QUEUED`.
pub async fn concurrent_creates_yield_exactly_one_created(s: Subject) {
    let mut tasks = Vec::new();
    for n in 0..16u128 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            create(&s, "p", 100 + n, "carol", 0).await.state.state
        }));
    }
    let mut states = Vec::new();
    for task in tasks {
        states.push(task.await.expect("task"));
    }
    assert_eq!(
        states.iter().filter(|s| **s == S::Created).count(),
        1,
        "{states:?}"
    );
    assert_eq!(states.iter().filter(|s| **s == S::Queued).count(), 15);
    let mut stored = Vec::new();
    for n in 0..16u128 {
        stored.push(load(&s, "p", 100 + n).await.state.state);
    }
    assert_eq!(stored, states, "each stored as reported");
}

/// A command's instance, transcript and audit entries are stored together.
pub async fn a_commit_saves_appends_and_audits(s: Subject) {
    let i = waiting(&s, "p", 1, "dave", 0).await;
    assert_eq!((i.state.state, i.version), (S::WaitingForReply, Version(3)));
    assert_eq!(i.state.next_deadline(), Some(t(100)));
    let stored = load(&s, "p", 1).await;
    assert_eq!(
        stored,
        Stored {
            state: i.state,
            version: i.version
        }
    );
    let transcript = transcript(&s, "p", 1).await;
    assert_eq!(transcript.len(), 1);
    assert_eq!(
        (transcript[0].role, transcript[0].text.as_str()),
        (Role::Agent, "hello")
    );
    assert_eq!(transcript[0].outbound_seq, Some(1));
    let steps: Vec<_> = audit_of(&s, "p", 1)
        .await
        .iter()
        .map(|r| (r.entry.to.clone(), r.entry.cause.clone()))
        .collect();
    let steps: Vec<_> = steps
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
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
    waiting(&s, "p", 1, "erin", 0).await;
    let before = load(&s, "p", 1).await;
    let refused = try_run(&s, "p", 1, 5, C::EndConversation { outcome: None }).await;
    match refused {
        Err(NotDone::Refused(e)) => assert_eq!(
            e,
            ConversationError::NotAllowed(NotAllowed::new(
                "end_conversation",
                S::WaitingForReply.as_str()
            ))
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(load(&s, "p", 1).await, before);
    assert_eq!(transcript(&s, "p", 1).await.len(), 1);
}

/// Two replies decided on one version: the first commit lands, the second
/// is a conflict that writes no transcript line, no audit entry and no
/// task.
pub async fn a_stale_commit_writes_no_line_audit_entry_or_task(s: Subject) {
    waiting(&s, "p", 1, "fay", 0).await;
    drain_tasks(&s).await;
    let seen = load(&s, "p", 1).await;
    let audit_before = audit_of(&s, "p", 1).await.len();
    let first = commit_on(&s, &seen, 10, reply("first"))
        .await
        .expect("the first commit lands");
    assert_eq!(first.state.state, S::WaitingForAgent);
    let second = commit_on(&s, &seen, 10, reply("second")).await;
    match second {
        Err(NotDone::Port(e)) => assert_eq!(e.kind, ErrorKind::Conflict, "{e}"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    let texts: Vec<_> = transcript(&s, "p", 1)
        .await
        .into_iter()
        .map(|m| m.text)
        .collect();
    assert_eq!(texts, ["hello", "first"]);
    assert_eq!(
        audit_of(&s, "p", 1).await.len(),
        audit_before + first.decision.transitions.len()
    );
    assert_eq!(
        drain_tasks(&s).await,
        [(TURN_KIND.to_owned(), 1, None)],
        "only the first commit's agent turn"
    );
    assert_eq!(load(&s, "p", 1).await.version, seen.version.next());
}

/// A command whose commit lost to another, decided again on the instance
/// as the winner left it, lands on the next version with both replies
/// kept.
pub async fn a_command_decided_again_on_the_winner_keeps_both_replies(s: Subject) {
    let start = waiting(&s, "p", 1, "gus", 0).await;
    let seen = load(&s, "p", 1).await;
    commit_on(&s, &seen, 10, reply("w0")).await.expect("w0");
    let lost = commit_on(&s, &seen, 10, reply("w1")).await;
    assert!(
        matches!(&lost, Err(NotDone::Port(e)) if e.kind == ErrorKind::Conflict),
        "{lost:?}"
    );
    let fresh = load(&s, "p", 1).await;
    assert_eq!(fresh.version, start.version.next(), "the version that won");
    let again = commit_on(&s, &fresh, 10, reply("w1"))
        .await
        .expect("decided again, it lands");
    assert_eq!(again.version, start.version.next().next());
    let replies: Vec<_> = transcript(&s, "p", 1)
        .await
        .into_iter()
        .filter(|m| m.role == Role::Contact)
        .map(|m| m.text)
        .collect();
    assert_eq!(replies, ["w0", "w1"]);
}

/// Ending the holder promotes the oldest queued instance in the same write.
pub async fn a_terminal_transition_promotes_the_oldest_queued(s: Subject) {
    create(&s, "p", 1, "frank", 0).await;
    create(&s, "p", 2, "frank", 1).await;
    create(&s, "p", 3, "frank", 2).await;
    run(&s, "p", 1, 3, C::BeginAgentTurn).await;
    let done = C::EndConversation {
        outcome: Some("done".into()),
    };
    let applied = run(&s, "p", 1, 4, done).await;
    assert_eq!(applied.state.state, S::Completed);
    let [(promoted, _)] = applied.also.as_slice() else {
        panic!("the oldest queued instance is promoted: {:?}", applied.also);
    };
    assert_eq!(
        (promoted.state.instance_id, promoted.state.state),
        (id(2), S::Created)
    );
    assert_eq!(&load(&s, "p", 2).await, promoted, "stored as reported");
    assert_eq!(load(&s, "p", 3).await.state.state, S::Queued);
    // Listings by state see the promotion written in the same commit.
    let in_state = |state| ListFilter {
        states: vec![state],
        ..ListFilter::default()
    };
    let queued = s.index.list(&product("p"), &in_state(S::Queued)).await;
    assert_eq!(listed(&queued.expect("list")), [3]);
    let created = s.index.list(&product("p"), &in_state(S::Created)).await;
    assert_eq!(listed(&created.expect("list")), [2]);
    let ended = s.index.list(&product("p"), &in_state(S::Completed)).await;
    assert_eq!(listed(&ended.expect("list")), [1]);
    // Cancelling the queued one promotes nothing: the contact is held.
    let applied = run(&s, "p", 3, 5, C::Cancel).await;
    assert!(applied.also.is_empty());
}

/// A paused holder still holds its contact; a paused queued one does not.
pub async fn a_paused_holder_keeps_its_contact(s: Subject) {
    waiting(&s, "p", 1, "gina", 0).await;
    run(&s, "p", 1, 10, C::Pause).await;
    assert_eq!(create(&s, "p", 2, "gina", 11).await.state.state, S::Queued);
    run(&s, "p", 2, 12, C::Pause).await;
    // The holder ends while the queued one is paused: nothing to promote.
    let applied = run(&s, "p", 1, 13, C::Cancel).await;
    assert!(applied.also.is_empty());
    // Resuming the paused queued instance promotes it, the contact being free.
    let applied = run(&s, "p", 2, 14, C::Resume).await;
    assert_eq!(applied.state.state, S::Queued);
    let [(promoted, _)] = applied.also.as_slice() else {
        panic!("promoted on resume: {:?}", applied.also);
    };
    assert_eq!(
        (promoted.state.instance_id, promoted.state.state),
        (id(2), S::Created)
    );
    assert_eq!(promoted.version, applied.version.next());
    assert_eq!(&load(&s, "p", 2).await, promoted);
}

fn ids(keys: &[ConversationKey]) -> Vec<InstanceId> {
    keys.iter().map(|k| k.instance_id).collect()
}

/// Only due heartbeats are claimed, and a claimed one is hidden for the lease.
pub async fn claim_due_takes_only_due_instances_once(s: Subject) {
    waiting(&s, "p", 1, "hank", 0).await; // due at 100
    waiting(&s, "p", 2, "ivy", 50).await; // due at 150
    let lease = Duration::from_secs(30);
    assert!(
        s.index
            .claim_due(t(99), 10, lease)
            .await
            .expect("claim")
            .is_empty()
    );
    let claimed = s.index.claim_due(t(120), 10, lease).await.expect("claim");
    assert_eq!(ids(&claimed), [id(1)]);
    assert_eq!(claimed[0].product_id, product("p"));
    assert!(
        s.index
            .claim_due(t(121), 10, lease)
            .await
            .expect("claim")
            .is_empty()
    );
    let both = s.index.claim_due(t(160), 10, lease).await.expect("claim");
    assert_eq!(ids(&both), [id(1), id(2)]);
    let fired = run(&s, "p", 1, 200, C::TimerFired).await;
    assert_eq!(fired.state.state, S::HeartbeatScheduled);
    let later = s.index.claim_due(t(1000), 10, lease).await.expect("claim");
    assert_eq!(ids(&later), [id(2)]);
}

/// Eight sweepers racing on one due heartbeat, each deciding and
/// committing once: exactly one firing lands, and deciding it again on the
/// instance as it then is refuses it.
pub async fn concurrent_sweepers_fire_a_heartbeat_once(s: Subject) {
    waiting(&s, "p", 1, "jack", 0).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (s, barrier) = (s.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let loaded = load(&s, "p", 1).await;
            barrier.wait().await;
            commit_on(&s, &loaded, 500, C::TimerFired).await
        }));
    }
    let mut fired = 0;
    for task in tasks {
        match task.await.expect("task") {
            Ok(_) => fired += 1,
            Err(NotDone::Port(e)) => assert_eq!(e.kind, ErrorKind::Conflict, "{e}"),
            Err(NotDone::Refused(e)) => panic!("decided on the armed heartbeat, refused: {e}"),
        }
    }
    assert_eq!(fired, 1);
    let again = try_run(&s, "p", 1, 500, C::TimerFired).await;
    assert!(matches!(again, Err(NotDone::Refused(_))), "{again:?}");
    let firings = audit_of(&s, "p", 1)
        .await
        .iter()
        .filter(|r| r.entry.cause == "timer_fired")
        .count();
    assert_eq!(firings, 1);
}

/// A delivery key is recorded once.
pub async fn delivery_keys_are_recorded_once(s: Subject) {
    waiting(&s, "p", 1, "kate", 0).await;
    let k = key("p", 1);
    assert!(s.index.record_delivery(&k, 1, t(1)).await.expect("record"));
    assert!(!s.index.record_delivery(&k, 1, t(2)).await.expect("record"));
    assert!(s.index.record_delivery(&k, 2, t(3)).await.expect("record"));
}

/// A reply after the end is kept, audited, and changes no state.
pub async fn late_replies_are_kept_and_audited(s: Subject) {
    waiting(&s, "p", 1, "liam", 0).await;
    run(&s, "p", 1, 10, C::Cancel).await;
    let applied = run(&s, "p", 1, 20, reply("too late?")).await;
    assert_eq!(applied.state.state, S::Failed);
    let transcript = transcript(&s, "p", 1).await;
    assert_eq!(
        transcript.last().map(|m| m.text.as_str()),
        Some("too late?")
    );
    let audit = audit_of(&s, "p", 1).await;
    assert_eq!(
        audit.last().map(|r| r.entry.cause.as_str()),
        Some("late_reply")
    );
}

/// Unknown ids, and ids of another product, load as nothing; a commit on
/// one is a conflict that creates nothing; their transcript is `NotFound`.
pub async fn unknown_ids_are_not_found(s: Subject) {
    let a = create(&s, "a", 1, "nina", 0).await;
    assert_eq!(s.store.load(&key("b", 1)).await.expect("load"), None);
    let mut state = a.state.clone();
    let decision = state.decide(&FREE, &C::Cancel, t(1)).expect("cancel");
    let e = s
        .store
        .commit(Commit {
            key: &key("b", 1),
            expected: Some(a.version),
            command: &C::Cancel,
            state: &state,
            decision: &decision,
            now: t(1),
        })
        .await
        .expect_err("another product's id");
    assert_eq!(e.kind, ErrorKind::Conflict, "{e}");
    assert_eq!(s.store.load(&key("b", 1)).await.expect("load"), None);
    let e = s
        .index
        .transcript(&key("a", 9))
        .await
        .expect_err("unknown id");
    assert!(e.is_not_found(), "{e}");
    let e = s
        .index
        .transcript(&key("b", 1))
        .await
        .expect_err("another product's id");
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

/// The tasks a decision asks for are on the queue once it is stored, and
/// only then: an agent turn for a created holder and after a reply, a
/// delivery per outbound message, a follow-up when a heartbeat fires, the
/// promoted instance's turn with the terminal transition, nothing for a
/// refused command or a queued creation.
pub async fn transitions_enqueue_their_tasks(s: Subject) {
    let turn = |n| (TURN_KIND.to_owned(), n, None);
    create(&s, "p", 1, "olga", 0).await;
    create(&s, "p", 2, "olga", 1).await;
    assert_eq!(drain_tasks(&s).await, [turn(1)], "the queued one waits");
    run(&s, "p", 1, 2, C::BeginAgentTurn).await;
    run(&s, "p", 1, 2, send("hi")).await;
    assert_eq!(
        drain_tasks(&s).await,
        [(DELIVER_KIND.to_owned(), 1, Some(1))]
    );
    let refused = try_run(&s, "p", 1, 3, C::BeginAgentTurn).await;
    assert!(matches!(refused, Err(NotDone::Refused(_))), "{refused:?}");
    assert_eq!(drain_tasks(&s).await, []);
    run(&s, "p", 1, 102, C::TimerFired).await;
    assert_eq!(
        drain_tasks(&s).await,
        [(FOLLOW_UP_KIND.to_owned(), 1, None)]
    );
    run(&s, "p", 1, 103, reply("yes")).await;
    assert_eq!(drain_tasks(&s).await, [turn(1)]);
    let applied = run(&s, "p", 1, 104, C::Cancel).await;
    assert_eq!(applied.also[0].0.state.state, S::Created);
    assert_eq!(drain_tasks(&s).await, [turn(2)]);
}

/// `oldest_due` reads the earliest heartbeat that has come of an instance no
/// claim holds.
pub async fn oldest_due_skips_claimed_instances(s: Subject) {
    let oldest = |now: u64| {
        let s = s.clone();
        async move { s.index.oldest_due(t(now)).await.expect("oldest due") }
    };
    assert_eq!(oldest(1000).await, None, "no instances");
    waiting(&s, "p", 1, "hank", 0).await; // due at 100
    waiting(&s, "p", 2, "ivy", 50).await; // due at 150
    assert_eq!(oldest(99).await, None, "nothing due yet");
    assert_eq!(oldest(160).await, Some(t(100)));
    let lease = Duration::from_secs(30);
    let claimed = s.index.claim_due(t(160), 1, lease).await.expect("claim");
    assert_eq!(ids(&claimed), [id(1)]);
    assert_eq!(oldest(160).await, Some(t(150)), "the claimed one is held");
    let claimed = s.index.claim_due(t(160), 10, lease).await.expect("claim");
    assert_eq!(ids(&claimed), [id(2)]);
    assert_eq!(oldest(160).await, None, "every due instance is claimed");
    assert_eq!(
        oldest(190).await,
        Some(t(100)),
        "a lapsed claim is due again"
    );
}
