//! Contract suites run against the in-memory adapters.

mod audit {
    use std::sync::Arc;

    use parlance_memory::MemoryAuditLog;

    parlance_testkit::audit_log_suite!(async {
        Some(Arc::new(MemoryAuditLog::new()) as parlance_testkit::audit::Subject)
    });
}

mod checkpoint {
    use std::sync::Arc;

    use parlance_memory::MemoryCheckpointer;

    parlance_testkit::checkpointer_suite!(async {
        Some(Arc::new(MemoryCheckpointer::new()) as parlance_testkit::checkpoint::Subject)
    });
}

mod memory_store {
    use std::sync::Arc;

    use parlance_memory::MemoryMemoryStore;

    parlance_testkit::memory_store_suite!(async {
        Some(Arc::new(MemoryMemoryStore::new()) as parlance_testkit::memory_store::Subject)
    });
}
