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
    /// YAML list of `{role, content}` laid out as the reference's (ending in
    /// a newline), with literal blocks that keep line breaks.
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

/// One element of the `yaml` format, laid out as the reference writes it
/// (`- role: <actor>`, `  content:`, the text's lines indented by four
/// spaces, a final newline; elements are joined by a blank line), except
/// that the block is literal (`|`), not folded (`>`), so a YAML parser reads
/// back the text with its line breaks. A text a literal block cannot carry
/// (one ending in a blank line, or holding a carriage return or a character
/// YAML does not print) is written as a double-quoted scalar instead; no
/// text (or an empty one) is the reference's empty folded block.
fn yaml_element(actor: Actor, text: Option<&str>) -> String {
    let mut s = format!("- role: {}\n  content: ", actor.as_str());
    let text = text.unwrap_or("");
    if text.is_empty() {
        s.push_str(">\n\n");
        return s;
    }
    // A final line break is the block's own (chomping `clip`); without one
    // the block strips it (`-`).
    let (body, chomp) = match text.strip_suffix('\n') {
        Some(body) => (body, ""),
        None => (text, "-"),
    };
    if body.is_empty() || body.ends_with('\n') || !text.chars().all(yaml_block_char) {
        let _ = writeln!(s, "{}", yaml_quoted(text));
        return s;
    }
    // The explicit indentation indicator keeps leading spaces of the first
    // line as text.
    let _ = writeln!(s, "|2{chomp}");
    for line in body.split('\n') {
        let _ = writeln!(s, "    {line}");
    }
    s
}

/// Whether a literal block keeps `c` as it is: printable characters, tab
/// and line feed (not the other characters YAML reads as line breaks).
fn yaml_block_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | ' '..='~')
        || (c >= '\u{a0}'
            && !matches!(
                c,
                '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}'
            ))
}

/// `text` as a YAML double-quoted scalar: characters a literal block would
/// not keep are escaped.
fn yaml_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if yaml_block_char(c) => out.push(c),
            c => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
        }
    }
    out.push('"');
    out
}

/// The dialogue in `format`. An empty dialogue is `""` in every format.
pub fn format_dialogue(dialogue: &[DialogueElement], format: DialogueFormat) -> String {
    if dialogue.is_empty() {
        return String::new();
    }
    match format {
        DialogueFormat::Yaml => dialogue
            .iter()
            .map(|e| yaml_element(e.actor, e.actor_text.as_deref()))
            .collect::<Vec<_>>()
            .join("\n"),
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
        DialogueFormat::Json => serde_json::to_value(dialogue)
            .map(|v| super::pyjson::dumps(&v))
            .unwrap_or_default(),
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
    use proptest::strategy::Strategy as _;

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

    /// The `content` of each element of a `yaml` dialogue, as a YAML parser
    /// reads it.
    fn parsed_contents(text: &str) -> Vec<serde_json::Value> {
        let parsed: Vec<serde_json::Value> = serde_norway::from_str(text).unwrap();
        parsed.iter().map(|v| v["content"].clone()).collect()
    }

    #[test]
    fn yaml_format_keeps_line_breaks_when_parsed() {
        let text = format_dialogue(&sample(), DialogueFormat::Yaml);
        assert_eq!(
            parsed_contents(&text),
            vec![
                serde_json::json!("Welcome.\nAsk me anything."),
                serde_json::json!("  indented\n\nwith a blank line"),
                serde_json::json!(""),
                serde_json::json!("ends with a newline\n"),
            ]
        );
        let parsed: Vec<serde_json::Value> = serde_norway::from_str(&text).unwrap();
        assert_eq!(parsed[1]["role"], "user");
    }

    #[test]
    fn yaml_format_ends_with_a_newline_like_the_reference() {
        // What the reference's format writes for the same elements, but for
        // the block style (`>` there, `|2-` here).
        let d = [
            el(Actor::Assistant, "init", Some("Hello.\nHow can I help?")),
            el(Actor::User, "user_input", Some("a question")),
        ];
        assert_eq!(
            format_dialogue(&d, DialogueFormat::Yaml),
            "- role: assistant\n  content: |2-\n    Hello.\n    How can I help?\n\n\
             - role: user\n  content: |2-\n    a question\n"
        );
        // No text is the reference's empty folded block.
        assert_eq!(
            format_dialogue(&[el(Actor::User, "choose", None)], DialogueFormat::Yaml),
            "- role: user\n  content: >\n\n"
        );
    }

    #[test]
    fn yaml_format_carries_texts_a_literal_block_cannot() {
        let texts = [
            "ends in a blank line\n\n",
            "\n",
            "\n\n\nthree leading breaks",
            "windows\r\nline",
            "next line\u{85}and separators\u{2028}\u{2029}",
            "a bom \u{feff} and \u{7f} and \u{0}",
            "tab\tand \"quotes\" and \\ and 😀 and é",
            "   ",
            "last line of spaces\n   ",
            "- not a list\n# not a comment\n---\n...",
        ];
        let d: Vec<_> = texts
            .iter()
            .map(|t| el(Actor::User, "user_input", Some(t)))
            .collect();
        let text = format_dialogue(&d, DialogueFormat::Yaml);
        assert!(text.ends_with('\n'));
        let want: Vec<_> = texts.iter().map(|t| serde_json::json!(t)).collect();
        assert_eq!(parsed_contents(&text), want, "{text}");
    }

    proptest::proptest! {
        #[test]
        fn yaml_format_reads_back_every_text(
            texts in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::sample::select(vec![
                        "a", " ", "\n", "\t", "\r", ":", "#", "-", "|", ">", "\"", "'", "\\",
                        "é", "😀", "\u{85}", "\u{2028}", "\u{0}", "\u{7f}", "\u{feff}", "---",
                    ]),
                    0..12,
                )
                .prop_map(|parts| parts.concat()),
                1..4,
            )
        ) {
            let d: Vec<_> = texts
                .iter()
                .map(|t| el(Actor::Assistant, "advance", Some(t)))
                .collect();
            let text = format_dialogue(&d, DialogueFormat::Yaml);
            let want: Vec<_> = texts.iter().map(|t| serde_json::json!(t)).collect();
            proptest::prop_assert_eq!(parsed_contents(&text), want, "{}", text);
        }
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
