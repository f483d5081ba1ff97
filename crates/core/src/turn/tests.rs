//! Tests of the turn runtime's core, on the seed-shaped support state.

use proptest::prelude::*;
use serde_json::json;

use super::seed::*;
use super::*;

fn input(message: &str) -> SupportInput {
    SupportInput {
        message: message.to_owned(),
        channel: Channel::Web,
        user_id: Some("u1".to_owned()),
        session_id: Some("s1".to_owned()),
        installed_skills: vec!["grounding".to_owned()],
    }
}

fn assistant(text: &str) -> Message {
    Message {
        role: Role::Assistant,
        content: text.to_owned(),
        response_style: Some("supportive".to_owned()),
    }
}

/// One whole turn with a reply stage and a finalize stage; returns the
/// output and the checkpoint delta.
fn run_turn(checkpoint: &Checkpoint, message: &str) -> (SupportOutput, CheckpointDelta) {
    let mut s: SupportState =
        begin_turn(checkpoint, input(message), SupportLoaded::default()).expect("begin");
    let reply = format!("heard: {message}");
    s.apply(vec![(
        "reply",
        SupportDelta {
            response_text: Some(reply.clone()),
            route: Some(Some(Route::Therapeutic)),
            diagnostics: Some(Diagnostics::from_iter([(
                "reply_ms".to_owned(),
                json!(1.5),
            )])),
            ..SupportDelta::default()
        },
    )])
    .expect("reply");
    s.apply(vec![(
        "finalize_turn",
        SupportDelta {
            transcript: vec![assistant(&reply)],
            ..SupportDelta::default()
        },
    )])
    .expect("finalize");
    finish_turn(s).expect("finish")
}

#[test]
fn schema_lists_every_leaf_field_once_with_its_lifecycle() {
    let schema = SupportState::schema();
    assert_eq!(schema.name, "SupportState");
    let names: Vec<_> = schema.fields.iter().map(|f| f.name).collect();
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "{names:?}");
    let f = schema.field("memory_control.pending_action").unwrap();
    assert_eq!(f.lifecycle, Lifecycle::Reducer);
    assert_eq!(f.reducer, Some(Reducer::LastValue));
    let f = schema.field("memory_control.action").unwrap();
    assert_eq!(f.lifecycle, Lifecycle::TurnScoped);
    let f = schema.field("history").unwrap();
    assert_eq!(
        (f.lifecycle, f.reducer),
        (Lifecycle::Reducer, Some(Reducer::Append))
    );
    assert_eq!(f.view_of, Some(("transcript", 40)));
    assert_eq!(
        SupportState::load_window(),
        LoadWindow::all().tail("transcript", 40)
    );
    assert_eq!(f.ty, "Vec<Message>");
    assert_eq!(f.writers, ["begin_turn", "finalize_turn"]);
    let f = schema.field("diagnostics").unwrap();
    assert_eq!(
        (f.lifecycle, f.reducer),
        (Lifecycle::TurnScoped, Some(Reducer::Merge))
    );
    assert_eq!(schema.field("message").unwrap().reducer, None);
    assert_eq!(schema.with_lifecycle(Lifecycle::Input).count(), 5);
    assert_eq!(schema.with_lifecycle(Lifecycle::Loaded).count(), 3);
    assert_eq!(schema.with_lifecycle(Lifecycle::Reducer).count(), 8);
    assert_eq!(schema.with_lifecycle(Lifecycle::TurnScoped).count(), 15);
}

#[test]
fn field_table_for_the_docs() {
    insta::assert_snapshot!("turn_field_table", SupportState::schema().to_markdown());
}

#[test]
fn two_last_value_writes_in_one_step_name_the_field_and_both_stages() {
    let mut s: SupportState = begin_turn(
        &Checkpoint::default(),
        input("hi"),
        SupportLoaded::default(),
    )
    .unwrap();
    let before = s.clone();
    let err = s
        .apply(vec![
            (
                "crisis_gate",
                SupportDelta {
                    route: Some(Some(Route::Crisis)),
                    diagnostics: Some(Diagnostics::from_iter([("a".to_owned(), json!(1))])),
                    ..SupportDelta::default()
                },
            ),
            (
                "turn_dispatch",
                SupportDelta {
                    route: Some(Some(Route::Therapeutic)),
                    ..SupportDelta::default()
                },
            ),
        ])
        .unwrap_err();
    assert_eq!(
        err,
        TurnError::ConflictingWrites {
            field: "route",
            first: "crisis_gate",
            second: "turn_dispatch"
        }
    );
    assert_eq!(
        err.to_string(),
        "field route was written by both crisis_gate and turn_dispatch in one step"
    );
    assert_eq!(s, before, "a rejected step applies nothing");
}

