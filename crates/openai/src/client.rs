//! The HTTP client: requests with a per-attempt timeout, retries with
//! exponential back-off and jitter (honouring `Retry-After`), streaming over
//! server-sent events, chat completions and embeddings.

use std::collections::VecDeque;
use std::future::Future;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::StreamExt as _;
use futures_util::stream::BoxStream;
use parlance_ports::{
    CompletionChunk, CompletionRequest, CompletionResponse, CompletionStream, EmbeddingProvider,
    Embeddings, LlmClient, LlmError, LlmResult, chunks_of,
};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Response, Url};
use serde_json::Value;
use tracing::Instrument as _;

use crate::config::{AuthStyle, ConfigError, OpenAiConfig};
use crate::sse::SseDecoder;
use crate::wire;

/// What both clients share: the connection pool, the endpoint, the key
/// header (marked sensitive) and the retry policy.
#[derive(Debug, Clone)]
struct Http {
    client: reqwest::Client,
    base: Url,
    config: OpenAiConfig,
    auth: Option<(HeaderName, HeaderValue)>,
}

impl Http {
    fn new(config: OpenAiConfig) -> Result<Self, ConfigError> {
        let bad = |reason: &str| ConfigError::BadUrl {
            url: config.base_url.clone(),
            reason: reason.to_owned(),
        };
        let base = Url::parse(config.base_url.trim()).map_err(|e| bad(&e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(bad("expected http or https"));
        }
        if base.cannot_be_a_base() {
            return Err(bad("not a base url"));
        }
        let auth = match &config.api_key {
            Some(key) if !key.expose().is_empty() => {
                let (name, value) = match config.auth {
                    AuthStyle::Bearer => (AUTHORIZATION, format!("Bearer {}", key.expose())),
                    AuthStyle::ApiKeyHeader => {
                        (HeaderName::from_static("api-key"), key.expose().to_owned())
                    }
                };
                let mut value = HeaderValue::from_str(&value).map_err(|_| ConfigError::BadKey)?;
                value.set_sensitive(true);
                Some((name, value))
            }
            _ => None,
        };
        let client = reqwest::Client::builder()
            .connect_timeout(config.timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|e| ConfigError::Client(e.to_string()))?;
        Ok(Self {
            client,
            base,
            config,
            auth,
        })
    }

    /// `base` with `path` appended to its path; the query is kept.
    fn endpoint(&self, path: &str) -> Url {
        let mut url = self.base.clone();
        let joined = format!("{}/{}", url.path().trim_end_matches('/'), path);
        url.set_path(&joined);
        url
    }

    /// One POST; a non-2xx status becomes a classified error.
    async fn send(&self, url: &Url, body: &Value) -> LlmResult<Response> {
        let mut req = self.client.post(url.clone()).json(body);
        if let Some((name, value)) = &self.auth {
            req = req.header(name, value.clone());
        }
        let res = req.send().await.map_err(|e| self.classify(&e))?;
        let status = res.status();
        if status.is_success() {
            return Ok(res);
        }
        let retry_after = retry_after(res.headers());
        let body = res.bytes().await.unwrap_or_default();
        Err(LlmError::from_status(
            status.as_u16(),
            retry_after,
            &wire::error_message(&body),
        ))
    }

    fn classify(&self, e: &reqwest::Error) -> LlmError {
        if e.is_timeout() {
            return LlmError::Timeout {
                after: self.config.timeout,
            };
        }
        // The URL is left out: it is in the logs' context already.
        let message = wire::scrub(&strip_url(e));
        if e.is_connect() || e.is_request() || e.is_body() {
            LlmError::Unavailable {
                message,
                retry_after: None,
            }
        } else {
            LlmError::Other { message }
        }
    }

    /// Runs `attempt` under the timeout, retrying retryable errors with
    /// back-off until the budget is spent. With a `deadline`, each attempt's
    /// limit is the configured timeout or what is left, whichever is
    /// shorter; no attempt starts once it has passed, and no back-off wait
    /// that would end at or after it is begun: the call fails instead.
    async fn with_retries<T, F, Fut>(
        &self,
        what: &'static str,
        deadline: Option<Instant>,
        mut attempt: F,
    ) -> LlmResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = LlmResult<T>>,
    {
        let began = Instant::now();
        let mut tries = 0u32;
        loop {
            let Some(limit) = self.attempt_limit(deadline, Instant::now()) else {
                tracing::warn!(
                    what,
                    tries,
                    "model call deadline passed; no further attempt"
                );
                return Err(LlmError::Timeout {
                    after: began.elapsed(),
                });
            };
            let started = Instant::now();
            let result = match tokio::time::timeout(limit, attempt()).await {
                Ok(r) => r,
                Err(_) => Err(LlmError::Timeout { after: limit }),
            };
            let elapsed_ms = started.elapsed().as_millis() as u64;
            match result {
                Ok(v) => {
                    tracing::debug!(what, tries, elapsed_ms, "model call succeeded");
                    return Ok(v);
                }
                Err(e) if e.is_retryable() && tries < self.config.max_retries => {
                    let Some(delay) = self.delay(tries, &e) else {
                        tracing::warn!(what, error = %e, "model asked for a longer wait than allowed; giving up");
                        return Err(e);
                    };
                    if deadline.is_some_and(|d| Instant::now() + delay >= d) {
                        tracing::warn!(
                            what,
                            tries,
                            delay_ms = delay.as_millis() as u64,
                            error = %e,
                            "no time left before the deadline for another attempt; giving up"
                        );
                        return Err(e);
                    }
                    tracing::warn!(
                        what,
                        attempt = tries + 1,
                        delay_ms = delay.as_millis() as u64,
                        error = %e,
                        "model call failed; retrying"
                    );
                    tokio::time::sleep(delay).await;
                    tries += 1;
                }
                Err(e) => {
                    tracing::warn!(what, tries, elapsed_ms, error = %e, "model call failed");
                    return Err(e);
                }
            }
        }
    }

    /// The limit of an attempt starting at `now`: the configured timeout,
    /// cut to what is left before `deadline`; `None` when nothing is left.
    fn attempt_limit(&self, deadline: Option<Instant>, now: Instant) -> Option<Duration> {
        match deadline {
            None => Some(self.config.timeout),
            Some(d) => {
                let left = d.saturating_duration_since(now);
                (!left.is_zero()).then(|| left.min(self.config.timeout))
            }
        }
    }

    /// The wait before retry number `tries + 1`: the server's `Retry-After`
    /// when given (`None` when it exceeds the allowed maximum), else
    /// exponential back-off with jitter in `[d/2, d]`.
    fn delay(&self, tries: u32, e: &LlmError) -> Option<Duration> {
        if let Some(asked) = e.retry_after() {
            return (asked <= self.config.max_retry_after).then_some(asked);
        }
        let exp = self
            .config
            .backoff_base
            .saturating_mul(2u32.saturating_pow(tries))
            .min(self.config.backoff_max);
        let half = exp / 2;
        let spread = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let jitter = if spread == 0 {
            0
        } else {
            random_u64() % spread.saturating_add(1)
        };
        Some(half + Duration::from_nanos(jitter))
    }
}

fn strip_url(e: &reqwest::Error) -> String {
    let mut msg = e.to_string();
    if let Some(url) = e.url() {
        msg = msg.replace(&format!(" for url ({url})"), "");
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // Without randomness the jitter is simply zero.
    let _ = getrandom::fill(&mut bytes);
    u64::from_le_bytes(bytes)
}

/// The server's requested wait: `retry-after-ms`, else `Retry-After` in
/// seconds, else `Retry-After` as an HTTP date measured from the response's
/// own `Date` (so no local clock is read).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = get("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let now = httpdate::parse_http_date(get("date")?).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A chat model behind an OpenAI-compatible `/chat/completions`.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use futures_util::StreamExt as _;
/// use parlance_openai::{OpenAiClient, OpenAiConfig};
/// use parlance_ports::{ChunkAccumulator, CompletionRequest, LlmClient, Message};
///
/// let client = OpenAiClient::new(OpenAiConfig::new("http://127.0.0.1:11434/v1", "llama3.1"))?;
/// let request = CompletionRequest::new(vec![Message::user("Say hello.")]).with_max_tokens(20);
///
/// let whole = client.complete(&request).await?;
/// println!("{}", whole.content);
///
/// let mut stream = client.stream(&request).await?;
/// let mut answer = ChunkAccumulator::new();
/// while let Some(chunk) = stream.next().await {
///     answer.push(chunk?);
/// }
/// println!("{}", answer.finish().content);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct OpenAiClient {
    http: Http,
    url: Url,
}

impl OpenAiClient {
    /// A client for `config`.
    ///
    /// # Errors
    ///
    /// When the base URL or key cannot be used.
    ///
    /// ```
    /// use parlance_openai::{OpenAiClient, OpenAiConfig};
    /// use parlance_ports::LlmClient;
    ///
    /// // Building makes no request: a bad URL or key is found here, the server
    /// // on the first call.
    /// let client = OpenAiClient::new(OpenAiConfig::new("http://127.0.0.1:8000/v1", "qwen2.5"))?;
    /// assert_eq!(client.url().as_str(), "http://127.0.0.1:8000/v1/chat/completions");
    /// assert_eq!(client.default_model(), "qwen2.5");
    /// # Ok::<(), parlance_openai::ConfigError>(())
    /// ```
    pub fn new(config: OpenAiConfig) -> Result<Self, ConfigError> {
        let http = Http::new(config)?;
        let url = http.endpoint("chat/completions");
        Ok(Self { http, url })
    }

