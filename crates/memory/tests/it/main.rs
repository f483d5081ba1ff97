//! Contract suites run against the in-memory adapters.

mod audit {
    use std::sync::Arc;

    use parlance_memory::MemoryAuditLog;

    parlance_testkit::audit_log_suite!(async {
        Some(Arc::new(MemoryAuditLog::new()) as parlance_testkit::audit::Subject)
    });
}

mod queue {
    use std::sync::Arc;

    use parlance_memory::MemoryTaskQueue;
    use parlance_testkit::ManualClock;
    use parlance_testkit::queue::{Subject, config};

    parlance_testkit::task_queue_suite!(async {
        let clock = Arc::new(ManualClock::new());
        let queue = Arc::new(MemoryTaskQueue::new(clock.clone(), config()));
        Some(Subject::new(queue, clock))
    });
}
