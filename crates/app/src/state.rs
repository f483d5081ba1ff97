//! What every request handler shares: the adapters behind the ports.

use std::sync::Arc;

use parlance_memory::{MemoryAuditLog, MemorySessionStore, MemoryTourCatalogs};
use parlance_ports::{
    AuditLog, Clock, IdGen, PortResult, SessionStore, SystemClock, TourCatalogStore, UuidV7Ids,
};
use parlance_postgres::{PgAuditLog, PgPool, PgSessionStore, PgTourCatalogs};

use crate::auth::ApiKeys;
use crate::session::{CATALOG_TTL, CachedTourCatalogs};

/// Where state is kept.
#[derive(Debug, Clone)]
pub enum Backend {
    /// In process; lost on exit.
    Memory,
    /// A PostgreSQL database (migrated).
    Postgres(PgPool),
}

impl Backend {
    /// `"memory"` or `"postgres"`.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Whether the backend answers now.
    pub async fn check(&self) -> PortResult<()> {
        match self {
            Backend::Memory => Ok(()),
            Backend::Postgres(pool) => parlance_postgres::ping(pool).await,
        }
    }
}

/// Shared, cheaply cloned service state.
#[derive(Clone)]
pub struct AppState {
    /// The storage backend.
    pub backend: Backend,
    /// Every transition, with its cause.
    pub audit: Arc<dyn AuditLog>,
    /// Session assistance states.
    pub sessions: Arc<dyn SessionStore>,
    /// Each product's tour catalog.
    pub tours: Arc<dyn TourCatalogStore>,
    /// The time source.
    pub clock: Arc<dyn Clock>,
    /// The id source.
    pub ids: Arc<dyn IdGen>,
    /// API keys and the products they open.
    pub keys: Arc<ApiKeys>,
    /// Largest accepted request body, in bytes.
    pub body_limit: usize,
}

impl AppState {
    /// State on the in-memory adapters with the system clock.
    pub fn memory(keys: ApiKeys) -> Self {
        Self::memory_with(keys, Arc::new(SystemClock), Arc::new(UuidV7Ids))
    }

    /// State on the in-memory adapters with the given clock and ids.
    pub fn memory_with(keys: ApiKeys, clock: Arc<dyn Clock>, ids: Arc<dyn IdGen>) -> Self {
        let audit = Arc::new(MemoryAuditLog::new());
        Self {
            backend: Backend::Memory,
            sessions: Arc::new(MemorySessionStore::new(audit.clone())),
            tours: Arc::new(MemoryTourCatalogs::new()),
            audit,
            clock,
            ids,
            keys: Arc::new(keys),
            body_limit: 1024 * 1024,
        }
    }

    /// State on PostgreSQL (the pool must be migrated) with the system clock.
    pub fn postgres(pool: PgPool, keys: ApiKeys) -> Self {
        Self {
            audit: Arc::new(PgAuditLog::new(pool.clone())),
            sessions: Arc::new(PgSessionStore::new(pool.clone())),
            tours: Arc::new(CachedTourCatalogs::new(
                Arc::new(PgTourCatalogs::new(pool.clone())),
                CATALOG_TTL,
            )),
            backend: Backend::Postgres(pool),
            clock: Arc::new(SystemClock),
            ids: Arc::new(UuidV7Ids),
            keys: Arc::new(keys),
            body_limit: 1024 * 1024,
        }
    }
}
