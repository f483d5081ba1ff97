//! Port traits of Parlance: storage, queue, LLM, clock and ids, with their errors.
//!
#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "adoption")]
pub mod adoption;
pub mod audit;
#[cfg(feature = "conversation")]
pub mod channel;
pub mod clock;
#[cfg(feature = "conversation")]
pub mod conversation;
#[cfg(feature = "turn")]
pub mod crisis;
pub mod embedding;
pub mod error;
#[cfg(feature = "flow")]
pub mod flow;
pub mod llm;
pub mod queue;
#[cfg(feature = "session")]
pub mod session;
pub mod store;
#[cfg(feature = "turn")]
pub mod turn;

#[cfg(feature = "adoption")]
pub use adoption::AdoptionStore;
pub use audit::{AuditEntry, AuditLog, AuditRecord};
#[cfg(feature = "conversation")]
pub use channel::{Channel, Outbound};
pub use clock::{Clock, IdGen, ManualClock, SequentialIds, SystemClock, UuidV7Ids};
#[cfg(feature = "conversation")]
pub use conversation::{
    ConversationPage, ConversationStore, ListCursor, ListFilter, ListOrder, MAX_LIST,
};
#[cfg(feature = "turn")]
pub use crisis::{
    CRISIS_LOG_DELTA, CrisisLog, CrisisLogEntry, CrisisLogRecord, carry_crisis_entries,
    split_crisis_entries,
};
pub use embedding::{EmbeddingProvider, Embeddings, cosine};
pub use error::{ErrorKind, PortError, PortResult};
#[cfg(feature = "flow")]
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
#[cfg(feature = "session")]
pub use session::{CLAIM_LEASE, SessionStore, TourCatalogStore};
pub use store::{Commit, Committed, MachineStore, Stored, Version, audit_entries, audit_entry};
#[cfg(feature = "turn")]
pub use turn::{
    Checkpointer, FORGET_MEMORY_DELTA, HistoryPage, MemoryStore, ThreadCursor, ThreadPage,
    ThreadSummary, carry_forgotten, split_forgotten,
};
