//! Turn threads and the memory store in maps.
//!
//! Threads are [`Records`] of [`Checkpoint`], committed under the records'
//! gate like every in-memory machine; a record holds the whole thread, and a
//! commit applies the decision's [`TurnEffect::Write`] delta to it (the
//! decided state may hold only a window of its lists, so it is never stored
//! as is). The crisis-log entries a turn carries
//! ([`CRISIS_LOG_DELTA`](parlance_ports::CRISIS_LOG_DELTA)) are appended to
//! the store's crisis log under the same gate, only when the thread is
//! written.
//!
//! Each commit also appends the thread's history entry under the gate: the
//! checkpoint's metadata, its delta, and every `snapshot_every` checkpoints
//! a copy of the objects, so the state at a checkpoint is the lists' entries
//! up to it and the objects folded from the nearest copy, as the PostgreSQL
//! store keeps them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use std::collections::BTreeMap;

use parlance_core::queue::DagLimits;
use parlance_core::turn::{
    Checkpoint, CheckpointDelta, CheckpointMeta, CheckpointRef, CheckpointSource,
    DEFAULT_SNAPSHOT_EVERY, MemoryFilter, MemoryId, MemoryKind, MemoryRecord, OwnerId,
    ProceduralProfile, QueryEmbedding, Retrieved, ThreadId, ThreadKey, TurnEffect, TurnKey,
    fold_objects, keeps_snapshot, retrieve_from,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{
    Checkpointer, Commit, Committed, HistoryPage, MachineStore, MemoryStore, PortError, PortResult,
    Stored, ThreadPage, ThreadSummary, Version, split_crisis_entries, split_forgotten,
};
use serde_json::Value;

use crate::records::record_key;
use crate::{MemoryAuditLog, MemoryCrisisLog, Records};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One checkpoint of a thread's history.
#[derive(Debug, Clone)]
struct Entry {
    meta: CheckpointMeta,
    /// What it appended and replaced.
    delta: CheckpointDelta,
    /// The objects once it was written, every `snapshot_every` checkpoints.
    snapshot: Option<BTreeMap<String, Value>>,
}

/// Turn threads held in memory: one record per thread, every list whole,
/// and each thread's history.
#[derive(Debug)]
pub struct MemoryCheckpointStore {
    records: Records<Checkpoint>,
    crisis_log: Arc<MemoryCrisisLog>,
    memory: Option<Arc<MemoryMemoryStore>>,
    history: Mutex<HashMap<ThreadKey, Vec<Entry>>>,
    snapshot_every: u64,
}

impl MemoryCheckpointStore {
    /// No threads yet; commits write their audit entries (a thread's
    /// decisions have none today) to `audit`, and the crisis-log entries
    /// turns carry to a crisis log of its own ([`Self::crisis_log`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    ///
    /// use parlance_core::ProductId;
    /// use parlance_core::turn::{OwnerId, ThreadId, ThreadKey, TurnKey};
    /// use parlance_memory::{MemoryAuditLog, MemoryCheckpointStore, MemoryMemoryStore};
    /// use parlance_ports::{Checkpointer, MachineStore, ThreadPage};
    ///
    /// let memory = Arc::new(MemoryMemoryStore::new());
    /// let store = MemoryCheckpointStore::new(Arc::new(MemoryAuditLog::new()))
    ///     .with_memory_store(memory.clone());
    /// let (acme, owner) = (ProductId::parse("acme")?, OwnerId::parse("user-7")?);
    /// let thread = ThreadKey {
    ///     product_id: acme.clone(),
    ///     owner: owner.clone(),
    ///     thread: ThreadId::parse("t-1")?,
    /// };
    ///
    /// // Threads are created by committing a turn's checkpoint, as for every
    /// // machine; until then there is nothing to read.
    /// assert!(store.load(&TurnKey::whole(thread.clone())).await?.is_none());
    /// let page = ThreadPage { after: None, limit: 20 };
    /// assert!(store.threads(&acme, &owner, &page).await?.is_empty());
    /// assert!(!store.delete_thread(&thread).await?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(audit: Arc<MemoryAuditLog>) -> Self {
        Self {
            records: Records::new(audit, None, DagLimits::default()),
            crisis_log: Arc::new(MemoryCrisisLog::new()),
            memory: None,
            history: Mutex::new(HashMap::new()),
            snapshot_every: DEFAULT_SNAPSHOT_EVERY,
        }
    }

    /// Keeps a copy of a thread's objects every `every` checkpoints (at
    /// least 1): reading an older state folds at most that many patches.
    pub fn with_snapshot_every(mut self, every: u64) -> Self {
        self.snapshot_every = every.max(1);
        self
    }

    /// Writes the crisis-log entries turns carry to `log` instead.
    pub fn with_crisis_log(mut self, log: Arc<MemoryCrisisLog>) -> Self {
        self.crisis_log = log;
        self
    }

    /// Deletes the memory entries turns forget
    /// ([`FORGET_MEMORY_DELTA`](parlance_ports::FORGET_MEMORY_DELTA)) from
    /// `store`, with the turn's commit. Without one, a turn that forgets is
    /// refused as `Invalid`.
    pub fn with_memory_store(mut self, store: Arc<MemoryMemoryStore>) -> Self {
        self.memory = Some(store);
        self
    }

    /// The crisis log this store's commits write to.
    pub fn crisis_log(&self) -> Arc<MemoryCrisisLog> {
        self.crisis_log.clone()
    }
}

