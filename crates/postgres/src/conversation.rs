//! Conversation instances in PostgreSQL.
//!
//! A command is decided on a plain read of the instance, then written by one
//! guarded statement: the row update (`WHERE state = $seen AND version =
//! $seen`) with the transcript messages and audit entries as data-modifying
//! CTEs that insert only when the update matched. An outcome that asks for
//! tasks or a promotion runs that statement in a transaction that also
//! enqueues the tasks (on the same connection, so they commit with the
//! transition) and promotes; otherwise the statement commits on its own.
//! When the guard finds the instance moved, nothing was written and the
//! command runs again inside a transaction holding the row lock
//! (`FOR UPDATE`), which cannot be overtaken: a command is decided at most
//! twice, and a hot instance costs waiters a lock queue, not a retry loop.
//!
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
use parlance_ports::conversation::{Command, audit_entries, creation_entry, effect_tasks};
use parlance_ports::{Applied, ConversationStore, ListFilter, PortError, PortResult};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row as _};

use crate::PgTaskQueue;
use crate::audit::insert_entries;
use crate::error::pg_err;
use crate::time::{from_pg, to_pg};

/// Conversation instances stored in PostgreSQL, enqueueing the tasks their
/// transitions ask for on a task queue in the same database.
#[derive(Debug, Clone)]
pub struct PgConversationStore {
    pool: PgPool,
    queue: PgTaskQueue,
}

impl PgConversationStore {
    /// A store on `pool` (migrated) whose transitions enqueue their tasks on
    /// `queue`, which must use the same database.
    pub fn new(pool: PgPool, queue: PgTaskQueue) -> Self {
        Self { pool, queue }
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

/// Writes a transition decided on `seen` (the state and version the command
/// read): the row, its transcript messages and its audit entries, in one
/// statement whose inserts happen only if the guarded update matched.
/// `false` when the instance moved since it was read: nothing was written.
async fn write_transition(
    conn: &mut PgConnection,
    instance: &Instance,
    seen: (ConversationState, i64),
    outcome: &Outcome,
    now: Timestamp,
) -> PortResult<bool> {
    let messages: Vec<&Message> = outcome
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Append(m) => Some(m),
            _ => None,
        })
        .collect();
    let audit = audit_entries(instance, outcome, now);
    let matched: i64 = sqlx::query_scalar(
        "WITH u AS (UPDATE conversation_instances SET state = $3, holds_contact = $4, \
         version = $5, heartbeat_due_at = $6, claimed_until = NULL, record = $7 \
         WHERE product_id = $1 AND instance_id = $2 AND state = $8 AND version = $9 \
         RETURNING instance_id), \
         m AS (INSERT INTO conversation_messages (product_id, instance_id, role, text, at, outbound_seq) \
         SELECT $1, u.instance_id, x.role, x.text, x.at, x.outbound_seq FROM u, \
         UNNEST($10::text[], $11::text[], $12::timestamptz[], $13::int4[]) WITH ORDINALITY \
         AS x(role, text, at, outbound_seq, n) ORDER BY x.n), \
         a AS (INSERT INTO audit_log (product_id, entity_kind, entity_id, from_state, to_state, cause, at, payload) \
         SELECT $1, 'conversation', $19, x.from_state, x.to_state, x.cause, $14, x.payload \
         FROM u, UNNEST($15::text[], $16::text[], $17::text[], $18::jsonb[]) WITH ORDINALITY \
         AS x(from_state, to_state, cause, payload, n) ORDER BY x.n) \
         SELECT count(*) FROM u",
    )
    .bind(instance.product_id.as_str())
    .bind(instance.instance_id.as_uuid())
    .bind(instance.state.as_str())
    .bind(instance.holds_contact())
    .bind(version(instance))
    .bind(instance.heartbeat_due_at.map(to_pg))
    .bind(encode(instance)?)
    .bind(seen.0.as_str())
    .bind(seen.1)
    .bind(messages.iter().map(|m| role(m.role)).collect::<Vec<_>>())
    .bind(messages.iter().map(|m| m.text.as_str()).collect::<Vec<_>>())
    .bind(messages.iter().map(|m| to_pg(m.at)).collect::<Vec<_>>())
    .bind(
        messages
            .iter()
            .map(|m| m.outbound_seq.map(|s| i32::try_from(s).unwrap_or(i32::MAX)))
            .collect::<Vec<_>>(),
    )
    .bind(to_pg(now))
    .bind(audit.iter().map(|e| e.from.as_deref()).collect::<Vec<_>>())
    .bind(audit.iter().map(|e| e.to.as_str()).collect::<Vec<_>>())
    .bind(audit.iter().map(|e| e.cause.as_str()).collect::<Vec<_>>())
    .bind(audit.iter().map(|e| e.payload.clone()).collect::<Vec<_>>())
    .bind(instance.instance_id.to_string())
    .fetch_one(&mut *conn)
    .await
    .map_err(pg_err("save conversation"))?;
    Ok(matched == 1)
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
    let seen = (next.state, version(&next));
    let Ok(outcome) = next.promote(now) else {
        return Ok(None);
    };
    next.version += 1;
    // The row is locked: the guard holds, and the audit entries go with it.
    if !write_transition(conn, &next, seen, &outcome, now).await? {
        return Err(PortError::other(
            "queued conversation moved under its row lock",
        ));
    }
    Ok(Some((next, outcome)))
}

