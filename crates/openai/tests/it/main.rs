//! Tests against a local OpenAI-compatible server.
