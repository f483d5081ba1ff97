//! Each string id's `PATTERN` (what the API document tells clients) accepts
//! exactly the characters its parser accepts.

use parlance_core::ProductId;
use parlance_core::adoption::UserId;
use parlance_core::conversation::ContactId;
use parlance_core::flow::FlowSessionId;
use parlance_core::session::SessionId;
use parlance_core::turn::{OwnerId, ThreadId};
use regex::Regex;

/// Every character up to U+3100 (controls, Latin, the Unicode spaces),
/// and a few beyond.
fn characters() -> impl Iterator<Item = char> {
    (0u32..0x3100)
        .chain([0xFEFF, 0x1F600, 0x10FFFF])
        .filter_map(char::from_u32)
}

fn agree(kind: &str, pattern: &str, parses: impl Fn(&str) -> bool) {
    let re = Regex::new(pattern).unwrap_or_else(|e| panic!("{kind}: {e}"));
    for c in characters() {
        let id = format!("a{c}b");
        assert_eq!(
            re.is_match(&id),
            parses(&id),
            "{kind}: the pattern and the parser disagree on {c:?} (U+{:04X})",
            c as u32
        );
    }
}

#[test]
fn every_id_pattern_agrees_with_its_parser() {
    agree("product", ProductId::PATTERN, |s| {
        ProductId::parse(s).is_ok()
    });
    agree("user", UserId::PATTERN, |s| UserId::parse(s).is_ok());
    agree("contact", ContactId::PATTERN, |s| {
        ContactId::parse(s).is_ok()
    });
    agree("flow session", FlowSessionId::PATTERN, |s| {
        FlowSessionId::parse(s).is_ok()
    });
    agree("session", SessionId::PATTERN, |s| {
        SessionId::parse(s).is_ok()
    });
    agree("owner", OwnerId::PATTERN, |s| OwnerId::parse(s).is_ok());
    agree("thread", ThreadId::PATTERN, |s| ThreadId::parse(s).is_ok());
}
