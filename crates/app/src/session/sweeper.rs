//! The sweeper: claims sessions whose deadline has come and ticks them, so
//! silent timeouts and cooldown ends happen without traffic.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parlance_core::session::TourCatalog;
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{AuditEntry, PortError, PortResult, SessionSave, StoredSession};
use serde_json::json;
use tokio::task::{JoinHandle, JoinSet};

use crate::state::AppState;

/// Most sessions claimed per batch.
pub const SWEEP_BATCH: usize = 500;

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Sessions claimed (their deadline had come).
    pub claimed: usize,
    /// Of those, sessions whose tick changed state (timeouts).
    pub transitions: usize,
    /// Of those, saves lost to a concurrent event (which ticked them itself).
    pub conflicts: usize,
}

/// How many claimed sessions are ticked and saved at once. Saves are
/// independent, so the sweep is bound by round trips, not by the database.
pub const SWEEP_CONCURRENCY: usize = 16;

/// How one claimed session's save went.
enum Swept {
    Saved { transitioned: bool },
    Conflict,
}

async fn tick_and_save(
    app: AppState,
    stored: StoredSession,
    tours: Arc<TourCatalog>,
    now: Timestamp,
) -> PortResult<Swept> {
    let mut s = stored.state;
    let out = s.tick(now, &tours);
    let audit: Vec<AuditEntry> = out
        .transition
        .as_ref()
        .map(|tr| AuditEntry {
            product_id: s.product_id().clone(),
            entity_kind: "session".to_owned(),
            entity_id: s.session_id().as_str().to_owned(),
            from: Some(tr.from.as_str().to_owned()),
            to: tr.to.as_str().to_owned(),
            cause: tr.cause.to_owned(),
            at: now,
            payload: json!({"event": "sweep"}),
        })
        .into_iter()
        .collect();
    let save = SessionSave {
        state: &s,
        expected_version: stored.version,
        next_deadline: s.next_deadline(&tours),
        audit: &audit,
    };
    match app.sessions.save(save).await {
        Ok(_) => Ok(Swept::Saved {
            transitioned: out.changed_state(),
        }),
        // An event saved it meanwhile, ticking it first: nothing is lost.
        Err(e) if e.is_conflict() => Ok(Swept::Conflict),
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

/// Claims up to `limit` due sessions, ticks each with its product's tour
/// catalog and saves it (with any transition's audit entry),
/// [`SWEEP_CONCURRENCY`] at a time.
///
/// # Errors
///
/// When claiming, loading a catalog or saving fails (other than a conflict);
/// the other claimed sessions are still saved first.
pub async fn sweep_once(app: &AppState, limit: usize) -> PortResult<SweepReport> {
    let now = app.clock.now();
    let claimed = app.sessions.claim_due(now, limit).await?;
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
        tasks.spawn(tick_and_save(app.clone(), stored, tours, now));
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

/// Spawns the sweeper: every second, sweeps until a batch comes back short.
/// Failures are logged and retried on the next second.
pub fn spawn_session_sweeper(app: AppState) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            every.tick().await;
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
