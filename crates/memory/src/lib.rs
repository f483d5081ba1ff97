#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

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
pub use llm::{OfflineLlm, Reply, Rule, When, text_pieces};
pub use queue::MemoryTaskQueue;
pub use records::Records;
pub use session::{MemorySessionStore, MemoryTourCatalogs};
pub use turn::{MemoryCheckpointStore, MemoryMemoryStore};
