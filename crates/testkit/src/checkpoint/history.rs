//! The thread store's history cases: checkpoints listed and paged, the
//! state as of each, forks, operator updates, interrupts and their resumes,
//! racing writers, deletion, and an owner's threads.
//!
//! Every write goes through the thread machine: the thread is loaded whole,
//! the command decided on it (`Checkpoint::decide`, or `Checkpoint::create`
//! for a new thread), and the decision committed on the loaded version, so
//! the decided state is what the store must hold after the commit.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parlance_core::turn::{
    Checkpoint, CheckpointDelta, CheckpointMeta, CheckpointRef, CheckpointSource,
    INTERRUPT_PENDING, LoadWindow, NO_INTERRUPT, OwnerId, PendingInterrupt, RESERVED_KEY,
    STALE_TURN, ThreadKey, TurnCommand, TurnError, TurnKey,
};
use parlance_core::{Decision, Machine, ProductId, Timestamp};
use parlance_ports::{
    Commit, ErrorKind, HistoryPage, PortError, ThreadCursor, ThreadPage, ThreadSummary, Version,
};
use serde_json::json;

use super::{Subject, key, load, msg, turn};

/// `n` seconds after the suite's epoch.
fn at(n: i64) -> Timestamp {
    Timestamp::from_secs(1_767_225_600 + n).expect("in range")
}

/// Why a command did not land.
#[derive(Debug, Clone, PartialEq)]
enum Refused {
    /// The machine refused it, for this reason.
    Machine(Option<&'static str>),
    /// There is no thread and the command creates none.
    NoThread,
    /// The store refused the commit.
    Store(ErrorKind),
}

impl From<PortError> for Refused {
    fn from(e: PortError) -> Self {
        Refused::Store(e.kind)
    }
}

/// `command` decided on `loaded` (a new thread when `None`): the state it
/// leaves and the decision to commit.
fn decide(
    k: &ThreadKey,
    loaded: Option<&Checkpoint>,
    command: &TurnCommand,
    now: Timestamp,
) -> Result<(Checkpoint, Decision<Checkpoint>), Refused> {
    let refused = |e: TurnError| match e {
        TurnError::NotAllowed(n) => Refused::Machine(n.reason),
        other => panic!("the machine failed: {other}"),
    };
    match loaded {
        Some(state) => {
            let mut state = state.clone();
            let decision = state.decide(&(), command, now).map_err(refused)?;
            Ok((state, decision))
        }
        None => Checkpoint::create(&TurnKey::whole(k.clone()), &(), command, now)
            .map_err(refused)?
            .ok_or(Refused::NoThread),
    }
}

/// Commits `decision` (of `command`, leaving `state`) on the thread at `k`
/// as loaded at version `base` (0: it did not exist); the new version.
async fn commit_at(
    s: &Subject,
    k: &ThreadKey,
    base: u64,
    command: &TurnCommand,
    (state, decision): &(Checkpoint, Decision<Checkpoint>),
    now: Timestamp,
) -> Result<u64, Refused> {
    let committed = s
        .store
        .commit(Commit {
            key: &TurnKey::whole(k.clone()),
            expected: (base > 0).then_some(Version(base)),
            command,
            state,
            decision,
            now,
        })
        .await?;
    assert_eq!(committed.version.0, base + 1, "a commit counts one version");
    Ok(committed.version.0)
}

/// Loads the thread at `k` whole, decides `command` on it and commits the
/// decision at `now`: the state the thread then holds.
async fn run(
    s: &Subject,
    k: &ThreadKey,
    command: &TurnCommand,
    now: Timestamp,
) -> Result<Checkpoint, Refused> {
    let loaded = load(s, k, LoadWindow::all()).await;
    let base = loaded.as_ref().map_or(0, |c| c.version);
    let decided = decide(k, loaded.as_ref(), command, now)?;
    commit_at(s, k, base, command, &decided, now).await?;
    Ok(decided.0)
}

/// [`run`], which must land.
async fn must(s: &Subject, k: &ThreadKey, command: &TurnCommand, now: Timestamp) -> Checkpoint {
    run(s, k, command, now)
        .await
        .unwrap_or_else(|r| panic!("{} refused: {r:?}", command_name(command)))
}

fn command_name(c: &TurnCommand) -> &'static str {
    use parlance_core::Command as _;
    c.name()
}

/// The version of the thread at `k` (0 when it does not exist).
async fn version(s: &Subject, k: &ThreadKey) -> u64 {
    load(s, k, LoadWindow::all()).await.map_or(0, |c| c.version)
}

/// A turn on the thread as it stands.
async fn next_turn(s: &Subject, k: &ThreadKey, n: u64, text: &str, now: Timestamp) -> Checkpoint {
    let base = version(s, k).await;
    must(s, k, &TurnCommand::commit(base, turn(n, text)), now).await
}

/// What a stage asks when it stops turn `n`.
fn pending(n: u64) -> PendingInterrupt {
    PendingInterrupt {
        stage: "confirm".to_owned(),
        step: 2,
        stages: vec!["confirm".to_owned()],
        join: None,
        payload: json!({"question": format!("go on with {n}?")}),
        suspended: json!({"input": format!("turn {n}")}),
    }
}

/// An operator's patch: a note object and one list entry.
fn patch(note: &str) -> CheckpointDelta {
    let mut d = CheckpointDelta::default();
    d.objects.insert("note".to_owned(), json!(note));
    d.appends
        .insert("history".to_owned(), vec![msg("operator", note)]);
    d
}

/// The whole history of the thread at `k`, newest first.
async fn history(s: &Subject, k: &ThreadKey) -> Vec<CheckpointMeta> {
    s.store
        .history(k, HistoryPage::newest(10_000))
        .await
        .expect("history")
}

