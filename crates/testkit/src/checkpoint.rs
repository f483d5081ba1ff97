//! Contract suite for the turn thread's store, `MachineStore<Checkpoint>`
//! with its history ([`Checkpointer`]): what the generic storage suite
//! ([`crate::store`]) cannot know about a thread (lists appended, objects
//! replaced, load windows, racing turns, a commit that writes its delta and
//! never the decided state), and each thread's history: its checkpoints,
//! the state as of each, forks, operator updates, interrupts, deletion and
//! the listing of an owner's threads.
//!
//! [`Subject`] is also the thread's [`StoreFixture`], so an adapter runs
//! both suites on one factory: [`machine_store_suite!`](crate::machine_store_suite) and
//! [`checkpoint_store_suite!`](crate::checkpoint_store_suite), each given
//! the same `async { Some(subject) }`, as that macro's example shows.

use std::sync::Arc;

use parlance_core::turn::seed::{CrisisAssessment, CrisisAudit};
use parlance_core::turn::{
    Checkpoint, CheckpointDelta, LoadWindow, OwnerId, ThreadId, ThreadKey, TurnCommand, TurnKey,
};
use parlance_core::{Decision, Machine, ProductId, Timestamp, Transition};
use parlance_ports::{
    AuditLog, CRISIS_LOG_DELTA, Checkpointer, Commit, Committed, CrisisLog, CrisisLogEntry,
    ErrorKind, MachineStore, PortResult, TaskQueue, TaskSpec, Version, carry_crisis_entries,
};
use serde_json::{Value, json};

use crate::store::StoreFixture;

mod history;

pub use history::*;

/// Runs every case of this suite against the subject the factory builds.
///
/// See how [the in-memory adapters](https://github.com/parlance-rs/parlance/blob/main/crates/memory/tests/it/main.rs) and [the PostgreSQL adapters](https://github.com/parlance-rs/parlance/blob/main/crates/postgres/tests/it/main.rs) run it.
///
/// ```
/// # use std::sync::Arc;
/// # use parlance_memory::{MemoryAuditLog, MemoryCheckpointStore, MemoryTaskQueue};
/// # use parlance_ports::{QueueConfig, SystemClock};
/// use parlance_testkit::checkpoint::Subject;
///
/// /// The in-memory thread store with the audit and crisis logs it writes to.
/// fn subject() -> Subject {
///     let audit = Arc::new(MemoryAuditLog::new());
///     let store = MemoryCheckpointStore::new(audit.clone());
///     let queue = Arc::new(MemoryTaskQueue::new(Arc::new(SystemClock), QueueConfig::default()));
///     Subject { crisis_log: store.crisis_log(), store: Arc::new(store), audit, queue }
/// }
///
/// // In the adapter's `tests/it/main.rs`, one `#[tokio::test]` per case:
/// mod checkpoint {
///     parlance_testkit::checkpoint_store_suite!(async { Some(super::subject()) });
/// }
///
/// // What some of those tests run:
/// #[tokio::main]
/// async fn main() {
///     use parlance_testkit::checkpoint::*;
///
///     commits_append_lists_and_replace_objects(subject()).await;
///     a_stale_version_conflicts_and_writes_nothing(subject()).await;
///     history_lists_every_checkpoint_newest_first(subject()).await;
///     a_fork_starts_a_thread_of_its_own(subject()).await;
/// }
/// ```
#[macro_export]
macro_rules! checkpoint_store_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::checkpoint;
            cases = [
                a_missing_thread_loads_as_none,
                commits_append_lists_and_replace_objects,
                a_stale_version_conflicts_and_writes_nothing,
                threads_are_scoped_by_product_owner_and_thread,
                windows_return_the_last_entries,
                every_window_is_the_tail_of_the_whole_list,
                racing_turns_both_land_once,
                a_commit_writes_its_delta_not_the_decided_state,
                a_commit_writes_the_audit_entries_it_carries,
                a_commit_carrying_a_task_is_refused,
                crisis_entries_commit_with_the_turn_and_never_reach_the_thread,
                a_lost_commit_leaves_no_crisis_entry_and_its_retry_one,
                a_crisis_entry_of_another_thread_is_refused,
                history_lists_every_checkpoint_newest_first,
                load_at_equals_the_state_after_every_commit,
                a_fork_starts_a_thread_of_its_own,
                racing_forks_to_one_thread_one_wins,
                an_update_commits_as_a_checkpoint_of_its_own,
                an_interrupt_holds_the_thread_until_one_resume_lands,
                racing_turns_leave_a_history_without_gaps,
                deleting_a_thread_leaves_nothing_of_it,
                a_thread_deleted_while_turns_race_leaves_nothing_behind,
                a_deletion_racing_a_threads_creation_leaves_it_whole_or_gone,
                a_read_racing_a_thread_made_again_sees_one_thread_whole,
                threads_are_listed_newest_first_and_paged,
            ]
        }
    };
}

