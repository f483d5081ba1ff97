//! Parlance's LLM and embedding ports over any OpenAI-compatible HTTP endpoint.
//!
#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod client;
mod config;
mod sse;
mod wire;

pub use client::{OpenAiClient, OpenAiEmbedder};
pub use config::{ApiSecret, AuthStyle, ConfigError, OpenAiConfig};
