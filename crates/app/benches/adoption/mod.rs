//! `session adoption`: the adoption snapshots' round trip (encode to JSON
//! text, decode it) through the typed codec and, in the same run, through
//! the value-tree codec it replaced (`parlance_core::adoption::snapshot_walk`,
//! built with the `tree-codec` feature), on realistic records. Rounds of the
//! two alternate; each figure is the median of its rounds.

use std::hint::black_box;
use std::time::Instant;

use parlance_core::Timestamp;
use parlance_core::adoption::snapshot_walk as tree;
use parlance_core::adoption::{CompletionRateDenominator, SessionSnapshot, UserAdoptionState};

use crate::common::report_row;

fn at(secs: f64) -> Timestamp {
    Timestamp::from_epoch_seconds(secs).expect("time")
}

/// A user's record as stored after a few weeks: metadata, mastery,
/// discovered features, `workflows` workflows of 3 to 5 steps in every
/// status, the last step-in and a sessions index of `sessions` entries.
fn record(workflows: usize, sessions: usize) -> UserAdoptionState {
    let t0 = 1_763_900_000.0;
    let statuses = ["completed", "in_progress", "not_started", "completed"];
    let mut progress = Vec::new();
    for w in 0..workflows {
        let status = statuses[w % statuses.len()];
        let steps: Vec<String> = (0..3 + w % 3)
            .map(|s| {
                let done = status == "completed" || s == 0;
                format!(
                    r#""step-{s}": {{"step_id": "step-{s}", "status": "{}", "confidence": {},
                    "evidence": "clicked 'Save' on /projects/{w}/settings after editing the name",
                    "completed_at": {}, "last_evaluated_at": {}}}"#,
                    if done { "completed" } else { "not_started" },
                    if done { 0.92 } else { 0.0 },
                    if done {
                        format!("{:.6}", t0 + 3600.0 * w as f64 + 61.25 * s as f64)
                    } else {
                        "null".to_owned()
                    },
                    t0 + 3600.0 * w as f64 + 61.25 * s as f64 + 0.5,
                )
            })
            .collect();
        progress.push(format!(
            r#""workflow-{w}": {{"workflow_id": "workflow-{w}", "status": "{status}",
            "confidence": 0.8500000000000001, "evidence": "the user finished the import wizard and invited two colleagues",
            "source": "detector", "first_detected_at": {}, "completed_at": {},
            "last_evaluated_at": {}, "steps": {{{}}}}}"#,
            t0 + 3600.0 * w as f64,
            if status == "completed" {
                format!("{:.6}", t0 + 3600.0 * w as f64 + 900.125)
            } else {
                "null".to_owned()
            },
            t0 + 3600.0 * w as f64 + 901.0,
            steps.join(", ")
        ));
    }
    let index: Vec<String> = (0..sessions)
        .map(|i| {
            format!(
                r#"{{"session_id": "sess-{i:04}-9f1c2a", "session_number": {}, "started_at": {}, "captured_at": {}}}"#,
                i + 1,
                t0 + 86_400.0 * i as f64 + 0.123456,
                t0 + 86_400.0 * i as f64 + 1_800.654321,
            )
        })
        .collect();
    let features: Vec<String> = (0..12).map(|i| format!("\"/app/feature-{i}\"")).collect();
    let text = format!(
        r#"{{"_v": 1, "user_id": "user-8d2f41",
        "metadata": {{"role": "admin", "plan": "team", "company": "Acme Ltd", "seats": 25, "locale": "en-GB"}},
        "journey_state": "onboarding",
        "mastery": {{"rating": 6, "level": "intermediate", "description": "uses reports and the importer without help"}},
        "discovered_features": [{}],
        "onboarding": {{"welcomed": true, "exploration_started_at": {t0}, "distinct_features_seen": 12,
            "explore_gate_passed": true, "workflow_progress": {{{}}},
            "last_step_in": {{"decided_at": {}, "should_step_in": true, "timing_assessment": "idle on the dashboard",
                "reason": "has not tried sharing a report", "suggested_workflow_ids": ["workflow-1", "workflow-2"]}},
            "last_reasoned_at": {}, "last_welcome_at": {t0}, "proactive_support_count": 4,
            "onboarding_completed_at": null, "summary": "A steady first week: imports done, sharing not yet tried.",
            "completion_rate": 0.4286}},
        "first_seen_at": {t0}, "last_updated_at": {}, "last_judged_at": {},
        "sessions": {{"count": {sessions}, "current_session_id": "sess-live-77", "index": [{}]}}}}"#,
        features.join(", "),
        progress.join(", "),
        t0 + 7_200.5,
        t0 + 7_300.25,
        t0 + 9_000.75,
        t0 + 8_000.0,
        index.join(", "),
    );
    UserAdoptionState::from_snapshot_str(&text, at(t0)).expect("the bench record decodes")
}

/// The median of `times`.
fn median_ns(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn time_ns(n: usize, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    start.elapsed().as_secs_f64() * 1e9 / n as f64
}

/// The median of `rounds` timings of `n` calls of `f`, ns per call.
fn median_of(rounds: usize, n: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..rounds).map(|_| time_ns(n, &mut f)).collect();
    median_ns(&mut times)
}

