//! Turn triage: which reply path a non-crisis turn takes, memory-control
//! commands, and the confirmation of a pending destructive action, all by
//! rule (no model), so a deletion is never confirmed by inference.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{exercise, find_phrase, normalize};
use crate::turn::{
    MemoryId, MemoryRecord, WorkingMemoryEntry, format_working_memory_entries, tokenize,
};

/// A memory command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MemoryCommand {
    /// "What do you remember about me?"
    Recall,
    /// "Forget what I said about X."
    Forget {
        /// What to forget.
        topic: String,
    },
    /// "Forget everything."
    ForgetAll,
}

const RECALL: &[&str] = &[
    "what do you remember about me",
    "what do you know about me",
    "what have you remembered",
    "what have you saved about me",
    "show me my memories",
    "show my memories",
    "what do you remember",
];

const FORGET_ALL: &[&str] = &[
    "forget everything",
    "forget all",
    "delete everything",
    "delete all my memories",
    "erase everything",
    "delete all memories",
    "wipe my memory",
];

const POLITE: &[&str] = &[
    "please ",
    "can you ",
    "could you ",
    "would you ",
    "i want you to ",
    "id like you to ",
    "i need you to ",
];

const FORGET_LEADS: &[&str] = &[
    "forget what i said about ",
    "forget what i told you about ",
    "forget everything about ",
    "forget anything about ",
    "forget about ",
    "forget that ",
    "forget ",
    "delete what you know about ",
    "delete what you remember about ",
    "delete what i said about ",
    "delete my memories about ",
    "delete ",
    "erase what i said about ",
    "erase ",
    "remove what you know about ",
    "stop remembering ",
];

/// The memory command in `message`, if it is one. Destructive commands must
/// open the message (after "please", "can you" and the like), so "I can't
/// forget about it" is not one.
pub fn parse_memory_command(message: &str) -> Option<MemoryCommand> {
    if find_phrase(message, RECALL).is_some() {
        return Some(MemoryCommand::Recall);
    }
    let mut n = normalize(message).trim().to_owned() + " ";
    loop {
        let before = n.len();
        for p in POLITE {
            if let Some(rest) = n.strip_prefix(p) {
                n = rest.to_owned();
            }
        }
        if n.len() == before {
            break;
        }
    }
    if FORGET_ALL.iter().any(|p| n.starts_with(&format!("{p} "))) {
        return Some(MemoryCommand::ForgetAll);
    }
    for lead in FORGET_LEADS {
        if let Some(rest) = n.strip_prefix(lead) {
            let topic = rest.trim();
            let topic = topic
                .strip_prefix("my ")
                .filter(|t| !t.is_empty())
                .unwrap_or(topic)
                .trim();
            if !topic.is_empty() {
                return Some(MemoryCommand::Forget {
                    topic: topic.to_owned(),
                });
            }
        }
    }
    None
}

/// An answer to "should I delete them?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmation {
    /// Go ahead.
    Confirm,
    /// Keep them.
    Cancel,
    /// Neither: the pending action is dropped and the message handled anew.
    Unclear,
}

/// Reads a confirmation: an explicit yes confirms, an explicit no cancels,
/// anything else is unclear (and never deletes).
pub fn parse_confirmation(message: &str) -> Confirmation {
    let n = normalize(message);
    let words: Vec<&str> = n.split_whitespace().collect();
    let no = [
        "no", "nope", "cancel", "dont", "keep", "wait", "stop", "not",
    ];
    let yes = ["yes", "yeah", "yep", "confirm", "sure", "ok", "okay"];
    if words.iter().any(|w| no.contains(w)) {
        Confirmation::Cancel
    } else if words.len() <= 6
        && (words.iter().any(|w| yes.contains(w))
            || super::has_phrase(&n, "do it")
            || super::has_phrase(&n, "go ahead")
            || super::has_phrase(&n, "delete them")
            || super::has_phrase(&n, "delete it"))
    {
        Confirmation::Confirm
    } else {
        Confirmation::Unclear
    }
}

/// A destructive action awaiting confirmation (`memory_control.pending_action`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingAction {
    /// `forget` or `forget_all`.
    pub kind: String,
    /// What the user named (empty for everything).
    pub topic: String,
    /// The entries it deletes.
    pub ids: Vec<MemoryId>,
}

impl PendingAction {
    /// As the state's JSON value.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// From the state's JSON value.
    pub fn from_value(v: &Value) -> Option<Self> {
        serde_json::from_value(v.clone()).ok()
    }
}

/// The owner's entries a command selects: every one for `ForgetAll`; for
/// `Forget`, those whose text shares a word with the topic.
pub fn select<'r>(command: &MemoryCommand, records: &'r [MemoryRecord]) -> Vec<&'r MemoryRecord> {
    match command {
        MemoryCommand::Recall => Vec::new(),
        MemoryCommand::ForgetAll => records.iter().collect(),
        MemoryCommand::Forget { topic } => {
            let words: Vec<String> = tokenize(topic)
                .into_iter()
                .filter(|w| {
                    w.len() > 2
                        && !["the", "and", "what", "said", "about", "that"].contains(&w.as_str())
                })
                .collect();
            records
                .iter()
                .filter(|r| {
                    let t = r.entry.tokens();
                    words.iter().any(|w| t.contains(w))
                })
                .collect()
        }
    }
}

/// What a memory-control turn says and does.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryReply {
    /// The reply.
    pub text: String,
    /// The pending action after this turn (`None` clears it).
    pub pending: Option<PendingAction>,
    /// Entries to delete now (only on a confirmation).
    pub delete: Vec<MemoryId>,
    /// The action taken, for `memory_control.action`.
    pub action: Value,
}

