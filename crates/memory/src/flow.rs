//! Flow sessions in memory, built on [`Records`]: the session with its
//! dialogue is the stored record; chain progress is kept beside it and
//! written under the same gate as the commit that names it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use parlance_core::flow::{
    DialogueElement, Email, FlowEffect, FlowKey, FlowRecord, FlowSession, FlowSessionId,
    ProgressUpdate,
};
use parlance_core::queue::DagLimits;
use parlance_core::{EntityKey, ProductId, Timestamp};
use parlance_ports::{
    ChainProgress, Commit, Committed, FlowStore, MachineStore, PortError, PortResult, Stored,
    TaskQueue, last_reply,
};

use crate::MemoryAuditLog;
use crate::records::{Records, record_key};

type ChainKey = (ProductId, FlowSessionId, String);

/// A user's sessions of one flow: product, flow, email.
type UserKey = (ProductId, String, String);

/// Flow sessions held in memory.
///
/// A commit checks the version, enqueues the decision's DAG, stores the
/// record with the run's id and appends the audit entry and the progress
/// while one gate is held, so the run exists if and only if the commit
/// happened. Reads of a session wait for a commit in progress: a worker
/// that claims a task of a DAG the moment it is enqueued still sees the
/// session that owns the run, as a PostgreSQL transaction would show it.
pub struct MemoryFlowStore {
    records: Records<FlowRecord>,
    progress: Mutex<HashMap<ChainKey, ChainProgress>>,
    /// The sessions created for each user, with their creation time: the
    /// user never changes after the creation, so the index is written
    /// once per session, in its creating commit.
    by_user: Mutex<HashMap<UserKey, Vec<(Timestamp, FlowSessionId)>>>,
    /// Held for the whole of a commit; reads of a session wait for it.
    settled: tokio::sync::RwLock<()>,
}

impl std::fmt::Debug for MemoryFlowStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryFlowStore")
            .field("records", &self.records)
            .finish_non_exhaustive()
    }
}

