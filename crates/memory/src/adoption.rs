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
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    ///
    /// use parlance_core::adoption::{AdoptionCommand, AdoptionKey, OnboardingPlan, UserAdoptionState, UserId};
    /// use parlance_core::{Machine, ProductId};
    /// use parlance_memory::{MemoryAdoptionStore, MemoryAuditLog, MemoryTaskQueue};
    /// use parlance_ports::{AdoptionStore, Clock, Commit, MachineStore, ManualClock, QueueConfig};
    ///
    /// let clock = Arc::new(ManualClock::new());
    /// let queue = Arc::new(MemoryTaskQueue::new(clock.clone(), QueueConfig::default()));
    /// let store = MemoryAdoptionStore::new(Arc::new(MemoryAuditLog::new()), queue);
    /// let acme = ProductId::parse("acme")?;
    /// let key = AdoptionKey::new(acme.clone(), UserId::parse("user-7")?);
    ///
    /// // The product's plan is the context every decision on its users reads.
    /// let plan = store.get_plan(&acme, None).await?.unwrap_or_default();
    /// assert_eq!(plan, OnboardingPlan::default());
    ///
    /// let seen = AdoptionCommand::Events { events: vec![], metadata: None };
    /// let (state, decision) = UserAdoptionState::create(&key, &plan, &seen, clock.now())?
    ///     .expect("a user seen for the first time is created");
    /// let committed = store
    ///     .commit(Commit {
    ///         key: &key,
    ///         expected: None,
    ///         command: &seen,
    ///         state: &state,
    ///         decision: &decision,
    ///         now: clock.now(),
    ///     })
    ///     .await?;
    /// assert_eq!(store.load(&key).await?.map(|s| s.version), Some(committed.version));
    /// assert!(store.delete(&key).await?);
    /// # Ok(())
    /// # }
    /// ```
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
