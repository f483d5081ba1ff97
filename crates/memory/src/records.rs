//! One machine's records in memory, committed as the storage protocol
//! requires: the version checked, the tasks enqueued, the state and its
//! audit entries written, all while one gate is held, so a commit that fails
//! writes nothing and no other commit of the store slips in between. Loads
//! wait for a commit in progress, so a worker that claims a task the
//! moment it is enqueued reads the state that asked for it.
//!
//! Every in-memory machine store is built on [`Records`]; what a machine
//! writes besides its state (a transcript, a deadline index) goes through
//! the `extra` step of [`Records::commit`], which runs under the same gate.
//! A store whose commit writes more than one record (a conversation and the
//! queued one it promotes) holds the [`Gate`] itself and takes the same
//! steps: check, check the tasks, enqueue, write.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use parlance_core::queue::DagLimits;
use parlance_core::{Decision, EntityKey, Machine, ProductId, Task, Timestamp};
use parlance_ports::{
    Commit, DagId, PortError, PortResult, Stored, TaskQueue, Version, audit_entries,
};

use crate::MemoryAuditLog;

/// The map key of a record: its product and its id as text.
pub type RecordKey = (ProductId, String);

/// The map key of `key`.
pub fn record_key<K: EntityKey>(key: &K) -> RecordKey {
    (key.product_id().clone(), key.entity_id().into_owned())
}

/// What a commit enqueued: the ids of its DAG runs, in the decision's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Enqueued {
    /// One per `Task::Dag`, in order.
    pub dags: Vec<DagId>,
}

/// The records of machine `M`, their audit log and their task queue.
///
/// The base of a store for a machine of your own: its `load` is
/// [`Records::load`], its `commit` is [`Records::commit`]. The crate's tests
/// hold such a store, for a [toy counter machine](https://github.com/parlance-rs/parlance/blob/main/crates/memory/tests/it/records.rs),
/// to the storage protocol's contract suite.
pub struct Records<M: Machine> {
    map: Mutex<HashMap<RecordKey, Stored<M>>>,
    gate: tokio::sync::RwLock<()>,
    audit: Arc<MemoryAuditLog>,
    queue: Option<Arc<dyn TaskQueue>>,
    limits: DagLimits,
}

impl<M: Machine> std::fmt::Debug for Records<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Records")
            .field("machine", &M::KIND)
            .field("records", &self.lock().len())
            .finish_non_exhaustive()
    }
}

impl<M: Machine> Records<M> {
    /// No records; commits write audit entries to `audit` and enqueue tasks
    /// on `queue` (a decision with tasks is refused without one), checking
    /// DAGs against `limits` before anything is written.
    pub fn new(
        audit: Arc<MemoryAuditLog>,
        queue: Option<Arc<dyn TaskQueue>>,
        limits: DagLimits,
    ) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            gate: tokio::sync::RwLock::new(()),
            audit,
            queue,
            limits,
        }
    }

    /// The records, locked (never held across an await).
    pub fn lock(&self) -> MutexGuard<'_, HashMap<RecordKey, Stored<M>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until no commit is in progress and holds commits off until the
    /// guard drops: what a store reads beside its records (a transcript, a
    /// deadline index) is then never half written.
    pub async fn settled(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.gate.read().await
    }

    /// The record at `key`, if any, once no commit is in progress.
    pub async fn load(&self, key: &M::Key) -> Option<Stored<M>> {
        let _reading = self.gate.read().await;
        self.lock().get(&record_key(key)).cloned()
    }

    /// Commits `c`: under the gate, checks the version (`Conflict` when it
    /// moved, the record exists on a create, or it is gone), checks every
    /// task, runs `extra` (which may refuse, or prepare what it writes),
    /// enqueues the tasks, then stores `state` with the version bumped and
    /// appends the audit entries, calling `written` with the stored record
    /// and what was enqueued, still under the gate. Nothing is written when
    /// any step before the enqueue fails.
    ///
    /// # Errors
    ///
    /// `Conflict` on a version mismatch, `Invalid` for a task that cannot
    /// be stored, `Unavailable` for tasks without a queue, or what `extra`
    /// answers.
    pub async fn commit<X>(
        &self,
        c: &Commit<'_, M>,
        state: M,
        extra: impl FnOnce(Option<&Stored<M>>) -> PortResult<X>,
        written: impl FnOnce(&mut Stored<M>, &Enqueued, X),
    ) -> PortResult<Version> {
        let gate = self.gate().await;
        let current = gate.check(c)?;
        gate.check_tasks(&c.decision.tasks)?;
        let prepared = extra(current.as_ref())?;
        // Checked above, so in memory this cannot fail.
        let enqueued = gate.enqueue(&c.decision.tasks).await?;
        let version = current.map_or(Version::FIRST, |s| s.version.next());
        let mut stored = Stored { state, version };
        written(&mut stored, &enqueued, prepared);
        gate.write(
            vec![Write {
                key: c.key,
                stored,
                decision: c.decision,
            }],
            c.now,
        );
        Ok(version)
    }

    /// Holds the commit gate until the returned guard drops: what a store
    /// does beside commits (a claim moving deadlines, a delete with its
    /// index) sees no commit half done, and no commit starts meanwhile. A
    /// store whose commit writes more than one record (a promotion beside
    /// the record committed) takes the guard's steps in the order
    /// [`Records::commit`] takes them.
    pub async fn gate(&self) -> Gate<'_, M> {
        Gate {
            records: self,
            _held: self.gate.write().await,
        }
    }

    /// Removes the record at `key`; false when there was none.
    pub async fn delete(&self, key: &M::Key) -> bool {
        let _gate = self.gate.write().await;
        self.lock().remove(&record_key(key)).is_some()
    }
}

