//! Bearer-key authentication: each key opens exactly one product.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;
use parlance_core::ProductId;
use parlance_ports::PortResult;
use parlance_postgres::PgApiKeys;
use sha2::{Digest, Sha256};

use crate::http::{ApiError, KeyId};

/// A secret API key. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key given by the operator.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// A fresh random key: `pk_` and 32 random bytes in hex.
    ///
    /// # Errors
    ///
    /// When the operating system has no randomness to give.
    pub fn generate() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)?;
        Ok(Self(format!("pk_{}", hex::encode(bytes))))
    }

    /// The key itself: show it once, to the operator, and nowhere else.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The SHA-256 digest of a key: all that is ever stored.
    pub fn digest(key: &str) -> [u8; 32] {
        Sha256::digest(key.as_bytes()).into()
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

/// Known keys, held as SHA-256 digests: a lookup compares digests, never the
/// key text, so timing reveals nothing about a key's prefix. Keys given at
/// start-up live in memory; with a database, the `api_keys` table (managed
/// by `parlance keys`) is asked next.
#[derive(Debug, Default, Clone)]
pub struct ApiKeys {
    by_digest: HashMap<[u8; 32], ProductId>,
    store: Option<PgApiKeys>,
}

impl ApiKeys {
    /// No keys: every `/v1` request is refused.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `key` for `product`.
    pub fn insert(&mut self, key: &ApiKey, product: ProductId) {
        self.by_digest.insert(ApiKey::digest(key.expose()), product);
    }

    /// One key for one product.
    pub fn single(key: &ApiKey, product: ProductId) -> Self {
        let mut keys = Self::new();
        keys.insert(key, product);
        keys
    }

    /// Also accepts the unrevoked keys stored in PostgreSQL.
    #[must_use]
    pub fn with_store(mut self, store: PgApiKeys) -> Self {
        self.store = Some(store);
        self
    }

    /// The product a presented key opens, among the in-memory keys.
    pub fn product_for(&self, presented: &str) -> Option<&ProductId> {
        self.by_digest.get(&ApiKey::digest(presented))
    }

    /// The product a presented key opens: the in-memory keys first, then the
    /// database's unrevoked keys.
    ///
    /// # Errors
    ///
    /// When the key table cannot be read.
    pub async fn resolve(&self, presented: &str) -> PortResult<Option<ProductId>> {
        let digest = ApiKey::digest(presented);
        if let Some(p) = self.by_digest.get(&digest) {
            return Ok(Some(p.clone()));
        }
        match &self.store {
            Some(store) => store.product_for(&digest).await,
            None => Ok(None),
        }
    }
}

/// The product the request's key opens; set by [`require_key`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticated(pub ProductId);

/// Middleware for `/v1`: a valid `Authorization: Bearer <key>` or 401. An
/// accepted request carries [`Authenticated`] and the key's [`KeyId`], and its
/// product is recorded on the request span.
pub async fn require_key(
    State(keys): State<Arc<ApiKeys>>,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let presented = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or_else(|| ApiError::unauthorized("missing bearer token"))?;
    let product = keys
        .resolve(presented)
        .await?
        .ok_or_else(|| ApiError::unauthorized("unknown API key"))?;
    crate::http::record_product(&product);
    let id = KeyId::new(ApiKey::digest(presented));
    req.extensions_mut().insert(Authenticated(product));
    req.extensions_mut().insert(id);
    Ok(next.run(req).await)
}

/// The product named in the path, checked against the caller's key.
///
/// Extracting it from a route with a `{product_id}` segment answers 404 when
/// the key belongs to another product: another tenant's records do not
/// exist for this caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub ProductId);

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Some(Authenticated(product)) = parts.extensions.get::<Authenticated>().cloned() else {
            return Err(ApiError::unauthorized("missing bearer token"));
        };
        let params = axum::extract::RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::not_found("no such route"))?;
        match params.iter().find(|(k, _)| *k == "product_id") {
            Some((_, p)) if p == product.as_str() => Ok(Tenant(product)),
            Some(_) => Err(ApiError::not_found("no such product")),
            // Routes without a product segment act on the key's own product.
            None => Ok(Tenant(product)),
        }
    }
}

/// The product a key opens, as `GET /v1/me` answers it.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct Me {
    /// The product the presented key opens.
    #[schema(value_type = parlance_core::ProductId, example = "acme")]
    product_id: ProductId,
}

/// The product the presented key opens: what a client (the console) calls
/// first to learn where its key leads.
#[utoipa::path(
    get,
    path = "/me",
    operation_id = "get_me",
    tag = "keys",
    responses(
        (status = 200, description = "The key's product.", body = Me),
        crate::http::openapi::ReadProblems,
    ),
)]
pub(crate) async fn me(Tenant(product): Tenant) -> crate::http::ApiJson<Me> {
    crate::http::ApiJson(Me {
        product_id: product,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_looked_up_by_digest() {
        let key = ApiKey::generate().unwrap();
        assert!(key.expose().starts_with("pk_") && key.expose().len() == 67);
        assert_eq!(format!("{key:?}"), "ApiKey(***)");
        let keys = ApiKeys::single(&key, ProductId::parse("acme").unwrap());
        assert_eq!(keys.product_for(key.expose()).unwrap().as_str(), "acme");
        assert!(keys.product_for("pk_wrong").is_none());
    }
}
