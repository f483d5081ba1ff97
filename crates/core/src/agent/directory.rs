//! The operator's data: the crisis resource directory (verified hotlines by
//! region) and the knowledge base (vetted answers). The agent never invents
//! either: a resource or an answer is shown only when it is in these files.

use serde::{Deserialize, Serialize};

use super::{find_phrase, has_phrase, normalize};
use crate::turn::seed::Resource;
use crate::turn::tokenize;

/// Why an operator file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DirectoryError {
    /// Not the expected JSON.
    #[error("invalid {what}: {message}")]
    Invalid {
        /// Which file kind.
        what: &'static str,
        /// The parser's complaint.
        message: String,
    },
    /// An entry misses a required value.
    #[error("{what} entry {index} has an empty {field}")]
    Empty {
        /// Which file kind.
        what: &'static str,
        /// The entry's position (from 0).
        index: usize,
        /// The empty field.
        field: &'static str,
    },
}

/// One verified resource as the operator lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectoryEntry {
    /// Its name.
    pub name: String,
    /// Its phone number (or text line).
    pub phone: String,
    /// Its website.
    #[serde(default)]
    pub website: String,
    /// The region it serves, as users may name it (e.g. `United Kingdom`).
    pub region: String,
    /// Other names of the region (e.g. `UK`, `England`).
    #[serde(default)]
    pub aliases: Vec<String>,
}

/// The operator's crisis resource directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceDirectory {
    /// What the file is (e.g. that it is an example, not complete).
    #[serde(default)]
    pub note: Option<String>,
    /// The resources.
    #[serde(default)]
    pub resources: Vec<DirectoryEntry>,
}

/// Where the user is, as far as the conversation says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A region named by the user.
    Known(String),
    /// The user declined to say.
    Refused,
    /// Nothing said.
    Unknown,
}

const REFUSALS: &[&str] = &[
    "rather not say where",
    "rather not say",
    "wont say where",
    "not telling you where",
    "dont want to say where",
    "prefer not to say",
    "none of your business",
];

const LOCATION_LEADS: &[&str] = &[
    "im in ",
    "i am in ",
    "i live in ",
    "im from ",
    "i am from ",
    "living in ",
];

impl ResourceDirectory {
    /// Parses and checks the directory file.
    ///
    /// # Errors
    ///
    /// When the JSON does not parse or an entry has an empty name, phone or
    /// region.
    pub fn from_json(text: &str) -> Result<Self, DirectoryError> {
        let dir: Self = serde_json::from_str(text).map_err(|e| DirectoryError::Invalid {
            what: "resource directory",
            message: e.to_string(),
        })?;
        for (index, e) in dir.resources.iter().enumerate() {
            for (field, value) in [
                ("name", &e.name),
                ("phone", &e.phone),
                ("region", &e.region),
            ] {
                if value.trim().is_empty() {
                    return Err(DirectoryError::Empty {
                        what: "resource directory",
                        index,
                        field,
                    });
                }
            }
        }
        Ok(dir)
    }

    /// Where the user is, from `texts` (newest first): a refusal, a region
    /// the directory knows (by name or alias), or a place after "I'm in",
    /// "I live in" and the like.
    pub fn infer_location<'t>(&self, texts: impl IntoIterator<Item = &'t str>) -> Location {
        for text in texts {
            if find_phrase(text, REFUSALS).is_some() {
                return Location::Refused;
            }
            let n = normalize(text);
            for e in &self.resources {
                if has_phrase(&n, &e.region) || e.aliases.iter().any(|a| has_phrase(&n, a)) {
                    return Location::Known(e.region.clone());
                }
            }
            if let Some(place) = place_after_lead(&n) {
                return Location::Known(place);
            }
        }
        Location::Unknown
    }

    /// The resources serving `region` (by name or alias, case-insensitive),
    /// in file order.
    pub fn lookup(&self, region: &str) -> Vec<Resource> {
        let want = normalize(region);
        self.resources
            .iter()
            .filter(|e| {
                normalize(&e.region) == want || e.aliases.iter().any(|a| normalize(a) == want)
            })
            .map(|e| Resource {
                name: e.name.clone(),
                phone: e.phone.clone(),
                website: e.website.clone(),
                region: e.region.clone(),
            })
            .collect()
    }
}

/// The words after "I'm in" (up to three, stopping at a common word).
fn place_after_lead(normalized: &str) -> Option<String> {
    const STOP: &[&str] = &[
        "and", "but", "so", "right", "now", "at", "the", "a", "with", "because", "pain", "trouble",
        "love", "danger", "bed", "my",
    ];
    for lead in LOCATION_LEADS {
        if let Some(i) = normalized.find(&format!(" {lead}")) {
            let rest = &normalized[i + lead.len() + 1..];
            let words: Vec<&str> = rest
                .split_whitespace()
                .take_while(|w| !STOP.contains(w))
                .take(3)
                .collect();
            if !words.is_empty() {
                return Some(
                    words
                        .iter()
                        .map(|w| {
                            let mut c = w.chars();
                            c.next().map_or_else(String::new, |f| {
                                f.to_uppercase().collect::<String>() + c.as_str()
                            })
                        })
                        .collect::<Vec<_>>()
                        .join(" "),
                );
            }
        }
    }
    None
}

