//! In-memory adapters of every Parlance port: the embedded default.
//!
//! Layer: adapter. Depends on `parlance-core` and `parlance-ports` (and tokio
//! where a port needs waiting); never on another adapter. Used by `parlance
//! serve` when no database is configured and by every test that does not need
//! PostgreSQL. Each adapter passes the same `parlance-testkit` contract suite
//! as its PostgreSQL twin, so the two behave alike. Nothing here survives a
//! restart.

#![forbid(unsafe_code)]

mod adoption;
mod audit;
mod channel;
mod conversation;
mod crisis;
pub mod embedding;
mod flow;
pub mod llm;
mod queue;
pub mod records;
mod session;
mod turn;

pub use adoption::MemoryAdoptionStore;
pub use audit::MemoryAuditLog;
pub use channel::LoopbackChannel;
pub use conversation::MemoryConversationStore;
pub use crisis::MemoryCrisisLog;
pub use embedding::HashingEmbedder;
pub use flow::MemoryFlowStore;
pub use llm::{OfflineLlm, PromptFacts, Reply, Rule, When, text_pieces};
pub use queue::MemoryTaskQueue;
pub use records::Records;
pub use session::{MemorySessionStore, MemoryTourCatalogs};
pub use turn::{MemoryCheckpointStore, MemoryMemoryStore};
