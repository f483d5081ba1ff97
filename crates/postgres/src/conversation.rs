//! Conversation instances in PostgreSQL.
//!
//! Each command runs in one transaction: the instance row is locked
//! (`FOR UPDATE`), the pure command runs, and the row, its transcript
//! messages, its audit entries and any promotion are written before commit.
//! Creation and promotion lock the contact's row in `conversation_contacts`
//! first, and the partial unique index `conversation_one_holder` makes a
//! second holder impossible whatever the code does. Lock order: instance,
//! then contact; promotion takes the queued instance with `SKIP LOCKED`, so
//! it never waits while holding the contact.

use std::time::Duration;

use async_trait::async_trait;
use parlance_core::conversation::{
    ConversationError, ConversationState, Effect, Instance, InstanceId, Message, NewInstance,
    Outcome, Role,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::conversation::{Command, audit_entries, creation_entry};
use parlance_ports::{Applied, ConversationStore, ListFilter, PortError, PortResult};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row as _};

use crate::audit::insert_entries;
use crate::error::pg_err;
use crate::time::{from_pg, to_pg};

/// Conversation instances stored in PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgConversationStore {
    pool: PgPool,
}

impl PgConversationStore {
    /// A store on `pool` (migrated).
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

fn decode(row: &PgRow) -> PortResult<Instance> {
    let record: serde_json::Value = row.try_get("record").map_err(pg_err("read conversation"))?;
    let version: i64 = row
        .try_get("version")
        .map_err(pg_err("read conversation"))?;
    let mut instance: Instance = serde_json::from_value(record).map_err(|e| {
        PortError::other("stored conversation record does not decode").with_source(e)
    })?;
    instance.version = u64::try_from(version).unwrap_or_default();
    Ok(instance)
}

fn encode(instance: &Instance) -> PortResult<serde_json::Value> {
    serde_json::to_value(instance)
        .map_err(|e| PortError::other("conversation record does not encode").with_source(e))
}

fn version(instance: &Instance) -> i64 {
    i64::try_from(instance.version).unwrap_or(i64::MAX)
}

fn role(r: Role) -> &'static str {
    match r {
        Role::Agent => "agent",
        Role::Contact => "contact",
        Role::Human => "human",
    }
}

fn parse_role(r: &str) -> PortResult<Role> {
    match r {
        "agent" => Ok(Role::Agent),
        "contact" => Ok(Role::Contact),
        "human" => Ok(Role::Human),
        other => Err(PortError::other(format!(
            "stored message has unknown role {other:?}"
        ))),
    }
}

/// Locks the contact's row, creating it first if needed.
async fn lock_contact(conn: &mut PgConnection, product: &str, contact: &str) -> PortResult<()> {
    sqlx::query(
        "INSERT INTO conversation_contacts (product_id, contact_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
    )
    .bind(product)
    .bind(contact)
    .execute(&mut *conn)
    .await
    .map_err(pg_err("register contact"))?;
    sqlx::query(
        "SELECT 1 FROM conversation_contacts WHERE product_id = $1 AND contact_id = $2 FOR UPDATE",
    )
    .bind(product)
    .bind(contact)
    .execute(&mut *conn)
    .await
    .map_err(pg_err("lock contact"))?;
    Ok(())
}

async fn contact_is_held(
    conn: &mut PgConnection,
    product: &str,
    contact: &str,
) -> PortResult<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM conversation_instances \
         WHERE product_id = $1 AND contact_id = $2 AND holds_contact)",
    )
    .bind(product)
    .bind(contact)
    .fetch_one(&mut *conn)
    .await
    .map_err(pg_err("check contact holder"))
}

/// Writes an instance's row (state, timer, version and record together).
async fn update(conn: &mut PgConnection, instance: &Instance) -> PortResult<()> {
    sqlx::query(
        "UPDATE conversation_instances SET state = $3, holds_contact = $4, version = $5, \
         heartbeat_due_at = $6, claimed_until = NULL, record = $7 \
         WHERE product_id = $1 AND instance_id = $2",
    )
    .bind(instance.product_id.as_str())
    .bind(instance.instance_id.as_uuid())
    .bind(instance.state.as_str())
    .bind(instance.holds_contact())
    .bind(version(instance))
    .bind(instance.heartbeat_due_at.map(to_pg))
    .bind(encode(instance)?)
    .execute(&mut *conn)
    .await
    .map_err(pg_err("save conversation"))?;
    Ok(())
}