#[test]
fn reducers_fold_a_step_in_the_order_given() {
    let mut s: SupportState = begin_turn(
        &Checkpoint::default(),
        input("hi"),
        SupportLoaded::default(),
    )
    .unwrap();
    s.apply(vec![
        (
            "a",
            SupportDelta {
                transcript: vec![assistant("one")],
                session_memory: Some(SessionMemory {
                    summary: Some("first".to_owned()),
                    current_goal: Some("sleep".to_owned()),
                    ..SessionMemory::default()
                }),
                diagnostics: Some(Diagnostics::from_iter([
                    ("k".to_owned(), json!("a")),
                    ("a_ms".to_owned(), json!(1)),
                ])),
                ..SupportDelta::default()
            },
        ),
        (
            "b",
            SupportDelta {
                transcript: vec![assistant("two")],
                session_memory: Some(SessionMemory {
                    summary: Some("second".to_owned()),
                    ..SessionMemory::default()
                }),
                diagnostics: Some(Diagnostics::from_iter([("k".to_owned(), json!("b"))])),
                response_text: Some("ok".to_owned()),
                ..SupportDelta::default()
            },
        ),
    ])
    .unwrap();
    let contents: Vec<_> = s.history.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(contents, ["hi", "one", "two"]);
    assert_eq!(s.session_memory.summary.as_deref(), Some("second"));
    assert_eq!(s.session_memory.current_goal.as_deref(), Some("sleep"));
    assert_eq!(s.diagnostics["k"], json!("b"));
    assert_eq!(s.diagnostics["a_ms"], json!(1));
    assert_eq!(s.response_text, "ok");
}

#[test]
fn begin_turn_restores_reducers_resets_turn_scoped_and_appends_the_user_turn() {
    let (_, d1) = run_turn(&Checkpoint::default(), "first");
    let mut cp = Checkpoint::default();
    cp.apply(&d1);
    assert_eq!(cp.version, 1);
    let loaded = SupportLoaded {
        working_memory: vec![WorkingMemoryEntry::Legacy("likes tea".to_owned())],
        procedural_rules: vec!["be brief".to_owned()],
        proactive_recall_enabled: true,
    };
    let s: SupportState = begin_turn(&cp, input("second"), loaded.clone()).unwrap();
    let contents: Vec<_> = s.history.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(contents, ["first", "heard: first", "second"]);
    assert_eq!(s.transcript.len(), 3);
    assert_eq!(s.session_progress.turn_count, Some(2));
    assert_eq!(s.message, "second");
    assert_eq!(s.channel, Channel::Web);
    assert_eq!(s.working_memory, loaded.working_memory);
    assert_eq!(s.procedural_rules, ["be brief"]);
    assert!(s.response_text.is_empty());
    assert_eq!(s.route, None);
    assert!(s.diagnostics.is_empty());
}

#[test]
fn finish_turn_returns_only_what_reducers_gained() {
    let (out, d1) = run_turn(&Checkpoint::default(), "first");
    assert_eq!(out.response_text, "heard: first");
    assert_eq!(out.response_type, "reply");
    assert_eq!(out.diagnostics["reply_ms"], json!(1.5));
    let mut cp = Checkpoint::default();
    cp.apply(&d1);
    let (_, d2) = run_turn(&cp, "again");
    assert!(
        !d2.appends.contains_key("history"),
        "a window is never stored"
    );
    assert_eq!(d2.appends["transcript"].len(), 2);
    assert_eq!(d2.appends["transcript"][0]["content"], json!("again"));
    let keys: Vec<_> = d2.objects.keys().map(String::as_str).collect();
    assert_eq!(keys, ["session_progress"], "only written reducer objects");
    assert_eq!(d2.objects["session_progress"], json!({"turn_count": 2}));
    assert_eq!(
        d1.encoded_len(),
        d2.encoded_len(),
        "same-sized turns write the same bytes"
    );
}

