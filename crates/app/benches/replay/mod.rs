//! `session replay`: the recorded session FSM traces through `SessionState`
//! and through the reference SDK, in one run.
//!
//! Both sides compile the traces before timing (ours to [`Op`]s, the
//! reference's script to opcode tuples) and time whole passes over every
//! trace: the session built from the trace's settings, then each step. A
//! snapshot round trip is the encode to JSON text and the decode back (the
//! reference: `to_dict`, `json.dumps`, `json.loads`, `from_dict`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use parlance_core::session::{
    ConversationEvent, SessionId, SessionState, TourCatalog, TourRegistry,
};
use parlance_core::{ProductId, Timestamp};
use serde_json::{Map, Value};

/// The reference package and the extras its modules import.
const REFERENCE: &[&str] = &["autoplay-sdk==0.13.0", "httpx", "httpx-sse"];

/// One recorded step.
enum Op {
    Advance(f64),
    Tick { with_registry: bool },
    Proactive(String),
    Reactive,
    User,
    Click,
    Reaction,
    TourStep,
    Guidance(bool, Option<String>),
    Link(ConversationEvent, String),
    CanDeliver,
    Roundtrip,
}

/// One recorded trace: the session's settings and its steps.
struct Trace {
    clock_start: Timestamp,
    session_id: SessionId,
    interaction_timeout_s: f64,
    cooldown_period_s: f64,
    metadata: Option<Map<String, Value>>,
    registry: TourCatalog,
    steps: Vec<Op>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn traces_file() -> PathBuf {
    root().join("crates/core/tests/conformance/session_state_fsm.jsonl")
}

fn compile(step: &Value) -> Op {
    let args = &step["args"];
    let text = |k: &str| args[k].as_str().expect("text argument").to_owned();
    match step["op"].as_str().expect("op") {
        "advance" => Op::Advance(args["dt"].as_f64().expect("dt")),
        "tick" => Op::Tick {
            with_registry: args["with_registry"].as_bool() == Some(true),
        },
        "transition_to_proactive" => Op::Proactive(text("trigger_id")),
        "transition_to_reactive" => Op::Reactive,
        "record_user_interaction" => Op::User,
        "record_option_click" => Op::Click,
        "record_reaction" => Op::Reaction,
        "record_tour_step" => Op::TourStep,
        "set_visual_guidance" => Op::Guidance(
            args["active"].as_bool().expect("active"),
            args["tour_id"].as_str().map(str::to_owned),
        ),
        "on_conversation_linked" => Op::Link(
            match args["event"].as_str() {
                Some("NEW") => ConversationEvent::New,
                Some("REPLY_EXISTING") => ConversationEvent::ReplyExisting,
                other => panic!("unknown link event {other:?}"),
            },
            text("conversation_id"),
        ),
        "can_deliver_proactive" => Op::CanDeliver,
        "snapshot_roundtrip" => Op::Roundtrip,
        other => panic!("unknown op {other}"),
    }
}

fn load(path: &Path) -> Vec<Trace> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let case: Value = serde_json::from_str(line).expect("one JSON case per line");
            let input = &case["input"];
            let init = &input["init"];
            let registry = match &input["tour_registry"] {
                Value::Null => TourCatalog::empty(),
                r => TourRegistry::from_value(r).expect("registry").catalog,
            };
            Trace {
                clock_start: Timestamp::from_epoch_seconds(
                    input["clock_start"].as_f64().expect("clock_start"),
                )
                .expect("in range"),
                session_id: SessionId::parse(init["session_id"].as_str().expect("session_id"))
                    .expect("session id"),
                interaction_timeout_s: init["interaction_timeout_s"].as_f64().unwrap_or(20.0),
                cooldown_period_s: init["cooldown_period_s"].as_f64().unwrap_or(60.0),
                metadata: init["metadata"].as_object().cloned(),
                registry,
                steps: case["steps"]
                    .as_array()
                    .expect("steps")
                    .iter()
                    .map(compile)
                    .collect(),
            }
        })
        .collect()
}

/// One snapshot round trip: the snapshot as JSON text, decoded again.
fn roundtrip(s: &SessionState) -> SessionState {
    let text = s.to_snapshot_string();
    SessionState::from_snapshot_slice(text.as_bytes()).expect("own snapshot decodes")
}

