//! Replays the reference SDK's recorded session cases against the session
//! machine: `session_state_fsm` (random walks), `session_state_from_dict`
//! (crafted and corrupt snapshots, then a fixed tail of operations) and
//! `tour_registry` (catalog decoding and lookups), from
//! `tests/conformance/*.jsonl` (format in `tests/conformance/FORMAT.md`).
//!
//! Every recorded return value, rejection and observable field must match.
//! The reference's clock values are monotonic seconds on a fake clock; they
//! are used here as epoch seconds, and every comparison is on ages, so the
//! time base does not matter. Reference snapshots (`_v: 1`) differ from ours
//! (`_v: 2`) only in the version, `product_id` and the "no cooldown" marker
//! (`0.0` there, `null` here); [`to_our_snapshot`] translates exactly that.
//!
//! Two lists below name every divergence: [`SKIPS`], rules naming the
//! snapshots we refuse and the reference loads, each by what the snapshot
//! does (a key of `SNAPSHOT_REQUIRED_KEYS` missing, an unknown state, an id
//! we refuse) or by a tag the corpus documents as a class of Python
//! artefacts, with its reason; and one named exception,
//! [`VISUAL_GUIDANCE_IN_THINKING`], applied step by step.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;

use parlance_core::session::{
    AssistState, ConversationEvent, DecodeError, SNAPSHOT_REQUIRED_KEYS, SessionError, SessionId,
    SessionState, TourCatalog, TourRegistry,
};
use parlance_core::{ProductId, Timestamp};
use serde_json::{Value, json};

/// A divergence rule: which cases it names, why, and the refusal it claims.
///
/// Every rule says we refuse a snapshot the reference loads; a case a rule
/// names is still decoded, and must be refused as the rule says.
struct Skip {
    /// Why we differ.
    reason: &'static str,
    /// Whether the rule names this case (by what the case does, or by a
    /// tag the corpus documents as a class).
    applies: fn(&Value) -> bool,
    /// The refusal the rule claims.
    refusal: fn(&DecodeError) -> bool,
}

/// The rule for snapshots missing a key we require, whichever key it is.
const MISSING_REQUIRED_KEY: &str = "policy (weakness 2; 12 for the session id): the reference loads a snapshot missing a key \
     we require (SNAPSHOT_REQUIRED_KEYS: version, identity, current_state, the timestamps) with a default \
     (an empty id, thinking, now); we refuse it, naming the key";

/// Every divergence of the replay, with its reason. The first rule that
/// applies names the case.
const SKIPS: &[Skip] = &[
    Skip {
        reason: MISSING_REQUIRED_KEY,
        applies: lacks_a_required_key,
        refusal: |e| matches!(e, DecodeError::Missing { path } if SNAPSHOT_REQUIRED_KEYS.contains(&path.as_str())),
    },
    Skip {
        reason: "python artefact: the reference stores wrong-typed timeouts unvalidated; we reject them at load",
        applies: |c| tag(c, "py_type_leak"),
        refusal: |e| {
            matches!(
                e,
                DecodeError::WrongType { .. } | DecodeError::Invalid { .. }
            ) && matches!(
                e.path(),
                Some("interaction_timeout_s" | "cooldown_period_s")
            )
        },
    },
    Skip {
        reason: "python artefact: `_v` of 1.0 or true equals 1 under Python `==`; our version must be the integer",
        applies: |c| {
            reference_loads(c)
                && snapshot(c)
                    .and_then(|s| s.get("_v"))
                    .is_some_and(|v| !(v.is_u64() || v.is_i64()))
        },
        refusal: |e| matches!(e, DecodeError::Version { .. }),
    },
    Skip {
        reason: "defect we fix: the reference loads an unknown current_state as thinking; the spec makes it an error",
        applies: |c| {
            reference_loads(c)
                && snapshot(c)
                    .and_then(|s| s.get("current_state"))
                    .is_some_and(|v| v.as_str().and_then(AssistState::from_wire).is_none())
        },
        refusal: |e| e.path() == Some("current_state"),
    },
    Skip {
        reason: "defect we fix (weakness 12): the reference loads a session id its constructor forbids (empty, not text)",
        applies: |c| {
            reference_loads(c)
                && snapshot(c)
                    .and_then(|s| s.get("session_id"))
                    .is_some_and(|v| v.as_str().is_none_or(|id| SessionId::parse(id).is_err()))
        },
        refusal: |e| e.path() == Some("session_id"),
    },
];

