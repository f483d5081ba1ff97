//! Contract suite for [`CrisisLog`] adapters.
//!
//! Run it from an adapter's tests with
//! `parlance_testkit::crisis_log_suite!(async { Some(log) });`.

use std::sync::Arc;

use parlance_core::turn::seed::{CrisisAssessment, CrisisAudit};
use parlance_core::turn::{OwnerId, ThreadId};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{CrisisLog, CrisisLogEntry};

/// Runs every case of this suite against the adapter the factory builds.
///
/// See how [the in-memory adapters](https://github.com/parlance-rs/parlance/blob/main/crates/memory/tests/it/main.rs) and [the PostgreSQL adapters](https://github.com/parlance-rs/parlance/blob/main/crates/postgres/tests/it/main.rs) run it.
///
/// ```
/// use std::sync::{Arc, Mutex};
///
/// use async_trait::async_trait;
/// use parlance_core::ProductId;
/// use parlance_core::turn::OwnerId;
/// use parlance_ports::{CrisisLog, CrisisLogEntry, CrisisLogRecord, PortResult};
///
/// /// A crisis log in a vector; `last` keeps a `seq` from being reused once
/// /// its record is erased.
/// #[derive(Default)]
/// struct VecLog(Mutex<(i64, Vec<CrisisLogRecord>)>);
///
/// #[async_trait]
/// impl CrisisLog for VecLog {
///     async fn record(&self, entry: &CrisisLogEntry) -> PortResult<i64> {
///         let mut guard = self.0.lock().expect("not poisoned");
///         let (last, records) = &mut *guard;
///         *last += 1;
///         records.push(CrisisLogRecord { seq: *last, entry: entry.clone() });
///         Ok(*last)
///     }
///
///     async fn list(
///         &self,
///         product_id: &ProductId,
///         owner: &OwnerId,
///         after_seq: Option<i64>,
///         limit: usize,
///     ) -> PortResult<Vec<CrisisLogRecord>> {
///         let guard = self.0.lock().expect("not poisoned");
///         Ok(guard
///             .1
///             .iter()
///             .filter(|r| r.entry.product_id == *product_id && r.entry.owner == *owner)
///             .filter(|r| r.seq > after_seq.unwrap_or(0))
///             .take(limit)
///             .cloned()
///             .collect())
///     }
///
///     async fn erase_owner(&self, product_id: &ProductId, owner: &OwnerId) -> PortResult<usize> {
///         let mut guard = self.0.lock().expect("not poisoned");
///         let before = guard.1.len();
///         guard.1.retain(|r| !(r.entry.product_id == *product_id && r.entry.owner == *owner));
///         Ok(before - guard.1.len())
///     }
/// }
///
/// // In the adapter's `tests/it/main.rs`:
/// mod crisis_log {
///     parlance_testkit::crisis_log_suite!(async {
///         Some(std::sync::Arc::new(super::VecLog::default()) as parlance_testkit::crisis_log::Subject)
///     });
/// }
///
/// // What those tests run, case by case:
/// #[tokio::main]
/// async fn main() {
///     use parlance_testkit::crisis_log::*;
///
///     let log = || Arc::new(VecLog::default());
///     record_then_list_in_order(log()).await;
///     list_is_scoped_by_product_and_owner(log()).await;
///     list_pages_after_seq_and_limits(log()).await;
///     values_round_trip_exactly(log()).await;
///     concurrent_records_lose_nothing(log()).await;
///     erasing_an_owner_removes_only_theirs_and_never_reuses_a_seq(log()).await;
/// }
/// ```
#[macro_export]
macro_rules! crisis_log_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::crisis_log;
            cases = [
                record_then_list_in_order,
                list_is_scoped_by_product_and_owner,
                list_pages_after_seq_and_limits,
                values_round_trip_exactly,
                concurrent_records_lose_nothing,
                erasing_an_owner_removes_only_theirs_and_never_reuses_a_seq,
            ]
        }
    };
}

/// The subject of this suite.
pub type Subject = Arc<dyn CrisisLog>;

fn product(p: &str) -> ProductId {
    ProductId::parse(p).expect("valid product id")
}

fn owner(o: &str) -> OwnerId {
    OwnerId::parse(o).expect("valid owner id")
}

fn entry(p: &str, o: &str, turn: u64, level: u8) -> CrisisLogEntry {
    CrisisLogEntry {
        product_id: product(p),
        owner: owner(o),
        thread: ThreadId::parse("t1").expect("valid thread id"),
        turn,
        at: Timestamp::from_micros(1_767_225_600_000_000 + turn as i64).expect("in range"),
        assessment: CrisisAssessment {
            level,
            confidence: 0.75,
            reason: format!("turn {turn}"),
            needs_crisis_response: level >= 2,
            needs_clarification: level == 1,
        },
        audit: CrisisAudit {
            override_kind: None,
            classifier_path: "llm_primary".to_owned(),
            llm_failure_occurred: false,
        },
        route: if level >= 2 { "crisis" } else { "dispatch" }.to_owned(),
    }
}

