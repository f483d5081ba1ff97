//! Contract suites for session stores: the storage protocol through
//! [`SessionFixture`] (run with `parlance_testkit::machine_store_suite!`),
//! and what only sessions have (exact round trips, deletion, claims of due
//! sessions, tour catalogs) through [`Subject`].
//!
//! Run the latter from an adapter's tests with
//! `parlance_testkit::session_store_suite!(async { Some(subject) });`.

use std::collections::HashSet;
use std::sync::Arc;

use parlance_core::session::{
    AssistState, ConversationEvent, SessionCommand, SessionEvent, SessionId, SessionKey,
    SessionState, TourCatalog,
};
use parlance_core::{Decision, ProductId, Timestamp, Transition};
use parlance_ports::{
    AuditEntry, AuditLog, CLAIM_LEASE, Commit, ErrorKind, MachineStore, PortError, SessionStore,
    Stored, TaskQueue, TourCatalogStore, Version,
};
use serde_json::{Value, json};

use crate::store::StoreFixture;

/// A session store under the storage protocol's suite
/// ([`crate::store`]).
#[derive(Clone)]
pub struct SessionFixture {
    /// The store under test.
    pub store: Arc<dyn MachineStore<SessionState>>,
    /// The audit log its commits write to.
    pub audit: Arc<dyn AuditLog>,
    /// The queue its commits enqueue on.
    pub queue: Arc<dyn TaskQueue>,
}

impl StoreFixture for SessionFixture {
    type M = SessionState;

    fn store(&self) -> Arc<dyn MachineStore<SessionState>> {
        self.store.clone()
    }

    fn audit(&self) -> Arc<dyn AuditLog> {
        self.audit.clone()
    }

    fn queue(&self) -> Arc<dyn TaskQueue> {
        self.queue.clone()
    }

    fn context(&self) -> &TourCatalog {
        TourCatalog::none()
    }

    fn key(&self, product: &ProductId, n: u32) -> SessionKey {
        SessionKey::new(product.clone(), sid(&format!("s-{n}")))
    }

    fn create(&self, _: &SessionKey) -> SessionCommand {
        SessionCommand::Create
    }

    /// Opening the chat from `thinking` (a transition); a message otherwise.
    fn change(&self, state: &SessionState) -> SessionCommand {
        match state.current_state() {
            AssistState::Thinking => SessionEvent::OpenChat.into(),
            _ => SessionEvent::UserMessage.into(),
        }
    }

    /// A session's decisions never ask for tasks (its changes here still
    /// record a transition: the suite's changes are decided on a new
    /// session, in `thinking`).
    fn audits_and_enqueues(&self) -> bool {
        false
    }
}

/// Runs every case of this suite against the adapters the factory builds.
///
/// See how [the in-memory adapters](https://github.com/parlance-rs/parlance/blob/main/crates/memory/tests/it/main.rs) and [the PostgreSQL adapters](https://github.com/parlance-rs/parlance/blob/main/crates/postgres/tests/it/main.rs) run it.
///
/// ```
/// # use std::sync::Arc;
/// # use parlance_memory::{MemoryAuditLog, MemorySessionStore, MemoryTaskQueue, MemoryTourCatalogs};
/// # use parlance_ports::{QueueConfig, SystemClock};
/// use parlance_testkit::session::Subject;
///
/// /// The in-memory session store, through both its ports, with its
/// /// catalogs and audit log.
/// fn subject() -> Subject {
///     let audit = Arc::new(MemoryAuditLog::new());
///     let queue = Arc::new(MemoryTaskQueue::new(Arc::new(SystemClock), QueueConfig::default()));
///     let store = Arc::new(MemorySessionStore::new(audit.clone(), queue));
///     let tours = Arc::new(MemoryTourCatalogs::new());
///     Subject { store: store.clone(), sessions: store, tours, audit }
/// }
///
/// // In the adapter's `tests/it/main.rs`, one `#[tokio::test]` per case:
/// mod session {
///     parlance_testkit::session_store_suite!(async { Some(super::subject()) });
/// }
///
/// // What some of those tests run:
/// #[tokio::main]
/// async fn main() {
///     use parlance_testkit::session::*;
///
///     create_creates_once(subject()).await;
///     commit_is_compare_and_swap(subject()).await;
///     states_round_trip_exactly(subject()).await;
///     tour_catalogs_round_trip_per_product(subject()).await;
/// }
/// ```
#[macro_export]
macro_rules! session_store_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::session;
            cases = [
                load_of_a_missing_session_is_none,
                create_creates_once,
                commit_is_compare_and_swap,
                commit_writes_audit_entries_only_when_it_succeeds,
                states_round_trip_exactly,
                sessions_are_scoped_by_product,
                delete_removes,
                concurrent_committers_lose_no_update,
                claim_due_takes_what_is_due_earliest_first,
                oldest_due_is_the_earliest_unclaimed_deadline,
                claimed_sessions_are_hidden_until_the_lease_ends,
                concurrent_claimers_never_share_a_session,
                tour_catalogs_round_trip_per_product,
            ]
        }
    };
}