    /// The URL chat requests go to.
    pub fn url(&self) -> &Url {
        &self.url
    }
}

#[async_trait]
impl LlmClient for OpenAiClient {
    fn describe(&self) -> String {
        let mut base = self.http.base.clone();
        base.set_query(None);
        format!("openai-compatible endpoint {base}")
    }

    fn default_model(&self) -> &str {
        &self.http.config.model
    }

    async fn complete(&self, request: &CompletionRequest) -> LlmResult<CompletionResponse> {
        let body = wire::chat_body(request, &self.http.config.model, false);
        let model = self.http.config.model.as_str();
        let span = call_span(request, &body);
        self.http
            .with_retries("chat", request.deadline, || async {
                let res = self.http.send(&self.url, &body).await?;
                let bytes = res.bytes().await.map_err(|e| self.http.classify(&e))?;
                let v: Value = serde_json::from_slice(&bytes).map_err(|e| LlmError::Other {
                    message: format!("malformed response body: {e}"),
                })?;
                wire::chat_response(&v, model).map_err(|m| LlmError::Other {
                    message: format!("malformed response: {m}"),
                })
            })
            .instrument(span)
            .await
    }

    async fn stream(&self, request: &CompletionRequest) -> LlmResult<CompletionStream> {
        let body = wire::chat_body(request, &self.http.config.model, true);
        let res = self
            .http
            .with_retries("chat stream", request.deadline, || {
                self.http.send(&self.url, &body)
            })
            .instrument(call_span(request, &body))
            .await?;
        let is_json = res
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if is_json {
            // A server that ignores `stream` answers whole: replay it.
            let limit = self
                .http
                .attempt_limit(request.deadline, Instant::now())
                .unwrap_or(Duration::ZERO);
            let bytes = tokio::time::timeout(limit, res.bytes())
                .await
                .map_err(|_| LlmError::Timeout { after: limit })?
                .map_err(|e| self.http.classify(&e))?;
            let v: Value = serde_json::from_slice(&bytes).map_err(|e| LlmError::Other {
                message: format!("malformed response body: {e}"),
            })?;
            let whole =
                wire::chat_response(&v, &self.http.config.model).map_err(|m| LlmError::Other {
                    message: format!("malformed response: {m}"),
                })?;
            let items: Vec<LlmResult<CompletionChunk>> =
                chunks_of(&whole).into_iter().map(Ok).collect();
            return Ok(Box::pin(futures_util::stream::iter(items)));
        }
        let state = StreamState {
            bytes: res.bytes_stream().map(|r| r.map(|b| b.to_vec())).boxed(),
            decoder: SseDecoder::new(),
            pending: VecDeque::new(),
            done: false,
            saw_model: false,
            idle: self.http.config.timeout,
            deadline: request.deadline,
            http: self.http.clone(),
        };
        Ok(Box::pin(futures_util::stream::unfold(state, next_chunk)))
    }
}

/// The span of one model call: the prompt's name and the model, never the
/// messages.
fn call_span(request: &CompletionRequest, body: &Value) -> tracing::Span {
    tracing::debug_span!(
        "model_call",
        prompt = request.prompt_name.as_deref().unwrap_or("unnamed"),
        model = body["model"].as_str().unwrap_or(""),
    )
}

struct StreamState {
    bytes: BoxStream<'static, reqwest::Result<Vec<u8>>>,
    decoder: SseDecoder,
    pending: VecDeque<LlmResult<CompletionChunk>>,
    done: bool,
    saw_model: bool,
    /// The longest wait for the first chunk and between chunks.
    idle: Duration,
    /// When the caller stops waiting, if it said.
    deadline: Option<Instant>,
    http: Http,
}

impl StreamState {
    /// Turns one event's data into pending chunks; `[DONE]` ends the stream.
    fn event(&mut self, event: Option<&str>, data: &str) {
        if self.done {
            return;
        }
        if data.trim() == "[DONE]" {
            self.done = true;
            return;
        }
        let parsed = serde_json::from_str::<Value>(data)
            .map_err(|e| format!("malformed stream event: {e}"))
            .and_then(|v| {
                if event == Some("error") {
                    return Err(format!(
                        "server error in stream: {}",
                        wire::error_message(data.as_bytes())
                    ));
                }
                wire::stream_chunks(&v, !self.saw_model)
            });
        match parsed {
            Ok(chunks) => {
                for c in chunks {
                    if matches!(c, CompletionChunk::Model { .. }) {
                        self.saw_model = true;
                    }
                    self.pending.push_back(Ok(c));
                }
            }
            Err(message) => {
                self.pending.push_back(Err(LlmError::Other { message }));
                self.done = true;
            }
        }
    }
}

async fn next_chunk(mut s: StreamState) -> Option<(LlmResult<CompletionChunk>, StreamState)> {
    loop {
        if let Some(item) = s.pending.pop_front() {
            return Some((item, s));
        }
        if s.done {
            return None;
        }
        let wait = s.deadline.map_or(s.idle, |d| {
            d.saturating_duration_since(Instant::now()).min(s.idle)
        });
        match tokio::time::timeout(wait, s.bytes.next()).await {
            Err(_) => {
                s.done = true;
                s.pending.push_back(Err(LlmError::Timeout { after: wait }));
            }
            Ok(None) => {
                if let Some(e) = s.decoder.finish() {
                    s.event(e.event.as_deref(), &e.data);
                }
                s.done = true;
            }
            Ok(Some(Err(e))) => {
                s.done = true;
                s.pending.push_back(Err(s.http.classify(&e)));
            }
            Ok(Some(Ok(bytes))) => match s.decoder.push(&bytes) {
                Ok(events) => {
                    for e in events {
                        s.event(e.event.as_deref(), &e.data);
                    }
                }
                Err(message) => {
                    s.done = true;
                    s.pending.push_back(Err(LlmError::Other { message }));
                }
            },
        }
    }
}

/// Embeddings from an OpenAI-compatible `/embeddings`.
#[derive(Debug, Clone)]
pub struct OpenAiEmbedder {
    http: Http,
    url: Url,
    model: String,
    dimensions: Option<usize>,
}

impl OpenAiEmbedder {
    /// An embedder of `model` on the endpoint of `config` (whose chat model
    /// is not used). `dimensions` asks the server to shorten the vectors
    /// (text-embedding-3 models) and is checked on every answer.
    ///
    /// # Errors
    ///
    /// When the base URL or key cannot be used.
    ///
    /// ```
    /// use parlance_openai::{OpenAiConfig, OpenAiEmbedder};
    /// use parlance_ports::EmbeddingProvider;
    ///
    /// let config = OpenAiConfig::new("https://api.openai.com/v1", "gpt-4o-mini");
    /// let embedder = OpenAiEmbedder::new(config, "text-embedding-3-small", Some(512))?;
    /// assert_eq!(embedder.model(), "text-embedding-3-small");
    /// assert_eq!(embedder.dimension(), Some(512));
    /// # Ok::<(), parlance_openai::ConfigError>(())
    /// ```
    pub fn new(
        config: OpenAiConfig,
        model: impl Into<String>,
        dimensions: Option<usize>,
    ) -> Result<Self, ConfigError> {
        let http = Http::new(config)?;
        let url = http.endpoint("embeddings");
        Ok(Self {
            http,
            url,
            model: model.into(),
            dimensions,
        })
    }
}

#[async_trait]
impl EmbeddingProvider for OpenAiEmbedder {
    fn model(&self) -> &str {
        &self.model
    }

