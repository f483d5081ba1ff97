//! Port traits of Parlance: what the application needs from the outside world.
//!
//! Layer: above `parlance-core`, below the adapters (`parlance-memory`,
//! `parlance-postgres`, `parlance-openai`) and `parlance-app`. It may depend on
//! `parlance-core`, serde, thiserror, async-trait and uuid; never on sqlx,
//! tokio or axum. Ports are object-safe `async_trait` traits with `&self`
//! receivers, so the app holds them as `Arc<dyn Port>`; each reports failures
//! as a [`PortError`] whose [`ErrorKind`] tells the caller what to do.

#![forbid(unsafe_code)]

pub mod audit;
pub mod clock;
pub mod error;
pub mod session;

pub use audit::{AuditEntry, AuditLog, AuditRecord};
pub use clock::{Clock, IdGen, ManualClock, SequentialIds, SystemClock, UuidV7Ids};
pub use error::{ErrorKind, PortError, PortResult};
pub use session::{CLAIM_LEASE, SessionSave, SessionStore, StoredSession, TourCatalogStore};