#[test]
fn checkpoint_windows_keep_the_last_entries() {
    let mut cp = Checkpoint::default();
    for i in 0..5 {
        let (_, d) = run_turn(&cp.clone(), &format!("m{i}"));
        cp.apply(&d);
    }
    assert_eq!(cp.lists["transcript"].len(), 10);
    let w = cp
        .clone()
        .windowed(&LoadWindow::all().tail("transcript", 3));
    assert_eq!(w.lists["transcript"].len(), 3);
    let s: SupportState = begin_turn(&w, input("next"), SupportLoaded::default()).unwrap();
    let contents: Vec<_> = s.history.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(contents, ["heard: m3", "m4", "heard: m4", "next"]);
    let (_, d) = finish_turn(s).unwrap();
    assert_eq!(
        d.appends["transcript"].len(),
        1,
        "a window does not re-persist old entries"
    );
    // The history window holds at most its last 40 entries.
    let mut long = Checkpoint::default();
    for i in 0..30 {
        let (_, d) = run_turn(&long.clone(), &format!("m{i}"));
        long.apply(&d);
    }
    let (_, d) = run_turn(&long.clone().windowed(&SupportState::load_window()), "last");
    let s: SupportState = begin_turn(&long, input("after"), SupportLoaded::default()).unwrap();
    assert_eq!(s.history.len(), 40);
    assert_eq!(s.history.last().map(|m| m.content.as_str()), Some("after"));
    assert_eq!(s.transcript.len(), 61);
    assert_eq!(d.appends["transcript"].len(), 2);
}

#[test]
fn decode_errors_name_the_field() {
    let mut cp = Checkpoint::default();
    cp.objects
        .insert("session_progress".to_owned(), json!({"turn_count": "x"}));
    let err = SupportState::restore(&cp, input("x"), SupportLoaded::default()).unwrap_err();
    assert!(
        matches!(
            err,
            TurnError::Decode {
                field: "session_progress",
                ..
            }
        ),
        "{err}"
    );
}

fn route_after_gate(s: &SupportState) -> &'static str {
    match s.route {
        Some(Route::Crisis) => "crisis_response",
        _ => "reply",
    }
}

fn graph() -> Graph<SupportState> {
    Graph::builder("support")
        .stage("crisis_gate")
        .stage("crisis_response")
        .stage("reply")
        .stage("memory")
        .stage("style")
        .stage("finalize_turn")
        .route(
            "crisis_gate",
            route_after_gate,
            &["crisis_response", "reply"],
        )
        .edge("crisis_response", "finalize_turn")
        .fanout("reply", &["memory", "style"], "finalize_turn")
        .edge("finalize_turn", END)
        .step_limit(6)
        .build()
        .expect("valid graph")
}

fn walk(g: &Graph<SupportState>, s: &SupportState) -> Result<Vec<Vec<&'static str>>, GraphError> {
    let mut run = g.start();
    let mut steps = Vec::new();
    while let Some(step) = run.current() {
        steps.push(step.stages.clone());
        run.advance(s)?;
    }
    Ok(steps)
}

#[test]
fn graphs_route_fan_out_and_end() {
    let g = graph();
    let mut s: SupportState =
        begin_turn(&Checkpoint::default(), input("x"), SupportLoaded::default()).unwrap();
    assert_eq!(
        walk(&g, &s).unwrap(),
        [
            vec!["crisis_gate"],
            vec!["reply"],
            vec!["memory", "style"],
            vec!["finalize_turn"]
        ]
    );
    s.route = Some(Route::Crisis);
    assert_eq!(
        walk(&g, &s).unwrap(),
        [
            vec!["crisis_gate"],
            vec!["crisis_response"],
            vec!["finalize_turn"]
        ]
    );
    insta::assert_snapshot!("turn_graph_mermaid", g.to_mermaid());
}

