//! Flow sessions in maps.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use parlance_core::flow::{DialogueElement, FlowSession};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{
    ChainProgress, FlowStore, PortError, PortResult, ProgressUpdate, StoredFlowSession,
};

type Key = (ProductId, String);

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<Key, StoredFlowSession>,
    dialogue: HashMap<Key, Vec<DialogueElement>>,
    progress: HashMap<(ProductId, String, String), ChainProgress>,
}

/// Flow sessions held in memory.
#[derive(Debug, Default)]
pub struct MemoryFlowStore {
    inner: Mutex<Inner>,
}

impl MemoryFlowStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
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
        dialogue: &[DialogueElement],
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
                dialogue_len: dialogue.len() as i64,
            },
        );
        inner.dialogue.insert(k, dialogue.to_vec());
        Ok(1)
    }

    async fn load(
        &self,
        product_id: &ProductId,
        session_id: &str,
    ) -> PortResult<StoredFlowSession> {
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
        append: &[DialogueElement],
        progress: Option<&ProgressUpdate>,
        _now: Timestamp,
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
        stored.dialogue_len += append.len() as i64;
        let version = stored.version;
        inner
            .dialogue
            .entry(k)
            .or_default()
            .extend_from_slice(append);
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
