//! `parlance keys create|list|revoke`: API keys stored hashed in PostgreSQL.

use std::io::Write;

use anyhow::Context as _;
use clap::Subcommand;
use parlance_core::ProductId;
use parlance_ports::{Clock as _, SystemClock};
use parlance_postgres::{PgApiKeys, PgPool};
use serde_json::json;

use crate::auth::ApiKey;

/// An operator action on API keys.
#[derive(Debug, Clone, Subcommand)]
pub enum KeysAction {
    /// Make a key for a product; the key is printed once and only its
    /// SHA-256 digest is stored.
    Create {
        /// The product the key opens.
        #[arg(long)]
        product: String,
        /// A label to recognise the key by.
        #[arg(long, default_value = "")]
        label: String,
    },
    /// List keys (never their secrets), one JSON object per line.
    List {
        /// Only this product's keys.
        #[arg(long)]
        product: Option<String>,
    },
    /// Revoke a key: requests bearing it are refused from now on.
    Revoke {
        /// The product the key opens.
        #[arg(long)]
        product: String,
        /// The key's id, as `list` shows it.
        id: i64,
    },
}

fn product(raw: &str) -> anyhow::Result<ProductId> {
    ProductId::parse(raw).with_context(|| format!("product id {raw:?}"))
}

/// Runs one key command, writing its answer to `out`.
///
/// # Errors
///
/// When the database cannot be reached, a product id is invalid, or the
/// key to revoke does not exist.
pub(super) async fn run(
    pool: PgPool,
    action: KeysAction,
    mut out: impl Write,
) -> anyhow::Result<()> {
    let keys = PgApiKeys::new(pool);
    let now = SystemClock.now();
    match action {
        KeysAction::Create { product: p, label } => {
            let p = product(&p)?;
            let key = ApiKey::generate().context("generate an API key")?;
            let record = keys
                .create(&p, &ApiKey::digest(key.expose()), &label, now)
                .await?;
            tracing::info!(product = %p, id = record.id, "api key created");
            writeln!(
                out,
                "{}",
                json!({"id": record.id, "product_id": p, "label": label, "key": key.expose()})
            )?;
        }
        KeysAction::List { product: p } => {
            let p = p.as_deref().map(product).transpose()?;
            for r in keys.list(p.as_ref()).await? {
                writeln!(
                    out,
                    "{}",
                    json!({
                        "id": r.id,
                        "product_id": r.product_id,
                        "label": r.label,
                        "created_at": r.created_at,
                        "revoked_at": r.revoked_at,
                    })
                )?;
            }
        }
        KeysAction::Revoke { product: p, id } => {
            let p = product(&p)?;
            keys.revoke(&p, id, now).await?;
            tracing::info!(product = %p, id, "api key revoked");
            writeln!(
                out,
                "{}",
                json!({"id": id, "product_id": p, "revoked": true})
            )?;
        }
    }
    Ok(())
}
