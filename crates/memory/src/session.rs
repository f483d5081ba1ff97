//! Session states on [`Records`] with a deadline index, and tour catalogs
//! in a map.
//!
//! A commit writes the state, its audit entries, its tasks and the
//! session's next deadline under the records' one gate; a claim of due
//! sessions holds the same gate, so it never sees a commit half done.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use parlance_core::queue::DagLimits;
use parlance_core::session::{SessionKey, SessionState, TourCatalog};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{
    CLAIM_LEASE, Commit, Committed, MachineStore, PortResult, SessionStore, Stored, TaskQueue,
    TourCatalogStore,
};

use crate::MemoryAuditLog;
use crate::records::{RecordKey, Records, record_key};

/// The deadline index: every session with a deadline, earliest first.
#[derive(Debug, Default)]
struct Due {
    at: HashMap<RecordKey, Timestamp>,
    order: BTreeSet<(Timestamp, RecordKey)>,
}

impl Due {
    fn set(&mut self, key: &RecordKey, deadline: Option<Timestamp>) {
        if let Some(old) = self.at.remove(key) {
            self.order.remove(&(old, key.clone()));
        }
        if let Some(new) = deadline {
            self.at.insert(key.clone(), new);
            self.order.insert((new, key.clone()));
        }
    }
}

/// Session states held in memory. A commit appends its audit entries to the
/// given audit log and enqueues its tasks on the given queue under the same
/// gate as the state, so all happen or none does.
#[derive(Debug)]
pub struct MemorySessionStore {
    records: Records<SessionState>,
    due: Mutex<Due>,
}

impl MemorySessionStore {
    /// An empty store writing audit entries to `audit` and tasks to `queue`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// use parlance_core::session::{
    ///     DEFAULT_INTERACTION_TIMEOUT_S, SessionCommand, SessionEvent, SessionId, SessionKey,
    ///     SessionState, TourCatalog,
    /// };
    /// use parlance_core::{Machine, ProductId};
    /// use parlance_memory::{MemoryAuditLog, MemorySessionStore, MemoryTaskQueue};
    /// use parlance_ports::{Clock, Commit, MachineStore, ManualClock, QueueConfig, SessionStore};
    ///
    /// let clock = Arc::new(ManualClock::new());
    /// let queue = Arc::new(MemoryTaskQueue::new(clock.clone(), QueueConfig::default()));
    /// let store = MemorySessionStore::new(Arc::new(MemoryAuditLog::new()), queue);
    /// let key = SessionKey::new(ProductId::parse("acme")?, SessionId::parse("visit-1")?);
    /// let tours = TourCatalog::default();
    ///
    /// // The user opens the chat as the session is created: two commits.
    /// let (state, decision) = SessionState::create(&key, &tours, &SessionCommand::Create, clock.now())?
    ///     .expect("`Create` creates a session");
    /// let created = store
    ///     .commit(Commit {
    ///         key: &key,
    ///         expected: None,
    ///         command: &SessionCommand::Create,
    ///         state: &state,
    ///         decision: &decision,
    ///         now: clock.now(),
    ///     })
    ///     .await?;
    /// let open = SessionCommand::Event(SessionEvent::OpenChat);
    /// let mut state = state;
    /// let decision = state.decide(&tours, &open, clock.now())?;
    /// store
    ///     .commit(Commit {
    ///         key: &key,
    ///         expected: Some(created.version),
    ///         command: &open,
    ///         state: &state,
    ///         decision: &decision,
    ///         now: clock.now(),
    ///     })
    ///     .await?;
    ///
    /// // Nothing is due until the interaction timeout has passed; then a sweeper
    /// // claims the session to tick it.
    /// assert!(store.claim_due(clock.now(), 10).await?.is_empty());
    /// clock.advance(Duration::from_secs_f64(DEFAULT_INTERACTION_TIMEOUT_S + 1.0));
    /// let due = store.claim_due(clock.now(), 10).await?;
    /// assert_eq!(due.len(), 1);
    /// assert_eq!(due[0].state.key(), key);
    /// assert!(store.delete(&key).await?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(audit: Arc<MemoryAuditLog>, queue: Arc<dyn TaskQueue>) -> Self {
        Self {
            records: Records::new(audit, Some(queue), DagLimits::default()),
            due: Mutex::new(Due::default()),
        }
    }

    fn due(&self) -> MutexGuard<'_, Due> {
        self.due.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl MachineStore<SessionState> for MemorySessionStore {
    async fn load(&self, key: &SessionKey) -> PortResult<Option<Stored<SessionState>>> {
        Ok(self.records.load(key).await)
    }

    async fn commit(&self, c: Commit<'_, SessionState>) -> PortResult<Committed<SessionState>> {
        let deadline = c.decision.next_deadline;
        let version = self
            .records
            .commit(
                &c,
                c.state.clone(),
                |_| Ok(()),
                |_, _, ()| self.due().set(&record_key(c.key), deadline),
            )
            .await?;
        Ok(Committed::at(version))
    }
}

