//! The embedding port: texts in, fixed-dimension vectors out.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::llm::{LlmResult, Usage};

/// The vectors of one `embed` call, in the order of its texts.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Embeddings {
    /// The model that made them.
    pub model: String,
    /// The length of every vector.
    pub dimension: usize,
    /// One vector per text, in order.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens spent, when the provider reports them.
    pub usage: Option<Usage>,
}

/// Turns texts into vectors whose cosine similarity tracks their meaning.
///
/// Implemented by [`HashingEmbedder`](https://docs.rs/parlance-memory/latest/parlance_memory/struct.HashingEmbedder.html) and [`OpenAiEmbedder`](https://docs.rs/parlance-openai/latest/parlance_openai/struct.OpenAiEmbedder.html), whose
/// constructors' examples call it.
#[async_trait]
pub trait EmbeddingProvider: Send + Sync + 'static {
    /// The model name.
    fn model(&self) -> &str;

    /// The length of the vectors, when known before the first call.
    fn dimension(&self) -> Option<usize>;

    /// One vector per text, in order, all of one dimension. An empty input
    /// gives an empty output without a call.
    async fn embed(&self, texts: &[String]) -> LlmResult<Embeddings>;
}

impl std::fmt::Debug for dyn EmbeddingProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EmbeddingProvider({})", self.model())
    }
}

/// Cosine similarity of two vectors; 0 when either is all zeros or their
/// lengths differ.
///
/// ```
/// use parlance_ports::cosine;
///
/// assert!((cosine(&[1.0, 1.0], &[2.0, 2.0]) - 1.0).abs() < 1e-6);
/// assert_eq!(cosine(&[1.0, 0.0], &[0.0, 1.0]), 0.0);
/// assert_eq!(cosine(&[1.0], &[1.0, 0.0]), 0.0);
/// ```
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
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
        return 0.0;
    }
    (dot / (na.sqrt() * nb.sqrt())) as f32
}

#[cfg(test)]
mod tests {
    use super::cosine;

    #[test]
    fn cosine_of_parallel_orthogonal_and_degenerate_vectors() {
        assert!((cosine(&[1.0, 0.0], &[2.0, 0.0]) - 1.0).abs() < 1e-6);
        assert!(cosine(&[1.0, 0.0], &[0.0, 1.0]).abs() < 1e-6);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
        assert_eq!(cosine(&[1.0], &[1.0, 0.0]), 0.0);
    }
}
