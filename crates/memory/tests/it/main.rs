//! Contract suites run against the in-memory adapters.

mod audit {
    use std::sync::Arc;

    use parlance_memory::MemoryAuditLog;

    parlance_testkit::audit_log_suite!(async {
        Some(Arc::new(MemoryAuditLog::new()) as parlance_testkit::audit::Subject)
    });
}

mod conversation {
    use std::sync::Arc;

    use parlance_memory::{MemoryAuditLog, MemoryConversationStore};
    use parlance_testkit::conversation::Subject;

    parlance_testkit::conversation_store_suite!(async {
        let audit = Arc::new(MemoryAuditLog::new());
        Some(Subject {
            store: Arc::new(MemoryConversationStore::new(audit.clone())),
            audit,
        })
    });
}
