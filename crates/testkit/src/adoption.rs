//! Contract suites for adoption stores: the storage protocol (the
//! [`crate::store`] suite, through the [`StoreFixture`] of [`Subject`]) and
//! what is particular to adoption records, plans and catalogs.
//!
//! Run both from an adapter's tests, on one factory producing
//! `Option<Subject>`:
//! `parlance_testkit::machine_store_suite!(subject());` and
//! `parlance_testkit::adoption_store_suite!(subject());`.

use std::sync::{Arc, LazyLock};

use parlance_core::adoption::{
    AdoptionCommand, AdoptionEvent, AdoptionKey, JourneyState, MasteryLevel, OnboardingPlan,
    TourCatalogEntry, UserAdoptionState, UserId, WorkflowStatus,
};
use parlance_core::{Decision, Machine, ProductId, Timestamp};
use parlance_ports::{AdoptionStore, AuditLog, Commit, MachineStore, Stored, TaskQueue, Version};
use serde_json::{Value, json};

use crate::store::StoreFixture;

/// Runs every adoption-specific case against the subject the factory
/// builds.
///
/// See how [the in-memory adapters](https://github.com/parlance-rs/parlance/blob/main/crates/memory/tests/it/main.rs) and [the PostgreSQL adapters](https://github.com/parlance-rs/parlance/blob/main/crates/postgres/tests/it/main.rs) run it.
///
/// ```
/// # use std::sync::Arc;
/// # use parlance_memory::{MemoryAdoptionStore, MemoryAuditLog, MemoryTaskQueue};
/// # use parlance_ports::{QueueConfig, SystemClock};
/// use parlance_testkit::adoption::Subject;
///
/// /// The in-memory adoption store, through both its ports, with its audit
/// /// log and queue.
/// async fn subject() -> Option<Subject> {
///     let audit = Arc::new(MemoryAuditLog::new());
///     let queue = Arc::new(MemoryTaskQueue::new(Arc::new(SystemClock), QueueConfig::default()));
///     let store = Arc::new(MemoryAdoptionStore::new(audit.clone(), queue.clone()));
///     Some(Subject { records: store.clone(), store, audit, queue })
/// }
///
/// // In the adapter's `tests/it/main.rs`, one `#[tokio::test]` per case:
/// mod adoption {
///     parlance_testkit::adoption_store_suite!(super::subject());
/// }
///
/// // What some of those tests run:
/// #[tokio::main]
/// async fn main() {
///     use parlance_testkit::adoption::*;
///
///     let fresh = || async { subject().await.expect("always available") };
///     a_rich_record_round_trips_with_its_audit_entry(fresh().await).await;
///     delete_removes_only_that_record(fresh().await).await;
///     plans_are_stored_per_product_and_role(fresh().await).await;
/// }
/// ```
#[macro_export]
macro_rules! adoption_store_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::adoption;
            cases = [
                a_rich_record_round_trips_with_its_audit_entry,
                delete_removes_only_that_record,
                concurrent_writers_lose_no_update,
                plans_are_stored_per_product_and_role,
                tour_catalogs_are_stored_per_product_and_role,
            ]
        }
    };
}

/// The subject of both suites: one adapter's adoption store, seen through
/// its two ports, with the audit log and the queue its commits write to.
#[derive(Clone)]
pub struct Subject {
    /// The records, through the storage protocol.
    pub records: Arc<dyn MachineStore<UserAdoptionState>>,
    /// The same store's other operations: delete, plans, catalogs.
    pub store: Arc<dyn AdoptionStore>,
    /// The audit log the commits write to.
    pub audit: Arc<dyn AuditLog>,
    /// The task queue the commits enqueue on.
    pub queue: Arc<dyn TaskQueue>,
}

/// The plan decisions are made with (adoption events do not read it).
static PLAN: LazyLock<OnboardingPlan> = LazyLock::new(OnboardingPlan::default);

/// Field events as one command, with the metadata of a first sighting.
fn events(events: Vec<AdoptionEvent>, metadata: Option<Value>) -> AdoptionCommand {
    AdoptionCommand::Events {
        events,
        metadata: metadata.and_then(|m| m.as_object().cloned()),
    }
}

impl StoreFixture for Subject {
    type M = UserAdoptionState;

    fn store(&self) -> Arc<dyn MachineStore<UserAdoptionState>> {
        self.records.clone()
    }

    fn audit(&self) -> Arc<dyn AuditLog> {
        self.audit.clone()
    }

    fn queue(&self) -> Arc<dyn TaskQueue> {
        self.queue.clone()
    }

    fn context(&self) -> &OnboardingPlan {
        &PLAN
    }

    fn key(&self, product: &ProductId, n: u32) -> AdoptionKey {
        AdoptionKey::new(product.clone(), user_id(&format!("u{n}")))
    }

    /// A first batch of events (none) with the user's metadata.
    fn create(&self, _key: &AdoptionKey) -> AdoptionCommand {
        events(Vec::new(), Some(json!({"role": "admin"})))
    }