fn tag(case: &Value, t: &str) -> bool {
    case["tags"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(t)))
}

/// The snapshot a `from_dict` case loads, when it is an object.
fn snapshot(case: &Value) -> Option<&serde_json::Map<String, Value>> {
    case["input"]["snapshot"].as_object()
}

/// Whether the reference loaded the case's snapshot.
fn reference_loads(case: &Value) -> bool {
    case["expect"]["load"].get("ok").is_some()
}

/// Whether the reference loaded a snapshot that, in our layout, lacks a key
/// of [`SNAPSHOT_REQUIRED_KEYS`]: the key is absent, or the object that
/// would hold it is (an object of the wrong type is not a missing key).
fn lacks_a_required_key(case: &Value) -> bool {
    if !reference_loads(case) {
        return false;
    }
    let ours = to_our_snapshot(&case["input"]["snapshot"]);
    let Some(root) = ours.as_object() else {
        return false;
    };
    SNAPSHOT_REQUIRED_KEYS.iter().any(|path| {
        let mut obj = root;
        let mut keys = path.split('.').peekable();
        while let Some(key) = keys.next() {
            match obj.get(key) {
                None => return true,
                Some(Value::Object(inner)) if keys.peek().is_some() => obj = inner,
                Some(_) => return false,
            }
        }
        false
    })
}

/// The one exception applied inside cases: the reference raises
/// `InvalidTransitionError` for `set_visual_guidance` in thinking; the seed
/// says it is a no-op, and we follow the seed, reporting it as ignored with
/// reason `v2_state_thinking`. Either way the state is unchanged.
const VISUAL_GUIDANCE_IN_THINKING: &str = "set_visual_guidance in thinking: the reference raises, the seed (which wins) makes it a no-op; \
     ours is ignored with reason v2_state_thinking";

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("conformance")
        .join(name)
}

