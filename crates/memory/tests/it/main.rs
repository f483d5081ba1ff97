//! Contract suites run against the in-memory adapters.

mod audit {
    use std::sync::Arc;

    use parlance_memory::MemoryAuditLog;

    parlance_testkit::audit_log_suite!(async {
        Some(Arc::new(MemoryAuditLog::new()) as parlance_testkit::audit::Subject)
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

mod flow {
    use std::sync::Arc;

    use parlance_memory::MemoryFlowStore;

    parlance_testkit::flow_store_suite!(async {
        Some(Arc::new(MemoryFlowStore::new()) as parlance_testkit::flow::Subject)
    });
}
