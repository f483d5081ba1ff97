//! What every audit trail route shares: the paging query and the page.

use parlance_core::{EntityKind, ProductId};
use parlance_ports::{AuditLog, AuditRecord};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::ApiError;

/// Paging of an audit trail.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct AuditQuery {
    /// Only records after this sequence number.
    pub(crate) after_seq: Option<i64>,
    /// At most this many records (1 to 1,000; default 100).
    #[param(minimum = 0)]
    pub(crate) limit: Option<usize>,
}

/// A page of an audit trail, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AuditPage {
    /// The records.
    pub(crate) records: Vec<AuditRecord>,
}

impl AuditQuery {
    /// The page of the trail of `kind` `id` in `log` this query asks for.
    pub(crate) async fn page(
        &self,
        log: &dyn AuditLog,
        product: &ProductId,
        kind: EntityKind,
        id: &str,
    ) -> Result<AuditPage, ApiError> {
        let limit = self.limit.unwrap_or(100).clamp(1, 1000);
        let records = log.list(product, kind, id, self.after_seq, limit).await?;
        Ok(AuditPage { records })
    }
}
