//! The flow file loader: any YAML or JSON text either loads into a flow or
//! is refused with located problems, never a panic; a flow that loads
//! starts a session and takes each event it offers without panicking.
#![no_main]

use std::collections::BTreeMap;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use parlance_core::flow::{Flow, FlowCommand, FlowContext, FlowKey, FlowRecord, RunnerOptions};
use parlance_core::machine::Machine;
use parlance_core::{ProductId, Timestamp};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The text up to a form feed is the flow file; the rest, a template.
    let (file, template) = text
        .split_once('\u{c}')
        .unwrap_or((text, "{{ actor_input }}"));
    let templates = BTreeMap::from([
        ("a.j2".to_owned(), template.to_owned()),
        ("b.j2".to_owned(), "b: {{ actor_input }}".to_owned()),
    ]);
    let Ok(flow) = Flow::from_file_text(file, templates) else {
        return;
    };
    let now = Timestamp::from_secs(1_767_225_600).expect("a valid time");
    let key = FlowKey::new(
        ProductId::parse("p").expect("a valid product id"),
        parlance_core::flow::FlowSessionId::parse("s").expect("a valid session id"),
    );
    let ctx = FlowContext::new(Arc::new(flow), RunnerOptions::default());
    let Ok(Some((started, _))) = FlowRecord::create(&key, &ctx, &FlowCommand::start(), now) else {
        return;
    };
    for event in ctx.flow.events_from(&started.session().state) {
        let mut record = started.clone();
        let _ = record.decide(
            &ctx,
            &FlowCommand::Fire {
                event,
                input: "input".to_owned(),
                fresh_id: "i-1".to_owned(),
            },
            now,
        );
    }
});
