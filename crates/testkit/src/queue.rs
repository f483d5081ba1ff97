//! Contract suite for [`TaskQueue`] adapters.
//!
//! Run it from an adapter's tests with
//! `parlance_testkit::task_queue_suite!(async { Some(Subject::new(queue, clock)) });`
//! where the queue reads time from `clock` and was built with [`config`].
//! The suite plays the worker itself (claim, complete, fail), so every case is
//! deterministic; time only moves when a case advances the clock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parlance_core::ProductId;
use parlance_ports::Clock as _;
use parlance_ports::{
    DagSpec, DagState, FailOutcome, Lease, ManualClock, MapSpec, NodeSpec, NodeState, QueueConfig,
    QueueDepth, QueueFootprint, TaskId, TaskQueue, TaskSpec, WorkerId,
};
use serde_json::{Value, json};
use uuid::Uuid;

/// Runs every case of this suite against the adapter the factory builds.
///
/// See how [the in-memory adapters](https://github.com/parlance-rs/parlance/blob/main/crates/memory/tests/it/main.rs) and [the PostgreSQL adapters](https://github.com/parlance-rs/parlance/blob/main/crates/postgres/tests/it/main.rs) run it.
///
/// ```
/// use std::sync::Arc;
///
/// use parlance_memory::MemoryTaskQueue;
/// use parlance_testkit::ManualClock;
/// use parlance_testkit::queue::{Subject, config};
///
/// /// The in-memory queue, built with the suite's `config` and reading a
/// /// manual clock.
/// fn subject() -> Subject {
///     let clock = Arc::new(ManualClock::new());
///     let queue = Arc::new(MemoryTaskQueue::new(clock.clone(), config()));
///     Subject::new(queue, clock)
/// }
///
/// // In the adapter's `tests/it/main.rs`, one `#[tokio::test]` per case:
/// mod queue {
///     parlance_testkit::task_queue_suite!(async { Some(super::subject()) });
/// }
///
/// // What some of those tests run (the clock only moves when a case moves it):
/// #[tokio::main]
/// async fn main() {
///     use parlance_testkit::queue::*;
///
///     claims_by_priority_then_run_at(subject()).await;
///     dedup_key_marks_a_running_task_to_run_again(subject()).await;
///     silent_worker_loses_its_tasks(subject()).await;
///     dag_chain_passes_results_in_order(subject()).await;
/// }
/// ```
#[macro_export]
macro_rules! task_queue_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::queue;
            cases = [
                claims_by_priority_then_run_at,
                batch_claim_respects_max_and_deadlines,
                no_double_claim_under_eight_claimers,
                dedup_key_folds_into_a_waiting_task,
                dedup_key_marks_a_running_task_to_run_again,
                requests_while_running_make_one_rerun_with_the_newest_payload,
                complete_and_claim_leaves_the_folded_request_to_every_worker,
                a_discarded_task_is_followed_by_the_request_folded_into_it,
                a_requeued_task_runs_once_more_as_the_request_folded_into_it,
                racing_enqueues_and_a_completion_lose_no_request,
                silent_worker_loses_its_tasks,
                expired_deadline_requeues_then_discards,
                fenced_operations_after_lease_loss_are_rejected,
                fence_names_the_worker,
                failed_attempts_back_off_then_dead_letter,
                release_gives_the_attempt_back,
                release_unheld_gives_back_what_the_worker_does_not_hold,
                complete_many_fences_each_item,
                dead_letters_are_listed_for_the_operator,
                dag_chain_passes_results_in_order,
                complete_and_claim_takes_the_freed_children,
                dag_fan_out_fan_in_joins_once_in_edge_order,
                concurrent_branch_completions_fire_the_join_once,
                random_dags_run_each_node_once_after_its_parents,
                dag_dynamic_map_grows_total,
                dag_empty_map_still_completes,
                failing_node_fails_dag_and_cancels_queued_siblings,
                expired_task_of_a_failed_run_is_cancelled,
                cancel_dag_stops_a_running_dag,
                dag_shapes_are_validated,
                map_node_must_return_an_array,
                dag_size_is_limited,
                purge_removes_old_finished_rows,
                completed_tasks_and_nodes_keep_no_payload,
                purge_removes_finished_runs_with_their_nodes,
                dedup_keys_are_per_product,
                a_dag_is_not_found_under_another_product,
                a_discarded_task_is_not_found_under_another_product,
                a_lease_naming_another_product_is_lost,
                depth_counts_live_tasks_of_one_queue,
                recovered_leases_are_counted_per_queue,
            ]
        }
    };
}

/// The subject of this suite: a queue and the manual clock it reads.
#[derive(Clone)]
pub struct Subject {
    /// The adapter under test, built with [`config`].
    pub queue: Arc<dyn TaskQueue>,
    /// The clock the adapter reads.
    pub clock: Arc<ManualClock>,
}

impl Subject {
    /// Pairs an adapter with its clock.
    pub fn new(queue: Arc<dyn TaskQueue>, clock: Arc<ManualClock>) -> Self {
        Self { queue, clock }
    }
}

/// The configuration adapters must be built with for this suite: workers
/// are stale after 30 s; default back-off (2 s doubling, jitter in the upper
/// half) and limits.
pub fn config() -> QueueConfig {
    QueueConfig {
        worker_stale_after: Duration::from_secs(30),
        ..QueueConfig::default()
    }
}

const LEASE: Duration = Duration::from_secs(300);

fn product() -> ProductId {
    ProductId::parse("acme").expect("valid product id")
}

/// A product that owns nothing the cases enqueue.
fn other_product() -> ProductId {
    ProductId::parse("globex").expect("valid product id")
}

fn worker(n: u128) -> WorkerId {
    WorkerId(Uuid::from_u128(n))
}

fn task(kind: &str) -> TaskSpec {
    TaskSpec::new(product(), kind, json!({"kind": kind}))
}

async fn claim(s: &Subject, w: u128, max: usize) -> Vec<Lease> {
    s.queue
        .claim(&worker(w), "default", max, LEASE)
        .await
        .expect("claim")
}

async fn claim_one(s: &Subject, w: u128) -> Option<Lease> {
    let mut got = claim(s, w, 1).await;
    assert!(got.len() <= 1);
    got.pop()
}

fn node_key(l: &Lease) -> String {
    l.dag.as_ref().expect("a dag task").node.clone()
}

fn inputs(l: &Lease) -> Vec<(String, Value)> {
    l.dag
        .as_ref()
        .expect("a dag task")
        .inputs
        .iter()
        .map(|i| (i.from.clone(), i.value.clone()))
        .collect()
}

/// Lower priority first, then earlier `run_at`, then enqueue order; future
/// tasks wait for their time; other queues are not touched.
pub async fn claims_by_priority_then_run_at(s: Subject) {
    let now = s.clock.now();
    let ids = s
        .queue
        .enqueue(&[
            task("low").priority(5),
            task("later").priority(1).run_at(now.plus_seconds(10.0)),
            task("now").priority(1),
            task("earlier").priority(1).run_at(now.plus_seconds(-5.0)),
            task("elsewhere").queue("other"),
            task("now-too").priority(1),
        ])
        .await
        .expect("enqueue");
    assert!(ids.iter().all(Option::is_some), "{ids:?}");
    let mut order = Vec::new();
    while let Some(l) = claim_one(&s, 1).await {
        order.push(l.kind.clone());
    }
    assert_eq!(order, ["earlier", "now", "now-too", "low"]);
    s.clock.advance(Duration::from_secs(10));
    let l = claim_one(&s, 1).await.expect("due now");
    assert_eq!(l.kind, "later");
    assert!(claim_one(&s, 1).await.is_none());
    let other = s
        .queue
        .claim(&worker(1), "other", 10, LEASE)
        .await
        .expect("claim");
    assert_eq!(other.len(), 1);
    assert_eq!(other[0].kind, "elsewhere");
    assert_eq!(other[0].queue, "other");
}

/// A claim returns at most `max` tasks, each with attempt 1, a fresh token,
/// and its own timeout (or the claim's lease) as deadline.
pub async fn batch_claim_respects_max_and_deadlines(s: Subject) {
    let mut specs: Vec<TaskSpec> = (0..5).map(|i| task(&format!("t{i}"))).collect();
    specs[0] = specs[0].clone().timeout(Duration::from_secs(7));
    s.queue.enqueue(&specs).await.expect("enqueue");
    let now = s.clock.now();
    let first = claim(&s, 1, 3).await;
    assert_eq!(first.len(), 3);
    assert_eq!(first[0].kind, "t0");
    assert_eq!(first[0].expires_at, now + Duration::from_secs(7));
    assert_eq!(first[1].expires_at, now + LEASE);
    for l in &first {
        assert_eq!(l.attempt, 1);
        assert_eq!(l.max_attempts, 5);
        assert_eq!(l.worker, worker(1));
        assert_eq!(l.product_id, product());
        assert_eq!(l.payload, json!({"kind": l.kind}));
        assert!(l.dag.is_none());
    }
    let rest = claim(&s, 2, 10).await;
    assert_eq!(rest.len(), 2);
    let mut tokens: Vec<i64> = first.iter().chain(&rest).map(|l| l.token).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 5, "tokens are unique");
    assert!(claim(&s, 3, 10).await.is_empty());
}

/// Eight claimers racing over 240 tasks: each task is claimed exactly once.
pub async fn no_double_claim_under_eight_claimers(s: Subject) {
    const TASKS: usize = 240;
    let specs: Vec<TaskSpec> = (0..TASKS).map(|i| task(&format!("t{i}"))).collect();
    let ids = s.queue.enqueue(&specs).await.expect("enqueue");
    let mut handles = Vec::new();
    for w in 0..8u128 {
        let q = Arc::clone(&s.queue);
        handles.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = q
                    .claim(&worker(w + 1), "default", 1 + (w as usize % 4), LEASE)
                    .await
                    .expect("claim");
                if got.is_empty() {
                    break;
                }
                for l in got {
                    q.complete(&l, json!(l.task_id.0)).await.expect("complete");
                    mine.push(l.task_id);
                }
            }
            mine
        }));
    }
    let mut all: Vec<TaskId> = Vec::new();
    for h in handles {
        all.extend(h.await.expect("claimer"));
    }
    assert_eq!(all.len(), TASKS, "every task claimed once");
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), TASKS, "no task claimed twice");
    let mut expected: Vec<TaskId> = ids.into_iter().flatten().collect();
    expected.sort_unstable();
    assert_eq!(all, expected);
}

