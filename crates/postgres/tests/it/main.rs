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

    parlance_testkit::conversation_store_suite!(async {
        test_pool().await.map(|pool| {
            let queue =
                PgTaskQueue::new(pool.clone(), Arc::new(SystemClock), QueueConfig::default());
            Subject {
                store: Arc::new(PgConversationStore::new(pool.clone(), queue.clone())),
                audit: Arc::new(PgAuditLog::new(pool)),
                queue: Arc::new(queue),
            }
        })
    });

    /// Two commands decided on the same read: one guarded write lands, the
    /// other finds the instance moved, writes nothing, and is decided again
    /// under the row lock; both replies are kept, in one version each.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_command_decided_on_a_stale_read_is_decided_again() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::{Barrier, Mutex};

        use parlance_core::conversation::{ContactId, InstanceId, NewInstance, Role};
        use parlance_core::{ProductId, Timestamp};
        use parlance_ports::ConversationStore as _;

        let Some(pool) = test_pool().await else {
            return;
        };
        let queue = PgTaskQueue::new(pool.clone(), Arc::new(SystemClock), QueueConfig::default());
        let store = Arc::new(PgConversationStore::new(pool, queue));
        let product = ProductId::parse("p").unwrap();
        let id = InstanceId::from_uuid(uuid::Uuid::from_u128(1));
        let now = Timestamp::from_secs(1_767_225_600).unwrap();
        let new = NewInstance {
            product_id: product.clone(),
            instance_id: id,
            contact_id: ContactId::parse("zoe").unwrap(),
            channel: "loopback".into(),
            objective: "book a demo".into(),
            todos: vec![],
            heartbeat_interval_s: 100,
            max_follow_ups: 2,
            metadata: serde_json::Map::new(),
        };
        let start = store.create(new, now).await.unwrap().unwrap().0;
        // The first two decisions wait for each other, so both read the
        // same version; later ones run straight through.
        let barrier = Arc::new(Barrier::new(2));
        let decisions = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut writers = Vec::new();
        for w in 0..2 {
            let (store, product) = (store.clone(), product.clone());
            let (barrier, decisions, seen) = (barrier.clone(), decisions.clone(), seen.clone());
            writers.push(tokio::spawn(async move {
                store
                    .apply(
                        &product,
                        id,
                        now,
                        Box::new(move |i| {
                            seen.lock().unwrap().push(i.version);
                            if decisions.fetch_add(1, Ordering::SeqCst) < 2 {
                                // Hand this worker's queued tasks to another
                                // thread while it waits.
                                tokio::task::block_in_place(|| barrier.wait());
                            }
                            Ok(i.contact_reply(format!("w{w}"), now))
                        }),
                    )
                    .await
                    .unwrap()
                    .unwrap()
            }));
        }
        for w in writers {
            w.await.unwrap();
        }
        assert_eq!(decisions.load(Ordering::SeqCst), 3, "one decision repeated");
        let seen = seen.lock().unwrap().clone();
        assert_eq!(&seen[..2], [start.version, start.version], "a shared read");
        assert_eq!(
            seen[2],
            start.version + 1,
            "decided again on the write that landed"
        );
        let end = store.get(&product, id).await.unwrap().unwrap();
        assert_eq!(end.version, start.version + 2);
        let transcript = store.transcript(&product, id).await.unwrap();
        let mut replies: Vec<_> = transcript
            .iter()
            .filter(|m| m.role == Role::Contact)
            .map(|m| m.text.clone())
            .collect();
        replies.sort();
        assert_eq!(replies, ["w0", "w1"]);
    }
}

mod checkpoint {
    use std::sync::Arc;

    use parlance_postgres::{PgCheckpointer, testing::test_pool};

    parlance_testkit::checkpointer_suite!(async {
        test_pool().await.map(|pool| {
            Arc::new(PgCheckpointer::new(pool)) as parlance_testkit::checkpoint::Subject
        })
    });
}

mod adoption {
    use std::sync::Arc;

    use parlance_postgres::{PgAdoptionStore, testing::test_pool};

    parlance_testkit::adoption_store_suite!(async {
        test_pool()
            .await
            .map(|pool| Arc::new(PgAdoptionStore::new(pool)) as parlance_testkit::adoption::Subject)
    });
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

    use parlance_postgres::{PgAuditLog, PgSessionStore, PgTourCatalogs, testing::test_pool};
    use parlance_testkit::session::Subject;

    parlance_testkit::session_store_suite!(async {
        test_pool().await.map(|pool| Subject {
            sessions: Arc::new(PgSessionStore::new(pool.clone())),
            tours: Arc::new(PgTourCatalogs::new(pool.clone())),
            audit: Arc::new(PgAuditLog::new(pool)),
        })
    });
}

mod flow {
    use std::sync::Arc;

    use parlance_postgres::{PgFlowStore, testing::test_pool};

    parlance_testkit::flow_store_suite!(async {
        test_pool()
            .await
            .map(|pool| Arc::new(PgFlowStore::new(pool)) as parlance_testkit::flow::Subject)
    });

    mod audit {
        use std::sync::Arc;

        use parlance_ports::{AuditLog, FlowStore};
        use parlance_postgres::{PgAuditLog, PgFlowStore, testing::test_pool};

        parlance_testkit::flow_store_audit_suite!(async {
            let pool = test_pool().await?;
            Some((
                Arc::new(PgFlowStore::new(pool.clone())) as Arc<dyn FlowStore>,
                Arc::new(PgAuditLog::new(pool)) as Arc<dyn AuditLog>,
            ))
        });
    }

    mod enqueue {
        use std::sync::Arc;

        use parlance_ports::{FlowStore, QueueConfig, SystemClock, TaskQueue};
        use parlance_postgres::{PgFlowStore, PgTaskQueue, testing::test_pool};

        parlance_testkit::flow_store_enqueue_suite!(async {
            let pool = test_pool().await?;
            let queue = Arc::new(PgTaskQueue::new(
                pool.clone(),
                Arc::new(SystemClock),
                QueueConfig::default(),
            ));
            let store: Arc<dyn FlowStore> = Arc::new(PgFlowStore::with_queue(pool, queue.clone()));
            Some((store, queue as Arc<dyn TaskQueue>))
        });
    }
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

    /// Every enqueue of runnable work tells other processes at commit:
    /// the one-statement batch, a deduplicated task and a caller's
    /// transaction alike.
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
        assert_eq!(heard().await, "parlance_jobs");
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
