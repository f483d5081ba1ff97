//! Scripted-model tests of the support agent: one per stage and per route,
//! the keyword fallback when the model fails, and memory across sessions.

use std::sync::Arc;

use parlance_core::ProductId;
use parlance_core::agent::crisis::UNIVERSAL_ADVICE;
use parlance_core::turn::seed::{SupportInput, SupportLoaded, SupportOutput};
use parlance_core::turn::{
    Checkpoint, MemoryEntry, MemoryId, MemoryKind, MemoryRecord, OwnerId, ProceduralProfile,
    SemanticEntry, ThreadId, ThreadKey, TurnKey,
};
use parlance_memory::{
    HashingEmbedder, MemoryAuditLog, MemoryCheckpointStore, MemoryCrisisLog, MemoryMemoryStore,
    OfflineLlm, Reply, When,
};
use parlance_ports::{
    CrisisLog, IdGen, LlmError, MachineStore, ManualClock, MemoryStore, SequentialIds,
};
use serde_json::{Value, json};

use super::AgentData;
use super::stages::{AgentContext, graph, runner};
use crate::turn::TurnRunError;

/// The reason the thread refused a turn or a resume, if it did.
fn refused_because(e: &TurnRunError) -> Option<&'static str> {
    use parlance_core::MachineError as _;
    match e {
        TurnRunError::Service(crate::execute::ServiceError::Refused { error, .. }) => {
            error.not_allowed().and_then(|n| n.reason)
        }
        _ => None,
    }
}

struct Harness {
    llm: Arc<OfflineLlm>,
    store: Arc<dyn MemoryStore>,
    log: Arc<MemoryCrisisLog>,
    threads: Arc<MemoryCheckpointStore>,
    ids: Arc<SequentialIds>,
    product: ProductId,
}

impl Harness {
    fn new(llm: OfflineLlm) -> Self {
        let store = Arc::new(MemoryMemoryStore::new());
        let threads = MemoryCheckpointStore::new(Arc::new(MemoryAuditLog::new()))
            .with_memory_store(store.clone());
        Self {
            llm: Arc::new(llm),
            store,
            log: threads.crisis_log(),
            threads: Arc::new(threads),
            ids: Arc::new(SequentialIds::new()),
            product: ProductId::parse("p").unwrap(),
        }
    }

    fn ctx(&self, user: &str, session: &str) -> AgentContext {
        AgentContext {
            product_id: self.product.clone(),
            owner: OwnerId::parse(user).unwrap(),
            thread: ThreadId::parse(session).unwrap(),
            llm: self.llm.clone(),
            response_llm: None,
            memory_store: self.store.clone(),
            crisis_budget: std::time::Duration::from_secs(3),
            embedder: Some(Arc::new(HashingEmbedder::default())),
            data: Arc::new(AgentData::examples().unwrap()),
            clock: Arc::new(ManualClock::new()),
            ids: self.ids.clone(),
            caller_history: Vec::new(),
        }
    }

    async fn turn_in(&self, user: &str, session: &str, message: &str) -> SupportOutput {
        let ctx = self.ctx(user, session);
        let key = ThreadKey {
            product_id: self.product.clone(),
            owner: ctx.owner.clone(),
            thread: ctx.thread.clone(),
        };
        let input = SupportInput {
            message: message.to_owned(),
            user_id: Some(user.to_owned()),
            session_id: Some(session.to_owned()),
            ..SupportInput::default()
        };
        runner(self.threads.clone(), Arc::new(ManualClock::new()))
            .run(&ctx, &key, input, SupportLoaded::default())
            .await
            .unwrap()
            .output
    }

    async fn turn(&self, message: &str) -> SupportOutput {
        self.turn_in("u1", "s1", message).await
    }

    fn key(&self) -> ThreadKey {
        ThreadKey {
            product_id: self.product.clone(),
            owner: OwnerId::parse("u1").unwrap(),
            thread: ThreadId::parse("s1").unwrap(),
        }
    }

    /// A turn of u1 in s1 on `store`, which may be refused.
    async fn try_turn_on(
        &self,
        store: Arc<dyn MachineStore<Checkpoint>>,
        message: &str,
    ) -> Result<SupportOutput, TurnRunError> {
        let input = SupportInput {
            message: message.to_owned(),
            user_id: Some("u1".to_owned()),
            session_id: Some("s1".to_owned()),
            ..SupportInput::default()
        };
        runner(store, Arc::new(ManualClock::new()))
            .run(
                &self.ctx("u1", "s1"),
                &self.key(),
                input,
                SupportLoaded::default(),
            )
            .await
            .map(|r| r.output)
    }

    async fn try_turn(&self, message: &str) -> Result<SupportOutput, TurnRunError> {
        self.try_turn_on(self.threads.clone(), message).await
    }

    /// Resumes the turn s1 of u1 waits on, on `store`, with `value`.
    async fn resume_on(
        &self,
        store: Arc<dyn MachineStore<Checkpoint>>,
        value: Value,
    ) -> Result<SupportOutput, TurnRunError> {
        runner(store, Arc::new(ManualClock::new()))
            .resume(&self.ctx("u1", "s1"), &self.key(), value)
            .await
            .map(|r| r.output)
    }

