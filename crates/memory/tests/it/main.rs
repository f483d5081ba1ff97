//! Contract suites run against the in-memory adapters.

mod audit {
    use std::sync::Arc;

    use parlance_memory::MemoryAuditLog;

    parlance_testkit::audit_log_suite!(async {
        Some(Arc::new(MemoryAuditLog::new()) as parlance_testkit::audit::Subject)
    });
}

mod session {
    use std::sync::Arc;

    use parlance_memory::{MemoryAuditLog, MemorySessionStore, MemoryTourCatalogs};
    use parlance_testkit::session::Subject;

    parlance_testkit::session_store_suite!(async {
        let audit = Arc::new(MemoryAuditLog::new());
        Some(Subject {
            sessions: Arc::new(MemorySessionStore::new(audit.clone())),
            tours: Arc::new(MemoryTourCatalogs::new()),
            audit,
        })
    });
}