/// Times `typed` and `tree` (each one round trip) in `rounds` alternating
/// rounds of `n` calls: the medians, ns per round trip.
fn side_by_side(
    rounds: usize,
    n: usize,
    mut typed: impl FnMut(),
    mut tree: impl FnMut(),
) -> (f64, f64) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        a.push(time_ns(n, &mut typed));
        b.push(time_ns(n, &mut tree));
    }
    (median_ns(&mut a), median_ns(&mut b))
}

const TABLE: &str = "Adoption snapshot round trip (encode + decode), typed codec vs value tree";
const COLUMNS: &[&str] = &[
    "document",
    "bytes",
    "typed encode (ns)",
    "typed decode (ns)",
    "typed round trip (ns)",
    "tree round trip (ns)",
    "speedup",
];

pub(crate) fn bench_adoption(rounds: usize, n: usize) {
    println!("adoption: load average at start: {}", load_average());
    let now = at(1_764_000_000.0);
    let cases: Vec<(String, UserAdoptionState)> = vec![
        ("new user".to_owned(), record(0, 0)),
        ("6 workflows, 12 sessions".to_owned(), record(6, 12)),
        ("12 workflows, 50 sessions".to_owned(), record(12, 50)),
    ];
    for (name, state) in &cases {
        let text = state.to_snapshot_string();
        // Both codecs write the same text and read it to the same record.
        assert_eq!(
            text,
            serde_json::to_string(&tree::encode_state(state)).expect("text")
        );
        assert_eq!(tree::decode_state_str(&text, now).as_ref(), Ok(state));
        assert_eq!(
            UserAdoptionState::from_snapshot_str(&text, now).as_ref(),
            Ok(state)
        );

        let enc = median_of(rounds, n, || {
            black_box(black_box(state).to_snapshot_string());
        });
        let dec = median_of(rounds, n, || {
            black_box(UserAdoptionState::from_snapshot_str(black_box(&text), now).ok());
        });
        let (typed, old) = side_by_side(
            rounds,
            n,
            || {
                let t = black_box(state).to_snapshot_string();
                black_box(UserAdoptionState::from_snapshot_str(&t, now).ok());
            },
            || {
                let t = serde_json::to_string(&tree::encode_state(black_box(state)))
                    .unwrap_or_default();
                black_box(tree::decode_state_str(&t, now).ok());
            },
        );
        report(
            &format!("user record, {name}"),
            text.len(),
            enc,
            dec,
            typed,
            old,
        );
    }

    let (_, state) = &cases[1];
    let snap = SessionSnapshot::from_adoption_state(
        state,
        "sess-live-77",
        13,
        state.first_seen_at,
        &[
            "workflow-0",
            "workflow-1",
            "workflow-2",
            "workflow-3",
            "workflow-4",
            "workflow-5",
            "workflow-6",
        ],
        CompletionRateDenominator::AllCatalogWorkflows,
        state.last_updated_at,
    );
    let text = snap.to_snapshot_string();
    assert_eq!(
        text,
        serde_json::to_string(&tree::encode_session(&snap)).expect("text")
    );
    assert_eq!(
        SessionSnapshot::from_snapshot_str(&text, now).as_ref(),
        Ok(&snap)
    );
    let enc = median_of(rounds, n, || {
        black_box(black_box(&snap).to_snapshot_string());
    });
    let dec = median_of(rounds, n, || {
        black_box(SessionSnapshot::from_snapshot_str(black_box(&text), now).ok());
    });
    let (typed, old) = side_by_side(
        rounds,
        n,
        || {
            let t = black_box(&snap).to_snapshot_string();
            black_box(SessionSnapshot::from_snapshot_str(&t, now).ok());
        },
        || {
            let t =
                serde_json::to_string(&tree::encode_session(black_box(&snap))).unwrap_or_default();
            let v = parlance_core::adoption::OrderedValue::parse(&t).ok();
            black_box(v.map(|v| tree::decode_session(&v, now).ok()));
        },
    );
    report(
        "session snapshot, 6 workflows",
        text.len(),
        enc,
        dec,
        typed,
        old,
    );
    println!("adoption: load average at end: {}", load_average());
}

fn report(name: &str, bytes: usize, enc: f64, dec: f64, typed: f64, old: f64) {
    println!(
        "adoption: {name} ({bytes} bytes): typed encode {enc:.0} ns + decode {dec:.0} ns; \
         round trip typed {typed:.0} ns, value tree {old:.0} ns; {:.1}x faster",
        old / typed
    );
    report_row(
        TABLE,
        COLUMNS,
        &[
            name.to_owned(),
            bytes.to_string(),
            format!("{enc:.0}"),
            format!("{dec:.0}"),
            format!("{typed:.0}"),
            format!("{old:.0}"),
            format!("{:.1}x", old / typed),
        ],
    );
}

/// `/proc/loadavg`'s three averages, or `?` where there is none.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "?".to_owned(),
        |s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
}
