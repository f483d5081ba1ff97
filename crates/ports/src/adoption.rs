//! Storage of user adoption records, onboarding plans and tour catalogs.
//!
//! A record is loaded and committed through the one storage protocol,
//! [`MachineStore<UserAdoptionState>`](crate::MachineStore): a commit writes
//! the record and the audit entries of its journey changes together or not
//! at all. What is left here is what that protocol does not cover: deleting
//! a record, and each product's onboarding plans and tour catalogs (read as
//! the context of a decision, never changed by one).

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::adoption::{AdoptionKey, OnboardingPlan, TourCatalogEntry};

use crate::PortResult;

/// The key a role-specific document is stored under: the role trimmed and
/// lowercased; `""` for the product-wide document.
pub fn role_key(role: Option<&str>) -> String {
    role.unwrap_or("").trim().to_lowercase()
}

/// The adoption operations beside load and commit: deleting a record (on
/// the same records as the store's
/// [`MachineStore<UserAdoptionState>`](crate::MachineStore), keyed by
/// `(product_id, user_id)`), and each product's onboarding plans and tour
/// catalogs (product-wide and per role).
///
/// Implemented by [`MemoryAdoptionStore`](https://docs.rs/parlance-memory/latest/parlance_memory/struct.MemoryAdoptionStore.html) and [`PgAdoptionStore`](https://docs.rs/parlance-postgres/latest/parlance_postgres/struct.PgAdoptionStore.html), whose
/// constructors' examples call it.
#[async_trait]
pub trait AdoptionStore: Send + Sync + 'static {
    /// Deletes the user's record; false when there was none.
    async fn delete(&self, key: &AdoptionKey) -> PortResult<bool>;

    /// Stores the onboarding plan for a role (`None`: product-wide),
    /// replacing the previous one.
    async fn put_plan(
        &self,
        product_id: &ProductId,
        role: Option<&str>,
        plan: &OnboardingPlan,
    ) -> PortResult<()>;

    /// The plan stored for exactly this role key (`None`: product-wide).
    async fn get_plan(
        &self,
        product_id: &ProductId,
        role: Option<&str>,
    ) -> PortResult<Option<OnboardingPlan>>;

    /// Stores the tour catalog for a role (`None`: product-wide), replacing
    /// the previous one.
    async fn put_tour_catalog(
        &self,
        product_id: &ProductId,
        role: Option<&str>,
        catalog: &[TourCatalogEntry],
    ) -> PortResult<()>;

    /// The catalog stored for exactly this role key (`None`: product-wide).
    async fn get_tour_catalog(
        &self,
        product_id: &ProductId,
        role: Option<&str>,
    ) -> PortResult<Option<Vec<TourCatalogEntry>>>;
}