#[test]
fn graphs_enforce_the_step_limit_and_declared_routes() {
    fn always_a(_: &SupportState) -> &'static str {
        "a"
    }
    fn nowhere(_: &SupportState) -> &'static str {
        "z"
    }
    let s: SupportState =
        begin_turn(&Checkpoint::default(), input("x"), SupportLoaded::default()).unwrap();
    let looping = Graph::<SupportState>::builder("loop")
        .stage("a")
        .route("a", always_a, &["a", END])
        .step_limit(4)
        .build()
        .unwrap();
    assert_eq!(
        walk(&looping, &s).unwrap_err(),
        GraphError::StepLimit { limit: 4 }
    );
    let bad = Graph::<SupportState>::builder("bad")
        .stage("a")
        .route("a", nowhere, &[END])
        .build()
        .unwrap();
    assert_eq!(
        walk(&bad, &s).unwrap_err(),
        GraphError::UndeclaredRoute { from: "a", to: "z" }
    );
    let missing = Graph::<SupportState>::builder("m")
        .stage("a")
        .edge("a", "b")
        .build();
    assert_eq!(
        missing.unwrap_err(),
        GraphError::UnknownStage { from: "a", to: "b" }
    );
    let dangling = Graph::<SupportState>::builder("d")
        .stage("a")
        .stage("b")
        .edge("a", "b")
        .build();
    assert_eq!(dangling.unwrap_err(), GraphError::NoEdge { stage: "b" });
}

/// Entries of every kind the formatter renders, as the seed shows them.
fn sample_working_memory() -> Vec<WorkingMemoryEntry> {
    vec![
        WorkingMemoryEntry::Entry(MemoryEntry::Semantic(SemanticEntry {
            category: "relationship".to_owned(),
            subject: "User".to_owned(),
            predicate: "worries about".to_owned(),
            object: "work".to_owned(),
            evidence_quote: Some("my boss is terrible".to_owned()),
        })),
        WorkingMemoryEntry::Entry(MemoryEntry::Episodic(EpisodicEntry {
            summary: "talked about loss after my dog died.".to_owned(),
            primary_themes: vec!["grief".to_owned(), "pets".to_owned()],
            is_catch_up: false,
            approach_used: Some("grief_support".to_owned()),
            approach_context: None,
        })),
        WorkingMemoryEntry::Entry(MemoryEntry::Semantic(SemanticEntry {
            category: "preference".to_owned(),
            subject: "User".to_owned(),
            predicate: "PREFERS".to_owned(),
            object: "short answers".to_owned(),
            evidence_quote: None,
        })),
        WorkingMemoryEntry::Entry(MemoryEntry::Episodic(EpisodicEntry {
            summary: "caught up after two weeks away.".to_owned(),
            primary_themes: vec![],
            is_catch_up: true,
            approach_used: None,
            approach_context: None,
        })),
        WorkingMemoryEntry::Legacy("User mentioned a sister in Leeds".to_owned()),
    ]
}

#[test]
fn working_memory_renders_as_the_seed_shows() {
    let entries = sample_working_memory();
    let text = format_working_memory_entries(&entries);
    assert_eq!(
        text.lines().next(),
        Some("[relationship] User WORRIES_ABOUT work — \"my boss is terrible\"")
    );
    assert_eq!(
        text.lines().nth(1),
        Some("Last session (grief): talked about loss after my dog died.")
    );
    insta::assert_snapshot!("working_memory_entries", text);
    // Legacy strings and structured entries share one JSON list.
    let back: Vec<WorkingMemoryEntry> =
        serde_json::from_value(serde_json::to_value(&entries).unwrap()).unwrap();
    assert_eq!(back, entries);
}

/// The body of the first ```` ```lang ```` block after `heading` in `page`,
/// before the next heading of the same level.
fn fenced_block<'p>(page: &'p str, heading: &str, lang: &str) -> Option<&'p str> {
    let start = page.find(&format!("\n{heading}\n"))? + heading.len() + 2;
    let level = heading.split(' ').next()?;
    let section = &page[start..];
    let section = section
        .find(&format!("\n{level} "))
        .map_or(section, |end| &section[..end]);
    let body = section.split_once(&format!("\n```{lang}\n"))?.1;
    body.split_once("```").map(|(body, _)| body)
}

