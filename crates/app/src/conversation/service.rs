//! Running conversation commands and carrying out their effects.
//!
//! A command runs inside the store's transaction (the machine is pure), and
//! its effects are carried out after the commit: outbound messages are
//! recorded under their idempotency key and handed to the channel, operators
//! are notified in the log, and agent work is scheduled.

use parlance_core::conversation::{
    ConversationError, Effect, Instance, InstanceId, NewInstance, Outcome,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::conversation::Command;
use parlance_ports::{Applied, Outbound, PortResult};

use crate::http::ApiError;
use crate::state::AppState;

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
    command: impl FnOnce(&mut Instance, Timestamp) -> Result<Outcome, ConversationError>
    + Send
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
    command: impl FnOnce(&mut Instance, Timestamp) -> Result<Outcome, ConversationError>
    + Send
    + 'static,
) -> Result<Applied, ApiError> {
    apply(state, product, id, command).await?.map_err(refusal)
}

/// Carries out what a committed command asked for. A delivery's key is
/// recorded before the message is handed to the channel, so running the
/// same effects again never sends twice; a failed hand-over is logged.
pub async fn execute(state: &AppState, instance: &Instance, outcome: &Outcome) {
    for effect in &outcome.effects {
        match effect {
            Effect::Deliver {
                outbound_seq,
                role,
                text,
            } => deliver(state, instance, *outbound_seq, *role, text).await,
            Effect::NotifyOperator { .. } => {
                tracing::info!(
                    product_id = %instance.product_id,
                    instance_id = %instance.instance_id,
                    "conversation needs a human"
                );
            }
            Effect::EnqueueAgentTurn | Effect::ComposeFollowUp => {
                super::agent::schedule(state, instance, effect).await;
            }
            Effect::Append(_) | Effect::PromoteNextQueued | Effect::LateReply => {
                // Done by the store in the command's transaction.
            }
        }
    }
}

async fn deliver(
    state: &AppState,
    instance: &Instance,
    outbound_seq: u32,
    role: parlance_core::conversation::Role,
    text: &str,
) {
    let now = state.clock.now();
    let first = match state
        .conversations
        .record_delivery(
            &instance.product_id,
            instance.instance_id,
            outbound_seq,
            now,
        )
        .await
    {
        Ok(first) => first,
        Err(e) => {
            tracing::warn!(error = %e, instance_id = %instance.instance_id, "could not record a delivery key");
            return;
        }
    };
    if !first {
        return;
    }
    let message = Outbound {
        product_id: instance.product_id.clone(),
        instance_id: instance.instance_id,
        contact_id: instance.contact_id.clone(),
        channel: instance.channel.clone(),
        outbound_seq,
        role,
        text: text.to_owned(),
    };
    if let Err(e) = state.channel.deliver(&message).await {
        tracing::warn!(error = %e, instance_id = %instance.instance_id, outbound_seq, "delivery failed");
    }
}
