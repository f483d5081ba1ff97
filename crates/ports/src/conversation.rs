//! Storage of conversation instances, their transcripts and delivery keys.

use std::time::Duration;

use async_trait::async_trait;
use parlance_core::conversation::{
    ContactId, ConversationError, ConversationState, Instance, InstanceId, Message, NewInstance,
    Outcome,
};
use parlance_core::{ProductId, Timestamp};

use crate::PortResult;

/// A command run against a stored instance under its lock: pure machine code,
/// no I/O. It mutates the instance and returns the outcome, or refuses.
pub type Command = Box<dyn FnOnce(&mut Instance) -> Result<Outcome, ConversationError> + Send>;

/// What applying a command stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// The instance as saved (version bumped).
    pub instance: Instance,
    /// What the command did.
    pub outcome: Outcome,
    /// An instance of the same contact promoted from `QUEUED` in the same
    /// transaction, with its outcome.
    pub promoted: Option<(Instance, Outcome)>,
}

/// Which instances to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Only this contact's.
    pub contact_id: Option<ContactId>,
    /// Only in this state.
    pub state: Option<ConversationState>,
    /// At most this many (the adapter caps it at 1000).
    pub limit: Option<usize>,
}

/// Conversation instances, scoped by product.
///
/// Invariants every adapter keeps: at most one instance per
/// `(product_id, contact_id)` holds its contact; a terminal transition and
/// the promotion of the contact's oldest `QUEUED` instance commit together;
/// the transcript is append-only; the heartbeat deadline is written with the
/// state that arms or clears it; every transition is in the audit log,
/// written in the same transaction.
#[async_trait]
pub trait ConversationStore: Send + Sync + 'static {
    /// Creates an instance, `CREATED` when no instance holds the contact and
    /// `QUEUED` otherwise, decided atomically: concurrent creates for one
    /// contact yield exactly one `CREATED`. A refused creation stores nothing.
    async fn create(
        &self,
        new: NewInstance,
        now: Timestamp,
    ) -> PortResult<Result<(Instance, Outcome), ConversationError>>;

    /// One instance, if it exists for this product.
    async fn get(&self, product: &ProductId, id: InstanceId) -> PortResult<Option<Instance>>;

    /// Instances matching `filter`, oldest first.
    async fn list(&self, product: &ProductId, filter: &ListFilter) -> PortResult<Vec<Instance>>;

    /// The instance's transcript, oldest first; `NotFound` for an unknown id.
    async fn transcript(&self, product: &ProductId, id: InstanceId) -> PortResult<Vec<Message>>;

    /// Runs `command` on the stored instance while holding it, then saves the
    /// instance (version bumped, timer written with the state), appends the
    /// outcome's messages and audit entries, and promotes the contact's
    /// oldest `QUEUED` instance when the outcome asks for it and the contact
    /// is free: one transaction. A refused command changes nothing.
    /// `NotFound` for an unknown id.
    async fn apply(
        &self,
        product: &ProductId,
        id: InstanceId,
        now: Timestamp,
        command: Command,
    ) -> PortResult<Result<Applied, ConversationError>>;

    /// Instances whose heartbeat is due at `now`, at most `limit`, oldest
    /// deadline first; each is hidden from other claimers for `lease`, so
    /// concurrent sweepers never take the same one.
    async fn claim_due(
        &self,
        now: Timestamp,
        limit: usize,
        lease: Duration,
    ) -> PortResult<Vec<Instance>>;

    /// Records the idempotency key of an outbound message before it is handed
    /// to the channel: `true` the first time, `false` when it was already
    /// recorded (the message was sent, or is being sent, by another attempt).
    async fn record_delivery(
        &self,
        product: &ProductId,
        id: InstanceId,
        outbound_seq: u32,
        now: Timestamp,
    ) -> PortResult<bool>;
}

/// The audit entries for an outcome on `instance`: one per transition, and
/// one for a late reply (from and to the terminal state).
pub fn audit_entries(
    instance: &Instance,
    outcome: &Outcome,
    now: Timestamp,
) -> Vec<crate::AuditEntry> {
    let entry = |from: Option<&str>, to: &str, cause: &str| crate::AuditEntry {
        product_id: instance.product_id.clone(),
        entity_kind: "conversation".to_owned(),
        entity_id: instance.instance_id.to_string(),
        from: from.map(str::to_owned),
        to: to.to_owned(),
        cause: cause.to_owned(),
        at: now,
        payload: serde_json::json!({}),
    };
    let mut entries: Vec<_> = outcome
        .transitions
        .iter()
        .map(|t| entry(Some(t.from.as_str()), t.to.as_str(), t.cause))
        .collect();
    if outcome
        .effects
        .iter()
        .any(|e| matches!(e, parlance_core::conversation::Effect::LateReply))
    {
        let s = instance.state.as_str();
        entries.push(entry(Some(s), s, "late_reply"));
    }
    entries
}

/// The audit entry for a newly created instance.
pub fn creation_entry(instance: &Instance) -> crate::AuditEntry {
    crate::AuditEntry {
        product_id: instance.product_id.clone(),
        entity_kind: "conversation".to_owned(),
        entity_id: instance.instance_id.to_string(),
        from: None,
        to: instance.state.as_str().to_owned(),
        cause: "create".to_owned(),
        at: instance.created_at,
        payload: serde_json::json!({"contact_id": instance.contact_id.as_str()}),
    }
}
