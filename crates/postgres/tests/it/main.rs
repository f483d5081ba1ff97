//! Contract suites run against the PostgreSQL adapters, one database per test.
//! Skipped (and said so) when `DATABASE_URL` is unset.

mod audit {
    use std::sync::Arc;

    use parlance_postgres::{PgAuditLog, testing::test_pool};

    parlance_testkit::audit_log_suite!(async {
        test_pool()
            .await
            .map(|pool| Arc::new(PgAuditLog::new(pool)) as parlance_testkit::audit::Subject)
    });
}

mod conversation {
    use std::sync::Arc;

    use parlance_ports::{QueueConfig, SystemClock};
    use parlance_postgres::{PgAuditLog, PgConversationStore, PgTaskQueue, testing::test_pool};
    use parlance_testkit::conversation::Subject;

    pub(super) async fn subject() -> Option<Subject> {
        let pool = test_pool().await?;
        let queue = PgTaskQueue::new(pool.clone(), Arc::new(SystemClock), QueueConfig::default());
        let store = Arc::new(PgConversationStore::new(pool.clone(), queue.clone()));
        Some(Subject {
            store: store.clone(),
            index: store,
            audit: Arc::new(PgAuditLog::new(pool)),
            queue: Arc::new(queue),
        })
    }

    parlance_testkit::conversation_store_suite!(subject());

    mod protocol {
        parlance_testkit::machine_store_suite!(super::subject());
    }
}

mod checkpoint {
    use std::sync::Arc;

    use parlance_ports::{QueueConfig, SystemClock};
    use parlance_postgres::{
        PgAuditLog, PgCheckpointStore, PgCrisisLog, PgPool, PgTaskQueue, testing::test_pool,
    };
    use parlance_testkit::checkpoint::Subject;

    fn subject(pool: PgPool) -> Subject {
        subject_copying_every(parlance_core::turn::DEFAULT_SNAPSHOT_EVERY)(pool)
    }

    /// A store keeping a copy of a thread's objects every `k` checkpoints.
    fn subject_copying_every(k: u64) -> impl Fn(PgPool) -> Subject {
        move |pool| Subject {
            store: Arc::new(PgCheckpointStore::new(pool.clone()).with_snapshot_every(k)),
            audit: Arc::new(PgAuditLog::new(pool.clone())),
            crisis_log: Arc::new(PgCrisisLog::new(pool.clone())),
            queue: Arc::new(PgTaskQueue::new(
                pool,
                Arc::new(SystemClock),
                QueueConfig::default(),
            )),
        }
    }

    parlance_testkit::machine_store_suite!(async { test_pool().await.map(subject) });
    parlance_testkit::checkpoint_store_suite!(async { test_pool().await.map(subject) });

    /// The history cases again, with a copy of the objects every third
    /// checkpoint.
    mod copying_every_3 {
        use parlance_postgres::testing::test_pool;

        parlance_testkit::contract_tests! {
            factory = async { test_pool().await.map(super::subject_copying_every(3)) };
            suite = parlance_testkit::checkpoint;
            cases = [
                load_at_equals_the_state_after_every_commit,
                a_fork_starts_a_thread_of_its_own,
                racing_turns_leave_a_history_without_gaps,
            ]
        }
    }

    fn thread(name: &str) -> parlance_core::turn::ThreadKey {
        use parlance_core::ProductId;
        use parlance_core::turn::{OwnerId, ThreadId, ThreadKey};
        ThreadKey {
            product_id: ProductId::parse("p").unwrap(),
            owner: OwnerId::parse("u").unwrap(),
            thread: ThreadId::parse(name).unwrap(),
        }
    }

    /// Commits `count` turns on the thread at `k` as it stands, each
    /// replacing one of a few objects and adding a list entry.
    async fn turns(store: &PgCheckpointStore, k: &parlance_core::turn::ThreadKey, count: u64) {
        use parlance_core::turn::{Checkpoint, CheckpointDelta, TurnCommand, TurnKey};
        use parlance_core::{Machine as _, Timestamp};
        use parlance_ports::{Commit, MachineStore as _};
        use serde_json::json;

        let now = Timestamp::from_secs(1_767_225_600).unwrap();
        let key = TurnKey::whole(k.clone());
        for _ in 0..count {
            let loaded = store.load(&key).await.unwrap();
            let base = loaded.as_ref().map_or(0, |s| s.version.0);
            let n = base + 1;
            let mut delta = CheckpointDelta::default();
            delta
                .objects
                .insert(format!("k{}", n % 3), json!({"turn": n}));
            delta
                .appends
                .insert("history".to_owned(), vec![json!(format!("m{n}"))]);
            let command = TurnCommand::commit(base, delta);
            let (state, decision) = match loaded {
                Some(stored) => {
                    let mut state = stored.state;
                    let decision = state.decide(&(), &command, now).unwrap();
                    (state, decision)
                }
                None => Checkpoint::create(&key, &(), &command, now)
                    .unwrap()
                    .unwrap(),
            };
            store
                .commit(Commit {
                    key: &key,
                    expected: loaded_version(base),
                    command: &command,
                    state: &state,
                    decision: &decision,
                    now,
                })
                .await
                .unwrap();
        }
    }

    fn loaded_version(base: u64) -> Option<parlance_ports::Version> {
        (base > 0).then_some(parlance_ports::Version(base))
    }