    async fn resume(&self, value: Value) -> Result<SupportOutput, TurnRunError> {
        self.resume_on(self.threads.clone(), value).await
    }

    /// The whole thread at `key`, which must exist.
    async fn thread(&self, key: &ThreadKey) -> Checkpoint {
        self.threads
            .load(&TurnKey::whole(key.clone()))
            .await
            .unwrap()
            .expect("the thread exists")
            .state
    }

    async fn add_fact(&self, object: &str, quote: &str) {
        let r = MemoryRecord {
            id: MemoryId::from_uuid(self.ids.new_uuid()),
            owner: OwnerId::parse("u1").unwrap(),
            entry: MemoryEntry::Semantic(SemanticEntry {
                category: "work".into(),
                subject: "User".into(),
                predicate: "WORRIES_ABOUT".into(),
                object: object.into(),
                evidence_quote: Some(quote.into()),
            }),
            embedding: None,
            at: parlance_core::Timestamp::from_micros(1_767_225_600_000_000).unwrap(),
        };
        self.store.add(&self.product, &r).await.unwrap();
    }

    fn prompts(&self, name: &str) -> Vec<String> {
        self.llm
            .received()
            .into_iter()
            .filter(|r| r.prompt_name.as_deref() == Some(name))
            .map(|r| {
                r.messages
                    .iter()
                    .map(|m| m.content.clone())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .collect()
    }

    async fn memories(&self, user: &str) -> Vec<MemoryRecord> {
        self.store
            .list(&self.product, &OwnerId::parse(user).unwrap(), None)
            .await
            .unwrap()
    }
}

fn d<'a>(o: &'a SupportOutput, key: &str) -> &'a Value {
    o.diagnostics.get(key).unwrap_or(&Value::Null)
}

fn calm_gate() -> Reply {
    Reply::json(&json!({
        "level": 0, "confidence": 0.9, "reason": "no risk",
        "needs_crisis_response": false, "needs_clarification": false
    }))
}

fn reply(style: &str, approach: &str, text: &str) -> Reply {
    Reply::json(&json!({"response_style": style, "therapeutic_approach": approach, "reply": text}))
}

#[test]
fn the_graph_renders() {
    insta::assert_snapshot!(graph().to_mermaid());
}

#[tokio::test]
async fn memory_context_loads_working_memory_profile_and_timings() {
    let h = Harness::new(
        OfflineLlm::new()
            .with_rule(When::PromptName("crisis_gate".into()), calm_gate())
            .with_rule(
                When::PromptName("therapeutic_reply".into()),
                reply("reflective", "cbt", "That sounds stressful."),
            ),
    );
    h.add_fact("boss", "my boss is terrible").await;
    h.store
        .put_profile(
            &h.product,
            &OwnerId::parse("u1").unwrap(),
            &ProceduralProfile {
                procedural_rules: vec!["Keep replies under three sentences".into()],
                proactive_recall_enabled: true,
            },
        )
        .await
        .unwrap();
    let out = h.turn("My boss yelled at me again today").await;
    assert_eq!(d(&out, "retrieval_path"), "hybrid_rrf");
    assert!(d(&out, "load_memory_ms").is_number());
    assert!(d(&out, "turn_memory_context_ms").is_number());
    assert!(d(&out, "turn_total_ms").is_number());
    let prompt = &h.prompts("therapeutic_reply")[0];
    assert!(
        prompt.contains("[work] User WORRIES_ABOUT boss — \"my boss is terrible\""),
        "{prompt}"
    );
    assert!(
        prompt.contains("Keep replies under three sentences"),
        "{prompt}"
    );
    assert_eq!(out.response_style.as_deref(), Some("reflective"));
    assert_eq!(out.therapeutic_approach.as_deref(), Some("cbt"));
    assert_eq!(out.response_style_source, "model");
    assert_eq!(out.response_type, "reply");
}

#[tokio::test]
async fn crisis_gate_model_first_routes_to_the_crisis_response_and_logs() {
    let h = Harness::new(OfflineLlm::new().with_rule(
        When::PromptName("crisis_gate".into()),
        Reply::json(&json!({
            "level": 3, "confidence": 0.95, "reason": "explicit plan",
            "needs_crisis_response": true, "needs_clarification": false
        })),
    ));
    let out = h
        .turn("I have decided tonight is the night. I live in the UK.")
        .await;
    assert_eq!(out.response_type, "crisis");
    assert_eq!(out.crisis.level, 3);
    assert_eq!(d(&out, "crisis_classifier_path"), "llm_primary");
    assert!(d(&out, "crisis_gate_ms").is_number());
    assert!(out.response_text.contains(UNIVERSAL_ADVICE));
    assert!(
        out.response_text.contains("Samaritans"),
        "{}",
        out.response_text
    );
    assert_eq!(d(&out, "resource_lookup_status"), "found");
    assert_eq!(d(&out, "inferred_location"), "United Kingdom");
    let log = h
        .log
        .list(&h.product, &OwnerId::parse("u1").unwrap(), None, 10)
        .await
        .unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].entry.route, "crisis");
    assert!(!log[0].entry.audit.llm_failure_occurred);
    assert_eq!(d(&out, "memory_extraction"), "skipped_crisis");
}

