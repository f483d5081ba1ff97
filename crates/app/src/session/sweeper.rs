//! The sweeper: claims sessions whose deadline has come and ticks them, so
//! silent timeouts and cooldown ends happen without traffic.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parlance_core::session::{SessionCommand, SessionState, TourCatalog};
use parlance_core::{Machine as _, ProductId, Timestamp};
use parlance_ports::{Commit, PortError, PortResult, Stored};
use tokio::task::{JoinHandle, JoinSet};

use super::Sessions;

/// Most sessions claimed per batch.
pub const SWEEP_BATCH: usize = 500;

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Sessions claimed (their deadline had come).
    pub claimed: usize,
    /// Of those, sessions whose tick changed state (timeouts).
    pub transitions: usize,
    /// Of those, commits lost to a concurrent event (which ticked them itself).
    pub conflicts: usize,
}

/// How many claimed sessions are ticked and committed at once. Commits are
/// independent, so the sweep is bound by round trips, not by the database.
pub const SWEEP_CONCURRENCY: usize = 16;

/// How one claimed session's commit went.
enum Swept {
    Saved { transitioned: bool },
    Conflict,
}

/// Decides the sweep of one claimed session and commits it once: a lost
/// compare-and-swap means an event committed it meanwhile, ticking it
/// first, so nothing is lost and nothing is retried.
async fn sweep_one(
    app: Sessions,
    stored: Stored<SessionState>,
    tours: Arc<TourCatalog>,
    now: Timestamp,
) -> PortResult<Swept> {
    let Stored { mut state, version } = stored;
    let command = SessionCommand::Sweep;
    let decision = state.decide(&tours, &command, now).map_err(|e| {
        PortError::other(format!("session {} refused its sweep", state.session_id())).with_source(e)
    })?;
    let key = state.key();
    let commit = Commit {
        key: &key,
        expected: Some(version),
        command: &command,
        state: &state,
        decision: &decision,
        now,
    };
    match app.store.commit(commit).await {
        Ok(_) => Ok(Swept::Saved {
            transitioned: !decision.transitions.is_empty(),
        }),
        Err(e) if e.is_conflict() => {
            crate::monitoring::cas_conflict(SessionState::KIND.as_str());
            Ok(Swept::Conflict)
        }
        Err(e) => Err(e),
    }
}

impl SweepReport {
    fn add(&mut self, r: Result<PortResult<Swept>, tokio::task::JoinError>) -> PortResult<()> {
        match r {
            Ok(Ok(Swept::Saved { transitioned })) => {
                self.transitions += usize::from(transitioned);
                Ok(())
            }
            Ok(Ok(Swept::Conflict)) => {
                self.conflicts += 1;
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(e) => Err(PortError::other("session sweep task failed").with_source(e)),
        }
    }
}

/// Claims up to `limit` due sessions and decides the sweeper's tick on each
/// with its product's tour catalog, committing it (with any transition's
/// audit entry) [`SWEEP_CONCURRENCY`] at a time.
///
/// # Errors
///
/// When claiming, loading a catalog or committing fails (other than a
/// conflict); the other claimed sessions are still committed first.
pub async fn sweep_once(app: &Sessions, limit: usize) -> PortResult<SweepReport> {
    let now = app.shared.clock.now();
    let claimed = app.due.claim_due(now, limit).await?;
    let mut report = SweepReport {
        claimed: claimed.len(),
        ..SweepReport::default()
    };
    let mut catalogs: HashMap<ProductId, Arc<TourCatalog>> = HashMap::new();
    let mut first_error = None;
    let mut tasks = JoinSet::new();
    for stored in claimed {
        let product = stored.state.product_id().clone();
        let tours = match catalogs.get(&product) {
            Some(c) => Arc::clone(c),
            None => match app.tours.get(&product).await {
                Ok(c) => {
                    let c = Arc::new(c);
                    catalogs.insert(product, Arc::clone(&c));
                    c
                }
                Err(e) => {
                    // Left claimed: it comes back when the lease ends.
                    first_error.get_or_insert(e);
                    continue;
                }
            },
        };
        if tasks.len() >= SWEEP_CONCURRENCY
            && let Some(done) = tasks.join_next().await
            && let Err(e) = report.add(done)
        {
            first_error.get_or_insert(e);
        }
        tasks.spawn(sweep_one(app.clone(), stored, tours, now));
    }
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = report.add(done) {
            first_error.get_or_insert(e);
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

/// Sets the sweeper's lag: how long the oldest due session has waited.
pub(super) async fn observe_lag(app: &Sessions) {
    let now = app.shared.clock.now();
    match app.due.oldest_due(now).await {
        Ok(oldest) => crate::monitoring::sweeper_lag("session", now, oldest),
        Err(e) => tracing::debug!(error = %e, "could not read the oldest due session"),
    }
}

/// Spawns the sweeper: every second, sets its lag and sweeps until a batch
/// comes back short.
/// Failures are logged and retried on the next second.
pub fn spawn_session_sweeper(app: Sessions) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            every.tick().await;
            observe_lag(&app).await;
            loop {
                match sweep_once(&app, SWEEP_BATCH).await {
                    Ok(r) if r.claimed == SWEEP_BATCH => continue,
                    Ok(r) => {
                        if r.claimed > 0 {
                            tracing::debug!(
                                claimed = r.claimed,
                                transitions = r.transitions,
                                "sessions swept"
                            );
                        }
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "session sweep failed");
                        break;
                    }
                }
            }
        }
    })
}
