//! Storage of user adoption state, onboarding plans and tour catalogs.

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::adoption::{OnboardingPlan, TourCatalogEntry, UserAdoptionState, UserId};

use crate::PortResult;

/// An adoption record with the version it was stored at.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredAdoption {
    /// The state.
    pub state: UserAdoptionState,
    /// Its version: 1 after the first save, +1 per save.
    pub version: i64,
}

/// The key a role-specific document is stored under: the role trimmed and
/// lowercased; `""` for the product-wide document.
pub fn role_key(role: Option<&str>) -> String {
    role.unwrap_or("").trim().to_lowercase()
}

/// Per-user adoption records keyed by `(product_id, user_id)`, plus each
/// product's onboarding plans and tour catalogs (product-wide and per role).
#[async_trait]
pub trait AdoptionStore: Send + Sync + 'static {
    /// The user's record, if any. A stored record that no longer decodes is
    /// an error (never "not found", so it is never overwritten by a fresh one).
    async fn load(
        &self,
        product_id: &ProductId,
        user_id: &UserId,
    ) -> PortResult<Option<StoredAdoption>>;

    /// Saves `state` (its `user_id` is the key) by compare-and-swap:
    /// `expected_version` `None` creates the record (`Conflict` when it
    /// exists), `Some(v)` replaces version `v` (`Conflict` when the stored
    /// version differs, `NotFound` when there is none). Returns the new
    /// version.
    async fn save(
        &self,
        product_id: &ProductId,
        state: &UserAdoptionState,
        expected_version: Option<i64>,
    ) -> PortResult<i64>;

    /// Deletes the user's record; false when there was none.
    async fn delete(&self, product_id: &ProductId, user_id: &UserId) -> PortResult<bool>;

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