#[tokio::test]
async fn model_failure_in_the_gate_still_routes_a_crisis_by_keywords() {
    let h = Harness::new(OfflineLlm::new().with_rule(
        When::PromptName("crisis_gate".into()),
        Reply::Error(LlmError::Unavailable {
            message: "down".into(),
            retry_after: None,
        }),
    ));
    let out = h.turn("I want to end my life").await;
    assert_eq!(out.response_type, "crisis");
    assert!(out.crisis.needs_crisis_response);
    assert_eq!(out.response_style.as_deref(), Some("crisis_response"));
    assert_eq!(d(&out, "crisis_classifier_path"), "keyword_fallback");
    assert!(out.response_text.contains(UNIVERSAL_ADVICE));
    assert!(out.response_text.contains("which country or region"));
    assert_eq!(d(&out, "resource_lookup_status"), "no_location");
    let log = h
        .log
        .list(&h.product, &OwnerId::parse("u1").unwrap(), None, 10)
        .await
        .unwrap();
    assert!(log[0].entry.audit.llm_failure_occurred);
    assert_eq!(log[0].entry.audit.classifier_path, "keyword_fallback");
}

#[tokio::test]
async fn malformed_gate_json_falls_back_and_calm_model_is_raised_by_keywords() {
    let h = Harness::new(
        OfflineLlm::new()
            .with_rule(
                When::UserContains("hurt myself".into()),
                Reply::text("{not json"),
            )
            .with_rule(When::PromptName("crisis_gate".into()), calm_gate()),
    );
    let out = h.turn("sometimes I hurt myself").await;
    assert_eq!(out.response_type, "crisis");
    assert_eq!(d(&out, "crisis_classifier_path"), "keyword_fallback");
    let out = h.turn("I keep thinking about suicide").await;
    assert_eq!(out.response_type, "crisis", "keywords raise a calm model");
    assert_eq!(d(&out, "crisis_classifier_path"), "llm_primary");
    let log = h
        .log
        .list(&h.product, &OwnerId::parse("u1").unwrap(), None, 10)
        .await
        .unwrap();
    assert_eq!(
        log[1].entry.audit.override_kind.as_deref(),
        Some("keyword_escalation")
    );
}

#[tokio::test]
async fn crisis_route_never_invents_resources() {
    let h = Harness::new(OfflineLlm::new());
    let out = h.turn("I'm in Narnia and I want to kill myself").await;
    assert_eq!(d(&out, "resource_lookup_status"), "no_verified_results");
    assert!(out.response_text.contains(UNIVERSAL_ADVICE));
    assert!(out.response_text.contains("won't guess"));
    let out = h
        .turn("I'd rather not say where. I still want to die")
        .await;
    assert_eq!(d(&out, "resource_lookup_status"), "location_refused");
    let h = Harness::new(OfflineLlm::new());
    let out = h.turn("I live in Canada").await;
    assert_eq!(out.response_type, "reply");
    let out = h.turn("I want to end my life").await;
    assert_eq!(
        d(&out, "resource_lookup_status"),
        "found",
        "location from earlier turns"
    );
    assert!(out.response_text.contains("988"));
}

#[tokio::test]
async fn unsure_gate_asks_a_safety_check() {
    let h = Harness::new(OfflineLlm::new().with_rule(
        When::PromptName("crisis_gate".into()),
        Reply::json(&json!({
            "level": 1, "confidence": 0.4, "reason": "ambiguous",
            "needs_crisis_response": false, "needs_clarification": true
        })),
    ));
    let out = h.turn("I just want to disappear for a while").await;
    assert_eq!(out.response_style.as_deref(), Some("safety_check"));
    assert_eq!(out.response_style_type, "safety");
    assert!(out.crisis.needs_clarification);
    assert_eq!(d(&out, "dispatch"), "safety_check");
    assert_eq!(d(&out, "memory_extraction"), "skipped_safety_check");
}

#[tokio::test]
async fn therapeutic_route_falls_back_when_the_response_model_fails() {
    let h = Harness::new(OfflineLlm::new().with_rule(
        When::PromptName("therapeutic_reply".into()),
        Reply::Error(LlmError::Timeout {
            after: std::time::Duration::from_secs(1),
        }),
    ));
    let out = h.turn("Work has been hard lately").await;
    assert_eq!(out.response_style.as_deref(), Some("supportive"));
    assert_eq!(d(&out, "reply_source"), "fallback");
    assert_eq!(d(&out, "dispatch"), "therapeutic_reply");
}

#[tokio::test]
async fn grounded_lookup_answers_only_from_the_knowledge_base() {
    let h = Harness::new(OfflineLlm::new());
    let out = h.turn("What is box breathing?").await;
    assert_eq!(out.response_type, "grounded_answer");
    assert_eq!(d(&out, "grounded_lookup_status"), "answered");
    assert!(out.response_text.starts_with("Box breathing is"));
    let out = h.turn("What is the capital of Peru?").await;
    assert_eq!(d(&out, "grounded_lookup_status"), "no_verified_answer");
    assert!(!out.response_text.contains("Lima"));
    assert!(
        h.prompts("therapeutic_reply").is_empty(),
        "lookups never ask the model"
    );
}

