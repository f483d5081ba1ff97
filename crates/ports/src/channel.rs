//! Outbound delivery of conversation messages to a contact.

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::conversation::{ContactId, InstanceId, Role};
use serde::Serialize;

use crate::PortResult;

/// A message to hand to a channel. `(instance_id, outbound_seq)` is its
/// idempotency key: a receiver that sees it twice drops the second.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outbound {
    /// The tenant.
    pub product_id: ProductId,
    /// The conversation.
    pub instance_id: InstanceId,
    /// Who receives it.
    pub contact_id: ContactId,
    /// The instance's channel name.
    pub channel: String,
    /// The instance's outbound sequence number.
    pub outbound_seq: u32,
    /// Agent or human operator.
    pub role: Role,
    /// The text.
    pub text: String,
}

/// Where outbound messages go.
///
/// Implemented by [`LoopbackChannel`](https://docs.rs/parlance-memory/latest/parlance_memory/struct.LoopbackChannel.html), whose
/// constructor's example calls it.
#[async_trait]
pub trait Channel: Send + Sync + 'static {
    /// Hands the message over; an error means it may not have arrived and
    /// the caller may retry with the same idempotency key.
    async fn deliver(&self, message: &Outbound) -> PortResult<()>;
}