    /// The versions of `k`'s checkpoints whose `snapshot` is not null, each
    /// checked to hold the whole objects as of it.
    async fn copies(
        pool: &PgPool,
        store: &PgCheckpointStore,
        k: &parlance_core::turn::ThreadKey,
    ) -> Vec<u64> {
        use parlance_ports::Checkpointer as _;
        use sqlx::Row as _;

        let rows = sqlx::query(
            "SELECT version, snapshot FROM turn_checkpoint \
             WHERE product_id = $1 AND owner_id = $2 AND thread_id = $3 \
               AND snapshot IS NOT NULL ORDER BY version",
        )
        .bind(k.product_id.as_str())
        .bind(k.owner.as_str())
        .bind(k.thread.as_str())
        .fetch_all(pool)
        .await
        .unwrap();
        let mut versions = Vec::new();
        for row in rows {
            let version = u64::try_from(row.get::<i64, _>("version")).unwrap();
            let snapshot: serde_json::Value = row.get("snapshot");
            let state = store.load_at(k, version).await.unwrap().unwrap();
            assert_eq!(
                snapshot,
                serde_json::to_value(&state.objects).unwrap(),
                "the copy at {version}"
            );
            versions.push(version);
        }
        versions
    }

    /// A copy of the objects is kept at the first checkpoint and at every
    /// `k`th, and only there: the state as of any checkpoint folds fewer
    /// than `k` patches onto its copy.
    #[tokio::test]
    async fn a_copy_is_kept_at_the_first_checkpoint_and_every_kth() {
        use parlance_core::Timestamp;
        use parlance_ports::Checkpointer as _;

        let Some(pool) = test_pool().await else {
            return;
        };
        let store = PgCheckpointStore::new(pool.clone());
        let t = thread("default");
        turns(&store, &t, 70).await;
        assert_eq!(copies(&pool, &store, &t).await, [1, 32, 64]);

        let store = store.with_snapshot_every(5);
        let t = thread("five");
        turns(&store, &t, 23).await;
        assert_eq!(copies(&pool, &store, &t).await, [1, 5, 10, 15, 20]);
        let rows: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM turn_checkpoint WHERE thread_id = 'five' AND patch IS NOT NULL",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(rows, 23, "one history row per checkpoint");

        // A fork's first checkpoint keeps one, and its own count starts there.
        let forked = thread("forked");
        store
            .fork(&t, 7, &forked, Timestamp::UNIX_EPOCH)
            .await
            .unwrap();
        turns(&store, &forked, 5).await;
        assert_eq!(copies(&pool, &store, &forked).await, [1, 5]);
    }