    /// The journey flipped (one transition) and a feature discovered.
    fn change(&self, state: &UserAdoptionState) -> AdoptionCommand {
        let journey = match state.journey_state {
            JourneyState::Onboarding => JourneyState::Onboarded,
            JourneyState::Onboarded => JourneyState::Onboarding,
        };
        events(
            vec![
                AdoptionEvent::SetJourneyState { state: journey },
                AdoptionEvent::RecordDiscoveredFeatures {
                    features: vec![format!("/f{}", state.discovered_features.len())],
                },
            ],
            None,
        )
    }

    /// Adoption decisions ask for no tasks; the change above still records
    /// a transition, so the audit checks are not vacuous.
    fn audits_and_enqueues(&self) -> bool {
        false
    }
}

fn product(p: &str) -> ProductId {
    ProductId::parse(p).expect("valid product id")
}

fn user_id(u: &str) -> UserId {
    UserId::parse(u).expect("valid user id")
}

fn key(p: &str, u: &str) -> AdoptionKey {
    AdoptionKey::new(product(p), user_id(u))
}

fn at(secs: i64) -> Timestamp {
    Timestamp::from_micros((1_767_225_600 + secs) * 1_000_000 + 123_457).expect("in range")
}

/// Creates the record at `key` with `metadata` at `at(0)`.
async fn create(s: &Subject, key: &AdoptionKey) -> Stored<UserAdoptionState> {
    let command = events(Vec::new(), Some(json!({"role": "admin"})));
    let (state, decision) = UserAdoptionState::create(key, &PLAN, &command, at(0))
        .expect("created")
        .expect("events create a record");
    let done = s
        .records
        .commit(Commit {
            key,
            expected: None,
            command: &command,
            state: &state,
            decision: &decision,
            now: at(0),
        })
        .await
        .expect("create");
    Stored {
        state,
        version: done.version,
    }
}

/// Everything survives a commit: times to the microsecond, the order of
/// the progress map, metadata, mastery; the journey change is in the audit
/// log, once.
pub async fn a_rich_record_round_trips_with_its_audit_entry(s: Subject) {
    let k = key("p", "u1");
    let first = events(
        Vec::new(),
        Some(json!({"role": "admin", "nested": {"locale": "fr"}})),
    );
    let (mut state, mut decision) = UserAdoptionState::create(&k, &PLAN, &first, at(0))
        .expect("created")
        .expect("events create a record");
    let progress = |id: &str, status| AdoptionEvent::UpsertWorkflowProgress {
        workflow_id: id.to_owned(),
        status,
        confidence: 0.75,
        evidence: "seen".to_owned(),
        source: Some("activity".to_owned()),
    };
    let steps = [
        AdoptionEvent::SetMastery {
            rating: 7.5,
            level: MasteryLevel::Proficient,
            description: "builds reports".to_owned(),
        },
        AdoptionEvent::SetJourneyState {
            state: JourneyState::Onboarded,
        },
        AdoptionEvent::RecordDiscoveredFeatures {
            features: vec!["/projects".to_owned(), "/reports ✓".to_owned()],
        },
        // Inserted in non-alphabetical order: the order must come back.
        progress("zeta", WorkflowStatus::Completed),
        progress("alpha", WorkflowStatus::InProgress),
        progress("mid", WorkflowStatus::Completed),
        AdoptionEvent::MarkWelcomed,
    ];
    for (n, event) in steps.into_iter().enumerate() {
        let later = state
            .decide(&PLAN, &events(vec![event], None), at(n as i64 + 1))
            .expect("accepted");
        decision.then(later);
    }
    assert_eq!(decision.transitions.len(), 1, "one journey change");
    let done = s
        .records
        .commit(Commit {
            key: &k,
            expected: None,
            command: &first,
            state: &state,
            decision: &decision,
            now: at(8),
        })
        .await
        .expect("create");
    assert_eq!(done.version, Version::FIRST);
    let got = s.records.load(&k).await.expect("load").expect("present");
    assert_eq!(got.version, Version::FIRST);
    assert_eq!(got.state, state);
    assert_eq!(
        got.state.onboarding.completed_workflow_ids(),
        ["zeta", "mid"]
    );
    let trail = s
        .audit
        .list(&k.product_id, UserAdoptionState::KIND, "u1", None, 10)
        .await
        .expect("audit");
    let trail: Vec<_> = trail
        .iter()
        .map(|r| {
            (
                r.entry.from.as_deref(),
                r.entry.to.as_str(),
                r.entry.cause.as_str(),
                r.entry.at,
            )
        })
        .collect();
    assert_eq!(
        trail,
        [(Some("onboarding"), "onboarded", "set_journey_state", at(8))]
    );
}

