//! Dialogue elements, persistence flags and the dialogue formats.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::Timestamp;

/// Who uttered a dialogue element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Actor {
    /// Context set by the flow itself.
    System,
    /// An invoker (or the flow's rendered templates).
    Assistant,
    /// The client.
    User,
}

impl Actor {
    /// The lowercase wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Actor::System => "system",
            Actor::Assistant => "assistant",
            Actor::User => "user",
        }
    }
}

/// One utterance of the dialogue (the chat history). Stored one row each,
/// append-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DialogueElement {
    /// Who said it.
    pub actor: Actor,
    /// The event whose transition recorded it (`init` for the greeting).
    pub event: String,
    /// The text; `None` when only the event was recorded.
    pub actor_text: Option<String>,
    /// When it was recorded.
    pub timestamp: Timestamp,
}

/// Which halves of a transition are written to the dialogue (the
/// reference's `DialoguePersistence` int flag, same bit values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Persistence(u8);

impl Persistence {
    /// Nothing is recorded.
    pub const NONE: Persistence = Persistence(0);
    /// A source element with the event name and no text.
    pub const SOURCE_EVENT: Persistence = Persistence(1);
    /// A source element with the raw input.
    pub const SOURCE_RAW: Persistence = Persistence(2);
    /// A target element with the raw input.
    pub const TARGET_RAW: Persistence = Persistence(4);
    /// A target element with the rendered target template.
    pub const TARGET_RENDERED: Persistence = Persistence(8);
    /// Both source bits.
    pub const SOURCE: Persistence = Persistence(3);
    /// Both target bits.
    pub const TARGET: Persistence = Persistence(12);

    /// The raw bits.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// Flags from raw bits (unknown bits dropped).
    pub fn from_bits(bits: u8) -> Persistence {
        Persistence(bits & 15)
    }

    /// True when every bit of `other` is set.
    pub fn contains(self, other: Persistence) -> bool {
        self.0 & other.0 == other.0
    }

    /// True when any bit of `other` is set.
    pub fn intersects(self, other: Persistence) -> bool {
        self.0 & other.0 != 0
    }

    /// Parses a flag name as written in flow files (`source_raw`, `none`, ...).
    pub fn from_name(name: &str) -> Option<Persistence> {
        Some(match name {
            "none" => Self::NONE,
            "source_event" => Self::SOURCE_EVENT,
            "source_raw" => Self::SOURCE_RAW,
            "target_raw" => Self::TARGET_RAW,
            "target_rendered" => Self::TARGET_RENDERED,
            "source" => Self::SOURCE,
            "target" => Self::TARGET,
            _ => return None,
        })
    }
}

impl std::ops::BitOr for Persistence {
    type Output = Persistence;
    fn bitor(self, rhs: Persistence) -> Persistence {
        Persistence(self.0 | rhs.0)
    }
}

/// How a dialogue is turned into text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DialogueFormat {
    /// YAML list of `{role, content}` with literal blocks that keep line breaks.
    Yaml,
    /// `[ROLE]: text` lines, a blank line between turns.
    Chat,
    /// A JSON array of the elements.
    Json,
    /// `Q:` / `A:` lines: user turns as questions, assistant turns as answers.
    QuestionAnswer,
}

impl DialogueFormat {
    /// Parses `yaml`, `chat`, `json` or `question_answer`.
    pub fn from_name(name: &str) -> Option<DialogueFormat> {
        Some(match name {
            "yaml" => Self::Yaml,
            "chat" => Self::Chat,
            "json" => Self::Json,
            "question_answer" => Self::QuestionAnswer,
            _ => return None,
        })
    }
}