    /// Threads stored a row per list entry (before migration 0017) are
    /// stored a row per checkpoint and list after it, every entry in its
    /// place: the whole lists, a window, and the state at a checkpoint read
    /// the same entries in the same order.
    #[tokio::test]
    async fn migration_17_keeps_every_entry_of_a_thread_in_its_place() {
        use parlance_core::turn::{LoadWindow, TurnKey};
        use parlance_ports::{Checkpointer as _, MachineStore as _};
        use serde_json::{Value, json};

        let Some(pool) = test_pool().await else {
            return;
        };
        let store = PgCheckpointStore::new(pool.clone());
        let t = thread("old");
        turns(&store, &t, 4).await;
        // The table as it was, holding the thread's entries, and a second
        // list with several entries at a checkpoint (none at checkpoint 2).
        sqlx::raw_sql(
            "CREATE TABLE turn_list_entry ( \
                 product_id text NOT NULL, owner_id text NOT NULL, thread_id text NOT NULL, \
                 field text NOT NULL, version bigint NOT NULL, idx integer NOT NULL, \
                 entry jsonb NOT NULL, \
                 PRIMARY KEY (product_id, owner_id, thread_id, field, version, idx)); \
             INSERT INTO turn_list_entry \
             SELECT a.product_id, a.owner_id, a.thread_id, a.field, a.version, \
                    (e.i - 1)::integer, e.entry::jsonb \
             FROM turn_list_append a, json_array_elements(a.entries) WITH ORDINALITY AS e(entry, i); \
             INSERT INTO turn_list_entry \
             SELECT 'p', 'u', 'old', 'notes', v, i, jsonb_build_object('v', v, 'i', i) \
             FROM generate_series(1, 4) AS v, generate_series(0, 3) AS i WHERE i < v AND v <> 2; \
             DROP TABLE turn_list_append;",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::raw_sql(include_str!("../../migrations/0017_turn_list_append.sql"))
            .execute(&pool)
            .await
            .unwrap();

        let history =
            |upto: u64| -> Vec<Value> { (1..=upto).map(|n| json!(format!("m{n}"))).collect() };
        let notes = |upto: u64| -> Vec<Value> {
            (1..=upto)
                .filter(|v| *v != 2)
                .flat_map(|v| (0..v).map(move |i| json!({"v": v, "i": i})))
                .collect()
        };
        let whole = store
            .load(&TurnKey::whole(t.clone()))
            .await
            .unwrap()
            .unwrap()
            .state;
        assert_eq!(whole.lists["history"], history(4));
        assert_eq!(whole.lists["notes"], notes(4));
        let windowed = store
            .load(&TurnKey::new(t.clone(), LoadWindow::all().tail("notes", 5)))
            .await
            .unwrap()
            .unwrap()
            .state;
        assert_eq!(windowed.lists["notes"], notes(4)[3..]);
        let at_3 = store.load_at(&t, 3).await.unwrap().unwrap();
        assert_eq!(at_3.lists["history"], history(3));
        assert_eq!(at_3.lists["notes"], notes(3));
        let counts: Vec<i32> = sqlx::query_scalar(
            "SELECT n FROM turn_list_append WHERE thread_id = 'old' AND field = 'notes' \
             ORDER BY version",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(
            counts,
            [1, 3, 4],
            "a row per checkpoint, counting its entries"
        );
    }

    /// A thread deleted while a commit on it is in flight: the delete waits
    /// for the commit and removes its rows too, so nothing of the thread is
    /// left, and the thread begun again reaches past that commit's version.
    #[tokio::test]
    async fn a_delete_leaves_no_row_of_a_commit_in_flight() {
        use parlance_ports::Checkpointer as _;

        let Some(pool) = test_pool().await else {
            return;
        };
        let store = PgCheckpointStore::new(pool.clone());
        let t = thread("t");
        turns(&store, &t, 2).await;
        // A commit of version 3 holding the thread's row, as the commit
        // statement writes it, not yet committed.
        let mut tx = pool.begin().await.unwrap();
        for statement in [
            "UPDATE turn_thread SET version = 3, objects = objects || '{\"x\": 3}' \
             WHERE product_id = 'p' AND owner_id = 'u' AND thread_id = 't' AND version = 2",
            "INSERT INTO turn_list_append (product_id, owner_id, thread_id, field, version, n, entries) \
             VALUES ('p', 'u', 't', 'history', 3, 1, '[\"m3\"]')",
            "INSERT INTO turn_checkpoint (product_id, owner_id, thread_id, version, at, source, \
                 interrupted, patch) \
             VALUES ('p', 'u', 't', 3, now(), 'turn', false, '{\"x\": 3}')",
        ] {
            sqlx::query(statement).execute(&mut *tx).await.unwrap();
        }
        let deleting = tokio::spawn({
            let store = store.clone();
            let t = t.clone();
            async move { store.delete_thread(&t).await }
        });
        // Until the delete waits on the commit's lock.
        let mut waited = 0;
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if waiting > 0 {
                break;
            }
            waited += 1;
            assert!(waited < 500, "the delete never waited on the commit");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        tx.commit().await.unwrap();
        assert!(deleting.await.unwrap().unwrap());
        for table in ["turn_thread", "turn_list_append", "turn_checkpoint"] {
            let left: i64 = sqlx::query_scalar(&format!(
                "SELECT count(*) FROM {table} WHERE thread_id = 't'"
            ))
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(left, 0, "rows left in {table}");
        }
        turns(&store, &t, 4).await;
        assert_eq!(
            store.load_at(&t, 3).await.unwrap().unwrap().lists["history"].len(),
            3
        );
    }

    /// A turn writes the same bytes however long its thread is: the rows of
    /// the 100th turn are as large as the first's, and the rows of earlier
    /// turns are never rewritten.
    #[tokio::test]
    async fn a_turn_writes_the_same_bytes_at_turn_100_as_at_turn_1() {
        use parlance_core::turn::{
            Checkpoint, CheckpointDelta, OwnerId, ThreadId, ThreadKey, TurnCommand, TurnKey,
        };
        use parlance_core::{Machine as _, ProductId, Timestamp};
        use parlance_ports::{Commit, MachineStore as _, Version};
        use serde_json::json;

        let Some(pool) = test_pool().await else {
            return;
        };
        let store = PgCheckpointStore::new(pool.clone());
        let key = TurnKey::whole(ThreadKey {
            product_id: ProductId::parse("p").unwrap(),
            owner: OwnerId::parse("u").unwrap(),
            thread: ThreadId::parse("long").unwrap(),
        });
        let now = Timestamp::from_secs(1_767_225_600).unwrap();
        // The rows' size and the transaction that wrote them.
        let written = async |version: i64| -> (i64, Vec<String>) {
            let size: i64 = sqlx::query_scalar(
                "SELECT coalesce(sum(pg_column_size(entries)), 0)::bigint FROM turn_list_append \
                 WHERE version = $1",
            )
            .bind(version)
            .fetch_one(&pool)
            .await
            .unwrap();
            let writers: Vec<String> = sqlx::query_scalar(
                "SELECT xmin::text FROM turn_list_append WHERE version = $1 ORDER BY field",
            )
            .bind(version)
            .fetch_all(&pool)
            .await
            .unwrap();
            (size, writers)
        };
        let mut first = None;
        for n in 1..=100u64 {
            let mut delta = CheckpointDelta::default();
            delta.appends.insert(
                "transcript".to_owned(),
                vec![
                    json!({"role": "user", "content": format!("m{n:03}")}),
                    json!({"role": "assistant", "content": format!("re: m{n:03}")}),
                ],
            );
            delta.objects.insert(
                "session_progress".to_owned(),
                json!({"turn_count": 100 + n}),
            );
            let command = TurnCommand::commit(n - 1, delta);
            let mut state = Checkpoint {
                version: n - 1,
                ..Checkpoint::default()
            };
            let decision = state.decide(&(), &command, now).unwrap();
            store
                .commit(Commit {
                    key: &key,
                    expected: (n > 1).then_some(Version(n - 1)),
                    command: &command,
                    state: &state,
                    decision: &decision,
                    now,
                })
                .await
                .unwrap();
            if n == 1 {
                first = Some(written(1).await);
            }
        }
        let (size_1, writers_1) = first.unwrap();
        assert!(size_1 > 0);
        assert_eq!(written(100).await.0, size_1, "turn 100 wrote more");
        assert_eq!(
            written(1).await,
            (size_1, writers_1),
            "turn 1's rows were rewritten"
        );
    }
}

mod adoption {
    use std::sync::Arc;

    use parlance_ports::{QueueConfig, SystemClock};
    use parlance_postgres::{PgAdoptionStore, PgAuditLog, PgTaskQueue, testing::test_pool};
    use parlance_testkit::adoption::Subject;

    pub(super) async fn subject() -> Option<Subject> {
        let pool = test_pool().await?;
        let queue = PgTaskQueue::new(pool.clone(), Arc::new(SystemClock), QueueConfig::default());
        let store = Arc::new(PgAdoptionStore::new(pool.clone(), queue.clone()));
        Some(Subject {
            records: store.clone(),
            store,
            audit: Arc::new(PgAuditLog::new(pool)),
            queue: Arc::new(queue),
        })
    }

    parlance_testkit::machine_store_suite!(subject());
    parlance_testkit::adoption_store_suite!(subject());

    /// A commit whose audit entry the database refuses writes nothing: the
    /// record stays at its version, as it was.
    #[tokio::test]
    async fn a_refused_audit_entry_fails_the_whole_commit() {
        use parlance_core::adoption::{
            AdoptionCommand, AdoptionEvent, AdoptionKey, JourneyState, OnboardingPlan,
            UserAdoptionState, UserId,
        };
        use parlance_core::{Machine as _, ProductId, Timestamp};
        use parlance_ports::{Commit, MachineStore as _};

        let Some(pool) = test_pool().await else {
            return;
        };
        let queue = PgTaskQueue::new(pool.clone(), Arc::new(SystemClock), QueueConfig::default());
        let store = PgAdoptionStore::new(pool.clone(), queue);
        let key = AdoptionKey::new(ProductId::parse("p").unwrap(), UserId::parse("u").unwrap());
        let plan = OnboardingPlan::default();
        let now = Timestamp::from_secs(1_767_225_600).unwrap();
        let create = AdoptionCommand::Events {
            events: vec![],
            metadata: None,
        };
        let (state, decision) = UserAdoptionState::create(&key, &plan, &create, now)
            .unwrap()
            .unwrap();
        let commit = |expected, command, state, decision| Commit {
            key: &key,
            expected,
            command,
            state,
            decision,
            now,
        };
        store
            .commit(commit(None, &create, &state, &decision))
            .await
            .unwrap();
        let before = store.load(&key).await.unwrap().unwrap();
        sqlx::raw_sql(
            "CREATE FUNCTION refuse_adoption_audit() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN IF NEW.entity_kind = 'adoption' THEN RAISE EXCEPTION 'audit refused'; \
             END IF; RETURN NEW; END $$; \
             CREATE TRIGGER refuse_adoption_audit BEFORE INSERT ON audit_log \
             FOR EACH ROW EXECUTE FUNCTION refuse_adoption_audit();",
        )
        .execute(&pool)
        .await
        .unwrap();
        let onboard = AdoptionCommand::Events {
            events: vec![AdoptionEvent::SetJourneyState {
                state: JourneyState::Onboarded,
            }],
            metadata: None,
        };
        let mut next = before.state.clone();
        let decision = next.decide(&plan, &onboard, now).unwrap();
        assert_eq!(decision.transitions.len(), 1);
        let refused = store
            .commit(commit(Some(before.version), &onboard, &next, &decision))
            .await;
        assert!(refused.is_err(), "{refused:?}");
        assert_eq!(store.load(&key).await.unwrap().unwrap(), before);
    }
}

mod queue {
    use std::sync::Arc;

    use parlance_postgres::{PgTaskQueue, testing::test_pool};
    use parlance_testkit::ManualClock;
    use parlance_testkit::queue::{Subject, config};

    parlance_testkit::task_queue_suite!(async {
        let pool = test_pool().await?;
        let clock = Arc::new(ManualClock::new());
        let queue = Arc::new(PgTaskQueue::new(pool, clock.clone(), config()));
        Some(Subject::new(queue, clock))
    });
}

/// The same suite through a worker's handle, which keeps one connection
/// for its calls (and takes pooled ones for calls that overlap).
mod queue_worker_handle {
    use std::sync::Arc;

    use parlance_ports::{SystemClock, TaskQueue as _, WorkerId};
    use parlance_postgres::{PgTaskQueue, testing::test_pool};
    use parlance_testkit::ManualClock;
    use parlance_testkit::queue::{Subject, config};
    use sqlx::Connection as _;

    parlance_testkit::task_queue_suite!(async {
        let pool = test_pool().await?;
        let clock = Arc::new(ManualClock::new());
        let queue = PgTaskQueue::new(pool, clock.clone(), config()).for_worker();
        Some(Subject::new(Arc::new(queue), clock))
    });

    /// A handle whose connection the server dropped fails one call at most,
    /// then works on another connection.
    #[tokio::test]
    async fn a_handle_replaces_a_connection_the_server_dropped() {
        let Some(pool) = test_pool().await else {
            return;
        };
        let queue = PgTaskQueue::new(pool.clone(), Arc::new(SystemClock), config()).for_worker();
        let worker = WorkerId(uuid::Uuid::from_u128(7));
        queue.heartbeat(&worker).await.expect("first heartbeat");
        let database: String = sqlx::query_scalar("SELECT current_database()")
            .fetch_one(&pool)
            .await
            .unwrap();
        let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
        let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
        // The handle's connection is the one whose last statement was the
        // heartbeat.
        let terminated: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity \
             WHERE datname = $1 AND query LIKE 'INSERT INTO workers%'",
        )
        .bind(&database)
        .fetch_all(&mut admin)
        .await
        .unwrap();
        assert_eq!(terminated, [true]);
        let _ = queue.heartbeat(&worker).await;
        queue
            .heartbeat(&worker)
            .await
            .expect("a heartbeat on a fresh connection");
        let last_seen: i64 = sqlx::query_scalar("SELECT count(*) FROM workers WHERE id = $1")
            .bind(worker.0)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(last_seen, 1);
    }
}

mod memory_store {
    use std::sync::Arc;

