//! Flow sessions in `flow_sessions`, `flow_dialogue` and `flow_progress`.
//!
//! A session is loaded with its dialogue by one statement (the dialogue
//! aggregated into arrays beside the session row). A commit is one guarded
//! statement: the session row's insert (`ON CONFLICT DO NOTHING`) or its
//! compare-and-swap update (`WHERE version = $expected`), with the
//! dialogue elements the decision appends, its audit entries and its chain
//! progress as data-modifying CTEs that write only when the row did. So a
//! turn writes the session row and one row per new dialogue element,
//! however long the dialogue is. A decision that starts a DAG runs that
//! statement in a transaction that first enqueues the DAG on the same
//! connection (`PgTaskQueue::enqueue_dag_in`, workers woken after the
//! commit) and stores the run's id in
//! the session: the run exists if and only if the commit does.
//!
//! The session's user (`user_info`, in `data`) has its email copied into
//! `user_email` by the insert alone (it never changes), indexed with the
//! product, the flow and the creation time for `user_sessions`.

use std::sync::Arc;

use async_trait::async_trait;
use parlance_core::flow::{
    Actor, DialogueElement, Email, FlowEffect, FlowKey, FlowRecord, FlowSession, FlowSessionId,
    ProgressUpdate,
};
use parlance_core::{Machine as _, ProductId, Task};
use parlance_ports::{
    ChainProgress, Commit, Committed, FlowStore, MachineStore, PortError, PortResult, Stored,
    Version, audit_entries,
};
use sqlx::{PgConnection, PgPool, Row as _};
use time::OffsetDateTime;

use crate::PgTaskQueue;
use crate::error::pg_err;
use crate::time::{from_pg, to_pg};

/// Flow sessions stored in PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgFlowStore {
    pool: PgPool,
    queue: Option<Arc<PgTaskQueue>>,
}

impl PgFlowStore {
    /// A store on `pool` (migrated), without a task queue (a commit that
    /// starts a DAG is `Unavailable`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use parlance_core::ProductId;
    /// use parlance_core::flow::{Email, FlowKey, FlowSessionId};
    /// use parlance_ports::{FlowStore, MachineStore};
    /// use parlance_postgres::PgFlowStore;
    ///
    /// // A fresh, migrated database; an application opens its pool with
    /// // `connect` and runs `migrate`. `None` where no PostgreSQL is configured.
    /// let Some(pool) = parlance_postgres::testing::test_pool().await else { return Ok(()) };
    /// let store = PgFlowStore::new(pool);
    /// let acme = ProductId::parse("acme")?;
    /// let key = FlowKey::new(acme.clone(), FlowSessionId::parse("s-1")?);
    ///
    /// // Sessions are created by committing the flow machine's decisions, as for
    /// // every machine; until then there is nothing to read.
    /// assert!(store.load(&key).await?.is_none());
    /// assert!(store.dialogue(&key).await.unwrap_err().is_not_found());
    /// let email = Email::parse("ada@example.com")?;
    /// assert!(store.user_sessions(&acme, "onboarding", &email, 10).await?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(pool: PgPool) -> Self {
        Self { pool, queue: None }
    }

    /// A store on `pool` that enqueues DAGs on `queue` in its own
    /// transactions (the queue must use the same database).
    pub fn with_queue(pool: PgPool, queue: Arc<PgTaskQueue>) -> Self {
        Self {
            pool,
            queue: Some(queue),
        }
    }

    /// The session's row with its first `len` dialogue elements as arrays,
    /// in one statement; `None` when there is no such session.
    async fn with_prefix(
        &self,
        key: &FlowKey,
        len: u64,
    ) -> PortResult<Option<sqlx::postgres::PgRow>> {
        sqlx::query(
            "SELECT s.version, s.data::text AS data, d.actors, d.events, d.texts, d.ats \
             FROM flow_sessions s LEFT JOIN LATERAL (\
             SELECT array_agg(actor ORDER BY seq) AS actors, array_agg(event ORDER BY seq) AS events, \
             array_agg(actor_text ORDER BY seq) AS texts, array_agg(at ORDER BY seq) AS ats \
             FROM flow_dialogue WHERE product_id = s.product_id AND session_id = s.session_id \
             AND seq <= $3) d ON true \
             WHERE s.product_id = $1 AND s.session_id = $2",
        )
        .bind(key.product_id.as_str())
        .bind(key.session_id.as_str())
        .bind(i64::try_from(len).unwrap_or(i64::MAX))
        .fetch_optional(&self.pool)
        .await
        .map_err(pg_err("load flow session"))
    }
}