#[tokio::test]
async fn guided_exercise_advances_one_step_per_turn_and_completes() {
    let h = Harness::new(OfflineLlm::new());
    let out = h.turn("Can we do a grounding exercise?").await;
    assert_eq!(out.response_style.as_deref(), Some("guided_exercise"));
    assert_eq!(out.response_style_source, "exercise");
    assert_eq!(out.therapeutic_approach.as_deref(), Some("dbt_skills"));
    assert!(out.response_text.contains("five things you can see"));
    for (answer, next) in [
        ("a lamp, a window, a cup, a book, a plant", "four things"),
        ("the chair, my socks, the desk, my sleeve", "three things"),
        ("traffic, a fan, birds", "two things"),
        ("coffee and soap", "one thing"),
    ] {
        let out = h.turn(answer).await;
        assert!(out.response_text.contains(next), "{}", out.response_text);
        assert_eq!(out.therapeutic_approach.as_deref(), Some("dbt_skills"));
        assert!(!out.should_persist_memory);
    }
    let out = h.turn("mint").await;
    assert!(out.response_text.contains("finished"));
    assert!(out.should_persist_memory);
    let key = ThreadKey {
        product_id: h.product.clone(),
        owner: OwnerId::parse("u1").unwrap(),
        thread: ThreadId::parse("s1").unwrap(),
    };
    let cp = h.thread(&key).await;
    assert_eq!(cp.objects["exercise_state.exercise_type"], Value::Null);
    assert_eq!(cp.lists["transcript"].len(), 12);
    // Exit on request.
    h.turn("grounding please").await;
    let out = h.turn("I want to stop").await;
    assert!(out.response_text.contains("stop the exercise here"));
    let cp = h.thread(&key).await;
    assert_eq!(cp.objects["exercise_state.exercise_step"], Value::Null);
}

#[tokio::test]
async fn memory_control_recalls_and_deletes_only_after_a_yes() {
    let h = Harness::new(OfflineLlm::new());
    h.add_fact("boss", "my boss is terrible").await;
    h.add_fact("exams", "exams scare me").await;
    let out = h.turn("What do you remember about me?").await;
    assert_eq!(out.response_type, "memory_control");
    assert!(out.response_text.contains("WORRIES_ABOUT boss"));
    assert_eq!(out.interrupt, None, "recall asks nothing");
    let out = h.turn("Please forget what I said about my boss").await;
    assert!(
        out.response_text.contains("Should I delete it?"),
        "{}",
        out.response_text
    );
    assert_eq!(out.response_type, "memory_control");
    let asked = out.interrupt.clone().expect("the turn waits for an answer");
    assert_eq!(asked["question"], json!(out.response_text));
    assert_eq!(asked["kind"], "forget");
    assert_eq!(asked["ids"].as_array().unwrap().len(), 1);
    assert!(
        asked["summary"][0].as_str().unwrap().contains("boss"),
        "{asked}"
    );
    assert!(
        asked["accepted"]["yes"]
            .as_array()
            .unwrap()
            .contains(&json!("yes"))
    );
    assert_eq!(h.memories("u1").await.len(), 2, "nothing deleted yet");
    let cp = h.thread(&h.key()).await;
    assert!(cp.is_interrupted());
    assert_eq!(
        cp.lists["transcript"].len(),
        3,
        "the recall turn, then the asking turn's user message"
    );

    // While it waits, a new turn is refused before any of its stages runs,
    // and a "yes" sent as a turn deletes nothing.
    let gates = h.prompts("crisis_gate").len();
    let e = h.try_turn("yes").await.unwrap_err();
    assert_eq!(
        refused_because(&e),
        Some(parlance_core::turn::INTERRUPT_PENDING)
    );
    assert_eq!(h.prompts("crisis_gate").len(), gates, "no stage ran");
    assert_eq!(h.memories("u1").await.len(), 2);

    let out = h.resume(json!("no, keep it")).await.unwrap();
    assert!(
        out.response_text.contains("haven't deleted"),
        "{}",
        out.response_text
    );
    assert_eq!(out.interrupt, None);
    assert_eq!(d(&out, "memories_deleted"), 0);
    assert_eq!(h.memories("u1").await.len(), 2);
    let e = h.resume(json!(true)).await.unwrap_err();
    assert_eq!(refused_because(&e), Some(parlance_core::turn::NO_INTERRUPT));
    assert_eq!(
        h.memories("u1").await.len(),
        2,
        "a late yes deletes nothing"
    );

    h.turn("forget what I said about my boss").await;
    let out = h.resume(json!(true)).await.unwrap();
    assert_eq!(d(&out, "memories_deleted"), 1);
    assert!(
        out.response_text.starts_with("Done."),
        "{}",
        out.response_text
    );
    let left = h.memories("u1").await;
    assert_eq!(left.len(), 1);
    assert!(left[0].entry.search_text().contains("exams"));
    let cp = h.thread(&h.key()).await;
    assert!(!cp.is_interrupted());
    let t = &cp.lists["transcript"];
    assert_eq!(
        t[t.len() - 2]["content"],
        "forget what I said about my boss"
    );
    assert_eq!(t[t.len() - 1]["content"], json!(out.response_text));

    // An unclear answer deletes nothing; so does "no" as a boolean.
    h.turn("forget everything").await;
    let out = h.resume(json!("Work was long today")).await.unwrap();
    assert!(out.response_text.contains("haven't deleted"));
    h.turn("forget everything").await;
    h.resume(json!(false)).await.unwrap();
    assert_eq!(h.memories("u1").await.len(), 1);
    let out = h.turn("yes").await;
    assert_ne!(out.response_type, "memory_control", "nothing is pending");
    assert!(
        h.prompts("memory_control").is_empty(),
        "memory control never asks the model"
    );
    // The gate's assessment is logged once per turn, with its first
    // commit: never again by a resume, never by a refused turn.
    let log = h
        .log
        .list(&h.product, &OwnerId::parse("u1").unwrap(), None, 100)
        .await
        .unwrap();
    let turns: Vec<u64> = log.iter().map(|r| r.entry.turn).collect();
    assert_eq!(turns, [1, 2, 3, 4, 5, 6], "{turns:?}");
}