/// The subject of this suite: a thread store with the audit log and the
/// crisis log its commits write to and a queue (a thread's commits enqueue
/// nothing; the generic suite checks that they did not).
#[derive(Clone)]
pub struct Subject {
    /// The store under test.
    pub store: Arc<dyn Checkpointer>,
    /// The audit log its commits write to.
    pub audit: Arc<dyn AuditLog>,
    /// The crisis log its commits write the entries turns carry to.
    pub crisis_log: Arc<dyn CrisisLog>,
    /// A queue on the same backend.
    pub queue: Arc<dyn TaskQueue>,
}

impl StoreFixture for Subject {
    type M = Checkpoint;

    fn store(&self) -> Arc<dyn MachineStore<Checkpoint>> {
        self.store.clone() as Arc<dyn MachineStore<Checkpoint>>
    }

    fn audit(&self) -> Arc<dyn AuditLog> {
        self.audit.clone()
    }

    fn queue(&self) -> Arc<dyn TaskQueue> {
        self.queue.clone()
    }

    fn context(&self) -> &() {
        &()
    }

    fn key(&self, product: &ProductId, n: u32) -> TurnKey {
        TurnKey::whole(ThreadKey {
            product_id: product.clone(),
            owner: OwnerId::parse("u").expect("owner id"),
            thread: ThreadId::parse(format!("t{n}")).expect("thread id"),
        })
    }

    fn create(&self, _key: &TurnKey) -> TurnCommand {
        TurnCommand::commit(0, turn(1, "first"))
    }

    fn change(&self, state: &Checkpoint) -> TurnCommand {
        let n = state.version + 1;
        TurnCommand::commit(state.version, turn(n, &format!("turn {n}")))
    }

    /// A committed turn is not a transition and enqueues nothing.
    fn audits_and_enqueues(&self) -> bool {
        false
    }
}

fn key(product: &str, owner: &str, thread: &str) -> ThreadKey {
    ThreadKey {
        product_id: ProductId::parse(product).expect("product id"),
        owner: OwnerId::parse(owner).expect("owner id"),
        thread: ThreadId::parse(thread).expect("thread id"),
    }
}