    fn dimension(&self) -> Option<usize> {
        self.dimensions
    }

    async fn embed(&self, texts: &[String]) -> LlmResult<Embeddings> {
        if texts.is_empty() {
            return Ok(Embeddings {
                model: self.model.clone(),
                dimension: self.dimensions.unwrap_or(0),
                vectors: Vec::new(),
                usage: None,
            });
        }
        let body = wire::embeddings_body(texts, &self.model, self.dimensions);
        let (vectors, model, usage) = self
            .http
            .with_retries("embeddings", None, || async {
                let res = self.http.send(&self.url, &body).await?;
                let bytes = res.bytes().await.map_err(|e| self.http.classify(&e))?;
                let v: Value = serde_json::from_slice(&bytes).map_err(|e| LlmError::Other {
                    message: format!("malformed response body: {e}"),
                })?;
                let vectors =
                    wire::embeddings_response(&v, texts.len()).map_err(|m| LlmError::Other {
                        message: format!("malformed response: {m}"),
                    })?;
                let model = v.get("model").and_then(Value::as_str).map(str::to_owned);
                Ok((vectors, model, wire::usage(v.get("usage"))))
            })
            .instrument(tracing::debug_span!("embed", model = %self.model, texts = texts.len()))
            .await?;
        let dimension = vectors.first().map_or(0, Vec::len);
        if let Some(want) = self.dimensions
            && want != dimension
        {
            return Err(LlmError::Other {
                message: format!("asked for {want} dimensions, got {dimension}"),
            });
        }
        Ok(Embeddings {
            model: model.unwrap_or_else(|| self.model.clone()),
            dimension,
            vectors,
            usage,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_keep_the_query_and_join_paths() {
        let http = Http::new(OpenAiConfig::new(
            "https://acme.openai.azure.com/openai/v1/?api-version=preview",
            "d",
        ))
        .unwrap();
        assert_eq!(
            http.endpoint("chat/completions").as_str(),
            "https://acme.openai.azure.com/openai/v1/chat/completions?api-version=preview"
        );
        let http = Http::new(OpenAiConfig::new("http://127.0.0.1:8000/v1", "m")).unwrap();
        assert_eq!(
            http.endpoint("embeddings").as_str(),
            "http://127.0.0.1:8000/v1/embeddings"
        );
        assert!(Http::new(OpenAiConfig::new("ftp://x", "m")).is_err());
        assert!(Http::new(OpenAiConfig::new("not a url", "m")).is_err());
    }

    #[test]
    fn retry_after_forms() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", HeaderValue::from_static("150"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(150)));
        let mut h = HeaderMap::new();
        h.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:05 GMT"),
        );
        assert_eq!(retry_after(&h), None, "a date needs the response's Date");
        h.insert(
            "date",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), Some(Duration::from_secs(5)));
        h.insert("retry-after", HeaderValue::from_static("-3"));
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn back_off_doubles_with_jitter_and_caps() {
        let http = Http::new(
            OpenAiConfig::new("http://127.0.0.1:1/v1", "m").with_retries(
                5,
                Duration::from_millis(100),
                Duration::from_millis(300),
            ),
        )
        .unwrap();
        let e = LlmError::Unavailable {
            message: "x".into(),
            retry_after: None,
        };
        for (tries, full) in [(0, 100), (1, 200), (2, 300), (6, 300)] {
            let d = http.delay(tries, &e).unwrap();
            assert!(
                d >= Duration::from_millis(full / 2) && d <= Duration::from_millis(full),
                "{tries}: {d:?}"
            );
        }
        let asked = LlmError::RateLimited {
            retry_after: Some(Duration::from_secs(2)),
        };
        assert_eq!(http.delay(0, &asked), Some(Duration::from_secs(2)));
        let too_long = LlmError::RateLimited {
            retry_after: Some(Duration::from_secs(3600)),
        };
        assert_eq!(http.delay(0, &too_long), None);
    }

    #[test]
    fn debug_never_shows_the_key() {
        let c = OpenAiClient::new(
            OpenAiConfig::new("http://127.0.0.1:1/v1", "m")
                .with_api_key(crate::ApiSecret::new("sk-very-secret")),
        )
        .unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("sk-very-secret"), "{shown}");
    }
}
