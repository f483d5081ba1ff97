//! Flow sessions in maps; each write's audit entries go to the in-memory
//! audit log under the same lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use parlance_core::flow::{DialogueElement, FlowSession};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{
    ChainProgress, DagId, DagStart, FlowAppend, FlowStore, PortError, PortResult, ProgressUpdate,
    StoredFlowSession, TaskQueue,
};

use crate::MemoryAuditLog;

type Key = (ProductId, String);

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<Key, StoredFlowSession>,
    dialogue: HashMap<Key, Vec<DialogueElement>>,
    progress: HashMap<(ProductId, String, String), ChainProgress>,
}

/// Flow sessions held in memory.
///
/// Saves are serialised by an async gate, so a save that enqueues a DAG can
/// check the version, enqueue and apply without another save slipping in
/// between: the run exists if and only if the save succeeded, as in one
/// database transaction. Audit entries are appended under the store's lock,
/// with the change they record.
#[derive(Default)]
pub struct MemoryFlowStore {
    inner: Mutex<Inner>,
    gate: tokio::sync::Mutex<()>,
    queue: Option<Arc<dyn TaskQueue>>,
    audit: Arc<MemoryAuditLog>,
}

impl std::fmt::Debug for MemoryFlowStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryFlowStore")
            .field("inner", &self.inner)
            .field("has_queue", &self.queue.is_some())
            .finish_non_exhaustive()
    }
}

impl MemoryFlowStore {
    /// An empty store writing audit entries to `audit`, without a task
    /// queue (`save_and_enqueue` is `Unavailable`).
    pub fn new(audit: Arc<MemoryAuditLog>) -> Self {
        Self {
            audit,
            ..Self::default()
        }
    }

    /// An empty store writing audit entries to `audit` that enqueues DAGs
    /// on `queue`.
    pub fn with_queue(audit: Arc<MemoryAuditLog>, queue: Arc<dyn TaskQueue>) -> Self {
        Self {
            queue: Some(queue),
            audit,
            ..Self::default()
        }
    }

    /// Checks that `expected_version` is still current.
    fn check(&self, product_id: &ProductId, session_id: &str, expected: i64) -> PortResult<()> {
        let inner = self.lock();
        let stored = inner
            .sessions
            .get(&key(product_id, session_id))
            .ok_or_else(|| PortError::not_found("no such flow session"))?;
        if stored.version != expected {
            return Err(PortError::conflict("flow session version moved"));
        }
        Ok(())
    }

