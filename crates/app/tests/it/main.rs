//! HTTP integration tests on a real listener.

mod service;
mod session;
mod support;
