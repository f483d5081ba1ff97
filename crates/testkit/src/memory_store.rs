//! Contract suite for [`MemoryStore`] adapters, with a small fixed corpus
//! whose expected retrieval results are worked out by hand below.
//!
//! Run it from an adapter's tests with
//! `parlance_testkit::memory_store_suite!(async { Some(store) });`.

use std::sync::Arc;

use parlance_core::turn::{
    EpisodicEntry, MemoryEntry, MemoryFilter, MemoryId, MemoryKind, MemoryRecord, OwnerId,
    ProceduralProfile, QueryEmbedding, RetrievalPath, SemanticEntry, ThreadId,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::MemoryStore;
use serde_json::json;

/// Runs every case of this suite against the adapter the factory builds.
///
/// See how [the in-memory adapters](https://github.com/parlance-rs/parlance/blob/main/crates/memory/tests/it/main.rs) and [the PostgreSQL adapters](https://github.com/parlance-rs/parlance/blob/main/crates/postgres/tests/it/main.rs) run it.
///
/// ```
/// use std::sync::Arc;
///
/// use parlance_memory::MemoryMemoryStore;
/// use parlance_testkit::memory_store::Subject;
///
/// fn subject() -> Subject {
///     Arc::new(MemoryMemoryStore::new())
/// }
///
/// // In the adapter's `tests/it/main.rs`, one `#[tokio::test]` per case:
/// mod memory_store {
///     parlance_testkit::memory_store_suite!(async { Some(super::subject()) });
/// }
///
/// // What some of those tests run:
/// #[tokio::main]
/// async fn main() {
///     use parlance_testkit::memory_store::*;
///
///     add_list_and_round_trip(subject()).await;
///     delete_by_filter(subject()).await;
///     token_recall_ranks_the_corpus(subject()).await;
///     hybrid_retrieval_fuses_by_reciprocal_rank(subject()).await;
/// }
/// ```
#[macro_export]
macro_rules! memory_store_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::memory_store;
            cases = [
                add_list_and_round_trip,
                delete_by_id,
                delete_by_filter,
                entries_are_scoped_by_product_and_owner,
                profile_and_session_memory_round_trip,
                token_recall_ranks_the_corpus,
                hybrid_retrieval_fuses_by_reciprocal_rank,
                an_embedding_failure_falls_back_to_token_recall,
                erasing_an_owner_removes_everything_of_theirs_only,
            ]
        }
    };
}

/// The subject of this suite.
pub type Subject = Arc<dyn MemoryStore>;

fn product(p: &str) -> ProductId {
    ProductId::parse(p).expect("product id")
}

fn owner(o: &str) -> OwnerId {
    OwnerId::parse(o).expect("owner id")
}

fn at(secs: i64) -> Timestamp {
    Timestamp::from_secs(1_767_225_600 + secs).expect("in range")
}

fn id(n: u128) -> MemoryId {
    MemoryId::from_uuid(uuid::Uuid::from_u128(n))
}

fn semantic(cat: &str, pred: &str, obj: &str, quote: Option<&str>) -> MemoryEntry {
    MemoryEntry::Semantic(SemanticEntry {
        category: cat.to_owned(),
        subject: "User".to_owned(),
        predicate: pred.to_owned(),
        object: obj.to_owned(),
        evidence_quote: quote.map(str::to_owned),
    })
}

fn episodic(summary: &str, themes: &[&str]) -> MemoryEntry {
    MemoryEntry::Episodic(EpisodicEntry {
        summary: summary.to_owned(),
        primary_themes: themes.iter().map(|t| (*t).to_owned()).collect(),
        is_catch_up: false,
        approach_used: Some("cbt".to_owned()),
        approach_context: None,
    })
}

fn record(n: u128, who: &str, entry: MemoryEntry, embedding: Option<Vec<f32>>) -> MemoryRecord {
    MemoryRecord {
        id: id(n),
        owner: owner(who),
        entry,
        embedding,
        at: at(n as i64),
    }
}