/// The history of `k` read in pages of `limit`, each starting before the
/// last one read.
async fn paged_history(s: &Subject, k: &ThreadKey, limit: usize) -> Vec<CheckpointMeta> {
    let mut all: Vec<CheckpointMeta> = Vec::new();
    let mut before = None;
    loop {
        let page = s
            .store
            .history(k, HistoryPage { before, limit })
            .await
            .expect("history page");
        assert!(page.len() <= limit, "a page of {} over {limit}", page.len());
        let Some(last) = page.last() else { break };
        before = Some(last.version);
        all.extend(page);
        assert!(all.len() <= 10_000, "paging never ends");
    }
    all
}

/// The state of `k` as of checkpoint `v`.
async fn load_at(s: &Subject, k: &ThreadKey, v: u64) -> Option<Checkpoint> {
    s.store.load_at(k, v).await.expect("load_at")
}

/// The reference to checkpoint `version` of `k`.
fn at_version(k: &ThreadKey, version: u64) -> CheckpointRef {
    CheckpointRef {
        owner: k.owner.clone(),
        thread: k.thread.clone(),
        version,
    }
}

/// The history entry a commit is expected to write.
fn meta(
    k: &ThreadKey,
    version: u64,
    now: Timestamp,
    source: CheckpointSource,
    interrupted: bool,
) -> CheckpointMeta {
    CheckpointMeta {
        version,
        parent: (version > 1).then(|| at_version(k, version - 1)),
        at: now,
        source,
        interrupted,
    }
}

/// Every checkpoint, newest first: number, parent, time, source and
/// whether it left an interrupt; paged with `before` and `limit`, every one
/// once; none for a thread that does not exist.
pub async fn history_lists_every_checkpoint_newest_first(s: Subject) {
    let k = key("p", "u", "t");
    assert_eq!(history(&s, &k).await, []);
    must(&s, &k, &TurnCommand::commit(0, turn(1, "one")), at(1)).await;
    must(&s, &k, &TurnCommand::commit(1, turn(2, "two")), at(2)).await;
    must(&s, &k, &TurnCommand::update(None, patch("fixed")), at(3)).await;
    let stopped = TurnCommand::interrupt(3, turn(4, "four"), pending(4));
    must(&s, &k, &stopped, at(4)).await;
    must(
        &s,
        &k,
        &TurnCommand::resume(4, turn(5, "five"), None),
        at(5),
    )
    .await;
    must(&s, &k, &TurnCommand::commit(5, turn(6, "six")), at(6)).await;
    // Written at an earlier time than the one before it: `at` is the
    // commit's own.
    must(&s, &k, &TurnCommand::update(Some(6), patch("late")), at(0)).await;
    let expected: Vec<_> = [
        meta(&k, 7, at(0), CheckpointSource::Update, false),
        meta(&k, 6, at(6), CheckpointSource::Turn, false),
        meta(&k, 5, at(5), CheckpointSource::Resume, false),
        meta(&k, 4, at(4), CheckpointSource::Turn, true),
        meta(&k, 3, at(3), CheckpointSource::Update, false),
        meta(&k, 2, at(2), CheckpointSource::Turn, false),
        meta(&k, 1, at(1), CheckpointSource::Turn, false),
    ]
    .into();
    assert_eq!(history(&s, &k).await, expected);
    assert_eq!(expected[6].parent, None, "the first checkpoint has none");
    for limit in [1, 2, 3, 6, 7, 100] {
        assert_eq!(
            paged_history(&s, &k, limit).await,
            expected,
            "pages of {limit}"
        );
    }
    let page = |before, limit| s.store.history(&k, HistoryPage { before, limit });
    assert_eq!(page(Some(5), 2).await.expect("page"), expected[3..5]);
    assert_eq!(page(Some(1), 10).await.expect("page"), []);
    assert_eq!(page(Some(0), 10).await.expect("page"), []);
    assert_eq!(page(Some(100), 1).await.expect("page"), expected[..1]);
    assert_eq!(page(None, 0).await.expect("page"), []);
    // Other threads of the same key parts have no history.
    for other in [key("q", "u", "t"), key("p", "v", "t"), key("p", "u", "s")] {
        assert_eq!(history(&s, &other).await, [], "{other:?}");
    }
}

/// Turn `n` of the long thread: entries on `history` every turn, on
/// `notes` every third and `events` every fifth (and an empty append every
/// seventh, which creates no list); objects replaced on keys that vary
/// with `n`, one of them set to null every eleventh turn.
fn varied(n: u64) -> CheckpointDelta {
    let mut d = CheckpointDelta::default();
    d.appends.insert(
        "history".to_owned(),
        vec![
            msg("user", &format!("m{n}")),
            msg("assistant", &format!("r{n}")),
        ],
    );
    if n.is_multiple_of(3) {
        d.appends
            .insert("notes".to_owned(), vec![json!({"n": n, "tags": ["a", n]})]);
    }
    if n.is_multiple_of(5) {
        d.appends
            .insert("events".to_owned(), vec![json!(n), json!(format!("e{n}"))]);
    }
    if n.is_multiple_of(7) {
        d.appends.insert("empty".to_owned(), Vec::new());
    }
    d.objects.insert(
        format!("k{}", n % 7),
        json!({"set_at": n, "half": n as f64 / 2.0}),
    );
    d.objects.insert("progress".to_owned(), json!({"turn": n}));
    if n.is_multiple_of(4) {
        d.objects
            .insert(format!("m{}", n % 9), json!([n, {"nested": {"deep": n}}]));
    }
    if n.is_multiple_of(11) {
        d.objects.insert("k3".to_owned(), serde_json::Value::Null);
    }
    d
}

