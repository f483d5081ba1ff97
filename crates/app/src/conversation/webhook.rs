//! The webhook channel: each outbound message is POSTed as JSON to one URL,
//! signed with HMAC-SHA256 so the receiver can check where it came from.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use hmac::{Hmac, Mac};
use parlance_ports::{Channel, Outbound, PortError, PortResult};
use sha2::Sha256;

/// The header carrying `sha256=<hex of HMAC-SHA256(secret, body)>`.
pub const SIGNATURE_HEADER: &str = "x-parlance-signature";
/// The header carrying `<instance_id>:<outbound_seq>`; a receiver drops a
/// message whose key it has seen.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// Delivers outbound messages to a webhook.
pub struct WebhookChannel {
    client: reqwest::Client,
    url: String,
    secret: Vec<u8>,
}

impl fmt::Debug for WebhookChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookChannel")
            .field("url", &self.url)
            .field("secret", &"***")
            .finish()
    }
}

impl WebhookChannel {
    /// A channel POSTing to `url`, signing with `secret`, giving up on an
    /// attempt after `timeout`.
    ///
    /// # Errors
    ///
    /// When the HTTP client cannot be built.
    pub fn new(
        url: impl Into<String>,
        secret: impl AsRef<[u8]>,
        timeout: Duration,
    ) -> PortResult<Self> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| PortError::other("build the webhook client").with_source(e))?;
        Ok(Self {
            client,
            url: url.into(),
            secret: secret.as_ref().to_vec(),
        })
    }
}

/// `sha256=<hex>` of HMAC-SHA256 over `body` with `secret`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("hmac takes any key length"));
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[async_trait]
impl Channel for WebhookChannel {
    async fn deliver(&self, message: &Outbound) -> PortResult<()> {
        let body = serde_json::to_vec(message)
            .map_err(|e| PortError::other("encode the webhook body").with_source(e))?;
        let response = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature(&self.secret, &body))
            .header(
                IDEMPOTENCY_HEADER,
                format!("{}:{}", message.instance_id, message.outbound_seq),
            )
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
    use super::*;

    #[test]
    fn signs_like_the_rfc_4231_vector() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn debug_hides_the_secret() {
        let c = WebhookChannel::new("http://127.0.0.1:9/hook", "s3cret", Duration::from_secs(1))
            .unwrap();
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}
