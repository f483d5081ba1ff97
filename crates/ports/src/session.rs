//! Storage of session assistance states and of each product's tour catalog.
//!
//! A session is loaded and committed through the one storage protocol,
//! [`MachineStore<SessionState>`](crate::MachineStore); what is left here is
//! what that protocol does not cover: claiming the sessions whose deadline
//! has come ([`SessionStore::claim_due`]), deleting one, and the tour
//! catalogs.

use std::time::Duration;

use async_trait::async_trait;
use parlance_core::session::{SessionKey, SessionState, TourCatalog};
use parlance_core::{ProductId, Timestamp};

use crate::{PortResult, Stored};

/// How long a session claimed by [`SessionStore::claim_due`] stays invisible
/// to other sweepers if its claimer never commits it (a crash, say).
pub const CLAIM_LEASE: Duration = Duration::from_secs(30);

/// The session reads and claims beside load and commit, on the same records
/// as the store's [`MachineStore<SessionState>`](crate::MachineStore), keyed
/// by `(product_id, session_id)`.
///
/// Implemented by [`MemorySessionStore`](https://docs.rs/parlance-memory/latest/parlance_memory/struct.MemorySessionStore.html) and [`PgSessionStore`](https://docs.rs/parlance-postgres/latest/parlance_postgres/struct.PgSessionStore.html), whose
/// constructors' examples call it.
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Deletes the session; false when there was none.
    async fn delete(&self, key: &SessionKey) -> PortResult<bool>;

    /// Claims up to `limit` sessions whose stored deadline (the committed
    /// decision's `next_deadline`) is at or before `now`, earliest first,
    /// across all products. A claimed session's deadline moves to `now +
    /// CLAIM_LEASE`, so concurrent sweepers never take the same one;
    /// committing it sets the real deadline again.
    async fn claim_due(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> PortResult<Vec<Stored<SessionState>>>;

    /// The earliest stored deadline at or before `now`: the oldest session
    /// that [`SessionStore::claim_due`] would take and no sweeper holds (a
    /// claimed one's deadline is in the future), `None` when nothing is
    /// due. A read, for the sweeper's lag.
    async fn oldest_due(&self, now: Timestamp) -> PortResult<Option<Timestamp>>;
}

/// Each product's tour catalog.
///
/// Implemented by [`MemoryTourCatalogs`](https://docs.rs/parlance-memory/latest/parlance_memory/struct.MemoryTourCatalogs.html) and [`PgTourCatalogs`](https://docs.rs/parlance-postgres/latest/parlance_postgres/struct.PgTourCatalogs.html), whose
/// constructors' examples call it.
#[async_trait]
pub trait TourCatalogStore: Send + Sync + 'static {
    /// The product's catalog; the empty catalog when none was stored.
    async fn get(&self, product_id: &ProductId) -> PortResult<TourCatalog>;

    /// Replaces the product's catalog.
    async fn put(&self, product_id: &ProductId, catalog: &TourCatalog) -> PortResult<()>;
}