/// Writes `count` checkpoints on the new thread `k` through the machine
/// (mostly turns; updates, interrupts and resumes among them): the state
/// after each, oldest first.
async fn long_thread(s: &Subject, k: &ThreadKey, count: u64, salt: u64) -> Vec<Checkpoint> {
    let mut states: Vec<Checkpoint> = Vec::new();
    for n in 1..=count {
        let base = n - 1;
        let delta = varied(n * salt);
        let command = match n % 10 {
            _ if n == 1 => TurnCommand::commit(0, delta),
            4 => TurnCommand::update(Some(base), delta),
            8 => TurnCommand::interrupt(base, delta, pending(n)),
            9 => TurnCommand::resume(base, delta, None),
            _ => TurnCommand::commit(base, delta),
        };
        let state = must(s, k, &command, at(i64::try_from(n).expect("small"))).await;
        assert_eq!(state.version, n);
        states.push(state);
    }
    states
}

/// Asserts that the state of `k` as of each checkpoint is `states[v - 1]`,
/// and that there is none before the first or after the last.
async fn assert_every_state(s: &Subject, k: &ThreadKey, states: &[Checkpoint]) {
    for (i, expected) in states.iter().enumerate() {
        let v = i as u64 + 1;
        let got = load_at(s, k, v).await;
        assert_eq!(
            got.as_ref(),
            Some(expected),
            "the state as of checkpoint {v}"
        );
    }
    assert_eq!(load_at(s, k, 0).await, None, "checkpoint 0");
    let past = states.len() as u64 + 1;
    assert_eq!(load_at(s, k, past).await, None, "checkpoint {past}");
    assert_eq!(load_at(s, k, u64::MAX).await, None, "checkpoint u64::MAX");
}

/// The state as of every checkpoint of a thread long enough to cross
/// several full copies of its objects is the state the machine had after
/// that commit: lists whole, objects, version. None before the first and
/// after the last; and the same once the thread is deleted and begun again.
pub async fn load_at_equals_the_state_after_every_commit(s: Subject) {
    let k = key("p", "u", "long");
    let states = long_thread(&s, &k, 80, 1).await;
    assert_eq!(
        load(&s, &k, LoadWindow::all()).await.as_ref(),
        states.last()
    );
    assert_every_state(&s, &k, &states).await;
    // A neighbour's history is its own.
    let other = key("p", "u", "short");
    let short = long_thread(&s, &other, 3, 7).await;
    assert_every_state(&s, &other, &short).await;
    assert_eq!(load_at(&s, &key("p", "u", "never"), 1).await, None);
    assert_eq!(load_at(&s, &key("q", "u", "long"), 1).await, None);

    assert!(s.store.delete_thread(&k).await.expect("delete"));
    assert_eq!(load_at(&s, &k, 1).await, None, "a deleted thread");
    let again = long_thread(&s, &k, 40, 3).await;
    assert_eq!(history(&s, &k).await.len(), 40);
    assert_every_state(&s, &k, &again).await;
    assert_every_state(&s, &other, &short).await;
}

/// A fork's thread starts with the state of its origin at the checkpoint
/// it was forked from, in one checkpoint of source `fork` whose parent is
/// that checkpoint; then it takes turns of its own and the origin is left
/// as it was. A missing checkpoint is `NotFound`, a thread that exists a
/// `Conflict`, another product `Invalid`, and none of them writes anything.
pub async fn a_fork_starts_a_thread_of_its_own(s: Subject) {
    let from = key("p", "u", "origin");
    let states = long_thread(&s, &from, 10, 1).await;
    let from_history = history(&s, &from).await;
    assert!(states[7].is_interrupted() && !states[6].is_interrupted());

    let to = key("p", "u", "copy");
    let forked = s.store.fork(&from, 3, &to, at(100)).await.expect("fork");
    let first = CheckpointMeta {
        version: 1,
        parent: Some(at_version(&from, 3)),
        at: at(100),
        source: CheckpointSource::Fork,
        interrupted: false,
    };
    assert_eq!(forked, first);
    assert_eq!(history(&s, &to).await, std::slice::from_ref(&first));
    let expected = Checkpoint {
        version: 1,
        ..states[2].clone()
    };
    assert_eq!(
        load(&s, &to, LoadWindow::all()).await,
        Some(expected.clone())
    );
    assert_eq!(load_at(&s, &to, 1).await, Some(expected.clone()));
    assert_eq!(load_at(&s, &to, 2).await, None);

    // The fork goes on by itself.
    let mut own = vec![expected];
    own.push(next_turn(&s, &to, 200, "forked one", at(101)).await);
    own.push(
        must(
            &s,
            &to,
            &TurnCommand::update(None, patch("forked")),
            at(102),
        )
        .await,
    );
    assert_every_state(&s, &to, &own).await;
    let to_history = history(&s, &to).await;
    assert_eq!(
        to_history,
        [
            meta(&to, 3, at(102), CheckpointSource::Update, false),
            meta(&to, 2, at(101), CheckpointSource::Turn, false),
            first,
        ]
    );
    // The origin is untouched.
    assert_eq!(history(&s, &from).await, from_history);
    assert_eq!(
        load(&s, &from, LoadWindow::all()).await.as_ref(),
        states.last()
    );
    assert_every_state(&s, &from, &states).await;

    // A fork of an interrupted checkpoint waits on the same interrupt.
    let waiting = key("p", "u", "waiting");
    let meta8 = s
        .store
        .fork(&from, 8, &waiting, at(110))
        .await
        .expect("fork");
    assert!(meta8.interrupted);
    assert_eq!(history(&s, &waiting).await, [meta8]);
    let held = load(&s, &waiting, LoadWindow::all())
        .await
        .expect("the fork exists");
    assert_eq!(held.pending_interrupt(), Some(pending(8)));
    let refused = run(&s, &waiting, &TurnCommand::commit(1, turn(1, "x")), at(111)).await;
    assert_eq!(refused, Err(Refused::Machine(Some(INTERRUPT_PENDING))));
    let resumed = TurnCommand::resume(1, turn(1, "answer"), None);
    assert!(!must(&s, &waiting, &resumed, at(112)).await.is_interrupted());

    // Refusals, each writing nothing.
    let fork = |v: u64, to: ThreadKey| {
        let s = s.clone();
        let from = from.clone();
        async move {
            s.store
                .fork(&from, v, &to, at(120))
                .await
                .map_err(|e| e.kind)
        }
    };
    let nowhere = key("p", "u", "nowhere");
    assert_eq!(fork(0, nowhere.clone()).await, Err(ErrorKind::NotFound));
    assert_eq!(fork(11, nowhere.clone()).await, Err(ErrorKind::NotFound));
    let missing = s
        .store
        .fork(&key("p", "u", "ghost"), 1, &nowhere, at(120))
        .await
        .map_err(|e| e.kind);
    assert_eq!(missing, Err(ErrorKind::NotFound));
    let elsewhere = s
        .store
        .fork(
            &key("q", "u", "origin"),
            1,
            &key("q", "u", "nowhere"),
            at(120),
        )
        .await
        .map_err(|e| e.kind);
    assert_eq!(
        elsewhere,
        Err(ErrorKind::NotFound),
        "another product's thread"
    );
    assert_eq!(fork(2, to.clone()).await, Err(ErrorKind::Conflict));
    assert_eq!(fork(2, from.clone()).await, Err(ErrorKind::Conflict));
    let across = key("q", "u", "copy");
    assert_eq!(fork(2, across.clone()).await, Err(ErrorKind::Invalid));
    for k in [&nowhere, &across] {
        assert_eq!(load(&s, k, LoadWindow::all()).await, None);
        assert_eq!(history(&s, k).await, []);
    }
    assert_every_state(&s, &to, &own).await;
    assert_eq!(history(&s, &from).await, from_history);

    // Another owner of the product may be forked to; the parent names the
    // origin's owner.
    let theirs = key("p", "v", "copy");
    let m = s
        .store
        .fork(&from, 10, &theirs, at(130))
        .await
        .expect("fork");
    assert_eq!(m.parent, Some(at_version(&from, 10)));
    assert_eq!(
        load_at(&s, &theirs, 1).await,
        Some(Checkpoint {
            version: 1,
            ..states[9].clone()
        })
    );
}