/// Two resumes of one interrupted turn at once: exactly one commits, the
/// other is refused on the thread as the first left it.
/// `h`'s memory store must be the one `store`'s commits forget in.
async fn racing_resumes_commit_once(h: Harness, store: Arc<dyn MachineStore<Checkpoint>>) {
    h.add_fact("boss", "my boss is terrible").await;
    h.try_turn_on(store.clone(), "forget what I said about my boss")
        .await
        .unwrap();
    let (a, b) = tokio::join!(
        h.resume_on(store.clone(), json!(true)),
        h.resume_on(store.clone(), json!(false)),
    );
    let (won, lost) = match (a, b) {
        (Ok(won), Err(lost)) | (Err(lost), Ok(won)) => (won, lost),
        (a, b) => panic!("expected one win and one refusal: {a:?} {b:?}"),
    };
    assert_eq!(
        refused_because(&lost),
        Some(parlance_core::turn::NO_INTERRUPT)
    );
    let cp = store
        .load(&TurnKey::whole(h.key()))
        .await
        .unwrap()
        .unwrap()
        .state;
    assert_eq!(cp.version, 2, "the turn, then one resume");
    assert!(!cp.is_interrupted());
    assert_eq!(cp.lists["transcript"].len(), 2);
    let deleted = d(&won, "memories_deleted").as_u64().unwrap();
    assert_eq!(h.memories("u1").await.len() as u64, 1 - deleted);
}

#[tokio::test]
async fn racing_resumes_commit_once_on_memory() {
    let h = Harness::new(OfflineLlm::new());
    let store = h.threads.clone();
    racing_resumes_commit_once(h, store).await;
}

#[tokio::test]
async fn racing_resumes_commit_once_on_postgres() {
    let Some(pool) = parlance_postgres::testing::test_pool().await else {
        return;
    };
    let mut h = Harness::new(OfflineLlm::new());
    h.store = Arc::new(parlance_postgres::PgMemoryStore::new(pool.clone()));
    let store = Arc::new(parlance_postgres::PgCheckpointStore::new(pool));
    racing_resumes_commit_once(h, store).await;
}

/// On PostgreSQL a confirmed deletion is deleted by the resume's commit,
/// in the thread store's transaction.
#[tokio::test]
async fn a_confirmed_deletion_commits_with_the_resume_on_postgres() {
    let Some(pool) = parlance_postgres::testing::test_pool().await else {
        return;
    };
    let mut h = Harness::new(OfflineLlm::new());
    h.store = Arc::new(parlance_postgres::PgMemoryStore::new(pool.clone()));
    let store: Arc<dyn MachineStore<Checkpoint>> =
        Arc::new(parlance_postgres::PgCheckpointStore::new(pool));
    h.add_fact("boss", "my boss is terrible").await;
    h.add_fact("exams", "exams scare me").await;
    h.try_turn_on(store.clone(), "forget what I said about my boss")
        .await
        .unwrap();
    assert_eq!(h.memories("u1").await.len(), 2, "nothing deleted yet");
    let out = h.resume_on(store, json!(true)).await.unwrap();
    assert_eq!(d(&out, "memories_deleted"), 1);
    let left = h.memories("u1").await;
    assert_eq!(left.len(), 1);
    assert!(left[0].entry.search_text().contains("exams"));
}

#[tokio::test]
async fn finalization_records_history_transcript_and_turn_count() {
    let h = Harness::new(OfflineLlm::new().with_rule(
        When::PromptName("therapeutic_reply".into()),
        reply("supportive", "none", "I'm listening."),
    ));
    h.turn("hello").await;
    let out = h.turn("it has been a rough week").await;
    assert_eq!(d(&out, "route"), "therapeutic");
    let key = ThreadKey {
        product_id: h.product.clone(),
        owner: OwnerId::parse("u1").unwrap(),
        thread: ThreadId::parse("s1").unwrap(),
    };
    let cp = h.thread(&key).await;
    assert_eq!(cp.version, 2);
    let t = &cp.lists["transcript"];
    assert_eq!(t.len(), 4);
    assert_eq!(t[3]["role"], "assistant");
    assert_eq!(t[3]["response_style"], "supportive");
    assert_eq!(cp.objects["session_progress"]["turn_count"], 2);
    // The second turn's prompt saw the first turn.
    let prompt = &h.prompts("therapeutic_reply")[1];
    assert!(prompt.contains("hello") && prompt.contains("I'm listening."));
}