/// The whole thread `current` (a new one when `None`) with `deltas`
/// applied in order; its version is set when it is stored.
fn written(current: Option<&Stored<Checkpoint>>, deltas: &[CheckpointDelta]) -> Checkpoint {
    let mut thread = current.map(|s| s.state.clone()).unwrap_or_default();
    for delta in deltas {
        thread.apply(delta);
    }
    thread
}

#[async_trait]
impl MachineStore<Checkpoint> for MemoryCheckpointStore {
    async fn load(&self, key: &TurnKey) -> PortResult<Option<Stored<Checkpoint>>> {
        Ok(self.records.load(key).await.map(|s| Stored {
            state: s.state.windowed(&key.window),
            version: s.version,
        }))
    }

    async fn commit(&self, c: Commit<'_, Checkpoint>) -> PortResult<Committed<Checkpoint>> {
        if !c.decision.tasks.is_empty() {
            return Err(PortError::invalid("a turn thread enqueues no tasks"));
        }
        // The thread's deltas, and the crisis-log entries and forgotten
        // memory entries they carry.
        let mut deltas = Vec::with_capacity(c.decision.effects.len());
        let mut entries = Vec::new();
        let mut forget = Vec::new();
        let mut source = CheckpointSource::Turn;
        for effect in &c.decision.effects {
            let TurnEffect::Write { delta, source: s } = effect else {
                return Err(PortError::invalid(
                    "a turn decision asks for an effect this thread store does not carry out",
                ));
            };
            let (thread, carried) = split_crisis_entries(&c.key.thread, delta)?;
            let (thread, forgotten) = split_forgotten(&thread)?;
            deltas.push(thread.into_owned());
            entries.extend(carried);
            forget.extend(forgotten);
            source = *s;
        }
        if !forget.is_empty() && self.memory.is_none() {
            return Err(PortError::invalid(
                "a turn forgets memory entries, and this thread store has no memory store",
            ));
        }
        let delta = deltas
            .iter()
            .fold(CheckpointDelta::default(), |all, d| all.then(d));
        let version = self
            .records
            .commit(
                &c,
                Checkpoint::default(),
                |current| Ok(written(current, &deltas)),
                |stored, _, thread| {
                    stored.state = thread;
                    stored.state.version = stored.version.0;
                    // Under the gate, with the thread: all or nothing.
                    self.crisis_log.append(entries);
                    if let Some(memory) = &self.memory {
                        memory.forget(&c.key.thread.product_id, &c.key.thread.owner, &forget);
                    }
                    let version = stored.version.0;
                    let entry = Entry {
                        meta: CheckpointMeta {
                            version,
                            parent: CheckpointMeta::parent_of(&c.key.thread, version, None),
                            at: c.now,
                            source,
                            interrupted: stored.state.is_interrupted(),
                        },
                        delta,
                        snapshot: keeps_snapshot(version, self.snapshot_every)
                            .then(|| stored.state.objects.clone()),
                    };
                    let mut history = lock(&self.history);
                    let entries = history.entry(c.key.thread.clone()).or_default();
                    if version == 1 {
                        // A thread deleted and begun again starts over.
                        entries.clear();
                    }
                    entries.push(entry);
                },
            )
            .await?;
        Ok(Committed::at(version))
    }
}

