//! A template or expression asking for a value over the size limit is
//! refused before the value is built: the refusal allocates a few bytes,
//! not the value. A binary of its own, so its counting allocator sees only
//! this test.

use std::alloc::System;

use std::sync::Arc;

use parlance_core::flow::{
    Condition, Flow, FlowBuilder, FlowCommand, FlowContext, FlowError, FlowKey, FlowRecord,
    FlowSessionId, MAX_VALUE_BYTES, RunnerOptions, TransitionDef,
};
use parlance_core::{Machine, ProductId, Timestamp};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn now() -> Timestamp {
    Timestamp::from_micros(1_767_225_600_000_000).unwrap()
}

fn flow(template: &str, assign: &str) -> Flow {
    let mut go = TransitionDef::new("go", "a", "b");
    go.cond = vec![Condition::Expr("true".into())];
    let mut set = TransitionDef::new("set", "a", "a");
    set.assign = vec![("n".to_owned(), assign.to_owned())];
    FlowBuilder::new("t")
        .template("a.j2", "a")
        .template("b.j2", template)
        .field("n", serde_json::json!(0))
        .user_state("a", "a.j2")
        .user_state("b", "b.j2")
        .transition(go)
        .transition(set)
        .build()
        .unwrap()
}

#[test]
fn values_over_the_limit_are_refused_before_they_are_allocated() {
    let cases = [
        ("{{ ('x' * 100000000) | length }}", "'x' * 100000000"),
        ("{{ ([0] * 100000000) | length }}", "[0] * 100000000"),
        (
            "{% set s = 'x' * 1000000 %}{{ (s ~ s ~ s ~ s) | length }}",
            "'x' * 10**9",
        ),
    ];
    for (template, assign) in cases {
        let c = FlowContext::new(Arc::new(flow(template, assign)), RunnerOptions::default());
        let key = FlowKey::new(
            ProductId::parse("acme").unwrap(),
            FlowSessionId::parse("s").unwrap(),
        );
        let mut r = FlowRecord::create(&key, &c, &FlowCommand::start(), now())
            .unwrap()
            .unwrap()
            .0;
        for event in ["go", "set"] {
            let cmd = FlowCommand::Fire {
                event: event.into(),
                input: String::new(),
                fresh_id: "x".into(),
            };
            let region = Region::new(GLOBAL);
            let e = r.decide(&c, &cmd, now()).unwrap_err();
            let allocated = region.change().bytes_allocated;
            assert!(matches!(e, FlowError::RenderLimit { .. }), "{event}: {e:?}");
            // The largest value the guard lets through, twice over, is far
            // below what the refused value would have taken.
            assert!(
                allocated < 4 * MAX_VALUE_BYTES,
                "{template} / {assign}: {allocated} bytes allocated for a refusal"
            );
        }
    }
}