/// A task of kind `turn` with dedup key `k` asking with `n` (its payload
/// `{"n": n}`).
fn request(n: u32) -> TaskSpec {
    TaskSpec::new(product(), "turn", json!({ "n": n })).dedup_key("k")
}

/// Enqueues `specs` and checks that each was folded into a live task.
async fn folded(s: &Subject, specs: &[TaskSpec]) {
    let ids = s.queue.enqueue(specs).await.expect("enqueue");
    assert!(ids.iter().all(Option::is_none), "folded: {ids:?}");
}

/// Completes the task `l` holds.
async fn done(s: &Subject, l: &Lease) {
    s.queue.complete(l, json!("done")).await.expect("complete");
}

/// Nothing is left to run on `queue`, now or later, and nothing runs.
async fn nothing_left(s: &Subject, queue: &str) {
    assert_eq!(
        s.queue.depth(queue).await.expect("depth"),
        QueueDepth::default(),
        "nothing left on {queue}"
    );
}

/// A request whose key a waiting task holds adds no task and changes
/// nothing: the waiting task runs once, as it was enqueued. A finished
/// task frees its key.
pub async fn dedup_key_folds_into_a_waiting_task(s: Subject) {
    let ids = s
        .queue
        .enqueue(&[
            task("a").dedup_key("k1"),
            task("b").dedup_key("k1"),
            task("c").dedup_key("k2"),
            task("d"),
        ])
        .await
        .expect("enqueue");
    assert!(
        ids[0].is_some() && ids[1].is_none() && ids[2].is_some() && ids[3].is_some(),
        "{ids:?}"
    );
    folded(&s, &[task("e").dedup_key("k1")]).await;
    let leases = claim(&s, 1, 10).await;
    let mut ran: Vec<(String, Value)> = leases
        .iter()
        .map(|l| (l.kind.clone(), l.payload.clone()))
        .collect();
    ran.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        ran,
        [
            ("a".to_owned(), json!({"kind": "a"})),
            ("c".to_owned(), json!({"kind": "c"})),
            ("d".to_owned(), json!({"kind": "d"})),
        ],
        "the waiting task ran as it was enqueued"
    );
    for l in &leases {
        s.queue.complete(l, json!(null)).await.expect("complete");
    }
    nothing_left(&s, "default").await;
    let after = s
        .queue
        .enqueue(&[task("g").dedup_key("k1")])
        .await
        .expect("enqueue");
    assert!(after[0].is_some(), "a finished task frees its key");
}

/// A request meeting a running task with its key adds no task beside it:
/// the running task is marked, and its completion enqueues one fresh task
/// of its kind with the key and the request's payload and settings (queue,
/// priority, `run_at`, attempts, timeout). That task holds the key as any
/// other.
pub async fn dedup_key_marks_a_running_task_to_run_again(s: Subject) {
    let first = s.queue.enqueue(&[request(0)]).await.expect("enqueue")[0].expect("new");
    let running = claim_one(&s, 1).await.expect("claim");
    let later = s.clock.now() + Duration::from_secs(10);
    let asked = TaskSpec::new(product(), "reply", json!({"n": 1}))
        .dedup_key("k")
        .queue("mail")
        .priority(3)
        .run_at(later)
        .max_attempts(2)
        .timeout(Duration::from_secs(7));
    s.queue
        .enqueue(&[task("filler").queue("mail").priority(4)])
        .await
        .expect("enqueue");
    folded(&s, &[asked]).await;
    assert!(claim(&s, 2, 10).await.is_empty(), "nothing runs beside it");
    assert_eq!(
        s.queue.depth("mail").await.expect("depth"),
        QueueDepth {
            ready: 1,
            scheduled: 0,
            running: 0
        },
        "only the filler"
    );
    done(&s, &running).await;
    assert_eq!(
        s.queue.depth("mail").await.expect("depth"),
        QueueDepth {
            ready: 1,
            scheduled: 1,
            running: 0
        },
        "the request, enqueued with the completion, waits for its time"
    );
    nothing_left(&s, "default").await;
    s.clock.set(later);
    let mut mail = s
        .queue
        .claim(&worker(2), "mail", 1, LEASE)
        .await
        .expect("claim");
    let rerun = mail.pop().expect("the request runs, before the filler");
    assert_ne!(rerun.task_id, first, "a fresh task");
    assert_eq!(rerun.kind, "turn", "the key names the work: its kind stays");
    assert_eq!(rerun.payload, json!({"n": 1}));
    assert_eq!((rerun.attempt, rerun.max_attempts), (1, 2));
    assert_eq!(rerun.expires_at, later + Duration::from_secs(7));
    // The fresh task holds the key as any task does.
    folded(&s, &[request(2)]).await;
    done(&s, &rerun).await;
    let again = claim_one(&s, 1)
        .await
        .expect("the request made while it ran");
    assert_eq!(again.payload, json!({"n": 2}));
    done(&s, &again).await;
    nothing_left(&s, "default").await;
}

/// A completion that also claims what it frees (`complete_and_claim`)
/// enqueues the request folded into the task as `complete` does, and
/// leaves it to every worker: it takes only a DAG's freed children.
pub async fn complete_and_claim_leaves_the_folded_request_to_every_worker(s: Subject) {
    s.queue.enqueue(&[request(0)]).await.expect("enqueue");
    let running = claim_one(&s, 1).await.expect("claim");
    folded(&s, &[request(1)]).await;
    let taken = s
        .queue
        .complete_and_claim(&running, json!("done"), &["turn".to_owned()], 1, LEASE)
        .await
        .expect("complete and claim");
    assert!(taken.is_empty(), "{taken:?}");
    let rerun = claim_one(&s, 2).await.expect("the request, for any worker");
    assert_eq!(rerun.payload, json!({"n": 1}));
    done(&s, &rerun).await;
    nothing_left(&s, "default").await;
}

/// Several requests while a task runs make one run after it, with the
/// newest request's payload, whether they come in one call or several.
pub async fn requests_while_running_make_one_rerun_with_the_newest_payload(s: Subject) {
    s.queue.enqueue(&[request(0)]).await.expect("enqueue");
    let running = claim_one(&s, 1).await.expect("claim");
    folded(&s, &[request(1)]).await;
    folded(&s, &[request(2), request(3)]).await;
    done(&s, &running).await;
    let leases = claim(&s, 1, 10).await;
    assert_eq!(leases.len(), 1, "one rerun: {leases:?}");
    assert_eq!(leases[0].payload, json!({"n": 3}), "the newest request's");
    done(&s, &leases[0]).await;
    nothing_left(&s, "default").await;
}

/// A task that fails for good still answers the request folded into it:
/// its discard, by the worker or by the sweep of an expired lease with no
/// attempts left, enqueues the request as a fresh task; the discarded one
/// stays for the operator. (Only a DAG's tasks are cancelled, and they
/// carry no dedup key.)
pub async fn a_discarded_task_is_followed_by_the_request_folded_into_it(s: Subject) {
    let first = s.queue.enqueue(&[request(0)]).await.expect("enqueue")[0].expect("new");
    let l = claim_one(&s, 1).await.expect("claim");
    folded(&s, &[request(1)]).await;
    assert_eq!(
        s.queue.fail(&l, "bad input", false).await.expect("fail"),
        FailOutcome::Discarded
    );
    let rerun = claim_one(&s, 1).await.expect("the request runs");
    assert_ne!(rerun.task_id, first);
    assert_eq!((rerun.payload.clone(), rerun.attempt), (json!({"n": 1}), 1));
    let dead = s.queue.list_discarded("default", 10).await.expect("list");
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].id, first,
        "the discarded task stays for the operator"
    );
    done(&s, &rerun).await;
    nothing_left(&s, "default").await;

    let short = Duration::from_secs(10);
    s.queue
        .enqueue(&[request(2).timeout(short).max_attempts(1)])
        .await
        .expect("enqueue");
    let l = claim_one(&s, 1).await.expect("claim");
    folded(&s, &[request(3)]).await;
    s.clock.advance(Duration::from_secs(11));
    s.queue.heartbeat(&worker(1)).await.expect("heartbeat");
    let r = s.queue.recover_expired().await.expect("recover");
    assert_eq!((r.requeued, r.discarded, r.cancelled), (0, 1, 0));
    assert!(
        s.queue
            .complete(&l, json!(1))
            .await
            .unwrap_err()
            .is_lease_lost()
    );
    let rerun = claim_one(&s, 1).await.expect("the request runs");
    assert_eq!(rerun.payload, json!({"n": 3}));
    assert_eq!(rerun.max_attempts, 5, "with the request's own attempts");
    done(&s, &rerun).await;
    nothing_left(&s, "default").await;
}