/// A command's decision on one read of its instance.
struct Decided {
    instance: Instance,
    outcome: Outcome,
    /// The state and version the decision was made on.
    seen: (ConversationState, i64),
    tasks: Vec<parlance_ports::TaskSpec>,
}

impl Decided {
    fn promotes(&self) -> bool {
        self.outcome.effects.contains(&Effect::PromoteNextQueued)
    }
}

/// The instance's row, read with `suffix` (a plain read, or `FOR UPDATE`);
/// `NotFound` when there is none.
async fn load(
    conn: &mut PgConnection,
    product: &ProductId,
    id: InstanceId,
    suffix: &str,
) -> PortResult<PgRow> {
    sqlx::query(&format!(
        "SELECT record, version FROM conversation_instances \
         WHERE product_id = $1 AND instance_id = $2{suffix}"
    ))
    .bind(product.as_str())
    .bind(id.as_uuid())
    .fetch_optional(conn)
    .await
    .map_err(pg_err("load conversation"))?
    .ok_or_else(|| PortError::not_found(format!("no conversation {id}")))
}

/// Runs `command` on the instance in `row`; the inner error is a refusal.
fn decide(row: &PgRow, command: &Command) -> PortResult<Result<Decided, ConversationError>> {
    let mut instance = decode(row)?;
    let seen = (instance.state, version(&instance));
    let outcome = match command(&mut instance) {
        Ok(o) => o,
        Err(e) => return Ok(Err(e)),
    };
    instance.version += 1;
    let tasks = effect_tasks(&instance, &outcome);
    Ok(Ok(Decided {
        instance,
        outcome,
        seen,
        tasks,
    }))
}

impl PgConversationStore {
    /// Writes a decision on `conn` with everything that commits with it:
    /// the guarded transition, the promotion it asks for (with its audit
    /// entries) and the tasks of both. `None` when the instance moved since
    /// the decision: nothing was written.
    async fn finish(
        &self,
        conn: &mut PgConnection,
        d: &Decided,
        now: Timestamp,
    ) -> PortResult<Option<Applied>> {
        if !write_transition(conn, &d.instance, d.seen, &d.outcome, now).await? {
            return Ok(None);
        }
        let promoted = if d.promotes() {
            promote_next(conn, &d.instance, now).await?
        } else {
            None
        };
        let mut tasks = d.tasks.clone();
        if let Some((p, o)) = &promoted {
            tasks.extend(effect_tasks(p, o));
        }
        if !tasks.is_empty() {
            self.queue.enqueue_in(conn, &tasks).await?;
        }
        Ok(Some(Applied {
            instance: d.instance.clone(),
            outcome: d.outcome.clone(),
            promoted,
        }))
    }
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
        self.queue
            .enqueue_in(&mut tx, &effect_tasks(&instance, &outcome))
            .await?;
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
        // Decide on a plain read, write with a guard.
        let mut conn = self.pool.acquire().await.map_err(pg_err("acquire"))?;
        let row = load(&mut conn, product, id, "").await?;
        drop(conn);
        let decided = match decide(&row, &command)? {
            Ok(d) => d,
            Err(e) => return Ok(Err(e)),
        };
        let alone = !decided.promotes() && decided.tasks.is_empty();
        if alone {
            let mut conn = self.pool.acquire().await.map_err(pg_err("acquire"))?;
            if let Some(applied) = self.finish(&mut conn, &decided, now).await? {
                return Ok(Ok(applied));
            }
        } else {
            let mut tx = self.pool.begin().await.map_err(pg_err("begin"))?;
            if let Some(applied) = self.finish(&mut tx, &decided, now).await? {
                tx.commit().await.map_err(pg_err("commit"))?;
                return Ok(Ok(applied));
            }
        }
        // Another write landed in between: decide again under the row lock.
        let mut tx = self.pool.begin().await.map_err(pg_err("begin"))?;
        let row = load(&mut tx, product, id, " FOR UPDATE").await?;
        let decided = match decide(&row, &command)? {
            Ok(d) => d,
            // Dropping the transaction rolls it back: nothing changed.
            Err(e) => return Ok(Err(e)),
        };
        let applied = self
            .finish(&mut tx, &decided, now)
            .await?
            .ok_or_else(|| PortError::other("conversation moved under its row lock"))?;
        tx.commit().await.map_err(pg_err("commit"))?;
        Ok(Ok(applied))
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
