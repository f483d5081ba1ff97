//! Contract suites run against the in-memory adapters.

mod records;

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

    pub(super) fn subject() -> Subject {
        let audit = Arc::new(MemoryAuditLog::new());
        let queue = Arc::new(MemoryTaskQueue::new(
            Arc::new(SystemClock),
            QueueConfig::default(),
        ));
        let store = Arc::new(MemoryConversationStore::new(audit.clone(), queue.clone()));
        Subject {
            store: store.clone(),
            index: store,
            audit,
            queue,
        }
    }

    parlance_testkit::conversation_store_suite!(async { Some(subject()) });

    mod protocol {
        parlance_testkit::machine_store_suite!(async { Some(super::subject()) });
    }
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

    use parlance_memory::{MemoryAdoptionStore, MemoryAuditLog, MemoryTaskQueue};
    use parlance_ports::{QueueConfig, SystemClock};
    use parlance_testkit::adoption::Subject;

    pub(super) async fn subject() -> Option<Subject> {
        let audit = Arc::new(MemoryAuditLog::new());
        let queue = Arc::new(MemoryTaskQueue::new(
            Arc::new(SystemClock),
            QueueConfig::default(),
        ));
        let store = Arc::new(MemoryAdoptionStore::new(audit.clone(), queue.clone()));
        Some(Subject {
            records: store.clone(),
            store,
            audit,
            queue,
        })
    }

    parlance_testkit::machine_store_suite!(subject());
    parlance_testkit::adoption_store_suite!(subject());
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

    use parlance_memory::{MemoryAuditLog, MemoryCheckpointStore, MemoryTaskQueue};
    use parlance_ports::{QueueConfig, SystemClock};
    use parlance_testkit::checkpoint::Subject;

    fn subject() -> Subject {
        subject_copying_every(parlance_core::turn::DEFAULT_SNAPSHOT_EVERY)
    }

    /// A store keeping a copy of a thread's objects every `k` checkpoints.
    fn subject_copying_every(k: u64) -> Subject {
        let audit = Arc::new(MemoryAuditLog::new());
        let store = MemoryCheckpointStore::new(audit.clone()).with_snapshot_every(k);
        Subject {
            crisis_log: store.crisis_log(),
            store: Arc::new(store),
            audit,
            queue: Arc::new(MemoryTaskQueue::new(
                Arc::new(SystemClock),
                QueueConfig::default(),
            )),
        }
    }

    parlance_testkit::machine_store_suite!(async { Some(subject()) });
    parlance_testkit::checkpoint_store_suite!(async { Some(subject()) });

    /// The history cases again, with a copy of the objects every third
    /// checkpoint.
    mod copying_every_3 {
        parlance_testkit::contract_tests! {
            factory = async { Some(super::subject_copying_every(3)) };
            suite = parlance_testkit::checkpoint;
            cases = [
                load_at_equals_the_state_after_every_commit,
                a_fork_starts_a_thread_of_its_own,
                racing_turns_leave_a_history_without_gaps,
            ]
        }
    }
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

    use parlance_memory::{
        MemoryAuditLog, MemorySessionStore, MemoryTaskQueue, MemoryTourCatalogs,
    };
    use parlance_ports::{QueueConfig, SystemClock, TaskQueue};
    use parlance_testkit::session::{SessionFixture, Subject};

    fn queue() -> Arc<dyn TaskQueue> {
        Arc::new(MemoryTaskQueue::new(
            Arc::new(SystemClock),
            QueueConfig::default(),
        ))
    }

    parlance_testkit::session_store_suite!(async {
        let audit = Arc::new(MemoryAuditLog::new());
        let store = Arc::new(MemorySessionStore::new(audit.clone(), queue()));
        Some(Subject {
            store: store.clone(),
            sessions: store,
            tours: Arc::new(MemoryTourCatalogs::new()),
            audit,
        })
    });

    parlance_testkit::machine_store_suite!(async {
        let audit = Arc::new(MemoryAuditLog::new());
        let queue = queue();
        Some(SessionFixture {
            store: Arc::new(MemorySessionStore::new(audit.clone(), queue.clone())),
            audit,
            queue,
        })
    });
}

mod flow {
    use std::sync::Arc;

    use parlance_memory::{MemoryAuditLog, MemoryFlowStore, MemoryTaskQueue};
    use parlance_ports::{QueueConfig, SystemClock};
    use parlance_testkit::flow::Fixture;

    fn fixture() -> Fixture {
        let audit = Arc::new(MemoryAuditLog::new());
        let config = QueueConfig::default();
        let queue = Arc::new(MemoryTaskQueue::new(Arc::new(SystemClock), config));
        let store = Arc::new(MemoryFlowStore::with_queue(
            audit.clone(),
            queue.clone(),
            config.dag_limits,
        ));
        Fixture::new(store.clone(), store, audit, queue)
    }

    parlance_testkit::machine_store_suite!(async { Some(fixture()) });
    parlance_testkit::flow_store_suite!(async { Some(fixture()) });
}

mod crisis_log {
    use std::sync::Arc;

    use parlance_memory::MemoryCrisisLog;

    parlance_testkit::crisis_log_suite!(async {
        Some(Arc::new(MemoryCrisisLog::new()) as parlance_testkit::crisis_log::Subject)
    });
}

mod storable {
    parlance_testkit::storable_suite!(
        adoption = super::adoption::subject(),
        conversation = async { Some(super::conversation::subject()) },
    );
}

mod channel {
    use std::sync::Arc;

    use parlance_memory::LoopbackChannel;
    use parlance_ports::Channel;
    use parlance_testkit::channel::ChannelFixture;

    struct Loopback(Arc<LoopbackChannel>);

    impl ChannelFixture for Loopback {
        fn channel(&self) -> Arc<dyn Channel> {
            self.0.clone()
        }

        fn received(&self) -> Vec<serde_json::Value> {
            self.0
                .sent()
                .iter()
                .map(|m| serde_json::to_value(m).expect("encodes"))
                .collect()
        }
    }

    parlance_testkit::channel_suite!(async {
        Some(Arc::new(Loopback(Arc::new(LoopbackChannel::new())))
            as parlance_testkit::channel::Subject)
    });
}