/// A task requeued after a request was folded into it (a retryable
/// failure, an expired lease, a release, a release of unheld leases) runs
/// once more, as that request: its payload and settings, its attempts
/// counted afresh; and nothing more after that.
pub async fn a_requeued_task_runs_once_more_as_the_request_folded_into_it(s: Subject) {
    // A retryable failure.
    let id = s
        .queue
        .enqueue(&[request(0).max_attempts(3)])
        .await
        .expect("enqueue")[0]
        .expect("new");
    let l = claim_one(&s, 1).await.expect("claim");
    folded(&s, &[request(1).max_attempts(4)]).await;
    let FailOutcome::Retrying { run_at } = s.queue.fail(&l, "503", true).await.expect("fail")
    else {
        panic!("retried")
    };
    assert!(claim(&s, 1, 10).await.is_empty(), "not before its back-off");
    s.clock.set(run_at);
    let again = claim_one(&s, 1).await.expect("runs again");
    assert_eq!(again.task_id, id, "the same task");
    assert_eq!(again.payload, json!({"n": 1}));
    assert_eq!((again.attempt, again.max_attempts), (1, 4));
    done(&s, &again).await;
    nothing_left(&s, "default").await;

    // An expired lease.
    let id = s
        .queue
        .enqueue(&[request(2).timeout(Duration::from_secs(10))])
        .await
        .expect("enqueue")[0]
        .expect("new");
    let l = claim_one(&s, 1).await.expect("claim");
    folded(&s, &[request(3)]).await;
    s.clock.advance(Duration::from_secs(11));
    s.queue.heartbeat(&worker(1)).await.expect("heartbeat");
    let r = s.queue.recover_expired().await.expect("recover");
    assert_eq!((r.requeued, r.discarded), (1, 0));
    assert!(
        s.queue
            .complete(&l, json!(1))
            .await
            .unwrap_err()
            .is_lease_lost()
    );
    let again = claim_one(&s, 1).await.expect("runs again");
    assert_eq!(
        (again.task_id, again.payload.clone()),
        (id, json!({"n": 3}))
    );
    assert_eq!(again.attempt, 1);
    assert_eq!(
        again.expires_at,
        s.clock.now() + LEASE,
        "the request's timeout (none): the claim's lease"
    );
    done(&s, &again).await;
    nothing_left(&s, "default").await;

    // A release, and a release of what a worker does not hold.
    for unheld in [false, true] {
        let id = s.queue.enqueue(&[request(4)]).await.expect("enqueue")[0].expect("new");
        let l = claim_one(&s, 7).await.expect("claim");
        folded(&s, &[request(5)]).await;
        if unheld {
            let n = s
                .queue
                .release_unheld(&worker(7), &[])
                .await
                .expect("release unheld");
            assert_eq!(n, 1);
        } else {
            s.queue.release(&l).await.expect("release");
        }
        let again = claim_one(&s, 1).await.expect("runs again");
        assert_eq!(
            (again.task_id, again.payload.clone()),
            (id, json!({"n": 5}))
        );
        done(&s, &again).await;
        nothing_left(&s, "default").await;
    }
}

/// Enqueues racing the completion of the running task with their key, round
/// after round: each round ends with exactly one live task with the key,
/// carrying one of that round's requests. It is the task one of the
/// enqueues inserted (that enqueue alone answered an id), or the one the
/// completion enqueued for the requests folded into it.
pub async fn racing_enqueues_and_a_completion_lose_no_request(s: Subject) {
    const ROUNDS: u32 = 30;
    const RACERS: u32 = 6;
    s.queue.enqueue(&[request(0)]).await.expect("enqueue");
    let mut live = claim_one(&s, 1).await.expect("claim");
    let (mut inserted, mut rerun) = (0, 0);
    for round in 1..=ROUNDS {
        let start = Arc::new(tokio::sync::Barrier::new(RACERS as usize + 1));
        let mut racers = Vec::new();
        for i in 0..RACERS {
            let (q, start) = (Arc::clone(&s.queue), Arc::clone(&start));
            racers.push(tokio::spawn(async move {
                start.wait().await;
                q.enqueue(&[request(round * 100 + i)])
                    .await
                    .expect("enqueue")[0]
            }));
        }
        let completing = {
            let (q, start, lease) = (Arc::clone(&s.queue), Arc::clone(&start), live.clone());
            tokio::spawn(async move {
                start.wait().await;
                q.complete(&lease, json!(round)).await
            })
        };
        let mut ids = Vec::new();
        for r in racers {
            ids.extend(r.await.expect("racer"));
        }
        completing.await.expect("completer").expect("complete");
        let leases = claim(&s, 1, 10).await;
        assert_eq!(leases.len(), 1, "round {round}: one live task: {leases:?}");
        let next = leases.into_iter().next().expect("one");
        let n = next.payload["n"].as_u64().expect("a request's payload");
        assert_eq!(
            n / 100,
            u64::from(round),
            "round {round}: a request of this round"
        );
        match ids.as_slice() {
            [] => {
                assert_ne!(next.task_id, live.task_id, "round {round}: a fresh task");
                rerun += 1;
            }
            [id] => {
                assert_eq!(next.task_id, *id, "round {round}: the inserted task");
                inserted += 1;
            }
            more => panic!("round {round}: two tasks were inserted: {more:?}"),
        }
        live = next;
    }
    assert_eq!(inserted + rerun, ROUNDS);
    s.queue
        .complete(&live, json!("last"))
        .await
        .expect("complete");
    nothing_left(&s, "default").await;
}

/// A worker that stops heartbeating loses its tasks to another worker once
/// it has been silent for the configured 30 s, and not before.
pub async fn silent_worker_loses_its_tasks(s: Subject) {
    s.queue.enqueue(&[task("a")]).await.expect("enqueue");
    let a = claim_one(&s, 1).await.expect("claimed by the first worker");
    s.queue.heartbeat(&worker(2)).await.expect("heartbeat");
    s.clock.advance(Duration::from_secs(20));
    s.queue.heartbeat(&worker(2)).await.expect("heartbeat");
    let r = s.queue.recover_expired().await.expect("recover");
    assert_eq!(r.requeued, 0, "20 s of silence is not yet dead");
    assert!(claim_one(&s, 2).await.is_none());
    s.clock.advance(Duration::from_secs(11));
    s.queue.heartbeat(&worker(2)).await.expect("heartbeat");
    let r = s.queue.recover_expired().await.expect("recover");
    assert_eq!((r.requeued, r.discarded), (1, 0));
    let b = claim_one(&s, 2).await.expect("taken over");
    assert_eq!(b.task_id, a.task_id);
    assert_eq!(b.attempt, 2);
    assert_ne!(b.token, a.token);
    let err = s.queue.complete(&a, json!("late")).await.unwrap_err();
    assert!(err.is_lease_lost(), "{err}");
    s.queue.complete(&b, json!("ok")).await.expect("complete");
    // A worker that keeps heartbeating keeps its task, however long it runs.
    s.queue.enqueue(&[task("long")]).await.expect("enqueue");
    let long = claim_one(&s, 2).await.expect("claim");
    for _ in 0..5 {
        s.clock.advance(Duration::from_secs(20));
        s.queue.heartbeat(&worker(2)).await.expect("heartbeat");
        assert_eq!(
            s.queue.recover_expired().await.expect("recover").requeued,
            0
        );
    }
    s.queue.complete(&long, json!(1)).await.expect("still held");
}