    use parlance_postgres::{PgMemoryStore, testing::test_pool};

    parlance_testkit::memory_store_suite!(async {
        test_pool().await.map(|pool| {
            Arc::new(PgMemoryStore::new(pool)) as parlance_testkit::memory_store::Subject
        })
    });
}

mod session {
    use std::sync::Arc;

    use parlance_ports::{QueueConfig, SystemClock};
    use parlance_postgres::{
        PgAuditLog, PgPool, PgSessionStore, PgTaskQueue, PgTourCatalogs, testing::test_pool,
    };
    use parlance_testkit::session::{SessionFixture, Subject};

    fn queue(pool: &PgPool) -> PgTaskQueue {
        PgTaskQueue::new(pool.clone(), Arc::new(SystemClock), QueueConfig::default())
    }

    parlance_testkit::session_store_suite!(async {
        test_pool().await.map(|pool| {
            let store = Arc::new(PgSessionStore::new(pool.clone(), queue(&pool)));
            Subject {
                store: store.clone(),
                sessions: store,
                tours: Arc::new(PgTourCatalogs::new(pool.clone())),
                audit: Arc::new(PgAuditLog::new(pool)),
            }
        })
    });

    parlance_testkit::machine_store_suite!(async {
        test_pool().await.map(|pool| {
            let queue = queue(&pool);
            SessionFixture {
                store: Arc::new(PgSessionStore::new(pool.clone(), queue.clone())),
                audit: Arc::new(PgAuditLog::new(pool)),
                queue: Arc::new(queue),
            }
        })
    });
}

mod flow {
    use std::sync::Arc;