/// The dialogue in `format`. An empty dialogue is `""` in every format.
pub fn format_dialogue(dialogue: &[DialogueElement], format: DialogueFormat) -> String {
    if dialogue.is_empty() {
        return String::new();
    }
    match format {
        DialogueFormat::Yaml => dialogue
            .iter()
            .map(|e| {
                let mut s = format!("- role: {}\n", e.actor.as_str());
                match e.actor_text.as_deref() {
                    None => s.push_str("  content: \"\""),
                    Some(text) => {
                        // A literal block with an explicit indentation
                        // indicator: line breaks, leading spaces and the
                        // absence of a final newline all survive parsing.
                        let chomp = if text.ends_with('\n') { "+" } else { "-" };
                        let _ = write!(s, "  content: |2{chomp}");
                        let body = text.strip_suffix('\n').unwrap_or(text);
                        for line in body.split('\n') {
                            if line.is_empty() {
                                s.push('\n');
                            } else {
                                let _ = write!(s, "\n    {line}");
                            }
                        }
                        if text.ends_with('\n') {
                            s.push('\n');
                        }
                    }
                }
                s
            })
            .collect::<Vec<_>>()
            .join("\n\n"),
        DialogueFormat::Chat => dialogue
            .iter()
            .map(|e| {
                format!(
                    "[{}]: {}\n",
                    e.actor.as_str().to_uppercase(),
                    e.actor_text.as_deref().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        DialogueFormat::Json => serde_json::to_string(dialogue).unwrap_or_default(),
        DialogueFormat::QuestionAnswer => dialogue
            .iter()
            .filter_map(|e| {
                let text = e.actor_text.as_deref()?;
                let tag = match e.actor {
                    Actor::User => "Q",
                    Actor::Assistant => "A",
                    Actor::System => "Context",
                };
                Some(format!("{tag}: {text}"))
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn el(actor: Actor, event: &str, text: Option<&str>) -> DialogueElement {
        DialogueElement {
            actor,
            event: event.to_owned(),
            actor_text: text.map(str::to_owned),
            timestamp: Timestamp::from_micros(1_767_225_600_000_000).unwrap(),
        }
    }

    fn sample() -> Vec<DialogueElement> {
        vec![
            el(Actor::Assistant, "init", Some("Welcome.\nAsk me anything.")),
            el(
                Actor::User,
                "user_input",
                Some("  indented\n\nwith a blank line"),
            ),
            el(Actor::User, "choose", None),
            el(Actor::Assistant, "advance", Some("ends with a newline\n")),
        ]
    }

    #[test]
    fn empty_dialogue_is_empty_in_every_format() {
        for f in [
            DialogueFormat::Yaml,
            DialogueFormat::Chat,
            DialogueFormat::Json,
            DialogueFormat::QuestionAnswer,
        ] {
            assert_eq!(format_dialogue(&[], f), "");
        }
    }

    #[test]
    fn yaml_format_keeps_line_breaks_when_parsed() {
        let text = format_dialogue(&sample(), DialogueFormat::Yaml);
        let parsed: Vec<serde_json::Value> = serde_norway::from_str(&text).unwrap();
        let contents: Vec<_> = parsed.iter().map(|v| v["content"].clone()).collect();
        assert_eq!(
            contents,
            vec![
                serde_json::json!("Welcome.\nAsk me anything."),
                serde_json::json!("  indented\n\nwith a blank line"),
                serde_json::json!(""),
                serde_json::json!("ends with a newline\n"),
            ]
        );
        assert_eq!(parsed[1]["role"], "user");
    }

    #[test]
    fn json_format_round_trips() {
        let text = format_dialogue(&sample(), DialogueFormat::Json);
        let back: Vec<DialogueElement> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, sample());
    }

    #[test]
    fn dialogue_formats_snapshot() {
        let d = sample();
        insta::assert_snapshot!("yaml", format_dialogue(&d, DialogueFormat::Yaml));
        insta::assert_snapshot!("chat", format_dialogue(&d, DialogueFormat::Chat));
        insta::assert_snapshot!("json", format_dialogue(&d, DialogueFormat::Json));
        insta::assert_snapshot!(
            "question_answer",
            format_dialogue(&d, DialogueFormat::QuestionAnswer)
        );
    }

    #[test]
    fn persistence_flags_keep_the_reference_values() {
        assert_eq!(Persistence::SOURCE_EVENT.bits(), 1);
        assert_eq!(Persistence::SOURCE_RAW.bits(), 2);
        assert_eq!(Persistence::TARGET_RAW.bits(), 4);
        assert_eq!(Persistence::TARGET_RENDERED.bits(), 8);
        assert_eq!(Persistence::SOURCE.bits(), 3);
        assert_eq!(Persistence::TARGET.bits(), 12);
        assert_eq!(Persistence::from_name("none"), Some(Persistence::NONE));
    }
}