/// Deleting removes one record, once.
pub async fn delete_removes_only_that_record(s: Subject) {
    let (u1, u2) = (key("p", "u1"), key("p", "u2"));
    create(&s, &u1).await;
    create(&s, &u2).await;
    assert!(s.store.delete(&u1).await.expect("delete"));
    assert!(!s.store.delete(&u1).await.expect("delete"));
    assert!(s.records.load(&u1).await.expect("load").is_none());
    assert!(s.records.load(&u2).await.expect("load").is_some());
    assert!(
        !s.store.delete(&key("q", "u2")).await.expect("delete"),
        "another product's record is not deleted"
    );
}

/// 8 writers doing load -> decide -> commit, deciding again on a lost
/// race, at once, lose no update.
pub async fn concurrent_writers_lose_no_update(s: Subject) {
    const WRITERS: usize = 8;
    const EACH: usize = 10;
    let hot = key("p", "hot");
    create(&s, &hot).await;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (s, hot) = (s.clone(), hot.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                let command = events(
                    vec![AdoptionEvent::RecordDiscoveredFeatures {
                        features: vec![format!("w{w}-{i}")],
                    }],
                    None,
                );
                loop {
                    let cur = s.records.load(&hot).await.expect("load").expect("present");
                    let mut state = cur.state;
                    let decision: Decision<UserAdoptionState> =
                        state.decide(&PLAN, &command, at(10)).expect("accepted");
                    let done = s
                        .records
                        .commit(Commit {
                            key: &hot,
                            expected: Some(cur.version),
                            command: &command,
                            state: &state,
                            decision: &decision,
                            now: at(10),
                        })
                        .await;
                    match done {
                        Ok(_) => break,
                        Err(e) if e.is_conflict() => tokio::task::yield_now().await,
                        Err(e) => panic!("commit failed: {e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer task");
    }
    let got = s.records.load(&hot).await.expect("load").expect("present");
    assert_eq!(got.version, Version(1 + (WRITERS * EACH) as u64));
    assert_eq!(got.state.discovered_features.len(), WRITERS * EACH);
    for w in 0..WRITERS {
        let mine: Vec<_> = got
            .state
            .discovered_features
            .iter()
            .filter(|f| f.starts_with(&format!("w{w}-")))
            .cloned()
            .collect();
        let expected: Vec<_> = (0..EACH).map(|i| format!("w{w}-{i}")).collect();
        assert_eq!(mine, expected, "writer {w} updates lost or reordered");
    }
}

fn plan(ids: &[&str]) -> OnboardingPlan {
    let config: Vec<_> = ids
        .iter()
        .map(|id| json!({"workflow_id": id, "name": id.to_uppercase(), "steps": [{"step_id": "s1"}],
                         "activity_signals": {"any_of": [{"canonical_url_prefix": "/x", "min_count": 2}]}}))
        .collect();
    OnboardingPlan::from_config(&json!(config)).plan
}

/// Plans are kept per product and per normalised role, and replaced whole.
pub async fn plans_are_stored_per_product_and_role(s: Subject) {
    let store = &s.store;
    let p = product("p");
    assert!(store.get_plan(&p, None).await.expect("get").is_none());
    store
        .put_plan(&p, None, &plan(&["a", "b"]))
        .await
        .expect("put");
    store
        .put_plan(&p, Some(" Admin "), &plan(&["c"]))
        .await
        .expect("put");
    assert_eq!(
        store.get_plan(&p, None).await.expect("get"),
        Some(plan(&["a", "b"]))
    );
    assert_eq!(
        store.get_plan(&p, Some("admin")).await.expect("get"),
        Some(plan(&["c"]))
    );
    assert!(
        store
            .get_plan(&p, Some("viewer"))
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        store
            .get_plan(&product("q"), None)
            .await
            .expect("get")
            .is_none()
    );
    store
        .put_plan(&p, None, &plan(&["z"]))
        .await
        .expect("replace");
    assert_eq!(
        store.get_plan(&p, None).await.expect("get"),
        Some(plan(&["z"]))
    );
}

/// Tour catalogs are kept per product and per normalised role.
pub async fn tour_catalogs_are_stored_per_product_and_role(s: Subject) {
    let store = &s.store;
    let p = product("p");
    let entry = |id: &str, role: Option<&str>| TourCatalogEntry {
        tour_id: id.to_owned(),
        name: format!("Tour {id}"),
        use_when: "when needed".to_owned(),
        role: role.map(str::to_owned),
    };
    let all = vec![entry("t1", None), entry("t2", Some(""))];
    store.put_tour_catalog(&p, None, &all).await.expect("put");
    store
        .put_tour_catalog(&p, Some("Admin"), &[entry("t3", Some("admin"))])
        .await
        .expect("put");
    assert_eq!(
        store.get_tour_catalog(&p, None).await.expect("get"),
        Some(all)
    );
    assert_eq!(
        store
            .get_tour_catalog(&p, Some(" ADMIN"))
            .await
            .expect("get"),
        Some(vec![entry("t3", Some("admin"))])
    );
    assert!(
        store
            .get_tour_catalog(&product("q"), None)
            .await
            .expect("get")
            .is_none()
    );
}
