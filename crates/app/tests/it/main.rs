//! HTTP integration tests on a real listener.

mod adoption;
mod adoption_llm;
mod agent;
mod conversation;
mod flow;
mod service;
mod session;
mod support;
mod webhook;
mod worker;