/// Forks racing to create one thread: exactly one wins, every other is a
/// `Conflict`, and the thread holds the winner's state alone.
pub async fn racing_forks_to_one_thread_one_wins(s: Subject) {
    const RACERS: u64 = 4;
    let from = key("p", "u", "origin");
    let states = long_thread(&s, &from, 6, 1).await;
    for round in 0..5 {
        let to = key("p", "u", &format!("race{round}"));
        let mut tasks = Vec::new();
        for r in 0..RACERS {
            let (s, from, to) = (s.clone(), from.clone(), to.clone());
            tasks.push(tokio::spawn(async move {
                let v = 1 + r % 6;
                let got = s.store.fork(&from, v, &to, at(200 + r as i64)).await;
                (v, got.map_err(|e| e.kind))
            }));
        }
        let mut won = Vec::new();
        for t in tasks {
            match t.await.expect("racer") {
                (v, Ok(m)) => won.push((v, m)),
                (_, Err(kind)) => assert_eq!(kind, ErrorKind::Conflict, "round {round}"),
            }
        }
        assert_eq!(won.len(), 1, "round {round}: {won:?}");
        let (v, m) = won.remove(0);
        assert_eq!(m.parent, Some(at_version(&from, v)));
        assert_eq!(history(&s, &to).await, [m]);
        let expected = Checkpoint {
            version: 1,
            ..states[usize::try_from(v).expect("small") - 1].clone()
        };
        assert_eq!(
            load(&s, &to, LoadWindow::all()).await,
            Some(expected.clone())
        );
        assert_eq!(load_at(&s, &to, 1).await, Some(expected));
    }
}

/// An operator's update is a checkpoint of source `update`, on any version
/// or the one it names; one writing a runtime key is refused and writes
/// nothing; one on a thread that does not exist creates nothing.
pub async fn an_update_commits_as_a_checkpoint_of_its_own(s: Subject) {
    let k = key("p", "u", "t");
    let missing = run(&s, &k, &TurnCommand::update(None, patch("x")), at(1)).await;
    assert_eq!(missing, Err(Refused::NoThread));
    assert_eq!(load(&s, &k, LoadWindow::all()).await, None);
    let first = next_turn(&s, &k, 1, "one", at(1)).await;
    let updated = must(&s, &k, &TurnCommand::update(None, patch("a")), at(2)).await;
    assert_eq!(updated.version, 2);
    assert_eq!(updated.objects["note"], json!("a"));
    assert_eq!(
        updated.lists["history"].len(),
        first.lists["history"].len() + 1
    );
    let pinned = must(&s, &k, &TurnCommand::update(Some(2), patch("b")), at(3)).await;
    let stale = run(&s, &k, &TurnCommand::update(Some(2), patch("c")), at(4)).await;
    assert_eq!(stale, Err(Refused::Machine(Some(STALE_TURN))));
    for reserved in ["__interrupt", "__anything"] {
        let mut objects = patch("d");
        objects.objects.insert(reserved.to_owned(), json!(null));
        let refused = run(&s, &k, &TurnCommand::update(None, objects), at(5)).await;
        assert_eq!(refused, Err(Refused::Machine(Some(RESERVED_KEY))));
        let mut lists = patch("e");
        lists.appends.insert(reserved.to_owned(), vec![json!(1)]);
        let refused = run(&s, &k, &TurnCommand::update(None, lists), at(5)).await;
        assert_eq!(refused, Err(Refused::Machine(Some(RESERVED_KEY))));
    }
    assert_eq!(load(&s, &k, LoadWindow::all()).await, Some(pinned.clone()));
    assert_eq!(
        history(&s, &k).await,
        [
            meta(&k, 3, at(3), CheckpointSource::Update, false),
            meta(&k, 2, at(2), CheckpointSource::Update, false),
            meta(&k, 1, at(1), CheckpointSource::Turn, false),
        ]
    );
    assert_every_state(&s, &k, &[first, updated, pinned]).await;
}

