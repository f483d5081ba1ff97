#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod adoption;
mod api_keys;
mod audit;
mod conversation;
mod crisis;
pub mod error;
mod flow;
mod pool;
mod queue;
mod session;
pub mod testing;
mod time;
mod turn;

pub use adoption::PgAdoptionStore;
pub use api_keys::{ApiKeyRecord, PgApiKeys};
pub use audit::PgAuditLog;
pub use conversation::PgConversationStore;
pub use crisis::PgCrisisLog;
pub use flow::PgFlowStore;
pub use pool::{DatabaseUrl, PoolOptions, connect, migrate, ping};
pub use queue::{PgTaskQueue, statements as queue_statements};
pub use session::{PgSessionStore, PgTourCatalogs};
pub use sqlx::PgPool;
pub use turn::{PgCheckpointStore, PgMemoryStore};