/// The adapters under test: the session store through both its ports, the
/// tour catalogs and the audit log commits write to.
#[derive(Clone)]
pub struct Subject {
    /// Session states: load and commit.
    pub store: Arc<dyn MachineStore<SessionState>>,
    /// The same records: deletion and claims.
    pub sessions: Arc<dyn SessionStore>,
    /// Tour catalogs.
    pub tours: Arc<dyn TourCatalogStore>,
    /// Where commits append their audit entries.
    pub audit: Arc<dyn AuditLog>,
}

fn product(p: &str) -> ProductId {
    ProductId::parse(p).expect("valid product id")
}

fn sid(s: &str) -> SessionId {
    SessionId::parse(s).expect("valid session id")
}

fn key(p: &str, s: &str) -> SessionKey {
    SessionKey::new(product(p), sid(s))
}

fn at(secs: f64) -> Timestamp {
    Timestamp::from_secs(1_767_225_600)
        .expect("in range")
        .plus_seconds(secs)
}

/// Commits `state` over `expected` with `transitions` at `now`, its
/// deadline the state's own.
async fn commit_with(
    store: &dyn MachineStore<SessionState>,
    state: &SessionState,
    expected: Option<Version>,
    transitions: Vec<Transition>,
    now: Timestamp,
) -> Result<Version, PortError> {
    let mut decision = Decision::changed();
    for t in transitions {
        decision.transition(t);
    }
    decision.next_deadline = state.next_deadline(TourCatalog::none());
    let command = match expected {
        None => SessionCommand::Create,
        Some(_) => SessionCommand::Tick,
    };
    store
        .commit(Commit {
            key: &state.key(),
            expected,
            command: &command,
            state,
            decision: &decision,
            now,
        })
        .await
        .map(|c| c.version)
}

/// Commits `state` over `expected`, with no transition.
async fn save(
    store: &dyn MachineStore<SessionState>,
    state: &SessionState,
    expected: Version,
) -> Result<Version, PortError> {
    commit_with(store, state, Some(expected), Vec::new(), at(0.0)).await
}

/// Creates session `s` of product `p`, fresh at `now`, and returns it as
/// stored.
async fn create(s: &Subject, p: &str, id: &str, now: Timestamp) -> Stored<SessionState> {
    let fresh = SessionState::new(product(p), sid(id), now);
    let version = commit_with(&*s.store, &fresh, None, Vec::new(), now)
        .await
        .expect("create");
    Stored {
        state: fresh,
        version,
    }
}

async fn load(s: &Subject, p: &str, id: &str) -> Option<Stored<SessionState>> {
    s.store.load(&key(p, id)).await.expect("load")
}

fn entry(p: &str, s: &str, to: &str) -> AuditEntry {
    AuditEntry {
        product_id: product(p),
        entity_kind: parlance_core::EntityKind::Session,
        entity_id: s.to_owned(),
        from: Some("thinking".to_owned()),
        to: to.to_owned(),
        cause: "transition_to_proactive".to_owned(),
        at: at(1.0),
        payload: json!({}),
    }
}

/// Nothing stored yet: `load` answers `None`.
pub async fn load_of_a_missing_session_is_none(s: Subject) {
    assert!(load(&s, "p", "nope").await.is_none());
}

/// A create stores the session at version 1; a second create is a
/// conflict that leaves the stored record as it was.
pub async fn create_creates_once(s: Subject) {
    let first = create(&s, "p", "s1", at(0.0)).await;
    assert_eq!(first.version, Version::FIRST);
    assert_eq!(
        first.state,
        SessionState::new(product("p"), sid("s1"), at(0.0))
    );
    let again = SessionState::new(product("p"), sid("s1"), at(50.0));
    let err = commit_with(&*s.store, &again, None, Vec::new(), at(50.0))
        .await
        .expect_err("a second create");
    assert_eq!(err.kind, ErrorKind::Conflict, "{err}");
    assert_eq!(
        load(&s, "p", "s1").await,
        Some(first),
        "a second create does not reset the session"
    );
}

