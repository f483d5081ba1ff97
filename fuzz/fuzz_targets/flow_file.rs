//! The flow file loader: any YAML or JSON text either loads into a flow or
//! is refused with located problems, never a panic; a flow that loads
//! starts a session and takes an event without panicking.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use parlance_core::Timestamp;
use parlance_core::flow::Flow;

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
    let Ok(started) = flow.start("s", now) else {
        return;
    };
    for event in flow.events_from(&started.session.state) {
        let _ = flow.fire(
            &started.session,
            &started.appended,
            &event,
            "input",
            "i-1",
            now,
        );
    }
});