/// Records come back oldest first with increasing `seq`, as returned.
pub async fn record_then_list_in_order(log: Subject) {
    let mut seqs = Vec::new();
    for t in 1..=3 {
        seqs.push(log.record(&entry("p", "u", t, 0)).await.expect("record"));
    }
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let got = log
        .list(&product("p"), &owner("u"), None, 100)
        .await
        .expect("list");
    assert_eq!(got.iter().map(|r| r.seq).collect::<Vec<_>>(), seqs);
    assert_eq!(
        got.iter().map(|r| r.entry.turn).collect::<Vec<_>>(),
        [1, 2, 3]
    );
}

/// Another product or owner never sees these records.
pub async fn list_is_scoped_by_product_and_owner(log: Subject) {
    log.record(&entry("a", "u", 1, 2)).await.expect("record");
    log.record(&entry("b", "u", 1, 2)).await.expect("record");
    log.record(&entry("a", "v", 1, 2)).await.expect("record");
    for (p, o) in [("a", "u"), ("b", "u"), ("a", "v")] {
        let got = log
            .list(&product(p), &owner(o), None, 100)
            .await
            .expect("list");
        assert_eq!(got.len(), 1, "{p}/{o}");
        assert_eq!(got[0].entry.product_id, product(p));
        assert_eq!(got[0].entry.owner, owner(o));
    }
    assert!(
        log.list(&product("c"), &owner("u"), None, 100)
            .await
            .expect("list")
            .is_empty()
    );
}

/// `after_seq` skips what was seen; `limit` caps the page.
pub async fn list_pages_after_seq_and_limits(log: Subject) {
    for t in 1..=5 {
        log.record(&entry("p", "u", t, 1)).await.expect("record");
    }
    let first = log
        .list(&product("p"), &owner("u"), None, 2)
        .await
        .expect("list");
    assert_eq!(
        first.iter().map(|r| r.entry.turn).collect::<Vec<_>>(),
        [1, 2]
    );
    let next = log
        .list(&product("p"), &owner("u"), Some(first[1].seq), 10)
        .await
        .expect("list");
    assert_eq!(
        next.iter().map(|r| r.entry.turn).collect::<Vec<_>>(),
        [3, 4, 5]
    );
}

/// Every field comes back as recorded.
pub async fn values_round_trip_exactly(log: Subject) {
    let mut e = entry("p", "u", 7, 3);
    e.assessment.reason = "keyword: \"end my life\" with \"tonight\" — ünïcode".to_owned();
    e.audit = CrisisAudit {
        override_kind: Some("keyword_escalation".to_owned()),
        classifier_path: "keyword_fallback".to_owned(),
        llm_failure_occurred: true,
    };
    let seq = log.record(&e).await.expect("record");
    let got = log
        .list(&product("p"), &owner("u"), None, 10)
        .await
        .expect("list");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].seq, seq);
    assert_eq!(got[0].entry, e);
}

/// Concurrent records all land, each with its own `seq`.
pub async fn concurrent_records_lose_nothing(log: Subject) {
    let tasks: Vec<_> = (1..=20)
        .map(|t| {
            let log = log.clone();
            tokio::spawn(async move { log.record(&entry("p", "u", t, 0)).await })
        })
        .collect();
    for t in tasks {
        t.await.expect("join").expect("record");
    }
    let got = log
        .list(&product("p"), &owner("u"), None, 100)
        .await
        .expect("list");
    assert_eq!(got.len(), 20);
    let mut turns: Vec<u64> = got.iter().map(|r| r.entry.turn).collect();
    turns.sort_unstable();
    assert_eq!(turns, (1..=20).collect::<Vec<_>>());
    assert!(got.windows(2).all(|w| w[0].seq < w[1].seq));
}

/// Erasing an owner removes that owner's records in that product and no
/// other, answering how many went; a record made afterwards gets a `seq`
/// above every one given before, even those erased.
pub async fn erasing_an_owner_removes_only_theirs_and_never_reuses_a_seq(log: Subject) {
    let mut given = Vec::new();
    for (p, o, t) in [("p", "v", 1), ("q", "u", 1), ("p", "u", 1), ("p", "u", 2)] {
        given.push(log.record(&entry(p, o, t, 2)).await.expect("record"));
    }
    // The newest records are the erased owner's.
    given.push(log.record(&entry("p", "u", 3, 2)).await.expect("record"));
    let list = |p: &'static str, o: &'static str| {
        let log = log.clone();
        async move {
            log.list(&product(p), &owner(o), None, 100)
                .await
                .expect("list")
        }
    };
    let (v_before, q_before) = (list("p", "v").await, list("q", "u").await);
    assert_eq!(
        log.erase_owner(&product("p"), &owner("u"))
            .await
            .expect("erase"),
        3
    );
    assert_eq!(list("p", "u").await, []);
    assert_eq!(list("p", "v").await, v_before);
    assert_eq!(list("q", "u").await, q_before);
    assert_eq!(
        log.erase_owner(&product("p"), &owner("u"))
            .await
            .expect("erase again"),
        0
    );
    let highest = given.iter().copied().max().expect("some were given");
    let next = log.record(&entry("p", "u", 4, 1)).await.expect("record");
    assert!(next > highest, "seq {next} after {given:?}");
    let later = log.record(&entry("p", "v", 2, 1)).await.expect("record");
    assert!(later > next, "seq {later} after {next}");
    let got = list("p", "u").await;
    assert_eq!(
        got.iter()
            .map(|r| (r.seq, r.entry.turn))
            .collect::<Vec<_>>(),
        [(next, 4)]
    );
}
