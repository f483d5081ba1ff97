//! The one storage protocol every machine's store follows.
//!
//! [`MachineStore::load`] returns a record's state and version;
//! [`MachineStore::commit`] takes the version the decision was made on, the
//! new state and its [`Decision`], and writes the state, the decision's
//! audit entries and its tasks atomically: one transaction in PostgreSQL,
//! one lock in memory. A commit that fails writes none of them. Where an
//! invariant spans records (one conversation holding a contact), the store
//! takes the lock it needs and decides the same command again under it: the
//! command is data, so nothing but data crosses the port.

use std::fmt;

use async_trait::async_trait;
use parlance_core::{Decision, EntityKey, Machine, Timestamp, Transition};
use serde::{Deserialize, Serialize};

use crate::{AuditEntry, PortResult};

/// A record's version: 1 once created, one more on every commit.
///
/// ```
/// use parlance_ports::Version;
///
/// let v = Version::FIRST;
/// assert_eq!(v.next(), Version(2));
/// assert_eq!(Version::from_i64(v.next().as_i64()), Version(2));
/// assert_eq!(v.to_string(), "1");
/// ```
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
#[cfg_attr(
    feature = "openapi",
    derive(utoipa::ToSchema),
    schema(description = "A record's version: 1 once created, one more on every commit.")
)]
pub struct Version(pub u64);

impl Version {
    /// The version of a record just created.
    pub const FIRST: Version = Version(1);

    /// The version after this one.
    #[must_use]
    pub fn next(self) -> Version {
        Version(self.0 + 1)
    }

    /// The version as a signed integer, as SQL stores it.
    pub fn as_i64(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }

    /// A version read back from SQL (negative values read as 0).
    pub fn from_i64(v: i64) -> Version {
        Version(u64::try_from(v).unwrap_or(0))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A stored record with the version a commit must name.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored<M> {
    /// The state as last committed.
    pub state: M,
    /// Its version.
    pub version: Version,
}

/// A decision to write.
#[derive(Debug)]
pub struct Commit<'a, M: Machine> {
    /// The record.
    pub key: &'a M::Key,
    /// The version the decision was made on; `None` creates the record.
    pub expected: Option<Version>,
    /// The command that was decided (stores that must decide again under a
    /// lock decide this).
    pub command: &'a M::Command,
    /// The state after the decision.
    pub state: &'a M,
    /// What the decision did.
    pub decision: &'a Decision<M>,
    /// When it was decided.
    pub now: Timestamp,
}

/// What a commit wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Committed<M: Machine> {
    /// The record's new version.
    pub version: Version,
    /// The state and decision written, when they differ from the caller's:
    /// the store decided the command again under the lock an invariant
    /// needs, or completed the state with what only storage assigns (the
    /// id of a DAG run it enqueued).
    pub written: Option<(M, Decision<M>)>,
    /// Other records of the same machine this commit changed, with their
    /// versions and decisions (a queued conversation promoted when the
    /// contact's holder ended).
    pub also: Vec<(Stored<M>, Decision<M>)>,
}

impl<M: Machine> Committed<M> {
    /// A commit that wrote exactly what it was given.
    pub fn at(version: Version) -> Self {
        Self {
            version,
            written: None,
            also: Vec::new(),
        }
    }
}

/// Storage of one machine's records, keyed by product first.
///
/// Invariants every adapter keeps: `commit` is a compare-and-swap on the
/// version (`expected: None` creates, and is a `Conflict` when the record
/// exists; `Some(v)` is a `Conflict` when the stored version is not `v` or
/// the record is gone); the state, the decision's audit entries
/// ([`audit_entries`]) and its tasks are written together or not at all;
/// the stored deadline is the decision's `next_deadline`.
///
/// Every machine store of `parlance-memory` and `parlance-postgres`
/// implements it; the examples of [`MemorySessionStore`](https://docs.rs/parlance-memory/latest/parlance_memory/struct.MemorySessionStore.html) and
/// [`PgSessionStore`](https://docs.rs/parlance-postgres/latest/parlance_postgres/struct.PgSessionStore.html) load and commit a session through it.
#[async_trait]
pub trait MachineStore<M: Machine>: Send + Sync + 'static {
    /// The record, if it exists. A stored state that no longer decodes is
    /// an error, never "not found", so it is never overwritten.
    async fn load(&self, key: &M::Key) -> PortResult<Option<Stored<M>>>;

    /// Writes a decision: see the trait's invariants.
    async fn commit(&self, commit: Commit<'_, M>) -> PortResult<Committed<M>>;
}

/// The audit entry of one transition of the record at `key`.
pub fn audit_entry<M: Machine>(key: &M::Key, t: &Transition, now: Timestamp) -> AuditEntry {
    AuditEntry {
        product_id: key.product_id().clone(),
        entity_kind: M::KIND,
        entity_id: key.entity_id().into_owned(),
        from: t.from.as_deref().map(str::to_owned),
        to: t.to.clone().into_owned(),
        cause: t.cause.clone().into_owned(),
        at: now,
        payload: t.detail.clone(),
    }
}

/// The audit entries of a decision on the record at `key`, in order.
pub fn audit_entries<M: Machine>(
    key: &M::Key,
    decision: &Decision<M>,
    now: Timestamp,
) -> Vec<AuditEntry> {
    decision
        .transitions
        .iter()
        .map(|t| audit_entry::<M>(key, t, now))
        .collect()
}
