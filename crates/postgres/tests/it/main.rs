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

mod flow {
    use std::sync::Arc;

    use parlance_postgres::{PgFlowStore, testing::test_pool};

    parlance_testkit::flow_store_suite!(async {
        test_pool()
            .await
            .map(|pool| Arc::new(PgFlowStore::new(pool)) as parlance_testkit::flow::Subject)
    });
}
