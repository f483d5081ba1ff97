//! Adoption records, plans and catalogs in maps.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::adoption::{OnboardingPlan, TourCatalogEntry, UserAdoptionState, UserId};
use parlance_ports::adoption::role_key;
use parlance_ports::{AdoptionStore, PortError, PortResult, StoredAdoption};

#[derive(Debug, Default)]
struct Inner {
    states: HashMap<(ProductId, String), StoredAdoption>,
    plans: HashMap<(ProductId, String), OnboardingPlan>,
    catalogs: HashMap<(ProductId, String), Vec<TourCatalogEntry>>,
}

/// An adoption store held in memory.
#[derive(Debug, Default)]
pub struct MemoryAdoptionStore {
    inner: Mutex<Inner>,
}

impl MemoryAdoptionStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl AdoptionStore for MemoryAdoptionStore {
    async fn load(
        &self,
        product_id: &ProductId,
        user_id: &UserId,
    ) -> PortResult<Option<StoredAdoption>> {
        Ok(self
            .lock()
            .states
            .get(&(product_id.clone(), user_id.as_str().to_owned()))
            .cloned())
    }

    async fn save(
        &self,
        product_id: &ProductId,
        state: &UserAdoptionState,
        expected_version: Option<i64>,
    ) -> PortResult<i64> {
        let key = (product_id.clone(), state.user_id.clone());
        let mut inner = self.lock();
        let current = inner.states.get(&key).map(|s| s.version);
        let version = match (current, expected_version) {
            (None, None) => 1,
            (Some(_), None) => {
                return Err(PortError::conflict("adoption record already exists"));
            }
            (None, Some(_)) => return Err(PortError::not_found("no adoption record")),
            (Some(c), Some(e)) if c == e => c + 1,
            (Some(_), Some(_)) => {
                return Err(PortError::conflict("adoption record version is stale"));
            }
        };
        inner.states.insert(
            key,
            StoredAdoption {
                state: state.clone(),
                version,
            },
        );
        Ok(version)
    }

    async fn delete(&self, product_id: &ProductId, user_id: &UserId) -> PortResult<bool> {
        Ok(self
            .lock()
            .states
            .remove(&(product_id.clone(), user_id.as_str().to_owned()))
            .is_some())
    }

    async fn put_plan(
        &self,
        product_id: &ProductId,
        role: Option<&str>,
        plan: &OnboardingPlan,
    ) -> PortResult<()> {
        self.lock()
            .plans
            .insert((product_id.clone(), role_key(role)), plan.clone());
        Ok(())
    }

    async fn get_plan(
        &self,
        product_id: &ProductId,
        role: Option<&str>,
    ) -> PortResult<Option<OnboardingPlan>> {
        Ok(self
            .lock()
            .plans
            .get(&(product_id.clone(), role_key(role)))
            .cloned())
    }

    async fn put_tour_catalog(
        &self,
        product_id: &ProductId,
        role: Option<&str>,
        catalog: &[TourCatalogEntry],
    ) -> PortResult<()> {
        self.lock()
            .catalogs
            .insert((product_id.clone(), role_key(role)), catalog.to_vec());
        Ok(())
    }

    async fn get_tour_catalog(
        &self,
        product_id: &ProductId,
        role: Option<&str>,
    ) -> PortResult<Option<Vec<TourCatalogEntry>>> {
        Ok(self
            .lock()
            .catalogs
            .get(&(product_id.clone(), role_key(role)))
            .cloned())
    }
}