/// One record a [`Gate`] writes, with the decision whose audit entries go
/// with it.
#[derive(Debug)]
pub struct Write<'a, M: Machine> {
    /// Where the record lives.
    pub key: &'a M::Key,
    /// The record and its new version.
    pub stored: Stored<M>,
    /// The decision that made it.
    pub decision: &'a Decision<M>,
}

/// The records' gate, held: what a commit does, step by step, while no
/// other commit of the same records can run.
pub struct Gate<'a, M: Machine> {
    records: &'a Records<M>,
    _held: tokio::sync::RwLockWriteGuard<'a, ()>,
}

impl<M: Machine> std::fmt::Debug for Gate<'_, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("machine", &M::KIND)
            .finish_non_exhaustive()
    }
}

impl<M: Machine> Gate<'_, M> {
    /// The records, locked (never held across an await).
    pub fn lock(&self) -> MutexGuard<'_, HashMap<RecordKey, Stored<M>>> {
        self.records.lock()
    }

    /// The record `c` replaces (`None` for a creation), once its version
    /// is checked.
    ///
    /// # Errors
    ///
    /// `Conflict` when the version moved, the record exists on a create,
    /// or it is gone.
    pub fn check(&self, c: &Commit<'_, M>) -> PortResult<Option<Stored<M>>> {
        let rk = record_key(c.key);
        let current = self.lock().get(&rk).cloned();
        match (&current, c.expected) {
            (None, None) => Ok(None),
            (Some(s), Some(v)) if s.version == v => Ok(current),
            (Some(s), None) => Err(PortError::conflict(format!(
                "{} {} exists (version {})",
                M::KIND,
                rk.1,
                s.version
            ))),
            (Some(s), Some(v)) => Err(PortError::conflict(format!(
                "{} {} is at version {}, not {v}",
                M::KIND,
                rk.1,
                s.version
            ))),
            (None, Some(_)) => Err(PortError::conflict(format!(
                "{} {} was deleted meanwhile",
                M::KIND,
                rk.1
            ))),
        }
    }

    /// Checks that every task can be stored, so that enqueueing them
    /// cannot fail.
    ///
    /// # Errors
    ///
    /// `Invalid` for a task that cannot be stored, `Unavailable` for tasks
    /// without a queue.
    pub fn check_tasks<'t>(&self, tasks: impl IntoIterator<Item = &'t Task>) -> PortResult<()> {
        let mut any = false;
        for task in tasks {
            any = true;
            match task {
                Task::One(spec) => spec.validate()?,
                Task::Dag(dag) => {
                    dag.plan(&self.records.limits)?;
                }
            }
        }
        if any && self.records.queue.is_none() {
            return Err(PortError::unavailable(format!(
                "this {} store has no task queue",
                M::KIND
            )));
        }
        Ok(())
    }

    /// Enqueues `tasks` (checked with [`Gate::check_tasks`]): the single
    /// tasks in one batch, then each DAG.
    ///
    /// # Errors
    ///
    /// What the queue answers.
    pub async fn enqueue<'t>(
        &self,
        tasks: impl IntoIterator<Item = &'t Task>,
    ) -> PortResult<Enqueued> {
        let mut enqueued = Enqueued::default();
        let Some(queue) = &self.records.queue else {
            return Ok(enqueued);
        };
        let mut singles = Vec::new();
        let mut dags = Vec::new();
        for task in tasks {
            match task {
                Task::One(spec) => singles.push(spec.clone()),
                Task::Dag(dag) => dags.push(dag),
            }
        }
        if !singles.is_empty() {
            queue.enqueue(&singles).await?;
        }
        for dag in dags {
            enqueued.dags.push(queue.enqueue_dag(dag).await?);
        }
        Ok(enqueued)
    }

    /// Stores `writes`, in order (a later write of the same record wins),
    /// and appends their decisions' audit entries: the last step of a
    /// commit, which cannot fail.
    pub fn write(&self, writes: Vec<Write<'_, M>>, now: Timestamp) {
        let mut audit = Vec::new();
        {
            let mut map = self.lock();
            for w in writes {
                audit.extend(audit_entries::<M>(w.key, w.decision, now));
                map.insert(record_key(w.key), w.stored);
            }
        }
        self.records.audit.push(&audit);
    }
}
