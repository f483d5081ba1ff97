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
}
