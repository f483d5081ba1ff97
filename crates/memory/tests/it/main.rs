//! Contract suites run against the in-memory adapters.

mod audit {
    use std::sync::Arc;

    use parlance_memory::MemoryAuditLog;

    parlance_testkit::audit_log_suite!(async {
        Some(Arc::new(MemoryAuditLog::new()) as parlance_testkit::audit::Subject)
    });
}

mod adoption {
    use std::sync::Arc;

    use parlance_memory::MemoryAdoptionStore;

    parlance_testkit::adoption_store_suite!(async {
        Some(Arc::new(MemoryAdoptionStore::new()) as parlance_testkit::adoption::Subject)
    });
}
