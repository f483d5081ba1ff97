//! The crisis gate's pure half: a conservative keyword classifier, the JSON
//! shape the model classifier answers in, and how the two are combined.
//!
//! The model decides first. Its answer is made consistent (level 2 or more
//! always needs the crisis response; level 1 without it always asks), and
//! the keyword classifier may only raise it, never lower it. When the model
//! fails or answers malformed JSON, the keyword classifier decides alone.
//! When in doubt the gate asks (`needs_clarification`) rather than ignores.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{find_phrase, normalize};
use crate::turn::seed::{CrisisAssessment, CrisisAudit};

/// `crisis_audit.classifier_path` when the model decided.
pub const PATH_LLM: &str = "llm_primary";
/// `crisis_audit.classifier_path` when the model failed and keywords decided.
pub const PATH_KEYWORD: &str = "keyword_fallback";
/// `crisis_audit.override_kind` when keywords raised the model's level.
pub const OVERRIDE_KEYWORD: &str = "keyword_escalation";
/// `crisis_audit.override_kind` when the model's flags contradicted its level.
pub const OVERRIDE_CONSISTENCY: &str = "consistency";

/// Words of intent to die or to self-harm: level 2, crisis response.
pub const INTENT_PHRASES: &[&str] = &[
    "kill myself",
    "killing myself",
    "end my life",
    "ending my life",
    "take my own life",
    "take my life",
    "suicide",
    "suicidal",
    "want to die",
    "wanna die",
    "dont want to be alive",
    "dont want to live",
    "better off dead",
    "hurt myself",
    "hurting myself",
    "harm myself",
    "self harm",
    "cut myself",
    "cutting myself",
    "overdose",
    "end it all",
    "not wake up",
];

/// Words of a plan, means or time: with intent, level 3.
pub const IMMINENT_PHRASES: &[&str] = &[
    "tonight",
    "right now",
    "today",
    "pills",
    "rope",
    "gun",
    "bridge",
    "a plan",
    "my plan",
    "wrote a note",
    "goodbye",
];

/// Words that may or may not mean risk: level 1, ask.
pub const AMBIGUOUS_PHRASES: &[&str] = &[
    "cant go on",
    "cant do this anymore",
    "cant take it anymore",
    "cant take this anymore",
    "no point",
    "whats the point",
    "hopeless",
    "give up on everything",
    "disappear",
    "not be here",
    "not being here",
    "no way out",
    "nothing matters",
    "tired of living",
    "a burden",
    "everyone would be better off",
];

/// Negations that turn intent into something to ask about.
const NEGATIONS: &[&str] = &[
    "not going to",
    "never going to",
    "would never",
    "wouldnt",
    "im not suicidal",
    "not suicidal",
    "never would",
];

/// What the keyword classifier found.
#[derive(Debug, Clone, PartialEq)]
pub struct KeywordFinding {
    /// The assessment.
    pub assessment: CrisisAssessment,
    /// The phrase that decided, if any.
    pub matched: Option<&'static str>,
}

/// The conservative keyword classifier: intent is level 2 (3 with a plan,
/// means or time) and needs the crisis response; negated intent and
/// ambiguous despair are level 1 and ask; nothing found is level 0.
pub fn keyword_assessment(message: &str) -> KeywordFinding {
    let n = normalize(message);
    let intent = find_phrase(message, INTENT_PHRASES);
    let negated = NEGATIONS.iter().any(|p| super::has_phrase(&n, p));
    if let Some(phrase) = intent {
        if negated {
            return KeywordFinding {
                assessment: CrisisAssessment {
                    level: 1,
                    confidence: 0.5,
                    reason: format!("keyword: \"{phrase}\" with a negation; asking to be sure"),
                    needs_crisis_response: false,
                    needs_clarification: true,
                },
                matched: Some(phrase),
            };
        }
        let imminent = find_phrase(message, IMMINENT_PHRASES);
        let level = if imminent.is_some() { 3 } else { 2 };
        return KeywordFinding {
            assessment: CrisisAssessment {
                level,
                confidence: 0.8,
                reason: match imminent {
                    Some(i) => format!("keyword: \"{phrase}\" with \"{i}\""),
                    None => format!("keyword: \"{phrase}\""),
                },
                needs_crisis_response: true,
                needs_clarification: false,
            },
            matched: Some(phrase),
        };
    }
    if let Some(phrase) = find_phrase(message, AMBIGUOUS_PHRASES) {
        return KeywordFinding {
            assessment: CrisisAssessment {
                level: 1,
                confidence: 0.5,
                reason: format!("keyword: \"{phrase}\" may signal risk; asking"),
                needs_crisis_response: false,
                needs_clarification: true,
            },
            matched: Some(phrase),
        };
    }
    KeywordFinding {
        assessment: CrisisAssessment {
            level: 0,
            confidence: 0.6,
            reason: "keyword: no risk phrase found".to_owned(),
            needs_crisis_response: false,
            needs_clarification: false,
        },
        matched: None,
    }
}

