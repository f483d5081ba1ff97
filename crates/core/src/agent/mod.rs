//! The reference support agent's pure decisions: the keyword crisis
//! classifier and how it is combined with the model's assessment, turn
//! triage, memory-control commands and their confirmation, the 5-4-3-2-1
//! grounding exercise, and lookups in the operator's resource directory and
//! knowledge base. No I/O: the app's stages call these with what they read.

pub mod crisis;
pub mod directory;
pub mod exercise;
pub mod triage;

#[cfg(test)]
mod tests;

/// Lowercased words of `text`, apostrophes dropped (`can't` is `cant`),
/// joined by single spaces and padded with one space each side, so a phrase
/// prepared the same way matches only whole words.
pub fn normalize(text: &str) -> String {
    let cleaned: String = text
        .chars()
        .filter(|c| *c != '\'' && *c != '\u{2019}')
        .map(|c| {
            if c.is_alphanumeric() {
                c.to_lowercase().next().unwrap_or(c)
            } else {
                ' '
            }
        })
        .collect();
    let words: Vec<&str> = cleaned.split_whitespace().collect();
    format!(" {} ", words.join(" "))
}

/// True when the normalized `haystack` holds `phrase` as whole words.
pub fn has_phrase(haystack: &str, phrase: &str) -> bool {
    let p = normalize(phrase);
    !p.trim().is_empty() && haystack.contains(&p)
}

/// The first of `phrases` found in `text` (as whole words), if any.
pub fn find_phrase<'p>(text: &str, phrases: &[&'p str]) -> Option<&'p str> {
    let n = normalize(text);
    phrases.iter().copied().find(|p| has_phrase(&n, p))
}
