//! PostgreSQL adapters of every Parlance storage and queue port.
//!
//! Layer: adapter. Depends on `parlance-core`, `parlance-ports`, sqlx (with
//! rustls, never OpenSSL) and tokio; never on another adapter. Queries are
//! checked at run time (`sqlx::query`), so building never needs a live
//! database. Migrations live in `migrations/` and are embedded into the
//! binary; [`migrate`] applies them. Errors from sqlx are classified into
//! [`parlance_ports::PortError`] at this boundary (see [`error`]).

#![forbid(unsafe_code)]

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