/// The model classifier's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmAssessment {
    /// 0 (none) to 3 (imminent).
    pub level: u8,
    /// 0 to 1.
    pub confidence: f64,
    /// Why.
    pub reason: String,
    /// Whether the crisis response must answer.
    pub needs_crisis_response: bool,
    /// Whether to ask before deciding.
    pub needs_clarification: bool,
}

/// The JSON schema the model classifier answers with. Its first enum values
/// and lowest numbers are the conservative ones a schema-filling fallback
/// picks; the keyword classifier still raises them.
pub fn llm_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "level": {"type": "integer", "minimum": 0, "maximum": 3},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "reason": {"type": "string"},
            "needs_crisis_response": {"type": "boolean"},
            "needs_clarification": {"type": "boolean"}
        },
        "required": ["level", "confidence", "reason", "needs_crisis_response", "needs_clarification"],
        "additionalProperties": false
    })
}

/// The model classifier's instructions.
pub const LLM_PROMPT: &str = "You assess risk of suicide or self-harm in the user's latest message, \
in the context of the recent conversation. Answer only JSON with: level (0 none, 1 possible risk, \
2 clear risk, 3 imminent risk), confidence (0 to 1), reason (one sentence), needs_crisis_response \
(true for level 2 or 3), needs_clarification (true when unsure whether there is risk). When in \
doubt, ask rather than ignore.";

/// The gate's decision: the assessment and its provenance. `llm` is `None`
/// when the model failed or answered malformed JSON.
pub fn decide(
    llm: Option<LlmAssessment>,
    keyword: &KeywordFinding,
) -> (CrisisAssessment, CrisisAudit) {
    let Some(llm) = llm else {
        return (
            keyword.assessment.clone(),
            CrisisAudit {
                override_kind: None,
                classifier_path: PATH_KEYWORD.to_owned(),
                llm_failure_occurred: true,
            },
        );
    };
    let mut a = CrisisAssessment {
        level: llm.level.min(3),
        confidence: llm.confidence.clamp(0.0, 1.0),
        reason: llm.reason,
        needs_crisis_response: llm.needs_crisis_response,
        needs_clarification: llm.needs_clarification,
    };
    let mut override_kind = None;
    if a.needs_crisis_response && a.level < 2 {
        a.level = 2;
        override_kind = Some(OVERRIDE_CONSISTENCY);
    }
    if a.level >= 2 && !a.needs_crisis_response {
        a.needs_crisis_response = true;
        a.needs_clarification = false;
        override_kind = Some(OVERRIDE_CONSISTENCY);
    }
    if a.level == 1 && !a.needs_clarification {
        a.needs_clarification = true;
        override_kind = Some(OVERRIDE_CONSISTENCY);
    }
    if a.needs_crisis_response {
        a.needs_clarification = false;
    }
    let k = &keyword.assessment;
    let raises = k.level > a.level || (k.needs_crisis_response && !a.needs_crisis_response);
    if raises {
        a = CrisisAssessment {
            reason: format!("{} (model said level {}: {})", k.reason, a.level, a.reason),
            ..k.clone()
        };
        override_kind = Some(OVERRIDE_KEYWORD);
    }
    (
        a,
        CrisisAudit {
            override_kind: override_kind.map(str::to_owned),
            classifier_path: PATH_LLM.to_owned(),
            llm_failure_occurred: false,
        },
    )
}

/// What everyone is told in a crisis, whatever else is known.
pub const UNIVERSAL_ADVICE: &str = "If you are in immediate danger or might act on these thoughts, \
please contact your local emergency services now.";

/// What a level-1 assessment asks, without the model.
pub const SAFETY_CHECK: &str = "I want to make sure I understand you. When you say that, are you \
having thoughts of hurting yourself or of ending your life? Whatever the answer, I'm here to listen.";
