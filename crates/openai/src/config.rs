//! Where the endpoint is, how to authenticate, and how patient to be.

use std::fmt;
use std::time::Duration;

/// A secret API key. `Debug` never shows it and it has no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiSecret(String);

impl ApiSecret {
    /// Wraps a key.
    ///
    /// ```
    /// use parlance_openai::ApiSecret;
    ///
    /// let key = ApiSecret::new("sk-live-123");
    /// assert_eq!(format!("{key:?}"), "ApiSecret(***)");
    /// assert_eq!(key.expose(), "sk-live-123"); // for the request header only
    /// ```
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key, for the request header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiSecret(***)")
    }
}

/// How the key is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuthStyle {
    /// `Authorization: Bearer <key>` (OpenAI, vLLM, Ollama, llama.cpp).
    Bearer,
    /// `api-key: <key>` (Azure OpenAI).
    ApiKeyHeader,
}

impl AuthStyle {
    /// `ApiKeyHeader` for Azure hosts (`*.openai.azure.com`,
    /// `*.cognitiveservices.azure.com`, `*.services.ai.azure.com`), `Bearer`
    /// otherwise.
    ///
    /// ```
    /// use parlance_openai::AuthStyle;
    ///
    /// assert_eq!(AuthStyle::for_host("acme.openai.azure.com"), AuthStyle::ApiKeyHeader);
    /// assert_eq!(AuthStyle::for_host("api.openai.com"), AuthStyle::Bearer);
    /// ```
    pub fn for_host(host: &str) -> Self {
        let host = host.to_ascii_lowercase();
        let azure = [
            ".openai.azure.com",
            ".cognitiveservices.azure.com",
            ".services.ai.azure.com",
        ];
        if azure.iter().any(|s| host.ends_with(s)) {
            AuthStyle::ApiKeyHeader
        } else {
            AuthStyle::Bearer
        }
    }
}

/// Settings of an OpenAI-compatible endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// The API root that `/chat/completions` and `/embeddings` are appended
    /// to, usually ending in `/v1` (a query string, e.g. Azure's
    /// `api-version`, is kept).
    pub base_url: String,
    /// The chat model (on Azure: the deployment name).
    pub model: String,
    /// The key, if the endpoint needs one.
    pub api_key: Option<ApiSecret>,
    /// How the key is sent.
    pub auth: AuthStyle,
    /// Limit on one attempt: the whole answer, or for a stream the first
    /// byte and then each gap between chunks.
    pub timeout: Duration,
    /// Retries after the first attempt, for rate limits, 5xx, connection
    /// failures and timeouts.
    pub max_retries: u32,
    /// The first back-off delay; it doubles each retry, with jitter.
    pub backoff_base: Duration,
    /// The longest back-off delay.
    pub backoff_max: Duration,
    /// The longest `Retry-After` honoured; a server asking for more gets its
    /// error passed to the caller at once.
    pub max_retry_after: Duration,
}

impl OpenAiConfig {
    /// Defaults: no key (Bearer, or Azure's header on Azure hosts), 60 s
    /// timeout, 3 retries from 250 ms up to 8 s, `Retry-After` up to 30 s.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use parlance_openai::{ApiSecret, OpenAiConfig};
    ///
    /// // A local server (Ollama here) needs no key.
    /// let local = OpenAiConfig::new("http://127.0.0.1:11434/v1", "llama3.1");
    /// assert!(local.api_key.is_none());
    /// assert_eq!(local.max_retries, 3);
    ///
    /// let hosted = OpenAiConfig::new("https://api.openai.com/v1", "gpt-4o-mini")
    ///     .with_api_key(ApiSecret::new("sk-..."))
    ///     .with_timeout(Duration::from_secs(20))
    ///     .with_retries(5, Duration::from_millis(100), Duration::from_secs(2));
    /// assert_eq!(hosted.timeout, Duration::from_secs(20));
    /// ```
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        let base_url = base_url.into();
        let auth = reqwest::Url::parse(&base_url)
            .ok()
            .and_then(|u| u.host_str().map(AuthStyle::for_host))
            .unwrap_or(AuthStyle::Bearer);
        Self {
            base_url,
            model: model.into(),
            api_key: None,
            auth,
            timeout: Duration::from_secs(60),
            max_retries: 3,
            backoff_base: Duration::from_millis(250),
            backoff_max: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(30),
        }
    }

    /// Sets the key.
    pub fn with_api_key(mut self, key: ApiSecret) -> Self {
        self.api_key = Some(key);
        self
    }

    /// Sets the per-attempt timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the retry budget and the back-off range.
    pub fn with_retries(mut self, max_retries: u32, base: Duration, max: Duration) -> Self {
        self.max_retries = max_retries;
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }
}

/// A configuration that cannot work.
///
/// ```
/// use parlance_openai::{ConfigError, OpenAiClient, OpenAiConfig};
///
/// let err = OpenAiClient::new(OpenAiConfig::new("ftp://models.example/v1", "m")).unwrap_err();
/// assert!(matches!(err, ConfigError::BadUrl { .. }), "{err}");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The base URL does not parse or is not http(s).
    #[error("bad base url {url:?}: {reason}")]
    BadUrl {
        /// The URL given.
        url: String,
        /// Why it is refused.
        reason: String,
    },
    /// The key cannot go in a header.
    #[error("the api key holds characters a header cannot carry")]
    BadKey,
    /// The HTTP client could not be built.
    #[error("cannot build the http client: {0}")]
    Client(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_redacted_and_azure_is_detected() {
        let c = OpenAiConfig::new("https://acme.openai.azure.com/openai/v1", "gpt-4o")
            .with_api_key(ApiSecret::new("sk-secret"));
        let shown = format!("{c:?}");
        assert!(!shown.contains("sk-secret"), "{shown}");
        assert!(shown.contains("ApiSecret(***)"));
        assert_eq!(c.auth, AuthStyle::ApiKeyHeader);
        assert_eq!(
            OpenAiConfig::new("http://127.0.0.1:11434/v1", "llama3").auth,
            AuthStyle::Bearer
        );
    }
}
