//! Contract suite for [`Channel`] adapters.
//!
//! A channel hands messages to a receiver that drops a repeat of an
//! idempotency key `(instance_id, outbound_seq)`. The fixture gives the
//! channel and what its far side accepted, as the JSON each message was
//! sent as; for a network channel the fixture's receiver keys on what the
//! channel sent, so a wrong or missing key shows up as lost or doubled
//! messages. Run it with `parlance_testkit::channel_suite!(async { Some(fixture) });`.

use std::collections::BTreeSet;
use std::sync::Arc;

use parlance_core::ProductId;
use parlance_core::conversation::{ContactId, InstanceId, Role};
use parlance_ports::{Channel, Outbound};
use serde_json::Value;

/// Runs every case of this suite against the channel the factory builds.
///
/// See how [the loopback channel](https://github.com/parlance-rs/parlance/blob/main/crates/memory/tests/it/main.rs) and [the service's HTTP channel](https://github.com/parlance-rs/parlance/blob/main/crates/app/tests/it/contracts.rs)
/// run it.
///
/// ```
/// use std::sync::{Arc, Mutex};
///
/// use async_trait::async_trait;
/// use parlance_ports::{Channel, Outbound, PortResult};
/// use parlance_testkit::channel::{ChannelFixture, Subject};
/// use serde_json::Value;
///
/// /// A channel whose far side keeps what arrives, dropping repeated keys.
/// #[derive(Default)]
/// struct Inbox(Mutex<Vec<Outbound>>);
///
/// #[async_trait]
/// impl Channel for Inbox {
///     async fn deliver(&self, message: &Outbound) -> PortResult<()> {
///         let mut inbox = self.0.lock().expect("not poisoned");
///         let key = |m: &Outbound| (m.instance_id, m.outbound_seq);
///         if !inbox.iter().any(|m| key(m) == key(message)) {
///             inbox.push(message.clone());
///         }
///         Ok(())
///     }
/// }
///
/// /// The fixture: the channel, and what its far side received.
/// #[derive(Default)]
/// struct Fixture(Arc<Inbox>);
///
/// impl ChannelFixture for Fixture {
///     fn channel(&self) -> Arc<dyn Channel> {
///         self.0.clone()
///     }
///
///     fn received(&self) -> Vec<Value> {
///         let inbox = self.0.0.lock().expect("not poisoned");
///         inbox.iter().map(|m| serde_json::to_value(m).expect("encodes")).collect()
///     }
/// }
///
/// fn subject() -> Subject {
///     Arc::new(Fixture::default())
/// }
///
/// // In the channel's `tests/it/main.rs`:
/// mod channel {
///     parlance_testkit::channel_suite!(async { Some(super::subject()) });
/// }
///
/// // What those tests run, case by case:
/// #[tokio::main]
/// async fn main() {
///     use parlance_testkit::channel::*;
///
///     a_delivered_message_arrives_intact(subject()).await;
///     a_repeated_key_arrives_once(subject()).await;
///     a_repeated_key_with_other_text_keeps_the_first(subject()).await;
///     every_sequence_number_arrives_in_order(subject()).await;
///     the_same_sequence_in_another_instance_arrives(subject()).await;
///     concurrent_deliveries_lose_nothing(subject()).await;
/// }
/// ```
#[macro_export]
macro_rules! channel_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::channel;
            cases = [
                a_delivered_message_arrives_intact,
                a_repeated_key_arrives_once,
                a_repeated_key_with_other_text_keeps_the_first,
                every_sequence_number_arrives_in_order,
                the_same_sequence_in_another_instance_arrives,
                concurrent_deliveries_lose_nothing,
            ]
        }
    };
}

/// A channel and the far side it delivers to.
pub trait ChannelFixture: Send + Sync {
    /// The channel under test.
    fn channel(&self) -> Arc<dyn Channel>;
    /// What the far side accepted so far, in arrival order, repeats of an
    /// idempotency key dropped; each message as the JSON it was sent as.
    fn received(&self) -> Vec<Value>;
}