/// The state as of the `n`th checkpoint of `entries` (1 first): lists from
/// every entry up to it, objects from the nearest copy at or before it.
fn state_at(entries: &[Entry], n: usize) -> Checkpoint {
    let upto = &entries[..n];
    let mut cp = Checkpoint::default();
    for e in upto {
        for (field, list) in &e.delta.appends {
            if !list.is_empty() {
                cp.lists
                    .entry(field.clone())
                    .or_default()
                    .extend(list.iter().cloned());
            }
        }
    }
    let copy = upto.iter().rposition(|e| e.snapshot.is_some()).unwrap_or(0);
    let snapshot = upto[copy].snapshot.clone().unwrap_or_default();
    cp.objects = fold_objects(snapshot, upto[copy + 1..].iter().map(|e| &e.delta.objects));
    cp.version = upto[n - 1].meta.version;
    cp
}

#[async_trait]
impl Checkpointer for MemoryCheckpointStore {
    async fn history(
        &self,
        thread: &ThreadKey,
        page: HistoryPage,
    ) -> PortResult<Vec<CheckpointMeta>> {
        let _settled = self.records.settled().await;
        let history = lock(&self.history);
        let Some(entries) = history.get(thread) else {
            return Ok(Vec::new());
        };
        Ok(entries
            .iter()
            .rev()
            .filter(|e| page.before.is_none_or(|b| e.meta.version < b))
            .take(page.limit)
            .map(|e| e.meta.clone())
            .collect())
    }

    async fn load_at(&self, thread: &ThreadKey, version: u64) -> PortResult<Option<Checkpoint>> {
        let _settled = self.records.settled().await;
        let history = lock(&self.history);
        let Some(entries) = history.get(thread) else {
            return Ok(None);
        };
        let Ok(n) = usize::try_from(version) else {
            return Ok(None);
        };
        if n == 0 || n > entries.len() {
            return Ok(None);
        }
        Ok(Some(state_at(entries, n)))
    }

    async fn fork(
        &self,
        from: &ThreadKey,
        version: u64,
        to: &ThreadKey,
        now: Timestamp,
    ) -> PortResult<CheckpointMeta> {
        if from.product_id != to.product_id {
            return Err(PortError::invalid("a thread forks within its product"));
        }
        let gate = self.records.gate().await;
        let mut history = lock(&self.history);
        let n = usize::try_from(version).unwrap_or(usize::MAX);
        let state = match history.get(from) {
            Some(entries) if n >= 1 && n <= entries.len() => state_at(entries, n),
            _ => {
                return Err(PortError::not_found(format!(
                    "thread {} has no checkpoint {version}",
                    from.thread
                )));
            }
        };
        let to_key = record_key(&TurnKey::whole(to.clone()));
        let mut records = gate.lock();
        if records.contains_key(&to_key) {
            return Err(PortError::conflict(format!("thread {} exists", to.thread)));
        }
        let meta = CheckpointMeta {
            version: 1,
            parent: Some(CheckpointRef {
                owner: from.owner.clone(),
                thread: from.thread.clone(),
                version,
            }),
            at: now,
            source: CheckpointSource::Fork,
            interrupted: state.is_interrupted(),
        };
        let entry = Entry {
            meta: meta.clone(),
            delta: CheckpointDelta {
                appends: state.lists.clone(),
                objects: state.objects.clone(),
            },
            snapshot: Some(state.objects.clone()),
        };
        let mut forked = state;
        forked.version = 1;
        records.insert(
            to_key,
            Stored {
                state: forked,
                version: Version::FIRST,
            },
        );
        history.insert(to.clone(), vec![entry]);
        Ok(meta)
    }