/// One pass over every trace; the number of steps run. With `keep`, the
/// state before each snapshot round trip is kept there.
fn replay(
    product: &ProductId,
    traces: &[Trace],
    snapshots: bool,
    mut keep: Option<&mut Vec<SessionState>>,
) -> usize {
    let mut n = 0;
    for t in traces {
        let mut now = t.clock_start;
        let mut s = SessionState::new(product.clone(), t.session_id.clone(), now)
            .with_settings(t.interaction_timeout_s, t.cooldown_period_s)
            .expect("settings");
        if let Some(m) = &t.metadata {
            s = s.with_metadata(m.clone());
        }
        for op in &t.steps {
            if !snapshots && matches!(op, Op::Roundtrip) {
                continue;
            }
            n += 1;
            // Refusals are part of the traces; their results are dropped
            // as the reference's exceptions are.
            match op {
                Op::Advance(dt) => now = now.plus_seconds(*dt),
                Op::Tick { with_registry } => {
                    let tours = if *with_registry {
                        &t.registry
                    } else {
                        TourCatalog::none()
                    };
                    std::hint::black_box(s.tick(now, tours));
                }
                Op::Proactive(trigger) => {
                    let _ = std::hint::black_box(s.transition_to_proactive(trigger, now));
                }
                Op::Reactive => {
                    let _ = std::hint::black_box(s.transition_to_reactive(now));
                }
                Op::User => {
                    std::hint::black_box(s.record_user_interaction(now));
                }
                Op::Click => {
                    std::hint::black_box(s.record_option_click(now));
                }
                Op::Reaction => {
                    std::hint::black_box(s.record_reaction(now));
                }
                Op::TourStep => {
                    std::hint::black_box(s.record_tour_step(now));
                }
                Op::Guidance(active, tour) => {
                    std::hint::black_box(s.set_visual_guidance(*active, tour.as_deref(), now));
                }
                Op::Link(event, id) => {
                    let _ = std::hint::black_box(s.on_conversation_linked(*event, id));
                }
                Op::CanDeliver => {
                    std::hint::black_box(s.can_deliver_proactive());
                }
                Op::Roundtrip => {
                    if let Some(keep) = keep.as_deref_mut() {
                        keep.push(s.clone());
                    }
                    s = roundtrip(&s);
                }
            }
        }
        std::hint::black_box(&s);
    }
    n
}

/// The best of `rounds` runs of `f`, in seconds, with what `f` returned.
fn best_of(rounds: usize, mut f: impl FnMut() -> usize) -> (usize, f64) {
    let mut best = f64::INFINITY;
    let mut n = 0;
    for _ in 0..rounds {
        let start = Instant::now();
        n = f();
        best = best.min(start.elapsed().as_secs_f64());
    }
    (n, best)
}

/// The target directory this benchmark was built into.
fn target_dir() -> PathBuf {
    // <target>/release/deps/session-<hash>
    let exe = std::env::current_exe().expect("current exe");
    exe.ancestors()
        .nth(3)
        .map_or_else(|| root().join("target"), Path::to_path_buf)
}

fn run(cmd: &mut Command) {
    println!("replay: running {cmd:?}");
    match cmd.status() {
        Ok(status) if status.success() => {}
        Ok(status) => panic!("replay: {cmd:?} failed ({status}); the reference cannot be run"),
        Err(e) => panic!("replay: cannot run {cmd:?}: {e}; the reference cannot be run"),
    }
}

/// The interpreter of a virtual environment holding the reference, made
/// (once, then reused) under the target directory. Panics when it cannot be
/// made: a replay without the reference side has no figure to give.
fn reference_python() -> PathBuf {
    let dir = target_dir().join("reference-py").join("autoplay-0.13.0");
    let python = dir.join("bin").join("python");
    let stamp = dir.join("installed.txt");
    let want = REFERENCE.join(" ");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(want.as_str()) && python.is_file() {
        return python;
    }
    let interpreter = std::env::var_os("PARLANCE_PYTHON").unwrap_or_else(|| "python3".into());
    if !python.is_file() {
        run(Command::new(&interpreter).args(["-m", "venv"]).arg(&dir));
    }
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(REFERENCE));
    std::fs::write(&stamp, &want).expect("write the venv stamp");
    python
}

