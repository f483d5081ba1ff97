//! The LLM and embedding ports over any OpenAI-compatible HTTP endpoint
//! (OpenAI, Azure OpenAI, vLLM, Ollama, llama.cpp).
//!
//! Layer: adapter. Depends on `parlance-core`, `parlance-ports`, reqwest
//! (rustls) and tokio (timeouts and back-off sleeps); never on another
//! adapter or on `parlance-app`. API keys never reach logs: they are held in
//! [`ApiSecret`], whose `Debug` is redacted, and sent in a header marked
//! sensitive. The caller reads the key from wherever it lives (the app: an
//! environment variable it is told the name of) and hands it over.
//!
//! [`OpenAiClient`] speaks `POST {base}/chat/completions`, whole or streamed
//! over server-sent events; [`OpenAiEmbedder`] speaks `POST
//! {base}/embeddings`. Each attempt has a timeout; rate limits (429), 5xx,
//! connection failures and timeouts are retried with exponential back-off
//! and jitter, waiting what `Retry-After` asks when it is within bounds.

#![forbid(unsafe_code)]

mod client;
mod config;
mod sse;
mod wire;

pub use client::{OpenAiClient, OpenAiEmbedder};
pub use config::{ApiSecret, AuthStyle, ConfigError, OpenAiConfig};