    async fn delete_thread(&self, thread: &ThreadKey) -> PortResult<bool> {
        let gate = self.records.gate().await;
        let removed = gate
            .lock()
            .remove(&record_key(&TurnKey::whole(thread.clone())))
            .is_some();
        lock(&self.history).remove(thread);
        Ok(removed)
    }

    async fn threads(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        page: &ThreadPage,
    ) -> PortResult<Vec<ThreadSummary>> {
        let _settled = self.records.settled().await;
        let history = lock(&self.history);
        let mut all: Vec<ThreadSummary> = history
            .iter()
            .filter(|(k, _)| k.product_id == *product_id && k.owner == *owner)
            .filter_map(|(k, entries)| {
                let last = entries.last()?;
                Some(ThreadSummary {
                    thread: k.thread.clone(),
                    version: last.meta.version,
                    updated_at: last.meta.at,
                    interrupted: last.meta.interrupted,
                })
            })
            .collect();
        // Newest first, then by id, as the PostgreSQL store orders them.
        all.sort_by(|a, b| {
            b.updated_at
                .cmp(&a.updated_at)
                .then_with(|| a.thread.cmp(&b.thread))
        });
        Ok(all
            .into_iter()
            .filter(|t| {
                page.after.as_ref().is_none_or(|c| {
                    t.updated_at < c.updated_at
                        || (t.updated_at == c.updated_at && t.thread > c.thread)
                })
            })
            .take(page.limit)
            .collect())
    }
}

type OwnerKey = (ProductId, OwnerId);

/// The memory store held in memory.
#[derive(Debug, Default)]
pub struct MemoryMemoryStore {
    entries: Mutex<HashMap<OwnerKey, Vec<MemoryRecord>>>,
    profiles: Mutex<HashMap<OwnerKey, ProceduralProfile>>,
    sessions: Mutex<HashMap<(ProductId, OwnerId, ThreadId), serde_json::Value>>,
}

impl MemoryMemoryStore {
    /// An empty store.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use parlance_core::ProductId;
    /// use parlance_core::turn::{OwnerId, ProceduralProfile, ThreadId};
    /// use parlance_memory::MemoryMemoryStore;
    /// use parlance_ports::MemoryStore;
    /// use serde_json::json;
    ///
    /// let store = MemoryMemoryStore::new();
    /// let (acme, owner) = (ProductId::parse("acme")?, OwnerId::parse("user-7")?);
    ///
    /// let profile = ProceduralProfile {
    ///     procedural_rules: vec!["Answer briefly.".to_owned()],
    ///     proactive_recall_enabled: true,
    /// };
    /// store.put_profile(&acme, &owner, &profile).await?;
    /// assert_eq!(store.profile(&acme, &owner).await?, profile);
    ///
    /// let session = ThreadId::parse("t-1")?;
    /// store.put_session_memory(&acme, &owner, &session, &json!({"topic": "billing"})).await?;
    /// let kept = store.session_memory(&acme, &owner, &session).await?;
    /// assert_eq!(kept, Some(json!({"topic": "billing"})));
    ///
    /// assert!(store.list(&acme, &owner, None).await?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Deletes the owner's entries with these ids (absent ones are no
    /// error).
    pub(crate) fn forget(&self, product_id: &ProductId, owner: &OwnerId, ids: &[MemoryId]) {
        if ids.is_empty() {
            return;
        }
        if let Some(list) = lock(&self.entries).get_mut(&key(product_id, owner)) {
            list.retain(|r| !ids.contains(&r.id));
        }
    }
}

