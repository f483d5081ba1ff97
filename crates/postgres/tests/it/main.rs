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

mod checkpoint {
    use std::sync::Arc;

    use parlance_postgres::{PgCheckpointer, testing::test_pool};

    parlance_testkit::checkpointer_suite!(async {
        test_pool().await.map(|pool| {
            Arc::new(PgCheckpointer::new(pool)) as parlance_testkit::checkpoint::Subject
        })
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