    use parlance_ports::{QueueConfig, SystemClock};
    use parlance_postgres::{PgAuditLog, PgFlowStore, PgTaskQueue, testing::test_pool};
    use parlance_testkit::flow::Fixture;

    async fn fixture() -> Option<Fixture> {
        let pool = test_pool().await?;
        let queue = Arc::new(PgTaskQueue::new(
            pool.clone(),
            Arc::new(SystemClock),
            QueueConfig::default(),
        ));
        let store = Arc::new(PgFlowStore::with_queue(pool.clone(), queue.clone()));
        Some(Fixture::new(
            store.clone(),
            store,
            Arc::new(PgAuditLog::new(pool)),
            queue,
        ))
    }

    parlance_testkit::machine_store_suite!(fixture());
    parlance_testkit::flow_store_suite!(fixture());
}

mod queue_in_transaction {
    use std::sync::Arc;
    use std::time::Duration;

    use parlance_core::ProductId;
    use parlance_ports::{QueueConfig, TaskQueue as _, TaskSpec, WorkerId};
    use parlance_postgres::{PgTaskQueue, testing::test_pool};
    use parlance_testkit::ManualClock;
    use serde_json::json;

    /// Tasks enqueued inside a caller's transaction exist exactly when it
    /// commits.
    #[tokio::test]
    async fn enqueue_follows_the_callers_transaction() {
        let Some(pool) = test_pool().await else {
            return;
        };
        let clock = Arc::new(ManualClock::new());
        let queue = PgTaskQueue::new(pool.clone(), clock, QueueConfig::default());
        let spec = |kind: &str| TaskSpec::new(ProductId::parse("p").unwrap(), kind, json!({}));
        let mut tx = pool.begin().await.unwrap();
        queue
            .enqueue_in(&mut tx, &[spec("rolled-back")])
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        let mut tx = pool.begin().await.unwrap();
        let ids = queue
            .enqueue_in(&mut tx, &[spec("committed")])
            .await
            .unwrap();
        let worker = WorkerId(Default::default());
        let lease = Duration::from_secs(60);
        let seen = queue.claim(&worker, "default", 10, lease).await.unwrap();
        assert!(seen.is_empty(), "not visible before commit");
        tx.commit().await.unwrap();
        let got = queue.claim(&worker, "default", 10, lease).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].kind, "committed");
        assert_eq!(Some(got[0].task_id), ids[0]);
    }

    /// Every enqueue of runnable work tells other processes after its
    /// commit: the one-statement batch, a deduplicated task and a caller's
    /// transaction (whose caller wakes the workers once it has committed)
    /// alike.
    #[tokio::test]
    async fn runnable_work_is_announced_to_other_processes() {
        let Some(pool) = test_pool().await else {
            return;
        };
        let clock = Arc::new(ManualClock::new());
        let queue = PgTaskQueue::new(pool.clone(), clock, QueueConfig::default());
        let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
            .await
            .unwrap();
        listener.listen("parlance_jobs").await.unwrap();
        let spec = |kind: &str| TaskSpec::new(ProductId::parse("p").unwrap(), kind, json!({}));
        let mut heard = async || {
            tokio::time::timeout(Duration::from_secs(60), listener.recv())
                .await
                .expect("a notification, not a hang")
                .expect("the listener stays connected")
                .channel()
                .to_owned()
        };
        queue.enqueue(&[spec("a"), spec("b")]).await.unwrap();
        assert_eq!(heard().await, "parlance_jobs");
        let mut keyed = spec("c");
        keyed.dedup_key = Some("c".into());
        queue.enqueue(&[keyed]).await.unwrap();
        assert_eq!(heard().await, "parlance_jobs");
        let mut tx = pool.begin().await.unwrap();
        queue.enqueue_in(&mut tx, &[spec("d")]).await.unwrap();
        tx.commit().await.unwrap();
        queue.wake_workers();
        assert_eq!(heard().await, "parlance_jobs");
    }

    /// The hint never rides in the transaction that wrote the tasks:
    /// PostgreSQL serialises the commits of notifying transactions under
    /// one lock held across their WAL flush, so concurrent writers that
    /// notify commit one at a time. It comes from another backend, after
    /// the writer's commit.
    #[tokio::test]
    async fn the_hint_is_sent_outside_the_writing_transaction() {
        use sqlx::Connection as _;
        let Some(pool) = test_pool().await else {
            return;
        };
        let clock = Arc::new(ManualClock::new());
        let queue = PgTaskQueue::new(pool.clone(), clock, QueueConfig::default());
        let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
            .await
            .unwrap();
        listener.listen("parlance_jobs").await.unwrap();
        let spec = TaskSpec::new(ProductId::parse("p").unwrap(), "e", json!({}));
        // The writer's connection stays checked out, so the hint cannot be
        // sent on it after the commit.
        let mut writer = pool.acquire().await.unwrap();
        let writer_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *writer)
            .await
            .unwrap();
        let mut tx = writer.begin().await.unwrap();
        queue.enqueue_in(&mut tx, &[spec]).await.unwrap();
        tx.commit().await.unwrap();
        queue.wake_workers();
        let hint = tokio::time::timeout(Duration::from_secs(60), listener.recv())
            .await
            .expect("a notification, not a hang")
            .expect("the listener stays connected");
        assert_ne!(
            i32::try_from(hint.process_id()).unwrap(),
            writer_pid,
            "the writing transaction sent the hint itself"
        );
        drop(writer);
    }
}