    fn apply(
        &self,
        product_id: &ProductId,
        session: &FlowSession,
        expected_version: i64,
        append: FlowAppend<'_>,
        progress: Option<&ProgressUpdate>,
    ) -> PortResult<i64> {
        let mut inner = self.lock();
        let k = key(product_id, &session.session_id);
        let stored = inner
            .sessions
            .get_mut(&k)
            .ok_or_else(|| PortError::not_found("no such flow session"))?;
        if stored.version != expected_version {
            return Err(PortError::conflict("flow session version moved"));
        }
        stored.version += 1;
        stored.session = session.clone();
        stored.dialogue_len += append.dialogue.len() as i64;
        let version = stored.version;
        inner
            .dialogue
            .entry(k)
            .or_default()
            .extend_from_slice(append.dialogue);
        self.audit.push(append.audit);
        if let Some(p) = progress {
            let entry = inner
                .progress
                .entry((
                    product_id.clone(),
                    session.session_id.clone(),
                    p.chain_id.clone(),
                ))
                .or_insert_with(|| ChainProgress {
                    chain_id: p.chain_id.clone(),
                    total: 0,
                    done: 0,
                    label: String::new(),
                });
            entry.total += p.add_total;
            entry.done += p.add_done;
            if let Some(label) = &p.label {
                entry.label = label.clone();
            }
        }
        Ok(version)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn key(p: &ProductId, s: &str) -> Key {
    (p.clone(), s.to_owned())
}

#[async_trait]
impl FlowStore for MemoryFlowStore {
    async fn create(
        &self,
        product_id: &ProductId,
        session: &FlowSession,
        append: FlowAppend<'_>,
        _now: Timestamp,
    ) -> PortResult<i64> {
        let mut inner = self.lock();
        let k = key(product_id, &session.session_id);
        if inner.sessions.contains_key(&k) {
            return Err(PortError::conflict("flow session exists"));
        }
        inner.sessions.insert(
            k.clone(),
            StoredFlowSession {
                session: session.clone(),
                version: 1,
                dialogue_len: append.dialogue.len() as i64,
            },
        );
        inner.dialogue.insert(k, append.dialogue.to_vec());
        self.audit.push(append.audit);
        Ok(1)
    }

    async fn load(
        &self,
        product_id: &ProductId,
        session_id: &str,
    ) -> PortResult<StoredFlowSession> {
        // A save that enqueues a DAG holds the gate from the enqueue to the
        // save; waiting for it here means a worker that claims one of the
        // DAG's tasks at once still sees the session that owns the run, as a
        // PostgreSQL transaction would show it.
        let _gate = self.gate.lock().await;
        self.lock()
            .sessions
            .get(&key(product_id, session_id))
            .cloned()
            .ok_or_else(|| PortError::not_found("no such flow session"))
    }

    async fn save(
        &self,
        product_id: &ProductId,
        session: &FlowSession,
        expected_version: i64,
        append: FlowAppend<'_>,
        progress: Option<&ProgressUpdate>,
        _now: Timestamp,
    ) -> PortResult<i64> {
        let _gate = self.gate.lock().await;
        self.apply(product_id, session, expected_version, append, progress)
    }

    async fn save_and_enqueue(
        &self,
        product_id: &ProductId,
        session: &FlowSession,
        expected_version: i64,
        append: FlowAppend<'_>,
        start: &DagStart,
        _now: Timestamp,
    ) -> PortResult<(i64, DagId)> {
        let Some(queue) = &self.queue else {
            return Err(PortError::unavailable("this flow store has no task queue"));
        };
        let _gate = self.gate.lock().await;
        self.check(product_id, &session.session_id, expected_version)?;
        let dag = queue.enqueue_dag(&start.dag).await?;
        let mut session = session.clone();
        if let Some(r) = &mut session.running {
            r.dag_id = Some(dag.0);
        }
        match self.apply(
            product_id,
            &session,
            expected_version,
            append,
            Some(&start.progress),
        ) {
            Ok(version) => Ok((version, dag)),
            Err(e) => {
                // Unreachable while the gate is held; never leave a run
                // behind a save that did not happen.
                let _ = queue.cancel_dag(dag).await;
                Err(e)
            }
        }
    }

    async fn dialogue(
        &self,
        product_id: &ProductId,
        session_id: &str,
    ) -> PortResult<Vec<DialogueElement>> {
        let inner = self.lock();
        let k = key(product_id, session_id);
        if !inner.sessions.contains_key(&k) {
            return Err(PortError::not_found("no such flow session"));
        }
        Ok(inner.dialogue.get(&k).cloned().unwrap_or_default())
    }

    async fn task_done(
        &self,
        product_id: &ProductId,
        session_id: &str,
        chain_id: &str,
        done: i64,
        add_total: i64,
    ) -> PortResult<()> {
        let mut inner = self.lock();
        let p = inner
            .progress
            .get_mut(&(
                product_id.clone(),
                session_id.to_owned(),
                chain_id.to_owned(),
            ))
            .ok_or_else(|| PortError::not_found("no such chain"))?;
        p.done += done;
        p.total += add_total;
        Ok(())
    }

    async fn progress(
        &self,
        product_id: &ProductId,
        session_id: &str,
        chain_id: &str,
    ) -> PortResult<Option<ChainProgress>> {
        Ok(self
            .lock()
            .progress
            .get(&(
                product_id.clone(),
                session_id.to_owned(),
                chain_id.to_owned(),
            ))
            .cloned())
    }
}
