//! The session assistance machine as a service: events, the proactive gate,
//! tour catalogs, the audit trail and the sweeper that ticks due sessions.

mod catalog_cache;
mod routes;
mod service;
mod sweeper;

use std::sync::Arc;

use parlance_core::session::SessionState;
use parlance_ports::{MachineStore, SessionStore, TourCatalogStore};

use crate::execute::Executor;
use crate::state::Shared;

pub use catalog_cache::{CATALOG_TTL, CachedTourCatalogs};
pub use routes::routes;
pub use service::{EventApplied, apply_event, gate, load_ticked};
pub use sweeper::{SWEEP_BATCH, SWEEP_CONCURRENCY, SweepReport, spawn_session_sweeper, sweep_once};

/// What the session routes, the service and the sweeper share.
#[derive(Clone)]
pub struct Sessions {
    /// Time, ids, the audit log.
    pub shared: Shared,
    /// Session states: load and commit.
    pub store: Arc<dyn MachineStore<SessionState>>,
    /// The same records' claims of due sessions.
    pub due: Arc<dyn SessionStore>,
    /// Each product's tour catalog.
    pub tours: Arc<dyn TourCatalogStore>,
}

impl Sessions {
    /// The executor every session command goes through.
    fn executor(&self) -> Executor<'_, SessionState> {
        Executor::new(self.store.as_ref(), self.shared.clock.as_ref())
    }
}
