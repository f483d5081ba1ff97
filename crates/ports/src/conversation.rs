//! Storage of conversation instances, their transcripts and delivery keys.

use std::time::Duration;

use async_trait::async_trait;
use parlance_core::conversation::{
    ContactId, ConversationError, ConversationState, Effect, Instance, InstanceId, Message,
    NewInstance, Outcome,
};
use parlance_core::{ProductId, Timestamp};

use crate::{PortResult, TaskSpec};

/// A command run against a stored instance: pure machine code, no I/O. It
/// mutates the instance and returns the outcome, or refuses. A store may run
/// it a second time, on a fresh read, when another write moved the instance
/// between its read and its guarded write; only the run whose write lands
/// counts.
pub type Command = Box<dyn Fn(&mut Instance) -> Result<Outcome, ConversationError> + Send + Sync>;

/// Task kind of an agent turn.
pub const TURN_KIND: &str = "conversation.agent_turn";
/// Task kind of a follow-up.
pub const FOLLOW_UP_KIND: &str = "conversation.follow_up";
/// Task kind of an outbound message's delivery to its channel.
pub const DELIVER_KIND: &str = "conversation.deliver";

/// The tasks an outcome on `instance` asks for, enqueued by the store in the
/// transaction that commits the outcome: an agent turn or a follow-up (one
/// pending task per instance and kind, so a second request while one waits
/// is folded into it), and one delivery per outbound message (its payload
/// names the message by `outbound_seq`; the text stays in the transcript).
pub fn effect_tasks(instance: &Instance, outcome: &Outcome) -> Vec<TaskSpec> {
    let payload = |extra: Option<u32>| {
        let mut p = serde_json::json!({ "instance_id": instance.instance_id });
        if let Some(seq) = extra {
            p["outbound_seq"] = seq.into();
        }
        p
    };
    outcome
        .effects
        .iter()
        .filter_map(|effect| {
            let (kind, seq) = match effect {
                Effect::EnqueueAgentTurn => (TURN_KIND, None),
                Effect::ComposeFollowUp => (FOLLOW_UP_KIND, None),
                Effect::Deliver { outbound_seq, .. } => (DELIVER_KIND, Some(*outbound_seq)),
                _ => return None,
            };
            let mut task = TaskSpec::new(instance.product_id.clone(), kind, payload(seq));
            if seq.is_none() {
                task.dedup_key = Some(format!(
                    "{kind}:{}:{}",
                    instance.product_id, instance.instance_id
                ));
            }
            Some(task)
        })
        .collect()
}

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
/// state that arms or clears it; every transition is in the audit log, and
/// the tasks its outcome asks for ([`effect_tasks`]) are on the task queue,
/// both written in the same transaction.
#[async_trait]
pub trait ConversationStore: Send + Sync + 'static {
    /// Creates an instance, `CREATED` when no instance holds the contact and
    /// `QUEUED` otherwise, decided atomically: concurrent creates for one
    /// contact yield exactly one `CREATED`; the outcome's [`effect_tasks`]
    /// commit with it. A refused creation stores nothing.
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

    /// Runs `command` on the stored instance, then saves the instance
    /// (version bumped, timer written with the state) only if its state and
    /// version are still those the command saw, appends the outcome's
    /// messages and audit entries, enqueues its [`effect_tasks`], and
    /// promotes the contact's oldest `QUEUED` instance when the outcome asks
    /// for it and the contact is free: one transaction. When the instance
    /// moved in between, the command runs again on the instance as it now is.
    /// A refused command changes nothing. `NotFound` for an unknown id.
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

    /// Records the idempotency key of an outbound message once the channel
    /// took it: `true` the first time, `false` when it was already recorded
    /// (an earlier attempt of the same delivery got that far).
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