/// A commit names the version it loaded; a stale version is a conflict and
/// changes nothing.
pub async fn commit_is_compare_and_swap(s: Subject) {
    let loaded = create(&s, "p", "s1", at(0.0)).await;
    let mut a = loaded.state.clone();
    a.transition_to_reactive(at(1.0)).expect("reactive");
    let v2 = save(&*s.store, &a, loaded.version).await.expect("save");
    assert_eq!(v2, loaded.version.next());

    let mut b = loaded.state.clone();
    b.transition_to_proactive("t", at(1.0)).expect("proactive");
    let err = save(&*s.store, &b, loaded.version)
        .await
        .expect_err("stale save");
    assert_eq!(err.kind, ErrorKind::Conflict, "{err}");
    assert_eq!(
        load(&s, "p", "s1").await,
        Some(Stored {
            state: a,
            version: v2
        })
    );

    // A session that does not exist cannot be saved.
    let ghost = SessionState::new(product("p"), sid("ghost"), at(0.0));
    let err = save(&*s.store, &ghost, Version::FIRST)
        .await
        .expect_err("no such row");
    assert_eq!(err.kind, ErrorKind::Conflict);
    assert!(load(&s, "p", "ghost").await.is_none());
}

/// Audit entries are appended with a successful commit, never with a lost
/// one.
pub async fn commit_writes_audit_entries_only_when_it_succeeds(s: Subject) {
    let loaded = create(&s, "p", "s1", at(0.0)).await;
    let mut st = loaded.state.clone();
    st.transition_to_proactive("t", at(1.0)).expect("proactive");
    let transition = || {
        vec![Transition::new(
            "thinking",
            "proactive_assistance",
            "transition_to_proactive",
        )]
    };
    commit_with(&*s.store, &st, Some(loaded.version), transition(), at(1.0))
        .await
        .expect("save");
    let err = commit_with(&*s.store, &st, Some(loaded.version), transition(), at(1.0))
        .await
        .expect_err("stale");
    assert!(err.is_conflict());
    let log = s
        .audit
        .list(
            &product("p"),
            parlance_core::EntityKind::Session,
            "s1",
            None,
            10,
        )
        .await
        .expect("list");
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].entry, entry("p", "s1", "proactive_assistance"));
}

/// Every field survives storage, microseconds and metadata included.
pub async fn states_round_trip_exactly(s: Subject) {
    let loaded = create(&s, "p", "s ü/1", at(0.123_457)).await;
    let meta = json!({"user_id": "u-1", "nested": {"n": [1, 2.5, null]}});
    let mut st = loaded
        .state
        .clone()
        .with_settings(12.5, 0.0)
        .expect("settings")
        .with_metadata(meta.as_object().cloned().unwrap_or_default());
    st.transition_to_proactive("t", at(1.000_001))
        .expect("proactive");
    st.set_visual_guidance(true, Some("flow_0"), at(2.0));
    st.record_option_click(at(3.0));
    st.on_conversation_linked(ConversationEvent::New, "conv-ü")
        .expect("link");
    st.tick(at(20.0), TourCatalog::none());
    assert_eq!(st.current_state(), AssistState::Thinking);
    let v = save(&*s.store, &st, loaded.version).await.expect("save");
    assert_eq!(
        load(&s, "p", "s ü/1").await,
        Some(Stored {
            state: st,
            version: v
        })
    );
}

/// The same session id under two products is two sessions.
pub async fn sessions_are_scoped_by_product(s: Subject) {
    let a = create(&s, "a", "x", at(0.0)).await;
    let mut st = a.state.clone();
    st.transition_to_reactive(at(1.0)).expect("reactive");
    save(&*s.store, &st, a.version).await.expect("save a");
    assert!(load(&s, "b", "x").await.is_none(), "b's is not a's");
    let b = create(&s, "b", "x", at(5.0)).await;
    assert_eq!(b.version, Version::FIRST);
    let b = load(&s, "b", "x").await.expect("b stored");
    assert_eq!(b.state.current_state(), AssistState::Thinking);
    assert_eq!(b.state.product_id(), &product("b"));
    assert!(s.sessions.delete(&key("b", "x")).await.expect("delete"));
    let a_again = load(&s, "a", "x").await;
    assert_eq!(a_again.map(|x| x.state), Some(st));
}