#[tokio::test]
async fn memory_extraction_keeps_only_quoted_facts_once() {
    let h = Harness::new(OfflineLlm::new().with_rule(
        When::PromptName("memory_extraction".into()),
        Reply::json(&json!({"facts": [
            {"category": "work", "subject": "User", "predicate": "WORRIES_ABOUT",
             "object": "presentation", "evidence_quote": "my presentation on Friday"},
            {"category": "health", "subject": "User", "predicate": "HAS",
             "object": "insomnia", "evidence_quote": "I never sleep"}
        ]})),
    ));
    let out = h.turn("I'm nervous about my presentation on Friday").await;
    assert_eq!(d(&out, "memory_facts_added"), 1);
    assert_eq!(
        d(&out, "memory_facts_dropped"),
        1,
        "an invented quote is dropped"
    );
    h.turn("Still thinking about my presentation on Friday")
        .await;
    let facts = h.memories("u1").await;
    assert_eq!(facts.len(), 1, "stored once");
    assert!(facts[0].embedding.is_some());
}

#[tokio::test]
async fn a_fact_from_session_one_is_retrieved_in_session_two() {
    let h = Harness::new(
        OfflineLlm::new()
            .with_rule(
                When::PromptName("memory_extraction".into()),
                Reply::json(&json!({"facts": [
                    {"category": "relationship", "subject": "User", "predicate": "WORRIES_ABOUT",
                     "object": "sister", "evidence_quote": "my sister stopped talking to me"}
                ]})),
            )
            .with_rule(
                When::PromptName("therapeutic_reply".into()),
                reply("supportive", "none", "I'm here."),
            ),
    );
    h.turn_in(
        "u1",
        "monday",
        "I'm upset that my sister stopped talking to me",
    )
    .await;
    let out = h
        .turn_in("u1", "friday", "I tried calling my sister again")
        .await;
    assert_eq!(d(&out, "retrieval_path"), "hybrid_rrf");
    let prompts = h.prompts("therapeutic_reply");
    let second = prompts.last().unwrap();
    assert!(
        second.contains(
            "[relationship] User WORRIES_ABOUT sister — \"my sister stopped talking to me\""
        ),
        "{second}"
    );
    assert!(
        !second.contains("I'm upset that"),
        "session one's transcript stays in its thread"
    );
    let semantic = h
        .store
        .list(
            &h.product,
            &OwnerId::parse("u1").unwrap(),
            Some(MemoryKind::Semantic),
        )
        .await
        .unwrap();
    assert_eq!(semantic.len(), 1);
}

#[tokio::test]
async fn a_crisis_never_confirms_a_deletion_and_ends_an_exercise() {
    let h = Harness::new(OfflineLlm::new());
    h.add_fact("boss", "my boss is terrible").await;
    h.turn("forget what I said about my boss").await;
    // A crisis message sent as a turn while the question waits is refused
    // (the client answers the question first); it deletes nothing.
    let e = h.try_turn("I want to kill myself").await.unwrap_err();
    assert_eq!(
        refused_because(&e),
        Some(parlance_core::turn::INTERRUPT_PENDING)
    );
    // Sent as the answer, it is no yes: nothing is deleted.
    let out = h.resume(json!("I want to kill myself")).await.unwrap();
    assert!(out.response_text.contains("haven't deleted"));
    let out = h.turn("I want to kill myself").await;
    assert_eq!(out.response_type, "crisis");
    let out = h.turn("yes").await;
    assert_ne!(
        out.response_type, "memory_control",
        "\"yes\" answered the safety question"
    );
    assert_eq!(h.memories("u1").await.len(), 1, "nothing deleted");
    h.turn("can we do a grounding exercise").await;
    h.turn("I want to end my life").await;
    let cp = h.thread(&h.key()).await;
    assert_eq!(cp.objects["exercise_state.exercise_type"], Value::Null);
}

#[tokio::test]
async fn a_pending_action_stored_before_interrupts_lapses_unconfirmed() {
    use parlance_core::turn::{CheckpointDelta, TurnCommand};
    let h = Harness::new(OfflineLlm::new());
    h.add_fact("boss", "my boss is terrible").await;
    h.turn("hello").await;
    let id = h.memories("u1").await[0].id;
    let stale = CheckpointDelta {
        objects: [(
            "memory_control.pending_action".to_owned(),
            json!({"kind": "forget", "topic": "boss", "ids": [id]}),
        )]
        .into(),
        ..CheckpointDelta::default()
    };
    let store: Arc<dyn MachineStore<Checkpoint>> = h.threads.clone();
    let clock = ManualClock::new();
    crate::execute::Executor::new(store.as_ref(), &clock)
        .run(
            &TurnKey::whole(h.key()),
            &(),
            &TurnCommand::update(None, stale),
        )
        .await
        .unwrap();
    let out = h.turn("yes").await;
    assert_ne!(out.response_type, "memory_control");
    assert_eq!(h.memories("u1").await.len(), 1, "never deleted by a turn");
    let cp = h.thread(&h.key()).await;
    assert_eq!(cp.objects["memory_control.pending_action"], Value::Null);
}