#[test]
fn the_machine_page_shows_the_generated_graph_and_working_memory() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/machines/turn.md");
    let page = std::fs::read_to_string(&path).expect("docs/machines/turn.md exists");
    assert_eq!(
        fenced_block(&page, "## Graphs", "mermaid"),
        Some(graph().to_mermaid().as_str()),
        "paste the generated diagram (`graph().to_mermaid()`) under \"## Graphs\" in {}",
        path.display()
    );
    let entries = sample_working_memory();
    let rendered = format!("{}\n", format_working_memory_entries(&entries));
    assert_eq!(
        fenced_block(&page, "## Working memory and retrieval", "text"),
        Some(rendered.as_str()),
        "paste the formatter's output under \"## Working memory and retrieval\" in {}",
        path.display()
    );
}

#[test]
fn reciprocal_rank_fusion_sums_reciprocal_ranks() {
    let fused = reciprocal_rank_fusion(&[vec!["a", "b", "c"], vec!["c", "b", "d"]]);
    let order: Vec<_> = fused.iter().map(|(id, _)| *id).collect();
    // b: 1/62 + 1/62; c: 1/63 + 1/61; a: 1/61; d: 1/63.
    assert_eq!(order, ["c", "b", "a", "d"]);
    assert!((fused[1].1 - 2.0 / 62.0).abs() < 1e-12);
    assert!((cosine_similarity(&[1.0, 0.0], &[0.0, 1.0])).abs() < 1e-12);
    assert!((cosine_similarity(&[1.0, 1.0], &[2.0, 2.0]) - 1.0).abs() < 1e-9);
    assert_eq!(cosine_similarity(&[1.0], &[1.0, 2.0]), 0.0);
    assert_eq!(
        tokenize("My boss's WELL-being, 2x!"),
        ["my", "boss", "s", "well", "being", "2x"]
    );
}

#[test]
fn retrieval_reports_its_path() {
    let rec = |n: u128, text: &str, emb: Option<Vec<f32>>| MemoryRecord {
        id: MemoryId::from_uuid(uuid::Uuid::from_u128(n)),
        owner: OwnerId::parse("u").unwrap(),
        entry: MemoryEntry::Episodic(EpisodicEntry {
            summary: text.to_owned(),
            primary_themes: vec![],
            is_catch_up: false,
            approach_used: None,
            approach_context: None,
        }),
        embedding: emb,
        at: crate::Timestamp::from_secs(n as i64).unwrap(),
    };
    let records = vec![
        rec(1, "work stress and my boss", Some(vec![1.0, 0.0])),
        rec(2, "sleep trouble", Some(vec![0.0, 1.0])),
        rec(3, "boss boss work", None),
    ];
    let t = retrieve_from(&records, "boss work", 5, QueryEmbedding::Absent);
    assert_eq!(t.path, RetrievalPath::TokenRecall);
    let ids: Vec<_> = t
        .hits
        .iter()
        .map(|h| h.record.id.as_uuid().as_u128())
        .collect();
    assert_eq!(ids, [3, 1], "both tokens; more occurrences first");
    let f = retrieve_from(&records, "boss work", 5, QueryEmbedding::Failed);
    assert_eq!(f.path, RetrievalPath::TokenRecallAfterEmbedError);
    let h = retrieve_from(
        &records,
        "boss work",
        2,
        QueryEmbedding::Vector(&[0.1, 1.0]),
    );
    assert_eq!(h.path, RetrievalPath::HybridRrf);
    let ids: Vec<_> = h
        .hits
        .iter()
        .map(|h| h.record.id.as_uuid().as_u128())
        .collect();
    // 1: token rank 2 + vector rank 2; 3: token rank 1; 2: vector rank 1.
    assert_eq!(ids, [1, 3]);
}

// ---- properties ----

fn message() -> impl Strategy<Value = Message> {
    ("[a-z ]{0,12}", any::<bool>()).prop_map(|(content, user)| Message {
        role: if user { Role::User } else { Role::Assistant },
        content,
        response_style: None,
    })
}

