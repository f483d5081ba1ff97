//! HTTP integration tests on a real listener.

mod service;
mod support;
mod worker;
