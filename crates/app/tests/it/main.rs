//! HTTP integration tests on a real listener.

mod adoption;
mod adoption_llm;
mod agent;
mod bad_input;
mod concurrency;
mod connections;
mod contracts;
mod conversation;
mod deadlines;
mod edge;
mod faults;
mod flow;
mod flow_storage;
mod load;
mod metrics;
mod openapi;
mod pg_restart;
mod scale_out;
mod security;
mod service;
mod session;
mod storable;
mod support;
mod tenancy;
mod webhook;
mod worker;
