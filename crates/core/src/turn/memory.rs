//! Working-memory entries, their rendering, and the pure half of retrieval:
//! tokenization, token and vector ranking, reciprocal rank fusion.
//!
//! Both memory-store adapters rank with these functions, so they agree on
//! results: PostgreSQL only narrows the candidates with its full-text index.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::OwnerId;
use crate::Timestamp;

crate::id::uuid_id!(
    /// A stored memory entry.
    MemoryId
);

/// A fact about the owner: `[category] Subject PREDICATE object`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SemanticEntry {
    /// Grouping, e.g. `relationship`, `health`, `preference`.
    pub category: String,
    /// Who or what the fact is about, e.g. `User`.
    pub subject: String,
    /// The relation, e.g. `WORRIES_ABOUT`.
    pub predicate: String,
    /// The other end, e.g. `work`.
    pub object: String,
    /// The user's words the fact was taken from.
    #[serde(default)]
    pub evidence_quote: Option<String>,
}

/// A summary of an earlier session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EpisodicEntry {
    /// What the session was about.
    pub summary: String,
    /// Its themes, most important first; the first labels the rendering.
    #[serde(default)]
    pub primary_themes: Vec<String>,
    /// True when the session was a catch-up after a gap.
    #[serde(default)]
    pub is_catch_up: bool,
    /// The therapeutic approach used, if any.
    #[serde(default)]
    pub approach_used: Option<String>,
    /// Why that approach was used.
    #[serde(default)]
    pub approach_context: Option<String>,
}

/// A structured memory entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum MemoryEntry {
    /// A fact.
    Semantic(SemanticEntry),
    /// A session summary.
    Episodic(EpisodicEntry),
}

/// The two kinds of entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum MemoryKind {
    /// [`MemoryEntry::Semantic`].
    Semantic,
    /// [`MemoryEntry::Episodic`].
    Episodic,
}

impl MemoryKind {
    /// `semantic` or `episodic`.
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryKind::Semantic => "semantic",
            MemoryKind::Episodic => "episodic",
        }
    }
}

impl MemoryEntry {
    /// Which kind it is.
    pub fn kind(&self) -> MemoryKind {
        match self {
            MemoryEntry::Semantic(_) => MemoryKind::Semantic,
            MemoryEntry::Episodic(_) => MemoryKind::Episodic,
        }
    }

    /// The text token recall searches.
    pub fn search_text(&self) -> String {
        match self {
            MemoryEntry::Semantic(s) => format!(
                "{} {} {} {} {}",
                s.category,
                s.subject,
                s.predicate.replace('_', " "),
                s.object,
                s.evidence_quote.as_deref().unwrap_or("")
            ),
            MemoryEntry::Episodic(e) => format!(
                "{} {} {} {}",
                e.summary,
                e.primary_themes.join(" "),
                e.approach_used.as_deref().unwrap_or(""),
                e.approach_context.as_deref().unwrap_or("")
            ),
        }
    }

    /// Its search tokens (see [`tokenize`]).
    pub fn tokens(&self) -> Vec<String> {
        tokenize(&self.search_text())
    }

    /// The category (semantic) or first theme (episodic), for filters.
    pub fn category(&self) -> Option<&str> {
        match self {
            MemoryEntry::Semantic(s) => Some(&s.category),
            MemoryEntry::Episodic(e) => e.primary_themes.first().map(String::as_str),
        }
    }

    /// The subject (semantic only), for filters.
    pub fn subject(&self) -> Option<&str> {
        match self {
            MemoryEntry::Semantic(s) => Some(&s.subject),
            MemoryEntry::Episodic(_) => None,
        }
    }
}

/// An entry of the `working_memory` field: structured, or a plain string
/// kept from older checkpoints, which renders unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum WorkingMemoryEntry {
    /// A structured entry.
    Entry(MemoryEntry),
    /// A legacy pre-formatted line.
    Legacy(String),
}

impl From<MemoryEntry> for WorkingMemoryEntry {
    fn from(e: MemoryEntry) -> Self {
        WorkingMemoryEntry::Entry(e)
    }
}

