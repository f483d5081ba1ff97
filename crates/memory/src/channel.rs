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
