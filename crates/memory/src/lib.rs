//! In-memory adapters of every Parlance port: the embedded default.
//!
#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "adoption")]
mod adoption;
mod audit;
#[cfg(feature = "conversation")]
mod channel;
#[cfg(feature = "conversation")]
mod conversation;
#[cfg(feature = "turn")]
mod crisis;
pub mod embedding;
#[cfg(feature = "flow")]
mod flow;
pub mod llm;
mod queue;
pub mod records;
#[cfg(feature = "session")]
mod session;
#[cfg(feature = "turn")]
mod turn;

#[cfg(feature = "adoption")]
pub use adoption::MemoryAdoptionStore;
pub use audit::MemoryAuditLog;
#[cfg(feature = "conversation")]
pub use channel::LoopbackChannel;
#[cfg(feature = "conversation")]
pub use conversation::MemoryConversationStore;
#[cfg(feature = "turn")]
pub use crisis::MemoryCrisisLog;
pub use embedding::HashingEmbedder;
#[cfg(feature = "flow")]
pub use flow::MemoryFlowStore;
pub use llm::{OfflineLlm, Reply, Rule, When, text_pieces};
pub use queue::MemoryTaskQueue;
pub use records::Records;
#[cfg(feature = "session")]
pub use session::{MemorySessionStore, MemoryTourCatalogs};
#[cfg(feature = "turn")]
pub use turn::{MemoryCheckpointStore, MemoryMemoryStore};
