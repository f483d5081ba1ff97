//! The LLM and embedding ports over any OpenAI-compatible HTTP endpoint
//! (OpenAI, Azure OpenAI, vLLM, Ollama, llama.cpp).
//!
//! Layer: adapter. Depends on `parlance-core` and `parlance-ports` (and, once
//! the LLM ports exist, reqwest with rustls); never on another adapter or on
//! `parlance-app`. API keys never reach logs: they are held in a type whose
//! `Debug` is redacted.

#![forbid(unsafe_code)]
