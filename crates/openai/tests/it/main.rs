//! Tests against a local OpenAI-compatible server started by each test.

mod client;
mod contract;
mod fake;
mod logs;
