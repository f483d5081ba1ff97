//! Storage of session assistance states and of each product's tour catalog.

use std::time::Duration;

use async_trait::async_trait;
use parlance_core::session::{SessionId, SessionState, TourCatalog};
use parlance_core::{ProductId, Timestamp};

use crate::{AuditEntry, PortResult};

/// How long a session claimed by [`SessionStore::claim_due`] stays invisible
/// to other sweepers if its claimer never saves it (a crash, say).
pub const CLAIM_LEASE: Duration = Duration::from_secs(30);

/// A stored session and the version a save must name.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSession {
    /// The state as last saved.
    pub state: SessionState,
    /// Increases by one on every save; starts at 1 when created.
    pub version: i64,
}

/// A compare-and-swap save.
#[derive(Debug, Clone, Copy)]
pub struct SessionSave<'a> {
    /// The new state; its `product_id` and `session_id` name the record.
    pub state: &'a SessionState,
    /// The version the state was loaded at; any other stored version is a
    /// [`crate::ErrorKind::Conflict`].
    pub expected_version: i64,
    /// When the session next needs a tick (`state.next_deadline(tours)`);
    /// indexed, so sweeping costs grow with what is due.
    pub next_deadline: Option<Timestamp>,
    /// Audit entries to append atomically with the save (none on conflict).
    pub audit: &'a [AuditEntry],
}

/// Session states, keyed by `(product_id, session_id)`.
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// The stored session, if any.
    async fn get(
        &self,
        product_id: &ProductId,
        session_id: &SessionId,
    ) -> PortResult<Option<StoredSession>>;

    /// The stored session, or a new one (defaults, anchored at `now`, version
    /// 1) stored first. Concurrent callers all get the same record.
    async fn get_or_create(
        &self,
        product_id: &ProductId,
        session_id: &SessionId,
        now: Timestamp,
    ) -> PortResult<StoredSession>;

    /// Saves `save.state` if the stored version is `save.expected_version`,
    /// with its audit entries, and returns the new version. A different
    /// version, or a record deleted meanwhile, is a `Conflict`: reload, apply
    /// again and retry.
    async fn save(&self, save: SessionSave<'_>) -> PortResult<i64>;

    /// Deletes the session; false when there was none.
    async fn delete(&self, product_id: &ProductId, session_id: &SessionId) -> PortResult<bool>;

    /// Claims up to `limit` sessions whose next deadline is at or before
    /// `now`, earliest first, across all products. A claimed session's
    /// deadline moves to `now + CLAIM_LEASE`, so concurrent sweepers never
    /// take the same one; saving it sets the real deadline again.
    async fn claim_due(&self, now: Timestamp, limit: usize) -> PortResult<Vec<StoredSession>>;
}

/// Each product's tour catalog.
#[async_trait]
pub trait TourCatalogStore: Send + Sync + 'static {
    /// The product's catalog; the empty catalog when none was stored.
    async fn get(&self, product_id: &ProductId) -> PortResult<TourCatalog>;

    /// Replaces the product's catalog.
    async fn put(&self, product_id: &ProductId, catalog: &TourCatalog) -> PortResult<()>;
}
