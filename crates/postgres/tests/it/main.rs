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