/// One entry as a prompt line:
/// `[relationship] User WORRIES_ABOUT work — "my boss is terrible"` or
/// `Last session (grief): talked about loss after my dog died.`
pub fn format_working_memory_entry(entry: &WorkingMemoryEntry) -> String {
    match entry {
        WorkingMemoryEntry::Legacy(line) => line.clone(),
        WorkingMemoryEntry::Entry(MemoryEntry::Semantic(s)) => {
            let predicate = s.predicate.trim().to_uppercase().replace(' ', "_");
            let mut line = format!("[{}] {} {} {}", s.category, s.subject, predicate, s.object);
            if let Some(q) = s.evidence_quote.as_deref().filter(|q| !q.trim().is_empty()) {
                line.push_str(&format!(" — \"{}\"", q.trim()));
            }
            line
        }
        WorkingMemoryEntry::Entry(MemoryEntry::Episodic(e)) => {
            match e.primary_themes.first().filter(|t| !t.trim().is_empty()) {
                Some(theme) => format!("Last session ({}): {}", theme.trim(), e.summary.trim()),
                None => format!("Last session: {}", e.summary.trim()),
            }
        }
    }
}

/// Every entry, one line each, in order.
pub fn format_working_memory_entries(entries: &[WorkingMemoryEntry]) -> String {
    entries
        .iter()
        .map(format_working_memory_entry)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A stored entry with its owner, embedding and time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryRecord {
    /// Its id.
    pub id: MemoryId,
    /// Whose it is.
    pub owner: OwnerId,
    /// What it says.
    pub entry: MemoryEntry,
    /// Its embedding, when one was computed.
    pub embedding: Option<Vec<f32>>,
    /// When it was stored.
    pub at: Timestamp,
}

/// Which entries a filtered delete removes: all conditions must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryFilter {
    /// Only this kind.
    pub kind: Option<MemoryKind>,
    /// Only this category (semantic) or first theme (episodic).
    pub category: Option<String>,
    /// Only this subject (semantic).
    pub subject: Option<String>,
    /// Only entries stored before this time.
    pub before: Option<Timestamp>,
}

impl MemoryFilter {
    /// True when `record` passes the filter.
    pub fn matches(&self, record: &MemoryRecord) -> bool {
        self.kind.is_none_or(|k| record.entry.kind() == k)
            && self
                .category
                .as_deref()
                .is_none_or(|c| record.entry.category() == Some(c))
            && self
                .subject
                .as_deref()
                .is_none_or(|s| record.entry.subject() == Some(s))
            && self.before.is_none_or(|b| record.at < b)
    }
}

/// Procedural memory: how the owner wants to be answered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProceduralProfile {
    /// Style directives applied to every reply.
    pub procedural_rules: Vec<String>,
    /// Whether the agent may bring up recalled content on its own.
    pub proactive_recall_enabled: bool,
}

/// Which retrieval path ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetrievalPath {
    /// Token recall fused with embedding similarity.
    HybridRrf,
    /// Token recall alone: no embedding provider.
    TokenRecall,
    /// Token recall alone: the embedding provider failed.
    TokenRecallAfterEmbedError,
}

impl RetrievalPath {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RetrievalPath::HybridRrf => "hybrid_rrf",
            RetrievalPath::TokenRecall => "token_recall",
            RetrievalPath::TokenRecallAfterEmbedError => "token_recall_after_embed_error",
        }
    }
}

/// One retrieved entry with its fused (or token) score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryHit {
    /// The entry.
    pub record: MemoryRecord,
    /// Higher is better; comparable only within one retrieval.
    pub score: f64,
}

/// What a retrieval returns: the best entries first, and the path taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Retrieved {
    /// At most `k` hits, best first.
    pub hits: Vec<MemoryHit>,
    /// Which path ran.
    pub path: RetrievalPath,
}

/// The reciprocal-rank-fusion constant: a rank-`r` result scores `1/(RRF_K + r)`.
pub const RRF_K: f64 = 60.0;

/// How many token-recall candidates an adapter fetches before ranking.
pub const RETRIEVE_CANDIDATES: usize = 200;

/// Lowercased runs of letters and digits, in order (duplicates kept).
pub fn tokenize(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Newer first, then by id: the tie-break every ranking uses.
fn recency(a: &MemoryRecord, b: &MemoryRecord) -> Ordering {
    b.at.cmp(&a.at).then(a.id.cmp(&b.id))
}

/// Token recall ranking: records sharing at least one token with `query`,
/// by how many distinct query tokens they contain, then by how often, then
/// newest first.
pub fn rank_by_tokens<'r>(
    query: &str,
    records: &'r [MemoryRecord],
) -> Vec<(&'r MemoryRecord, f64)> {
    let mut q = tokenize(query);
    q.sort();
    q.dedup();
    let mut scored: Vec<(&MemoryRecord, usize, usize)> = records
        .iter()
        .filter_map(|r| {
            let tokens = r.entry.tokens();
            let distinct = q.iter().filter(|t| tokens.contains(t)).count();
            let total = tokens.iter().filter(|t| q.contains(t)).count();
            (distinct > 0).then_some((r, distinct, total))
        })
        .collect();
    scored.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then(b.2.cmp(&a.2))
            .then_with(|| recency(a.0, b.0))
    });
    scored
        .into_iter()
        .map(|(r, d, t)| (r, d as f64 + t as f64 / 1000.0))
        .collect()
}

