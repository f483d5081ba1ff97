//! Adoption records on [`Records`], plans and catalogs in maps.
//!
//! A commit writes the record, the audit entries of its journey changes and
//! its tasks under the records' one gate, so all happen or none does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::adoption::{AdoptionKey, OnboardingPlan, TourCatalogEntry, UserAdoptionState};
use parlance_core::queue::DagLimits;
use parlance_ports::adoption::role_key;
use parlance_ports::{
    AdoptionStore, Commit, Committed, MachineStore, PortResult, Stored, TaskQueue,
};

use crate::MemoryAuditLog;
use crate::records::Records;

/// Onboarding plans and tour catalogs, keyed by product and role key.
#[derive(Debug, Default)]
struct Documents {
    plans: HashMap<(ProductId, String), OnboardingPlan>,
    catalogs: HashMap<(ProductId, String), Vec<TourCatalogEntry>>,
}

/// An adoption store held in memory. A commit appends its audit entries to
/// the given audit log and enqueues its tasks on the given queue under the
/// same gate as the record.
#[derive(Debug)]
pub struct MemoryAdoptionStore {
    records: Records<UserAdoptionState>,
    documents: Mutex<Documents>,
}

impl MemoryAdoptionStore {
    /// An empty store writing audit entries to `audit` and tasks to `queue`.
    pub fn new(audit: Arc<MemoryAuditLog>, queue: Arc<dyn TaskQueue>) -> Self {
        Self {
            records: Records::new(audit, Some(queue), DagLimits::default()),
            documents: Mutex::new(Documents::default()),
        }
    }

    fn documents(&self) -> MutexGuard<'_, Documents> {
        self.documents.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl MachineStore<UserAdoptionState> for MemoryAdoptionStore {
    async fn load(&self, key: &AdoptionKey) -> PortResult<Option<Stored<UserAdoptionState>>> {
        Ok(self.records.load(key).await)
    }

    async fn commit(
        &self,
        c: Commit<'_, UserAdoptionState>,
    ) -> PortResult<Committed<UserAdoptionState>> {
        let version = self
            .records
            .commit(&c, c.state.clone(), |_| Ok(()), |_, _, ()| {})
            .await?;
        Ok(Committed::at(version))
    }
}

#[async_trait]
impl AdoptionStore for MemoryAdoptionStore {
    async fn delete(&self, key: &AdoptionKey) -> PortResult<bool> {
        Ok(self.records.delete(key).await)
    }

    async fn put_plan(
        &self,
        product_id: &ProductId,
        role: Option<&str>,
        plan: &OnboardingPlan,
    ) -> PortResult<()> {
        self.documents()
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
            .documents()
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
        self.documents()
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
            .documents()
            .catalogs
            .get(&(product_id.clone(), role_key(role)))
            .cloned())
    }
}
