//! Tests of the agent's pure decisions.

use super::crisis::{self, LlmAssessment, decide, keyword_assessment};
use super::directory::{
    KnowledgeBase, Location, ResourceDirectory, crisis_reply, grounded_reply, lookup_status,
};
use super::exercise::{self, GROUNDING_STEPS, grounding_turn};
use super::triage::{
    Confirmation, Dispatch, MemoryCommand, command_reply, confirmation_reply, dispatch,
    grounded_query, parse_confirmation, parse_memory_command,
};
use crate::Timestamp;
use crate::turn::{MemoryEntry, MemoryId, MemoryRecord, OwnerId, SemanticEntry};

fn llm(level: u8, crisis: bool, clarify: bool) -> LlmAssessment {
    LlmAssessment {
        level,
        confidence: 0.9,
        reason: "model".to_owned(),
        needs_crisis_response: crisis,
        needs_clarification: clarify,
    }
}

#[test]
fn keywords_classify_intent_plans_ambiguity_and_nothing() {
    let k = keyword_assessment("I want to kill myself");
    assert_eq!(
        (k.assessment.level, k.assessment.needs_crisis_response),
        (2, true)
    );
    let k = keyword_assessment("I'm going to take the pills tonight and end my life");
    assert_eq!(k.assessment.level, 3);
    let k = keyword_assessment("I just can't go on like this");
    assert_eq!(k.assessment.level, 1);
    assert!(k.assessment.needs_clarification && !k.assessment.needs_crisis_response);
    let k = keyword_assessment("I'm not suicidal, just tired of my boss");
    assert!(
        k.assessment.needs_clarification,
        "negated intent still asks"
    );
    let k = keyword_assessment("My boss is terrible and work stresses me out");
    assert_eq!(k.assessment.level, 0);
    assert!(!k.assessment.needs_clarification);
    // Whole words only.
    assert_eq!(
        keyword_assessment("the suicidesquad movie")
            .assessment
            .level,
        0
    );
}

#[test]
fn model_failure_falls_back_to_keywords() {
    let k = keyword_assessment("I want to end my life");
    let (a, audit) = decide(None, &k);
    assert!(a.needs_crisis_response);
    assert_eq!(audit.classifier_path, crisis::PATH_KEYWORD);
    assert!(audit.llm_failure_occurred);
}

#[test]
fn keywords_raise_the_model_never_lower_it() {
    let k = keyword_assessment("I want to end my life");
    let (a, audit) = decide(Some(llm(0, false, false)), &k);
    assert!(a.needs_crisis_response);
    assert_eq!(
        audit.override_kind.as_deref(),
        Some(crisis::OVERRIDE_KEYWORD)
    );
    assert_eq!(audit.classifier_path, crisis::PATH_LLM);
    let calm = keyword_assessment("hello there");
    let (a, audit) = decide(Some(llm(3, true, false)), &calm);
    assert_eq!(a.level, 3);
    assert!(audit.override_kind.is_none());
}

#[test]
fn inconsistent_model_answers_are_made_safe() {
    let calm = keyword_assessment("hello");
    let (a, audit) = decide(Some(llm(2, false, false)), &calm);
    assert!(a.needs_crisis_response);
    assert_eq!(
        audit.override_kind.as_deref(),
        Some(crisis::OVERRIDE_CONSISTENCY)
    );
    let (a, _) = decide(Some(llm(1, false, false)), &calm);
    assert!(a.needs_clarification, "level 1 asks");
    let (a, _) = decide(Some(llm(0, true, false)), &calm);
    assert_eq!(a.level, 2);
    let (a, _) = decide(Some(llm(9, true, true)), &calm);
    assert_eq!(a.level, 3);
    assert!(!a.needs_clarification);
}

const DIR: &str = r#"{
  "note": "example",
  "resources": [
    {"name": "Line A", "phone": "111", "website": "https://a.example", "region": "United Kingdom", "aliases": ["UK", "England"]},
    {"name": "Line B", "phone": "222", "region": "Ireland"}
  ]
}"#;

#[test]
fn directory_infers_location_and_looks_up_only_verified_resources() {
    let dir = ResourceDirectory::from_json(DIR).unwrap();
    assert_eq!(
        dir.infer_location(["I live in England"]),
        Location::Known("United Kingdom".into())
    );
    assert_eq!(
        dir.infer_location(["nothing here", "I'm in the uk"]),
        Location::Known("United Kingdom".into())
    );
    assert_eq!(
        dir.infer_location(["I'm in Narnia right now"]),
        Location::Known("Narnia".into())
    );
    assert_eq!(
        dir.infer_location(["I'd rather not say where"]),
        Location::Refused
    );
    assert_eq!(dir.infer_location(["hello"]), Location::Unknown);
    let found = dir.lookup("united kingdom");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].phone, "111");
    assert!(dir.lookup("Narnia").is_empty());
    assert_eq!(
        lookup_status(&Location::Known("UK".into()), &found),
        "found"
    );
    assert_eq!(
        lookup_status(&Location::Known("Narnia".into()), &[]),
        "no_verified_results"
    );
    assert_eq!(lookup_status(&Location::Refused, &[]), "location_refused");
    assert_eq!(lookup_status(&Location::Unknown, &[]), "no_location");
    for loc in [
        Location::Known("UK".into()),
        Location::Known("Narnia".into()),
        Location::Refused,
        Location::Unknown,
    ] {
        let r = if loc == Location::Known("UK".into()) {
            found.clone()
        } else {
            Vec::new()
        };
        let text = crisis_reply(&loc, &r);
        assert!(text.contains(crisis::UNIVERSAL_ADVICE), "{text}");
        assert!(!text.contains("222"));
    }
    assert!(crisis_reply(&Location::Unknown, &[]).contains("which country or region"));
    assert!(
        ResourceDirectory::from_json(r#"{"resources":[{"name":"x","phone":"","region":"y"}]}"#)
            .is_err()
    );
}

