//! Contract suite for [`Checkpointer`] adapters.
//!
//! Run it from an adapter's tests with
//! `parlance_testkit::checkpointer_suite!(async { Some(checkpointer) });`.

use std::sync::Arc;

use parlance_core::ProductId;
use parlance_core::turn::{CheckpointDelta, LoadWindow, OwnerId, ThreadId, ThreadKey};
use parlance_ports::Checkpointer;
use serde_json::{Value, json};

/// Runs every case of this suite against the adapter the factory builds.
#[macro_export]
macro_rules! checkpointer_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::checkpoint;
            cases = [
                a_new_thread_is_empty_at_version_zero,
                commits_append_lists_and_replace_objects,
                a_stale_version_conflicts_and_writes_nothing,
                threads_are_scoped_by_product_owner_and_thread,
                windows_return_the_last_entries,
                racing_turns_both_land_once,
                commit_size_does_not_grow_with_thread_length,
            ]
        }
    };
}

/// The subject of this suite.
pub type Subject = Arc<dyn Checkpointer>;

fn key(product: &str, owner: &str, thread: &str) -> ThreadKey {
    ThreadKey {
        product_id: ProductId::parse(product).expect("product id"),
        owner: OwnerId::parse(owner).expect("owner id"),
        thread: ThreadId::parse(thread).expect("thread id"),
    }
}

fn msg(role: &str, content: &str) -> Value {
    json!({"role": role, "content": content})
}

/// A turn's delta: a user and an assistant message on `history` and
/// `transcript`, and a progress object.
fn turn(n: u64, text: &str) -> CheckpointDelta {
    let mut d = CheckpointDelta::default();
    for field in ["history", "transcript"] {
        d.appends.insert(
            field.to_owned(),
            vec![msg("user", text), msg("assistant", &format!("re: {text}"))],
        );
    }
    d.objects
        .insert("session_progress".to_owned(), json!({"turn_count": n}));
    d
}

/// A thread nobody committed to loads empty at version 0.
pub async fn a_new_thread_is_empty_at_version_zero(cp: Subject) {
    let got = cp
        .load(&key("p", "u", "t"), &LoadWindow::all())
        .await
        .expect("load");
    assert_eq!(got.version, 0);
    assert!(got.lists.is_empty() && got.objects.is_empty(), "{got:?}");
}

/// Lists grow by the delta's entries in order; objects are replaced; the
/// version counts commits; values round-trip exactly.
pub async fn commits_append_lists_and_replace_objects(cp: Subject) {
    let k = key("p", "u", "t");
    let c1 = cp.commit(&k, 0, &turn(1, "hello")).await.expect("commit 1");
    assert_eq!(c1.version, 1);
    let mut second = turn(2, "naïve ✓ \"quoted\"");
    second.objects.insert(
        "session_memory".to_owned(),
        json!({"summary": "x", "open_loops": ["a", "b"], "n": 1.5, "nested": {"z": null}}),
    );
    let c2 = cp.commit(&k, 1, &second).await.expect("commit 2");
    assert_eq!(c2.version, 2);
    // An empty delta still counts as a turn.
    let c3 = cp
        .commit(&k, 2, &CheckpointDelta::default())
        .await
        .expect("commit 3");
    assert_eq!(c3.version, 3);
    let got = cp.load(&k, &LoadWindow::all()).await.expect("load");
    assert_eq!(got.version, 3);
    let contents: Vec<_> = got.lists["history"]
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        contents,
        [
            "hello",
            "re: hello",
            "naïve ✓ \"quoted\"",
            "re: naïve ✓ \"quoted\""
        ]
    );
    assert_eq!(got.lists["transcript"], got.lists["history"]);
    assert_eq!(got.objects["session_progress"], json!({"turn_count": 2}));
    assert_eq!(
        got.objects["session_memory"],
        second.objects["session_memory"]
    );
}

/// A commit at the wrong version is a conflict and changes nothing.
pub async fn a_stale_version_conflicts_and_writes_nothing(cp: Subject) {
    let k = key("p", "u", "t");
    cp.commit(&k, 0, &turn(1, "one")).await.expect("commit");
    for stale in [0, 2, 7] {
        let err = cp
            .commit(&k, stale, &turn(9, "lost"))
            .await
            .expect_err("stale version");
        assert!(err.is_conflict(), "{err}");
    }
    let missing = key("p", "u", "never");
    let err = cp
        .commit(&missing, 3, &turn(1, "x"))
        .await
        .expect_err("no such version");
    assert!(err.is_conflict(), "{err}");
    let got = cp.load(&k, &LoadWindow::all()).await.expect("load");
    assert_eq!(got.version, 1);
    assert_eq!(got.lists["history"].len(), 2);
    assert_eq!(got.objects["session_progress"], json!({"turn_count": 1}));
    let none = cp.load(&missing, &LoadWindow::all()).await.expect("load");
    assert_eq!(none.version, 0);
}