/// Cosine similarity; 0 for mismatched lengths or a zero vector.
pub fn cosine_similarity(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() || a.is_empty() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na.sqrt() * nb.sqrt())
    }
}

/// Vector ranking: records with an embedding of the query's length, by
/// cosine similarity, then newest first.
pub fn rank_by_vector<'r>(
    query: &[f32],
    records: &'r [MemoryRecord],
) -> Vec<(&'r MemoryRecord, f64)> {
    let mut scored: Vec<(&MemoryRecord, f64)> = records
        .iter()
        .filter_map(|r| {
            let e = r.embedding.as_deref()?;
            (e.len() == query.len()).then(|| (r, cosine_similarity(query, e)))
        })
        .collect();
    scored.sort_by(|a, b| {
        b.1.partial_cmp(&a.1)
            .unwrap_or(Ordering::Equal)
            .then_with(|| recency(a.0, b.0))
    });
    scored
}

/// Reciprocal rank fusion of rankings (each best first): every id scores
/// the sum of `1/(RRF_K + rank)` over the rankings it appears in (rank from
/// 1). Ties go to the id ranked best in the earliest ranking.
pub fn reciprocal_rank_fusion<T: Ord + Clone>(rankings: &[Vec<T>]) -> Vec<(T, f64)> {
    let mut scores: BTreeMap<T, (f64, (usize, usize))> = BTreeMap::new();
    for (which, ranking) in rankings.iter().enumerate() {
        for (i, id) in ranking.iter().enumerate() {
            let e = scores
                .entry(id.clone())
                .or_insert((0.0, (usize::MAX, usize::MAX)));
            e.0 += 1.0 / (RRF_K + (i + 1) as f64);
            e.1 = e.1.min((which, i));
        }
    }
    let mut fused: Vec<(T, f64, (usize, usize))> = scores
        .into_iter()
        .map(|(id, (s, first))| (id, s, first))
        .collect();
    fused.sort_by(|a, b| {
        b.1.partial_cmp(&a.1)
            .unwrap_or(Ordering::Equal)
            .then(a.2.cmp(&b.2))
    });
    fused.into_iter().map(|(id, s, _)| (id, s)).collect()
}

/// The embedding side of a retrieval, as the caller computed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QueryEmbedding<'a> {
    /// No embedding provider is configured.
    Absent,
    /// The provider was asked and failed.
    Failed,
    /// The query's embedding.
    Vector(&'a [f32]),
}

/// Ranks `candidates` for `query` and keeps the best `k`: token recall
/// alone, or fused with vector similarity by reciprocal rank fusion when the
/// query has an embedding. The path taken is reported.
pub fn retrieve_from(
    candidates: &[MemoryRecord],
    query: &str,
    k: usize,
    embedding: QueryEmbedding<'_>,
) -> Retrieved {
    let tokens = rank_by_tokens(query, candidates);
    match embedding {
        QueryEmbedding::Vector(v) => {
            let vector = rank_by_vector(v, candidates);
            let fused = reciprocal_rank_fusion(&[
                tokens.iter().map(|(r, _)| r.id).collect(),
                vector.iter().map(|(r, _)| r.id).collect(),
            ]);
            let by_id: BTreeMap<MemoryId, &MemoryRecord> =
                candidates.iter().map(|r| (r.id, r)).collect();
            Retrieved {
                hits: fused
                    .into_iter()
                    .take(k)
                    .filter_map(|(id, score)| {
                        by_id.get(&id).map(|r| MemoryHit {
                            record: (*r).clone(),
                            score,
                        })
                    })
                    .collect(),
                path: RetrievalPath::HybridRrf,
            }
        }
        other => Retrieved {
            hits: tokens
                .into_iter()
                .take(k)
                .map(|(r, score)| MemoryHit {
                    record: r.clone(),
                    score,
                })
                .collect(),
            path: if other == QueryEmbedding::Failed {
                RetrievalPath::TokenRecallAfterEmbedError
            } else {
                RetrievalPath::TokenRecall
            },
        },
    }
}
