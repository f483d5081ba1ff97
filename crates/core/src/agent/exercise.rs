//! The 5-4-3-2-1 grounding exercise as a small machine: one step per turn,
//! the approach pinned at the start, exit on request. `exercise_step` holds
//! the step whose prompt was shown last (1 to 5); no exercise is `None`.

use super::find_phrase;
use crate::table::{Edge, TransitionTable};

/// `exercise_state.exercise_type` of the grounding exercise.
pub const GROUNDING: &str = "grounding_5_4_3_2_1";

/// The approach pinned when the grounding exercise starts.
pub const GROUNDING_APPROACH: &str = "dbt_skills";

/// What each step asks, in order.
pub const GROUNDING_STEPS: [&str; 5] = [
    "Look around and name five things you can see.",
    "Now notice four things you can touch or feel, like your feet on the floor or the fabric of your clothes.",
    "Next, listen for three things you can hear.",
    "Now find two things you can smell (or two smells you like, if nothing comes).",
    "Last, notice one thing you can taste.",
];

/// The exercise's states and transitions, for tests and docs.
pub const TABLE: TransitionTable = TransitionTable {
    machine: "grounding exercise",
    states: &["idle", "step_1", "step_2", "step_3", "step_4", "step_5"],
    terminal: &[],
    edges: &[
        Edge {
            from: "idle",
            to: "step_1",
            cause: "start",
        },
        Edge {
            from: "step_1",
            to: "step_2",
            cause: "answer",
        },
        Edge {
            from: "step_2",
            to: "step_3",
            cause: "answer",
        },
        Edge {
            from: "step_3",
            to: "step_4",
            cause: "answer",
        },
        Edge {
            from: "step_4",
            to: "step_5",
            cause: "answer",
        },
        Edge {
            from: "step_5",
            to: "idle",
            cause: "complete",
        },
        Edge {
            from: "step_1",
            to: "idle",
            cause: "exit",
        },
        Edge {
            from: "step_2",
            to: "idle",
            cause: "exit",
        },
        Edge {
            from: "step_3",
            to: "idle",
            cause: "exit",
        },
        Edge {
            from: "step_4",
            to: "idle",
            cause: "exit",
        },
        Edge {
            from: "step_5",
            to: "idle",
            cause: "exit",
        },
    ],
};

/// Phrases that start the exercise.
pub const START_PHRASES: &[&str] = &[
    "grounding exercise",
    "grounding",
    "5 4 3 2 1",
    "54321",
    "five four three two one",
    "help me calm down",
    "panic attack",
    "im panicking",
];

/// Phrases that leave it.
pub const EXIT_PHRASES: &[&str] = &[
    "stop",
    "exit",
    "quit",
    "enough",
    "end the exercise",
    "stop the exercise",
    "i want to stop",
    "lets stop",
    "not now",
    "cancel",
];

/// True when `message` asks to start a grounding exercise.
pub fn wants_grounding(message: &str) -> bool {
    find_phrase(message, START_PHRASES).is_some()
}

/// True when `message` asks to leave the exercise.
pub fn wants_exit(message: &str) -> bool {
    find_phrase(message, EXIT_PHRASES).is_some()
}

/// What one exercise turn does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExerciseTurn {
    /// The reply.
    pub reply: String,
    /// The step shown now (`None`: the exercise is over).
    pub step: Option<u32>,
    /// The transition taken.
    pub cause: &'static str,
    /// The state before and after (the table's names).
    pub from: String,
    /// The state after.
    pub to: String,
}

fn state_name(step: Option<u32>) -> String {
    step.map_or_else(|| "idle".to_owned(), |s| format!("step_{s}"))
}

/// Advances the exercise by one turn from `current` (the step shown last, or
/// `None` to start).
pub fn grounding_turn(current: Option<u32>, message: &str) -> ExerciseTurn {
    let (reply, step, cause) = match current {
        None | Some(0) => (
            format!(
                "Let's try the 5-4-3-2-1 grounding exercise together. Take a slow breath; we'll go one step at a time, and you can say stop whenever you like. {}",
                GROUNDING_STEPS[0]
            ),
            Some(1),
            "start",
        ),
        Some(_) if wants_exit(message) => (
            "Of course, we can stop the exercise here. Thank you for trying it. How are you feeling right now?".to_owned(),
            None,
            "exit",
        ),
        Some(s) if (s as usize) < GROUNDING_STEPS.len() => (
            format!("Thank you. {}", GROUNDING_STEPS[s as usize]),
            Some(s + 1),
            "answer",
        ),
        Some(_) => (
            "Well done, you've finished the 5-4-3-2-1 exercise. Notice how your body feels now compared with when we started. You can come back to it whenever you need to.".to_owned(),
            None,
            "complete",
        ),
    };
    ExerciseTurn {
        reply,
        from: state_name(current.filter(|s| *s > 0)),
        to: state_name(step),
        step,
        cause,
    }
}
