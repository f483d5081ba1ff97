//! PostgreSQL adapters of every Parlance storage and queue port, with embedded migrations.
//!
#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "adoption")]
mod adoption;
mod api_keys;
mod audit;
#[cfg(feature = "conversation")]
mod conversation;
#[cfg(feature = "turn")]
mod crisis;
pub mod error;
#[cfg(feature = "flow")]
mod flow;
mod pool;
mod queue;
#[cfg(feature = "session")]
mod session;
pub mod testing;
mod time;
#[cfg(feature = "turn")]
mod turn;

#[cfg(feature = "adoption")]
pub use adoption::PgAdoptionStore;
pub use api_keys::{ApiKeyRecord, PgApiKeys};
pub use audit::PgAuditLog;
#[cfg(feature = "conversation")]
pub use conversation::PgConversationStore;
#[cfg(feature = "turn")]
pub use crisis::PgCrisisLog;
#[cfg(feature = "flow")]
pub use flow::PgFlowStore;
pub use pool::{DatabaseUrl, PoolOptions, connect, migrate, ping};
pub use queue::{PgTaskQueue, statements as queue_statements};
#[cfg(feature = "session")]
pub use session::{PgSessionStore, PgTourCatalogs};
pub use sqlx::PgPool;
#[cfg(feature = "turn")]
pub use turn::{PgCheckpointStore, PgMemoryStore};
