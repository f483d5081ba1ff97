//! Adoption use cases: reads, the effective plan and catalog of a role,
//! and every change as one command through the executor.

use parlance_core::adoption::{
    AdoptionCommand, AdoptionKey, OnboardingPlan, TourCatalogEntry, UserAdoptionState,
};
use parlance_core::{Machine as _, ProductId};
use parlance_ports::{Commit, PortResult, Stored, Version};

use super::Adoptions;
use crate::execute::{Executed, Executor, ServiceError};

/// The service error of every adoption use case.
pub(crate) type Error = ServiceError<UserAdoptionState>;

/// The stored record, if any.
pub(crate) async fn find(
    app: &Adoptions,
    key: &AdoptionKey,
) -> PortResult<Option<Stored<UserAdoptionState>>> {
    app.records.load(key).await
}

/// The stored record, or [`ServiceError::NotFound`].
pub(crate) async fn get(
    app: &Adoptions,
    key: &AdoptionKey,
) -> Result<Stored<UserAdoptionState>, Error> {
    find(app, key).await?.ok_or(ServiceError::NotFound)
}

/// Decides `command` on the user's record with `plan` and commits it, with
/// the audit entries of its journey changes, deciding again on a lost race.
pub(crate) async fn run(
    app: &Adoptions,
    key: &AdoptionKey,
    plan: &OnboardingPlan,
    command: &AdoptionCommand,
) -> Result<Executed<UserAdoptionState>, Error> {
    Executor::new(app.records.as_ref(), app.shared.clock.as_ref())
        .run(key, plan, command)
        .await
}

/// What [`replace`] wrote.
pub(crate) struct Replaced {
    /// The record as committed.
    pub(crate) stored: Stored<UserAdoptionState>,
    /// True when the record was created.
    pub(crate) created: bool,
}

/// Replaces the user's record with the snapshot in `command`
/// ([`AdoptionCommand::PutState`]) in one compare-and-swap on the version
/// the client names: `None` creates the record, `Some(v)` replaces version
/// `v`. Never retried: a record that moved (or exists, on a create) is the
/// client's conflict, a port error of kind `Conflict`.
///
/// # Errors
///
/// The machine's refusal (a snapshot that does not decode or names another
/// user), [`ServiceError::NotFound`] when a version is named and there is no
/// record, or the port's error.
pub(crate) async fn replace(
    app: &Adoptions,
    key: &AdoptionKey,
    command: &AdoptionCommand,
    expected: Option<Version>,
) -> Result<Replaced, Error> {
    let now = app.shared.clock.now();
    // A snapshot replaces the whole record; no plan is read.
    let plan = OnboardingPlan::default();
    let loaded = find(app, key).await?;
    let (state, decision) = match loaded {
        Some(Stored { mut state, version }) => match state.decide(&plan, command, now) {
            Ok(d) => (state, d),
            Err(error) => {
                return Err(ServiceError::refused(
                    error,
                    Some(Stored { state, version }),
                ));
            }
        },
        None if expected.is_some() => return Err(ServiceError::NotFound),
        None => match UserAdoptionState::create(key, &plan, command, now) {
            Ok(Some(created)) => created,
            Ok(None) => return Err(ServiceError::NotFound),
            Err(error) => return Err(ServiceError::refused(error, None)),
        },
    };
    let committed = app
        .records
        .commit(Commit {
            key,
            expected,
            command,
            state: &state,
            decision: &decision,
            now,
        })
        .await?;
    Ok(Replaced {
        stored: Stored {
            state,
            version: committed.version,
        },
        created: expected.is_none(),
    })
}

/// The plan that applies to `role`: the role's own plan when one is stored,
/// else the product-wide plan, filtered to the role.
pub(crate) async fn effective_plan(
    app: &Adoptions,
    product: &ProductId,
    role: Option<&str>,
) -> PortResult<OnboardingPlan> {
    let plan = match app.store.get_plan(product, role).await? {
        Some(p) if role.is_some_and(|r| !r.trim().is_empty()) => p,
        _ => app.store.get_plan(product, None).await?.unwrap_or_default(),
    };
    Ok(plan.for_role(role))
}

/// The tour catalog that applies to `role`: the role's own catalog when one
/// is stored, else the product-wide catalog (empty when neither is).
pub(crate) async fn effective_catalog(
    app: &Adoptions,
    product: &ProductId,
    role: Option<&str>,
) -> PortResult<Vec<TourCatalogEntry>> {
    if role.is_some_and(|r| !r.trim().is_empty())
        && let Some(c) = app.store.get_tour_catalog(product, role).await?
    {
        return Ok(c);
    }
    Ok(app
        .store
        .get_tour_catalog(product, None)
        .await?
        .unwrap_or_default())
}
