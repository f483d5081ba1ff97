//! The heartbeat sweeper: fires due heartbeats, so follow-ups and
//! abandonment happen without traffic.

use std::time::Duration;

use futures::StreamExt as _;

use super::service;
use crate::state::AppState;

/// Instances claimed per sweep.
const BATCH: usize = 100;
/// Firings in flight at once.
const CONCURRENCY: usize = 16;
/// How long a claimed instance is hidden from other sweepers.
const LEASE: Duration = Duration::from_secs(30);

/// Fires every heartbeat due now; returns how many fired. Concurrent
/// sweepers (in other processes too) never fire one heartbeat twice: claims
/// skip each other's rows and firing re-checks the deadline under the row's
/// lock.
///
/// # Errors
///
/// When the store cannot be reached.
pub async fn sweep_once(state: &AppState) -> parlance_ports::PortResult<usize> {
    let mut fired = 0;
    loop {
        let now = state.clock.now();
        let due = state.conversations.claim_due(now, BATCH, LEASE).await?;
        let claimed = due.len();
        // Each firing is its own transaction: run several at once so the
        // batch costs a few commit latencies, not one per instance.
        let results: Vec<_> = futures::stream::iter(due)
            .map(|instance| async move {
                service::apply(
                    state,
                    &instance.product_id,
                    instance.instance_id,
                    |i, now| i.fire_heartbeat(now),
                )
                .await
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        for applied in results {
            fired += usize::from(applied?.is_ok());
        }
        if claimed < BATCH {
            return Ok(fired);
        }
    }
}

/// Sweeps every second until the task is aborted.
pub fn spawn(state: AppState) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match sweep_once(&state).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(fired = n, "conversation heartbeats fired"),
                Err(e) => tracing::warn!(error = %e, "conversation sweep failed"),
            }
        }
    })
}
