//! HTTP integration tests on a real listener.

mod flow;
mod service;
mod support;
