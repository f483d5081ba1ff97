#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod adoption;
pub mod audit;
pub mod channel;
pub mod clock;
pub mod conversation;
pub mod crisis;
pub mod embedding;
pub mod error;
pub mod flow;
pub mod llm;
pub mod queue;
pub mod session;
pub mod store;
pub mod turn;

pub use adoption::AdoptionStore;
pub use audit::{AuditEntry, AuditLog, AuditRecord};
pub use channel::{Channel, Outbound};
pub use clock::{Clock, IdGen, ManualClock, SequentialIds, SystemClock, UuidV7Ids};
pub use conversation::{ConversationStore, ListFilter};
pub use crisis::{
    CRISIS_LOG_DELTA, CrisisLog, CrisisLogEntry, CrisisLogRecord, carry_crisis_entries,
    split_crisis_entries,
};
pub use embedding::{EmbeddingProvider, Embeddings, cosine};
pub use error::{ErrorKind, PortError, PortResult};
pub use flow::{ChainProgress, FlowStore, last_reply};
pub use llm::{
    ChunkAccumulator, CompletionChunk, CompletionRequest, CompletionResponse, CompletionStream,
    FinishReason, LlmClient, LlmError, LlmResult, Message, ResponseFormat, Role, ToolCall,
    ToolChoice, ToolDefinition, Usage, chunks_of,
};
pub use queue::{
    DagFailure, DagId, DagSpec, DagState, DagStatus, DagTask, DiscardedTask, FailOutcome, Lease,
    LeaseLost, MapSpec, NodeInput, NodeResult, NodeSpec, NodeState, QueueConfig, QueueDepth,
    QueueFootprint, RecoverReport, TaskId, TaskQueue, TaskSpec, WorkerId,
};
pub use session::{CLAIM_LEASE, SessionStore, TourCatalogStore};
pub use store::{Commit, Committed, MachineStore, Stored, Version, audit_entries, audit_entry};
pub use turn::{
    Checkpointer, FORGET_MEMORY_DELTA, HistoryPage, MemoryStore, ThreadCursor, ThreadPage,
    ThreadSummary, carry_forgotten, split_forgotten,
};