/// The listed summary of `k`'s thread, if `threads` lists it.
async fn summary(s: &Subject, k: &ThreadKey) -> Option<ThreadSummary> {
    s.store
        .threads(
            &k.product_id,
            &k.owner,
            &ThreadPage {
                after: None,
                limit: 1000,
            },
        )
        .await
        .expect("threads")
        .into_iter()
        .find(|t| t.thread == k.thread)
}

/// A turn stopped by an interrupt is committed with it: the thread loads
/// it pending, its checkpoint and its listing say interrupted, and it
/// takes no new turn. Two resumes decided on the same version race: one
/// commits, the other is a `Conflict`, and decided again on the thread as
/// it now is, finds no interrupt.
pub async fn an_interrupt_holds_the_thread_until_one_resume_lands(s: Subject) {
    let k = key("p", "u", "t");
    next_turn(&s, &k, 1, "one", at(1)).await;
    let stopped = TurnCommand::interrupt(1, turn(2, "two"), pending(2));
    let held = must(&s, &k, &stopped, at(2)).await;
    let loaded = load(&s, &k, LoadWindow::all())
        .await
        .expect("the thread exists");
    assert_eq!(loaded, held);
    assert_eq!(loaded.pending_interrupt(), Some(pending(2)));
    assert_eq!(
        history(&s, &k).await[0],
        meta(&k, 2, at(2), CheckpointSource::Turn, true)
    );
    let listed = summary(&s, &k).await.expect("listed");
    assert!(listed.interrupted && listed.version == 2, "{listed:?}");
    // A windowed load sees the interrupt too.
    let windowed = load(&s, &k, LoadWindow::all().tail("history", 1))
        .await
        .expect("the thread exists");
    assert_eq!(windowed.pending_interrupt(), Some(pending(2)));

    let refused = run(&s, &k, &TurnCommand::commit(2, turn(3, "three")), at(3)).await;
    assert_eq!(refused, Err(Refused::Machine(Some(INTERRUPT_PENDING))));

    // Two resumes on version 2, committed at once.
    let mut tasks = Vec::new();
    for r in 0..2u64 {
        let (s, k, loaded) = (s.clone(), k.clone(), loaded.clone());
        tasks.push(tokio::spawn(async move {
            let command = TurnCommand::resume(2, turn(10 + r, &format!("answer {r}")), None);
            let decided = decide(&k, Some(&loaded), &command, at(4)).expect("a resume is due");
            let got = commit_at(&s, &k, 2, &command, &decided, at(4)).await;
            (r, decided.0, got)
        }));
    }
    let mut landed = Vec::new();
    let mut lost = Vec::new();
    for t in tasks {
        match t.await.expect("resume") {
            (r, state, Ok(v)) => landed.push((r, state, v)),
            (r, _, Err(e)) => lost.push((r, e)),
        }
    }
    assert_eq!(landed.len(), 1, "landed {landed:?}, lost {lost:?}");
    assert_eq!(lost.len(), 1);
    let (_, resumed, v) = landed.remove(0);
    assert_eq!(v, 3);
    let (loser, why) = lost.remove(0);
    assert_eq!(why, Refused::Store(ErrorKind::Conflict));
    let again = TurnCommand::resume(3, turn(10 + loser, "answer again"), None);
    let reloaded = load(&s, &k, LoadWindow::all()).await;
    assert_eq!(reloaded.as_ref(), Some(&resumed));
    assert_eq!(
        decide(&k, reloaded.as_ref(), &again, at(5)).map(|_| ()),
        Err(Refused::Machine(Some(NO_INTERRUPT)))
    );
    assert_eq!(resumed.pending_interrupt(), None);
    assert_eq!(
        history(&s, &k).await[0],
        meta(&k, 3, at(4), CheckpointSource::Resume, false)
    );
    assert!(!summary(&s, &k).await.expect("listed").interrupted);

    // A resumed turn may stop again; then a turn goes through once that
    // interrupt is answered.
    must(
        &s,
        &k,
        &TurnCommand::interrupt(3, turn(20, "w"), pending(20)),
        at(6),
    )
    .await;
    let again = TurnCommand::resume(4, turn(21, "x"), Some(pending(21)));
    let again = must(&s, &k, &again, at(7)).await;
    assert_eq!(again.pending_interrupt(), Some(pending(21)));
    assert_eq!(
        history(&s, &k).await[0],
        meta(&k, 5, at(7), CheckpointSource::Resume, true)
    );
    assert!(summary(&s, &k).await.expect("listed").interrupted);
    must(&s, &k, &TurnCommand::resume(5, turn(22, "y"), None), at(8)).await;
    let last = next_turn(&s, &k, 23, "z", at(9)).await;
    assert_eq!(last.version, 7);
    assert_eq!(load_at(&s, &k, 5).await, Some(again));
}