fn lines(records: &[&MemoryRecord]) -> String {
    let entries: Vec<WorkingMemoryEntry> = records
        .iter()
        .map(|r| WorkingMemoryEntry::Entry(r.entry.clone()))
        .collect();
    format_working_memory_entries(&entries)
        .lines()
        .map(|l| format!("- {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A new command against the owner's `records`: recall lists them;
/// forgetting asks for confirmation first (nothing is deleted this turn).
pub fn command_reply(command: &MemoryCommand, records: &[MemoryRecord]) -> MemoryReply {
    let action = serde_json::to_value(command).unwrap_or(Value::Null);
    match command {
        MemoryCommand::Recall => {
            let all: Vec<&MemoryRecord> = records.iter().collect();
            let text = if all.is_empty() {
                "I don't have anything saved about you yet.".to_owned()
            } else {
                format!("Here is what I remember about you:\n{}", lines(&all))
            };
            MemoryReply {
                text,
                pending: None,
                delete: Vec::new(),
                action,
            }
        }
        MemoryCommand::Forget { .. } | MemoryCommand::ForgetAll => {
            let chosen = select(command, records);
            let (kind, topic) = match command {
                MemoryCommand::Forget { topic } => ("forget", topic.clone()),
                _ => ("forget_all", String::new()),
            };
            if chosen.is_empty() {
                let text = if topic.is_empty() {
                    "I don't have anything saved about you, so there is nothing to forget."
                        .to_owned()
                } else {
                    format!(
                        "I don't have anything saved about {topic}, so there is nothing to forget."
                    )
                };
                return MemoryReply {
                    text,
                    pending: None,
                    delete: Vec::new(),
                    action,
                };
            }
            let what = if topic.is_empty() {
                "everything I remember about you".to_owned()
            } else {
                format!("what I remember about {topic}")
            };
            let text = format!(
                "I found {} {} to delete ({what}):\n{}\nShould I delete {}? Reply yes to confirm or no to keep {}.",
                chosen.len(),
                if chosen.len() == 1 {
                    "memory"
                } else {
                    "memories"
                },
                lines(&chosen),
                if chosen.len() == 1 { "it" } else { "them" },
                if chosen.len() == 1 { "it" } else { "them" },
            );
            MemoryReply {
                text,
                pending: Some(PendingAction {
                    kind: kind.to_owned(),
                    topic,
                    ids: chosen.iter().map(|r| r.id).collect(),
                }),
                delete: Vec::new(),
                action,
            }
        }
    }
}

/// The turn after a destructive command: confirm deletes, cancel keeps.
pub fn confirmation_reply(pending: &PendingAction, answer: Confirmation) -> MemoryReply {
    match answer {
        Confirmation::Confirm => MemoryReply {
            text: format!(
                "Done. I've deleted {} {}{}.",
                pending.ids.len(),
                if pending.ids.len() == 1 {
                    "memory"
                } else {
                    "memories"
                },
                if pending.topic.is_empty() {
                    String::new()
                } else {
                    format!(" about {}", pending.topic)
                }
            ),
            pending: None,
            delete: pending.ids.clone(),
            action: json!({"kind": "confirm", "pending": pending}),
        },
        Confirmation::Cancel | Confirmation::Unclear => MemoryReply {
            text: "Okay, I haven't deleted anything.".to_owned(),
            pending: None,
            delete: Vec::new(),
            action: json!({"kind": "cancel", "pending": pending}),
        },
    }
}

/// The factual question in `message`, if it asks one that is not about the
/// user (those get a therapeutic reply).
pub fn grounded_query(message: &str) -> Option<String> {
    let n = normalize(message);
    let t = n.trim();
    let asks = message.trim_end().ends_with('?')
        || [
            "what is ",
            "what are ",
            "whats ",
            "how does ",
            "how do ",
            "is it true",
            "can you explain ",
            "tell me about ",
        ]
        .iter()
        .any(|p| format!("{t} ").starts_with(p));
    let about_self = t
        .split_whitespace()
        .any(|w| ["i", "im", "me", "my", "myself", "ive", "id", "mine"].contains(&w));
    let factual = [
        "what is ",
        "what are ",
        "whats ",
        "how does ",
        "how do ",
        "is it true",
        "can you explain ",
        "tell me about ",
        "what does ",
        "why do ",
        "why does ",
        "when ",
        "where ",
        "who ",
    ]
    .iter()
    .any(|p| format!("{t} ").starts_with(p));
    (asks && factual && !about_self).then(|| message.trim().to_owned())
}

/// Where a non-crisis turn goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dispatch {
    /// Ask about safety first (the gate was unsure).
    SafetyCheck,
    /// A memory command, or the answer to a pending one.
    MemoryControl,
    /// The guided exercise (active, or asked for).
    Exercise,
    /// A factual question for the knowledge base.
    GroundedLookup(String),
    /// A therapeutic reply.
    Therapeutic,
}

/// Triage by rule, in priority order: safety check, a pending confirmation
/// (an unclear answer drops it and goes on), a memory command, a factual
/// question (a side-turn that leaves an active exercise where it is), the
/// exercise, else a therapeutic reply.
pub fn dispatch(
    message: &str,
    needs_clarification: bool,
    pending: bool,
    exercise_active: bool,
) -> Dispatch {
    if needs_clarification {
        return Dispatch::SafetyCheck;
    }
    if pending && parse_confirmation(message) != Confirmation::Unclear {
        return Dispatch::MemoryControl;
    }
    if parse_memory_command(message).is_some() {
        return Dispatch::MemoryControl;
    }
    // A factual side-question keeps an active exercise where it is.
    if let Some(q) = grounded_query(message) {
        return Dispatch::GroundedLookup(q);
    }
    if exercise_active || exercise::wants_grounding(message) {
        return Dispatch::Exercise;
    }
    Dispatch::Therapeutic
}
