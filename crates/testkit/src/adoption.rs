//! Contract suite for [`AdoptionStore`] adapters.
//!
//! Run it from an adapter's tests with
//! `parlance_testkit::adoption_store_suite!(async { Some(store) });`.

use std::sync::Arc;

use parlance_core::adoption::{
    JourneyState, MasteryLevel, OnboardingPlan, TourCatalogEntry, UserAdoptionState, UserId,
    WorkflowStatus,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{AdoptionStore, ErrorKind};
use serde_json::json;

/// Runs every case of this suite against the adapter the factory builds.
#[macro_export]
macro_rules! adoption_store_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::adoption;
            cases = [
                missing_record_loads_as_none,
                save_then_load_round_trips,
                saves_are_compare_and_swap,
                records_are_scoped_by_product,
                delete_removes_only_that_record,
                concurrent_savers_with_retries_lose_no_update,
                plans_are_stored_per_product_and_role,
                tour_catalogs_are_stored_per_product_and_role,
            ]
        }
    };
}

/// The subject of this suite.
pub type Subject = Arc<dyn AdoptionStore>;

fn product(p: &str) -> ProductId {
    ProductId::parse(p).expect("valid product id")
}

fn user_id(u: &str) -> UserId {
    UserId::parse(u).expect("valid user id")
}

fn at(secs: i64) -> Timestamp {
    Timestamp::from_micros((1_767_225_600 + secs) * 1_000_000 + 123_457).expect("in range")
}

fn state(u: &str) -> UserAdoptionState {
    let meta = json!({"role": "admin", "nested": {"locale": "fr"}});
    UserAdoptionState::new(u, meta.as_object().cloned().unwrap_or_default(), at(0))
        .expect("valid state")
}

/// Loading a user that was never saved gives `None`.
pub async fn missing_record_loads_as_none(store: Subject) {
    let got = store
        .load(&product("p"), &user_id("nobody"))
        .await
        .expect("load");
    assert!(got.is_none());
}

/// Everything survives a save: times to the microsecond, progress map order,
/// metadata, mastery, sessions.
pub async fn save_then_load_round_trips(store: Subject) {
    let mut s = state("u1");
    s.set_mastery(7.5, MasteryLevel::Proficient, "builds reports", at(1))
        .expect("finite");
    s.set_journey_state(JourneyState::Onboarded, at(2));
    s.record_discovered_features(["/projects", "/reports ✓"], at(3));
    // Inserted in non-alphabetical order: the order must come back.
    for (id, status) in [
        ("zeta", WorkflowStatus::Completed),
        ("alpha", WorkflowStatus::InProgress),
        ("mid", WorkflowStatus::Completed),
    ] {
        s.onboarding
            .upsert_workflow_progress(id, status, 0.75, "seen", Some("activity"), at(4))
            .expect("finite");
    }
    s.mark_welcomed(at(5));
    let v = store.save(&product("p"), &s, None).await.expect("insert");
    assert_eq!(v, 1);
    let got = store
        .load(&product("p"), &user_id("u1"))
        .await
        .expect("load")
        .expect("present");
    assert_eq!(got.version, 1);
    assert_eq!(got.state, s);
    assert_eq!(
        got.state.onboarding.completed_workflow_ids(),
        ["zeta", "mid"]
    );
}

/// Stale or missing versions are refused with the right kind.
pub async fn saves_are_compare_and_swap(store: Subject) {
    let p = product("p");
    let mut s = state("u1");
    assert_eq!(store.save(&p, &s, None).await.expect("insert"), 1);
    let again = store.save(&p, &s, None).await.expect_err("second insert");
    assert_eq!(again.kind, ErrorKind::Conflict);
    s.set_mastery(3.0, MasteryLevel::Beginner, "", at(1))
        .expect("finite");
    assert_eq!(store.save(&p, &s, Some(1)).await.expect("update"), 2);
    let stale = store.save(&p, &s, Some(1)).await.expect_err("stale");
    assert_eq!(stale.kind, ErrorKind::Conflict);
    let missing = store
        .save(&p, &state("ghost"), Some(1))
        .await
        .expect_err("missing");
    assert_eq!(missing.kind, ErrorKind::NotFound);
    let got = store
        .load(&p, &user_id("u1"))
        .await
        .expect("load")
        .expect("present");
    assert_eq!((got.version, got.state.mastery.rating), (2, 3));
}

/// Another product never sees the record.
pub async fn records_are_scoped_by_product(store: Subject) {
    let mut a = state("u1");
    a.set_mastery(9.0, MasteryLevel::PowerUser, "", at(1))
        .expect("finite");
    store.save(&product("a"), &a, None).await.expect("insert a");
    store
        .save(&product("b"), &state("u1"), None)
        .await
        .expect("insert b");
    let got_a = store
        .load(&product("a"), &user_id("u1"))
        .await
        .expect("load");
    let got_b = store
        .load(&product("b"), &user_id("u1"))
        .await
        .expect("load");
    assert_eq!(got_a.expect("a").state.mastery.rating, 9);
    assert_eq!(got_b.expect("b").state.mastery.rating, 0);
    assert!(
        store
            .load(&product("c"), &user_id("u1"))
            .await
            .expect("load")
            .is_none()
    );
}

/// Deleting removes one record, once.
pub async fn delete_removes_only_that_record(store: Subject) {
    store
        .save(&product("p"), &state("u1"), None)
        .await
        .expect("insert");
    store
        .save(&product("p"), &state("u2"), None)
        .await
        .expect("insert");
    assert!(
        store
            .delete(&product("p"), &user_id("u1"))
            .await
            .expect("delete")
    );
    assert!(
        !store
            .delete(&product("p"), &user_id("u1"))
            .await
            .expect("delete")
    );
    assert!(
        store
            .load(&product("p"), &user_id("u1"))
            .await
            .expect("load")
            .is_none()
    );
    assert!(
        store
            .load(&product("p"), &user_id("u2"))
            .await
            .expect("load")
            .is_some()
    );
}

/// 8 writers doing load -> change -> compare-and-swap with retries, at
/// once, lose no update.
pub async fn concurrent_savers_with_retries_lose_no_update(store: Subject) {
    const WRITERS: usize = 8;
    const EACH: usize = 10;
    let p = product("p");
    store.save(&p, &state("hot"), None).await.expect("insert");
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let store = Arc::clone(&store);
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                let feature = format!("w{w}-{i}");
                loop {
                    let cur = store
                        .load(&p, &user_id("hot"))
                        .await
                        .expect("load")
                        .expect("present");
                    let mut s = cur.state;
                    s.record_discovered_features([feature.as_str()], at(10));
                    match store.save(&p, &s, Some(cur.version)).await {
                        Ok(_) => break,
                        Err(e) if e.is_conflict() => tokio::task::yield_now().await,
                        Err(e) => panic!("save failed: {e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer task");
    }
    let got = store
        .load(&p, &user_id("hot"))
        .await
        .expect("load")
        .expect("present");
    assert_eq!(got.version, 1 + (WRITERS * EACH) as i64);
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
pub async fn plans_are_stored_per_product_and_role(store: Subject) {
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
pub async fn tour_catalogs_are_stored_per_product_and_role(store: Subject) {
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
