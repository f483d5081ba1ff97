//! A three-stage graph over the seed-shaped state with no LLM: a keyword
//! gate, an echoing reply and turn finalization. Used by the executor's
//! tests and the turn benchmark to measure the runtime itself.

use std::sync::Arc;

use parlance_core::turn::seed::{Message, Role, Route, SupportDelta, SupportState};
use parlance_core::turn::{Checkpoint, END, Graph};
use parlance_ports::{Clock, MachineStore};
use serde_json::json;

use super::PureStage;

/// Routes a message mentioning harm to the crisis reply, else the reply.
fn after_gate(s: &SupportState) -> &'static str {
    match s.route {
        Some(Route::Crisis) => "crisis_reply",
        _ => "reply",
    }
}

/// The graph: `gate -> (reply | crisis_reply) -> finalize_turn -> END`.
pub fn graph() -> Graph<SupportState> {
    Graph::builder("echo")
        .stage("gate")
        .stage("reply")
        .stage("crisis_reply")
        .stage("finalize_turn")
        .route("gate", after_gate, &["reply", "crisis_reply"])
        .edge("reply", "finalize_turn")
        .edge("crisis_reply", "finalize_turn")
        .edge("finalize_turn", END)
        .step_limit(8)
        .build()
        .expect("the echo graph is valid")
}

/// The gate: a keyword check, recorded in diagnostics.
pub fn gate(s: &SupportState) -> SupportDelta {
    let lower = s.message.to_lowercase();
    let crisis = ["hurt myself", "end it", "suicide"]
        .iter()
        .any(|k| lower.contains(k));
    SupportDelta {
        route: Some(Some(if crisis {
            Route::Crisis
        } else {
            Route::Therapeutic
        })),
        diagnostics: Some(serde_json::Map::from_iter([(
            "crisis_classifier_path".to_owned(),
            json!("keyword"),
        )])),
        ..SupportDelta::default()
    }
}

/// The reply: echoes the message with the turn number.
pub fn reply(s: &SupportState) -> SupportDelta {
    SupportDelta {
        response_text: Some(format!(
            "Turn {}: I hear you saying \"{}\".",
            s.session_progress.turn_count.unwrap_or(0),
            s.message
        )),
        response_style: Some(Some("reflective".to_owned())),
        ..SupportDelta::default()
    }
}

/// The crisis reply.
pub fn crisis_reply(_: &SupportState) -> SupportDelta {
    SupportDelta {
        response_text: Some(
            "I'm worried about your safety. Please contact your local emergency services."
                .to_owned(),
        ),
        response_style: Some(Some("crisis_response".to_owned())),
        ..SupportDelta::default()
    }
}

/// Finalization: the assistant turn appended to the transcript (and so to
/// the history window over it).
pub fn finalize_turn(s: &SupportState) -> SupportDelta {
    let turn = Message {
        role: Role::Assistant,
        content: s.response_text.clone(),
        response_style: s.response_style.clone(),
    };
    SupportDelta {
        transcript: vec![turn],
        ..SupportDelta::default()
    }
}

/// A runner of the echo graph on the threads in `store`, for any context
/// type.
pub fn runner<C: Sync + ?Sized + 'static>(
    store: Arc<dyn MachineStore<Checkpoint>>,
    clock: Arc<dyn Clock>,
) -> super::TurnRunner<SupportState, C> {
    super::TurnRunner::new(graph(), store, clock)
        .stage("gate", PureStage(gate))
        .stage("reply", PureStage(reply))
        .stage("crisis_reply", PureStage(crisis_reply))
        .stage("finalize_turn", PureStage(finalize_turn))
}