impl MemoryFlowStore {
    /// An empty store writing audit entries to `audit`, without a task
    /// queue (a commit that starts a DAG is `Unavailable`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    ///
    /// use parlance_core::ProductId;
    /// use parlance_core::flow::{Email, FlowKey, FlowSessionId};
    /// use parlance_memory::{MemoryAuditLog, MemoryFlowStore};
    /// use parlance_ports::{FlowStore, MachineStore};
    ///
    /// let store = MemoryFlowStore::new(Arc::new(MemoryAuditLog::new()));
    /// let acme = ProductId::parse("acme")?;
    /// let key = FlowKey::new(acme.clone(), FlowSessionId::parse("s-1")?);
    ///
    /// // Sessions are created by committing the flow machine's decisions, as for
    /// // every machine; until then there is nothing to read.
    /// assert!(store.load(&key).await?.is_none());
    /// assert!(store.dialogue(&key).await.unwrap_err().is_not_found());
    /// let email = Email::parse("ada@example.com")?;
    /// assert!(store.user_sessions(&acme, "onboarding", &email, 10).await?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(audit: Arc<MemoryAuditLog>) -> Self {
        Self::build(audit, None, DagLimits::default())
    }

    /// An empty store writing audit entries to `audit` that enqueues DAGs
    /// on `queue`, checking them against `limits` (the queue's) before
    /// anything is written.
    pub fn with_queue(
        audit: Arc<MemoryAuditLog>,
        queue: Arc<dyn TaskQueue>,
        limits: DagLimits,
    ) -> Self {
        Self::build(audit, Some(queue), limits)
    }

    fn build(
        audit: Arc<MemoryAuditLog>,
        queue: Option<Arc<dyn TaskQueue>>,
        limits: DagLimits,
    ) -> Self {
        Self {
            records: Records::new(audit, queue, limits),
            progress: Mutex::new(HashMap::new()),
            by_user: Mutex::new(HashMap::new()),
            settled: tokio::sync::RwLock::new(()),
        }
    }

    fn progress_map(&self) -> MutexGuard<'_, HashMap<ChainKey, ChainProgress>> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn user_index(&self) -> MutexGuard<'_, HashMap<UserKey, Vec<(Timestamp, FlowSessionId)>>> {
        self.by_user.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn chain_key(key: &FlowKey, chain_id: &str) -> ChainKey {
    (
        key.product_id.clone(),
        key.session_id.clone(),
        chain_id.to_owned(),
    )
}

/// Creates or extends a chain's progress.
fn add_progress(map: &mut HashMap<ChainKey, ChainProgress>, key: &FlowKey, p: &ProgressUpdate) {
    let entry = map
        .entry(chain_key(key, &p.chain_id))
        .or_insert_with(|| ChainProgress {
            chain_id: p.chain_id.clone(),
            total: 0,
            done: 0,
            label: String::new(),
        });
    entry.total += p.add_total;
    entry.done += p.add_done;
    if let Some(label) = &p.label {
        entry.label.clone_from(label);
    }
}

#[async_trait]
impl MachineStore<FlowRecord> for MemoryFlowStore {
    async fn load(&self, key: &FlowKey) -> PortResult<Option<Stored<FlowRecord>>> {
        let _settled = self.settled.read().await;
        Ok(self.records.load(key).await)
    }

    async fn commit(&self, c: Commit<'_, FlowRecord>) -> PortResult<Committed<FlowRecord>> {
        let _settled = self.settled.write().await;
        let mut with_run = None;
        let version = self
            .records
            .commit(
                &c,
                c.state.clone(),
                |_| Ok(()),
                |stored, enqueued, ()| {
                    if let Some(dag) = enqueued.dags.first() {
                        stored.state.set_dag_id(dag.0);
                        with_run = Some(stored.state.clone());
                    }
                    let mut progress = self.progress_map();
                    for effect in &c.decision.effects {
                        if let FlowEffect::Progress(p) = effect {
                            add_progress(&mut progress, c.key, p);
                        }
                    }
                    let session = stored.state.session();
                    if c.expected.is_none()
                        && let Some(user) = &session.user_info
                    {
                        self.user_index()
                            .entry((
                                c.key.product_id.clone(),
                                session.flow.clone(),
                                user.email.as_str().to_owned(),
                            ))
                            .or_default()
                            .push((c.now, c.key.session_id.clone()));
                    }
                },
            )
            .await?;
        Ok(Committed {
            version,
            written: with_run.map(|state| (state, c.decision.clone())),
            also: Vec::new(),
        })
    }
}

#[async_trait]
impl FlowStore for MemoryFlowStore {
    async fn session(&self, key: &FlowKey) -> PortResult<Option<Stored<FlowSession>>> {
        let _settled = self.settled.read().await;
        Ok(self.records.lock().get(&record_key(key)).map(|s| Stored {
            state: s.state.session().clone(),
            version: s.version,
        }))
    }

    async fn dialogue(&self, key: &FlowKey) -> PortResult<Vec<DialogueElement>> {
        let _settled = self.settled.read().await;
        self.records
            .lock()
            .get(&record_key(key))
            .map(|s| s.state.dialogue().to_vec())
            .ok_or_else(|| PortError::not_found(format!("no flow session {}", key.entity_id())))
    }

    async fn dialogue_prefix(&self, key: &FlowKey, len: u64) -> PortResult<Vec<DialogueElement>> {
        let _settled = self.settled.read().await;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        self.records
            .lock()
            .get(&record_key(key))
            .map(|s| {
                let all = s.state.dialogue();
                all[..len.min(all.len())].to_vec()
            })
            .ok_or_else(|| PortError::not_found(format!("no flow session {}", key.entity_id())))
    }

    async fn session_with_prefix(
        &self,
        key: &FlowKey,
        len: u64,
    ) -> PortResult<Option<(Stored<FlowSession>, Vec<DialogueElement>)>> {
        let _settled = self.settled.read().await;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        Ok(self.records.lock().get(&record_key(key)).map(|s| {
            let all = s.state.dialogue();
            let session = Stored {
                state: s.state.session().clone(),
                version: s.version,
            };
            (session, all[..len.min(all.len())].to_vec())
        }))
    }

    async fn session_with_reply(
        &self,
        key: &FlowKey,
    ) -> PortResult<Option<(Stored<FlowSession>, Option<String>)>> {
        let _settled = self.settled.read().await;
        Ok(self.records.lock().get(&record_key(key)).map(|s| {
            let session = Stored {
                state: s.state.session().clone(),
                version: s.version,
            };
            (session, last_reply(s.state.dialogue()))
        }))
    }

    async fn task_done(
        &self,
        key: &FlowKey,
        chain_id: &str,
        done: i64,
        add_total: i64,
    ) -> PortResult<()> {
        let mut map = self.progress_map();
        let p = map
            .get_mut(&chain_key(key, chain_id))
            .ok_or_else(|| PortError::not_found(format!("no chain {chain_id}")))?;
        p.done += done;
        p.total += add_total;
        Ok(())
    }

    async fn progress(&self, key: &FlowKey, chain_id: &str) -> PortResult<Option<ChainProgress>> {
        Ok(self.progress_map().get(&chain_key(key, chain_id)).cloned())
    }

    async fn user_sessions(
        &self,
        product: &ProductId,
        flow: &str,
        email: &Email,
        limit: usize,
    ) -> PortResult<Vec<FlowSessionId>> {
        let _settled = self.settled.read().await;
        let key = (product.clone(), flow.to_owned(), email.as_str().to_owned());
        let mut sessions = self.user_index().get(&key).cloned().unwrap_or_default();
        sessions.sort_unstable_by(|a, b| b.cmp(a));
        Ok(sessions.into_iter().take(limit).map(|(_, id)| id).collect())
    }
}