/// The corpus, stored for owner `u1` of product `p`, ids 1..=6 in time order.
fn corpus() -> Vec<MemoryRecord> {
    vec![
        record(
            1,
            "u1",
            semantic(
                "relationship",
                "WORRIES_ABOUT",
                "work",
                Some("my boss is terrible"),
            ),
            Some(vec![1.0, 0.0, 0.0]),
        ),
        record(
            2,
            "u1",
            semantic("health", "HAS", "insomnia", Some("I can't sleep at night")),
            Some(vec![0.0, 1.0, 0.0]),
        ),
        record(
            3,
            "u1",
            episodic("talked about loss after my dog died.", &["grief"]),
            Some(vec![0.0, 0.0, 1.0]),
        ),
        record(
            4,
            "u1",
            semantic("preference", "PREFERS", "short answers", None),
            Some(vec![0.7, 0.7, 0.0]),
        ),
        record(
            5,
            "u1",
            episodic(
                "work deadlines and a difficult boss meeting",
                &["work", "stress"],
            ),
            Some(vec![0.9, 0.1, 0.0]),
        ),
        record(
            6,
            "u1",
            semantic(
                "family",
                "MISSES",
                "sister",
                Some("my sister lives in Leeds"),
            ),
            Some(vec![0.0, 0.2, 0.9]),
        ),
    ]
}

async fn seed(store: &Subject) {
    for r in corpus() {
        store.add(&product("p"), &r).await.expect("add");
    }
}

fn ids(records: impl IntoIterator<Item = MemoryRecord>) -> Vec<u128> {
    records
        .into_iter()
        .map(|r| r.id.as_uuid().as_u128())
        .collect()
}

/// Entries come back oldest first, exactly as stored; a repeated id conflicts.
pub async fn add_list_and_round_trip(store: Subject) {
    seed(&store).await;
    let all = store
        .list(&product("p"), &owner("u1"), None)
        .await
        .expect("list");
    assert_eq!(all, corpus());
    let episodes = store
        .list(&product("p"), &owner("u1"), Some(MemoryKind::Episodic))
        .await
        .expect("list");
    assert_eq!(ids(episodes), [3, 5]);
    let err = store
        .add(&product("p"), &corpus()[0])
        .await
        .expect_err("duplicate id");
    assert!(err.is_conflict(), "{err}");
    let mut no_embedding = record(9, "u1", episodic("ünïcode ✓", &[]), None);
    no_embedding.at = at(100);
    store.add(&product("p"), &no_embedding).await.expect("add");
    let all = store
        .list(&product("p"), &owner("u1"), None)
        .await
        .expect("list");
    assert_eq!(all.last(), Some(&no_embedding));
}

/// Deleting by id removes that entry only; a missing id is not found.
pub async fn delete_by_id(store: Subject) {
    seed(&store).await;
    store
        .delete(&product("p"), &owner("u1"), id(2))
        .await
        .expect("delete");
    let left = store
        .list(&product("p"), &owner("u1"), None)
        .await
        .expect("list");
    assert_eq!(ids(left), [1, 3, 4, 5, 6]);
    let again = store.delete(&product("p"), &owner("u1"), id(2)).await;
    assert!(again.expect_err("gone").is_not_found());
    let other = store.delete(&product("p"), &owner("u2"), id(3)).await;
    assert!(other.expect_err("not the owner's").is_not_found());
}

/// A filtered delete removes what matches every condition and counts it.
pub async fn delete_by_filter(store: Subject) {
    seed(&store).await;
    let n = store
        .delete_where(
            &product("p"),
            &owner("u1"),
            &MemoryFilter {
                kind: Some(MemoryKind::Semantic),
                before: Some(at(4)),
                ..MemoryFilter::default()
            },
        )
        .await
        .expect("delete");
    assert_eq!(n, 2);
    let n = store
        .delete_where(
            &product("p"),
            &owner("u1"),
            &MemoryFilter {
                category: Some("work".to_owned()),
                ..MemoryFilter::default()
            },
        )
        .await
        .expect("delete");
    assert_eq!(n, 1, "episodic entries match on their first theme");
    let n = store
        .delete_where(
            &product("p"),
            &owner("u1"),
            &MemoryFilter {
                subject: Some("User".to_owned()),
                category: Some("family".to_owned()),
                ..MemoryFilter::default()
            },
        )
        .await
        .expect("delete");
    assert_eq!(n, 1);
    let left = store
        .list(&product("p"), &owner("u1"), None)
        .await
        .expect("list");
    assert_eq!(ids(left), [3, 4]);
    let all = store
        .delete_where(&product("p"), &owner("u1"), &MemoryFilter::default())
        .await
        .expect("delete");
    assert_eq!(all, 2);
}

