//! HTTP integration tests on a real listener.

mod adoption;
mod service;
mod support;
mod worker;
