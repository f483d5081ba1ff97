//! The sweeper: claims sessions whose deadline has come and ticks them, so
//! silent timeouts and cooldown ends happen without traffic.

use std::collections::HashMap;
use std::time::Duration;

use parlance_core::ProductId;
use parlance_core::session::TourCatalog;
use parlance_ports::{AuditEntry, PortResult, SessionSave};
use serde_json::json;
use tokio::task::JoinHandle;

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

/// Claims up to `limit` due sessions, ticks each with its product's tour
/// catalog and saves it (with any transition's audit entry).
///
/// # Errors
///
/// When claiming, loading a catalog or saving fails (other than a conflict).
pub async fn sweep_once(app: &AppState, limit: usize) -> PortResult<SweepReport> {
    let now = app.clock.now();
    let claimed = app.sessions.claim_due(now, limit).await?;
    let mut report = SweepReport {
        claimed: claimed.len(),
        ..SweepReport::default()
    };
    let mut catalogs: HashMap<ProductId, TourCatalog> = HashMap::new();
    for stored in claimed {
        let product = stored.state.product_id().clone();
        if !catalogs.contains_key(&product) {
            let c = app.tours.get(&product).await?;
            catalogs.insert(product.clone(), c);
        }
        let tours = &catalogs[&product];
        let mut s = stored.state;
        let out = s.tick(now, tours);
        let audit: Vec<AuditEntry> = out
            .transition
            .as_ref()
            .map(|tr| AuditEntry {
                product_id: product.clone(),
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
            next_deadline: s.next_deadline(tours),
            audit: &audit,
        };
        match app.sessions.save(save).await {
            Ok(_) => report.transitions += usize::from(out.changed_state()),
            // An event saved it meanwhile, ticking it first: nothing is lost.
            Err(e) if e.is_conflict() => report.conflicts += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(report)
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