/// Past its deadline a task goes back even from a live worker; with no
/// attempts left it is discarded, and the operator can retry it.
pub async fn expired_deadline_requeues_then_discards(s: Subject) {
    let spec = task("slow")
        .timeout(Duration::from_secs(10))
        .max_attempts(2);
    let id = s.queue.enqueue(&[spec]).await.expect("enqueue")[0].expect("new");
    let first = claim_one(&s, 1).await.expect("claim");
    s.clock.advance(Duration::from_secs(9));
    s.queue.heartbeat(&worker(1)).await.expect("heartbeat");
    assert_eq!(
        s.queue.recover_expired().await.expect("recover").requeued,
        0
    );
    s.clock.advance(Duration::from_secs(2));
    s.queue.heartbeat(&worker(1)).await.expect("heartbeat");
    let r = s.queue.recover_expired().await.expect("recover");
    assert_eq!((r.requeued, r.discarded), (1, 0));
    assert!(
        s.queue
            .complete(&first, json!(1))
            .await
            .unwrap_err()
            .is_lease_lost()
    );
    let second = claim_one(&s, 1).await.expect("claim again");
    assert_eq!(second.attempt, 2);
    s.clock.advance(Duration::from_secs(11));
    s.queue.heartbeat(&worker(1)).await.expect("heartbeat");
    let r = s.queue.recover_expired().await.expect("recover");
    assert_eq!((r.requeued, r.discarded), (0, 1));
    assert!(
        claim_one(&s, 1).await.is_none(),
        "discarded tasks do not run"
    );
    s.queue
        .retry_discarded(&product(), id)
        .await
        .expect("operator retry");
    let third = claim_one(&s, 1).await.expect("claimable again");
    assert_eq!(third.task_id, id);
    assert_eq!(third.attempt, 1, "a retried task gets a fresh budget");
    let err = s.queue.retry_discarded(&product(), id).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

/// Complete, fail and release with a lost lease change nothing.
pub async fn fenced_operations_after_lease_loss_are_rejected(s: Subject) {
    s.queue
        .enqueue(&[task("a").timeout(Duration::from_secs(5))])
        .await
        .expect("enqueue");
    let stale = claim_one(&s, 1).await.expect("claim");
    s.clock.advance(Duration::from_secs(6));
    s.queue.recover_expired().await.expect("recover");
    let fresh = claim_one(&s, 2).await.expect("re-claimed");
    for err in [
        s.queue.complete(&stale, json!("zombie")).await.unwrap_err(),
        s.queue.fail(&stale, "zombie", true).await.unwrap_err(),
        s.queue.release(&stale).await.unwrap_err(),
    ] {
        assert!(err.is_lease_lost(), "{err}");
        assert!(err.is_conflict());
    }
    // The fresh lease is untouched by the zombie's attempts.
    s.queue
        .complete(&fresh, json!("ok"))
        .await
        .expect("complete");
    let twice = s.queue.complete(&fresh, json!("again")).await.unwrap_err();
    assert!(twice.is_lease_lost(), "a lease completes once");
    assert!(claim_one(&s, 2).await.is_none());
}

/// Completing, failing and releasing `forged` each answer lease lost.
async fn assert_lease_lost(s: &Subject, forged: &Lease) {
    for err in [
        s.queue.complete(forged, json!("forged")).await.unwrap_err(),
        s.queue.fail(forged, "forged", false).await.unwrap_err(),
        s.queue.release(forged).await.unwrap_err(),
    ] {
        assert!(err.is_lease_lost(), "{err}");
    }
}

/// A lease is its task, its token and its worker: the same token presented
/// for another worker is refused and changes nothing.
pub async fn fence_names_the_worker(s: Subject) {
    s.queue.enqueue(&[task("a")]).await.expect("enqueue");
    let held = claim_one(&s, 1).await.expect("claim");
    let forged = Lease {
        worker: worker(2),
        ..held.clone()
    };
    assert_lease_lost(&s, &forged).await;
    s.queue
        .complete(&held, json!("ok"))
        .await
        .expect("the holder completes");
}

/// Retryable failures come back after exponential back-off; a permanent one
/// dead-letters the task.
pub async fn failed_attempts_back_off_then_dead_letter(s: Subject) {
    s.queue
        .enqueue(&[task("flaky").max_attempts(3)])
        .await
        .expect("enqueue");
    let t0 = s.clock.now();
    let l1 = claim_one(&s, 1).await.expect("claim");
    let FailOutcome::Retrying { run_at } = s.queue.fail(&l1, "503", true).await.expect("fail")
    else {
        panic!("first failure retries")
    };
    let wait = run_at.seconds_since(t0);
    assert!(
        (1.0..=2.0).contains(&wait),
        "first back-off in [1 s, 2 s]: {wait}"
    );
    assert!(claim_one(&s, 1).await.is_none(), "not before the back-off");
    s.clock.set(run_at);
    let l2 = claim_one(&s, 1).await.expect("due again");
    assert_eq!(l2.attempt, 2);
    let t1 = s.clock.now();
    let FailOutcome::Retrying { run_at } = s.queue.fail(&l2, "503", true).await.expect("fail")
    else {
        panic!("second failure retries")
    };
    let wait = run_at.seconds_since(t1);
    assert!(
        (2.0..=4.0).contains(&wait),
        "second back-off in [2 s, 4 s]: {wait}"
    );
    s.clock.set(run_at);
    let l3 = claim_one(&s, 1).await.expect("due again");
    assert_eq!(
        s.queue.fail(&l3, "still 503", true).await.expect("fail"),
        FailOutcome::Discarded,
        "attempts exhausted"
    );
    s.queue.enqueue(&[task("bad")]).await.expect("enqueue");
    let l = claim_one(&s, 1).await.expect("claim");
    assert_eq!(
        s.queue.fail(&l, "bad input", false).await.expect("fail"),
        FailOutcome::Discarded,
        "a permanent error skips retries"
    );
    s.queue
        .retry_discarded(&product(), l.task_id)
        .await
        .expect("retry");
    assert_eq!(claim_one(&s, 1).await.expect("back").task_id, l.task_id);
}

/// A released task is available at once and the attempt does not count.
pub async fn release_gives_the_attempt_back(s: Subject) {
    s.queue
        .enqueue(&[task("a").max_attempts(1)])
        .await
        .expect("enqueue");
    let l = claim_one(&s, 1).await.expect("claim");
    s.queue.release(&l).await.expect("release");
    let again = claim_one(&s, 2).await.expect("available again");
    assert_eq!(again.attempt, 1);
    assert!(s.queue.release(&l).await.unwrap_err().is_lease_lost());
    s.queue.complete(&again, json!(1)).await.expect("complete");
}

/// A worker's leases other than those it holds are given back (the
/// attempt not counted); other workers' leases are untouched.
pub async fn release_unheld_gives_back_what_the_worker_does_not_hold(s: Subject) {
    s.queue
        .enqueue(&[task("a"), task("b"), task("c")])
        .await
        .expect("enqueue");
    let mine = claim(&s, 1, 10).await;
    assert_eq!(mine.len(), 3);
    let me = mine[0].worker;
    let released = s
        .queue
        .release_unheld(&me, &[mine[0].task_id])
        .await
        .expect("release unheld");
    assert_eq!(released, 2);
    let theirs = claim(&s, 2, 10).await;
    let mut ids: Vec<TaskId> = theirs.iter().map(|l| l.task_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [mine[1].task_id, mine[2].task_id]);
    assert!(
        theirs.iter().all(|l| l.attempt == 1),
        "the attempt does not count"
    );
    assert!(
        s.queue
            .complete(&mine[1], json!(1))
            .await
            .unwrap_err()
            .is_lease_lost()
    );
    assert_eq!(
        s.queue.release_unheld(&me, &[]).await.expect("again"),
        1,
        "only its own lease"
    );
    for l in &theirs {
        s.queue.complete(l, json!(1)).await.expect("still theirs");
    }
}

/// A batch completion records the held leases and reports each lost one,
/// DAG nodes included.
pub async fn complete_many_fences_each_item(s: Subject) {
    let specs: Vec<TaskSpec> = (0..4).map(|i| task(&format!("t{i}"))).collect();
    s.queue.enqueue(&specs).await.expect("enqueue");
    let dag = DagSpec::new(product())
        .node(NodeSpec::new("a", "step", json!({})))
        .node(NodeSpec::new("b", "step", json!({})))
        .edge("a", "b");
    let run = s.queue.enqueue_dag(&dag).await.expect("enqueue dag");
    let leases = claim(&s, 1, 10).await;
    assert_eq!(leases.len(), 5);
    // The first task is lost before the batch lands.
    s.queue.release(&leases[0]).await.expect("release");
    let batch: Vec<(Lease, Value)> = leases.iter().map(|l| (l.clone(), json!(l.kind))).collect();
    let out = s.queue.complete_many(&batch).await.expect("complete many");
    assert_eq!(out.len(), 5);
    assert!(out[0].as_ref().unwrap_err().is_lease_lost());
    assert!(out[1..].iter().all(Result::is_ok), "{out:?}");
    let again = s
        .queue
        .complete_many(&batch[1..2])
        .await
        .expect("complete many");
    assert!(
        again[0].as_ref().unwrap_err().is_lease_lost(),
        "completes once"
    );
    let b = claim(&s, 1, 10).await;
    let keys: Vec<String> = b.iter().filter(|l| l.dag.is_some()).map(node_key).collect();
    assert_eq!(keys, ["b"], "the node's completion freed its child");
    assert_eq!(b.len(), 2, "b and the released task");
    let st = s.queue.dag_status(&product(), run).await.expect("status");
    assert_eq!(st.done, 1);
}

/// Discarded tasks are listed newest first with their error; other queues
/// and live tasks are not.
pub async fn dead_letters_are_listed_for_the_operator(s: Subject) {
    s.queue
        .enqueue(&[task("a"), task("b"), task("c"), task("d").queue("other")])
        .await
        .expect("enqueue");
    let leases = claim(&s, 1, 3).await;
    s.queue
        .fail(&leases[0], "first", false)
        .await
        .expect("fail");
    s.clock.advance(Duration::from_secs(1));
    s.queue
        .fail(&leases[1], "second", false)
        .await
        .expect("fail");
    let other = s
        .queue
        .claim(&worker(1), "other", 1, LEASE)
        .await
        .expect("claim");
    s.queue
        .fail(&other[0], "elsewhere", false)
        .await
        .expect("fail");
    let dead = s.queue.list_discarded("default", 10).await.expect("list");
    let got: Vec<(TaskId, Option<String>, u32)> = dead
        .iter()
        .map(|d| (d.id, d.last_error.clone(), d.attempts))
        .collect();
    assert_eq!(
        got,
        [
            (leases[1].task_id, Some("second".to_owned()), 1),
            (leases[0].task_id, Some("first".to_owned()), 1),
        ]
    );
    assert_eq!(dead[0].kind, "b");
    assert_eq!(dead[0].product_id, product());
    assert_eq!(dead[0].discarded_at, s.clock.now());
    assert!(dead[0].dag_id.is_none());
    assert_eq!(
        s.queue
            .list_discarded("default", 1)
            .await
            .expect("list")
            .len(),
        1
    );
    s.queue
        .retry_discarded(&product(), leases[0].task_id)
        .await
        .expect("retry");
    assert_eq!(
        s.queue
            .list_discarded("default", 10)
            .await
            .expect("list")
            .len(),
        1
    );
}

/// Claims one task at a time and completes it with `f(lease)`, returning the
/// node keys in the order they ran.
async fn drain(s: &Subject, f: impl Fn(&Lease) -> Value) -> Vec<String> {
    let mut order = Vec::new();
    while let Some(l) = claim_one(s, 9).await {
        order.push(node_key(&l));
        s.queue.complete(&l, f(&l)).await.expect("complete");
    }
    order
}

/// Concatenates the inputs' strings and the node's key.
fn concat(l: &Lease) -> Value {
    let mut out: String = inputs(l)
        .iter()
        .map(|(_, v)| v.as_str().unwrap_or("?").to_owned())
        .collect();
    out.push_str(&node_key(l));
    json!(out)
}

/// A chain runs in order, each node receiving its parent's result.
pub async fn dag_chain_passes_results_in_order(s: Subject) {
    let dag = DagSpec::new(product())
        .node(NodeSpec::new("a", "step", json!({"n": 1})).label("first"))
        .node(NodeSpec::new("b", "step", json!({"n": 2})).label("second"))
        .node(NodeSpec::new("c", "step", json!({"n": 3})))
        .edge("a", "b")
        .edge("b", "c");
    let id = s.queue.enqueue_dag(&dag).await.expect("enqueue dag");
    let st = s.queue.dag_status(&product(), id).await.expect("status");
    assert_eq!((st.state, st.total, st.done), (DagState::Running, 3, 0));
    assert_eq!(st.labels, ["first"]);
    assert_eq!(st.product_id, product());
    let a = claim_one(&s, 1).await.expect("root runnable");
    assert_eq!(node_key(&a), "a");
    assert_eq!(a.payload, json!({"n": 1}));
    assert!(inputs(&a).is_empty());
    assert!(claim_one(&s, 1).await.is_none(), "b waits for a");
    s.queue.complete(&a, concat(&a)).await.expect("complete");
    let st = s.queue.dag_status(&product(), id).await.expect("status");
    assert_eq!((st.done, st.labels.clone()), (1, vec!["second".to_owned()]));
    let b = claim_one(&s, 1).await.expect("b runnable");
    assert_eq!(inputs(&b), [("a".to_owned(), json!("a"))]);
    s.queue.complete(&b, concat(&b)).await.expect("complete");
    assert_eq!(drain(&s, concat).await, ["c"]);
    let st = s.queue.dag_status(&product(), id).await.expect("status");
    assert_eq!((st.state, st.total, st.done), (DagState::Completed, 3, 3));
    assert!(st.labels.is_empty() && st.error.is_none());
    let results = s.queue.dag_results(&product(), id).await.expect("results");
    let got: Vec<(String, NodeState, Option<Value>)> = results
        .into_iter()
        .map(|r| (r.key, r.state, r.result))
        .collect();
    assert_eq!(
        got,
        [
            ("a".to_owned(), NodeState::Completed, Some(json!("a"))),
            ("b".to_owned(), NodeState::Completed, Some(json!("ab"))),
            ("c".to_owned(), NodeState::Completed, Some(json!("abc"))),
        ]
    );
}

/// A completion that also claims takes, for the completing worker, the
/// children it freed of the kinds asked for (at most `max`, with fresh
/// fencing tokens and their inputs); freed children it does not take stay
/// claimable by any worker; a join is taken only by the completion that
/// frees it; a lost lease completes nothing and takes nothing.
pub async fn complete_and_claim_takes_the_freed_children(s: Subject) {
    let dag = DagSpec::new(product())
        .node(NodeSpec::new("a", "step", json!({"n": 1})))
        .node(NodeSpec::new("b", "step", json!({"n": 2})))
        .node(NodeSpec::new("c", "other", json!({"n": 3})))
        .node(NodeSpec::new("d", "step", json!({"n": 4})))
        .edge("a", "b")
        .edge("a", "c")
        .edge("b", "d")
        .edge("c", "d");
    let id = s.queue.enqueue_dag(&dag).await.expect("enqueue dag");
    let a = claim_one(&s, 1).await.expect("root runnable");
    let step = ["step".to_owned()];
    let taken = s
        .queue
        .complete_and_claim(&a, json!("a"), &step, 1, LEASE)
        .await
        .expect("complete and claim");
    assert_eq!(taken.len(), 1, "b is freed and of a kind asked for");
    let b = &taken[0];
    assert_eq!(node_key(b), "b");
    assert_eq!(
        (b.worker, b.attempt, b.payload.clone()),
        (worker(1), 1, json!({"n": 2}))
    );
    assert_eq!(inputs(b), [("a".to_owned(), json!("a"))]);
    assert_ne!(b.token, a.token);
    let again = s
        .queue
        .complete_and_claim(&a, json!("a"), &step, 1, LEASE)
        .await
        .expect_err("a is completed");
    assert!(again.is_lease_lost(), "{again}");
    // `c` was not taken (another kind): any worker claims it.
    let c = claim_one(&s, 2).await.expect("c left to the others");
    assert_eq!(node_key(&c), "c");
    assert!(claim_one(&s, 2).await.is_none(), "b is leased, d waits");
    let none = s
        .queue
        .complete_and_claim(b, json!("ab"), &step, 1, LEASE)
        .await
        .expect("complete b");
    assert!(none.is_empty(), "d still waits for c");
    let joined = s
        .queue
        .complete_and_claim(&c, json!("ac"), &step, 1, LEASE)
        .await
        .expect("complete c");
    assert_eq!(joined.len(), 1, "c's completion frees the join");
    let d = &joined[0];
    assert_eq!((node_key(d), d.worker), ("d".to_owned(), worker(2)));
    assert_eq!(
        inputs(d),
        [("b".to_owned(), json!("ab")), ("c".to_owned(), json!("ac"))]
    );
    assert!(claim_one(&s, 3).await.is_none(), "d runs once");
    s.queue
        .complete(d, json!("abcd"))
        .await
        .expect("complete d");
    let st = s.queue.dag_status(&product(), id).await.expect("status");
    assert_eq!((st.state, st.done), (DagState::Completed, 4));
}

/// A fan-out runs in parallel; the join runs once, after all branches, with
/// their results in declared edge order whatever order they finished in.
pub async fn dag_fan_out_fan_in_joins_once_in_edge_order(s: Subject) {
    let mut dag = DagSpec::new(product()).node(NodeSpec::new("root", "step", json!({})));
    for i in 1..=5 {
        dag = dag
            .node(NodeSpec::new(format!("x{i}"), "step", json!({})).label("branch"))
            .edge("root", format!("x{i}"));
    }
    dag = dag.node(NodeSpec::new("join", "step", json!({})));
    for i in 1..=5 {
        dag = dag.edge(format!("x{i}"), "join");
    }
    let id = s.queue.enqueue_dag(&dag).await.expect("enqueue dag");
    assert_eq!(drain(&s, concat).await.len(), 7);
    let id2 = {
        let id2 = s.queue.enqueue_dag(&dag).await.expect("enqueue dag");
        let root = claim_one(&s, 1).await.expect("root");
        s.queue.complete(&root, json!("r")).await.expect("complete");
        let mut branches = claim(&s, 1, 10).await;
        assert_eq!(branches.len(), 5, "all branches runnable at once");
        let st = s.queue.dag_status(&product(), id2).await.expect("status");
        assert_eq!(st.labels, ["branch"]);
        branches.reverse();
        for (n, b) in branches.iter().enumerate() {
            assert_eq!(inputs(b), [("root".to_owned(), json!("r"))]);
            s.queue
                .complete(b, json!(node_key(b)))
                .await
                .expect("complete");
            let waiting = claim(&s, 1, 10).await;
            if n < 4 {
                assert!(
                    waiting.is_empty(),
                    "join fired early after {} branches",
                    n + 1
                );
            } else {
                assert_eq!(waiting.len(), 1, "join fires exactly once");
                let j = &waiting[0];
                assert_eq!(node_key(j), "join");
                let want: Vec<(String, Value)> = (1..=5)
                    .map(|i| (format!("x{i}"), json!(format!("x{i}"))))
                    .collect();
                assert_eq!(inputs(j), want, "inputs in declared edge order");
                s.queue
                    .complete(j, json!("joined"))
                    .await
                    .expect("complete");
            }
        }
        id2
    };
    for run in [id, id2] {
        let st = s.queue.dag_status(&product(), run).await.expect("status");
        assert_eq!((st.state, st.total, st.done), (DagState::Completed, 7, 7));
    }
    assert!(claim(&s, 1, 10).await.is_empty());
}

/// Twenty branches completed by eight racing workers: the join is enqueued
/// exactly once, after the last branch, and the run counts every node.
pub async fn concurrent_branch_completions_fire_the_join_once(s: Subject) {
    const BRANCHES: usize = 20;
    let mut dag = DagSpec::new(product()).node(NodeSpec::new("join", "step", json!({})));
    for i in 0..BRANCHES {
        dag = dag
            .node(NodeSpec::new(format!("b{i:02}"), "step", json!({})))
            .edge(format!("b{i:02}"), "join");
    }
    let id = s.queue.enqueue_dag(&dag).await.expect("enqueue dag");
    let mut handles = Vec::new();
    for w in 0..8u128 {
        let q = Arc::clone(&s.queue);
        handles.push(tokio::spawn(async move {
            let mut joins = 0;
            loop {
                let got = q
                    .claim(&worker(w + 1), "default", 2, LEASE)
                    .await
                    .expect("claim");
                if got.is_empty() {
                    break;
                }
                for l in &got {
                    if node_key(l) == "join" {
                        joins += 1;
                        assert_eq!(inputs(l).len(), BRANCHES);
                    }
                }
                if w % 2 == 0 {
                    // Half the workers record their batch in one call.
                    let batch: Vec<(Lease, Value)> = got
                        .iter()
                        .map(|l| (l.clone(), json!(node_key(l))))
                        .collect();
                    let out = q.complete_many(&batch).await.expect("complete many");
                    assert!(out.iter().all(Result::is_ok), "{out:?}");
                } else {
                    for l in got {
                        q.complete(&l, json!(node_key(&l))).await.expect("complete");
                    }
                }
            }
            joins
        }));
    }
    let mut joins = 0;
    for h in handles {
        joins += h.await.expect("worker");
    }
    // A worker may have stopped just before the join was enqueued.
    while let Some(l) = claim_one(&s, 99).await {
        assert_eq!(node_key(&l), "join");
        joins += 1;
        s.queue.complete(&l, json!("join")).await.expect("complete");
    }
    assert_eq!(joins, 1, "the join ran exactly once");
    let st = s.queue.dag_status(&product(), id).await.expect("status");
    let n = u32::try_from(BRANCHES + 1).expect("small");
    assert_eq!((st.state, st.total, st.done), (DagState::Completed, n, n));
}

/// A tiny deterministic generator, so the random cases replay exactly.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random DAGs drained in random batch sizes and completion orders: every
/// node is claimed once, only after all its parents completed, with their
/// results in declared edge order; each run ends completed with
/// `done == total`.
pub async fn random_dags_run_each_node_once_after_its_parents(s: Subject) {
    let mut rng = Lcg(0x5eed);
    for _ in 0..6 {
        let n = 2 + rng.below(10) as usize;
        let mut dag = DagSpec::new(product());
        for i in 0..n {
            dag = dag.node(NodeSpec::new(format!("n{i}"), "step", json!({"i": i})));
        }
        let mut parents: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (j, ps) in parents.iter_mut().enumerate().skip(1) {
            for i in 0..j {
                if rng.below(10) < 3 {
                    dag = dag.edge(format!("n{i}"), format!("n{j}"));
                    ps.push(i);
                }
            }
        }
        // Declared edge order per child is by parent index here, since edges
        // were added child by child in increasing parent order.
        let id = s.queue.enqueue_dag(&dag).await.expect("enqueue dag");
        let mut done = vec![false; n];
        let mut claimed = vec![0u32; n];
        loop {
            let max = 1 + rng.below(4) as usize;
            let mut got = claim(&s, 1 + u128::from(rng.below(3) as u8), max).await;
            if got.is_empty() {
                break;
            }
            // Finish in a random order, sometimes as one batch.
            for k in (1..got.len()).rev() {
                got.swap(k, rng.below(k as u64 + 1) as usize);
            }
            let mut batch = Vec::new();
            for l in &got {
                let key = node_key(l);
                let i: usize = key[1..].parse().expect("n<i>");
                claimed[i] += 1;
                assert_eq!(claimed[i], 1, "{key} claimed twice");
                assert!(parents[i].iter().all(|&p| done[p]), "{key} ran early");
                let want: Vec<(String, Value)> = parents[i]
                    .iter()
                    .map(|p| (format!("n{p}"), json!(format!("r{p}"))))
                    .collect();
                assert_eq!(inputs(l), want, "{key} inputs");
                batch.push((l.clone(), json!(format!("r{i}"))));
            }
            if rng.below(2) == 0 {
                let out = s.queue.complete_many(&batch).await.expect("complete many");
                assert!(out.iter().all(Result::is_ok), "{out:?}");
            } else {
                for (l, v) in &batch {
                    s.queue.complete(l, v.clone()).await.expect("complete");
                }
            }
            for (l, _) in &batch {
                let i: usize = node_key(l)[1..].parse().expect("n<i>");
                done[i] = true;
            }
        }
        assert!(done.iter().all(|d| *d), "every node ran: {done:?}");
        let st = s.queue.dag_status(&product(), id).await.expect("status");
        let total = u32::try_from(n).expect("small");
        assert_eq!(
            (st.state, st.total, st.done),
            (DagState::Completed, total, total)
        );
    }
}

/// A map node's list fans out at run time: one node per element, results
/// combined in element order, `total` grown to match, children fed the
/// combined list.
pub async fn dag_dynamic_map_grows_total(s: Subject) {
    let dag = DagSpec::new(product())
        .node(NodeSpec::new("list", "split", json!({})).map(MapSpec {
            kind: "square".to_owned(),
            payload: json!({"op": "square"}),
            label: Some("squaring".to_owned()),
        }))
        .node(NodeSpec::new("sum", "sum", json!({})))
        .edge("list", "sum");
    let id = s.queue.enqueue_dag(&dag).await.expect("enqueue dag");
    let list = claim_one(&s, 1).await.expect("list");
    s.queue
        .complete(&list, json!([1, 2, 3, 4]))
        .await
        .expect("complete");
    let st = s.queue.dag_status(&product(), id).await.expect("status");
    assert_eq!((st.total, st.done), (2 + 4 + 1, 1));
    assert_eq!(st.labels, ["squaring"]);
    let mut elements = claim(&s, 1, 10).await;
    assert_eq!(elements.len(), 4);
    elements.sort_by_key(node_key);
    for (i, e) in elements.iter().enumerate() {
        assert_eq!(node_key(e), format!("list[{i}]"));
        assert_eq!(e.kind, "square");
        assert_eq!(e.payload, json!({"op": "square"}));
        assert_eq!(inputs(e), [("list".to_owned(), json!(i + 1))]);
    }
    // Finish out of order: the combined list still follows element order.
    for e in elements.iter().rev() {
        let x = inputs(e)[0].1.as_i64().expect("a number");
        s.queue.complete(e, json!(x * x)).await.expect("complete");
    }
    let sum = claim_one(&s, 1).await.expect("sum runnable once");
    assert_eq!(
        inputs(&sum),
        [("list#combine".to_owned(), json!([1, 4, 9, 16]))]
    );
    s.queue.complete(&sum, json!(30)).await.expect("complete");
    let st = s.queue.dag_status(&product(), id).await.expect("status");
    assert_eq!((st.state, st.total, st.done), (DagState::Completed, 7, 7));
    let results: HashMap<String, Option<Value>> = s
        .queue
        .dag_results(&product(), id)
        .await
        .expect("results")
        .into_iter()
        .map(|r| (r.key, r.result))
        .collect();
    assert_eq!(results.len(), 7);
    assert_eq!(results["list#combine"], Some(json!([1, 4, 9, 16])));
    assert_eq!(results["sum"], Some(json!(30)));
    let keys: Vec<String> = s
        .queue
        .dag_results(&product(), id)
        .await
        .expect("results")
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(
        keys,
        [
            "list",
            "sum",
            "list[0]",
            "list[1]",
            "list[2]",
            "list[3]",
            "list#combine"
        ]
    );
}

/// Mapping over an empty list completes the combine node with `[]` at once.
pub async fn dag_empty_map_still_completes(s: Subject) {
    let dag = DagSpec::new(product())
        .node(NodeSpec::new("list", "split", json!({})).map(MapSpec {
            kind: "square".to_owned(),
            payload: json!({}),
            label: None,
        }))
        .node(NodeSpec::new("after", "step", json!({})))
        .edge("list", "after");
    let id = s.queue.enqueue_dag(&dag).await.expect("enqueue dag");
    let list = claim_one(&s, 1).await.expect("list");
    s.queue.complete(&list, json!([])).await.expect("complete");
    let after = claim_one(&s, 1).await.expect("after runnable");
    assert_eq!(inputs(&after), [("list#combine".to_owned(), json!([]))]);
    done(&s, &after).await;
    let st = s.queue.dag_status(&product(), id).await.expect("status");
    assert_eq!((st.state, st.total, st.done), (DagState::Completed, 3, 3));
}

/// A discarded node fails the run with its error, cancels the queued
/// siblings and everything downstream; a sibling already running may still
/// finish, but nothing new starts.
pub async fn failing_node_fails_dag_and_cancels_queued_siblings(s: Subject) {
    let mut dag = DagSpec::new(product())
        .node(NodeSpec::new("root", "step", json!({})))
        .node(NodeSpec::new("join", "step", json!({})));
    for (k, attempts) in [("a", 1), ("b", 1), ("c", 3), ("d", 1)] {
        dag = dag
            .node(NodeSpec::new(k, "step", json!({})).max_attempts(attempts))
            .edge("root", k)
            .edge(k, "join");
    }
    let id = s.queue.enqueue_dag(&dag).await.expect("enqueue dag");
    let root = claim_one(&s, 1).await.expect("root");
    s.queue.complete(&root, json!("r")).await.expect("complete");
    let three = claim(&s, 1, 3).await;
    assert_eq!(three.len(), 3);
    let (failing, running, flaky) = (&three[0], &three[1], &three[2]);
    assert_eq!(
        s.queue
            .fail(failing, "model refused", true)
            .await
            .expect("fail"),
        FailOutcome::Discarded,
        "one attempt only"
    );
    let st = s.queue.dag_status(&product(), id).await.expect("status");
    assert_eq!(st.state, DagState::Failed);
    let err = st.error.expect("the error is reported");
    assert_eq!(err.node, node_key(failing));
    assert_eq!(err.message, "model refused");
    assert!(
        claim(&s, 1, 10).await.is_empty(),
        "queued siblings cancelled"
    );
    s.queue
        .complete(running, json!("late"))
        .await
        .expect("a running sibling may finish");
    assert_eq!(
        s.queue.fail(flaky, "503", true).await.expect("fail"),
        FailOutcome::Cancelled,
        "a sibling is not retried once its run has failed"
    );
    assert!(claim(&s, 1, 10).await.is_empty(), "the join never runs");
    let states: HashMap<String, NodeState> = s
        .queue
        .dag_results(&product(), id)
        .await
        .expect("results")
        .into_iter()
        .map(|r| (r.key, r.state))
        .collect();
    assert_eq!(states["root"], NodeState::Completed);
    assert_eq!(states[&node_key(failing)], NodeState::Failed);
    assert_eq!(states[&node_key(running)], NodeState::Completed);
    assert_eq!(states[&node_key(flaky)], NodeState::Cancelled);
    assert_eq!(states["join"], NodeState::Cancelled);
    let cancelled = states
        .values()
        .filter(|s| **s == NodeState::Cancelled)
        .count();
    assert_eq!(
        cancelled, 3,
        "the queued sibling, the retried one and the join"
    );
    let st = s.queue.dag_status(&product(), id).await.expect("status");
    assert_eq!((st.state, st.done), (DagState::Failed, 2));
    assert!(st.labels.is_empty());
}

/// The sweeper does not bring back a task of a run that is over.
pub async fn expired_task_of_a_failed_run_is_cancelled(s: Subject) {
    let dag = DagSpec::new(product())
        .node(NodeSpec::new("a", "step", json!({})).max_attempts(1))
        .node(NodeSpec::new("b", "step", json!({})))
        .node(NodeSpec::new("c", "step", json!({})))
        .edge("b", "c");
    let id = s.queue.enqueue_dag(&dag).await.expect("enqueue dag");
    let a = claim_one(&s, 1).await.expect("a");
    let b = claim_one(&s, 2).await.expect("b");
    assert_eq!(node_key(&b), "b");
    s.queue.fail(&a, "boom", false).await.expect("fail");
    s.clock.advance(Duration::from_secs(31));
    s.queue.heartbeat(&worker(1)).await.expect("heartbeat");
    let r = s.queue.recover_expired().await.expect("recover");
    assert_eq!((r.requeued, r.discarded, r.cancelled), (0, 0, 1));
    assert!(claim(&s, 1, 10).await.is_empty());
    assert!(
        s.queue
            .complete(&b, json!(1))
            .await
            .unwrap_err()
            .is_lease_lost()
    );
    let states: Vec<NodeState> = s
        .queue
        .dag_results(&product(), id)
        .await
        .expect("results")
        .into_iter()
        .map(|r| r.state)
        .collect();
    assert_eq!(
        states,
        [
            NodeState::Failed,
            NodeState::Cancelled,
            NodeState::Cancelled
        ]
    );
}

/// Cancelling a running DAG cancels its queued and running tasks (the
/// running lease is lost) and nothing further runs.
pub async fn cancel_dag_stops_a_running_dag(s: Subject) {
    let dag = DagSpec::new(product())
        .node(NodeSpec::new("a", "step", json!({})))
        .node(NodeSpec::new("b", "step", json!({})))
        .node(NodeSpec::new("c", "step", json!({})))
        .edge("a", "c")
        .edge("b", "c");
    let id = s.queue.enqueue_dag(&dag).await.expect("enqueue dag");
    let a = claim_one(&s, 1).await.expect("a");
    let st = s.queue.cancel_dag(&product(), id).await.expect("cancel");
    assert_eq!(st.state, DagState::Cancelled);
    assert!(
        s.queue
            .complete(&a, json!(1))
            .await
            .unwrap_err()
            .is_lease_lost()
    );
    assert!(claim(&s, 1, 10).await.is_empty(), "b was cancelled");
    let results = s.queue.dag_results(&product(), id).await.expect("results");
    assert!(
        results.iter().all(|r| r.state == NodeState::Cancelled),
        "{results:?}"
    );
    let again = s
        .queue
        .cancel_dag(&product(), id)
        .await
        .expect("cancel is idempotent");
    assert_eq!((again.state, again.done), (DagState::Cancelled, 0));
    // A finished run stays as it was.
    let done = s
        .queue
        .enqueue_dag(&DagSpec::new(product()).node(NodeSpec::new("x", "step", json!({}))))
        .await
        .expect("enqueue dag");
    drain(&s, concat).await;
    let st = s.queue.cancel_dag(&product(), done).await.expect("cancel");
    assert_eq!(st.state, DagState::Completed);
    let missing = s
        .queue
        .cancel_dag(&product(), parlance_ports::DagId(9_999_999))
        .await;
    assert!(missing.unwrap_err().is_not_found());
}

/// Cycles, unknown endpoints and empty DAGs are rejected with nothing
/// enqueued; unknown runs are not found.
pub async fn dag_shapes_are_validated(s: Subject) {
    let cyclic = DagSpec::new(product())
        .node(NodeSpec::new("a", "step", json!({})))
        .node(NodeSpec::new("b", "step", json!({})))
        .edge("a", "b")
        .edge("b", "a");
    let unknown = DagSpec::new(product())
        .node(NodeSpec::new("a", "step", json!({})))
        .edge("a", "ghost");
    for bad in [cyclic, unknown, DagSpec::new(product())] {
        let err = s.queue.enqueue_dag(&bad).await.unwrap_err();
        assert_eq!(err.kind, parlance_ports::ErrorKind::Invalid, "{err}");
    }
    assert!(claim(&s, 1, 10).await.is_empty(), "nothing was enqueued");
    let err = s
        .queue
        .dag_status(&product(), parlance_ports::DagId(424_242))
        .await
        .unwrap_err();
    assert!(err.is_not_found());
    let err = s
        .queue
        .enqueue(&[task("x").max_attempts(0)])
        .await
        .unwrap_err();
    assert_eq!(err.kind, parlance_ports::ErrorKind::Invalid);
}

/// One map node, `list`, with a single attempt, mapping `square` over its
/// result.
fn one_map_node() -> DagSpec {
    DagSpec::new(product()).node(
        NodeSpec::new("list", "split", json!({}))
            .max_attempts(1)
            .map(MapSpec {
                kind: "square".to_owned(),
                payload: json!({}),
                label: None,
            }),
    )
}

/// A map node completing with something other than a list is refused and
/// stays leased, so the worker can fail it.
pub async fn map_node_must_return_an_array(s: Subject) {
    let dag = one_map_node();
    let id = s.queue.enqueue_dag(&dag).await.expect("enqueue dag");
    let l = claim_one(&s, 1).await.expect("list");
    let err = s
        .queue
        .complete(&l, json!({"not": "a list"}))
        .await
        .unwrap_err();
    assert_eq!(err.kind, parlance_ports::ErrorKind::Invalid, "{err}");
    let outcome = s
        .queue
        .fail(&l, "map result is not a list", false)
        .await
        .expect("still leased");
    assert_eq!(outcome, FailOutcome::Discarded);
    let st = s.queue.dag_status(&product(), id).await.expect("status");
    assert_eq!(st.state, DagState::Failed);
    assert_eq!(st.done, 0);
}

/// A DAG over the node limit is refused with nothing enqueued, and a map
/// node fanning out past it is refused and stays leased.
pub async fn dag_size_is_limited(s: Subject) {
    let max = config().dag_limits.max_nodes;
    let mut big = DagSpec::new(product());
    for i in 0..=max {
        big = big.node(NodeSpec::new(format!("n{i}"), "step", json!({})));
    }
    let err = s.queue.enqueue_dag(&big).await.unwrap_err();
    assert_eq!(err.kind, parlance_ports::ErrorKind::Invalid, "{err}");
    assert!(claim(&s, 1, 10).await.is_empty(), "nothing was enqueued");

    let dag = one_map_node();
    let id = s.queue.enqueue_dag(&dag).await.expect("enqueue dag");
    let l = claim_one(&s, 1).await.expect("list");
    let items: Vec<Value> = (0..=max).map(|i| json!(i)).collect();
    let err = s.queue.complete(&l, json!(items)).await.unwrap_err();
    assert_eq!(err.kind, parlance_ports::ErrorKind::Invalid, "{err}");
    let outcome = s
        .queue
        .fail(&l, "map fan-out over the limit", false)
        .await
        .expect("still leased");
    assert_eq!(outcome, FailOutcome::Discarded);
    let st = s.queue.dag_status(&product(), id).await.expect("status");
    assert_eq!((st.state, st.total), (DagState::Failed, 1));
}

/// Finished rows older than the cut-off are deleted; discarded tasks and
/// recent rows stay.
pub async fn purge_removes_old_finished_rows(s: Subject) {
    s.queue
        .enqueue(&[task("done"), task("dead")])
        .await
        .expect("enqueue");
    let leases = claim(&s, 1, 2).await;
    s.queue
        .complete(&leases[0], json!(1))
        .await
        .expect("complete");
    s.queue.fail(&leases[1], "no", false).await.expect("fail");
    let run = s
        .queue
        .enqueue_dag(&DagSpec::new(product()).node(NodeSpec::new("x", "step", json!({}))))
        .await
        .expect("enqueue dag");
    drain(&s, concat).await;
    let cutoff = s.clock.now().plus_seconds(-3600.0);
    assert_eq!(s.queue.purge_finished(cutoff).await.expect("purge"), 0);
    s.clock.advance(Duration::from_secs(7200));
    let purged = s
        .queue
        .purge_finished(s.clock.now().plus_seconds(-3600.0))
        .await
        .expect("purge");
    assert_eq!(purged, 3, "the completed task, the node's task and the run");
    assert!(
        s.queue
            .dag_status(&product(), run)
            .await
            .unwrap_err()
            .is_not_found()
    );
    s.queue
        .retry_discarded(&product(), leases[1].task_id)
        .await
        .expect("the dead letter survives");
}

/// A DAG `a` -> `list` (a map whose elements get a large template) ->
/// `sum`, every payload large.
fn bulky_dag() -> DagSpec {
    let big = "x".repeat(2_000);
    DagSpec::new(product())
        .node(NodeSpec::new("a", "step", json!({"text": big})))
        .node(
            NodeSpec::new("list", "split", json!({"text": big})).map(MapSpec {
                kind: "square".to_owned(),
                payload: json!({"text": big}),
                label: None,
            }),
        )
        .node(NodeSpec::new("sum", "sum", json!({"text": big})))
        .edge("a", "list")
        .edge("list", "sum")
}

/// Completes every runnable task as [`bulky_dag`] expects: `list` with
/// `[1, 2]`, anything else with its key.
async fn run_bulky(s: &Subject) {
    while let Some(l) = claim_one(s, 9).await {
        let key = node_key(&l);
        let result = if key == "list" {
            json!([1, 2])
        } else {
            json!(key)
        };
        s.queue.complete(&l, result).await.expect("complete");
    }
}

/// A completed task or node keeps no payload (a map node no element
/// template, an element no input), only its result: status and results
/// read as before.
pub async fn completed_tasks_and_nodes_keep_no_payload(s: Subject) {
    let big = "x".repeat(2_000);
    s.queue
        .enqueue(&[TaskSpec::new(product(), "plain", json!({"text": big}))])
        .await
        .expect("enqueue");
    let plain = claim_one(&s, 1).await.expect("plain");
    let run = s
        .queue
        .enqueue_dag(&bulky_dag())
        .await
        .expect("enqueue dag");
    let queued = s.queue.footprint(&product()).await.expect("footprint");
    assert_eq!((queued.tasks, queued.runs, queued.nodes), (2, 1, 3));
    assert!(queued.payload_bytes >= 5 * 2_000, "{queued:?}");
    assert_eq!(queued.result_bytes, 0);
    s.queue.complete(&plain, json!(1)).await.expect("complete");
    let a = claim_one(&s, 1).await.expect("a");
    s.queue.complete(&a, json!("a")).await.expect("complete");
    let partway = s.queue.footprint(&product()).await.expect("footprint");
    assert!(
        partway.payload_bytes < queued.payload_bytes - 2 * 2_000,
        "the plain task and `a` dropped theirs: {partway:?} after {queued:?}"
    );
    assert!(partway.payload_bytes > 0, "`list` and `sum` still wait");
    run_bulky(&s).await;
    let st = s.queue.dag_status(&product(), run).await.expect("status");
    assert_eq!((st.state, st.total, st.done), (DagState::Completed, 6, 6));
    let done = s.queue.footprint(&product()).await.expect("footprint");
    assert_eq!(done.payload_bytes, 0, "{done:?}");
    assert!(done.result_bytes > 0, "results stay");
    assert_eq!((done.tasks, done.runs, done.nodes), (1 + 5, 1, 6));
    let results: HashMap<String, Option<Value>> = s
        .queue
        .dag_results(&product(), run)
        .await
        .expect("results")
        .into_iter()
        .map(|r| (r.key, r.result))
        .collect();
    assert_eq!(results["a"], Some(json!("a")));
    assert_eq!(results["list"], Some(json!([1, 2])));
    assert_eq!(results["list[1]"], Some(json!("list[1]")));
    assert_eq!(results["list#combine"], Some(json!(["list[0]", "list[1]"])));
    assert_eq!(results["sum"], Some(json!("sum")));
    assert_eq!(
        s.queue
            .footprint(&other_product())
            .await
            .expect("footprint"),
        QueueFootprint::default(),
        "another product holds nothing"
    );
}

/// Retention deletes a finished run with its nodes (a map's elements and
/// combine node included) and its tasks; a running run stays whole.
pub async fn purge_removes_finished_runs_with_their_nodes(s: Subject) {
    let done = s
        .queue
        .enqueue_dag(&bulky_dag())
        .await
        .expect("enqueue dag");
    run_bulky(&s).await;
    let st = s.queue.dag_status(&product(), done).await.expect("status");
    assert_eq!(st.state, DagState::Completed);
    s.clock.advance(Duration::from_secs(7200));
    let running = s
        .queue
        .enqueue_dag(&DagSpec::new(product()).node(NodeSpec::new("x", "step", json!({}))))
        .await
        .expect("enqueue dag");
    let before = s.queue.footprint(&product()).await.expect("footprint");
    assert_eq!((before.runs, before.nodes, before.tasks), (2, 7, 6));
    let purged = s
        .queue
        .purge_finished(s.clock.now().plus_seconds(-3600.0))
        .await
        .expect("purge");
    assert_eq!(purged, 5 + 1, "the run's five tasks and the run");
    let after = s.queue.footprint(&product()).await.expect("footprint");
    assert_eq!(
        (after.runs, after.nodes, after.tasks),
        (1, 1, 1),
        "{after:?}"
    );
    assert_eq!(after.result_bytes, 0);
    assert!(
        s.queue
            .dag_results(&product(), done)
            .await
            .unwrap_err()
            .is_not_found()
    );
    let st = s.queue.dag_status(&product(), running).await.expect("kept");
    assert_eq!(st.state, DagState::Running);
}

/// The same dedup key under two products names two tasks; under one
/// product it still blocks the duplicate.
pub async fn dedup_keys_are_per_product(s: Subject) {
    let mut theirs = task("b").dedup_key("k");
    theirs.product_id = other_product();
    let ids = s
        .queue
        .enqueue(&[task("a").dedup_key("k"), theirs, task("c").dedup_key("k")])
        .await
        .expect("enqueue");
    assert!(ids[0].is_some() && ids[1].is_some(), "{ids:?}");
    assert_eq!(ids[2], None, "a duplicate within the product");
    let mut claimed: Vec<(ProductId, String)> = claim(&s, 1, 10)
        .await
        .into_iter()
        .map(|l| (l.product_id, l.kind))
        .collect();
    claimed.sort();
    assert_eq!(
        claimed,
        [
            (product(), "a".to_owned()),
            (other_product(), "b".to_owned())
        ]
    );
}

/// Another product can neither read, cancel nor list the results of a run
/// (not found, nothing changed); the owning product still can.
pub async fn a_dag_is_not_found_under_another_product(s: Subject) {
    let dag = DagSpec::new(product())
        .node(NodeSpec::new("a", "step", json!({})))
        .node(NodeSpec::new("b", "step", json!({})))
        .edge("a", "b");
    let id = s.queue.enqueue_dag(&dag).await.expect("enqueue dag");
    let other = other_product();
    let err = s.queue.dag_status(&other, id).await.unwrap_err();
    assert!(err.is_not_found(), "status: {err}");
    let err = s.queue.dag_results(&other, id).await.unwrap_err();
    assert!(err.is_not_found(), "results: {err}");
    let err = s.queue.cancel_dag(&other, id).await.unwrap_err();
    assert!(err.is_not_found(), "cancel: {err}");
    // The run is untouched and still runs.
    let st = s.queue.dag_status(&product(), id).await.expect("status");
    assert_eq!((st.state, st.done), (DagState::Running, 0));
    let a = claim_one(&s, 1).await.expect("a still runs");
    s.queue.complete(&a, json!("a")).await.expect("complete");
    let results = s.queue.dag_results(&product(), id).await.expect("results");
    assert_eq!(results[0].result, Some(json!("a")));
    let st = s.queue.cancel_dag(&product(), id).await.expect("cancel");
    assert_eq!((st.state, st.done), (DagState::Cancelled, 1));
    assert!(claim(&s, 1, 10).await.is_empty(), "b was cancelled");
}

/// Another product cannot retry a dead letter (not found, still
/// discarded); the owning product can.
pub async fn a_discarded_task_is_not_found_under_another_product(s: Subject) {
    let id = s.queue.enqueue(&[task("doomed")]).await.expect("enqueue")[0].expect("id");
    let l = claim_one(&s, 1).await.expect("claim");
    s.queue.fail(&l, "no", false).await.expect("fail");
    let err = s
        .queue
        .retry_discarded(&other_product(), id)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert!(claim(&s, 1, 10).await.is_empty(), "still discarded");
    let dead = s.queue.list_discarded("default", 10).await.expect("list");
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].id, &dead[0].product_id), (id, &product()));
    s.queue
        .retry_discarded(&product(), id)
        .await
        .expect("the owner retries");
    assert_eq!(claim_one(&s, 1).await.expect("claimable").task_id, id);
}