async fn append_messages(
    conn: &mut PgConnection,
    instance: &Instance,
    outcome: &Outcome,
) -> PortResult<()> {
    for effect in &outcome.effects {
        if let Effect::Append(m) = effect {
            sqlx::query(
                "INSERT INTO conversation_messages (product_id, instance_id, role, text, at, outbound_seq) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(instance.product_id.as_str())
            .bind(instance.instance_id.as_uuid())
            .bind(role(m.role))
            .bind(&m.text)
            .bind(to_pg(m.at))
            .bind(m.outbound_seq.map(|s| i32::try_from(s).unwrap_or(i32::MAX)))
            .execute(&mut *conn)
            .await
            .map_err(pg_err("append transcript"))?;
        }
    }
    Ok(())
}

/// Promotes the oldest `QUEUED` instance of `holder`'s contact when no
/// instance holds the contact any more.
async fn promote_next(
    conn: &mut PgConnection,
    holder: &Instance,
    now: Timestamp,
) -> PortResult<Option<(Instance, Outcome)>> {
    let product = holder.product_id.as_str();
    let contact = holder.contact_id.as_str();
    lock_contact(conn, product, contact).await?;
    if contact_is_held(conn, product, contact).await? {
        return Ok(None);
    }
    let row = sqlx::query(
        "SELECT record, version FROM conversation_instances \
         WHERE product_id = $1 AND contact_id = $2 AND state = 'QUEUED' \
         ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED",
    )
    .bind(product)
    .bind(contact)
    .fetch_optional(&mut *conn)
    .await
    .map_err(pg_err("find queued conversation"))?;
    let Some(row) = row else { return Ok(None) };
    let mut next = decode(&row)?;
    let Ok(outcome) = next.promote(now) else {
        return Ok(None);
    };
    next.version += 1;
    update(conn, &next).await?;
    Ok(Some((next, outcome)))
}

#[async_trait]
impl ConversationStore for PgConversationStore {
    async fn create(
        &self,
        new: NewInstance,
        now: Timestamp,
    ) -> PortResult<Result<(Instance, Outcome), ConversationError>> {
        let mut tx = self.pool.begin().await.map_err(pg_err("begin"))?;
        lock_contact(&mut tx, new.product_id.as_str(), new.contact_id.as_str()).await?;
        let held =
            contact_is_held(&mut tx, new.product_id.as_str(), new.contact_id.as_str()).await?;
        let (mut instance, outcome) = match Instance::create(new, held, now) {
            Ok(created) => created,
            Err(e) => return Ok(Err(e)),
        };
        instance.version = 1;
        sqlx::query(
            "INSERT INTO conversation_instances (product_id, instance_id, contact_id, state, \
             holds_contact, version, heartbeat_due_at, created_at, record) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(instance.product_id.as_str())
        .bind(instance.instance_id.as_uuid())
        .bind(instance.contact_id.as_str())
        .bind(instance.state.as_str())
        .bind(instance.holds_contact())
        .bind(version(&instance))
        .bind(instance.heartbeat_due_at.map(to_pg))
        .bind(to_pg(instance.created_at))
        .bind(encode(&instance)?)
        .execute(&mut *tx)
        .await
        .map_err(pg_err("insert conversation"))?;
        insert_entries(&mut *tx, &[creation_entry(&instance)])
            .await
            .map_err(pg_err("audit conversation"))?;
        tx.commit().await.map_err(pg_err("commit"))?;
        Ok(Ok((instance, outcome)))
    }

    async fn get(&self, product: &ProductId, id: InstanceId) -> PortResult<Option<Instance>> {
        let row = sqlx::query(
            "SELECT record, version FROM conversation_instances WHERE product_id = $1 AND instance_id = $2",
        )
        .bind(product.as_str())
        .bind(id.as_uuid())
        .fetch_optional(&self.pool)
        .await
        .map_err(pg_err("load conversation"))?;
        row.as_ref().map(decode).transpose()
    }

    async fn list(&self, product: &ProductId, filter: &ListFilter) -> PortResult<Vec<Instance>> {
        let limit = filter.limit.unwrap_or(1000).min(1000);
        let rows = sqlx::query(
            "SELECT record, version FROM conversation_instances \
             WHERE product_id = $1 AND ($2::text IS NULL OR contact_id = $2) \
             AND ($3::text IS NULL OR state = $3) ORDER BY seq LIMIT $4",
        )
        .bind(product.as_str())
        .bind(filter.contact_id.as_ref().map(|c| c.as_str()))
        .bind(filter.state.map(ConversationState::as_str))
        .bind(i64::try_from(limit).unwrap_or(1000))
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("list conversations"))?;
        rows.iter().map(decode).collect()
    }

    async fn transcript(&self, product: &ProductId, id: InstanceId) -> PortResult<Vec<Message>> {
        if self.get(product, id).await?.is_none() {
            return Err(PortError::not_found(format!("no conversation {id}")));
        }
        let rows = sqlx::query(
            "SELECT role, text, at, outbound_seq FROM conversation_messages \
             WHERE product_id = $1 AND instance_id = $2 ORDER BY seq",
        )
        .bind(product.as_str())
        .bind(id.as_uuid())
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("load transcript"))?;
        rows.iter()
            .map(|row| {
                let role: String = row.try_get("role").map_err(pg_err("read message"))?;
                let seq: Option<i32> = row
                    .try_get("outbound_seq")
                    .map_err(pg_err("read message"))?;
                Ok(Message {
                    role: parse_role(&role)?,
                    text: row.try_get("text").map_err(pg_err("read message"))?,
                    at: from_pg(row.try_get("at").map_err(pg_err("read message"))?),
                    outbound_seq: seq.and_then(|s| u32::try_from(s).ok()),
                })
            })
            .collect()
    }

    async fn apply(
        &self,
        product: &ProductId,
        id: InstanceId,
        now: Timestamp,
        command: Command,
    ) -> PortResult<Result<Applied, ConversationError>> {
        let mut tx = self.pool.begin().await.map_err(pg_err("begin"))?;
        let row = sqlx::query(
            "SELECT record, version FROM conversation_instances \
             WHERE product_id = $1 AND instance_id = $2 FOR UPDATE",
        )
        .bind(product.as_str())
        .bind(id.as_uuid())
        .fetch_optional(&mut *tx)
        .await
        .map_err(pg_err("lock conversation"))?;
        let Some(row) = row else {
            return Err(PortError::not_found(format!("no conversation {id}")));
        };
        let mut instance = decode(&row)?;
        let outcome = match command(&mut instance) {
            Ok(o) => o,
            // Dropping the transaction rolls it back: nothing changed.
            Err(e) => return Ok(Err(e)),
        };
        instance.version += 1;
        update(&mut tx, &instance).await?;
        append_messages(&mut tx, &instance, &outcome).await?;
        let mut audit = audit_entries(&instance, &outcome, now);
        let promoted = if outcome.effects.contains(&Effect::PromoteNextQueued) {
            promote_next(&mut tx, &instance, now).await?
        } else {
            None
        };
        if let Some((p, o)) = &promoted {
            audit.extend(audit_entries(p, o, now));
        }
        insert_entries(&mut *tx, &audit)
            .await
            .map_err(pg_err("audit conversation"))?;
        tx.commit().await.map_err(pg_err("commit"))?;
        Ok(Ok(Applied {
            instance,
            outcome,
            promoted,
        }))
    }

    async fn claim_due(
        &self,
        now: Timestamp,
        limit: usize,
        lease: Duration,
    ) -> PortResult<Vec<Instance>> {
        let rows = sqlx::query(
            "UPDATE conversation_instances SET claimed_until = $2 \
             WHERE (product_id, instance_id) IN ( \
               SELECT product_id, instance_id FROM conversation_instances \
               WHERE heartbeat_due_at <= $1 AND (claimed_until IS NULL OR claimed_until <= $1) \
               ORDER BY heartbeat_due_at LIMIT $3 FOR UPDATE SKIP LOCKED) \
             RETURNING record, version",
        )
        .bind(to_pg(now))
        .bind(to_pg(now + lease))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("claim due conversations"))?;
        let mut due = rows.iter().map(decode).collect::<PortResult<Vec<_>>>()?;
        due.sort_by_key(|i| (i.heartbeat_due_at, i.created_at));
        Ok(due)
    }

    async fn record_delivery(
        &self,
        product: &ProductId,
        id: InstanceId,
        outbound_seq: u32,
        now: Timestamp,
    ) -> PortResult<bool> {
        let done = sqlx::query(
            "INSERT INTO conversation_deliveries (product_id, instance_id, outbound_seq, recorded_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        )
        .bind(product.as_str())
        .bind(id.as_uuid())
        .bind(i32::try_from(outbound_seq).unwrap_or(i32::MAX))
        .bind(to_pg(now))
        .execute(&self.pool)
        .await
        .map_err(pg_err("record delivery"))?;
        Ok(done.rows_affected() == 1)
    }
}