/// Writers racing on one thread, each reloading and retrying after a
/// `Conflict`: the history holds every version once, with no gaps, and the
/// state as of each is the replay of the deltas that landed, in order.
pub async fn racing_turns_leave_a_history_without_gaps(s: Subject) {
    const WRITERS: u64 = 5;
    const TURNS: u64 = 4;
    let k = key("p", "u", "hot");
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (s, k) = (s.clone(), k.clone());
        tasks.push(tokio::spawn(async move {
            let mut landed = Vec::new();
            for t in 0..TURNS {
                let mut attempts = 0;
                loop {
                    attempts += 1;
                    assert!(attempts < 1000, "writer {w} never landed");
                    let loaded = load(&s, &k, LoadWindow::all()).await;
                    let base = loaded.as_ref().map_or(0, |c| c.version);
                    let mut delta = varied(w * 100 + t);
                    delta
                        .objects
                        .insert(format!("w{w}"), json!({"turn": t, "base": base}));
                    let command = if t == 2 && base > 0 {
                        TurnCommand::update(Some(base), delta.clone())
                    } else {
                        TurnCommand::commit(base, delta.clone())
                    };
                    let decided = match decide(&k, loaded.as_ref(), &command, at(1)) {
                        Ok(d) => d,
                        Err(r) => panic!("writer {w}: {r:?}"),
                    };
                    match commit_at(&s, &k, base, &command, &decided, at(1)).await {
                        Ok(v) => {
                            landed.push((v, delta));
                            break;
                        }
                        Err(Refused::Store(ErrorKind::Conflict)) => tokio::task::yield_now().await,
                        Err(r) => panic!("writer {w}: {r:?}"),
                    }
                }
            }
            landed
        }));
    }
    let mut landed = BTreeMap::new();
    for t in tasks {
        for (v, delta) in t.await.expect("writer") {
            assert!(
                landed.insert(v, delta).is_none(),
                "version {v} landed twice"
            );
        }
    }
    let n = WRITERS * TURNS;
    assert_eq!(
        landed.keys().copied().collect::<Vec<_>>(),
        (1..=n).collect::<Vec<_>>()
    );
    let versions: Vec<_> = history(&s, &k).await.iter().map(|m| m.version).collect();
    assert_eq!(versions, (1..=n).rev().collect::<Vec<_>>());
    let mut replay = Checkpoint::default();
    for (v, delta) in &landed {
        replay.apply(delta);
        assert_eq!(
            load_at(&s, &k, *v).await.as_ref(),
            Some(&replay),
            "version {v}"
        );
    }
    assert_eq!(load(&s, &k, LoadWindow::all()).await, Some(replay));
}

/// Deleting a thread removes it whole: its state, lists and history, from
/// every read and from its owner's list; other threads of the owner, other
/// owners' and other products' are untouched. Deleting it again, or a
/// thread that never was, answers false.
pub async fn deleting_a_thread_leaves_nothing_of_it(s: Subject) {
    let doomed = key("p", "u", "t");
    let others = [key("p", "u", "s"), key("p", "v", "t"), key("q", "u", "t")];
    let mut before = Vec::new();
    for (i, k) in std::iter::once(&doomed).chain(&others).enumerate() {
        let states = long_thread(&s, k, 9, i as u64 + 1).await;
        before.push((history(&s, k).await, states));
    }
    assert!(s.store.delete_thread(&doomed).await.expect("delete"));
    assert!(!s.store.delete_thread(&doomed).await.expect("delete again"));
    assert!(
        !s.store
            .delete_thread(&key("p", "u", "never"))
            .await
            .expect("delete a thread that never was")
    );
    assert_eq!(load(&s, &doomed, LoadWindow::all()).await, None);
    assert_eq!(
        load(&s, &doomed, LoadWindow::all().tail("history", 2)).await,
        None
    );
    assert_eq!(history(&s, &doomed).await, []);
    for v in 0..=10 {
        assert_eq!(load_at(&s, &doomed, v).await, None, "checkpoint {v}");
    }
    assert_eq!(summary(&s, &doomed).await, None);
    let listed = s
        .store
        .threads(
            &doomed.product_id,
            &doomed.owner,
            &ThreadPage {
                after: None,
                limit: 100,
            },
        )
        .await
        .expect("threads");
    assert_eq!(
        listed.iter().map(|t| t.thread.as_str()).collect::<Vec<_>>(),
        ["s"]
    );
    for (k, (hist, states)) in others.iter().zip(&before[1..]) {
        assert_eq!(&history(&s, k).await, hist, "{k:?}");
        assert_eq!(load(&s, k, LoadWindow::all()).await.as_ref(), states.last());
        assert_every_state(&s, k, states).await;
        assert!(summary(&s, k).await.is_some(), "{k:?}");
    }
    // It may be begun again, from nothing.
    let fresh = next_turn(&s, &doomed, 1, "again", at(50)).await;
    assert_eq!(fresh.version, 1);
    assert_eq!(fresh.lists["history"].len(), 2);
    assert_eq!(
        history(&s, &doomed).await,
        [meta(&doomed, 1, at(50), CheckpointSource::Turn, false)]
    );
}