/// A lease is also its product: the same task, token and worker presented
/// under another product are refused and change nothing, for a plain task
/// and for a DAG node.
pub async fn a_lease_naming_another_product_is_lost(s: Subject) {
    s.queue.enqueue(&[task("a")]).await.expect("enqueue");
    let id = s
        .queue
        .enqueue_dag(&DagSpec::new(product()).node(NodeSpec::new("n", "step", json!({}))))
        .await
        .expect("enqueue dag");
    let held = claim(&s, 1, 2).await;
    assert_eq!(held.len(), 2);
    for l in &held {
        let forged = Lease {
            product_id: other_product(),
            ..l.clone()
        };
        assert_lease_lost(&s, &forged).await;
        let many = s
            .queue
            .complete_many(&[(forged, json!("forged"))])
            .await
            .expect("complete many");
        assert!(many[0].as_ref().unwrap_err().is_lease_lost());
    }
    let st = s.queue.dag_status(&product(), id).await.expect("status");
    assert_eq!((st.state, st.done), (DagState::Running, 0));
    for l in &held {
        s.queue
            .complete(l, json!("ok"))
            .await
            .expect("the holder completes");
    }
    let st = s.queue.dag_status(&product(), id).await.expect("status");
    assert_eq!(st.state, DagState::Completed);
}