#[test]
fn knowledge_base_answers_only_what_it_holds() {
    let kb = KnowledgeBase::from_json(r#"{"entries":[
        {"id":"box","question":"What is box breathing?","answer":"Breathe in for 4, hold 4, out 4, hold 4.","keywords":["breathing technique"],"source":"Example clinic"}
    ]}"#).unwrap();
    let hit = kb.lookup("What is box breathing?");
    assert_eq!(hit.map(|e| e.id.as_str()), Some("box"));
    let (text, status) = grounded_reply(hit);
    assert_eq!(status, "answered");
    assert!(text.contains("Example clinic"));
    assert!(kb.lookup("What is the capital of France?").is_none());
    assert_eq!(grounded_reply(None).1, "no_verified_answer");
}

#[test]
fn grounding_exercise_advances_one_step_per_turn() {
    let mut step = None;
    let mut seen = Vec::new();
    let t = grounding_turn(step, "can we do a grounding exercise");
    assert_eq!((t.cause, t.step), ("start", Some(1)));
    assert!(t.reply.contains(GROUNDING_STEPS[0]));
    step = t.step;
    for i in 1..5 {
        let t = grounding_turn(step, "a lamp, a cup");
        assert_eq!(t.step, Some(i + 1));
        assert!(t.reply.contains(GROUNDING_STEPS[i as usize]));
        assert!(exercise::TABLE.allows(&t.from, &t.to, t.cause), "{t:?}");
        seen.push(t.cause);
        step = t.step;
    }
    let t = grounding_turn(step, "salt");
    assert_eq!((t.cause, t.step), ("complete", None));
    assert!(exercise::TABLE.allows(&t.from, &t.to, t.cause));
    let t = grounding_turn(Some(2), "I want to stop");
    assert_eq!((t.cause, t.step), ("exit", None));
    assert!(exercise::TABLE.allows(&t.from, &t.to, t.cause));
}

#[test]
fn grounding_table_renders() {
    insta::assert_snapshot!(exercise::TABLE.to_mermaid());
}

fn record(n: u128, object: &str, quote: &str) -> MemoryRecord {
    MemoryRecord {
        id: MemoryId::from_uuid(uuid::Uuid::from_u128(n)),
        owner: OwnerId::parse("u").unwrap(),
        entry: MemoryEntry::Semantic(SemanticEntry {
            category: "work".into(),
            subject: "User".into(),
            predicate: "WORRIES_ABOUT".into(),
            object: object.into(),
            evidence_quote: Some(quote.into()),
        }),
        embedding: None,
        at: Timestamp::from_micros(1_767_225_600_000_000).unwrap(),
    }
}

#[test]
fn memory_commands_parse_and_deletions_wait_for_a_yes() {
    assert_eq!(
        parse_memory_command("What do you remember about me?"),
        Some(MemoryCommand::Recall)
    );
    assert_eq!(
        parse_memory_command("Please forget what I said about my boss."),
        Some(MemoryCommand::Forget {
            topic: "boss".into()
        })
    );
    assert_eq!(
        parse_memory_command("Can you forget everything?"),
        Some(MemoryCommand::ForgetAll)
    );
    assert_eq!(parse_memory_command("I can't forget about my ex"), None);
    let records = vec![
        record(1, "boss", "my boss is terrible"),
        record(2, "exams", "exams scare me"),
    ];
    let r = command_reply(
        &MemoryCommand::Forget {
            topic: "boss".into(),
        },
        &records,
    );
    assert!(r.delete.is_empty(), "nothing is deleted before a yes");
    let pending = r.pending.unwrap();
    assert_eq!(pending.ids, vec![records[0].id]);
    assert_eq!(parse_confirmation("yes please"), Confirmation::Confirm);
    assert_eq!(parse_confirmation("no, keep it"), Confirmation::Cancel);
    assert_eq!(
        parse_confirmation("my day was long and tiring honestly"),
        Confirmation::Unclear
    );
    let done = confirmation_reply(&pending, Confirmation::Confirm);
    assert_eq!(done.delete, vec![records[0].id]);
    assert!(
        confirmation_reply(&pending, Confirmation::Cancel)
            .delete
            .is_empty()
    );
    let recall = command_reply(&MemoryCommand::Recall, &records);
    assert!(
        recall.text.contains("[work] User WORRIES_ABOUT boss"),
        "{}",
        recall.text
    );
}

#[test]
fn triage_orders_safety_memory_exercise_and_lookup() {
    assert_eq!(
        dispatch("forget my boss", true, false, false),
        Dispatch::SafetyCheck
    );
    assert_eq!(dispatch("yes", false, true, false), Dispatch::MemoryControl);
    assert_eq!(
        dispatch("forget what I said about work", false, false, true),
        Dispatch::MemoryControl
    );
    assert_eq!(dispatch("a lamp", false, false, true), Dispatch::Exercise);
    assert_eq!(
        dispatch("Can we do the 5-4-3-2-1 exercise?", false, false, false),
        Dispatch::Exercise
    );
    assert!(matches!(
        dispatch("What is box breathing?", false, false, false),
        Dispatch::GroundedLookup(_)
    ));
    assert_eq!(
        dispatch("What should I do about my boss?", false, false, false),
        Dispatch::Therapeutic
    );
    assert_eq!(grounded_query("I feel sad"), None);
    assert!(
        matches!(
            dispatch("What is box breathing?", false, false, true),
            Dispatch::GroundedLookup(_)
        ),
        "a factual side-question during an exercise"
    );
}
