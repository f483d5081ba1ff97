//! Conversation instances as a service: commands through the store, effects
//! through the channel and the task queue, and the HTTP routes.

pub mod agent;
pub mod cli;
pub mod demo;
pub mod routes;
pub mod service;
pub mod sweeper;
pub mod webhook;

pub use routes::routes;