/// `depth` counts the live tasks of one queue, every product's, by where
/// they stand: ready now, scheduled for later, leased; finished tasks and
/// other queues' tasks are not counted.
pub async fn depth_counts_live_tasks_of_one_queue(s: Subject) {
    let depth = |q: &'static str| {
        let s = s.clone();
        async move { s.queue.depth(q).await.expect("depth") }
    };
    assert_eq!(depth("default").await, QueueDepth::default(), "empty");
    let later = s.clock.now() + Duration::from_secs(60);
    s.queue
        .enqueue(&[
            task("a"),
            task("b"),
            task("c"),
            TaskSpec::new(other_product(), "d", json!({})),
            task("later").run_at(later),
            task("elsewhere").queue("other"),
        ])
        .await
        .expect("enqueue");
    assert_eq!(
        depth("default").await,
        QueueDepth {
            ready: 4,
            scheduled: 1,
            running: 0
        }
    );
    let leases = claim(&s, 1, 2).await;
    assert_eq!(leases.len(), 2);
    s.queue
        .complete(&leases[0], json!(null))
        .await
        .expect("complete");
    assert_eq!(
        depth("default").await,
        QueueDepth {
            ready: 2,
            scheduled: 1,
            running: 1
        },
        "one claimed and completed (gone), one running"
    );
    assert_eq!(
        depth("other").await,
        QueueDepth {
            ready: 1,
            scheduled: 0,
            running: 0
        }
    );
    s.clock.advance(Duration::from_secs(61));
    assert_eq!(depth("default").await.ready, 3, "the delayed one is due");
    assert_eq!(depth("nothing-here").await, QueueDepth::default());
}