/// The reference's figures, from `autoplay_session.py`.
struct Reference {
    version: String,
    steps: usize,
    best_s: f64,
    steps_lean: usize,
    best_s_lean: f64,
    roundtrips: usize,
    best_s_roundtrips: f64,
}

fn reference(traces: &Path, rounds: usize) -> Reference {
    let python = reference_python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/replay/autoplay_session.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(traces)
        .arg(rounds.to_string())
        .output()
        .unwrap_or_else(|e| panic!("replay: cannot run {}: {e}", python.display()));
    assert!(
        out.status.success(),
        "replay: the reference script failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "replay: the reference printed no result ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let count = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}")) as usize;
    let secs = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"));
    Reference {
        version: v["version"].as_str().unwrap_or("?").to_owned(),
        steps: count("steps"),
        best_s: secs("best_s"),
        steps_lean: count("steps_without_snapshots"),
        best_s_lean: secs("best_s_without_snapshots"),
        roundtrips: count("roundtrips"),
        best_s_roundtrips: secs("best_s_roundtrips"),
    }
}

fn ns_per(secs: f64, n: usize) -> f64 {
    secs * 1e9 / n as f64
}

/// Runs both sides; `rounds` passes of the reference, more of ours (each
/// of ours is much shorter), best of each.
pub(crate) fn bench_replay(rounds: usize) {
    println!("replay: load average at start: {}", load_average());
    let path = traces_file();
    let traces = load(&path);
    let product = ProductId::parse("prod-1").expect("id");
    let ours_rounds = rounds * 20;

    let mut states = Vec::new();
    replay(&product, &traces, true, Some(&mut states));
    let (steps, ours_full) = best_of(ours_rounds, || replay(&product, &traces, true, None));
    let (steps_lean, ours_lean) = best_of(ours_rounds, || replay(&product, &traces, false, None));
    let (trips, ours_trip) = best_of(ours_rounds, || {
        for s in &states {
            std::hint::black_box(roundtrip(std::hint::black_box(s)));
        }
        states.len()
    });

    let r = reference(&path, rounds);
    assert_eq!(
        (r.steps, r.steps_lean, r.roundtrips),
        (steps, steps_lean, trips),
        "both sides replay the same steps"
    );
    println!(
        "replay: {} traces from {}, {steps} steps ({trips} snapshot round trips); best of {ours_rounds} passes (ours), {rounds} (autoplay-sdk {})",
        traces.len(),
        path.display(),
        r.version
    );
    let reference_column = format!("autoplay-sdk {}", r.version);
    let line = |what: &str, n: usize, ours: f64, theirs: f64, unit: &str| {
        println!(
            "replay: {what}: parlance-core {ours:.1} {unit}, autoplay-sdk {theirs:.1} {unit}; ratio {:.1}x",
            theirs / ours
        );
        crate::common::report_row(
            "session replay",
            &[
                "measure",
                "count",
                "unit",
                "parlance-core",
                &reference_column,
                "ratio autoplay-sdk / parlance-core",
            ],
            &[
                what.to_owned(),
                n.to_string(),
                unit.to_owned(),
                format!("{ours:.1}"),
                format!("{theirs:.1}"),
                format!("{:.1}x", theirs / ours),
            ],
        );
    };
    line(
        "whole traces",
        steps,
        ns_per(ours_full, steps),
        ns_per(r.best_s, r.steps),
        "ns/step",
    );
    line(
        "without the snapshot round trips",
        steps_lean,
        ns_per(ours_lean, steps_lean),
        ns_per(r.best_s_lean, r.steps_lean),
        "ns/step",
    );
    line(
        "one snapshot round trip",
        trips,
        ns_per(ours_trip, trips),
        ns_per(r.best_s_roundtrips, r.roundtrips),
        "ns",
    );
    println!("replay: load average at end: {}", load_average());
}

/// `/proc/loadavg`'s three averages, or `?` where there is none.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "?".to_owned(),
        |s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
}