/// A thread deleted again and again while writers race turns on it: what
/// the race leaves holds its own checkpoints and no row of an earlier
/// incarnation, so it goes on past every version reached before with each
/// state its own; deleted a last time, nothing of it is left.
pub async fn a_thread_deleted_while_turns_race_leaves_nothing_behind(s: Subject) {
    const WRITERS: u64 = 4;
    const ATTEMPTS: u64 = 40;
    let k = key("p", "u", "t");
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (s, k) = (s.clone(), k.clone());
        tasks.push(tokio::spawn(async move {
            let mut highest = 0;
            for a in 0..ATTEMPTS {
                let loaded = load(&s, &k, LoadWindow::all()).await;
                let base = loaded.as_ref().map_or(0, |c| c.version);
                let command = TurnCommand::commit(base, varied(w * 100 + a));
                let decided = decide(&k, loaded.as_ref(), &command, at(1)).expect("a turn");
                match commit_at(&s, &k, base, &command, &decided, at(1)).await {
                    Ok(v) => highest = highest.max(v),
                    Err(Refused::Store(ErrorKind::Conflict)) => {}
                    Err(r) => panic!("writer {w}: {r:?}"),
                }
                tokio::task::yield_now().await;
            }
            highest
        }));
    }
    let writing = Arc::new(AtomicBool::new(true));
    let deleter = {
        let (s, k, writing) = (s.clone(), k.clone(), writing.clone());
        tokio::spawn(async move {
            let mut deleted = 0;
            while writing.load(Ordering::Relaxed) {
                deleted += u32::from(s.store.delete_thread(&k).await.expect("delete"));
                tokio::task::yield_now().await;
            }
            deleted
        })
    };
    let mut highest = 0;
    for t in tasks {
        highest = highest.max(t.await.expect("writer"));
    }
    writing.store(false, Ordering::Relaxed);
    deleter.await.expect("deleter");
    // The thread as the race left it holds its own checkpoints and no
    // other: none past its version.
    let current = load(&s, &k, LoadWindow::all()).await;
    let reached = current.as_ref().map_or(0, |c| c.version);
    let versions: Vec<_> = history(&s, &k).await.iter().map(|m| m.version).collect();
    assert_eq!(versions, (1..=reached).rev().collect::<Vec<_>>());
    if let Some(current) = &current {
        assert_eq!(load_at(&s, &k, reached).await.as_ref(), Some(current));
    }
    for v in reached + 1..=highest + 1 {
        assert_eq!(
            load_at(&s, &k, v).await,
            None,
            "checkpoint {v} of {reached}"
        );
    }
    // Going on past every version it reached, each state is its own.
    let mut after = Vec::new();
    for n in reached + 1..=highest + 5 {
        let command = TurnCommand::commit(n - 1, varied(n * 13));
        after.push(must(&s, &k, &command, at(2)).await);
    }
    for state in &after {
        assert_eq!(load_at(&s, &k, state.version).await.as_ref(), Some(state));
    }
    assert_eq!(load(&s, &k, LoadWindow::all()).await.as_ref(), after.last());
    // Deleted once more, nothing of it is left.
    assert!(s.store.delete_thread(&k).await.expect("delete"));
    assert_eq!(load(&s, &k, LoadWindow::all()).await, None);
    assert_eq!(history(&s, &k).await, []);
    for v in 0..=highest + 5 {
        assert_eq!(load_at(&s, &k, v).await, None, "checkpoint {v}");
    }
    assert_eq!(summary(&s, &k).await, None);
}

/// A deletion that finds no thread races the commit creating it, again and
/// again: the thread the commit created is either gone whole or whole, its
/// first checkpoint with it. (A deletion that found nothing to delete once
/// went on to delete the rows of the thread created meanwhile, leaving a
/// thread without the checkpoint it started with.)
pub async fn a_deletion_racing_a_threads_creation_leaves_it_whole_or_gone(s: Subject) {
    const ROUNDS: u64 = 150;
    let k = key("p", "u", "t");
    let mut kept = 0;
    for n in 0..ROUNDS {
        let deleting = {
            let (s, k) = (s.clone(), k.clone());
            tokio::spawn(async move { s.store.delete_thread(&k).await.expect("delete") })
        };
        let created = run(&s, &k, &TurnCommand::commit(0, varied(n)), at(1)).await;
        deleting.await.expect("deleter");
        let current = load(&s, &k, LoadWindow::all()).await;
        let versions: Vec<_> = history(&s, &k).await.iter().map(|m| m.version).collect();
        match (&created, &current) {
            (Ok(state), Some(current)) => {
                kept += 1;
                assert_eq!(current, state, "round {n}: the thread as created");
                assert_eq!(versions, [1], "round {n}: its history");
                assert_eq!(load_at(&s, &k, 1).await.as_ref(), Some(state), "round {n}");
            }
            (_, None) => {
                assert_eq!(
                    versions,
                    Vec::<u64>::new(),
                    "round {n}: rows of a deleted thread"
                );
                assert_eq!(load_at(&s, &k, 1).await, None, "round {n}");
            }
            (Err(r), Some(_)) => {
                panic!("round {n}: the creation was refused ({r:?}) yet a thread is stored")
            }
        }
        s.store.delete_thread(&k).await.expect("delete");
    }
    assert!(kept > 0, "no creation outlived its racing deletion");
}

/// Reads of a checkpoint race the deletion of its thread and the making of
/// a new thread under the same key, again and again: each read is the state
/// of one of the two threads, whole, or nothing; never one thread's objects
/// with the other's lists.
pub async fn a_read_racing_a_thread_made_again_sees_one_thread_whole(s: Subject) {
    const ROUNDS: u64 = 100;
    let k = key("p", "u", "t");
    // Every write of thread `g` carries `g`: in its objects and in each of
    // its entries.
    let of = |g: u64| {
        let mut d = CheckpointDelta::default();
        d.appends.insert(
            "history".to_owned(),
            vec![json!({"thread": g, "i": 0}), json!({"thread": g, "i": 1})],
        );
        d.objects.insert("thread".to_owned(), json!(g));
        d
    };
    let make = async |g: u64| {
        must(&s, &k, &TurnCommand::commit(0, of(g)), at(1)).await;
        must(&s, &k, &TurnCommand::commit(1, of(g)), at(2)).await;
    };
    make(0).await;
    let done = Arc::new(AtomicBool::new(false));
    let reader = tokio::spawn({
        let (s, k, done) = (s.clone(), k.clone(), done.clone());
        async move {
            let (mut whole, mut gone) = (0, 0);
            loop {
                let finished = done.load(Ordering::SeqCst);
                match s.store.load_at(&k, 2).await.expect("load_at") {
                    None => gone += 1,
                    Some(state) => {
                        let g = state.objects.get("thread").cloned();
                        let entries: Vec<_> = state
                            .lists
                            .get("history")
                            .into_iter()
                            .flatten()
                            .map(|e| e.get("thread").cloned())
                            .collect();
                        assert_eq!(
                            entries,
                            vec![g.clone(); 4],
                            "a read of checkpoint 2 is not one thread whole: {state:?}"
                        );
                        whole += 1;
                    }
                }
                if finished {
                    return (whole, gone);
                }
                tokio::task::yield_now().await;
            }
        }
    });
    for g in 1..=ROUNDS {
        assert!(s.store.delete_thread(&k).await.expect("delete"));
        make(g).await;
        tokio::task::yield_now().await;
    }
    done.store(true, Ordering::SeqCst);
    let (whole, gone) = reader.await.expect("reader");
    // The last read came after the last thread was made.
    assert!(whole > 0, "no read saw a thread whole ({gone} saw none)");
}