fn now() -> Timestamp {
    Timestamp::from_secs(1_767_225_600).expect("in range")
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

/// The turn that began on version `base` and produced `delta`, decided on
/// a stand-in that holds nothing but that version: a store writes the
/// decision's delta, never the decided state (a windowed load leaves it
/// partial), so what a thread holds must not depend on the state handed
/// over.
fn decided(base: u64, delta: CheckpointDelta) -> (Checkpoint, TurnCommand, Decision<Checkpoint>) {
    let command = TurnCommand::commit(base, delta);
    let mut state = Checkpoint {
        version: base,
        ..Checkpoint::default()
    };
    let decision = state
        .decide(&(), &command, now())
        .expect("a commit on its own base is allowed");
    (state, command, decision)
}

/// Commits a decision on the thread at `k` as the turn that began on
/// version `base` (0: the thread is new).
async fn commit_decided(
    s: &Subject,
    k: &ThreadKey,
    base: u64,
    (state, command, decision): &(Checkpoint, TurnCommand, Decision<Checkpoint>),
) -> PortResult<Committed<Checkpoint>> {
    s.store
        .commit(Commit {
            key: &TurnKey::whole(k.clone()),
            expected: (base > 0).then_some(Version(base)),
            command,
            state,
            decision,
            now: now(),
        })
        .await
}

/// Commits `delta` on the thread at `k` as the turn that began on version
/// `base`.
async fn commit(
    s: &Subject,
    k: &ThreadKey,
    base: u64,
    delta: CheckpointDelta,
) -> PortResult<Committed<Checkpoint>> {
    commit_decided(s, k, base, &decided(base, delta)).await
}

/// The thread at `k` with `window` applied, if it exists.
async fn load(s: &Subject, k: &ThreadKey, window: LoadWindow) -> Option<Checkpoint> {
    let stored = s
        .store
        .load(&TurnKey::new(k.clone(), window))
        .await
        .expect("load")?;
    assert_eq!(
        stored.version.0, stored.state.version,
        "a thread's version is its store version"
    );
    Some(stored.state)
}

/// The whole thread at `k`, which must exist.
async fn thread(s: &Subject, k: &ThreadKey) -> Checkpoint {
    load(s, k, LoadWindow::all())
        .await
        .expect("the thread exists")
}

/// A thread nobody committed to does not exist, whatever the window.
pub async fn a_missing_thread_loads_as_none(s: Subject) {
    let k = key("p", "u", "t");
    assert_eq!(load(&s, &k, LoadWindow::all()).await, None);
    assert_eq!(
        load(&s, &k, LoadWindow::all().tail("history", 3)).await,
        None
    );
}

/// Lists grow by the delta's entries in order; objects are replaced; the
/// version counts commits; values round-trip exactly.
pub async fn commits_append_lists_and_replace_objects(s: Subject) {
    let k = key("p", "u", "t");
    let c1 = commit(&s, &k, 0, turn(1, "hello")).await.expect("commit 1");
    assert_eq!(c1.version, Version(1));
    let mut second = turn(2, "naïve ✓ \"quoted\"");
    second.objects.insert(
        "session_memory".to_owned(),
        json!({"summary": "x", "open_loops": ["a", "b"], "n": 1.5, "nested": {"z": null}}),
    );
    let c2 = commit(&s, &k, 1, second.clone()).await.expect("commit 2");
    assert_eq!(c2.version, Version(2));
    // An empty delta still counts as a turn.
    let c3 = commit(&s, &k, 2, CheckpointDelta::default())
        .await
        .expect("commit 3");
    assert_eq!(c3.version, Version(3));
    let got = thread(&s, &k).await;
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
pub async fn a_stale_version_conflicts_and_writes_nothing(s: Subject) {
    let k = key("p", "u", "t");
    commit(&s, &k, 0, turn(1, "one")).await.expect("commit");
    for stale in [0, 2, 7] {
        let err = commit(&s, &k, stale, turn(9, "lost"))
            .await
            .expect_err("stale version");
        assert!(err.is_conflict(), "{err}");
    }
    let missing = key("p", "u", "never");
    let err = commit(&s, &missing, 3, turn(1, "x"))
        .await
        .expect_err("no such version");
    assert!(err.is_conflict(), "{err}");
    let got = thread(&s, &k).await;
    assert_eq!(got.version, 1);
    assert_eq!(got.lists["history"].len(), 2);
    assert_eq!(got.objects["session_progress"], json!({"turn_count": 1}));
    assert_eq!(load(&s, &missing, LoadWindow::all()).await, None);
}

/// Another product, owner or thread never sees these entries.
pub async fn threads_are_scoped_by_product_owner_and_thread(s: Subject) {
    let keys = [
        key("a", "u", "t"),
        key("b", "u", "t"),
        key("a", "v", "t"),
        key("a", "u", "s"),
    ];
    for (i, k) in keys.iter().enumerate() {
        commit(&s, k, 0, turn(1, &format!("m{i}")))
            .await
            .expect("commit");
    }
    for (i, k) in keys.iter().enumerate() {
        let got = thread(&s, k).await;
        assert_eq!(got.version, 1);
        assert_eq!(got.lists["history"][0]["content"], json!(format!("m{i}")));
        assert_eq!(got.lists["history"].len(), 2);
    }
}

/// A window returns the last entries of the named list, whole others.
pub async fn windows_return_the_last_entries(s: Subject) {
    let k = key("p", "u", "t");
    for n in 1..=5 {
        commit(&s, &k, n - 1, turn(n, &format!("m{n}")))
            .await
            .expect("commit");
    }
    let got = load(&s, &k, LoadWindow::all().tail("history", 3))
        .await
        .expect("the thread exists");
    let contents: Vec<_> = got.lists["history"]
        .iter()
        .map(|m| m["content"].clone())
        .collect();
    assert_eq!(contents, [json!("re: m4"), json!("m5"), json!("re: m5")]);
    assert_eq!(got.lists["transcript"].len(), 10);
    assert_eq!(got.version, 5);
    let none = load(&s, &k, LoadWindow::all().tail("history", 0))
        .await
        .expect("the thread exists");
    assert!(none.lists.get("history").is_none_or(Vec::is_empty));
}

/// Turns appending one, none, three, two entries and so on to a list:
/// every window, from none to more than the list holds, is the last
/// entries of the whole list, in order, whatever turns they came with.
pub async fn every_window_is_the_tail_of_the_whole_list(s: Subject) {
    let k = key("p", "u", "t");
    let counts = [1, 0, 3, 2, 1, 4, 0, 2];
    for (i, count) in counts.iter().enumerate() {
        let n = i as u64 + 1;
        let mut delta = CheckpointDelta::default();
        delta.appends.insert(
            "events".to_owned(),
            (0..*count).map(|j| json!({"turn": n, "j": j})).collect(),
        );
        delta.objects.insert("at".to_owned(), json!(n));
        commit(&s, &k, n - 1, delta).await.expect("commit");
    }
    let whole = load(&s, &k, LoadWindow::all())
        .await
        .expect("the thread exists")
        .lists
        .remove("events")
        .unwrap_or_default();
    assert_eq!(whole.len(), counts.iter().sum::<usize>());
    for last in 0..=whole.len() + 2 {
        let got = load(&s, &k, LoadWindow::all().tail("events", last))
            .await
            .expect("the thread exists");
        let tail = &whole[whole.len().saturating_sub(last)..];
        assert_eq!(
            got.lists.get("events").map_or(&[][..], Vec::as_slice),
            tail,
            "the last {last} entries"
        );
        assert_eq!(got.version, counts.len() as u64);
    }
}

/// Turns racing on one thread, each retried on the new state after a
/// conflict: all land, each turn's entries once and together.
pub async fn racing_turns_both_land_once(s: Subject) {
    const RACERS: u64 = 8;
    let k = key("p", "u", "hot");
    let mut tasks = Vec::new();
    for r in 0..RACERS {
        let s = s.clone();
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            let mut attempts = 0;
            loop {
                attempts += 1;
                let base = load(&s, &k, LoadWindow::all())
                    .await
                    .map_or(0, |head| head.version);
                let delta = turn(base + 1, &format!("racer {r}"));
                match commit(&s, &k, base, delta).await {
                    Ok(c) => return (c.version.0, attempts),
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
    let got = thread(&s, &k).await;
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

/// The 100th commit of a thread writes what its turn added and nothing
/// else: every commit is handed a decided state holding only its own turn
/// (as a windowed load leaves it), and the thread still holds every entry
/// of every turn, in order; what the store holds grows by the same amount
/// with the 100th turn as with the second. (The PostgreSQL adapter's own
/// test measures its rows.)
pub async fn a_commit_writes_its_delta_not_the_decided_state(s: Subject) {
    let k = key("p", "u", "long");
    let mut held = vec![0];
    for n in 1..=100u64 {
        let delta = turn(100 + n, &format!("m{n:03}"));
        let c = commit(&s, &k, n - 1, delta).await.expect("commit");
        assert_eq!(c.version, Version(n));
        if matches!(n, 1 | 2 | 99 | 100) {
            let stored = thread(&s, &k).await;
            held.push(serde_json::to_vec(&stored.lists).expect("encodes").len());
        }
    }
    // held: [0, after 1, after 2, after 99, after 100]
    let (second, hundredth) = (held[2] - held[1], held[4] - held[3]);
    assert!(second > 0);
    assert_eq!(second, hundredth, "stored sizes {held:?}");
    let got = thread(&s, &k).await;
    assert_eq!(got.version, 100);
    let history: Vec<_> = got.lists["history"]
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    let expected: Vec<_> = (1..=100)
        .flat_map(|n| [format!("m{n:03}"), format!("re: m{n:03}")])
        .collect();
    assert_eq!(history, expected);
    assert_eq!(got.objects["session_progress"], json!({"turn_count": 200}));
}

/// A decision that records a transition writes its audit entry with the
/// turn; one that loses its race writes none.
pub async fn a_commit_writes_the_audit_entries_it_carries(s: Subject) {
    let k = key("p", "u", "audited");
    let mut first = decided(0, turn(1, "one"));
    first
        .2
        .transition(Transition::new("open", "open", "reviewed"));
    commit_decided(&s, &k, 0, &first).await.expect("commit");
    let lost = commit_decided(&s, &k, 0, &first).await;
    assert_eq!(
        lost.map(|_| ()).map_err(|e| e.kind),
        Err(ErrorKind::Conflict)
    );
    let entries = s
        .audit
        .list(
            &k.product_id,
            Checkpoint::KIND,
            &format!("{}/{}", k.owner, k.thread),
            None,
            100,
        )
        .await
        .expect("list audit entries");
    let written: Vec<_> = entries
        .iter()
        .map(|r| {
            (
                r.entry.from.as_deref(),
                r.entry.to.as_str(),
                r.entry.cause.as_str(),
            )
        })
        .collect();
    assert_eq!(written, [(Some("open"), "open", "reviewed")]);
    assert_eq!(thread(&s, &k).await.version, 1);
}

/// A thread enqueues nothing: a commit carrying a task, even a valid one,
/// is refused as invalid and writes nothing.
pub async fn a_commit_carrying_a_task_is_refused(s: Subject) {
    let k = key("p", "u", "t");
    commit(&s, &k, 0, turn(1, "one")).await.expect("commit");
    let mut with_task = decided(1, turn(2, "two"));
    with_task
        .2
        .task(TaskSpec::new(k.product_id.clone(), "turn", json!({})));
    let refused = commit_decided(&s, &k, 1, &with_task).await;
    assert_eq!(
        refused.map(|_| ()).map_err(|e| e.kind),
        Err(ErrorKind::Invalid)
    );
    let got = thread(&s, &k).await;
    assert_eq!(got.version, 1);
    assert_eq!(got.lists["history"].len(), 2);
}

/// The assessment of turn `turn` on the thread at `k`.
fn crisis_entry(k: &ThreadKey, turn: u64) -> CrisisLogEntry {
    CrisisLogEntry {
        product_id: k.product_id.clone(),
        owner: k.owner.clone(),
        thread: k.thread.clone(),
        turn,
        at: now(),
        assessment: CrisisAssessment {
            level: 3,
            confidence: 0.9,
            reason: format!("turn {turn}"),
            needs_crisis_response: true,
            needs_clarification: false,
        },
        audit: CrisisAudit {
            override_kind: None,
            classifier_path: "keyword_fallback".to_owned(),
            llm_failure_occurred: true,
        },
        route: "crisis".to_owned(),
    }
}

/// `turn(n, text)` carrying the assessment of turn `n` on `k`.
fn assessed_turn(k: &ThreadKey, n: u64, text: &str) -> CheckpointDelta {
    let mut d = turn(n, text);
    carry_crisis_entries(&mut d, &[crisis_entry(k, n)]).expect("entry encodes");
    d
}

/// The crisis-log entries of `k`'s owner on `k`'s thread, oldest first.
async fn crisis_entries(s: &Subject, k: &ThreadKey) -> Vec<CrisisLogEntry> {
    s.crisis_log
        .list(&k.product_id, &k.owner, None, 1000)
        .await
        .expect("list crisis log")
        .into_iter()
        .map(|r| r.entry)
        .filter(|e| e.thread == k.thread)
        .collect()
}

/// The crisis-log entries a turn carries are written with the turn, in
/// order, and never become a list of the thread.
pub async fn crisis_entries_commit_with_the_turn_and_never_reach_the_thread(s: Subject) {
    let k = key("p", "u", "t");
    commit(&s, &k, 0, assessed_turn(&k, 1, "one"))
        .await
        .expect("commit 1");
    commit(&s, &k, 1, turn(2, "two")).await.expect("commit 2");
    commit(&s, &k, 2, assessed_turn(&k, 3, "three"))
        .await
        .expect("commit 3");
    let logged = crisis_entries(&s, &k).await;
    assert_eq!(logged, vec![crisis_entry(&k, 1), crisis_entry(&k, 3)]);
    let got = thread(&s, &k).await;
    assert!(
        !got.lists.contains_key(CRISIS_LOG_DELTA),
        "the crisis log reached the thread: {:?}",
        got.lists.keys().collect::<Vec<_>>()
    );
    assert_eq!(got.lists["history"].len(), 6);
}

/// A turn whose commit is lost to another leaves no crisis entry; the same
/// turn run again on the thread that won leaves exactly one.
pub async fn a_lost_commit_leaves_no_crisis_entry_and_its_retry_one(s: Subject) {
    let k = key("p", "u", "t");
    commit(&s, &k, 0, turn(1, "one")).await.expect("commit 1");
    // Two turns began on version 1; the other one wins.
    let lost = decided(1, assessed_turn(&k, 2, "mine"));
    commit(&s, &k, 1, turn(2, "theirs"))
        .await
        .expect("the winner");
    let err = commit_decided(&s, &k, 1, &lost)
        .await
        .expect_err("a lost commit");
    assert!(err.is_conflict(), "{err}");
    assert_eq!(crisis_entries(&s, &k).await, vec![], "a lost turn logged");
    // A new thread whose creation is lost: nothing either.
    let fresh = key("p", "u", "fresh");
    commit(&s, &fresh, 0, turn(1, "first"))
        .await
        .expect("create");
    let err = commit(&s, &fresh, 0, assessed_turn(&fresh, 1, "also first"))
        .await
        .expect_err("the thread exists");
    assert!(err.is_conflict(), "{err}");
    assert_eq!(crisis_entries(&s, &fresh).await, vec![]);
    // The retry, on the thread as it is now.
    commit(&s, &k, 2, assessed_turn(&k, 3, "mine again"))
        .await
        .expect("the retry");
    assert_eq!(crisis_entries(&s, &k).await, vec![crisis_entry(&k, 3)]);
}

/// A turn cannot log an assessment under another product, owner or
/// thread: the commit is refused and writes nothing.
pub async fn a_crisis_entry_of_another_thread_is_refused(s: Subject) {
    let k = key("p", "u", "t");
    let other = key("q", "u", "t");
    let mut d = turn(1, "one");
    carry_crisis_entries(&mut d, &[crisis_entry(&other, 1)]).expect("entry encodes");
    let err = commit(&s, &k, 0, d)
        .await
        .expect_err("another thread's entry");
    assert_eq!(err.kind, ErrorKind::Invalid, "{err}");
    assert_eq!(load(&s, &k, LoadWindow::all()).await, None);
    assert_eq!(crisis_entries(&s, &other).await, vec![]);
    assert_eq!(crisis_entries(&s, &k).await, vec![]);
}