/// Another product, owner or thread never sees these entries.
pub async fn threads_are_scoped_by_product_owner_and_thread(cp: Subject) {
    let keys = [
        key("a", "u", "t"),
        key("b", "u", "t"),
        key("a", "v", "t"),
        key("a", "u", "s"),
    ];
    for (i, k) in keys.iter().enumerate() {
        cp.commit(k, 0, &turn(1, &format!("m{i}")))
            .await
            .expect("commit");
    }
    for (i, k) in keys.iter().enumerate() {
        let got = cp.load(k, &LoadWindow::all()).await.expect("load");
        assert_eq!(got.version, 1);
        assert_eq!(got.lists["history"][0]["content"], json!(format!("m{i}")));
        assert_eq!(got.lists["history"].len(), 2);
    }
}

/// A window returns the last entries of the named list, whole others.
pub async fn windows_return_the_last_entries(cp: Subject) {
    let k = key("p", "u", "t");
    for n in 1..=5 {
        cp.commit(&k, n - 1, &turn(n, &format!("m{n}")))
            .await
            .expect("commit");
    }
    let got = cp
        .load(&k, &LoadWindow::all().tail("history", 3))
        .await
        .expect("load");
    let contents: Vec<_> = got.lists["history"]
        .iter()
        .map(|m| m["content"].clone())
        .collect();
    assert_eq!(contents, [json!("re: m4"), json!("m5"), json!("re: m5")]);
    assert_eq!(got.lists["transcript"].len(), 10);
    assert_eq!(got.version, 5);
    let none = cp
        .load(&k, &LoadWindow::all().tail("history", 0))
        .await
        .expect("load");
    assert!(none.lists.get("history").is_none_or(Vec::is_empty));
}

/// Turns racing on one thread, each retried on the new state after a
/// conflict: all land, each turn's entries once and together.
pub async fn racing_turns_both_land_once(cp: Subject) {
    const RACERS: u64 = 8;
    let k = key("p", "u", "hot");
    let mut tasks = Vec::new();
    for r in 0..RACERS {
        let cp = Arc::clone(&cp);
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            let mut attempts = 0;
            loop {
                attempts += 1;
                let head = cp.load(&k, &LoadWindow::all()).await.expect("load");
                let delta = turn(head.version + 1, &format!("racer {r}"));
                match cp.commit(&k, head.version, &delta).await {
                    Ok(c) => return (c.version, attempts),
                    Err(e) if e.is_conflict() => tokio::task::yield_now().await,
                    Err(e) => panic!("commit failed: {e}"),
                }
                assert!(attempts < 1000, "racer {r} never landed");
            }
        }));
    }
    let mut versions = Vec::new();
    for t in tasks {
        versions.push(t.await.expect("racer").0);
    }
    versions.sort_unstable();
    assert_eq!(versions, (1..=RACERS).collect::<Vec<_>>());
    let got = cp.load(&k, &LoadWindow::all()).await.expect("load");
    assert_eq!(got.version, RACERS);
    let history = &got.lists["history"];
    assert_eq!(history.len() as u64, RACERS * 2);
    for pair in history.chunks(2) {
        let text = pair[0]["content"].as_str().expect("text");
        assert_eq!(pair[1]["content"], json!(format!("re: {text}")));
    }
    for r in 0..RACERS {
        let n = history
            .iter()
            .filter(|m| m["content"] == json!(format!("racer {r}")))
            .count();
        assert_eq!(n, 1, "racer {r} landed {n} times");
    }
    assert_eq!(got.lists["transcript"], *history);
    assert_eq!(
        got.objects["session_progress"],
        json!({"turn_count": RACERS})
    );
}

/// The 100th commit of a thread writes as many bytes as the first.
pub async fn commit_size_does_not_grow_with_thread_length(cp: Subject) {
    let k = key("p", "u", "long");
    let mut sizes = Vec::new();
    for n in 1..=100u64 {
        let c = cp
            .commit(&k, n - 1, &turn(100 + n, &format!("m{:03}", n)))
            .await
            .expect("commit");
        assert_eq!(c.version, n);
        sizes.push(c.bytes_written);
    }
    assert!(sizes[0] > 0);
    assert_eq!(sizes[0], sizes[99], "{sizes:?}");
    let got = cp.load(&k, &LoadWindow::all()).await.expect("load");
    assert_eq!(got.lists["history"].len(), 200);
}
