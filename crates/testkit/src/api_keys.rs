//! Contract suites for API-key stores.
//!
//! The in-memory keys (given at start-up) and the PostgreSQL key table have
//! no common port: the service asks the first, then the second, for the
//! product a presented key opens. What both promise is the lookup, so
//! [`api_key_suite!`](crate::api_key_suite) holds every store to it; the
//! PostgreSQL table can also revoke, which
//! [`api_key_revocation_suite!`](crate::api_key_revocation_suite) checks.
//! The fixture takes key text and stores whatever the store keeps (a digest).

use std::sync::Arc;

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_ports::{ErrorKind, PortResult};

/// Runs every lookup case against the key store the factory builds.
///
/// See how [the PostgreSQL key table](https://github.com/parlance-rs/parlance/blob/main/crates/postgres/tests/it/main.rs) and [the service's start-up keys](https://github.com/parlance-rs/parlance/blob/main/crates/app/tests/it/contracts.rs)
/// run it.
///
/// No in-memory adapter holds keys: here, a list of keys fixed at start-up.
///
/// ```
/// use std::sync::{Arc, Mutex};
///
/// use async_trait::async_trait;
/// use parlance_core::ProductId;
/// use parlance_ports::{PortError, PortResult};
/// use parlance_testkit::api_keys::{KeyStoreFixture, Subject};
///
/// /// Keys given at start-up, numbered from 1 as they are added.
/// #[derive(Default)]
/// struct StartUp(Mutex<Vec<(String, ProductId)>>);
///
/// #[async_trait]
/// impl KeyStoreFixture for StartUp {
///     async fn add(&self, product: &ProductId, key: &str) -> i64 {
///         let mut keys = self.0.lock().expect("not poisoned");
///         keys.push((key.to_owned(), product.clone()));
///         i64::try_from(keys.len()).expect("a few keys")
///     }
///
///     async fn resolve(&self, presented: &str) -> PortResult<Option<ProductId>> {
///         let keys = self.0.lock().expect("not poisoned");
///         Ok(keys.iter().find(|(k, _)| k == presented).map(|(_, p)| p.clone()))
///     }
///
///     async fn revoke(&self, _: &ProductId, _: i64) -> PortResult<()> {
///         Err(PortError::invalid("keys given at start-up are fixed"))
///     }
/// }
///
/// fn keys() -> Subject {
///     Arc::new(StartUp::default())
/// }
///
/// // In the service's tests, one `#[tokio::test]` per case:
/// mod start_up_keys {
///     parlance_testkit::api_key_suite!(async { Some(super::keys()) });
/// }
///
/// // What some of those tests run:
/// #[tokio::main]
/// async fn main() {
///     use parlance_testkit::api_keys::*;
///
///     a_stored_key_opens_its_product(keys()).await;
///     an_empty_store_opens_nothing(keys()).await;
///     keys_of_two_products_stay_apart(keys()).await;
///     near_misses_open_nothing(keys()).await;
/// }
/// ```
#[macro_export]
macro_rules! api_key_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::api_keys;
            cases = [
                a_stored_key_opens_its_product,
                an_empty_store_opens_nothing,
                keys_of_two_products_stay_apart,
                a_product_may_hold_several_keys,
                near_misses_open_nothing,
            ]
        }
    };
}

/// Runs every revocation case against a store that can revoke.
///
/// See how [the PostgreSQL key table](https://github.com/parlance-rs/parlance/blob/main/crates/postgres/tests/it/main.rs) runs it.
///
/// No in-memory adapter holds keys: here, a list whose keys can be revoked.
///
/// ```
/// use std::sync::{Arc, Mutex};
///
/// use async_trait::async_trait;
/// use parlance_core::ProductId;
/// use parlance_ports::{PortError, PortResult};
/// use parlance_testkit::api_keys::{KeyStoreFixture, Subject};
///
/// /// Key `n` is entry `n - 1`: its text, its product, whether it is revoked.
/// #[derive(Default)]
/// struct Keys(Mutex<Vec<(String, ProductId, bool)>>);
///
/// #[async_trait]
/// impl KeyStoreFixture for Keys {
///     async fn add(&self, product: &ProductId, key: &str) -> i64 {
///         let mut keys = self.0.lock().expect("not poisoned");
///         keys.push((key.to_owned(), product.clone(), false));
///         i64::try_from(keys.len()).expect("a few keys")
///     }
///
///     async fn resolve(&self, presented: &str) -> PortResult<Option<ProductId>> {
///         let keys = self.0.lock().expect("not poisoned");
///         let live = keys.iter().find(|(k, _, revoked)| k == presented && !revoked);
///         Ok(live.map(|(_, p, _)| p.clone()))
///     }
///
///     async fn revoke(&self, product: &ProductId, id: i64) -> PortResult<()> {
///         let mut keys = self.0.lock().expect("not poisoned");
///         let n = usize::try_from(id - 1).ok();
///         match n.and_then(|n| keys.get_mut(n)) {
///             Some((_, owner, revoked)) if owner == product => {
///                 *revoked = true;
///                 Ok(())
///             }
///             _ => Err(PortError::not_found("no such key of this product")),
///         }
///     }
/// }
///
/// fn keys() -> Subject {
///     Arc::new(Keys::default())
/// }
///
/// // In the adapter's tests, one `#[tokio::test]` per case:
/// mod revocable_keys {
///     parlance_testkit::api_key_revocation_suite!(async { Some(super::keys()) });
/// }
///
/// // What those tests run, case by case:
/// #[tokio::main]
/// async fn main() {
///     use parlance_testkit::api_keys::*;
///
///     a_revoked_key_opens_nothing(keys()).await;
///     revoking_twice_is_harmless(keys()).await;
///     another_product_cannot_revoke_a_key(keys()).await;
///     revoking_an_unknown_key_is_not_found(keys()).await;
/// }
/// ```
#[macro_export]
macro_rules! api_key_revocation_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::api_keys;
            cases = [
                a_revoked_key_opens_nothing,
                revoking_twice_is_harmless,
                another_product_cannot_revoke_a_key,
                revoking_an_unknown_key_is_not_found,
            ]
        }
    };
}

