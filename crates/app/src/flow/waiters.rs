//! Polls that wait a little for a session's run to end.
//!
//! A client polls a session until its task graph is done. When the graph
//! runs on a worker in this process, the poll need not answer "still
//! running" over and over: it waits (up to the service's poll wait) and is
//! woken the moment a change of that session commits here. A change
//! committed by another process is seen by re-reading the session every
//! [`RECHECK`] while waiting, so a poll is never later than that.
//!
//! A map of reference-counted [`Notify`]s by session, each removed when
//! its last waiter leaves, so memory follows the polls in flight. (One
//! process-wide `Notify` would wake every waiting poll on every commit,
//! each to re-read its session for nothing.)

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use parlance_core::flow::FlowKey;
use tokio::sync::Notify;

/// How often a waiting poll re-reads its session when nothing in this
/// process wakes it (the run finished in another process).
pub(super) const RECHECK: Duration = Duration::from_millis(20);

/// The polls waiting, by session.
#[derive(Debug, Default)]
pub(super) struct Waiters {
    by_session: Mutex<HashMap<FlowKey, Arc<Notify>>>,
}

impl Waiters {
    /// A waiter on `key`'s session; wakes when [`Waiters::wake`] is called
    /// for it while its `notified()` future is enabled.
    pub(super) fn waiter(&self, key: &FlowKey) -> Waiter<'_> {
        let notify = self
            .by_session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.clone())
            .or_default()
            .clone();
        Waiter {
            waiters: self,
            key: key.clone(),
            notify,
        }
    }

    /// Wakes the polls waiting on `key`'s session (a change of it
    /// committed).
    pub(super) fn wake(&self, key: &FlowKey) {
        let map = self
            .by_session
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = map.get(key) {
            n.notify_waiters();
        }
    }

    /// Sessions with a poll waiting (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// One poll's registration; leaves the map when dropped.
pub(super) struct Waiter<'a> {
    waiters: &'a Waiters,
    key: FlowKey,
    notify: Arc<Notify>,
}

impl Waiter<'_> {
    /// The `Notify` woken for this session.
    pub(super) fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut map = self
            .waiters
            .by_session
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Entry::Occupied(e) = map.entry(self.key.clone()) {
            // Only the map and this waiter hold it: nobody else waits.
            if Arc::ptr_eq(e.get(), &self.notify) && Arc::strong_count(e.get()) == 2 {
                e.remove();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> FlowKey {
        FlowKey::new(
            parlance_core::ProductId::parse("p").unwrap(),
            id.parse().unwrap(),
        )
    }

    #[tokio::test]
    async fn a_wake_reaches_the_waiters_of_its_session_only_and_nothing_is_left() {
        let w = Waiters::default();
        let (a, b) = (key("a"), key("b"));
        let wa = w.waiter(&a);
        let wb = w.waiter(&b);
        {
            let fa = wa.notify().notified();
            let fb = wb.notify().notified();
            tokio::pin!(fa, fb);
            fa.as_mut().enable();
            fb.as_mut().enable();
            w.wake(&a);
            tokio::time::timeout(Duration::from_secs(5), fa)
                .await
                .expect("a's waiter is woken");
            assert!(
                tokio::time::timeout(Duration::from_millis(20), fb)
                    .await
                    .is_err(),
                "b's waiter sleeps on"
            );
        }
        drop((wa, wb));
        assert_eq!(w.len(), 0);
    }
}