/// Another product or owner never sees, retrieves or deletes these entries.
pub async fn entries_are_scoped_by_product_and_owner(store: Subject) {
    seed(&store).await;
    let mut theirs = record(7, "u2", episodic("boss work boss work", &["work"]), None);
    store.add(&product("p"), &theirs).await.expect("add");
    theirs.id = id(8);
    theirs.owner = owner("u1");
    store.add(&product("q"), &theirs).await.expect("add");
    let got = store
        .list(&product("p"), &owner("u2"), None)
        .await
        .expect("list");
    assert_eq!(ids(got), [7]);
    let got = store
        .list(&product("q"), &owner("u1"), None)
        .await
        .expect("list");
    assert_eq!(ids(got), [8]);
    let hits = store
        .retrieve(
            &product("p"),
            &owner("u1"),
            "boss work",
            10,
            QueryEmbedding::Absent,
        )
        .await
        .expect("retrieve");
    assert_eq!(ids(hits.hits.into_iter().map(|h| h.record)), [5, 1]);
    let n = store
        .delete_where(&product("q"), &owner("u1"), &MemoryFilter::default())
        .await
        .expect("delete");
    assert_eq!(n, 1);
    let still = store
        .list(&product("p"), &owner("u1"), None)
        .await
        .expect("list");
    assert_eq!(still.len(), 6);
}

/// The procedural profile defaults until stored; session memory is per session.
pub async fn profile_and_session_memory_round_trip(store: Subject) {
    let (p, u) = (product("p"), owner("u1"));
    assert_eq!(
        store.profile(&p, &u).await.expect("profile"),
        ProceduralProfile::default()
    );
    let profile = ProceduralProfile {
        procedural_rules: vec!["be brief".to_owned(), "no emojis".to_owned()],
        proactive_recall_enabled: true,
    };
    store.put_profile(&p, &u, &profile).await.expect("put");
    assert_eq!(store.profile(&p, &u).await.expect("profile"), profile);
    let replaced = ProceduralProfile::default();
    store.put_profile(&p, &u, &replaced).await.expect("put");
    assert_eq!(store.profile(&p, &u).await.expect("profile"), replaced);
    assert_eq!(
        store.profile(&product("q"), &u).await.expect("profile"),
        ProceduralProfile::default()
    );

    let (s1, s2) = (
        ThreadId::parse("s1").unwrap(),
        ThreadId::parse("s2").unwrap(),
    );
    assert_eq!(store.session_memory(&p, &u, &s1).await.expect("get"), None);
    let v = json!({"summary": "sleep", "open_loops": ["call mum"]});
    store
        .put_session_memory(&p, &u, &s1, &v)
        .await
        .expect("put");
    store
        .put_session_memory(&p, &u, &s1, &json!({"summary": "sleep better"}))
        .await
        .expect("put");
    assert_eq!(
        store.session_memory(&p, &u, &s1).await.expect("get"),
        Some(json!({"summary": "sleep better"}))
    );
    assert_eq!(store.session_memory(&p, &u, &s2).await.expect("get"), None);
    assert_eq!(
        store
            .session_memory(&p, &owner("u2"), &s1)
            .await
            .expect("get"),
        None
    );
}

/// Token recall: entries sharing query tokens, most distinct tokens first,
/// then most occurrences, then newest.
///
/// "boss work": #5 (work x2 with its theme, boss) before #1 (work, boss).
/// "my boss": #1 (both), then the one-token matches newest first: #6, #5, #3.
pub async fn token_recall_ranks_the_corpus(store: Subject) {
    seed(&store).await;
    let (p, u) = (product("p"), owner("u1"));
    let got = store
        .retrieve(&p, &u, "Boss, work?", 5, QueryEmbedding::Absent)
        .await
        .expect("retrieve");
    assert_eq!(got.path, RetrievalPath::TokenRecall);
    assert_eq!(ids(got.hits.into_iter().map(|h| h.record)), [5, 1]);
    let got = store
        .retrieve(&p, &u, "my boss", 10, QueryEmbedding::Absent)
        .await
        .expect("retrieve");
    assert_eq!(ids(got.hits.into_iter().map(|h| h.record)), [1, 6, 5, 3]);
    let got = store
        .retrieve(&p, &u, "my boss", 2, QueryEmbedding::Absent)
        .await
        .expect("retrieve");
    assert_eq!(ids(got.hits.into_iter().map(|h| h.record)), [1, 6]);
    let got = store
        .retrieve(&p, &u, "insomnia", 3, QueryEmbedding::Absent)
        .await
        .expect("retrieve");
    assert_eq!(ids(got.hits.into_iter().map(|h| h.record)), [2]);
    let none = store
        .retrieve(&p, &u, "zebra", 3, QueryEmbedding::Absent)
        .await
        .expect("retrieve");
    assert!(none.hits.is_empty());
}

