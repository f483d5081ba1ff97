//! The heartbeat sweeper: fires due heartbeats, so follow-ups and
//! abandonment happen without traffic.

use std::time::Duration;

use futures::StreamExt as _;
use parlance_core::conversation::ConversationCommand;

use super::Conversations;
use super::service;
use crate::execute::ServiceError;

/// Instances claimed per sweep.
const BATCH: usize = 100;
/// Firings in flight at once.
const CONCURRENCY: usize = 16;
/// How long a claimed instance is hidden from other sweepers.
const LEASE: Duration = Duration::from_secs(30);

/// Fires every heartbeat due now; returns how many fired. Concurrent
/// sweepers (in other processes too) never fire one heartbeat twice: claims
/// skip each other's rows, and a firing is a command like any other, a
/// compare-and-swap on the version decided again on a fresh load when it
/// loses, where the fired heartbeat is no longer armed.
///
/// # Errors
///
/// When the store cannot be reached.
pub async fn sweep_once(state: &Conversations) -> parlance_ports::PortResult<usize> {
    let mut fired = 0;
    loop {
        let now = state.shared.clock.now();
        let due = state.index.claim_due(now, BATCH, LEASE).await?;
        let claimed = due.len();
        // Each firing is its own transaction: run several at once so the
        // batch costs a few commit latencies, not one per instance.
        let results: Vec<_> =
            futures::stream::iter(due)
                .map(|key| async move {
                    service::run(state, &key, ConversationCommand::TimerFired).await
                })
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
        for result in results {
            match result {
                Ok(_) => fired += 1,
                Err(ServiceError::Port(e)) => return Err(e),
                Err(e @ ServiceError::Contended { .. }) => {
                    // A later sweep fires it if it is still due.
                    tracing::warn!(error = %e, "a heartbeat lost every race to other writers");
                }
                // Not due any more, or moved on: nothing to fire.
                Err(_) => {}
            }
        }
        if claimed < BATCH {
            return Ok(fired);
        }
    }
}

/// Sets the sweeper's lag: how long the oldest due heartbeat no sweeper
/// holds has waited.
pub(super) async fn observe_lag(state: &Conversations) {
    let now = state.shared.clock.now();
    match state.index.oldest_due(now).await {
        Ok(oldest) => crate::monitoring::sweeper_lag("conversation", now, oldest),
        Err(e) => tracing::debug!(error = %e, "could not read the oldest due heartbeat"),
    }
}

/// Every second, sets the sweeper's lag and sweeps, until the task is
/// aborted.
pub fn spawn(state: Conversations) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            observe_lag(&state).await;
            match sweep_once(&state).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(fired = n, "conversation heartbeats fired"),
                Err(e) => tracing::warn!(error = %e, "conversation sweep failed"),
            }
        }
    })
}