/// A request meeting a running task with its key, in each order against
/// the statement that ends the task's run, forced by a trigger that holds
/// the first statement's row lock (it sleeps after its update) until the
/// second is seen waiting for it.
mod queue_dedup_interleavings {
    use std::sync::Arc;
    use std::time::Duration;

    use parlance_core::ProductId;
    use parlance_ports::{FailOutcome, Lease, TaskQueue as _, TaskSpec, WorkerId};
    use parlance_postgres::{PgPool, PgTaskQueue, testing::test_pool};
    use parlance_testkit::ManualClock;
    use parlance_testkit::queue::config;
    use serde_json::json;

    const LEASE: Duration = Duration::from_secs(300);

    fn request(n: u32) -> TaskSpec {
        TaskSpec::new(ProductId::parse("acme").unwrap(), "turn", json!({ "n": n })).dedup_key("k")
    }

    /// A queue on a fresh database whose updates of `jobs` matching `when`
    /// sleep two seconds after they changed the row, and its task asked
    /// with 0, claimed.
    async fn running(when: &str) -> Option<(PgPool, Arc<PgTaskQueue>, Lease)> {
        let pool = test_pool().await?;
        for sql in [
            "CREATE FUNCTION hold_job() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$"
                .to_owned(),
            format!(
                "CREATE TRIGGER hold_job AFTER UPDATE ON jobs FOR EACH ROW WHEN ({when}) \
                 EXECUTE FUNCTION hold_job()"
            ),
        ] {
            sqlx::query(&sql).execute(&pool).await.unwrap();
        }
        let queue = Arc::new(PgTaskQueue::new(
            pool.clone(),
            Arc::new(ManualClock::new()),
            config(),
        ));
        queue.enqueue(&[request(0)]).await.unwrap();
        let lease = claim(&queue).await.pop().expect("the task");
        Some((pool, queue, lease))
    }

    async fn claim(queue: &PgTaskQueue) -> Vec<Lease> {
        let worker = WorkerId(uuid::Uuid::from_u128(1));
        queue.claim(&worker, "default", 10, LEASE).await.unwrap()
    }

    /// Waits until a backend of this database waits in `what` (a
    /// `wait_event` of `pg_stat_activity`, or the `Lock` type).
    async fn until_waiting(pool: &PgPool, what: &str) {
        for _ in 0..400 {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND (wait_event = $1 OR wait_event_type = $1)",
            )
            .bind(what)
            .fetch_one(pool)
            .await
            .unwrap();
            if n > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("no backend waited in {what}");
    }

    /// Runs `first` until it holds the row (sleeping in the trigger), then
    /// `second` until it waits for that lock; returns both answers.
    async fn in_order<A, B>(
        pool: &PgPool,
        first: impl Future<Output = A> + Send + 'static,
        second: impl Future<Output = B> + Send + 'static,
    ) -> (A, B)
    where
        A: Send + 'static,
        B: Send + 'static,
    {
        let first = tokio::spawn(first);
        until_waiting(pool, "PgSleep").await;
        let second = tokio::spawn(second);
        until_waiting(pool, "Lock").await;
        assert!(!first.is_finished(), "the first still holds the row");
        (first.await.unwrap(), second.await.unwrap())
    }

    /// The one task left with the key, claimed and completed; nothing
    /// after it.
    async fn one_left(queue: &PgTaskQueue) -> Lease {
        let mut left = claim(queue).await;
        assert_eq!(left.len(), 1, "one live task: {left:?}");
        let last = left.pop().unwrap();
        queue.complete(&last, json!("done")).await.unwrap();
        assert!(claim(queue).await.is_empty(), "nothing after it");
        last
    }