/// `resource_lookup_status` for a crisis turn: `found`, `no_location`,
/// `location_refused` or `no_verified_results`.
pub fn lookup_status(location: &Location, found: &[Resource]) -> &'static str {
    match location {
        Location::Known(_) if !found.is_empty() => "found",
        Location::Known(_) => "no_verified_results",
        Location::Refused => "location_refused",
        Location::Unknown => "no_location",
    }
}

/// The crisis reply: care, the universal advice to contact local emergency
/// services, then only the directory's resources for the location (or a
/// request for the location, or a plain statement that none is verified).
pub fn crisis_reply(location: &Location, found: &[Resource]) -> String {
    let mut out =
        String::from("I'm really glad you told me, and I'm concerned about your safety. ");
    out.push_str(super::crisis::UNIVERSAL_ADVICE);
    match location {
        Location::Known(_) if !found.is_empty() => {
            out.push_str("\nYou can also reach, any time:");
            for r in found {
                out.push_str(&format!("\n- {} ({}): {}", r.name, r.region, r.phone));
                if !r.website.is_empty() {
                    out.push_str(&format!(", {}", r.website));
                }
            }
        }
        Location::Known(place) => out.push_str(&format!(
            "\nI don't have a verified crisis line for {place}, so I won't guess one; \
             your local emergency number is the surest way to get help now."
        )),
        Location::Refused => out.push_str(
            "\nThat's okay, you don't have to tell me where you are. If you change your mind, \
             I can share a crisis line for your region.",
        ),
        Location::Unknown => out.push_str(
            "\nIf you tell me which country or region you're in, I can share a crisis line there.",
        ),
    }
    out.push_str("\nYou don't have to go through this alone. Are you safe right now?");
    out
}

/// One vetted answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KnowledgeEntry {
    /// A stable id.
    pub id: String,
    /// The question it answers.
    pub question: String,
    /// The answer, shown verbatim.
    pub answer: String,
    /// More words it should match.
    #[serde(default)]
    pub keywords: Vec<String>,
    /// Where the answer comes from.
    #[serde(default)]
    pub source: Option<String>,
}

/// The operator's knowledge base.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KnowledgeBase {
    /// What the file is.
    #[serde(default)]
    pub note: Option<String>,
    /// The answers.
    #[serde(default)]
    pub entries: Vec<KnowledgeEntry>,
}

const STOPWORDS: &[&str] = &[
    "a", "an", "the", "is", "are", "was", "were", "be", "what", "whats", "how", "do", "does",
    "did", "can", "could", "you", "tell", "me", "about", "of", "to", "in", "on", "for", "and",
    "or", "it", "its", "this", "that", "why", "when", "where", "who", "which", "there", "any",
    "with", "please", "i", "my", "should", "would", "will", "explain", "mean", "means", "work",
    "works",
];

fn content_tokens(text: &str) -> Vec<String> {
    let mut t: Vec<String> = tokenize(text)
        .into_iter()
        .filter(|w| !STOPWORDS.contains(&w.as_str()))
        .collect();
    t.sort();
    t.dedup();
    t
}

impl KnowledgeBase {
    /// Parses and checks the knowledge-base file.
    ///
    /// # Errors
    ///
    /// When the JSON does not parse or an entry has an empty id, question or
    /// answer.
    pub fn from_json(text: &str) -> Result<Self, DirectoryError> {
        let kb: Self = serde_json::from_str(text).map_err(|e| DirectoryError::Invalid {
            what: "knowledge base",
            message: e.to_string(),
        })?;
        for (index, e) in kb.entries.iter().enumerate() {
            for (field, value) in [
                ("id", &e.id),
                ("question", &e.question),
                ("answer", &e.answer),
            ] {
                if value.trim().is_empty() {
                    return Err(DirectoryError::Empty {
                        what: "knowledge base",
                        index,
                        field,
                    });
                }
            }
        }
        Ok(kb)
    }

    /// The entry answering `query`: the one sharing the most content words
    /// with it (question and keywords), provided it covers at least half of
    /// the query's content words; ties go to the earlier entry.
    pub fn lookup(&self, query: &str) -> Option<&KnowledgeEntry> {
        let q = content_tokens(query);
        if q.is_empty() {
            return None;
        }
        let mut best: Option<(&KnowledgeEntry, usize)> = None;
        for e in &self.entries {
            let words = content_tokens(&format!("{} {}", e.question, e.keywords.join(" ")));
            let shared = q.iter().filter(|t| words.contains(t)).count();
            if shared > 0 && shared * 2 >= q.len() && best.is_none_or(|(_, s)| shared > s) {
                best = Some((e, shared));
            }
        }
        best.map(|(e, _)| e)
    }
}

/// The grounded reply: the vetted answer (with its source), or a plain
/// statement that there is none.
pub fn grounded_reply(entry: Option<&KnowledgeEntry>) -> (String, &'static str) {
    match entry {
        Some(e) => {
            let mut text = e.answer.trim().to_owned();
            if let Some(s) = e.source.as_deref().filter(|s| !s.trim().is_empty()) {
                text.push_str(&format!(" (Source: {})", s.trim()));
            }
            (text, "answered")
        }
        None => (
            "I don't have a verified answer to that in my knowledge base, so I'd rather not guess. \
             A qualified professional or an official health service can answer it reliably."
                .to_owned(),
            "no_verified_answer",
        ),
    }
}
