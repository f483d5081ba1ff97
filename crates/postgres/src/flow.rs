//! Flow sessions in `flow_sessions`, `flow_dialogue` and `flow_progress`;
//! each write's audit entries go to `audit_log` in the same transaction.

use std::sync::Arc;

use async_trait::async_trait;
use parlance_core::flow::{Actor, DialogueElement, FlowSession};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{
    ChainProgress, DagId, DagStart, FlowAppend, FlowStore, PortError, PortResult, ProgressUpdate,
    StoredFlowSession,
};
use sqlx::{PgPool, Postgres, QueryBuilder, Row as _};

use crate::PgTaskQueue;
use crate::audit::insert_entries;
use crate::error::pg_err;
use crate::time::{from_pg, to_pg};

/// Flow sessions stored in PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgFlowStore {
    pool: PgPool,
    queue: Option<Arc<PgTaskQueue>>,
}

impl PgFlowStore {
    /// A store on `pool` (migrated), without a task queue
    /// (`save_and_enqueue` is `Unavailable`).
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
}

fn encode(session: &FlowSession) -> PortResult<serde_json::Value> {
    serde_json::to_value(session)
        .map_err(|e| PortError::invalid("flow session does not encode").with_source(e))
}

fn decode(v: serde_json::Value) -> PortResult<FlowSession> {
    serde_json::from_value(v)
        .map_err(|e| PortError::other("stored flow session does not decode").with_source(e))
}

fn actor_from(s: &str) -> Actor {
    match s {
        "system" => Actor::System,
        "user" => Actor::User,
        _ => Actor::Assistant,
    }
}

async fn insert_dialogue(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    product_id: &ProductId,
    session_id: &str,
    first_seq: i64,
    elements: &[DialogueElement],
) -> Result<(), sqlx::Error> {
    if elements.is_empty() {
        return Ok(());
    }
    let mut q: QueryBuilder<'_, Postgres> = QueryBuilder::new(
        "INSERT INTO flow_dialogue (product_id, session_id, seq, actor, event, actor_text, at) ",
    );
    q.push_values(elements.iter().enumerate(), |mut b, (i, e)| {
        b.push_bind(product_id.as_str())
            .push_bind(session_id)
            .push_bind(first_seq + i as i64)
            .push_bind(e.actor.as_str())
            .push_bind(&e.event)
            .push_bind(e.actor_text.as_deref())
            .push_bind(to_pg(e.timestamp));
    });
    q.build().execute(&mut **tx).await.map(|_| ())
}

/// The compare-and-swap save inside `tx`.
async fn save_in(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    product_id: &ProductId,
    session: &FlowSession,
    expected_version: i64,
    append: FlowAppend<'_>,
    progress: Option<&ProgressUpdate>,
    now: Timestamp,
) -> PortResult<i64> {
    let data = encode(session)?;
    let row = sqlx::query(
        "UPDATE flow_sessions SET data = $3, state = $4, version = version + 1, \
             dialogue_len = dialogue_len + $5, updated_at = $6 \
             WHERE product_id = $1 AND session_id = $2 AND version = $7 \
             RETURNING version, dialogue_len",
    )
    .bind(product_id.as_str())
    .bind(&session.session_id)
    .bind(&data)
    .bind(&session.state)
    .bind(append.dialogue.len() as i64)
    .bind(to_pg(now))
    .bind(expected_version)
    .fetch_optional(&mut **tx)
    .await
    .map_err(pg_err("save flow session"))?;
    let Some(row) = row else {
        let exists =
            sqlx::query("SELECT 1 FROM flow_sessions WHERE product_id = $1 AND session_id = $2")
                .bind(product_id.as_str())
                .bind(&session.session_id)
                .fetch_optional(&mut **tx)
                .await
                .map_err(pg_err("save flow session"))?;
        return Err(match exists {
            Some(_) => PortError::conflict("flow session version moved"),
            None => PortError::not_found("no such flow session"),
        });
    };
    let version: i64 = row
        .try_get("version")
        .map_err(pg_err("save flow session"))?;
    let len: i64 = row
        .try_get("dialogue_len")
        .map_err(pg_err("save flow session"))?;
    insert_dialogue(
        tx,
        product_id,
        &session.session_id,
        len - append.dialogue.len() as i64 + 1,
        append.dialogue,
    )
    .await
    .map_err(pg_err("append flow dialogue"))?;
    insert_entries(&mut **tx, append.audit)
        .await
        .map_err(pg_err("audit flow transition"))?;
    if let Some(p) = progress {
        sqlx::query(
            "INSERT INTO flow_progress (product_id, session_id, chain_id, label, total, done) \
                 VALUES ($1, $2, $3, COALESCE($4, ''), $5, $6) \
                 ON CONFLICT (product_id, session_id, chain_id) \
                 DO UPDATE SET total = flow_progress.total + EXCLUDED.total, \
                 done = flow_progress.done + EXCLUDED.done, \
                 label = COALESCE($4, flow_progress.label)",
        )
        .bind(product_id.as_str())
        .bind(&session.session_id)
        .bind(&p.chain_id)
        .bind(p.label.as_deref())
        .bind(p.add_total)
        .bind(p.add_done)
        .execute(&mut **tx)
        .await
        .map_err(pg_err("start flow progress"))?;
    }
    Ok(version)
}