/// `recover_expired` reports the leases it recovered per queue: requeued,
/// discarded and cancelled ones alike.
pub async fn recovered_leases_are_counted_per_queue(s: Subject) {
    let short = Duration::from_secs(10);
    s.queue
        .enqueue(&[
            task("a").timeout(short),
            task("b").timeout(short).max_attempts(1),
            task("c").timeout(short).queue("mail"),
            task("d").queue("mail"),
        ])
        .await
        .expect("enqueue");
    assert_eq!(claim(&s, 1, 10).await.len(), 2);
    let mail = s
        .queue
        .claim(&worker(1), "mail", 10, LEASE)
        .await
        .expect("claim mail");
    assert_eq!(mail.len(), 2);
    let r = s.queue.recover_expired().await.expect("recover");
    assert!(r.by_queue.is_empty(), "nothing expired yet: {r:?}");
    s.clock.advance(Duration::from_secs(11));
    s.queue.heartbeat(&worker(1)).await.expect("heartbeat");
    let r = s.queue.recover_expired().await.expect("recover");
    assert_eq!((r.requeued, r.discarded, r.cancelled), (2, 1, 0));
    let by_queue: Vec<(&str, u64)> = r.by_queue.iter().map(|(q, n)| (q.as_str(), *n)).collect();
    assert_eq!(by_queue, [("default", 2), ("mail", 1)]);
}