fn cases(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(data(name))
        .unwrap_or_else(|e| panic!("read {}: {e}", data(name).display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("each line is one JSON case"))
        .collect()
}

/// Tallies per suite.
#[derive(Default)]
struct Tally {
    ran: usize,
    skipped: BTreeMap<&'static str, usize>,
    exceptions: usize,
    failures: Vec<String>,
}

impl Tally {
    fn report(&self, suite: &str, total: usize) {
        let mut err = std::io::stderr().lock();
        let skipped: usize = self.skipped.values().sum();
        let _ = writeln!(
            err,
            "conformance {suite}: {total} cases, {} ran, {skipped} skipped, {} failed",
            self.ran,
            self.failures.len()
        );
        for (reason, n) in &self.skipped {
            let _ = writeln!(err, "  skipped {n:>3}: {reason}");
        }
        if self.exceptions > 0 {
            let _ = writeln!(
                err,
                "  named exception applied {} times: {VISUAL_GUIDANCE_IN_THINKING}",
                self.exceptions
            );
        }
    }

    fn finish(self, suite: &str, total: usize) {
        self.report(suite, total);
        assert!(
            self.failures.is_empty(),
            "{} of {} {suite} cases diverge from the reference; first ones:\n{}",
            self.failures.len(),
            self.ran,
            self.failures
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert!(self.ran > 0, "no {suite} case ran");
    }
}

/// JSON equality with numbers compared numerically (`1` == `1.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn secs(t: f64) -> Timestamp {
    Timestamp::from_epoch_seconds(t).expect("recorded clock values are in range")
}

/// The observable state of FORMAT.md: ages relative to `now`.
fn observe(s: &SessionState, now: Timestamp) -> Value {
    let th = s.thinking();
    json!({
        "state": s.current_state().as_str(),
        "cooldown_active": th.cooldown_active,
        "can_go_proactive": th.can_go_proactive(),
        "cooldown_override_s": th.active_cooldown_period_s,
        "cooldown_age_s": th.cooldown_started_at.map(|t| now.seconds_since(t)),
        "visual_guidance_active": s.visual_guidance_active(),
        "active_tour_id": s.active_tour_id(),
        "conversation_linked": s.conversation_linked(),
        "conversation_id": s.conversation_id(),
        "user_clicked_option": s.proactive().user_clicked_option,
        "last_interaction_age_s": now.seconds_since(s.last_interaction_at()),
        "proactive_elapsed_s": s.proactive().time_since_last_interaction_s,
        "proactive_anchor_age_s": now.seconds_since(s.proactive().last_message_at),
        "reactive_elapsed_s": s.reactive().time_since_last_interaction_s,
        "reactive_anchor_age_s": now.seconds_since(s.reactive().last_message_at),
    })
}

/// Our snapshot in the reference's `snapshot_rel` layout: timestamps as ages,
/// our `_v` mapped back to the reference's, no `product_id`.
fn snapshot_rel(snap: &Value, now: Timestamp) -> Value {
    let mut v = snap.clone();
    let age = |x: &Value| match x.as_f64() {
        Some(t) => json!(now.seconds_since(secs(t))),
        None => Value::Null,
    };
    let m = v.as_object_mut().expect("object");
    m.remove("product_id");
    let ver = m["_v"].as_u64().expect("integer version");
    m.insert("_v".into(), json!(ver - 1));
    let li = age(&m["last_interaction_at"]);
    m.insert("last_interaction_at".into(), li);
    for (sub, key) in [
        ("thinking", "cooldown_started_at"),
        ("proactive", "last_message_at"),
        ("reactive", "last_message_at"),
    ] {
        let a = age(&m[sub][key]);
        m[sub][key] = a;
    }
    v
}

/// A reference (`_v: 1`) snapshot in our layout: the version numbers are
/// one apart (an integer `n` becomes `n + 1`; anything else stays as it is,
/// and is rejected), `product_id` is added, and the `0.0` "no cooldown"
/// marker becomes `null`.
fn to_our_snapshot(reference: &Value) -> Value {
    let mut v = reference.clone();
    if let Some(m) = v.as_object_mut() {
        if let Some(n) = m
            .get("_v")
            .and_then(|x| if x.is_f64() { None } else { x.as_i64() })
        {
            m.insert("_v".into(), json!(n + 1));
        }
        m.entry("product_id").or_insert(json!("prod-1"));
        if let Some(Value::Object(th)) = m.get_mut("thinking")
            && th.get("cooldown_started_at").and_then(Value::as_f64) == Some(0.0)
        {
            th.insert("cooldown_started_at".into(), Value::Null);
        }
    }
    v
}

/// Runs one recorded step; returns an error text on divergence.
fn step(
    s: &mut SessionState,
    now: &mut Timestamp,
    registry: &TourCatalog,
    st: &Value,
    exceptions: &mut usize,
) -> Result<(), String> {
    let op = st["op"].as_str().unwrap_or_default();
    let args = st.get("args").cloned().unwrap_or(json!({}));
    let expected = &st["result"];
    let expect_error = expected.get("error").is_some();
    let ok_null = json!({"ok": null});
    let got: Value = match op {
        "advance" => {
            *now = now.plus_seconds(args["dt"].as_f64().ok_or("advance without dt")?);
            ok_null
        }
        "tick" => {
            let tours = if args["with_registry"].as_bool() == Some(true) {
                registry
            } else {
                TourCatalog::none()
            };
            s.tick(*now, tours);
            ok_null
        }
        "transition_to_proactive" => {
            let trigger = args["trigger_id"].as_str().unwrap_or_default();
            match s.transition_to_proactive(trigger, *now) {
                Ok(out) if out.changed_state() => json!({"ok": true}),
                Ok(out) if out.ignored == Some("v2_cooldown_active") => json!({"ok": false}),
                Ok(out) => return Err(format!("unexpected outcome {out:?}")),
                Err(SessionError::NotAllowed(_)) => {
                    json!({"error": "InvalidTransitionError"})
                }
                Err(e) => return Err(format!("unexpected error {e}")),
            }
        }
        "transition_to_reactive" => match s.transition_to_reactive(*now) {
            Ok(_) => ok_null,
            Err(SessionError::NotAllowed(_)) => {
                json!({"error": "InvalidTransitionError"})
            }
            Err(e) => return Err(format!("unexpected error {e}")),
        },
        "record_user_interaction" => {
            s.record_user_interaction(*now);
            ok_null
        }
        "record_option_click" => {
            s.record_option_click(*now);
            ok_null
        }
        "record_reaction" => {
            s.record_reaction(*now);
            ok_null
        }
        "record_tour_step" => {
            s.record_tour_step(*now);
            ok_null
        }
        "set_visual_guidance" => {
            let active = args["active"].as_bool().ok_or("active is not a bool")?;
            let out = s.set_visual_guidance(active, args["tour_id"].as_str(), *now);
            match out.ignored {
                None => ok_null,
                Some("v2_state_thinking") if expect_error => {
                    *exceptions += 1;
                    expected.clone()
                }
                Some(reason) => json!({"ignored": reason}),
            }
        }
        "on_conversation_linked" => {
            let event = match args["event"].as_str() {
                Some("NEW") => ConversationEvent::New,
                Some("REPLY_EXISTING") => ConversationEvent::ReplyExisting,
                other => return Err(format!("unknown link event {other:?}")),
            };
            let id = args["conversation_id"].as_str().unwrap_or_default();
            s.on_conversation_linked(event, id)
                .map_err(|e| format!("link refused: {e}"))?;
            ok_null
        }
        "can_deliver_proactive" => {
            let (allowed, reason) = s.can_deliver_proactive();
            json!({"ok": [allowed, reason]})
        }
        "snapshot_roundtrip" => {
            let text = s.to_snapshot_string();
            let snap: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            if snap != s.to_snapshot() {
                return Err(format!("snapshot text {text} is not the snapshot value"));
            }
            *s = SessionState::from_snapshot_slice(text.as_bytes())
                .map_err(|e| format!("own snapshot does not decode: {e}"))?;
            json!({"ok": snapshot_rel(&snap, *now)})
        }
        other => return Err(format!("unknown op {other}")),
    };
    if !same(&got, expected) {
        return Err(format!("{op}: got {got}, expected {expected}"));
    }
    let t = st["t"].as_f64().ok_or("step without t")?;
    if *now != secs(t) {
        return Err(format!("{op}: clock at {now}, recorded {t}"));
    }
    Ok(())
}

/// Runs `steps` from `s`, checking the observable state after each.
fn run_steps(
    mut s: SessionState,
    mut now: Timestamp,
    mut expected: Value,
    steps: &[Value],
    registry: &TourCatalog,
    exceptions: &mut usize,
) -> Result<(SessionState, Timestamp, Value), String> {
    for (i, st) in steps.iter().enumerate() {
        step(&mut s, &mut now, registry, st, exceptions).map_err(|e| format!("step {i}: {e}"))?;
        if let (Some(exp), Some(delta)) = (expected.as_object_mut(), st["delta"].as_object()) {
            for (k, v) in delta {
                exp.insert(k.clone(), v.clone());
            }
        }
        let got = observe(&s, now);
        if !same(&got, &expected) {
            return Err(format!(
                "step {i} ({}): state {got}, expected {expected}",
                st["op"]
            ));
        }
    }
    Ok((s, now, expected))
}

fn fsm_case(case: &Value, exceptions: &mut usize) -> Result<(), String> {
    let input = &case["input"];
    let expect = &case["expect"];
    let now = secs(input["clock_start"].as_f64().ok_or("no clock_start")?);
    let init = &input["init"];
    let session_id = SessionId::parse(init["session_id"].as_str().unwrap_or_default())
        .map_err(|e| e.to_string())?;
    let mut s = SessionState::new(ProductId::parse("prod-1").expect("valid"), session_id, now)
        .with_settings(
            init["interaction_timeout_s"].as_f64().unwrap_or(20.0),
            init["cooldown_period_s"].as_f64().unwrap_or(60.0),
        )
        .map_err(|e| e.to_string())?;
    if let Some(m) = init["metadata"].as_object() {
        s = s.with_metadata(m.clone());
    }
    let registry = match &input["tour_registry"] {
        Value::Null => TourCatalog::empty(),
        r => {
            let reg = TourRegistry::from_value(r).map_err(|e| format!("registry: {e}"))?;
            let got = serde_json::to_value(&reg).map_err(|e| e.to_string())?;
            if !same(&got, &expect["tour_registry_resolved"]) {
                return Err(format!(
                    "registry resolved to {got}, expected {}",
                    expect["tour_registry_resolved"]
                ));
            }
            reg.catalog
        }
    };
    let initial = observe(&s, now);
    if !same(&initial, &expect["initial_state"]) {
        return Err(format!(
            "initial state {initial}, expected {}",
            expect["initial_state"]
        ));
    }
    let steps = case["steps"].as_array().cloned().unwrap_or_default();
    let (s, now, _) = run_steps(s, now, initial, &steps, &registry, exceptions)?;
    let last = observe(&s, now);
    if !same(&last, &expect["final_state"]) {
        return Err(format!(
            "final state {last}, expected {}",
            expect["final_state"]
        ));
    }
    Ok(())
}

fn from_dict_case(case: &Value, exceptions: &mut usize) -> Result<(), String> {
    let input = &case["input"];
    let load = &case["expect"]["load"];
    let now = secs(input["clock_at_load"].as_f64().ok_or("no clock_at_load")?);
    let ours = to_our_snapshot(&input["snapshot"]);
    let decoded = SessionState::from_snapshot(&ours);
    let s = match (decoded, load.get("ok")) {
        (Err(_), None) => return Ok(()),
        (Err(e), Some(_)) => return Err(format!("rejected a snapshot the reference loads: {e}")),
        (Ok(_), None) => {
            return Err(format!("loaded a snapshot the reference rejects ({load})"));
        }
        (Ok(s), Some(ok)) => {
            let got = observe(&s, now);
            if !same(&got, &ok["state"]) {
                return Err(format!("loaded state {got}, expected {}", ok["state"]));
            }
            let snap = snapshot_rel(&s.to_snapshot(), now);
            if !same(&snap, &ok["snapshot"]) {
                return Err(format!("snapshot {snap}, expected {}", ok["snapshot"]));
            }
            s
        }
    };
    let steps = case["steps"].as_array().cloned().unwrap_or_default();
    let initial = observe(&s, now);
    run_steps(s, now, initial, &steps, TourCatalog::none(), exceptions).map(|_| ())
}

fn registry_case(case: &Value) -> Result<(), String> {
    let expect = &case["expect"];
    match (
        TourRegistry::from_value(&case["input"]["registry"]),
        expect.get("ok"),
    ) {
        (Err(_), None) => Ok(()),
        (Err(e), Some(_)) => Err(format!("rejected a registry the reference reads: {e}")),
        (Ok(_), None) => Err(format!("read a registry the reference rejects ({expect})")),
        (Ok(reg), Some(ok)) => {
            let got = serde_json::to_value(&reg).map_err(|e| e.to_string())?;
            if !same(&got, ok) {
                return Err(format!("registry {got}, expected {ok}"));
            }
            let lookups = expect["lookups"].as_object().ok_or("no lookups")?;
            for (query, want) in lookups {
                let tour = |t: Option<&_>| {
                    t.map_or(Ok(Value::Null), serde_json::to_value)
                        .map_err(|e| e.to_string())
                };
                let got = json!({
                    "get": tour(reg.catalog.get(query))?,
                    "get_by_user_tour_id": tour(reg.catalog.get_by_user_tour_id(query))?,
                });
                if !same(&got, want) {
                    return Err(format!("lookup {query:?}: {got}, expected {want}"));
                }
            }
            Ok(())
        }
    }
}

/// Why we refuse the snapshot a `from_dict` case loads, if we do.
fn our_refusal(case: &Value) -> Option<DecodeError> {
    SessionState::from_snapshot(&to_our_snapshot(&case["input"]["snapshot"])).err()
}

/// Replays `file`'s cases with `run`, except those a rule of `rules` names;
/// those are decoded and must be refused as their rule claims.
fn replay(
    file: &str,
    suite: &str,
    run: impl Fn(&Value, &mut usize) -> Result<(), String>,
    rules: &[Skip],
) {
    let all = cases(file);
    let mut tally = Tally::default();
    for case in &all {
        assert_eq!(case["suite"], suite, "{file} holds only {suite} cases");
        if let Some(skip) = rules.iter().find(|skip| (skip.applies)(case)) {
            *tally.skipped.entry(skip.reason).or_default() += 1;
            match our_refusal(case) {
                Some(e) if (skip.refusal)(&e) => {}
                got => tally.failures.push(format!(
                    "{}: skipped as \"{}\", but we answer {got:?}",
                    case["id"], skip.reason
                )),
            }
            continue;
        }
        tally.ran += 1;
        if let Err(e) = run(case, &mut tally.exceptions) {
            tally.failures.push(format!("{}: {e}", case["id"]));
        }
    }
    tally.finish(suite, all.len());
}

#[test]
fn session_state_fsm_matches_the_reference() {
    replay(
        "session_state_fsm.jsonl",
        "session_state_fsm",
        fsm_case,
        &[],
    );
}

#[test]
fn session_state_from_dict_matches_the_reference() {
    replay(
        "session_state_from_dict.jsonl",
        "session_state_from_dict",
        from_dict_case,
        SKIPS,
    );
}

#[test]
fn tour_registry_matches_the_reference() {
    replay(
        "tour_registry.jsonl",
        "tour_registry",
        |c, _| registry_case(c),
        &[],
    );
}

#[test]
fn skip_reasons_are_distinct() {
    let mut reasons: Vec<_> = SKIPS.iter().map(|s| s.reason).collect();
    reasons.sort_unstable();
    reasons.dedup();
    assert_eq!(reasons.len(), SKIPS.len());
}

/// A snapshot the reference loads without any one key of
/// `SNAPSHOT_REQUIRED_KEYS` is named by the missing-key rule and refused
/// naming that key, whichever key it is: every intact recorded snapshot,
/// with each required key of the reference's layout removed in turn.
#[test]
fn a_snapshot_missing_any_required_key_is_named_by_rule() {
    let mut checked = 0;
    for case in cases("session_state_from_dict.jsonl") {
        if !tag(&case, "mut:none") {
            continue;
        }
        for path in SNAPSHOT_REQUIRED_KEYS {
            // The reference refuses a snapshot without `_v` too, and writes
            // no `product_id` (ours is added to each of its snapshots).
            if matches!(*path, "_v" | "product_id") {
                continue;
            }
            let mut c = case.clone();
            c["tags"] = json!([format!("drop:{path}"), "mut:drop_key"]);
            let snap = c["input"]["snapshot"].as_object_mut().expect("object");
            match path.split_once('.') {
                None => snap.remove(*path),
                Some((sub, key)) => snap[sub].as_object_mut().expect("object").remove(key),
            };
            let rule = SKIPS.iter().find(|s| (s.applies)(&c)).map(|s| s.reason);
            assert_eq!(
                rule,
                Some(MISSING_REQUIRED_KEY),
                "{} without {path}",
                case["id"]
            );
            assert_eq!(
                our_refusal(&c),
                Some(DecodeError::Missing {
                    path: (*path).to_owned()
                }),
                "{} without {path}",
                case["id"]
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no intact snapshot in the corpus");
}
