//! The session assistance machine as a service: events, the proactive gate,
//! tour catalogs, the audit trail and the sweeper that ticks due sessions.

mod catalog_cache;
mod routes;
mod service;
mod sweeper;

pub use catalog_cache::{CATALOG_TTL, CachedTourCatalogs};
pub use routes::routes;
pub use service::{
    EventApplied, MAX_ATTEMPTS, ServiceError, SessionEvent, apply_event, gate, load_ticked,
};
pub use sweeper::{SWEEP_BATCH, SWEEP_CONCURRENCY, SweepReport, spawn_session_sweeper, sweep_once};