/// `delete` removes the record and says whether there was one.
pub async fn delete_removes(s: Subject) {
    create(&s, "p", "s1", at(0.0)).await;
    assert!(s.sessions.delete(&key("p", "s1")).await.expect("delete"));
    assert!(!s.sessions.delete(&key("p", "s1")).await.expect("delete"));
    assert!(load(&s, "p", "s1").await.is_none());
}

/// 32 tasks incrementing one counter in the same session, each committing
/// again on a conflict: every increment lands, and the version counts
/// every commit.
pub async fn concurrent_committers_lose_no_update(s: Subject) {
    const TASKS: usize = 32;
    const EACH: u64 = 5;
    create(&s, "p", "hot", at(0.0)).await;
    let mut handles = Vec::new();
    for _ in 0..TASKS {
        let store = Arc::clone(&s.store);
        handles.push(tokio::spawn(async move {
            let mut conflicts = 0u32;
            for _ in 0..EACH {
                loop {
                    let cur = store
                        .load(&key("p", "hot"))
                        .await
                        .expect("load")
                        .expect("stored");
                    let mut meta = cur.state.metadata().clone();
                    let n = meta.get("count").and_then(Value::as_i64).unwrap_or(0);
                    meta.insert("count".into(), json!(n + 1));
                    let next = cur.state.clone().with_metadata(meta);
                    match save(&*store, &next, cur.version).await {
                        Ok(_) => break,
                        Err(e) if e.is_conflict() => {
                            conflicts += 1;
                            assert!(conflicts < 10_000, "livelock");
                            tokio::task::yield_now().await;
                        }
                        Err(e) => panic!("save failed: {e}"),
                    }
                }
            }
        }));
    }
    for h in handles {
        h.await.expect("committer task");
    }
    let got = load(&s, "p", "hot").await.expect("stored");
    let total = TASKS as u64 * EACH;
    assert_eq!(got.state.metadata()["count"], json!(total));
    assert_eq!(got.version, Version(1 + total));
}

/// Stores `n` proactive sessions of product `p` whose deadlines are
/// `first + i` seconds (timeout 0 after an interaction at `first + i`).
async fn due_sessions(s: &Subject, p: &str, n: usize, first: f64) -> Vec<SessionId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = sid(&format!("due-{i:03}"));
        let cur = create(s, p, id.as_str(), at(0.0)).await;
        let mut st = cur
            .state
            .clone()
            .with_settings(0.0, 60.0)
            .expect("settings");
        st.transition_to_proactive("t", at(first + i as f64))
            .expect("proactive");
        save(&*s.store, &st, cur.version).await.expect("save");
        ids.push(id);
    }
    ids
}

/// Only sessions whose deadline has come are claimed, earliest first, at
/// most `limit`; sessions without a deadline never are.
pub async fn claim_due_takes_what_is_due_earliest_first(s: Subject) {
    due_sessions(&s, "p", 5, 10.0).await; // deadlines 10..=14
    create(&s, "p", "idle", at(0.0)).await;
    assert!(
        s.sessions
            .claim_due(at(9.0), 10)
            .await
            .expect("claim")
            .is_empty()
    );
    let got = s.sessions.claim_due(at(12.0), 2).await.expect("claim");
    let ids: Vec<_> = got
        .iter()
        .map(|x| x.state.session_id().as_str().to_owned())
        .collect();
    assert_eq!(ids, ["due-000", "due-001"]);
    let got = s.sessions.claim_due(at(12.0), 10).await.expect("claim");
    let ids: Vec<_> = got
        .iter()
        .map(|x| x.state.session_id().as_str().to_owned())
        .collect();
    assert_eq!(ids, ["due-002"], "claimed ones are not handed out again");
    let got = s.sessions.claim_due(at(30.0), 10).await.expect("claim");
    let ids: Vec<_> = got
        .iter()
        .map(|x| x.state.session_id().as_str().to_owned())
        .collect();
    assert_eq!(ids, ["due-003", "due-004"], "never the idle session");
}

