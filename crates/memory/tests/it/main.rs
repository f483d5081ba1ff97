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

    use parlance_memory::{MemoryAuditLog, MemoryConversationStore, MemoryTaskQueue};
    use parlance_ports::{QueueConfig, SystemClock};
    use parlance_testkit::conversation::Subject;

    parlance_testkit::conversation_store_suite!(async {
        let audit = Arc::new(MemoryAuditLog::new());
        let queue = Arc::new(MemoryTaskQueue::new(
            Arc::new(SystemClock),
            QueueConfig::default(),
        ));
        Some(Subject {
            store: Arc::new(MemoryConversationStore::new(audit.clone(), queue.clone())),
            audit,
            queue,
        })
    });
}

mod llm {
    use std::sync::Arc;

    use parlance_memory::{OfflineLlm, Reply};
    use parlance_ports::{CompletionRequest, LlmClient, LlmError};
    use parlance_testkit::llm::{LlmFixture, Scripted, Subject};

    /// The offline client, scripted one reply at a time.
    struct Offline(Arc<OfflineLlm>);

    impl LlmFixture for Offline {
        fn client(&self) -> Arc<dyn LlmClient> {
            self.0.clone()
        }

        fn script(&self, answer: Scripted) {
            self.0.push_reply(match answer {
                Scripted::Answer {
                    content,
                    tool_calls,
                    usage,
                } => Reply::Answer {
                    content,
                    tool_calls,
                    usage: Some(usage),
                },
                Scripted::Status {
                    status,
                    retry_after,
                    message,
                } => Reply::Error(LlmError::from_status(status, retry_after, &message)),
            });
        }

        fn received(&self) -> Vec<CompletionRequest> {
            self.0.received()
        }
    }

    parlance_testkit::llm_client_suite!(async {
        Some(Arc::new(Offline(Arc::new(OfflineLlm::new()))) as Subject)
    });
}

mod embedding {
    use std::sync::Arc;

    use parlance_memory::HashingEmbedder;

    parlance_testkit::embedding_suite!(async {
        Some(Arc::new(HashingEmbedder::default()) as parlance_testkit::embedding::Subject)
    });
}

mod adoption {
    use std::sync::Arc;

    use parlance_memory::MemoryAdoptionStore;

    parlance_testkit::adoption_store_suite!(async {
        Some(Arc::new(MemoryAdoptionStore::new()) as parlance_testkit::adoption::Subject)
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

mod flow {
    use std::sync::Arc;

    use parlance_memory::MemoryFlowStore;

    parlance_testkit::flow_store_suite!(async {
        Some(Arc::new(MemoryFlowStore::new(Arc::default())) as parlance_testkit::flow::Subject)
    });

    mod audit {
        use std::sync::Arc;

        use parlance_memory::{MemoryAuditLog, MemoryFlowStore};

        parlance_testkit::flow_store_audit_suite!(async {
            let audit = Arc::new(MemoryAuditLog::new());
            Some((
                Arc::new(MemoryFlowStore::new(audit.clone())) as Arc<dyn parlance_ports::FlowStore>,
                audit as Arc<dyn parlance_ports::AuditLog>,
            ))
        });
    }

    mod enqueue {
        use std::sync::Arc;

        use parlance_memory::{MemoryFlowStore, MemoryTaskQueue};
        use parlance_ports::{FlowStore, QueueConfig, SystemClock, TaskQueue};

        parlance_testkit::flow_store_enqueue_suite!(async {
            let queue: Arc<dyn TaskQueue> = Arc::new(MemoryTaskQueue::new(
                Arc::new(SystemClock),
                QueueConfig::default(),
            ));
            let store: Arc<dyn FlowStore> =
                Arc::new(MemoryFlowStore::with_queue(Arc::default(), queue.clone()));
            Some((store, queue))
        });
    }
}

mod crisis_log {
    use std::sync::Arc;

    use parlance_memory::MemoryCrisisLog;

    parlance_testkit::crisis_log_suite!(async {
        Some(Arc::new(MemoryCrisisLog::new()) as parlance_testkit::crisis_log::Subject)
    });
}
