//! The webhook channel: each outbound message is POSTed as JSON to one URL,
//! signed in the Standard Webhooks format (<https://www.standardwebhooks.com/>)
//! so a receiver can check it with any of that format's verifiers.
//!
//! Signing goes through `standardwebhooks`, the format's reference library:
//! the receivers' verifiers and this sender then share one definition of
//! what is signed and how the secret is read.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parlance_ports::{Channel, Clock, Outbound, PortError, PortResult, SystemClock};
use standardwebhooks::Webhook;

/// The header carrying the delivery's id, `<instance_id>:<outbound_seq>`:
/// the same on every retry of one message, so a receiver drops a message
/// whose id it has seen.
pub const ID_HEADER: &str = standardwebhooks::HEADER_WEBHOOK_ID;
/// The header carrying the attempt's time, in Unix seconds.
pub const TIMESTAMP_HEADER: &str = standardwebhooks::HEADER_WEBHOOK_TIMESTAMP;
/// The header carrying `v1,<base64 of HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`.
pub const SIGNATURE_HEADER: &str = standardwebhooks::HEADER_WEBHOOK_SIGNATURE;

/// The prefix of a secret given as base64, as Standard Webhooks serializes
/// secrets.
const SECRET_PREFIX: &str = "whsec_";

/// Delivers outbound messages to a webhook.
pub struct WebhookChannel {
    client: reqwest::Client,
    url: String,
    signer: Webhook,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for WebhookChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookChannel")
            .field("url", &self.url)
            .field("secret", &"***")
            .finish_non_exhaustive()
    }
}

impl WebhookChannel {
    /// A channel POSTing to `url`, signing with `secret`, giving up on an
    /// attempt after `timeout`, stamping attempts with the system clock.
    ///
    /// `secret` is either `whsec_<base64>`, whose decoded bytes are the
    /// HMAC key (the form Standard Webhooks libraries take), or any other
    /// text, whose UTF-8 bytes are the key as they are.
    ///
    /// # Errors
    ///
    /// `Invalid` when the secret is empty or its `whsec_` form is not
    /// base64; `Other` when the HTTP client cannot be built.
    pub fn new(
        url: impl Into<String>,
        secret: impl AsRef<str>,
        timeout: Duration,
    ) -> PortResult<Self> {
        let signer = signer(secret.as_ref())?;
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| PortError::other("build the webhook client").with_source(e))?;
        Ok(Self {
            client,
            url: url.into(),
            signer,
            clock: Arc::new(SystemClock),
        })
    }

    /// The same channel stamping attempts with `clock`.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The `webhook-signature` value of `body` sent as delivery `id` at
    /// `timestamp` (Unix seconds).
    fn signature(&self, id: &str, timestamp: i64, body: &[u8]) -> PortResult<String> {
        self.signer
            .sign(id, timestamp, body)
            .map_err(|e| PortError::other("sign the webhook body").with_source(e))
    }
}

/// The signing key `secret` stands for; see [`WebhookChannel::new`].
fn signer(secret: &str) -> PortResult<Webhook> {
    let invalid = || PortError::invalid("the webhook secret is empty");
    match secret.strip_prefix(SECRET_PREFIX) {
        Some("") => Err(invalid()),
        // The reference library strips the prefix and decodes the base64.
        Some(_) => Webhook::new(secret).map_err(|e| {
            PortError::invalid("the webhook secret starts with `whsec_` but is not base64")
                .with_source(e)
        }),
        None if secret.is_empty() => Err(invalid()),
        None => Webhook::from_bytes(secret.as_bytes().to_vec())
            .map_err(|e| PortError::invalid("unusable webhook secret").with_source(e)),
    }
}

/// The delivery id of `message`: stable across retries, unique per message.
fn delivery_id(message: &Outbound) -> String {
    format!("{}:{}", message.instance_id, message.outbound_seq)
}

#[async_trait]
impl Channel for WebhookChannel {
    async fn deliver(&self, message: &Outbound) -> PortResult<()> {
        let body = serde_json::to_vec(message)
            .map_err(|e| PortError::other("encode the webhook body").with_source(e))?;
        let id = delivery_id(message);
        let timestamp = self.clock.now().as_micros().div_euclid(1_000_000);
        let signature = self.signature(&id, timestamp, &body)?;
        let response = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(ID_HEADER, id)
            .header(TIMESTAMP_HEADER, timestamp.to_string())
            .header(SIGNATURE_HEADER, signature)
            .body(body)
            .send()
            .await
            .map_err(|e| PortError::unavailable("webhook unreachable").with_source(e))?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else if status.is_server_error() || status.as_u16() == 429 {
            Err(PortError::unavailable(format!("webhook answered {status}")))
        } else {
            Err(PortError::invalid(format!("webhook answered {status}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use parlance_core::ProductId;
    use parlance_core::conversation::{ContactId, InstanceId, Role};
    use parlance_ports::ErrorKind;

    use super::*;

    fn channel(secret: &str) -> PortResult<WebhookChannel> {
        WebhookChannel::new("http://127.0.0.1:9/hook", secret, Duration::from_secs(1))
    }

    #[test]
    fn signs_like_the_reference_vector() {
        // The vector of the Standard Webhooks reference libraries.
        let c = channel("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        assert_eq!(
            c.signature(
                "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
                1_649_367_553,
                br#"{"email":"test@example.com","username":"test_user"}"#,
            )
            .unwrap(),
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
        );
    }

    #[test]
    fn a_raw_secret_is_its_own_bytes() {
        // `czNjcmV0` is the base64 of `s3cret`: both name the same key.
        let raw = channel("s3cret").unwrap();
        let encoded = channel("whsec_czNjcmV0").unwrap();
        let other = channel("whsec_b3RoZXI=").unwrap();
        let sign = |c: &WebhookChannel| c.signature("i:1", 1_700_000_000, b"{}").unwrap();
        assert_eq!(sign(&raw), sign(&encoded));
        assert_ne!(sign(&raw), sign(&other));
    }

    #[test]
    fn unusable_secrets_are_refused() {
        for secret in ["", "whsec_", "whsec_not base64!"] {
            let err = channel(secret).unwrap_err();
            assert_eq!(err.kind, ErrorKind::Invalid, "{secret:?}");
        }
    }

    #[test]
    fn the_delivery_id_is_the_instance_and_sequence() {
        let m = Outbound {
            product_id: ProductId::parse("acme").unwrap(),
            instance_id: InstanceId::from_uuid(uuid::Uuid::from_u128(7)),
            contact_id: ContactId::parse("+15550100").unwrap(),
            channel: "whatsapp".into(),
            outbound_seq: 3,
            role: Role::Agent,
            text: "hi".into(),
        };
        assert_eq!(delivery_id(&m), "00000000-0000-0000-0000-000000000007:3");
    }

    #[test]
    fn debug_hides_the_secret() {
        let c = channel("s3cret").unwrap();
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}
