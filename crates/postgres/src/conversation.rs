//! Conversation instances in PostgreSQL.
//!
//! A commit is written by one guarded statement: the row insert (`ON
//! CONFLICT DO NOTHING`, for a creation) or update (`WHERE version =
//! $expected`), with the transcript messages and the audit entries as
//! data-modifying CTEs that insert only when the row was written, and so
//! are the decision's single tasks (same dedup rule and wake-up hint as the
//! queue's own enqueue). A guard that does not match (the instance moved
//! since it was loaded, or a created one exists) writes nothing and is a
//! `Conflict`: the caller decides again on a fresh load. A change commits
//! on its own, one statement and one round trip, unless it promotes or asks
//! for a DAG: then that statement runs in a transaction that also enqueues
//! the DAG and promotes. A creation runs in a transaction too (below).
//!
//! Creation and promotion lock the contact's row in `conversation_contacts`
//! first; a creation is decided again under that lock with whether the
//! contact is held, and the partial unique index `conversation_one_holder`
//! makes a second holder impossible whatever the code does. Lock order:
//! instance, then contact; promotion takes the queued instance with `SKIP
//! LOCKED`, so it never waits while holding the contact.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use parlance_core::conversation::{
    ConversationCommand, ConversationContext, ConversationEffect, ConversationKey, Instance,
    InstanceId, Message, Role,
};
use parlance_core::{Command as _, Decision, Machine, ProductId, Task, Timestamp};
use parlance_ports::{
    Commit, Committed, ConversationPage, ConversationStore, ListCursor, ListFilter, ListOrder,
    MAX_LIST, MachineStore, PortError, PortResult, Stored, Version,
};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Postgres, QueryBuilder, Row as _};

use crate::PgTaskQueue;
use crate::error::pg_err;
use crate::queue::{TaskRows, enqueue_after_u};
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
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    ///
    /// use parlance_core::conversation::{
    ///     ContactId, ConversationCommand, ConversationContext, ConversationKey, ConversationState,
    ///     Instance, NewInstance,
    /// };
    /// use parlance_core::{Machine, ProductId};
    /// use parlance_ports::{Clock, Commit, ConversationStore, ListFilter, MachineStore, ManualClock, QueueConfig};
    /// use parlance_postgres::{PgConversationStore, PgTaskQueue};
    ///
    /// // A fresh, migrated database; an application opens its pool with
    /// // `connect` and runs `migrate`. `None` where no PostgreSQL is configured.
    /// let Some(pool) = parlance_postgres::testing::test_pool().await else { return Ok(()) };
    /// let clock = Arc::new(ManualClock::new());
    /// let queue = PgTaskQueue::new(pool.clone(), clock.clone(), QueueConfig::default());
    /// let store = PgConversationStore::new(pool, queue);
    /// let acme = ProductId::parse("acme")?;
    /// let key = ConversationKey {
    ///     product_id: acme.clone(),
    ///     instance_id: "0196b2a0-0000-7000-8000-000000000001".parse()?,
    /// };
    /// let command = ConversationCommand::Create(NewInstance {
    ///     product_id: acme.clone(),
    ///     instance_id: key.instance_id,
    ///     contact_id: ContactId::parse("+15550100")?,
    ///     channel: "whatsapp".to_owned(),
    ///     objective: "book a demo".to_owned(),
    ///     todos: vec![],
    ///     heartbeat_interval_s: 3600,
    ///     max_follow_ups: 2,
    ///     metadata: serde_json::Map::new(),
    /// });
    /// let free = ConversationContext { contact_held: false };
    /// let (state, decision) = Instance::create(&key, &free, &command, clock.now())?.expect("created");
    /// store
    ///     .commit(Commit {
    ///         key: &key,
    ///         expected: None,
    ///         command: &command,
    ///         state: &state,
    ///         decision: &decision,
    ///         now: clock.now(),
    ///     })
    ///     .await?;
    ///
    /// let listed = store.list(&acme, &ListFilter::default()).await?;
    /// assert_eq!(listed.items.len(), 1);
    /// assert_eq!(listed.items[0].state.state, ConversationState::Created);
    /// assert!(store.transcript(&key).await?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(pool: PgPool, queue: PgTaskQueue) -> Self {
        Self { pool, queue }
    }
}

