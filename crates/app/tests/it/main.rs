//! HTTP integration tests on a real listener.

mod adoption;
mod adoption_llm;
mod service;
mod support;
mod worker;