fn key(product_id: &ProductId, owner: &OwnerId) -> OwnerKey {
    (product_id.clone(), owner.clone())
}

#[async_trait]
impl MemoryStore for MemoryMemoryStore {
    async fn add(&self, product_id: &ProductId, record: &MemoryRecord) -> PortResult<()> {
        let mut entries = lock(&self.entries);
        if entries
            .iter()
            .filter(|((p, _), _)| p == product_id)
            .flat_map(|(_, list)| list)
            .any(|r| r.id == record.id)
        {
            return Err(PortError::conflict(format!(
                "memory entry {} already exists",
                record.id
            )));
        }
        let list = entries.entry(key(product_id, &record.owner)).or_default();
        list.push(record.clone());
        // Oldest first, then by id, as PostgreSQL lists them.
        list.sort_by_key(|r| (r.at, r.id));
        Ok(())
    }

    async fn list(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        kind: Option<MemoryKind>,
    ) -> PortResult<Vec<MemoryRecord>> {
        let entries = lock(&self.entries);
        Ok(entries
            .get(&key(product_id, owner))
            .map(|list| {
                list.iter()
                    .filter(|r| kind.is_none_or(|k| r.entry.kind() == k))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn delete(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        id: MemoryId,
    ) -> PortResult<()> {
        let mut entries = lock(&self.entries);
        let list = entries.entry(key(product_id, owner)).or_default();
        let before = list.len();
        list.retain(|r| r.id != id);
        if list.len() == before {
            return Err(PortError::not_found(format!("memory entry {id}")));
        }
        Ok(())
    }

    async fn erase_owner(&self, product_id: &ProductId, owner: &OwnerId) -> PortResult<usize> {
        let k = key(product_id, owner);
        let gone = lock(&self.entries).remove(&k).map_or(0, |l| l.len());
        lock(&self.profiles).remove(&k);
        lock(&self.sessions).retain(|(p, o, _), _| !(p == product_id && o == owner));
        Ok(gone)
    }

    async fn delete_where(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        filter: &MemoryFilter,
    ) -> PortResult<usize> {
        let mut entries = lock(&self.entries);
        let list = entries.entry(key(product_id, owner)).or_default();
        let before = list.len();
        list.retain(|r| !filter.matches(r));
        Ok(before - list.len())
    }

    async fn profile(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
    ) -> PortResult<ProceduralProfile> {
        Ok(lock(&self.profiles)
            .get(&key(product_id, owner))
            .cloned()
            .unwrap_or_default())
    }

    async fn put_profile(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        profile: &ProceduralProfile,
    ) -> PortResult<()> {
        lock(&self.profiles).insert(key(product_id, owner), profile.clone());
        Ok(())
    }

    async fn session_memory(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        session: &ThreadId,
    ) -> PortResult<Option<serde_json::Value>> {
        Ok(lock(&self.sessions)
            .get(&(product_id.clone(), owner.clone(), session.clone()))
            .cloned())
    }

    async fn put_session_memory(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        session: &ThreadId,
        value: &serde_json::Value,
    ) -> PortResult<()> {
        lock(&self.sessions).insert(
            (product_id.clone(), owner.clone(), session.clone()),
            value.clone(),
        );
        Ok(())
    }

    async fn retrieve(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        query: &str,
        k: usize,
        embedding: QueryEmbedding<'_>,
    ) -> PortResult<Retrieved> {
        let entries = lock(&self.entries);
        let candidates = entries
            .get(&key(product_id, owner))
            .map(Vec::as_slice)
            .unwrap_or_default();
        Ok(retrieve_from(candidates, query, k, embedding))
    }
}

#[cfg(test)]
mod tests {
    use parlance_core::turn::TurnCommand;
    use parlance_core::{Machine as _, ProductId};
    use serde_json::json;

    use super::*;

    fn thread(name: &str) -> ThreadKey {
        ThreadKey {
            product_id: ProductId::parse("p").expect("product id"),
            owner: OwnerId::parse("u").expect("owner id"),
            thread: ThreadId::parse(name).expect("thread id"),
        }
    }

    /// Commits `count` turns on `k`, each replacing one of a few objects.
    async fn turns(store: &MemoryCheckpointStore, k: &ThreadKey, count: u64) {
        let now = Timestamp::from_secs(1_767_225_600).expect("in range");
        let key = TurnKey::whole(k.clone());
        for n in 1..=count {
            let mut delta = CheckpointDelta::default();
            delta
                .objects
                .insert(format!("k{}", n % 3), json!({"turn": n}));
            delta
                .appends
                .insert("history".to_owned(), vec![json!(format!("m{n}"))]);
            let command = TurnCommand::commit(n - 1, delta);
            let loaded = store.load(&key).await.expect("load");
            let (state, decision) = match loaded {
                Some(stored) => {
                    let mut state = stored.state;
                    let decision = state.decide(&(), &command, now).expect("a turn");
                    (state, decision)
                }
                None => Checkpoint::create(&key, &(), &command, now)
                    .expect("a first turn")
                    .expect("creates the thread"),
            };
            store
                .commit(Commit {
                    key: &key,
                    expected: (n > 1).then_some(Version(n - 1)),
                    command: &command,
                    state: &state,
                    decision: &decision,
                    now,
                })
                .await
                .expect("commit");
        }
    }

    /// The versions of `k`'s checkpoints that keep a copy of the objects,
    /// each checked to be the whole objects as of it.
    fn copies(store: &MemoryCheckpointStore, k: &ThreadKey) -> Vec<u64> {
        let history = lock(&store.history);
        let entries = &history[k];
        entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let copy = e.snapshot.as_ref()?;
                let mut folded = Checkpoint::default();
                for earlier in &entries[..=i] {
                    folded.apply(&earlier.delta);
                }
                assert_eq!(*copy, folded.objects, "the copy at {}", e.meta.version);
                Some(e.meta.version)
            })
            .collect()
    }

    /// A copy of the objects is kept at the first checkpoint and at every
    /// `k`th, so the state as of any checkpoint folds fewer than `k`
    /// patches onto its copy.
    #[tokio::test]
    async fn a_copy_is_kept_at_the_first_checkpoint_and_every_kth() {
        let store = MemoryCheckpointStore::new(Arc::new(MemoryAuditLog::new()));
        let t = thread("default");
        turns(&store, &t, 70).await;
        assert_eq!(copies(&store, &t), [1, 32, 64]);

        let store = store.with_snapshot_every(5);
        let t = thread("five");
        turns(&store, &t, 23).await;
        assert_eq!(copies(&store, &t), [1, 5, 10, 15, 20]);
        for v in 1..=23 {
            let entries = &lock(&store.history)[&t];
            let n = usize::try_from(v).expect("small");
            let copy = entries[..n]
                .iter()
                .rposition(|e| e.snapshot.is_some())
                .expect("a copy at or before every checkpoint");
            assert!(
                n - 1 - copy < 5,
                "checkpoint {v} folds {} patches",
                n - 1 - copy
            );
        }

        // A fork's first checkpoint keeps one, and its own count starts there.
        let forked = thread("forked");
        store
            .fork(&t, 7, &forked, Timestamp::UNIX_EPOCH)
            .await
            .expect("fork");
        let key = TurnKey::whole(forked.clone());
        let now = Timestamp::UNIX_EPOCH;
        for v in 1..6 {
            let command = TurnCommand::commit(v, CheckpointDelta::default());
            let mut state = store
                .load(&key)
                .await
                .expect("load")
                .expect("the fork exists")
                .state;
            let decision = state.decide(&(), &command, now).expect("a turn");
            store
                .commit(Commit {
                    key: &key,
                    expected: Some(Version(v)),
                    command: &command,
                    state: &state,
                    decision: &decision,
                    now,
                })
                .await
                .expect("commit");
        }
        assert_eq!(copies(&store, &forked), [1, 5]);
    }
}