/// A key store as the service uses it.
#[async_trait]
pub trait KeyStoreFixture: Send + Sync {
    /// Stores `key` for `product`; returns the store's id for the key.
    async fn add(&self, product: &ProductId, key: &str) -> i64;
    /// The product a presented key opens, if any.
    async fn resolve(&self, presented: &str) -> PortResult<Option<ProductId>>;
    /// Revokes key `id` of `product`. Stores fixed at start-up answer
    /// `Invalid` (and are not run through the revocation suite).
    async fn revoke(&self, product: &ProductId, id: i64) -> PortResult<()>;
}

/// The subject of these suites.
pub type Subject = Arc<dyn KeyStoreFixture>;

fn product(p: &str) -> ProductId {
    ProductId::parse(p).expect("valid product id")
}

async fn opens(keys: &Subject, presented: &str) -> Option<ProductId> {
    keys.resolve(presented).await.expect("resolve")
}

/// A stored key opens exactly its product.
pub async fn a_stored_key_opens_its_product(keys: Subject) {
    keys.add(&product("acme"), "pk_acme_1").await;
    assert_eq!(opens(&keys, "pk_acme_1").await, Some(product("acme")));
}

/// With nothing stored, no key opens anything, the empty one included.
pub async fn an_empty_store_opens_nothing(keys: Subject) {
    for presented in ["pk_acme_1", "", " "] {
        assert_eq!(opens(&keys, presented).await, None, "{presented:?}");
    }
}

/// Each product's key opens its own product, never the other.
pub async fn keys_of_two_products_stay_apart(keys: Subject) {
    keys.add(&product("acme"), "pk_acme").await;
    keys.add(&product("other"), "pk_other").await;
    assert_eq!(opens(&keys, "pk_acme").await, Some(product("acme")));
    assert_eq!(opens(&keys, "pk_other").await, Some(product("other")));
}

/// A product's second key works alongside its first.
pub async fn a_product_may_hold_several_keys(keys: Subject) {
    keys.add(&product("acme"), "pk_one").await;
    keys.add(&product("acme"), "pk_two").await;
    assert_eq!(opens(&keys, "pk_one").await, Some(product("acme")));
    assert_eq!(opens(&keys, "pk_two").await, Some(product("acme")));
}

/// Only the exact key opens: a prefix, an extension, another case or one
/// changed character open nothing.
pub async fn near_misses_open_nothing(keys: Subject) {
    keys.add(&product("acme"), "pk_secret_key").await;
    for presented in [
        "pk_secret_ke",
        "pk_secret_key_",
        "PK_SECRET_KEY",
        "pk_secret_kez",
        "pk_",
        "",
    ] {
        assert_eq!(opens(&keys, presented).await, None, "{presented:?}");
    }
    assert_eq!(opens(&keys, "pk_secret_key").await, Some(product("acme")));
}

/// A revoked key opens nothing; the product's other key still opens it.
pub async fn a_revoked_key_opens_nothing(keys: Subject) {
    let old = keys.add(&product("acme"), "pk_old").await;
    keys.add(&product("acme"), "pk_new").await;
    keys.revoke(&product("acme"), old).await.expect("revoke");
    assert_eq!(opens(&keys, "pk_old").await, None);
    assert_eq!(opens(&keys, "pk_new").await, Some(product("acme")));
}

/// Revoking a revoked key succeeds and the key stays revoked.
pub async fn revoking_twice_is_harmless(keys: Subject) {
    let id = keys.add(&product("acme"), "pk_old").await;
    keys.revoke(&product("acme"), id).await.expect("revoke");
    keys.revoke(&product("acme"), id)
        .await
        .expect("revoke again");
    assert_eq!(opens(&keys, "pk_old").await, None);
}

/// A product cannot revoke another's key: `NotFound`, and the key still opens.
pub async fn another_product_cannot_revoke_a_key(keys: Subject) {
    let id = keys.add(&product("acme"), "pk_acme").await;
    keys.add(&product("other"), "pk_other").await;
    let e = keys
        .revoke(&product("other"), id)
        .await
        .expect_err("another product's key");
    assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
    assert_eq!(opens(&keys, "pk_acme").await, Some(product("acme")));
}

/// Revoking an id the store never gave is `NotFound`.
pub async fn revoking_an_unknown_key_is_not_found(keys: Subject) {
    let id = keys.add(&product("acme"), "pk_acme").await;
    let e = keys
        .revoke(&product("acme"), id + 1000)
        .await
        .expect_err("no such key");
    assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
    assert_eq!(opens(&keys, "pk_acme").await, Some(product("acme")));
}
