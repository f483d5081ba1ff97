//! Contract suite for [`EmbeddingProvider`] adapters.
//!
//! Run it with `parlance_testkit::embedding_suite!(async { Some(provider) });`.

use std::sync::Arc;

use parlance_ports::EmbeddingProvider;

/// Runs every case of this suite against the provider the factory builds.
///
/// ```
/// use std::sync::Arc;
///
/// use async_trait::async_trait;
/// use parlance_ports::{EmbeddingProvider, Embeddings, LlmResult};
///
/// /// One dimension per letter of the Latin alphabet.
/// struct LetterCounts;
///
/// #[async_trait]
/// impl EmbeddingProvider for LetterCounts {
///     fn model(&self) -> &str {
///         "letter-counts"
///     }
///
///     fn dimension(&self) -> Option<usize> {
///         Some(26)
///     }
///
///     async fn embed(&self, texts: &[String]) -> LlmResult<Embeddings> {
///         let vectors = texts
///             .iter()
///             .map(|text| {
///                 let mut v = vec![0.0; 26];
///                 for b in text.bytes().filter(u8::is_ascii_alphabetic) {
///                     v[usize::from(b.to_ascii_lowercase() - b'a')] += 1.0;
///                 }
///                 v
///             })
///             .collect();
///         Ok(Embeddings { model: self.model().to_owned(), dimension: 26, vectors, usage: None })
///     }
/// }
///
/// // In the adapter's `tests/it/main.rs`:
/// mod embedding {
///     parlance_testkit::embedding_suite!(async {
///         Some(std::sync::Arc::new(super::LetterCounts) as parlance_testkit::embedding::Subject)
///     });
/// }
///
/// // What those tests run, case by case:
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() {
///     parlance_testkit::embedding::one_vector_per_text_in_order(Arc::new(LetterCounts)).await;
///     parlance_testkit::embedding::empty_input_gives_no_vectors(Arc::new(LetterCounts)).await;
/// }
/// ```
#[macro_export]
macro_rules! embedding_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::embedding;
            cases = [
                one_vector_per_text_in_order,
                empty_input_gives_no_vectors,
            ]
        }
    };
}

/// The subject of this suite.
pub type Subject = Arc<dyn EmbeddingProvider>;

/// Each text gets one vector of the reported dimension, in input order, and
/// the same text gets the same vector.
pub async fn one_vector_per_text_in_order(p: Subject) {
    let texts: Vec<String> = [
        "my boss is terrible",
        "",
        "naïve ✓ café",
        "my boss is terrible",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let out = p.embed(&texts).await.expect("embed");
    assert_eq!(out.vectors.len(), texts.len());
    assert!(out.dimension > 0);
    assert!(out.vectors.iter().all(|v| v.len() == out.dimension));
    if let Some(d) = p.dimension() {
        assert_eq!(d, out.dimension);
    }
    assert!(!out.model.is_empty());
    assert_eq!(out.vectors[0], out.vectors[3]);
    assert_ne!(out.vectors[0], out.vectors[2]);
    let single = p.embed(&texts[2..3]).await.expect("embed");
    assert_eq!(
        single.vectors[0], out.vectors[2],
        "a vector does not depend on its batch"
    );
}

/// No texts, no vectors (and no error).
pub async fn empty_input_gives_no_vectors(p: Subject) {
    let out = p.embed(&[]).await.expect("embed");
    assert!(out.vectors.is_empty());
}