/// The owner's threads read in pages of `limit`, each after the last one
/// read.
async fn paged_threads(
    s: &Subject,
    product: &ProductId,
    owner: &OwnerId,
    limit: usize,
) -> Vec<ThreadSummary> {
    let mut all: Vec<ThreadSummary> = Vec::new();
    let mut after = None;
    loop {
        let page = s
            .store
            .threads(product, owner, &ThreadPage { after, limit })
            .await
            .expect("threads");
        assert!(page.len() <= limit, "a page of {} over {limit}", page.len());
        let Some(last) = page.last() else { break };
        after = Some(ThreadCursor {
            updated_at: last.updated_at,
            thread: last.thread.clone(),
        });
        all.extend(page);
        assert!(all.len() <= 1000, "paging never ends");
    }
    all
}

/// An owner's threads, newest first by their last write (the time of the
/// newest checkpoint), ties by thread id in byte order; paged with the
/// cursor of the last one, every thread once; other owners' and products'
/// never; each with its version and whether it waits on an interrupt.
pub async fn threads_are_listed_newest_first_and_paged(s: Subject) {
    let p = ProductId::parse("p").expect("product id");
    let u = OwnerId::parse("u").expect("owner id");
    // (thread, the times of its writes): ties at 5 and at 9.
    let writes: [(&str, &[i64]); 8] = [
        ("b", &[1, 5]),
        ("B", &[5]),
        ("a", &[2, 3, 5]),
        ("a-1", &[9]),
        ("a_1", &[9]),
        ("z", &[7]),
        ("late", &[20, 4]),
        ("c", &[1]),
    ];
    for (thread, times) in writes {
        let k = key("p", "u", thread);
        for (i, t) in times.iter().enumerate() {
            next_turn(&s, &k, i as u64 + 1, thread, at(*t)).await;
        }
    }
    // "z" waits on an interrupt.
    let z = key("p", "u", "z");
    must(
        &s,
        &z,
        &TurnCommand::interrupt(1, turn(2, "stop"), pending(2)),
        at(8),
    )
    .await;
    // A fork is listed by the time it was made.
    s.store
        .fork(&key("p", "u", "a"), 2, &key("p", "u", "fork"), at(6))
        .await
        .expect("fork");
    // Neighbours never listed.
    next_turn(&s, &key("p", "v", "x"), 1, "x", at(30)).await;
    next_turn(&s, &key("q", "u", "y"), 1, "y", at(30)).await;

    let listed = |thread: &str, version, t, interrupted| ThreadSummary {
        thread: parlance_core::turn::ThreadId::parse(thread).expect("thread id"),
        version,
        updated_at: at(t),
        interrupted,
    };
    let expected = [
        listed("a-1", 1, 9, false),
        listed("a_1", 1, 9, false),
        listed("z", 2, 8, true),
        listed("fork", 1, 6, false),
        listed("B", 1, 5, false),
        listed("a", 3, 5, false),
        listed("b", 2, 5, false),
        listed("late", 2, 4, false),
        listed("c", 1, 1, false),
    ];
    for limit in [1, 2, 3, 4, 9, 50] {
        assert_eq!(
            paged_threads(&s, &p, &u, limit).await,
            expected,
            "pages of {limit}"
        );
    }
    // A cursor between two tied threads.
    let after_b = s
        .store
        .threads(
            &p,
            &u,
            &ThreadPage {
                after: Some(ThreadCursor {
                    updated_at: at(5),
                    thread: parlance_core::turn::ThreadId::parse("B").expect("thread id"),
                }),
                limit: 2,
            },
        )
        .await
        .expect("threads");
    assert_eq!(after_b, expected[5..7]);
    let none = s
        .store
        .threads(
            &p,
            &u,
            &ThreadPage {
                after: None,
                limit: 0,
            },
        )
        .await
        .expect("threads");
    assert_eq!(none, []);
    // Answering the interrupt clears the flag and moves the thread up.
    must(&s, &z, &TurnCommand::resume(2, turn(3, "go"), None), at(10)).await;
    let first = paged_threads(&s, &p, &u, 100).await.remove(0);
    assert_eq!(first, listed("z", 3, 10, false));
    // Other owners and products see only their own.
    let v = OwnerId::parse("v").expect("owner id");
    assert_eq!(
        paged_threads(&s, &p, &v, 10).await,
        [listed("x", 1, 30, false)]
    );
    let q = ProductId::parse("q").expect("product id");
    assert_eq!(
        paged_threads(&s, &q, &u, 10).await,
        [listed("y", 1, 30, false)]
    );
    assert_eq!(
        paged_threads(&s, &q, &OwnerId::parse("w").expect("owner id"), 10).await,
        []
    );
}
