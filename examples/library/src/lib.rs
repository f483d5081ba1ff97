//! Examples of the Parlance library crates; the code is in `examples/`.
//!
//! | Example | What it shows |
//! |---|---|
//! | `session` | the session machine alone, driven by a manual clock: events, a timeout, a cooldown |
//! | `turn_graph` | a custom `turn_state!` with a three-stage graph on the memory checkpointer |
//! | `yaml_flow` | a YAML flow loaded from a string and run in-process on the memory adapters |
//! | `postgres_axum` | the PostgreSQL adapters under an axum handler of one's own (needs `DATABASE_URL`) |
//! | `custom_adapter` | a new storage adapter checked with the testkit's contract suite |
//!
//! Run one with `cargo run -p parlance-examples --example <name>`; `cargo
//! xtask ci` runs them all. Each asserts what it shows and exits 0.

#![forbid(unsafe_code)]