fn decode(row: &PgRow) -> PortResult<Stored<Instance>> {
    let record: serde_json::Value = row.try_get("record").map_err(pg_err("read conversation"))?;
    let version: i64 = row
        .try_get("version")
        .map_err(pg_err("read conversation"))?;
    let state: Instance = serde_json::from_value(record).map_err(|e| {
        PortError::other("stored conversation record does not decode").with_source(e)
    })?;
    Ok(Stored {
        state,
        version: Version::from_i64(version),
    })
}

fn encode(instance: &Instance) -> PortResult<serde_json::Value> {
    serde_json::to_value(instance)
        .map_err(|e| PortError::other("conversation record does not encode").with_source(e))
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

fn conflict(key: &ConversationKey, why: &str) -> PortError {
    PortError::conflict(format!("conversation {} {why}", key.instance_id))
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

/// The transcript lines, audit entries and tasks of a write, as
/// data-modifying CTEs on the written row `u`: they insert only when it was
/// written. The statement answers whether the row was written and whether a
/// runnable task was enqueued. Parameters `$1` to `$28` are bound by
/// [`write`]; `$29` and up are the guard's.
fn written_with_lines_audit_and_tasks(u: &str) -> String {
    format!(
        "WITH u AS ({u}), \
         m AS (INSERT INTO conversation_messages (product_id, instance_id, role, text, at, outbound_seq) \
         SELECT $1, u.instance_id, x.role, x.text, x.at, x.outbound_seq FROM u, \
         UNNEST($8::text[], $9::text[], $10::timestamptz[], $11::int4[]) WITH ORDINALITY \
         AS x(role, text, at, outbound_seq, n) ORDER BY x.n), \
         a AS (INSERT INTO audit_log (product_id, entity_kind, entity_id, from_state, to_state, cause, at, payload) \
         SELECT $1, $18, $17, x.from_state, x.to_state, x.cause, $12, x.payload \
         FROM u, UNNEST($13::text[], $14::text[], $15::text[], $16::jsonb[]) WITH ORDINALITY \
         AS x(from_state, to_state, cause, payload, n) ORDER BY x.n), \
         {} \
         SELECT (SELECT count(*) FROM u) AS written, (SELECT count(*) FROM hint) AS hinted",
        enqueue_after_u(19)
    )
}

/// A creation: the row inserted unless the instance exists.
static INSERT: LazyLock<String> = LazyLock::new(|| {
    written_with_lines_audit_and_tasks(
        "INSERT INTO conversation_instances (product_id, instance_id, contact_id, state, \
         holds_contact, version, heartbeat_due_at, created_at, record) \
         VALUES ($1, $2, $29, $3, $4, $5, $6, $30, $7) \
         ON CONFLICT (product_id, instance_id) DO NOTHING RETURNING instance_id",
    )
});

/// A change: the row updated only at the version the decision was made on.
static UPDATE: LazyLock<String> = LazyLock::new(|| {
    written_with_lines_audit_and_tasks(
        "UPDATE conversation_instances SET state = $3, holds_contact = $4, \
         version = $5, heartbeat_due_at = $6, claimed_until = NULL, record = $7 \
         WHERE product_id = $1 AND instance_id = $2 AND version = $29 \
         RETURNING instance_id",
    )
});

/// How a row is written.
#[derive(Debug, Clone, Copy)]
enum Guard {
    /// Inserted; nothing is written when the instance exists.
    Absent,
    /// Updated; nothing is written unless it is at this version.
    At(Version),
}

/// What one guarded statement did.
#[derive(Debug, Clone, Copy)]
struct Wrote {
    /// The guard matched: the row and everything with it were written.
    row: bool,
    /// A task runnable now was enqueued (its `pg_notify` hint was sent).
    runnable: bool,
}

/// Writes `state` at `key` as decided by `decision`, with its transcript
/// lines, audit entries and `tasks`, in one statement. Nothing is written
/// when the guard did not match.
async fn write(
    conn: &mut PgConnection,
    key: &ConversationKey,
    guard: Guard,
    state: &Instance,
    decision: &Decision<Instance>,
    now: Timestamp,
    tasks: &TaskRows<'_>,
) -> PortResult<Wrote> {
    let version = match guard {
        Guard::Absent => Version::FIRST,
        Guard::At(v) => v.next(),
    };
    let lines: Vec<&Message> = decision
        .effects
        .iter()
        .filter_map(|e| match e {
            ConversationEffect::Append(m) => Some(m),
            _ => None,
        })
        .collect();
    let transitions = &decision.transitions;
    let sql: &'static str = match guard {
        Guard::Absent => &INSERT,
        Guard::At(_) => &UPDATE,
    };
    let query = sqlx::query(sql)
        .bind(key.product_id.as_str())
        .bind(key.instance_id.as_uuid())
        .bind(state.state.as_str())
        .bind(state.holds_contact())
        .bind(version.as_i64())
        .bind(decision.next_deadline.map(to_pg))
        .bind(encode(state)?)
        .bind(lines.iter().map(|m| role(m.role)).collect::<Vec<_>>())
        .bind(lines.iter().map(|m| m.text.as_str()).collect::<Vec<_>>())
        .bind(lines.iter().map(|m| to_pg(m.at)).collect::<Vec<_>>())
        .bind(
            lines
                .iter()
                .map(|m| m.outbound_seq.map(|s| i32::try_from(s).unwrap_or(i32::MAX)))
                .collect::<Vec<_>>(),
        )
        .bind(to_pg(now))
        .bind(
            transitions
                .iter()
                .map(|t| t.from.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            transitions
                .iter()
                .map(|t| t.to.as_ref())
                .collect::<Vec<_>>(),
        )
        .bind(
            transitions
                .iter()
                .map(|t| t.cause.as_ref())
                .collect::<Vec<_>>(),
        )
        .bind(
            transitions
                .iter()
                .map(|t| t.detail.clone())
                .collect::<Vec<_>>(),
        )
        .bind(key.instance_id.to_string())
        .bind(Instance::KIND.as_str());
    let query = tasks.bind(query);
    let query = match guard {
        Guard::Absent => query
            .bind(state.contact_id.as_str())
            .bind(to_pg(state.created_at)),
        Guard::At(expected) => query.bind(expected.as_i64()),
    };
    // Read to the end: the statement's commit is done when this returns.
    let rows = query
        .fetch_all(&mut *conn)
        .await
        .map_err(pg_err("write conversation"))?;
    let row = rows
        .first()
        .ok_or_else(|| PortError::other("write conversation: no answer"))?;
    let written: i64 = row
        .try_get("written")
        .map_err(pg_err("write conversation"))?;
    let hinted: i64 = row
        .try_get("hinted")
        .map_err(pg_err("write conversation"))?;
    Ok(Wrote {
        row: written == 1,
        runnable: hinted > 0,
    })
}

/// An instance written by a commit, with the decision that made it.
struct Written {
    state: Instance,
    version: Version,
    decision: Decision<Instance>,
}

/// Promotes the oldest `QUEUED` instance of `holder`'s contact when no
/// instance holds the contact any more: `promote` decided on it and
/// written with its transcript lines and audit entries.
async fn promote_next(
    conn: &mut PgConnection,
    queue: &PgTaskQueue,
    holder: &Instance,
    now: Timestamp,
) -> PortResult<Option<Written>> {
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
    let Stored {
        state: mut next,
        version,
    } = decode(&row)?;
    let free = ConversationContext {
        contact_held: false,
    };
    let Ok(decision) = next.decide(&free, &ConversationCommand::Promote, now) else {
        return Ok(None);
    };
    let key = next.key();
    // The row is locked: the guard holds.
    let none = TaskRows::new(queue, [])?;
    if !write(conn, &key, Guard::At(version), &next, &decision, now, &none)
        .await?
        .row
    {
        return Err(PortError::other(
            "queued conversation moved under its row lock",
        ));
    }
    Ok(Some(Written {
        state: next,
        version: version.next(),
        decision,
    }))
}

/// Whether `decision` asks for a DAG (enqueued in a transaction of its
/// own statements; single tasks go with the row).
fn has_dag(decision: &Decision<Instance>) -> bool {
    decision.tasks.iter().any(|t| matches!(t, Task::Dag(_)))
}

impl PgConversationStore {
    /// Enqueues the DAGs of `decisions` on `conn`.
    async fn enqueue_dags(
        &self,
        conn: &mut PgConnection,
        decisions: &[&Decision<Instance>],
    ) -> PortResult<()> {
        for d in decisions {
            for task in &d.tasks {
                if let Task::Dag(dag) = task {
                    self.queue.enqueue_dag_in(conn, dag).await?;
                }
            }
        }
        Ok(())
    }

    /// A creation, decided again under the contact's lock.
    async fn create(&self, c: &Commit<'_, Instance>) -> PortResult<Committed<Instance>> {
        let ConversationCommand::Create(new) = c.command else {
            return Err(PortError::invalid(format!(
                "{} does not create a conversation",
                c.command.name()
            )));
        };
        let mut tx = self.pool.begin().await.map_err(pg_err("begin"))?;
        lock_contact(&mut tx, new.product_id.as_str(), new.contact_id.as_str()).await?;
        let held =
            contact_is_held(&mut tx, new.product_id.as_str(), new.contact_id.as_str()).await?;
        let ctx = ConversationContext { contact_held: held };
        let (state, decision) = match Instance::create(c.key, &ctx, c.command, c.now) {
            Ok(Some(created)) => created,
            Ok(None) => return Err(PortError::other("a create command created nothing")),
            Err(e) => {
                return Err(
                    PortError::invalid("the creation is refused under the contact's lock")
                        .with_source(e),
                );
            }
        };
        let tasks = TaskRows::new(&self.queue, decision.single_tasks())?;
        let wrote = write(
            &mut tx,
            c.key,
            Guard::Absent,
            &state,
            &decision,
            c.now,
            &tasks,
        )
        .await?;
        if !wrote.row {
            return Err(conflict(c.key, "exists"));
        }
        self.enqueue_dags(&mut tx, &[&decision]).await?;
        tx.commit().await.map_err(pg_err("commit"))?;
        if wrote.runnable || has_dag(&decision) {
            self.queue.wake_workers();
        }
        let mut done = Committed::at(Version::FIRST);
        if state != *c.state {
            done.written = Some((state, decision));
        }
        Ok(done)
    }

    /// A change at version `expected`, with the promotion it asks for.
    async fn change(
        &self,
        c: &Commit<'_, Instance>,
        expected: Version,
    ) -> PortResult<Committed<Instance>> {
        let tasks = TaskRows::new(&self.queue, c.decision.single_tasks())?;
        let promotes = c
            .decision
            .effects
            .contains(&ConversationEffect::PromoteNextQueued);
        let guard = Guard::At(expected);
        if !promotes && !has_dag(c.decision) {
            // One statement, atomic on its own: the row, its lines, its
            // audit entries and its tasks.
            let mut conn = self.pool.acquire().await.map_err(pg_err("acquire"))?;
            let wrote = write(&mut conn, c.key, guard, c.state, c.decision, c.now, &tasks).await?;
            if !wrote.row {
                return Err(conflict(c.key, "moved since it was loaded"));
            }
            if wrote.runnable {
                self.queue.wake_workers();
            }
            return Ok(Committed::at(expected.next()));
        }
        let mut tx = self.pool.begin().await.map_err(pg_err("begin"))?;
        let wrote = write(&mut tx, c.key, guard, c.state, c.decision, c.now, &tasks).await?;
        if !wrote.row {
            // Dropping the transaction rolls it back: nothing was written.
            return Err(conflict(c.key, "moved since it was loaded"));
        }
        let promoted = if promotes {
            promote_next(&mut tx, &self.queue, c.state, c.now).await?
        } else {
            None
        };
        // The decision's single tasks went with its row; the promoted
        // one's, and every DAG, are enqueued here.
        let mut wake = wrote.runnable;
        if let Some(p) = &promoted {
            let singles: Vec<_> = p.decision.single_tasks().cloned().collect();
            if !singles.is_empty() {
                self.queue.enqueue_in(&mut tx, &singles).await?;
                wake = true;
            }
        }
        let mut decisions = vec![c.decision];
        decisions.extend(promoted.as_ref().map(|p| &p.decision));
        self.enqueue_dags(&mut tx, &decisions).await?;
        wake |= decisions.iter().any(|d| has_dag(d));
        tx.commit().await.map_err(pg_err("commit"))?;
        if wake {
            self.queue.wake_workers();
        }
        let mut done = Committed::at(expected.next());
        done.also = promoted
            .into_iter()
            .map(|p| {
                (
                    Stored {
                        state: p.state,
                        version: p.version,
                    },
                    p.decision,
                )
            })
            .collect();
        Ok(done)
    }
}

#[async_trait]
impl MachineStore<Instance> for PgConversationStore {
    async fn load(&self, key: &ConversationKey) -> PortResult<Option<Stored<Instance>>> {
        let row = sqlx::query(
            "SELECT record, version FROM conversation_instances \
             WHERE product_id = $1 AND instance_id = $2",
        )
        .bind(key.product_id.as_str())
        .bind(key.instance_id.as_uuid())
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("load conversation"))?;
        row.first().map(decode).transpose()
    }

    async fn commit(&self, c: Commit<'_, Instance>) -> PortResult<Committed<Instance>> {
        match c.expected {
            None => self.create(&c).await,
            Some(expected) => self.change(&c, expected).await,
        }
    }
}

#[async_trait]
impl ConversationStore for PgConversationStore {
    async fn list(&self, product: &ProductId, filter: &ListFilter) -> PortResult<ConversationPage> {
        let limit = filter.limit.unwrap_or(MAX_LIST).min(MAX_LIST);
        // One more than the page, to know whether another follows.
        let fetch = i64::try_from(limit).unwrap_or(1000) + 1;
        let newest = filter.order == ListOrder::NewestFirst;
        let mut states: Vec<&str> = filter.states.iter().map(|s| s.as_str()).collect();
        states.sort_unstable();
        states.dedup();
        // Only the conditions asked for are in the statement, so each shape
        // gets a plan of its own on the indexes by contact, by state and by
        // product, each in creation order (`seq`).
        let page = |q: &mut QueryBuilder<'_, Postgres>, state: Option<&str>| {
            q.push("SELECT record, version, seq FROM conversation_instances WHERE product_id = ")
                .push_bind(product.as_str().to_owned());
            if let Some(contact) = &filter.contact_id {
                q.push(" AND contact_id = ")
                    .push_bind(contact.as_str().to_owned());
            }
            match (state, states.as_slice()) {
                (Some(one), _) | (None, &[one]) => {
                    q.push(" AND state = ").push_bind(one.to_owned());
                }
                (None, []) => {}
                (None, several) => {
                    let names: Vec<String> = several.iter().map(|s| (*s).to_owned()).collect();
                    q.push(" AND state = ANY(").push_bind(names).push(")");
                }
            }
            if let Some(ListCursor(after)) = filter.after {
                // A cursor past any `seq` leaves nothing after (or
                // everything before) it.
                let after = i64::try_from(after).unwrap_or(i64::MAX);
                q.push(if newest { " AND seq < " } else { " AND seq > " })
                    .push_bind(after);
            }
            q.push(if newest {
                " ORDER BY seq DESC LIMIT "
            } else {
                " ORDER BY seq LIMIT "
            })
            .push_bind(fetch);
        };
        let mut q = QueryBuilder::<Postgres>::new("");
        if filter.contact_id.is_none() && states.len() > 1 {
            // Several states of a whole product: a page of each, read in
            // order from the index by state, merged. Its cost is the
            // page's, however many instances each state holds; one scan
            // filtering on every state would read all of them.
            q.push("SELECT record, version, seq FROM (");
            for (i, state) in states.iter().enumerate() {
                if i > 0 {
                    q.push(" UNION ALL ");
                }
                q.push("(");
                page(&mut q, Some(state));
                q.push(")");
            }
            q.push(if newest {
                ") AS pages ORDER BY seq DESC LIMIT "
            } else {
                ") AS pages ORDER BY seq LIMIT "
            })
            .push_bind(fetch);
        } else {
            // One state, any state, or one contact's few instances.
            page(&mut q, None);
        }
        let rows = q
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(pg_err("list conversations"))?;
        let mut items = Vec::with_capacity(rows.len().min(limit));
        let mut next = None;
        for row in &rows {
            if items.len() == limit {
                break;
            }
            items.push(decode(row)?);
            let seq: i64 = row.try_get("seq").map_err(pg_err("list conversations"))?;
            if rows.len() > limit && items.len() == limit {
                next = u64::try_from(seq).ok().map(ListCursor);
            }
        }
        Ok(ConversationPage { items, next })
    }

    async fn transcript(&self, key: &ConversationKey) -> PortResult<Vec<Message>> {
        let rows = sqlx::query(
            "SELECT role, text, at, outbound_seq FROM conversation_messages \
             WHERE product_id = $1 AND instance_id = $2 ORDER BY seq",
        )
        .bind(key.product_id.as_str())
        .bind(key.instance_id.as_uuid())
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("load transcript"))?;
        if rows.is_empty() {
            // No line yet, or no such instance.
            let exists: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM conversation_instances \
                 WHERE product_id = $1 AND instance_id = $2)",
            )
            .bind(key.product_id.as_str())
            .bind(key.instance_id.as_uuid())
            .fetch_one(&self.pool)
            .await
            .map_err(pg_err("load conversation"))?;
            if !exists {
                return Err(PortError::not_found(format!(
                    "no conversation {}",
                    key.instance_id
                )));
            }
        }
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

    async fn claim_due(
        &self,
        now: Timestamp,
        limit: usize,
        lease: Duration,
    ) -> PortResult<Vec<ConversationKey>> {
        let rows = sqlx::query(
            "UPDATE conversation_instances SET claimed_until = $2 \
             WHERE (product_id, instance_id) IN ( \
               SELECT product_id, instance_id FROM conversation_instances \
               WHERE heartbeat_due_at <= $1 AND (claimed_until IS NULL OR claimed_until <= $1) \
               ORDER BY heartbeat_due_at LIMIT $3 FOR UPDATE SKIP LOCKED) \
             RETURNING product_id, instance_id, heartbeat_due_at, seq",
        )
        .bind(to_pg(now))
        .bind(to_pg(now + lease))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("claim due conversations"))?;
        let mut due = rows
            .iter()
            .map(|row| {
                let product: String = row.try_get("product_id")?;
                let id: uuid::Uuid = row.try_get("instance_id")?;
                let at: time::OffsetDateTime = row.try_get("heartbeat_due_at")?;
                let seq: i64 = row.try_get("seq")?;
                Ok((at, seq, product, id))
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(pg_err("read due conversations"))?;
        due.sort_by_key(|(at, seq, ..)| (*at, *seq));
        due.into_iter()
            .map(|(_, _, product, id)| {
                Ok(ConversationKey {
                    product_id: ProductId::parse(product).map_err(|e| {
                        PortError::other("stored conversation has an invalid product id")
                            .with_source(e)
                    })?,
                    instance_id: InstanceId::from_uuid(id),
                })
            })
            .collect()
    }

    async fn oldest_due(&self, now: Timestamp) -> PortResult<Option<Timestamp>> {
        let oldest: Option<time::OffsetDateTime> = sqlx::query_scalar(
            "SELECT min(heartbeat_due_at) FROM conversation_instances \
             WHERE heartbeat_due_at <= $1 AND (claimed_until IS NULL OR claimed_until <= $1)",
        )
        .bind(to_pg(now))
        .fetch_one(&self.pool)
        .await
        .map_err(pg_err("read the oldest due conversation"))?;
        Ok(oldest.map(from_pg))
    }

    async fn record_delivery(
        &self,
        key: &ConversationKey,
        outbound_seq: u32,
        now: Timestamp,
    ) -> PortResult<bool> {
        let done = sqlx::query(
            "INSERT INTO conversation_deliveries (product_id, instance_id, outbound_seq, recorded_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        )
        .bind(key.product_id.as_str())
        .bind(key.instance_id.as_uuid())
        .bind(i32::try_from(outbound_seq).unwrap_or(i32::MAX))
        .bind(to_pg(now))
        .execute(&self.pool)
        .await
        .map_err(pg_err("record delivery"))?;
        Ok(done.rows_affected() == 1)
    }
}
