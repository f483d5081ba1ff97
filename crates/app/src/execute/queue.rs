//! Commands on one record wait their turn in this process.
//!
//! Without this, every client of a busy record loads the same version,
//! decides, and all but one lose the compare-and-swap; under enough load
//! some lose every attempt and are refused. Holding a per-record lock from
//! the load to the commit makes the commands of one process queue instead,
//! so a compare-and-swap can only be lost to another process.
//!
//! A map of reference-counted async mutexes, each removed when its last
//! user leaves, so memory follows the records in use, not every record ever
//! seen. (Striping a fixed array of mutexes would need no map, but would
//! queue unrelated records behind one another, including an agent turn
//! behind another thread's model calls.)

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use parlance_core::{EntityKey, EntityKind, Machine};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// A record: its machine, product and id.
type RecordId = (EntityKind, String, String);

/// The records with commands in flight, each with its queue. Every
/// executor of a process shares [`RecordQueues::process`]; another set
/// behaves as another process would.
#[derive(Debug, Default)]
pub struct RecordQueues {
    held: Mutex<HashMap<RecordId, Arc<AsyncMutex<()>>>>,
}

static PROCESS: LazyLock<RecordQueues> = LazyLock::new(RecordQueues::default);

impl RecordQueues {
    /// The queues every executor of this process uses by default.
    pub fn process() -> &'static RecordQueues {
        &PROCESS
    }

    /// Waits until no other command queued here is running on `key`'s
    /// record. Cancelling the wait (a request dropped at its deadline)
    /// leaves the queue as it was.
    pub(super) async fn wait_turn<M: Machine>(&self, key: &M::Key) -> Turn<'_> {
        let id: RecordId = (
            M::KIND,
            key.product_id().as_str().to_owned(),
            key.entity_id().into_owned(),
        );
        let queue = {
            let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            held.entry(id.clone()).or_default().clone()
        };
        // A cancelled wait leaves its entry behind until the record is next
        // used, when the last one out removes it.
        let guard = queue.lock_owned().await;
        Turn {
            queues: self,
            id,
            guard: Some(guard),
        }
    }
}

/// The turn of one command on one record; the next command's starts when
/// it is dropped.
pub(super) struct Turn<'a> {
    queues: &'a RecordQueues,
    id: RecordId,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut held = self
            .queues
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Entry::Occupied(e) = held.entry(self.id.clone()) {
            // Only the map holds it: nobody is running or waiting.
            if Arc::strong_count(e.get()) == 1 {
                e.remove();
            }
        }
    }
}

/// `product`'s records with a queue (for tests).
#[cfg(test)]
fn queued_records(product: &str) -> usize {
    PROCESS
        .held
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .keys()
        .filter(|(_, p, _)| p == product)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use parlance_core::session::{SessionKey, SessionState};
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn one_command_per_record_at_a_time_and_nothing_left_behind() {
        let product = parlance_core::ProductId::parse("queue-test").unwrap();
        let inside: Arc<[AtomicUsize; 2]> = Arc::new(Default::default());
        let most: Arc<[AtomicUsize; 2]> = Arc::new(Default::default());
        let mut tasks = Vec::new();
        for i in 0..64 {
            let record = i % 2;
            let key = SessionKey::new(product.clone(), format!("s{record}").parse().unwrap());
            let (inside, most) = (inside.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                let _turn = RecordQueues::process()
                    .wait_turn::<SessionState>(&key)
                    .await;
                let now = inside[record].fetch_add(1, Ordering::SeqCst) + 1;
                most[record].fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                inside[record].fetch_sub(1, Ordering::SeqCst);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        for record in 0..2 {
            assert_eq!(most[record].load(Ordering::SeqCst), 1, "record {record}");
        }
        assert_eq!(
            queued_records("queue-test"),
            0,
            "every queue is removed when empty"
        );
    }
}