#[async_trait]
impl FlowStore for PgFlowStore {
    async fn create(
        &self,
        product_id: &ProductId,
        session: &FlowSession,
        append: FlowAppend<'_>,
        now: Timestamp,
    ) -> PortResult<i64> {
        let data = encode(session)?;
        let mut tx = self.pool.begin().await.map_err(pg_err("begin"))?;
        sqlx::query(
            "INSERT INTO flow_sessions (product_id, session_id, flow, state, version, data, dialogue_len, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, 1, $5, $6, $7, $7)",
        )
        .bind(product_id.as_str())
        .bind(&session.session_id)
        .bind(&session.flow)
        .bind(&session.state)
        .bind(&data)
        .bind(append.dialogue.len() as i64)
        .bind(to_pg(now))
        .execute(&mut *tx)
        .await
        .map_err(pg_err("create flow session"))?;
        insert_dialogue(&mut tx, product_id, &session.session_id, 1, append.dialogue)
            .await
            .map_err(pg_err("append flow dialogue"))?;
        insert_entries(&mut *tx, append.audit)
            .await
            .map_err(pg_err("audit flow transition"))?;
        tx.commit().await.map_err(pg_err("commit"))?;
        Ok(1)
    }

    async fn load(
        &self,
        product_id: &ProductId,
        session_id: &str,
    ) -> PortResult<StoredFlowSession> {
        let row = sqlx::query(
            "SELECT version, data, dialogue_len FROM flow_sessions WHERE product_id = $1 AND session_id = $2",
        )
        .bind(product_id.as_str())
        .bind(session_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(pg_err("load flow session"))?
        .ok_or_else(|| PortError::not_found("no such flow session"))?;
        Ok(StoredFlowSession {
            version: row
                .try_get("version")
                .map_err(pg_err("decode flow session"))?,
            dialogue_len: row
                .try_get("dialogue_len")
                .map_err(pg_err("decode flow session"))?,
            session: decode(row.try_get("data").map_err(pg_err("decode flow session"))?)?,
        })
    }

    async fn save(
        &self,
        product_id: &ProductId,
        session: &FlowSession,
        expected_version: i64,
        append: FlowAppend<'_>,
        progress: Option<&ProgressUpdate>,
        now: Timestamp,
    ) -> PortResult<i64> {
        let mut tx = self.pool.begin().await.map_err(pg_err("begin"))?;
        let version = save_in(
            &mut tx,
            product_id,
            session,
            expected_version,
            append,
            progress,
            now,
        )
        .await?;
        tx.commit().await.map_err(pg_err("commit"))?;
        Ok(version)
    }

    async fn save_and_enqueue(
        &self,
        product_id: &ProductId,
        session: &FlowSession,
        expected_version: i64,
        append: FlowAppend<'_>,
        start: &DagStart,
        now: Timestamp,
    ) -> PortResult<(i64, DagId)> {
        let Some(queue) = &self.queue else {
            return Err(PortError::unavailable("this flow store has no task queue"));
        };
        let mut tx = self.pool.begin().await.map_err(pg_err("begin"))?;
        let dag = queue.enqueue_dag_in(&mut tx, &start.dag).await?;
        let mut session = session.clone();
        if let Some(r) = &mut session.running {
            r.dag_id = Some(dag.0);
        }
        // A lost compare-and-swap rolls the run back with the save.
        let version = save_in(
            &mut tx,
            product_id,
            &session,
            expected_version,
            append,
            Some(&start.progress),
            now,
        )
        .await?;
        tx.commit().await.map_err(pg_err("commit"))?;
        Ok((version, dag))
    }

    async fn dialogue(
        &self,
        product_id: &ProductId,
        session_id: &str,
    ) -> PortResult<Vec<DialogueElement>> {
        let mut tx = self.pool.begin().await.map_err(pg_err("begin"))?;
        let exists =
            sqlx::query("SELECT 1 FROM flow_sessions WHERE product_id = $1 AND session_id = $2")
                .bind(product_id.as_str())
                .bind(session_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(pg_err("load flow dialogue"))?;
        if exists.is_none() {
            return Err(PortError::not_found("no such flow session"));
        }
        let rows = sqlx::query(
            "SELECT actor, event, actor_text, at FROM flow_dialogue \
             WHERE product_id = $1 AND session_id = $2 ORDER BY seq",
        )
        .bind(product_id.as_str())
        .bind(session_id)
        .fetch_all(&mut *tx)
        .await
        .map_err(pg_err("load flow dialogue"))?;
        tx.commit().await.map_err(pg_err("commit"))?;
        rows.into_iter()
            .map(|r| {
                Ok(DialogueElement {
                    actor: actor_from(r.try_get::<&str, _>("actor")?),
                    event: r.try_get("event")?,
                    actor_text: r.try_get("actor_text")?,
                    timestamp: from_pg(r.try_get("at")?),
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(pg_err("decode flow dialogue"))
    }

    async fn task_done(
        &self,
        product_id: &ProductId,
        session_id: &str,
        chain_id: &str,
        done: i64,
        add_total: i64,
    ) -> PortResult<()> {
        let r = sqlx::query(
            "UPDATE flow_progress SET done = done + $4, total = total + $5 \
             WHERE product_id = $1 AND session_id = $2 AND chain_id = $3",
        )
        .bind(product_id.as_str())
        .bind(session_id)
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

    async fn progress(
        &self,
        product_id: &ProductId,
        session_id: &str,
        chain_id: &str,
    ) -> PortResult<Option<ChainProgress>> {
        let row = sqlx::query(
            "SELECT label, total, done FROM flow_progress \
             WHERE product_id = $1 AND session_id = $2 AND chain_id = $3",
        )
        .bind(product_id.as_str())
        .bind(session_id)
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
}