    /// The mark lands first: the completion waits for it, finds the mark
    /// on the newest row and enqueues the request.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mark_then_the_completion_enqueues_the_request() {
        let Some((pool, queue, lease)) =
            running("OLD.rerun IS NULL AND NEW.rerun IS NOT NULL").await
        else {
            return;
        };
        let (q1, q2) = (queue.clone(), queue.clone());
        let (asked, completed) = in_order(
            &pool,
            async move { q1.enqueue(&[request(1)]).await.unwrap() },
            async move { q2.complete(&lease, json!("done")).await },
        )
        .await;
        assert_eq!(asked, [None], "folded into the running task");
        completed.unwrap();
        assert_eq!(one_left(&queue).await.payload, json!({"n": 1}));
    }

    /// The completion lands first: the request waits for it, then finds
    /// the key free and inserts its own task.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_completion_then_a_request_inserts_afresh() {
        let Some((pool, queue, lease)) = running("OLD.state = 1 AND NEW.state = 2").await else {
            return;
        };
        let (q1, q2) = (queue.clone(), queue.clone());
        let (completed, asked) = in_order(
            &pool,
            async move { q1.complete(&lease, json!("done")).await },
            async move { q2.enqueue(&[request(1)]).await.unwrap() },
        )
        .await;
        completed.unwrap();
        let [Some(id)] = asked[..] else {
            panic!("the request inserted its task: {asked:?}")
        };
        let last = one_left(&queue).await;
        assert_eq!((last.task_id, last.payload), (id, json!({"n": 1})));
    }

    /// A request meets the completion of a task marked before: it waits,
    /// then finds the task that completion enqueued, waiting, and is
    /// folded into it; that task runs once, with the first request.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_meeting_a_marked_completion_is_folded_into_its_rerun() {
        let Some((pool, queue, lease)) = running("OLD.rerun IS NOT NULL AND NEW.state = 2").await
        else {
            return;
        };
        assert_eq!(queue.enqueue(&[request(1)]).await.unwrap(), [None]);
        let (q1, q2) = (queue.clone(), queue.clone());
        let (completed, asked) = in_order(
            &pool,
            async move { q1.complete(&lease, json!("done")).await },
            async move { q2.enqueue(&[request(2)]).await.unwrap() },
        )
        .await;
        completed.unwrap();
        assert_eq!(asked, [None], "folded into the waiting rerun");
        assert_eq!(one_left(&queue).await.payload, json!({"n": 1}));
    }

    /// A newer request marks a task marked before while its completion
    /// starts: the completion waits for it and enqueues the newer one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_mark_then_the_completion_enqueues_the_newer_request() {
        let Some((pool, queue, lease)) =
            running("OLD.rerun IS NOT NULL AND NEW.rerun IS NOT NULL").await
        else {
            return;
        };
        assert_eq!(queue.enqueue(&[request(1)]).await.unwrap(), [None]);
        let (q1, q2) = (queue.clone(), queue.clone());
        let (asked, completed) = in_order(
            &pool,
            async move { q1.enqueue(&[request(2)]).await.unwrap() },
            async move { q2.complete(&lease, json!("done")).await },
        )
        .await;
        assert_eq!(asked, [None]);
        completed.unwrap();
        assert_eq!(one_left(&queue).await.payload, json!({"n": 2}));
    }

    /// The mark lands first and the task's attempt then fails: the retry
    /// takes the request's payload.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mark_then_a_retry_runs_the_request() {
        let Some((pool, queue, lease)) =
            running("OLD.rerun IS NULL AND NEW.rerun IS NOT NULL").await
        else {
            return;
        };
        let id = lease.task_id;
        let (q1, q2) = (queue.clone(), queue.clone());
        let (asked, failed) = in_order(
            &pool,
            async move { q1.enqueue(&[request(1)]).await.unwrap() },
            async move { q2.fail(&lease, "503", true).await },
        )
        .await;
        assert_eq!(asked, [None]);
        assert!(
            matches!(failed, Ok(FailOutcome::Retrying { .. })),
            "{failed:?}"
        );
        sqlx::query("UPDATE jobs SET run_at = run_at - interval '1 hour'")
            .execute(&pool)
            .await
            .unwrap();
        let last = one_left(&queue).await;
        assert_eq!((last.task_id, last.payload), (id, json!({"n": 1})));
    }

    /// The retry lands first: the request waits for it, then finds the task
    /// waiting and is folded into it (the task runs once more, as it was).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_retry_then_a_request_is_folded_into_the_waiting_task() {
        let Some((pool, queue, lease)) = running("OLD.state = 1 AND NEW.state = 0").await else {
            return;
        };
        let id = lease.task_id;
        let (q1, q2) = (queue.clone(), queue.clone());
        let (failed, asked) = in_order(
            &pool,
            async move { q1.fail(&lease, "503", true).await },
            async move { q2.enqueue(&[request(1)]).await.unwrap() },
        )
        .await;
        assert!(
            matches!(failed, Ok(FailOutcome::Retrying { .. })),
            "{failed:?}"
        );
        assert_eq!(asked, [None], "folded into the waiting task");
        sqlx::query("UPDATE jobs SET run_at = run_at - interval '1 hour'")
            .execute(&pool)
            .await
            .unwrap();
        let last = one_left(&queue).await;
        assert_eq!((last.task_id, last.payload), (id, json!({"n": 0})));
    }
}

mod crisis_log {
    use std::sync::Arc;

    use parlance_postgres::{PgCrisisLog, testing::test_pool};

    parlance_testkit::crisis_log_suite!(async {
        test_pool()
            .await
            .map(|pool| Arc::new(PgCrisisLog::new(pool)) as parlance_testkit::crisis_log::Subject)
    });
}

mod api_keys {
    use parlance_core::{ProductId, Timestamp};
    use parlance_ports::ErrorKind;
    use parlance_postgres::{PgApiKeys, testing::test_pool};