fn delta() -> impl Strategy<Value = SupportDelta> {
    (
        prop::collection::vec(message(), 0..3),
        prop::collection::vec(message(), 0..2),
        prop::option::of(prop::option::of(0u32..9)),
        prop::option::of("[a-z]{0,6}"),
        prop::option::of(prop::sample::select(vec![
            None,
            Some(Route::Crisis),
            Some(Route::Therapeutic),
        ])),
        prop::option::of(prop::collection::btree_map("[a-c]", 0i64..5, 0..3)),
        prop::option::of("[a-z]{0,6}"),
        any::<bool>(),
    )
        .prop_map(
            |(first, then, step, text, route, diag, summary, persist)| SupportDelta {
                transcript: first.into_iter().chain(then).collect(),
                exercise_step: step,
                response_text: text,
                route,
                diagnostics: diag.map(|m| m.into_iter().map(|(k, v)| (k, json!(v))).collect()),
                session_memory: summary.map(|s| SessionMemory {
                    summary: Some(s),
                    ..SessionMemory::default()
                }),
                should_persist_memory: persist.then_some(true),
                ..SupportDelta::default()
            },
        )
}

fn steps() -> impl Strategy<Value = Vec<Vec<(&'static str, SupportDelta)>>> {
    prop::collection::vec(
        prop::collection::vec(
            (
                prop::sample::select(vec!["gate", "reply", "memory", "finalize"]),
                delta(),
            ),
            1..4,
        ),
        0..5,
    )
}