/// The session as JSON text, stored in a `json` column (not `jsonb`, which
/// would reorder the keys of its model).
fn encode(session: &FlowSession) -> PortResult<String> {
    serde_json::to_string(session)
        .map_err(|e| PortError::invalid("flow session does not encode").with_source(e))
}

fn decode(text: &str) -> PortResult<FlowSession> {
    serde_json::from_str(text)
        .map_err(|e| PortError::other("stored flow session does not decode").with_source(e))
}

fn actor_from(s: &str) -> Actor {
    match s {
        "system" => Actor::System,
        "user" => Actor::User,
        _ => Actor::Assistant,
    }
}

/// The writes of a commit beside the session row, in the order the CTEs of
/// [`INSERT_SESSION`] and [`UPDATE_SESSION`] bind them.
macro_rules! commit_tail {
    () => {
        "d AS (INSERT INTO flow_dialogue (product_id, session_id, seq, actor, event, actor_text, at) \
         SELECT $1, $2, s.dialogue_len - $6 + x.n, x.actor, x.event, x.actor_text, x.at \
         FROM s, UNNEST($9::text[], $10::text[], $11::text[], $12::timestamptz[]) WITH ORDINALITY \
         AS x(actor, event, actor_text, at, n)), \
         a AS (INSERT INTO audit_log (product_id, entity_kind, entity_id, from_state, to_state, cause, at, payload) \
         SELECT $1, $13, $2, x.from_state, x.to_state, x.cause, $7, x.payload \
         FROM s, UNNEST($14::text[], $15::text[], $16::text[], $17::jsonb[]) WITH ORDINALITY \
         AS x(from_state, to_state, cause, payload, n) ORDER BY x.n), \
         p AS (SELECT x.* FROM s, UNNEST($18::text[], $19::text[], $20::int8[], $21::int8[]) \
         AS x(chain_id, label, total, done)), \
         pu AS (UPDATE flow_progress f SET total = f.total + p.total, done = f.done + p.done, \
         label = COALESCE(p.label, f.label) FROM p \
         WHERE f.product_id = $1 AND f.session_id = $2 AND f.chain_id = p.chain_id \
         RETURNING f.chain_id), \
         pi AS (INSERT INTO flow_progress (product_id, session_id, chain_id, label, total, done) \
         SELECT $1, $2, p.chain_id, COALESCE(p.label, ''), p.total, p.done FROM p \
         WHERE p.chain_id NOT IN (SELECT chain_id FROM pu)) \
         SELECT count(*) FROM s"
    };
}

/// A new session row and what its creation writes beside it; counts 0 when
/// the session exists.
const INSERT_SESSION: &str = concat!(
    "WITH s AS (INSERT INTO flow_sessions (product_id, session_id, flow, state, version, data, \
     dialogue_len, created_at, updated_at, user_email) \
     VALUES ($1, $2, $22, $4, $5, $3::json, $6, $7, $7, $23) \
     ON CONFLICT (product_id, session_id) DO NOTHING RETURNING dialogue_len), ",
    commit_tail!()
);

/// The session row's compare-and-swap on version `$8` and what the change
/// writes beside it; counts 0 when the version moved or the row is gone.
const UPDATE_SESSION: &str = concat!(
    "WITH s AS (UPDATE flow_sessions SET data = $3::json, state = $4, version = $5, \
     dialogue_len = dialogue_len + $6, updated_at = $7 \
     WHERE product_id = $1 AND session_id = $2 AND version = $8 RETURNING dialogue_len), ",
    commit_tail!()
);

/// Sums the decision's progress updates per chain, in order of first
/// mention (one upsert per chain; the last label named stands).
fn progress_updates(effects: &[FlowEffect]) -> Vec<ProgressUpdate> {
    let mut out: Vec<ProgressUpdate> = Vec::new();
    for effect in effects {
        let FlowEffect::Progress(p) = effect else {
            continue;
        };
        match out.iter_mut().find(|q| q.chain_id == p.chain_id) {
            Some(q) => {
                q.add_total += p.add_total;
                q.add_done += p.add_done;
                if p.label.is_some() {
                    q.label.clone_from(&p.label);
                }
            }
            None => out.push(p.clone()),
        }
    }
    out
}