/// The subject of this suite.
pub type Subject = Arc<dyn ChannelFixture>;

/// A message of `instance` (a number, for readable tests) with `seq`.
pub fn message(instance: u128, seq: u32, text: &str) -> Outbound {
    Outbound {
        product_id: ProductId::parse("acme").expect("valid product id"),
        instance_id: InstanceId::from_uuid(uuid::Uuid::from_u128(instance)),
        contact_id: ContactId::parse("+15550100").expect("valid contact id"),
        channel: "whatsapp".to_owned(),
        outbound_seq: seq,
        role: Role::Agent,
        text: text.to_owned(),
    }
}

fn json(m: &Outbound) -> Value {
    serde_json::to_value(m).expect("an outbound message encodes")
}

/// One message arrives once with every field as sent, text byte for byte.
pub async fn a_delivered_message_arrives_intact(subject: Subject) {
    let channel = subject.channel();
    let mut m = message(
        7,
        3,
        "Which day suits you?\n  \u{1F4C5} «Tuesday» \"or\" \\Wednesday",
    );
    m.role = Role::Human;
    m.channel = "sms".to_owned();
    channel.deliver(&m).await.expect("deliver");
    assert_eq!(subject.received(), vec![json(&m)]);
}

/// Delivering the same message again (a retry) is accepted and dropped.
pub async fn a_repeated_key_arrives_once(subject: Subject) {
    let channel = subject.channel();
    let m = message(7, 1, "hello");
    for _ in 0..3 {
        channel.deliver(&m).await.expect("deliver");
    }
    assert_eq!(subject.received(), vec![json(&m)]);
}

/// The key alone decides a repeat: a retry whose text differs is dropped.
pub async fn a_repeated_key_with_other_text_keeps_the_first(subject: Subject) {
    let channel = subject.channel();
    let first = message(7, 1, "first");
    channel.deliver(&first).await.expect("deliver");
    channel
        .deliver(&message(7, 1, "second"))
        .await
        .expect("deliver");
    assert_eq!(subject.received(), vec![json(&first)]);
}

/// Consecutive sequence numbers of one instance all arrive, in order.
pub async fn every_sequence_number_arrives_in_order(subject: Subject) {
    let channel = subject.channel();
    let sent: Vec<Outbound> = (1..=5).map(|s| message(7, s, &format!("m{s}"))).collect();
    for m in &sent {
        channel.deliver(m).await.expect("deliver");
    }
    assert_eq!(
        subject.received(),
        sent.iter().map(json).collect::<Vec<_>>()
    );
}

/// A sequence number is a key only within its instance.
pub async fn the_same_sequence_in_another_instance_arrives(subject: Subject) {
    let channel = subject.channel();
    let a = message(7, 1, "to seven");
    let b = message(8, 1, "to eight");
    channel.deliver(&a).await.expect("deliver");
    channel.deliver(&b).await.expect("deliver");
    assert_eq!(subject.received(), vec![json(&a), json(&b)]);
}

/// Concurrent deliveries of distinct keys all arrive, each once, even with
/// every message delivered twice at the same time.
pub async fn concurrent_deliveries_lose_nothing(subject: Subject) {
    let channel = subject.channel();
    let mut tasks = Vec::new();
    for i in 0..16u32 {
        for _ in 0..2 {
            let channel = channel.clone();
            tasks.push(tokio::spawn(async move {
                let m = message(100 + u128::from(i % 4), i, &format!("m{i}"));
                channel.deliver(&m).await.expect("deliver");
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    let got = subject.received();
    let want: BTreeSet<String> = (0..16u32)
        .map(|i| json(&message(100 + u128::from(i % 4), i, &format!("m{i}"))).to_string())
        .collect();
    assert_eq!(got.len(), want.len(), "{got:?}");
    let got: BTreeSet<String> = got.iter().map(Value::to_string).collect();
    assert_eq!(got, want);
}
