//! Running conversation commands and carrying out their effects.
//!
//! Every command goes through the [`Executor`]: the instance is loaded, the
//! command decided on it (a creation on nothing) and committed by the store
//! with its transcript lines, audit entries and tasks (agent turns,
//! follow-ups, deliveries) in one transaction, decided again on a fresh
//! load when another write got there first. The store decides a creation
//! again under the contact's lock and promotes the contact's next queued
//! instance when a decision frees the contact; both come back in the
//! [`Executed`] result. Deliveries run as tasks: the message is handed to
//! the channel under its idempotency key, then the key is recorded.
//! Operators are notified in the log after the commit.

use parlance_core::Decision;
use parlance_core::conversation::{
    ConversationCommand, ConversationContext, ConversationEffect, ConversationKey, Instance,
    InstanceId, NewInstance,
};
use parlance_ports::{Lease, Outbound, PortError};
use serde_json::{Value, json};

use super::Conversations;
use crate::execute::{Executed, Executor, ServiceError};
use crate::worker::{TaskError, TaskHandler};

/// What running a conversation command answers.
pub(super) type Outcome = Result<Executed<Instance>, ServiceError<Instance>>;

/// Decides `command` on the instance at `key`, commits it and carries out
/// its effects (and those of an instance it promoted).
///
/// # Errors
///
/// The machine's refusal (nothing changed), `NotFound` for an unknown
/// instance, `Contended` when every attempt lost its race, or a store
/// failure.
pub async fn run(
    state: &Conversations,
    key: &ConversationKey,
    command: ConversationCommand,
) -> Outcome {
    // Only creation and promotion read the context, and the store decides
    // those again under the contact's lock.
    let ctx = ConversationContext::default();
    let executed = Executor::new(state.store.as_ref(), state.shared.clock.as_ref())
        .run(key, &ctx, &command)
        .await?;
    notify(&executed.state, &executed.decision);
    for (promoted, decision) in &executed.also {
        notify(&promoted.state, decision);
    }
    Ok(executed)
}

/// Creates an instance: `CREATED`, or `QUEUED` when its contact is held.
///
/// # Errors
///
/// As [`run`]; a refusal when the request is unusable or the id exists.
pub async fn create(state: &Conversations, new: NewInstance) -> Outcome {
    let key = new.key();
    run(state, &key, ConversationCommand::Create(new)).await
}

/// Carries out what a committed decision asked for beyond its tasks and
/// transcript lines, which the store wrote with it: a hand-off to a human
/// is logged.
fn notify(instance: &Instance, decision: &Decision<Instance>) {
    for effect in &decision.effects {
        if let ConversationEffect::NotifyOperator { .. } = effect {
            tracing::info!(
                product_id = %instance.product_id,
                instance_id = %instance.instance_id,
                "conversation needs a human"
            );
        }
    }
}

/// The conversation a task names: its product and the payload's
/// `instance_id`.
///
/// # Errors
///
/// A permanent task error when the payload has no usable `instance_id`.
pub(super) fn task_key(task: &Lease) -> Result<ConversationKey, TaskError> {
    let instance_id: InstanceId = task
        .payload
        .get("instance_id")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .ok_or_else(|| TaskError::permanent("payload has no instance_id"))?;
    Ok(ConversationKey {
        product_id: task.product_id.clone(),
        instance_id,
    })
}

/// Delivers one outbound message from the queue: the message named by the
/// task's `instance_id` and `outbound_seq` is read from the transcript,
/// handed to the channel under its idempotency key, and its key recorded.
/// A channel that is unavailable fails the attempt and the queue retries it;
/// a run repeated after a crash hands the message over again under the same
/// key, which the receiver drops.
pub(super) struct DeliveryHandler {
    state: Conversations,
}

impl DeliveryHandler {
    /// The handler of [`parlance_ports::conversation::DELIVER_KIND`].
    pub(super) fn new(state: Conversations) -> Self {
        Self { state }
    }
}

#[async_trait::async_trait]
impl TaskHandler for DeliveryHandler {
    async fn run(&self, task: &Lease) -> Result<Value, TaskError> {
        let key = task_key(task)?;
        let seq = task
            .payload
            .get("outbound_seq")
            .and_then(Value::as_u64)
            .and_then(|s| u32::try_from(s).ok())
            .ok_or_else(|| TaskError::permanent("payload has no outbound_seq"))?;
        let unavailable = |e: PortError| TaskError::retryable(e.to_string());
        let instance = self
            .state
            .store
            .load(&key)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| TaskError::permanent(format!("no conversation {}", key.instance_id)))?
            .state;
        let index = &self.state.index;
        let transcript = index.transcript(&key).await.map_err(unavailable)?;
        let message = transcript
            .into_iter()
            .find(|m| m.outbound_seq == Some(seq))
            .ok_or_else(|| TaskError::permanent(format!("no outbound message {seq}")))?;
        let outbound = Outbound {
            product_id: instance.product_id.clone(),
            instance_id: instance.instance_id,
            contact_id: instance.contact_id.clone(),
            channel: instance.channel.clone(),
            outbound_seq: seq,
            role: message.role,
            text: message.text,
        };
        if let Err(e) = self.state.channel.deliver(&outbound).await {
            tracing::warn!(error = %e, instance_id = %key.instance_id, outbound_seq = seq, "delivery failed");
            return Err(if e.kind == parlance_ports::ErrorKind::Unavailable {
                TaskError::retryable(e.to_string())
            } else {
                TaskError::permanent(e.to_string())
            });
        }
        let first = index
            .record_delivery(&key, seq, self.state.shared.clock.now())
            .await
            .map_err(unavailable)?;
        Ok(json!({ "delivered": seq, "first": first }))
    }
}
