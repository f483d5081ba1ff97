//! A read-through cache in front of a tour catalog store: events read their
//! product's catalog on every request, and catalogs rarely change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::session::TourCatalog;
use parlance_ports::{PortResult, TourCatalogStore};

/// How long a cached catalog is used before it is read again. A `put` through
/// this process is seen at once; one through another process within this.
pub const CATALOG_TTL: Duration = Duration::from_secs(1);

/// Caches each product's catalog for [`CATALOG_TTL`].
pub struct CachedTourCatalogs {
    inner: Arc<dyn TourCatalogStore>,
    ttl: Duration,
    entries: Mutex<HashMap<ProductId, (Instant, Arc<TourCatalog>)>>,
}

impl CachedTourCatalogs {
    /// A cache in front of `inner`.
    pub fn new(inner: Arc<dyn TourCatalogStore>, ttl: Duration) -> Self {
        Self {
            inner,
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ProductId, (Instant, Arc<TourCatalog>)>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl TourCatalogStore for CachedTourCatalogs {
    async fn get(&self, product_id: &ProductId) -> PortResult<TourCatalog> {
        if let Some((at, c)) = self.lock().get(product_id)
            && at.elapsed() < self.ttl
        {
            return Ok(TourCatalog::clone(c));
        }
        let fresh = self.inner.get(product_id).await?;
        self.lock().insert(
            product_id.clone(),
            (Instant::now(), Arc::new(fresh.clone())),
        );
        Ok(fresh)
    }

    async fn put(&self, product_id: &ProductId, catalog: &TourCatalog) -> PortResult<()> {
        self.inner.put(product_id, catalog).await?;
        self.lock().insert(
            product_id.clone(),
            (Instant::now(), Arc::new(catalog.clone())),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parlance_memory::MemoryTourCatalogs;
    use serde_json::json;

    #[tokio::test]
    async fn serves_from_cache_until_the_ttl_and_sees_its_own_puts() {
        let store = Arc::new(MemoryTourCatalogs::new());
        let cache = CachedTourCatalogs::new(store.clone(), Duration::from_millis(50));
        let p = ProductId::parse("p").unwrap();
        assert_eq!(cache.get(&p).await.unwrap(), TourCatalog::empty());
        let c = TourCatalog::from_value(&json!({"tours": [{"id": "a"}]})).unwrap();
        store.put(&p, &c).await.unwrap(); // behind the cache's back
        assert_eq!(cache.get(&p).await.unwrap(), TourCatalog::empty());
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(cache.get(&p).await.unwrap(), c);
        let c2 = TourCatalog::from_value(&json!({"tours": []})).unwrap();
        cache.put(&p, &c2).await.unwrap();
        assert_eq!(cache.get(&p).await.unwrap(), c2);
        assert_eq!(store.get(&p).await.unwrap(), c2);
    }
}
