//! Contract suite for [`AuditLog`] adapters.
//!
//! Run it from an adapter's tests with
//! `parlance_testkit::audit_log_suite!(async { Some(log) });`.

use std::sync::Arc;

use parlance_core::{ProductId, Timestamp};
use parlance_ports::{AuditEntry, AuditLog};
use serde_json::json;

/// Runs every case of this suite against the adapter the factory builds.
///
/// ```
/// use std::sync::{Arc, Mutex};
///
/// use async_trait::async_trait;
/// use parlance_core::{EntityKind, ProductId};
/// use parlance_ports::{AuditEntry, AuditLog, AuditRecord, PortResult};
///
/// /// An audit log in a vector, numbering records from 1.
/// #[derive(Default)]
/// struct VecLog(Mutex<Vec<AuditRecord>>);
///
/// #[async_trait]
/// impl AuditLog for VecLog {
///     async fn append(&self, entries: &[AuditEntry]) -> PortResult<()> {
///         let mut log = self.0.lock().expect("not poisoned");
///         for entry in entries {
///             let seq = i64::try_from(log.len()).expect("small") + 1;
///             log.push(AuditRecord { seq, entry: entry.clone() });
///         }
///         Ok(())
///     }
///
///     async fn list(
///         &self,
///         product_id: &ProductId,
///         entity_kind: EntityKind,
///         entity_id: &str,
///         after_seq: Option<i64>,
///         limit: usize,
///     ) -> PortResult<Vec<AuditRecord>> {
///         let log = self.0.lock().expect("not poisoned");
///         Ok(log
///             .iter()
///             .filter(|r| {
///                 r.entry.product_id == *product_id
///                     && r.entry.entity_kind == entity_kind
///                     && r.entry.entity_id == entity_id
///                     && r.seq > after_seq.unwrap_or(0)
///             })
///             .take(limit)
///             .cloned()
///             .collect())
///     }
/// }
///
/// // In the adapter's `tests/it/main.rs`:
/// mod audit {
///     parlance_testkit::audit_log_suite!(async {
///         Some(std::sync::Arc::new(super::VecLog::default()) as parlance_testkit::audit::Subject)
///     });
/// }
///
/// // What those tests run, case by case:
/// #[tokio::main]
/// async fn main() {
///     use parlance_testkit::audit::*;
///
///     append_then_list_in_order(Arc::new(VecLog::default())).await;
///     list_is_scoped_by_product_kind_and_entity(Arc::new(VecLog::default())).await;
///     list_pages_after_seq(Arc::new(VecLog::default())).await;
///     values_round_trip_exactly(Arc::new(VecLog::default())).await;
///     concurrent_appends_lose_nothing(Arc::new(VecLog::default())).await;
/// }
/// ```
#[macro_export]
macro_rules! audit_log_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::audit;
            cases = [
                append_then_list_in_order,
                list_is_scoped_by_product_kind_and_entity,
                list_pages_after_seq,
                values_round_trip_exactly,
                concurrent_appends_lose_nothing,
            ]
        }
    };
}

/// The subject of this suite.
pub type Subject = Arc<dyn AuditLog>;

fn product(p: &str) -> ProductId {
    ProductId::parse(p).expect("valid product id")
}

fn at(micros: i64) -> Timestamp {
    Timestamp::from_micros(1_767_225_600_000_000 + micros).expect("in range")
}

fn entry(p: &str, kind: &str, id: &str, to: &str, t: i64) -> AuditEntry {
    AuditEntry {
        product_id: product(p),
        entity_kind: parlance_core::EntityKind::parse(kind).expect("a known kind"),
        entity_id: id.to_owned(),
        from: Some("thinking".to_owned()),
        to: to.to_owned(),
        cause: "test".to_owned(),
        at: at(t),
        payload: json!({}),
    }
}

/// Entries come back oldest first with strictly increasing `seq`.
pub async fn append_then_list_in_order(log: Subject) {
    let entries = [
        entry("p", "session", "s1", "proactive_assistance", 1),
        entry("p", "session", "s1", "thinking", 2),
        entry("p", "session", "s1", "reactive_assistance", 3),
    ];
    log.append(&entries[..2]).await.expect("append");
    log.append(&entries[2..]).await.expect("append");
    let got = log
        .list(
            &product("p"),
            parlance_core::EntityKind::Session,
            "s1",
            None,
            100,
        )
        .await
        .expect("list");
    let tos: Vec<_> = got.iter().map(|r| r.entry.to.as_str()).collect();
    assert_eq!(
        tos,
        ["proactive_assistance", "thinking", "reactive_assistance"]
    );
    assert!(got.windows(2).all(|w| w[0].seq < w[1].seq), "{got:?}");
    assert_eq!(log.append(&[]).await.ok(), Some(()));
}