#[async_trait]
impl SessionStore for MemorySessionStore {
    async fn delete(&self, key: &SessionKey) -> PortResult<bool> {
        let _gate = self.records.gate().await;
        let rk = record_key(key);
        self.due().set(&rk, None);
        Ok(self.records.lock().remove(&rk).is_some())
    }

    async fn claim_due(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> PortResult<Vec<Stored<SessionState>>> {
        let _gate = self.records.gate().await;
        let mut due = self.due();
        let keys: Vec<RecordKey> = due
            .order
            .iter()
            .take_while(|(deadline, _)| *deadline <= now)
            .take(limit)
            .map(|(_, key)| key.clone())
            .collect();
        let lease = Some(now + CLAIM_LEASE);
        let records = self.records.lock();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            match records.get(&key) {
                Some(stored) => {
                    due.set(&key, lease);
                    out.push(stored.clone());
                }
                None => due.set(&key, None),
            }
        }
        Ok(out)
    }

    async fn oldest_due(&self, now: Timestamp) -> PortResult<Option<Timestamp>> {
        let _gate = self.records.gate().await;
        Ok(self
            .due()
            .order
            .iter()
            .next()
            .map(|(deadline, _)| *deadline)
            .filter(|deadline| *deadline <= now))
    }
}

/// Tour catalogs held in memory.
#[derive(Debug, Default)]
pub struct MemoryTourCatalogs {
    catalogs: Mutex<HashMap<ProductId, TourCatalog>>,
}

impl MemoryTourCatalogs {
    /// No catalogs.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use parlance_core::ProductId;
    /// use parlance_core::session::TourCatalog;
    /// use parlance_memory::MemoryTourCatalogs;
    /// use parlance_ports::TourCatalogStore;
    ///
    /// let catalogs = MemoryTourCatalogs::new();
    /// let acme = ProductId::parse("acme")?;
    /// assert_eq!(catalogs.get(&acme).await?, TourCatalog::default());
    ///
    /// let catalog = TourCatalog {
    ///     default_interaction_timeout_s: Some(90.0),
    ///     ..TourCatalog::default()
    /// };
    /// catalogs.put(&acme, &catalog).await?;
    /// assert_eq!(catalogs.get(&acme).await?, catalog);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl TourCatalogStore for MemoryTourCatalogs {
    async fn get(&self, product_id: &ProductId) -> PortResult<TourCatalog> {
        let catalogs = self.catalogs.lock().unwrap_or_else(|e| e.into_inner());
        Ok(catalogs.get(product_id).cloned().unwrap_or_default())
    }

    async fn put(&self, product_id: &ProductId, catalog: &TourCatalog) -> PortResult<()> {
        let mut catalogs = self.catalogs.lock().unwrap_or_else(|e| e.into_inner());
        catalogs.insert(product_id.clone(), catalog.clone());
        Ok(())
    }
}
