//! Running conversation commands and carrying out their effects.
//!
//! A command is decided by the pure machine and stored by the store, which
//! enqueues the tasks its outcome asks for in the same transaction: agent
//! turns, follow-ups and deliveries. Deliveries run as tasks: the message's
//! idempotency key is recorded, then the message is handed to the channel.
//! Operators are notified in the log after the commit.

use parlance_core::conversation::{
    ConversationError, Effect, Instance, InstanceId, NewInstance, Outcome,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::conversation::Command;
use parlance_ports::{Applied, Lease, Outbound, PortError, PortResult};
use serde_json::{Value, json};

use crate::http::ApiError;
use crate::state::AppState;
use crate::worker::{TaskError, TaskHandler};

/// A refused command as an HTTP answer: 409 with the current state for a
/// command the state does not allow, 422 for an unusable field.
pub fn refusal(e: ConversationError) -> ApiError {
    match e {
        ConversationError::NotAllowed { command, state } => {
            ApiError::conflict("invalid-transition", e.to_string())
                .with("state", state.as_str())
                .with("command", command)
        }
        ConversationError::NotDue { .. } => ApiError::conflict("not-due", e.to_string()),
        ConversationError::Invalid { .. } => ApiError::unprocessable(e.to_string()),
    }
}

/// Creates an instance and carries out its effects.
///
/// # Errors
///
/// 422 for an unusable request, 409 when the id exists, 503 when the store
/// is down.
pub async fn create(state: &AppState, new: NewInstance) -> Result<Instance, ApiError> {
    let now = state.clock.now();
    let (instance, outcome) = state
        .conversations
        .create(new, now)
        .await?
        .map_err(refusal)?;
    execute(state, &instance, &outcome).await;
    Ok(instance)
}

/// Runs `command` on an instance and carries out its effects; a refusal is
/// the inner error, with nothing changed.
///
/// # Errors
///
/// `NotFound` for an unknown id, `Unavailable` when the store is down.
pub async fn apply(
    state: &AppState,
    product: &ProductId,
    id: InstanceId,
    command: impl Fn(&mut Instance, Timestamp) -> Result<Outcome, ConversationError>
    + Send
    + Sync
    + 'static,
) -> PortResult<Result<Applied, ConversationError>> {
    let now = state.clock.now();
    let boxed: Command = Box::new(move |i| command(i, now));
    let applied = match state.conversations.apply(product, id, now, boxed).await? {
        Ok(applied) => applied,
        Err(refused) => return Ok(Err(refused)),
    };
    execute(state, &applied.instance, &applied.outcome).await;
    if let Some((promoted, outcome)) = &applied.promoted {
        execute(state, promoted, outcome).await;
    }
    Ok(Ok(applied))
}

/// [`apply`] for HTTP handlers.
///
/// # Errors
///
/// 404 for an unknown id, 409/422 for a refused command, 503 when the store
/// is down.
pub async fn run(
    state: &AppState,
    product: &ProductId,
    id: InstanceId,
    command: impl Fn(&mut Instance, Timestamp) -> Result<Outcome, ConversationError>
    + Send
    + Sync
    + 'static,
) -> Result<Applied, ApiError> {
    apply(state, product, id, command).await?.map_err(refusal)
}

/// Carries out what a committed command asked for beyond its tasks, which
/// the store enqueued with it: a hand-off to a human is logged.
pub async fn execute(_state: &AppState, instance: &Instance, outcome: &Outcome) {
    for effect in &outcome.effects {
        if let Effect::NotifyOperator { .. } = effect {
            tracing::info!(
                product_id = %instance.product_id,
                instance_id = %instance.instance_id,
                "conversation needs a human"
            );
        }
    }
}

/// The conversation a task's payload names.
///
/// # Errors
///
/// A permanent task error when the payload has no usable `instance_id`.
pub fn task_instance(task: &Lease) -> Result<InstanceId, TaskError> {
    task.payload
        .get("instance_id")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .ok_or_else(|| TaskError::permanent("payload has no instance_id"))
}

/// Delivers one outbound message from the queue: the message named by the
/// task's `instance_id` and `outbound_seq` is read from the transcript,
/// handed to the channel under its idempotency key, and its key recorded.
/// A channel that is unavailable fails the attempt and the queue retries it;
/// a run repeated after a crash hands the message over again under the same
/// key, which the receiver drops.
pub struct DeliveryHandler {
    state: AppState,
}

impl DeliveryHandler {
    /// The handler of [`parlance_ports::conversation::DELIVER_KIND`].
    pub fn new(state: AppState) -> Self {
        Self { state }
    }
}

#[async_trait::async_trait]
impl TaskHandler for DeliveryHandler {
    async fn run(&self, task: &Lease) -> Result<Value, TaskError> {
        let id = task_instance(task)?;
        let seq = task
            .payload
            .get("outbound_seq")
            .and_then(Value::as_u64)
            .and_then(|s| u32::try_from(s).ok())
            .ok_or_else(|| TaskError::permanent("payload has no outbound_seq"))?;
        let store = &self.state.conversations;
        let product = &task.product_id;
        let unavailable = |e: PortError| TaskError::retryable(e.to_string());
        let instance = store
            .get(product, id)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| TaskError::permanent(format!("no conversation {id}")))?;
        let transcript = store.transcript(product, id).await.map_err(unavailable)?;
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
            tracing::warn!(error = %e, instance_id = %id, outbound_seq = seq, "delivery failed");
            return Err(if e.kind == parlance_ports::ErrorKind::Unavailable {
                TaskError::retryable(e.to_string())
            } else {
                TaskError::permanent(e.to_string())
            });
        }
        let first = store
            .record_delivery(product, id, seq, self.state.clock.now())
            .await
            .map_err(unavailable)?;
        Ok(json!({ "delivered": seq, "first": first }))
    }
}
