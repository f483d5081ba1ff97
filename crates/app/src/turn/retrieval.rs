//! Hybrid retrieval: the seam between the memory store and an embedding
//! provider. The app embeds the query through whatever provider it has; the
//! store fuses token recall with cosine similarity, or falls back to token
//! recall and says why.

use std::time::Instant;

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::turn::{OwnerId, QueryEmbedding, Retrieved};
use parlance_ports::{MemoryStore, PortError, PortResult};
use serde::Serialize;

/// Anything that can embed a query (an embedding provider adapter).
#[async_trait]
pub trait QueryEmbedder: Send + Sync {
    /// The query's embedding.
    async fn embed_query(&self, text: &str) -> Result<Vec<f32>, PortError>;
}

/// A retrieval with its timing, for diagnostics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RetrievalReport {
    /// What was retrieved and by which path.
    pub retrieved: Retrieved,
    /// Wall time in milliseconds, embedding included.
    pub millis: f64,
}

/// Retrieves the `k` entries best matching `query`: hybrid (token recall
/// fused with embedding similarity) when `embedder` answers, token recall
/// alone when there is none or it fails.
pub async fn retrieve_hybrid(
    store: &dyn MemoryStore,
    embedder: Option<&dyn QueryEmbedder>,
    product_id: &ProductId,
    owner: &OwnerId,
    query: &str,
    k: usize,
) -> PortResult<RetrievalReport> {
    let started = Instant::now();
    let vector = match embedder {
        None => None,
        Some(e) => Some(e.embed_query(query).await),
    };
    let embedding = match &vector {
        None => QueryEmbedding::Absent,
        Some(Ok(v)) => QueryEmbedding::Vector(v),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "query embedding failed; token recall only");
            QueryEmbedding::Failed
        }
    };
    let retrieved = store
        .retrieve(product_id, owner, query, k, embedding)
        .await?;
    Ok(RetrievalReport {
        retrieved,
        millis: started.elapsed().as_secs_f64() * 1000.0,
    })
}