    #[tokio::test]
    async fn keys_are_created_listed_found_and_revoked() {
        let Some(pool) = test_pool().await else {
            return;
        };
        let keys = PgApiKeys::new(pool);
        let acme = ProductId::parse("acme").unwrap();
        let other = ProductId::parse("other").unwrap();
        let t0 = Timestamp::from_micros(1_767_225_600_000_000).unwrap();
        let a = keys.create(&acme, &[1; 32], "ci", t0).await.unwrap();
        let b = keys.create(&other, &[2; 32], "", t0).await.unwrap();
        assert_eq!(
            keys.product_for(&[1; 32]).await.unwrap(),
            Some(acme.clone())
        );
        assert_eq!(
            keys.product_for(&[2; 32]).await.unwrap(),
            Some(other.clone())
        );
        assert_eq!(keys.product_for(&[3; 32]).await.unwrap(), None);
        let dup = keys.create(&acme, &[1; 32], "again", t0).await.unwrap_err();
        assert_eq!(dup.kind, ErrorKind::Conflict);

        assert_eq!(keys.list(None).await.unwrap().len(), 2);
        let mine = keys.list(Some(&acme)).await.unwrap();
        assert_eq!(mine, vec![a.clone()]);

        // Another product cannot revoke the key; its owner can, once.
        let e = keys.revoke(&other, a.id, t0).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        let t1 = Timestamp::from_micros(1_767_225_700_000_000).unwrap();
        keys.revoke(&acme, a.id, t1).await.unwrap();
        keys.revoke(&acme, a.id, t0).await.unwrap();
        assert_eq!(keys.product_for(&[1; 32]).await.unwrap(), None);
        assert_eq!(
            keys.list(Some(&acme)).await.unwrap()[0].revoked_at,
            Some(t1)
        );
        assert_eq!(keys.product_for(&[2; 32]).await.unwrap(), Some(other));
        assert!(b.revoked_at.is_none());
    }
}

mod storable {
    parlance_testkit::storable_suite!(
        adoption = super::adoption::subject(),
        conversation = super::conversation::subject(),
    );
}

mod data_exceptions {
    use parlance_ports::ErrorKind;
    use parlance_postgres::error::port_error;
    use parlance_postgres::testing::test_pool;

    /// Every value PostgreSQL refuses as data (SQLSTATE class 22) is a
    /// typed `Invalid`, which the service answers with 422, never `Other`
    /// (500): NUL in `text` (22021), a `\u0000` escape in `jsonb` (22P05), a
    /// number out of range (22003), a string too long (22001).
    #[tokio::test]
    async fn values_the_database_refuses_are_invalid() {
        let Some(pool) = test_pool().await else {
            return;
        };
        let cases: [(&str, &str); 4] = [
            ("22021", "SELECT $1::text"),
            ("22P05", "SELECT $1::jsonb"),
            ("22003", "SELECT $1::bigint + 9223372036854775807"),
            (
                "22001",
                "SELECT CAST($1::text AS varchar(1))::char(1) || ''",
            ),
        ];
        for (code, sql) in cases {
            let query = sqlx::query(sql);
            let query = match code {
                "22021" => query.bind("a\0b"),
                "22P05" => query.bind("\"a\\u0000b\""),
                "22003" => query.bind(1_i64),
                _ => query.bind("ab"),
            };
            let Err(e) = query.execute(&pool).await else {
                if code == "22001" {
                    // A cast truncates instead; covered below by an insert.
                    continue;
                }
                panic!("{code}: the database took the value");
            };
            let got = match &e {
                sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
                _ => None,
            };
            assert_eq!(got.as_deref(), Some(code), "{sql}: {e}");
            assert_eq!(port_error("probe", e).kind, ErrorKind::Invalid, "{code}");
        }
        sqlx::query("CREATE TABLE short_text_probe (v varchar(1))")
            .execute(&pool)
            .await
            .unwrap();
        let e = sqlx::query("INSERT INTO short_text_probe VALUES ($1)")
            .bind("ab")
            .execute(&pool)
            .await
            .unwrap_err();
        assert_eq!(port_error("probe", e).kind, ErrorKind::Invalid, "22001");
    }
}

mod api_key_contract {
    use std::sync::Arc;

    use async_trait::async_trait;
    use parlance_core::{ProductId, Timestamp};
    use parlance_ports::PortResult;
    use parlance_postgres::{PgApiKeys, testing::test_pool};
    use parlance_testkit::api_keys::{KeyStoreFixture, Subject};
    use sha2::{Digest as _, Sha256};

    /// The key table, holding SHA-256 digests as the service stores them.
    struct Table(PgApiKeys);

    fn digest(key: &str) -> [u8; 32] {
        Sha256::digest(key.as_bytes()).into()
    }

    fn now() -> Timestamp {
        Timestamp::from_micros(1_767_225_600_000_000).expect("in range")
    }

    #[async_trait]
    impl KeyStoreFixture for Table {
        async fn add(&self, product: &ProductId, key: &str) -> i64 {
            self.0
                .create(product, &digest(key), "contract", now())
                .await
                .expect("create")
                .id
        }

        async fn resolve(&self, presented: &str) -> PortResult<Option<ProductId>> {
            self.0.product_for(&digest(presented)).await
        }

        async fn revoke(&self, product: &ProductId, id: i64) -> PortResult<()> {
            self.0.revoke(product, id, now()).await
        }
    }

    async fn subject() -> Option<Subject> {
        let pool = test_pool().await?;
        Some(Arc::new(Table(PgApiKeys::new(pool))) as Subject)
    }

    parlance_testkit::api_key_suite!(subject());
    parlance_testkit::api_key_revocation_suite!(subject());
}