/// Writes the session row of `c` (with `state`, which may carry the id of
/// a run enqueued on the same connection) and what its decision writes
/// beside it, in one statement. `false` when the guard failed: the session
/// exists (a create) or moved (an update), and nothing was written.
async fn write(
    conn: &mut PgConnection,
    c: &Commit<'_, FlowRecord>,
    state: &FlowRecord,
) -> PortResult<bool> {
    let session = state.session();
    let dialogue: Vec<&DialogueElement> = c
        .decision
        .effects
        .iter()
        .filter_map(|e| match e {
            FlowEffect::Dialogue(d) => Some(d),
            _ => None,
        })
        .collect();
    let audit = audit_entries::<FlowRecord>(c.key, c.decision, c.now);
    let progress = progress_updates(&c.decision.effects);
    let version = c.expected.map_or(Version::FIRST, Version::next);
    let statement = match c.expected {
        None => INSERT_SESSION,
        Some(_) => UPDATE_SESSION,
    };
    let matched: i64 = sqlx::query_scalar(statement)
        .bind(c.key.product_id.as_str())
        .bind(c.key.session_id.as_str())
        .bind(encode(session)?)
        .bind(&session.state)
        .bind(version.as_i64())
        .bind(i64::try_from(dialogue.len()).unwrap_or(i64::MAX))
        .bind(to_pg(c.now))
        .bind(c.expected.map(Version::as_i64))
        .bind(
            dialogue
                .iter()
                .map(|e| e.actor.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            dialogue
                .iter()
                .map(|e| e.event.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            dialogue
                .iter()
                .map(|e| e.actor_text.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            dialogue
                .iter()
                .map(|e| to_pg(e.timestamp))
                .collect::<Vec<_>>(),
        )
        .bind(FlowRecord::KIND.as_str())
        .bind(audit.iter().map(|e| e.from.as_deref()).collect::<Vec<_>>())
        .bind(audit.iter().map(|e| e.to.as_str()).collect::<Vec<_>>())
        .bind(audit.iter().map(|e| e.cause.as_str()).collect::<Vec<_>>())
        .bind(audit.iter().map(|e| e.payload.clone()).collect::<Vec<_>>())
        .bind(
            progress
                .iter()
                .map(|p| p.chain_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            progress
                .iter()
                .map(|p| p.label.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(progress.iter().map(|p| p.add_total).collect::<Vec<_>>())
        .bind(progress.iter().map(|p| p.add_done).collect::<Vec<_>>())
        .bind(&session.flow)
        .bind(session.user_info.as_ref().map(|u| u.email.as_str()))
        .fetch_one(&mut *conn)
        .await
        .map_err(pg_err("save flow session"))?;
    Ok(matched == 1)
}

/// The conflict a commit whose guard failed reports.
fn lost(c: &Commit<'_, FlowRecord>) -> PortError {
    match c.expected {
        None => PortError::conflict(format!("flow session {} exists", c.key.session_id)),
        Some(v) => PortError::conflict(format!(
            "flow session {} is no longer at version {v}",
            c.key.session_id
        )),
    }
}

/// The dialogue of a row whose arrays were aggregated by [`LOAD`].
fn dialogue_of(row: &sqlx::postgres::PgRow) -> Result<Vec<DialogueElement>, sqlx::Error> {
    let actors: Option<Vec<String>> = row.try_get("actors")?;
    let events: Option<Vec<String>> = row.try_get("events")?;
    let texts: Option<Vec<Option<String>>> = row.try_get("texts")?;
    let ats: Option<Vec<OffsetDateTime>> = row.try_get("ats")?;
    Ok(actors
        .unwrap_or_default()
        .into_iter()
        .zip(events.unwrap_or_default())
        .zip(texts.unwrap_or_default())
        .zip(ats.unwrap_or_default())
        .map(|(((actor, event), actor_text), at)| DialogueElement {
            actor: actor_from(&actor),
            event,
            actor_text,
            timestamp: from_pg(at),
        })
        .collect())
}

/// The session and version of a row with columns `version` and `data`.
fn stored_session(row: &sqlx::postgres::PgRow) -> PortResult<Stored<FlowSession>> {
    let version: i64 = row
        .try_get("version")
        .map_err(pg_err("decode flow session"))?;
    Ok(Stored {
        state: decode(
            row.try_get::<&str, _>("data")
                .map_err(pg_err("decode flow session"))?,
        )?,
        version: Version::from_i64(version),
    })
}

/// A session row with its dialogue, oldest first, as arrays (one statement,
/// one snapshot).
const LOAD: &str = "SELECT s.version, s.data::text AS data, d.actors, d.events, d.texts, d.ats \
     FROM flow_sessions s LEFT JOIN LATERAL (\
     SELECT array_agg(actor ORDER BY seq) AS actors, array_agg(event ORDER BY seq) AS events, \
     array_agg(actor_text ORDER BY seq) AS texts, array_agg(at ORDER BY seq) AS ats \
     FROM flow_dialogue WHERE product_id = s.product_id AND session_id = s.session_id) d ON true \
     WHERE s.product_id = $1 AND s.session_id = $2";

#[async_trait]
impl MachineStore<FlowRecord> for PgFlowStore {
    async fn load(&self, key: &FlowKey) -> PortResult<Option<Stored<FlowRecord>>> {
        let row = sqlx::query(LOAD)
            .bind(key.product_id.as_str())
            .bind(key.session_id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(pg_err("load flow session"))?;
        let Some(row) = row else { return Ok(None) };
        let version: i64 = row
            .try_get("version")
            .map_err(pg_err("decode flow session"))?;
        let session = decode(
            row.try_get::<&str, _>("data")
                .map_err(pg_err("decode flow session"))?,
        )?;
        let dialogue = dialogue_of(&row).map_err(pg_err("decode flow dialogue"))?;
        Ok(Some(Stored {
            state: FlowRecord::from_parts(key.product_id.clone(), session, dialogue),
            version: Version::from_i64(version),
        }))
    }

    async fn commit(&self, c: Commit<'_, FlowRecord>) -> PortResult<Committed<FlowRecord>> {
        let version = c.expected.map_or(Version::FIRST, Version::next);
        if c.decision.tasks.is_empty() {
            let mut conn = self.pool.acquire().await.map_err(pg_err("connect"))?;
            if !write(&mut conn, &c, c.state).await? {
                return Err(lost(&c));
            }
            return Ok(Committed::at(version));
        }
        let Some(queue) = &self.queue else {
            return Err(PortError::unavailable("this flow store has no task queue"));
        };
        let mut tx = self.pool.begin().await.map_err(pg_err("begin"))?;
        let singles: Vec<_> = c.decision.single_tasks().cloned().collect();
        if !singles.is_empty() {
            queue.enqueue_in(&mut tx, &singles).await?;
        }
        let mut with_run = None;
        for task in &c.decision.tasks {
            if let Task::Dag(spec) = task {
                let dag = queue.enqueue_dag_in(&mut tx, spec).await?;
                // The session waits for the decision's (only) run.
                if with_run.is_none() {
                    let mut state = c.state.clone();
                    state.set_dag_id(dag.0);
                    with_run = Some(state);
                }
            }
        }
        // A lost compare-and-swap rolls the run back with the write.
        if !write(&mut tx, &c, with_run.as_ref().unwrap_or(c.state)).await? {
            return Err(lost(&c));
        }
        tx.commit().await.map_err(pg_err("commit"))?;
        // Only now can a worker claim the run's first nodes.
        queue.wake_workers();
        Ok(Committed {
            version,
            written: with_run.map(|state| (state, c.decision.clone())),
            also: Vec::new(),
        })
    }
}

#[async_trait]
impl FlowStore for PgFlowStore {
    async fn session(&self, key: &FlowKey) -> PortResult<Option<Stored<FlowSession>>> {
        let row = sqlx::query(
            "SELECT version, data::text AS data FROM flow_sessions WHERE product_id = $1 AND session_id = $2",
        )
        .bind(key.product_id.as_str())
        .bind(key.session_id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(pg_err("load flow session"))?;
        let Some(row) = row else { return Ok(None) };
        let version: i64 = row
            .try_get("version")
            .map_err(pg_err("decode flow session"))?;
        Ok(Some(Stored {
            state: decode(
                row.try_get::<&str, _>("data")
                    .map_err(pg_err("decode flow session"))?,
            )?,
            version: Version::from_i64(version),
        }))
    }

    async fn dialogue(&self, key: &FlowKey) -> PortResult<Vec<DialogueElement>> {
        let row = sqlx::query(LOAD)
            .bind(key.product_id.as_str())
            .bind(key.session_id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(pg_err("load flow dialogue"))?
            .ok_or_else(|| PortError::not_found("no such flow session"))?;
        dialogue_of(&row).map_err(pg_err("decode flow dialogue"))
    }

    async fn dialogue_prefix(&self, key: &FlowKey, len: u64) -> PortResult<Vec<DialogueElement>> {
        let row = self
            .with_prefix(key, len)
            .await?
            .ok_or_else(|| PortError::not_found("no such flow session"))?;
        dialogue_of(&row).map_err(pg_err("decode flow dialogue"))
    }

    async fn session_with_prefix(
        &self,
        key: &FlowKey,
        len: u64,
    ) -> PortResult<Option<(Stored<FlowSession>, Vec<DialogueElement>)>> {
        let Some(row) = self.with_prefix(key, len).await? else {
            return Ok(None);
        };
        let session = stored_session(&row)?;
        let dialogue = dialogue_of(&row).map_err(pg_err("decode flow dialogue"))?;
        Ok(Some((session, dialogue)))
    }

    async fn session_with_reply(
        &self,
        key: &FlowKey,
    ) -> PortResult<Option<(Stored<FlowSession>, Option<String>)>> {
        // The latest assistant element: what `actor_from` reads as one.
        let row = sqlx::query(
            "SELECT s.version, s.data::text AS data, (SELECT d.actor_text FROM flow_dialogue d \
             WHERE d.product_id = s.product_id AND d.session_id = s.session_id \
             AND d.actor NOT IN ('system', 'user') ORDER BY d.seq DESC LIMIT 1) AS reply \
             FROM flow_sessions s WHERE s.product_id = $1 AND s.session_id = $2",
        )
        .bind(key.product_id.as_str())
        .bind(key.session_id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(pg_err("load flow session"))?;
        let Some(row) = row else { return Ok(None) };
        let session = stored_session(&row)?;
        let reply: Option<String> = row.try_get("reply").map_err(pg_err("decode flow reply"))?;
        Ok(Some((session, reply)))
    }

    async fn task_done(
        &self,
        key: &FlowKey,
        chain_id: &str,
        done: i64,
        add_total: i64,
    ) -> PortResult<()> {
        let r = sqlx::query(
            "UPDATE flow_progress SET done = done + $4, total = total + $5 \
             WHERE product_id = $1 AND session_id = $2 AND chain_id = $3",
        )
        .bind(key.product_id.as_str())
        .bind(key.session_id.as_str())
        .bind(chain_id)
        .bind(done)
        .bind(add_total)
        .execute(&self.pool)
        .await
        .map_err(pg_err("record flow progress"))?;
        if r.rows_affected() == 0 {
            return Err(PortError::not_found("no such chain"));
        }
        Ok(())
    }

    async fn progress(&self, key: &FlowKey, chain_id: &str) -> PortResult<Option<ChainProgress>> {
        let row = sqlx::query(
            "SELECT label, total, done FROM flow_progress \
             WHERE product_id = $1 AND session_id = $2 AND chain_id = $3",
        )
        .bind(key.product_id.as_str())
        .bind(key.session_id.as_str())
        .bind(chain_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(pg_err("load flow progress"))?;
        row.map(|r| {
            Ok(ChainProgress {
                chain_id: chain_id.to_owned(),
                label: r.try_get("label")?,
                total: r.try_get("total")?,
                done: r.try_get("done")?,
            })
        })
        .transpose()
        .map_err(pg_err("decode flow progress"))
    }

    async fn user_sessions(
        &self,
        product: &ProductId,
        flow: &str,
        email: &Email,
        limit: usize,
    ) -> PortResult<Vec<FlowSessionId>> {
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT session_id FROM flow_sessions \
             WHERE product_id = $1 AND flow = $2 AND user_email = $3 \
             ORDER BY created_at DESC, session_id COLLATE \"C\" DESC LIMIT $4",
        )
        .bind(product.as_str())
        .bind(flow)
        .bind(email.as_str())
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("list a user's flow sessions"))?;
        ids.into_iter()
            .map(|id| {
                FlowSessionId::parse(id)
                    .map_err(|e| PortError::other("stored flow session id").with_source(e))
            })
            .collect()
    }
}
