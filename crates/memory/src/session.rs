//! Session states and tour catalogs in maps, with a deadline index.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use parlance_core::session::{SessionId, SessionState, TourCatalog};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{
    CLAIM_LEASE, PortError, PortResult, SessionSave, SessionStore, StoredSession, TourCatalogStore,
};

use crate::MemoryAuditLog;

type Key = (ProductId, SessionId);

#[derive(Debug)]
struct Entry {
    state: SessionState,
    version: i64,
    next_deadline: Option<Timestamp>,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<Key, Entry>,
    /// `(deadline, key)` for every session with a deadline.
    due: BTreeSet<(Timestamp, Key)>,
}

impl Inner {
    fn set_deadline(&mut self, key: &Key, deadline: Option<Timestamp>) {
        let Some(entry) = self.sessions.get_mut(key) else {
            return;
        };
        if let Some(old) = entry.next_deadline.take() {
            self.due.remove(&(old, key.clone()));
        }
        entry.next_deadline = deadline;
        if let Some(new) = deadline {
            self.due.insert((new, key.clone()));
        }
    }
}

/// Session states held in memory. Saves append their audit entries to the
/// given audit log under the same lock, so both happen or neither does.
#[derive(Debug)]
pub struct MemorySessionStore {
    inner: Mutex<Inner>,
    audit: Arc<MemoryAuditLog>,
}

impl MemorySessionStore {
    /// An empty store writing audit entries to `audit`.
    pub fn new(audit: Arc<MemoryAuditLog>) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            audit,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl SessionStore for MemorySessionStore {
    async fn get(
        &self,
        product_id: &ProductId,
        session_id: &SessionId,
    ) -> PortResult<Option<StoredSession>> {
        let inner = self.lock();
        Ok(inner
            .sessions
            .get(&(product_id.clone(), session_id.clone()))
            .map(|e| StoredSession {
                state: e.state.clone(),
                version: e.version,
            }))
    }

    async fn get_or_create(
        &self,
        product_id: &ProductId,
        session_id: &SessionId,
        now: Timestamp,
    ) -> PortResult<StoredSession> {
        let mut inner = self.lock();
        let entry = inner
            .sessions
            .entry((product_id.clone(), session_id.clone()))
            .or_insert_with(|| Entry {
                state: SessionState::new(product_id.clone(), session_id.clone(), now),
                version: 1,
                next_deadline: None,
            });
        Ok(StoredSession {
            state: entry.state.clone(),
            version: entry.version,
        })
    }

    async fn save(&self, save: SessionSave<'_>) -> PortResult<i64> {
        let key = (
            save.state.product_id().clone(),
            save.state.session_id().clone(),
        );
        let mut inner = self.lock();
        let Some(entry) = inner.sessions.get_mut(&key) else {
            return Err(PortError::conflict("session was deleted meanwhile"));
        };
        if entry.version != save.expected_version {
            return Err(PortError::conflict(format!(
                "session is at version {}, not {}",
                entry.version, save.expected_version
            )));
        }
        entry.state = save.state.clone();
        entry.version += 1;
        let version = entry.version;
        inner.set_deadline(&key, save.next_deadline);
        self.audit.push(save.audit);
        Ok(version)
    }

    async fn delete(&self, product_id: &ProductId, session_id: &SessionId) -> PortResult<bool> {
        let key = (product_id.clone(), session_id.clone());
        let mut inner = self.lock();
        inner.set_deadline(&key, None);
        Ok(inner.sessions.remove(&key).is_some())
    }

    async fn claim_due(&self, now: Timestamp, limit: usize) -> PortResult<Vec<StoredSession>> {
        let mut inner = self.lock();
        let keys: Vec<Key> = inner
            .due
            .iter()
            .take_while(|(deadline, _)| *deadline <= now)
            .take(limit)
            .map(|(_, key)| key.clone())
            .collect();
        let lease = now + CLAIM_LEASE;
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            inner.set_deadline(&key, Some(lease));
            if let Some(e) = inner.sessions.get(&key) {
                out.push(StoredSession {
                    state: e.state.clone(),
                    version: e.version,
                });
            }
        }
        Ok(out)
    }
}

/// Tour catalogs held in memory.
#[derive(Debug, Default)]
pub struct MemoryTourCatalogs {
    catalogs: Mutex<HashMap<ProductId, TourCatalog>>,
}

impl MemoryTourCatalogs {
    /// No catalogs.
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
