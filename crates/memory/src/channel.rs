//! The loopback channel: records outbound messages instead of sending them.

use std::sync::Mutex;

use async_trait::async_trait;
use parlance_ports::{Channel, Outbound, PortResult};

/// Records every delivered message, dropping repeats of an idempotency key.
#[derive(Debug, Default)]
pub struct LoopbackChannel {
    sent: Mutex<Vec<Outbound>>,
}

impl LoopbackChannel {
    /// A channel with nothing sent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use parlance_core::ProductId;
    /// use parlance_core::conversation::{ContactId, Role};
    /// use parlance_memory::LoopbackChannel;
    /// use parlance_ports::{Channel, Outbound};
    ///
    /// let channel = LoopbackChannel::new();
    /// let message = Outbound {
    ///     product_id: ProductId::parse("acme")?,
    ///     instance_id: "0196b2a0-0000-7000-8000-000000000001".parse()?,
    ///     contact_id: ContactId::parse("+15550100")?,
    ///     channel: "whatsapp".to_owned(),
    ///     outbound_seq: 1,
    ///     role: Role::Agent,
    ///     text: "Which day suits you?".to_owned(),
    /// };
    /// channel.deliver(&message).await?;
    /// channel.deliver(&message).await?; // a retry: dropped
    /// assert_eq!(channel.sent(), vec![message]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Everything delivered so far, in order.
    pub fn sent(&self) -> Vec<Outbound> {
        self.sent.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[async_trait]
impl Channel for LoopbackChannel {
    async fn deliver(&self, message: &Outbound) -> PortResult<()> {
        let mut sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        let repeat = sent.iter().any(|m| {
            m.product_id == message.product_id
                && m.instance_id == message.instance_id
                && m.outbound_seq == message.outbound_seq
        });
        if !repeat {
            sent.push(message.clone());
        }
        Ok(())
    }
}