#[tokio::test]
async fn a_factual_side_question_keeps_the_exercise_step() {
    let h = Harness::new(OfflineLlm::new());
    h.turn("grounding exercise please").await;
    let out = h.turn("What is box breathing?").await;
    assert_eq!(out.response_type, "grounded_answer");
    assert_eq!(out.response_style_source, "gate");
    let out = h.turn("a lamp, a cup, a door, a book, a pen").await;
    assert_eq!(out.response_style_source, "exercise");
    assert!(
        out.response_text.contains("four things"),
        "{}",
        out.response_text
    );
}

#[tokio::test]
async fn worries_become_active_concerns_of_the_session() {
    let h = Harness::new(OfflineLlm::new().with_rule(
        When::PromptName("memory_extraction".into()),
        Reply::json(&json!({"facts": [
            {"category": "work", "subject": "User", "predicate": "WORRIES_ABOUT",
             "object": "deadline", "evidence_quote": "the deadline"}
        ]})),
    ));
    h.turn("I keep thinking about the deadline").await;
    h.turn("It is a lot").await;
    let prompts = h.prompts("therapeutic_reply");
    assert!(
        prompts[1].contains("Active concerns: deadline"),
        "{}",
        prompts[1]
    );
}

#[test]
fn operator_files_load_from_paths_and_bad_ones_are_refused() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agent");
    let data = AgentData::load(
        Some(&root.join("resource-directory.example.json")),
        Some(&root.join("knowledge-base.example.json")),
    )
    .unwrap();
    assert!(
        data.directory
            .note
            .as_deref()
            .unwrap()
            .starts_with("EXAMPLE ONLY")
    );
    assert!(!data.knowledge.entries.is_empty());
    let empty = AgentData::load(None, None).unwrap();
    assert!(empty.directory.resources.is_empty());
    let dir = std::env::temp_dir().join(format!("parlance-agent-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        r#"{"resources": [{"name": "x", "phone": "1", "region": "y", "extra": 1}]}"#,
    )
    .unwrap();
    let err = AgentData::load(Some(&bad), None).unwrap_err();
    assert!(format!("{err:#}").contains("unknown field"), "{err:#}");
    assert!(AgentData::load(Some(&dir.join("missing.json")), None).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The problem an agent error answers with: status, `Retry-After` and type.
async fn problem(e: super::service::AgentError) -> (u16, Option<String>, Value) {
    use axum::response::IntoResponse as _;
    let res = super::routes::answer(e).into_response();
    let status = res.status().as_u16();
    let retry = res
        .headers()
        .get(axum::http::header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = axum::body::to_bytes(res.into_body(), 1 << 16)
        .await
        .unwrap();
    (status, retry, serde_json::from_slice(&body).unwrap())
}

#[tokio::test]
async fn a_contended_turn_and_a_failed_stage_are_503s_that_changed_nothing() {
    use super::service::AgentError;
    use crate::execute::ServiceError;
    use crate::turn::{Dependency, StageError, TurnRunError};

    let contended = AgentError::Turn(TurnRunError::Service(ServiceError::Contended {
        attempts: 16,
    }));
    let (status, retry, body) = problem(contended).await;
    assert_eq!((status, retry.as_deref()), (503, Some("1")));
    assert_eq!(body["type"], "urn:parlance:problem:contended");

    let stage = AgentError::Turn(TurnRunError::Stage {
        stage: "memory_control",
        source: StageError::port(Dependency::MemoryStore)(parlance_ports::PortError::unavailable(
            "database unreachable",
        )),
    });
    let (status, retry, body) = problem(stage).await;
    assert_eq!((status, retry.as_deref()), (503, Some("1")));
    assert_eq!(body["type"], "urn:parlance:problem:unavailable");
    assert_eq!(
        body["detail"],
        "stage memory_control failed; nothing was changed, retry later"
    );
}

/// The crisis log commits with the turn: a thread store whose commits fail
/// or are lost, around the real one.
mod crisis_log_with_the_turn {
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use async_trait::async_trait;
    use parlance_core::turn::{Checkpoint, ThreadKey, TurnKey};
    use parlance_ports::{
        Commit, Committed, CompletionRequest, CompletionResponse, CrisisLog, LlmClient, LlmResult,
        MachineStore, ManualClock, PortError, PortResult, Stored,
    };

    use super::*;
    use crate::turn::TurnRunError;

    /// Fails the next commits with the queued errors, then commits.
    struct Flaky {
        inner: Arc<MemoryCheckpointStore>,
        failures: Mutex<VecDeque<PortError>>,
    }

    #[async_trait]
    impl MachineStore<Checkpoint> for Flaky {
        async fn load(&self, key: &TurnKey) -> PortResult<Option<Stored<Checkpoint>>> {
            self.inner.load(key).await
        }

        async fn commit(&self, c: Commit<'_, Checkpoint>) -> PortResult<Committed<Checkpoint>> {
            let failure = self.failures.lock().unwrap().pop_front();
            match failure {
                Some(e) => Err(e),
                None => self.inner.commit(c).await,
            }
        }
    }

    /// A confirmed deletion happens with the resume's commit: a resume that
    /// never commits deletes nothing, and the question still waits.
    #[tokio::test]
    async fn a_resume_that_does_not_commit_deletes_nothing() {
        let h = Harness::new(OfflineLlm::new());
        h.add_fact("boss", "my boss is terrible").await;
        h.turn("forget what I said about my boss").await;
        let flaky = Arc::new(Flaky {
            inner: h.threads.clone(),
            failures: Mutex::new(
                std::iter::repeat_with(|| PortError::unavailable("database unreachable"))
                    .take(32)
                    .collect(),
            ),
        });
        h.resume_on(flaky, json!(true))
            .await
            .expect_err("no commit");
        assert_eq!(h.memories("u1").await.len(), 1, "nothing deleted");
        assert!(h.thread(&h.key()).await.is_interrupted());
        let out = h.resume(json!(true)).await.unwrap();
        assert_eq!(d(&out, "memories_deleted"), 1);
        assert!(h.memories("u1").await.is_empty());
    }

    async fn turn_on(
        h: &Harness,
        store: Arc<dyn MachineStore<Checkpoint>>,
        ctx: &AgentContext,
        message: &str,
    ) -> Result<SupportOutput, TurnRunError> {
        let key = ThreadKey {
            product_id: h.product.clone(),
            owner: ctx.owner.clone(),
            thread: ctx.thread.clone(),
        };
        let input = SupportInput {
            message: message.to_owned(),
            user_id: Some("u1".to_owned()),
            session_id: Some("s1".to_owned()),
            ..SupportInput::default()
        };
        runner(store, Arc::new(ManualClock::new()))
            .run(ctx, &key, input, SupportLoaded::default())
            .await
            .map(|r| r.output)
    }

    async fn logged(h: &Harness) -> Vec<parlance_ports::CrisisLogRecord> {
        h.log
            .list(&h.product, &OwnerId::parse("u1").unwrap(), None, 100)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_turn_whose_commit_fails_leaves_no_crisis_entry() {
        let h = Harness::new(OfflineLlm::new());
        let flaky = Arc::new(Flaky {
            inner: h.threads.clone(),
            failures: Mutex::new(VecDeque::from([PortError::unavailable("disk full")])),
        });
        let ctx = h.ctx("u1", "s1");
        let e = turn_on(&h, flaky.clone(), &ctx, "I want to end my life")
            .await
            .unwrap_err();
        assert!(matches!(e, TurnRunError::Service(_)), "{e:?}");
        assert_eq!(logged(&h).await, vec![], "a failed turn logged its gate");
        // The same turn again commits, and logs once.
        let out = turn_on(&h, flaky, &ctx, "I want to end my life")
            .await
            .unwrap();
        assert_eq!(out.response_type, "crisis");
        let log = logged(&h).await;
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].entry.turn, 1);
        assert_eq!(log[0].entry.route, "crisis");
    }

    #[tokio::test]
    async fn a_retried_turn_writes_one_crisis_entry() {
        let h = Harness::new(OfflineLlm::new());
        let flaky = Arc::new(Flaky {
            inner: h.threads.clone(),
            failures: Mutex::new(VecDeque::from([
                PortError::conflict("lost"),
                PortError::conflict("lost again"),
            ])),
        });
        let ctx = h.ctx("u1", "s1");
        let out = turn_on(&h, flaky, &ctx, "I want to end my life")
            .await
            .unwrap();
        assert_eq!(out.response_type, "crisis");
        assert_eq!(
            h.prompts("crisis_gate").len(),
            3,
            "the gate ran once per attempt"
        );
        let log = logged(&h).await;
        assert_eq!(log.len(), 1, "{log:?}");
        assert_eq!(log[0].entry.thread.as_str(), "s1");
    }

    /// A model that accepts the call and never answers, whatever deadline
    /// the request carries.
    struct Silent;

    #[async_trait]
    impl LlmClient for Silent {
        fn describe(&self) -> String {
            "silent".to_owned()
        }

        fn default_model(&self) -> &str {
            "silent"
        }

        async fn complete(&self, _request: &CompletionRequest) -> LlmResult<CompletionResponse> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn a_turn_past_its_deadline_commits_nothing() {
        let h = Harness::new(OfflineLlm::new());
        let ctx = h.ctx("u1", "s1");
        let gone = crate::budget::Deadline::new(
            crate::budget::Family::Agent,
            Duration::ZERO,
            Instant::now(),
        );
        let e = crate::budget::scoped(
            gone,
            turn_on(&h, h.threads.clone(), &ctx, "I want to end my life"),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, TurnRunError::Deadline), "{e:?}");
        let key = TurnKey::whole(ThreadKey {
            product_id: h.product.clone(),
            owner: ctx.owner.clone(),
            thread: ctx.thread.clone(),
        });
        assert!(h.threads.load(&key).await.unwrap().is_none());
        assert_eq!(logged(&h).await, vec![]);
    }

    #[tokio::test]
    async fn the_gate_decides_by_keywords_within_its_budget() {
        let h = Harness::new(OfflineLlm::new());
        let mut ctx = h.ctx("u1", "s1");
        ctx.llm = Arc::new(Silent);
        ctx.crisis_budget = Duration::from_millis(200);
        let started = Instant::now();
        let out = tokio::time::timeout(
            Duration::from_secs(10),
            turn_on(&h, h.threads.clone(), &ctx, "I want to end my life"),
        )
        .await
        .expect("the gate waited past its budget")
        .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(out.response_type, "crisis");
        assert_eq!(d(&out, "crisis_classifier_path"), "keyword_fallback");
        let log = logged(&h).await;
        assert!(log[0].entry.audit.llm_failure_occurred);
    }
}