/// A claimed session is hidden for the lease; committing it sets its real
/// deadline; an uncommitted one comes back once the lease ends.
pub async fn claimed_sessions_are_hidden_until_the_lease_ends(s: Subject) {
    due_sessions(&s, "p", 2, 10.0).await; // deadlines 10, 11
    let claimed = s.sessions.claim_due(at(20.0), 10).await.expect("claim");
    assert_eq!(claimed.len(), 2);
    // The sweeper ticks and commits the first; the second's claimer "crashes".
    let mut st = claimed[0].state.clone();
    let out = st.tick(at(20.0), TourCatalog::none());
    assert!(out.changed_state());
    save(&*s.store, &st, claimed[0].version)
        .await
        .expect("save");
    let lease = CLAIM_LEASE.as_secs_f64();
    let back = s
        .sessions
        .claim_due(at(20.0 + lease - 1.0), 10)
        .await
        .expect("claim");
    assert!(back.is_empty(), "{back:?}");
    let back = s
        .sessions
        .claim_due(at(20.0 + lease), 10)
        .await
        .expect("claim");
    let ids: Vec<_> = back
        .iter()
        .map(|x| x.state.session_id().as_str().to_owned())
        .collect();
    assert_eq!(ids, ["due-001"]);
    let mut st = back[0].state.clone();
    st.tick(at(20.0 + lease), TourCatalog::none());
    save(&*s.store, &st, back[0].version).await.expect("save");
    // The first is in a cooldown ending at 20 + 60 s: due again then.
    let later = s.sessions.claim_due(at(80.0), 10).await.expect("claim");
    let ids: Vec<_> = later
        .iter()
        .map(|x| x.state.session_id().as_str().to_owned())
        .collect();
    assert_eq!(ids, ["due-000"]);
}

/// Four sweepers claiming at once split the due sessions without overlap.
pub async fn concurrent_claimers_never_share_a_session(s: Subject) {
    const N: usize = 60;
    due_sessions(&s, "p", N, 0.0).await;
    let mut handles = Vec::new();
    for _ in 0..4 {
        let store = Arc::clone(&s.sessions);
        handles.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = store.claim_due(at(1_000.0), 7).await.expect("claim");
                if got.is_empty() {
                    break mine;
                }
                mine.extend(got.into_iter().map(|x| x.state.session_id().clone()));
            }
        }));
    }
    let mut seen = HashSet::new();
    for h in handles {
        for id in h.await.expect("claimer") {
            assert!(seen.insert(id.clone()), "{id} claimed twice");
        }
    }
    assert_eq!(seen.len(), N);
}

/// A product without a catalog has the empty one; `put` replaces per product.
pub async fn tour_catalogs_round_trip_per_product(s: Subject) {
    assert_eq!(
        s.tours.get(&product("p")).await.expect("get"),
        TourCatalog::empty()
    );
    let c = TourCatalog::from_value(&json!({
        "default_interaction_timeout_s": 25.0,
        "default_cooldown_period_s": null,
        "tours": [{"id": "chip_0", "user_tour_id": "flow_0", "interaction_timeout_s": 40.5},
                  {"id": "chip_1", "user_tour_name": "Tour ü"}]
    }))
    .expect("catalog");
    s.tours.put(&product("p"), &c).await.expect("put");
    assert_eq!(s.tours.get(&product("p")).await.expect("get"), c);
    assert_eq!(
        s.tours.get(&product("q")).await.expect("get"),
        TourCatalog::empty()
    );
    let c2 = TourCatalog::from_value(&json!({"tours": []})).expect("catalog");
    s.tours.put(&product("p"), &c2).await.expect("put");
    assert_eq!(s.tours.get(&product("p")).await.expect("get"), c2);
}

/// `oldest_due` reads the earliest deadline that has come and that no
/// claim holds; a claim hides a session until its lease ends.
pub async fn oldest_due_is_the_earliest_unclaimed_deadline(s: Subject) {
    let oldest = |now: f64| {
        let s = s.clone();
        async move { s.sessions.oldest_due(at(now)).await.expect("oldest due") }
    };
    assert_eq!(oldest(100.0).await, None, "no sessions");
    due_sessions(&s, "p", 3, 10.0).await; // deadlines 10..=12
    create(&s, "p", "idle", at(0.0)).await;
    assert_eq!(oldest(9.0).await, None, "nothing due yet");
    assert_eq!(oldest(11.5).await, Some(at(10.0)));
    let got = s.sessions.claim_due(at(11.5), 1).await.expect("claim");
    assert_eq!(got.len(), 1);
    assert_eq!(
        oldest(11.5).await,
        Some(at(11.0)),
        "the claimed one is held"
    );
    let got = s.sessions.claim_due(at(12.0), 10).await.expect("claim");
    assert_eq!(got.len(), 2);
    assert_eq!(oldest(12.0).await, None, "every due session is claimed");
    let lapsed = 11.5 + parlance_ports::CLAIM_LEASE.as_secs_f64();
    assert_eq!(
        oldest(lapsed).await,
        Some(at(lapsed)),
        "a lapsed claim is due"
    );
}