/// Runs one turn of random steps, ignoring rejected steps.
fn random_turn(
    cp: &Checkpoint,
    message: &str,
    steps: Vec<Vec<(&'static str, SupportDelta)>>,
) -> (SupportState, CheckpointDelta) {
    let mut s: SupportState = begin_turn(cp, input(message), SupportLoaded::default()).unwrap();
    for step in steps {
        let before = s.clone();
        if let Err(e) = s.apply(step) {
            assert!(matches!(e, TurnError::ConflictingWrites { .. }), "{e}");
            assert_eq!(s, before);
        }
    }
    let delta = s.checkpoint_delta().unwrap();
    (s, delta)
}

proptest! {
    #[test]
    fn random_stage_deltas_never_panic(turns in prop::collection::vec(steps(), 1..4)) {
        let mut cp = Checkpoint::default();
        for (i, steps) in turns.into_iter().enumerate() {
            let (s, delta) = random_turn(&cp, &format!("m{i}"), steps);
            let (_out, d2) = finish_turn(s).unwrap();
            prop_assert_eq!(&d2, &delta);
            cp.apply(&delta);
        }
    }

    #[test]
    fn append_is_associative_over_turns(turns in prop::collection::vec(steps(), 1..5)) {
        // Commit turn by turn...
        let mut one_by_one = Checkpoint::default();
        let mut deltas = Vec::new();
        for (i, steps) in turns.into_iter().enumerate() {
            let (_, d) = random_turn(&one_by_one, &format!("m{i}"), steps);
            one_by_one.apply(&d);
            deltas.push(d);
        }
        // ...equals committing the concatenation of every turn's delta at once,
        let all = deltas.iter().fold(CheckpointDelta::default(), |acc, d| acc.then(d));
        let mut at_once = Checkpoint::default();
        at_once.apply(&all);
        prop_assert_eq!(&at_once.lists, &one_by_one.lists);
        prop_assert_eq!(&at_once.objects, &one_by_one.objects);
        // ...and equals any grouping of the deltas.
        if deltas.len() >= 2 {
            let (left, right) = deltas.split_at(deltas.len() / 2);
            let l = left.iter().fold(CheckpointDelta::default(), |acc, d| acc.then(d));
            let r = right.iter().fold(CheckpointDelta::default(), |acc, d| acc.then(d));
            let mut grouped = Checkpoint::default();
            grouped.apply(&l.then(&r));
            prop_assert_eq!(&grouped.lists, &one_by_one.lists);
        }
    }

    #[test]
    fn turn_scoped_fields_never_survive_a_turn(first in steps(), second in steps()) {
        let mut cp = Checkpoint::default();
        let (_, d) = random_turn(&cp, "one", first);
        for field in SupportState::schema().fields {
            if !field.lifecycle.is_persisted() {
                prop_assert!(!d.appends.contains_key(field.name), "{} persisted", field.name);
                prop_assert!(!d.objects.contains_key(field.name), "{} persisted", field.name);
            }
        }
        cp.apply(&d);
        let fresh: SupportState = begin_turn(&cp, input("two"), SupportLoaded::default()).unwrap();
        prop_assert!(fresh.response_text.is_empty());
        prop_assert_eq!(fresh.route, None);
        prop_assert!(fresh.diagnostics.is_empty());
        prop_assert!(!fresh.should_persist_memory);
        prop_assert!(fresh.memory_action.is_none());
        prop_assert_eq!(&fresh.crisis, &CrisisAssessment::default());
        let (_, d2) = random_turn(&cp, "two", second);
        cp.apply(&d2);
        prop_assert_eq!(cp.version, 2);
    }
}

#[test]
fn a_suspended_turn_resumes_with_its_fields_and_only_new_gains() {
    let mut s: SupportState = begin_turn(
        &Checkpoint::default(),
        input("forget my boss"),
        SupportLoaded {
            procedural_rules: vec!["be brief".to_owned()],
            ..SupportLoaded::default()
        },
    )
    .unwrap();
    s.apply(vec![(
        "turn_dispatch",
        SupportDelta {
            route: Some(Some(Route::MemoryControl)),
            memory_action: Some(Some(json!({"kind": "forget", "topic": "boss"}))),
            ..SupportDelta::default()
        },
    )])
    .unwrap();
    let suspended = s.suspend().unwrap();
    assert_eq!(suspended["message"], "forget my boss");
    assert_eq!(
        suspended["procedural_profile.procedural_rules"][0],
        "be brief"
    );
    assert_eq!(suspended["memory_control.action"]["topic"], "boss");
    assert!(
        suspended.get("transcript").is_none(),
        "reducer fields stay in the checkpoint"
    );
    // What the turn gained up to the interrupt is committed.
    let mut cp = Checkpoint::default();
    cp.apply(&s.checkpoint_delta().unwrap());
    assert_eq!(cp.lists["transcript"].len(), 1);

    let mut r = SupportState::resume_from(&cp, &suspended).unwrap();
    assert_eq!(r.message, "forget my boss");
    assert_eq!(r.route, Some(Route::MemoryControl));
    assert_eq!(r.procedural_rules, ["be brief"]);
    assert_eq!(r.history.len(), 1, "the window follows the checkpoint");
    assert_eq!(r.book().base_version, 1);
    assert!(
        r.checkpoint_delta().unwrap().is_empty(),
        "nothing gained yet"
    );
    r.apply(vec![(
        "finalize_turn",
        SupportDelta {
            transcript: vec![assistant("done")],
            ..SupportDelta::default()
        },
    )])
    .unwrap();
    let delta = r.checkpoint_delta().unwrap();
    assert_eq!(delta.appends["transcript"].len(), 1, "only the new entry");

    // A field the suspended JSON lacks is at its default; a bad one names
    // itself.
    let bare = SupportState::resume_from(&cp, &json!({})).unwrap();
    assert_eq!(bare.message, "");
    let err = SupportState::resume_from(&cp, &json!({"route": 7})).unwrap_err();
    assert!(
        matches!(err, TurnError::Decode { field: "route", .. }),
        "{err:?}"
    );
}

#[test]
fn a_run_resumes_at_a_stored_step_of_the_graph() {
    let g = graph();
    let s: SupportState =
        begin_turn(&Checkpoint::default(), input("x"), SupportLoaded::default()).unwrap();
    let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let mut run = g
        .resume_at(3, &names(&["memory", "style"]), Some("finalize_turn"))
        .unwrap();
    let step = run.current().unwrap().clone();
    assert_eq!((step.number, step.join()), (3, Some("finalize_turn")));
    assert_eq!(step.stages, ["memory", "style"]);
    run.advance(&s).unwrap();
    assert_eq!(run.current().unwrap().stages, ["finalize_turn"]);
    assert_eq!(run.current().unwrap().number, 4);

    let run = g.resume_at(2, &names(&["reply"]), None).unwrap();
    assert_eq!(run.current().unwrap().stages, ["reply"]);

    // A stage the graph no longer has, or a step it cannot take: an error.
    assert_eq!(
        g.resume_at(2, &names(&["retired"]), None).unwrap_err(),
        GraphError::NotInGraph {
            stage: "retired".to_owned()
        }
    );
    assert!(
        g.resume_at(3, &names(&["memory", "reply"]), Some("finalize_turn"))
            .is_err()
    );
    assert!(g.resume_at(0, &names(&["reply"]), None).is_err());
    assert!(g.resume_at(2, &[], None).is_err());
}