/// Another product, kind or entity never sees these records.
pub async fn list_is_scoped_by_product_kind_and_entity(log: Subject) {
    log.append(&[
        entry("a", "session", "x", "thinking", 1),
        entry("b", "session", "x", "thinking", 2),
        entry("a", "conversation", "x", "ACTIVE", 3),
        entry("a", "session", "y", "thinking", 4),
    ])
    .await
    .expect("append");
    for (p, kind, id, t) in [
        ("a", "session", "x", 1),
        ("b", "session", "x", 2),
        ("a", "conversation", "x", 3),
        ("a", "session", "y", 4),
    ] {
        let got = log
            .list(
                &product(p),
                parlance_core::EntityKind::parse(kind).expect("a known kind"),
                id,
                None,
                10,
            )
            .await
            .expect("list");
        assert_eq!(got.len(), 1, "{p}/{kind}/{id}: {got:?}");
        assert_eq!(got[0].entry.at, at(t));
    }
    let none = log
        .list(
            &product("c"),
            parlance_core::EntityKind::Session,
            "x",
            None,
            10,
        )
        .await
        .expect("list");
    assert!(none.is_empty());
}

/// `after_seq` and `limit` page through an entity's records.
pub async fn list_pages_after_seq(log: Subject) {
    let entries: Vec<_> = (0..5)
        .map(|i| entry("p", "flow", "f", &format!("s{i}"), i))
        .collect();
    log.append(&entries).await.expect("append");
    let first = log
        .list(&product("p"), parlance_core::EntityKind::Flow, "f", None, 2)
        .await
        .expect("list");
    assert_eq!(first.len(), 2);
    let rest = log
        .list(
            &product("p"),
            parlance_core::EntityKind::Flow,
            "f",
            Some(first[1].seq),
            10,
        )
        .await
        .expect("list");
    let tos: Vec<_> = first
        .iter()
        .chain(rest.iter())
        .map(|r| r.entry.to.clone())
        .collect();
    assert_eq!(tos, ["s0", "s1", "s2", "s3", "s4"]);
    let empty = log
        .list(
            &product("p"),
            parlance_core::EntityKind::Flow,
            "f",
            Some(rest[2].seq),
            10,
        )
        .await
        .expect("list");
    assert!(empty.is_empty());
}

/// Times keep their microseconds; payloads and a missing `from` survive.
pub async fn values_round_trip_exactly(log: Subject) {
    let mut e = entry("p", "adoption", "u1", "onboarded", 123_457);
    e.from = None;
    e.cause = "judge_adoption".to_owned();
    e.payload = json!({"rating": 7, "nested": {"why": ["a", "b"]}, "text": "naïve ✓"});
    log.append(std::slice::from_ref(&e)).await.expect("append");
    let got = log
        .list(
            &product("p"),
            parlance_core::EntityKind::Adoption,
            "u1",
            None,
            10,
        )
        .await
        .expect("list");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].entry, e);
}

/// 16 writers appending at once lose nothing and never share a `seq`.
pub async fn concurrent_appends_lose_nothing(log: Subject) {
    const WRITERS: usize = 16;
    const EACH: usize = 20;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let log = Arc::clone(&log);
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                let e = entry("p", "session", "hot", &format!("w{w}-{i}"), i as i64);
                log.append(&[e]).await.expect("append");
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer task");
    }
    let got = log
        .list(
            &product("p"),
            parlance_core::EntityKind::Session,
            "hot",
            None,
            10_000,
        )
        .await
        .expect("list");
    assert_eq!(got.len(), WRITERS * EACH);
    assert!(got.windows(2).all(|w| w[0].seq < w[1].seq));
    for w in 0..WRITERS {
        let mine: Vec<_> = got
            .iter()
            .filter(|r| r.entry.to.starts_with(&format!("w{w}-")))
            .map(|r| r.entry.to.clone())
            .collect();
        let expected: Vec<_> = (0..EACH).map(|i| format!("w{w}-{i}")).collect();
        assert_eq!(mine, expected, "writer {w} records out of order or missing");
    }
}
