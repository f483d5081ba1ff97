//! The offline embedder: feature hashing of normalized tokens (and their
//! character trigrams) into a fixed dimension, L2-normalized. Deterministic,
//! no model, no network: similar wording gives similar vectors, which is
//! enough for hybrid retrieval to work offline.

use async_trait::async_trait;
use parlance_ports::{EmbeddingProvider, Embeddings, LlmResult, Usage};

/// The default vector length.
pub const DEFAULT_DIMENSION: usize = 256;

/// Weight of a whole token; each of its character trigrams weighs less, so
/// shared words dominate and shared stems still count.
const TOKEN_WEIGHT: f32 = 1.0;
const TRIGRAM_WEIGHT: f32 = 0.35;

/// The feature-hashing embedder.
#[derive(Debug, Clone)]
pub struct HashingEmbedder {
    dimension: usize,
    model: String,
}

impl Default for HashingEmbedder {
    fn default() -> Self {
        Self::new(DEFAULT_DIMENSION)
    }
}

impl HashingEmbedder {
    /// An embedder of `dimension` (at least 1).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use parlance_memory::HashingEmbedder;
    /// use parlance_ports::{EmbeddingProvider, cosine};
    ///
    /// let embedder = HashingEmbedder::new(64);
    /// assert_eq!(embedder.model(), "feature-hash-64");
    /// let texts = ["export a report", "exporting reports", "change my password"].map(String::from);
    /// let out = embedder.embed(&texts).await?;
    /// assert_eq!(out.dimension, 64);
    /// let (a, b, c) = (&out.vectors[0], &out.vectors[1], &out.vectors[2]);
    /// assert!(cosine(a, b) > cosine(a, c));
    /// assert_eq!(embedder.vector("export a report"), *a);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(dimension: usize) -> Self {
        let dimension = dimension.max(1);
        Self {
            dimension,
            model: format!("feature-hash-{dimension}"),
        }
    }

    /// The vector of one text: all zeros when it has no token.
    pub fn vector(&self, text: &str) -> Vec<f32> {
        let mut v = vec![0.0f32; self.dimension];
        for token in tokens(text) {
            self.add(&mut v, token.as_bytes(), TOKEN_WEIGHT);
            let padded: Vec<char> = format!("^{token}$").chars().collect();
            if padded.len() > 5 {
                for w in padded.windows(3) {
                    let gram: String = w.iter().collect();
                    self.add(&mut v, gram.as_bytes(), TRIGRAM_WEIGHT);
                }
            }
        }
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 {
            for x in &mut v {
                *x /= norm;
            }
        }
        v
    }

    fn add(&self, v: &mut [f32], feature: &[u8], weight: f32) {
        let h = fnv1a(feature);
        let index = (h % self.dimension as u64) as usize;
        // The top bit picks the sign, so unrelated collisions cancel out on average.
        let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
        v[index] += sign * weight;
    }
}

/// Lowercased runs of letters and digits.
pub(crate) fn tokens(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
}

/// 64-bit FNV-1a: stable across runs, platforms and releases.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[async_trait]
impl EmbeddingProvider for HashingEmbedder {
    fn model(&self) -> &str {
        &self.model
    }

    fn dimension(&self) -> Option<usize> {
        Some(self.dimension)
    }

    async fn embed(&self, texts: &[String]) -> LlmResult<Embeddings> {
        let count = texts.iter().map(|t| tokens(t).count()).fold(0u32, |a, n| {
            a.saturating_add(u32::try_from(n).unwrap_or(u32::MAX))
        });
        Ok(Embeddings {
            model: self.model.clone(),
            dimension: self.dimension,
            vectors: texts.iter().map(|t| self.vector(t)).collect(),
            usage: Some(Usage::new(count, 0)),
        })
    }
}

#[cfg(test)]
mod tests {
    use parlance_ports::cosine;

    use super::*;

    #[test]
    fn vectors_are_unit_length_and_deterministic() {
        let e = HashingEmbedder::default();
        let a = e.vector("My boss is terrible at work");
        assert_eq!(a.len(), DEFAULT_DIMENSION);
        let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
        assert_eq!(
            a,
            HashingEmbedder::new(256).vector("my BOSS is terrible, at work!")
        );
        assert!(e.vector("  ,.;  ").iter().all(|x| *x == 0.0));
    }

    #[test]
    fn similar_texts_are_closer_than_unrelated_ones() {
        let e = HashingEmbedder::default();
        let q = e.vector("worried about work");
        let near = e.vector("I worry about my work and my boss");
        let far = e.vector("recipe for banana bread");
        assert!(
            cosine(&q, &near) > cosine(&q, &far) + 0.2,
            "{} vs {}",
            cosine(&q, &near),
            cosine(&q, &far)
        );
    }

    #[tokio::test]
    async fn embed_keeps_order_and_reports_model_and_dimension() {
        let e = HashingEmbedder::new(64);
        let texts = vec!["alpha".to_owned(), "beta gamma".to_owned()];
        let out = e.embed(&texts).await.unwrap();
        assert_eq!(out.model, "feature-hash-64");
        assert_eq!(out.dimension, 64);
        assert_eq!(out.vectors, vec![e.vector("alpha"), e.vector("beta gamma")]);
        assert_eq!(e.dimension(), Some(64));
        assert!(e.embed(&[]).await.unwrap().vectors.is_empty());
    }
}