/// Hybrid: token ranks [1, 6, 5, 3] for "my boss" fused with cosine ranks
/// for [0, 0, 1], which are [3, 6, 5, 4, 2, 1] (zero similarities newest
/// first). RRF scores: #6 2/62, #3 1/64 + 1/61, #5 2/63, #1 1/61 + 1/66,
/// so the order is 6, 3, 5, 1, 4, 2.
pub async fn hybrid_retrieval_fuses_by_reciprocal_rank(store: Subject) {
    seed(&store).await;
    let (p, u) = (product("p"), owner("u1"));
    let got = store
        .retrieve(
            &p,
            &u,
            "my boss",
            6,
            QueryEmbedding::Vector(&[0.0, 0.0, 1.0]),
        )
        .await
        .expect("retrieve");
    assert_eq!(got.path, RetrievalPath::HybridRrf);
    let scores: Vec<f64> = got.hits.iter().map(|h| h.score).collect();
    assert_eq!(
        ids(got.hits.into_iter().map(|h| h.record)),
        [6, 3, 5, 1, 4, 2]
    );
    assert!((scores[0] - 2.0 / 62.0).abs() < 1e-9, "{scores:?}");
    let top = store
        .retrieve(
            &p,
            &u,
            "my boss",
            2,
            QueryEmbedding::Vector(&[0.0, 0.0, 1.0]),
        )
        .await
        .expect("retrieve");
    assert_eq!(ids(top.hits.into_iter().map(|h| h.record)), [6, 3]);
}

/// When the embedding provider failed, token recall runs alone and says so.
pub async fn an_embedding_failure_falls_back_to_token_recall(store: Subject) {
    seed(&store).await;
    let got = store
        .retrieve(
            &product("p"),
            &owner("u1"),
            "my boss",
            2,
            QueryEmbedding::Failed,
        )
        .await
        .expect("retrieve");
    assert_eq!(got.path, RetrievalPath::TokenRecallAfterEmbedError);
    assert_eq!(ids(got.hits.into_iter().map(|h| h.record)), [1, 6]);
}

/// Erasing an owner removes every entry, the procedural profile and every
/// session memory of that owner in that product, answering how many entries
/// went; other owners and other products keep theirs.
pub async fn erasing_an_owner_removes_everything_of_theirs_only(store: Subject) {
    let (p, q) = (product("p"), product("q"));
    let (u1, u2) = (owner("u1"), owner("u2"));
    seed(&store).await;
    let theirs = record(7, "u2", semantic("health", "HAS", "a cold", None), None);
    store.add(&p, &theirs).await.expect("add");
    let elsewhere = record(8, "u1", episodic("another product", &["x"]), None);
    store.add(&q, &elsewhere).await.expect("add");
    let profile = ProceduralProfile {
        procedural_rules: vec!["be brief".to_owned()],
        proactive_recall_enabled: true,
    };
    let (s1, s2) = (
        ThreadId::parse("s1").expect("thread id"),
        ThreadId::parse("s2").expect("thread id"),
    );
    for (pr, o) in [(&p, &u1), (&p, &u2), (&q, &u1)] {
        store.put_profile(pr, o, &profile).await.expect("put");
        for s in [&s1, &s2] {
            store
                .put_session_memory(pr, o, s, &json!({"of": o.as_str()}))
                .await
                .expect("put");
        }
    }
    assert_eq!(store.erase_owner(&p, &u1).await.expect("erase"), 6);
    assert_eq!(store.list(&p, &u1, None).await.expect("list"), []);
    assert_eq!(
        store.profile(&p, &u1).await.expect("profile"),
        ProceduralProfile::default()
    );
    for s in [&s1, &s2] {
        assert_eq!(store.session_memory(&p, &u1, s).await.expect("get"), None);
    }
    // Nothing of anyone else's went.
    assert_eq!(store.list(&p, &u2, None).await.expect("list"), [theirs]);
    assert_eq!(store.list(&q, &u1, None).await.expect("list"), [elsewhere]);
    for (pr, o) in [(&p, &u2), (&q, &u1)] {
        assert_eq!(store.profile(pr, o).await.expect("profile"), profile);
        for s in [&s1, &s2] {
            assert_eq!(
                store.session_memory(pr, o, s).await.expect("get"),
                Some(json!({"of": o.as_str()}))
            );
        }
    }
    let recalled = store
        .retrieve(&p, &u1, "boss work", 5, QueryEmbedding::Absent)
        .await
        .expect("retrieve");
    assert!(recalled.hits.is_empty(), "{recalled:?}");
    assert_eq!(store.erase_owner(&p, &u1).await.expect("erase again"), 0);
}
