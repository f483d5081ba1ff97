//! Parlance's service: use-case services, the HTTP API, workers, the timer
//! sweeper and the `parlance` command line.
//!
//! Layer: top. Depends on every other `parlance-*` crate except the testkit
//! (a dev-dependency); nothing depends on it. This is the only crate that
//! installs a tracing subscriber, reads configuration and picks adapters: the
//! in-memory ones by default, PostgreSQL when a database URL is given.

#![forbid(unsafe_code)]

pub mod adoption;
pub mod agent;
pub mod auth;
pub mod config;
pub mod conversation;
pub mod demo;
pub mod flow;
pub mod http;
pub mod keys;
pub mod models;
pub mod serve;
pub mod session;
pub mod state;
pub mod telemetry;
pub mod turn;
pub mod worker;

pub use config::{LogFormat, ServeConfig};
pub use state::AppState;
