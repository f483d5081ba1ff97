//! Turn threads (`turn_thread`, `turn_list_append`, `turn_checkpoint`) and
//! the memory store (`memory_entry`, `memory_profile`, `memory_session`).
//!
//! A thread commits in one statement: the `turn_thread` row inserted (a new
//! thread) or bumped with a compare-and-swap on its version, its objects
//! patched with `||`, the turn's list entries inserted, one row per list
//! holding its new entries as one `json` array, and the checkpoint's
//! `turn_checkpoint` row (its objects patch, with a full copy of the objects
//! at version 1 and every `snapshot_every`th), all from the decision's
//! [`TurnEffect::Write`] delta. Nothing already stored is rewritten, so a
//! commit writes the same bytes however long the thread is.
//! A decision that carries audit entries writes them in the same
//! transaction (a thread's decisions carry none today), and so do the
//! crisis-log entries a turn carries in its delta
//! ([`CRISIS_LOG_DELTA`](parlance_ports::CRISIS_LOG_DELTA)): they are
//! inserted into `crisis_log` only when the thread row is written, and the
//! owner's memory entries a turn deletes
//! ([`FORGET_MEMORY_DELTA`](parlance_ports::FORGET_MEMORY_DELTA)): they are
//! deleted from `memory_entry` only then. A turn carrying none of these is
//! one autocommitted statement.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use futures_util::TryStreamExt as _;
use parlance_core::turn::{
    Checkpoint, CheckpointDelta, CheckpointMeta, CheckpointRef, CheckpointSource,
    DEFAULT_SNAPSHOT_EVERY, MemoryEntry, MemoryFilter, MemoryId, MemoryKind, MemoryRecord, OwnerId,
    ProceduralProfile, QueryEmbedding, RETRIEVE_CANDIDATES, Retrieved, ThreadId, ThreadKey,
    TurnEffect, TurnKey, fold_objects, retrieve_from, tokenize,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{
    Checkpointer, Commit, Committed, HistoryPage, MachineStore, MemoryStore, PortError, PortResult,
    Stored, ThreadPage, ThreadSummary, Version, audit_entries, split_crisis_entries,
    split_forgotten,
};
use serde_json::{Value, json};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row as _};

use crate::audit::insert_entries;
use crate::crisis::insert_entry;
use crate::error::pg_err;
use crate::time::{from_pg, to_pg};

/// Turn threads stored in PostgreSQL: list entries append-only, one row per
/// checkpoint and list; objects as one jsonb per thread; a version per
/// thread; one history row per checkpoint.
#[derive(Debug, Clone)]
pub struct PgCheckpointStore {
    pool: PgPool,
    snapshot_every: u64,
}

impl PgCheckpointStore {
    /// A thread store on `pool` (migrated), keeping a copy of a thread's
    /// objects every [`DEFAULT_SNAPSHOT_EVERY`] checkpoints.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use parlance_core::ProductId;
    /// use parlance_core::turn::{OwnerId, ThreadId, ThreadKey, TurnKey};
    /// use parlance_ports::{Checkpointer, MachineStore, ThreadPage};
    /// use parlance_postgres::PgCheckpointStore;
    ///
    /// // A fresh, migrated database; an application opens its pool with
    /// // `connect` and runs `migrate`. `None` where no PostgreSQL is configured.
    /// let Some(pool) = parlance_postgres::testing::test_pool().await else { return Ok(()) };
    /// let store = PgCheckpointStore::new(pool).with_snapshot_every(16);
    /// let (acme, owner) = (ProductId::parse("acme")?, OwnerId::parse("user-7")?);
    /// let thread = ThreadKey {
    ///     product_id: acme.clone(),
    ///     owner: owner.clone(),
    ///     thread: ThreadId::parse("t-1")?,
    /// };
    ///
    /// // Threads are created by committing a turn's checkpoint, as for every
    /// // machine; until then there is nothing to read.
    /// assert!(store.load(&TurnKey::whole(thread.clone())).await?.is_none());
    /// let page = ThreadPage { after: None, limit: 20 };
    /// assert!(store.threads(&acme, &owner, &page).await?.is_empty());
    /// assert!(!store.delete_thread(&thread).await?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            snapshot_every: DEFAULT_SNAPSHOT_EVERY,
        }
    }

    /// Keeps a copy of a thread's objects every `every` checkpoints (at
    /// least 1): reading an older state folds at most that many patches.
    pub fn with_snapshot_every(mut self, every: u64) -> Self {
        self.snapshot_every = every.max(1);
        self
    }
}

/// Binds a thread's key as `$1`, `$2`, `$3`.
macro_rules! bind_thread {
    ($q:expr, $t:expr) => {
        $q.bind($t.product_id.as_str())
            .bind($t.owner.as_str())
            .bind($t.thread.as_str())
    };
}

/// The objects of a thread as of checkpoint `$4`: the target checkpoint's
/// row (part 0, none when it does not exist), the nearest copy of the
/// objects at or before it (part 1), then the patches after that copy up
/// to it, oldest first (part 2).
const LOAD_AT_OBJECTS: &str = "\
    WITH snap AS ( \
        SELECT version, snapshot FROM turn_checkpoint \
        WHERE product_id = $1 AND owner_id = $2 AND thread_id = $3 \
          AND version <= $4 AND snapshot IS NOT NULL \
        ORDER BY version DESC LIMIT 1 \
    ) \
    SELECT 0 AS part, NULL::jsonb AS value, version FROM turn_checkpoint \
    WHERE product_id = $1 AND owner_id = $2 AND thread_id = $3 AND version = $4 \
    UNION ALL \
    SELECT 1, snapshot, version FROM snap \
    UNION ALL \
    SELECT 2, c.patch, c.version \
    FROM snap JOIN turn_checkpoint c \
      ON c.product_id = $1 AND c.owner_id = $2 AND c.thread_id = $3 \
     AND c.version > snap.version AND c.version <= $4 \
    ORDER BY part, version";

/// Every list entry of a thread up to checkpoint `$4`, a row per checkpoint
/// and list, in the order of the table's primary key, so the server reads
/// them in order and sorts nothing.
const LOAD_AT_ENTRIES: &str = "\
    SELECT field, entries FROM turn_list_append \
    WHERE product_id = $1 AND owner_id = $2 AND thread_id = $3 AND version <= $4 \
    ORDER BY field, version";

const HISTORY: &str = "\
    SELECT version, at, source, interrupted, forked_owner, forked_thread, forked_version \
    FROM turn_checkpoint \
    WHERE product_id = $1 AND owner_id = $2 AND thread_id = $3 \
      AND ($4::bigint IS NULL OR version < $4) \
    ORDER BY version DESC LIMIT $5";

const THREADS: &str = "\
    SELECT thread_id, version, updated_at, \
        coalesce(jsonb_typeof(objects -> '__interrupt'), 'null') <> 'null' AS interrupted \
    FROM turn_thread \
    WHERE product_id = $1 AND owner_id = $2 \
      AND ($3::timestamptz IS NULL \
           OR updated_at < $3 OR (updated_at = $3 AND thread_id COLLATE \"C\" > $4)) \
    ORDER BY updated_at DESC, thread_id COLLATE \"C\" LIMIT $5";

/// Deletes a thread's row, waiting for a commit in flight on it (which
/// holds the row) to finish; a commit after it finds no row and writes
/// nothing. Answers whether there was one.
const DELETE_THREAD: &str = "\
    DELETE FROM turn_thread WHERE product_id = $1 AND owner_id = $2 AND thread_id = $3";

/// Deletes a thread's list entries and history. Run after
/// [`DELETE_THREAD`] in the same transaction, in a statement of its own:
/// its snapshot then holds the rows of every commit the row's deletion
/// waited for, which one statement's single snapshot would miss. Run only
/// when that deletion took a row: without a row there is no lock, and a
/// thread created meanwhile would lose its rows and keep its head.
const DELETE_THREAD_ROWS: &str = "\
    WITH entries AS ( \
        DELETE FROM turn_list_append WHERE product_id = $1 AND owner_id = $2 AND thread_id = $3 \
    ) \
    DELETE FROM turn_checkpoint WHERE product_id = $1 AND owner_id = $2 AND thread_id = $3";

fn meta_of(thread: &ThreadKey, row: &PgRow) -> PortResult<CheckpointMeta> {
    let decode = pg_err("decode checkpoint history");
    let version = Version::from_i64(row.try_get("version").map_err(decode)?).0;
    let source: String = row.try_get("source").map_err(decode)?;
    let forked_owner: Option<String> = row.try_get("forked_owner").map_err(decode)?;
    let forked_thread: Option<String> = row.try_get("forked_thread").map_err(decode)?;
    let forked_version: Option<i64> = row.try_get("forked_version").map_err(decode)?;
    let forked_from = match (forked_owner, forked_thread, forked_version) {
        (Some(o), Some(t), Some(v)) => Some(CheckpointRef {
            owner: OwnerId::parse(o)
                .map_err(|e| PortError::other(format!("stored owner id: {e}")))?,
            thread: ThreadId::parse(t)
                .map_err(|e| PortError::other(format!("stored thread id: {e}")))?,
            version: Version::from_i64(v).0,
        }),
        _ => None,
    };
    Ok(CheckpointMeta {
        version,
        parent: CheckpointMeta::parent_of(thread, version, forked_from),
        at: from_pg(row.try_get("at").map_err(decode)?),
        source: CheckpointSource::parse(&source)
            .ok_or_else(|| PortError::other(format!("stored checkpoint source {source:?}")))?,
        interrupted: row.try_get("interrupted").map_err(decode)?,
    })
}

/// A checkpoint's appends as `json_to_recordset` reads them, one record
/// per list that grows (field, count, entries), as JSON text: the entries
/// are stored as the text sent.
fn append_rows<'a>(lists: impl IntoIterator<Item = (&'a String, &'a Vec<Value>)>) -> String {
    Value::Array(
        lists
            .into_iter()
            .filter(|(_, list)| !list.is_empty())
            .map(|(field, list)| json!({"field": field, "n": list.len(), "entries": list}))
            .collect(),
    )
    .to_string()
}

/// The entries of one `turn_list_append` row.
fn entries_of(row: &PgRow, decode: impl Fn(sqlx::Error) -> PortError) -> PortResult<Vec<Value>> {
    let sqlx::types::Json(entries) = row.try_get("entries").map_err(decode)?;
    Ok(entries)
}

#[async_trait]
impl Checkpointer for PgCheckpointStore {
    async fn history(
        &self,
        thread: &ThreadKey,
        page: HistoryPage,
    ) -> PortResult<Vec<CheckpointMeta>> {
        let rows = bind_thread!(sqlx::query(HISTORY), thread)
            .bind(page.before.map(|b| i64::try_from(b).unwrap_or(i64::MAX)))
            .bind(i64::try_from(page.limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(pg_err("list checkpoints"))?;
        rows.iter().map(|row| meta_of(thread, row)).collect()
    }

    async fn load_at(&self, thread: &ThreadKey, version: u64) -> PortResult<Option<Checkpoint>> {
        let Ok(at) = i64::try_from(version) else {
            return Ok(None);
        };
        // Two statements on one snapshot: a thread deleted, or deleted and
        // made again, between them cannot mix two states. The entries are
        // read alone, in their key's order, as the bulk of the state.
        let mut tx = self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
            .map_err(pg_err("begin load checkpoint"))?;
        let rows = bind_thread!(sqlx::query(LOAD_AT_OBJECTS), thread)
            .bind(at)
            .fetch_all(&mut *tx)
            .await
            .map_err(pg_err("load checkpoint"))?;
        let decode = pg_err("decode checkpoint");
        let mut found = false;
        let mut snapshot = BTreeMap::new();
        let mut patches = Vec::new();
        for row in rows {
            let part: i32 = row.try_get("part").map_err(decode)?;
            if part == 0 {
                found = true;
                continue;
            }
            let Value::Object(map) = row.try_get("value").map_err(decode)? else {
                return Err(PortError::other("a stored checkpoint patch is no object"));
            };
            let map: BTreeMap<String, Value> = map.into_iter().collect();
            if part == 1 {
                snapshot = map;
            } else {
                patches.push(map);
            }
        }
        if !found {
            tx.rollback().await.map_err(pg_err("load checkpoint"))?;
            return Ok(None);
        }
        let mut checkpoint = Checkpoint {
            version,
            objects: fold_objects(snapshot, &patches),
            ..Checkpoint::default()
        };
        {
            // Decoded as they arrive, while the server sends the rest. They
            // come field by field: each list is gathered whole, then put in
            // its place once.
            let mut rows = bind_thread!(sqlx::query(LOAD_AT_ENTRIES), thread)
                .bind(at)
                .fetch(&mut *tx);
            let mut current: Option<(String, Vec<Value>)> = None;
            while let Some(row) = rows
                .try_next()
                .await
                .map_err(pg_err("load checkpoint's lists"))?
            {
                let field: &str = row.try_get("field").map_err(decode)?;
                let entries = entries_of(&row, decode)?;
                match &mut current {
                    Some((f, list)) if f == field => list.extend(entries),
                    _ => {
                        if let Some((f, list)) = current.replace((field.to_owned(), entries)) {
                            checkpoint.lists.insert(f, list);
                        }
                    }
                }
            }
            if let Some((f, list)) = current {
                checkpoint.lists.insert(f, list);
            }
        }
        tx.commit().await.map_err(pg_err("load checkpoint"))?;
        Ok(Some(checkpoint))
    }

    async fn fork(
        &self,
        from: &ThreadKey,
        version: u64,
        to: &ThreadKey,
        now: Timestamp,
    ) -> PortResult<CheckpointMeta> {
        if from.product_id != to.product_id {
            return Err(PortError::invalid("a thread forks within its product"));
        }
        let Some(state) = self.load_at(from, version).await? else {
            return Err(PortError::not_found(format!(
                "thread {} has no checkpoint {version}",
                from.thread
            )));
        };
        let objects = Value::Object(
            state
                .objects
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        );
        let interrupted = state.is_interrupted();
        let mut tx = self.pool.begin().await.map_err(pg_err("begin fork"))?;
        let created = bind_thread!(
            sqlx::query(
                "INSERT INTO turn_thread (product_id, owner_id, thread_id, version, objects, updated_at) \
                 VALUES ($1, $2, $3, 1, $4::jsonb, $5) ON CONFLICT DO NOTHING",
            ),
            to
        )
        .bind(&objects)
        .bind(to_pg(now))
        .execute(&mut *tx)
        .await
        .map_err(pg_err("fork thread"))?;
        if created.rows_affected() == 0 {
            return Err(PortError::conflict(format!("thread {} exists", to.thread)));
        }
        bind_thread!(
            sqlx::query(
                "INSERT INTO turn_list_append (product_id, owner_id, thread_id, field, version, n, entries) \
                 SELECT $1, $2, $3, a.field, 1, a.n, a.entries \
                 FROM json_to_recordset($4::json) AS a(field text, n integer, entries json)",
            ),
            to
        )
        .bind(append_rows(&state.lists))
        .execute(&mut *tx)
        .await
        .map_err(pg_err("fork thread's lists"))?;
        bind_thread!(
            sqlx::query(
                "INSERT INTO turn_checkpoint (product_id, owner_id, thread_id, version, at, source, \
                     interrupted, patch, snapshot, forked_owner, forked_thread, forked_version) \
                 VALUES ($1, $2, $3, 1, $4, 'fork', $5, $6::jsonb, $6::jsonb, $7, $8, $9)",
            ),
            to
        )
        .bind(to_pg(now))
        .bind(interrupted)
        .bind(&objects)
        .bind(from.owner.as_str())
        .bind(from.thread.as_str())
        .bind(i64::try_from(version).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await
        .map_err(pg_err("fork thread's history"))?;
        tx.commit().await.map_err(pg_err("fork thread"))?;
        Ok(CheckpointMeta {
            version: 1,
            parent: Some(CheckpointRef {
                owner: from.owner.clone(),
                thread: from.thread.clone(),
                version,
            }),
            at: now,
            source: CheckpointSource::Fork,
            interrupted,
        })
    }

    async fn delete_thread(&self, thread: &ThreadKey) -> PortResult<bool> {
        let mut tx = self.pool.begin().await.map_err(pg_err("begin delete"))?;
        let deleted = bind_thread!(sqlx::query(DELETE_THREAD), thread)
            .execute(&mut *tx)
            .await
            .map_err(pg_err("delete thread"))?;
        if deleted.rows_affected() == 0 {
            // No row, so no lock: a commit creating the thread may land
            // now, and the rows it writes are not this deletion's to take.
            tx.rollback().await.map_err(pg_err("delete thread"))?;
            return Ok(false);
        }
        bind_thread!(sqlx::query(DELETE_THREAD_ROWS), thread)
            .execute(&mut *tx)
            .await
            .map_err(pg_err("delete thread's rows"))?;
        tx.commit().await.map_err(pg_err("delete thread"))?;
        Ok(true)
    }

    async fn threads(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        page: &ThreadPage,
    ) -> PortResult<Vec<ThreadSummary>> {
        let rows = sqlx::query(THREADS)
            .bind(product_id.as_str())
            .bind(owner.as_str())
            .bind(page.after.as_ref().map(|c| to_pg(c.updated_at)))
            .bind(page.after.as_ref().map(|c| c.thread.as_str()))
            .bind(i64::try_from(page.limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(pg_err("list threads"))?;
        let decode = pg_err("decode thread");
        rows.iter()
            .map(|row| {
                let thread: String = row.try_get("thread_id").map_err(decode)?;
                Ok(ThreadSummary {
                    thread: ThreadId::parse(thread)
                        .map_err(|e| PortError::other(format!("stored thread id: {e}")))?,
                    version: Version::from_i64(row.try_get("version").map_err(decode)?).0,
                    updated_at: from_pg(row.try_get("updated_at").map_err(decode)?),
                    interrupted: row.try_get("interrupted").map_err(decode)?,
                })
            })
            .collect()
    }
}

/// The end of both commit statements: inserts the list entries (`$5`) of
/// the thread row `t` the statement's head wrote, at its new version, and
/// the checkpoint's history row (written at `$6` by source `$7`, with a
/// copy of all objects when its version is 1 or a multiple of `$8`), and
/// answers that version (no row when the head wrote nothing).
macro_rules! commit_tail {
    () => {
        ", ins AS ( \
            INSERT INTO turn_list_append (product_id, owner_id, thread_id, field, version, n, entries) \
            SELECT $1, $2, $3, a.field, t.version, a.n, a.entries \
            FROM t, json_to_recordset($5::json) AS a(field text, n integer, entries json) \
        ), hist AS ( \
            INSERT INTO turn_checkpoint \
                (product_id, owner_id, thread_id, version, at, source, interrupted, patch, snapshot) \
            SELECT $1, $2, $3, t.version, $6, $7, \
                coalesce(jsonb_typeof(t.objects -> '__interrupt'), 'null') <> 'null', $4::jsonb, \
                CASE WHEN t.version = 1 OR t.version % $8 = 0 THEN t.objects END \
            FROM t \
        ) \
        SELECT t.version FROM t"
    };
}

/// Creates a thread at version 1 with the objects `$4` and the entries
/// `$5`; no row when the thread exists.
const CREATE_THREAD: &str = concat!(
    "WITH t AS ( \
        INSERT INTO turn_thread (product_id, owner_id, thread_id, version, objects, updated_at) \
        VALUES ($1, $2, $3, 1, $4::jsonb, $6) \
        ON CONFLICT DO NOTHING RETURNING version, objects \
    )",
    commit_tail!()
);

/// Commits a turn on a thread still at version `$9`: the version bumped,
/// the objects patched with `$4`, the entries `$5` added; no row when the
/// thread moved or is gone.
const COMMIT_TURN: &str = concat!(
    "WITH t AS ( \
        UPDATE turn_thread SET version = version + 1, objects = objects || $4::jsonb, \
            updated_at = $6 \
        WHERE product_id = $1 AND owner_id = $2 AND thread_id = $3 AND version = $9 \
        RETURNING version, objects \
    )",
    commit_tail!()
);

/// The decision's writes as one delta, and what wrote the checkpoint: its
/// [`TurnEffect::Write`]s in order (one, from [`Checkpoint`]'s decisions,
/// borrowed as is).
fn delta_of<'a>(
    c: &Commit<'a, Checkpoint>,
) -> PortResult<(Cow<'a, CheckpointDelta>, CheckpointSource)> {
    match c.decision.effects.as_slice() {
        [TurnEffect::Write { delta, source }] => Ok((Cow::Borrowed(delta), *source)),
        effects => {
            let mut source = CheckpointSource::Turn;
            let mut whole = CheckpointDelta::default();
            for effect in effects {
                let TurnEffect::Write { delta, source: s } = effect else {
                    return Err(PortError::invalid(
                        "a turn decision asks for an effect this thread store does not carry out",
                    ));
                };
                source = *s;
                whole = whole.then(delta);
            }
            Ok((Cow::Owned(whole), source))
        }
    }
}

#[async_trait]
impl MachineStore<Checkpoint> for PgCheckpointStore {
    async fn load(&self, key: &TurnKey) -> PortResult<Option<Stored<Checkpoint>>> {
        // One round trip: the head row, then every list's rows up to the
        // head's version (so a commit landing meanwhile is left out), all of
        // them for unwindowed lists and, for windowed ones, the newest rows
        // that hold the last entries (at most one row per entry asked for,
        // as a row holds at least one; the oldest of them may hold more).
        let thread = &key.thread;
        let (fields, lasts): (Vec<&str>, Vec<i64>) = key
            .window
            .tails
            .iter()
            .map(|(f, n)| (f.as_str(), i64::try_from(*n).unwrap_or(i64::MAX)))
            .unzip();
        let rows = sqlx::query(
            "WITH head AS ( \
                SELECT version, objects FROM turn_thread \
                WHERE product_id = $1 AND owner_id = $2 AND thread_id = $3 \
             ) \
             SELECT 0 AS part, NULL::text AS field, objects::json AS entries, version FROM head \
             UNION ALL \
             SELECT 1, a.field, a.entries, a.version \
             FROM head JOIN turn_list_append a \
               ON a.product_id = $1 AND a.owner_id = $2 AND a.thread_id = $3 \
              AND a.version <= head.version AND NOT (a.field = ANY($4)) \
             UNION ALL \
             SELECT 1, w.field, x.entries, x.version \
             FROM head CROSS JOIN unnest($4::text[], $5::bigint[]) AS w(field, last) \
             CROSS JOIN LATERAL ( \
                SELECT entries, version FROM ( \
                    SELECT entries, version, n, sum(n) OVER (ORDER BY version DESC) AS upto \
                    FROM ( \
                        SELECT entries, version, n FROM turn_list_append \
                        WHERE product_id = $1 AND owner_id = $2 AND thread_id = $3 \
                          AND field = w.field AND version <= head.version \
                        ORDER BY version DESC LIMIT w.last \
                    ) newest \
                ) counted \
                WHERE upto - n < w.last \
             ) x \
             ORDER BY part, field, version",
        )
        .bind(thread.product_id.as_str())
        .bind(thread.owner.as_str())
        .bind(thread.thread.as_str())
        .bind(&fields)
        .bind(&lasts)
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("load checkpoint"))?;
        let decode = pg_err("decode checkpoint");
        let mut head = None;
        let mut checkpoint = Checkpoint::default();
        for row in rows {
            let part: i32 = row.try_get("part").map_err(decode)?;
            if part == 0 {
                let version = Version::from_i64(row.try_get("version").map_err(decode)?);
                checkpoint.version = version.0;
                head = Some(version);
                if let Value::Object(map) = row.try_get("entries").map_err(decode)? {
                    checkpoint.objects = map.into_iter().collect();
                }
            } else {
                let field: String = row.try_get("field").map_err(decode)?;
                checkpoint
                    .lists
                    .entry(field)
                    .or_default()
                    .extend(entries_of(&row, decode)?);
            }
        }
        // A windowed list's oldest row may reach further back than the
        // window: its entries before the window are dropped.
        for (field, last) in &key.window.tails {
            if let Some(list) = checkpoint.lists.get_mut(field) {
                let extra = list.len().saturating_sub(*last);
                list.drain(..extra);
            }
        }
        Ok(head.map(|version| Stored {
            state: checkpoint,
            version,
        }))
    }

    async fn commit(&self, c: Commit<'_, Checkpoint>) -> PortResult<Committed<Checkpoint>> {
        if !c.decision.tasks.is_empty() {
            return Err(PortError::invalid("a turn thread enqueues no tasks"));
        }
        let thread = &c.key.thread;
        let (whole, source) = delta_of(&c)?;
        let (delta, crisis) = split_crisis_entries(thread, &whole)?;
        let (delta, forget) = split_forgotten(&delta)?;
        let objects = Value::Object(
            delta
                .objects
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        );
        let entries = append_rows(&delta.appends);
        let statement = match c.expected {
            None => sqlx::query_scalar::<_, i64>(CREATE_THREAD),
            Some(_) => sqlx::query_scalar::<_, i64>(COMMIT_TURN),
        }
        .bind(thread.product_id.as_str())
        .bind(thread.owner.as_str())
        .bind(thread.thread.as_str())
        .bind(&objects)
        .bind(&entries)
        .bind(to_pg(c.now))
        .bind(source.as_str())
        .bind(i64::try_from(self.snapshot_every).unwrap_or(i64::MAX));
        let statement = match c.expected {
            None => statement,
            Some(v) => statement.bind(v.as_i64()),
        };
        let audit = audit_entries::<Checkpoint>(c.key, c.decision, c.now);
        let version: Option<i64> = if audit.is_empty() && crisis.is_empty() && forget.is_empty() {
            // The hot path: one autocommitted statement.
            statement
                .fetch_optional(&self.pool)
                .await
                .map_err(pg_err("commit turn"))?
        } else {
            let mut tx = self.pool.begin().await.map_err(pg_err("begin turn"))?;
            let version = statement
                .fetch_optional(&mut *tx)
                .await
                .map_err(pg_err("commit turn"))?;
            if version.is_some() {
                insert_entries(&mut *tx, &audit)
                    .await
                    .map_err(pg_err("append turn audit entries"))?;
                for entry in &crisis {
                    insert_entry(&mut *tx, entry)
                        .await
                        .map_err(pg_err("record the turn's crisis assessment"))?;
                }
                if !forget.is_empty() {
                    let ids: Vec<uuid::Uuid> = forget.iter().map(|id| id.as_uuid()).collect();
                    sqlx::query(
                        "DELETE FROM memory_entry \
                         WHERE product_id = $1 AND owner_id = $2 AND id = ANY($3)",
                    )
                    .bind(thread.product_id.as_str())
                    .bind(thread.owner.as_str())
                    .bind(&ids)
                    .execute(&mut *tx)
                    .await
                    .map_err(pg_err("forget the turn's memory entries"))?;
                }
                tx.commit().await.map_err(pg_err("commit turn"))?;
            }
            version
        };
        let Some(version) = version else {
            return Err(PortError::conflict(match c.expected {
                None => format!("thread {} exists", thread.thread),
                Some(v) => format!("thread {} is not at version {v}", thread.thread),
            }));
        };
        Ok(Committed::at(Version::from_i64(version)))
    }
}

/// The memory store in PostgreSQL: full-text token recall on a `tsvector`
/// of each entry's tokens, embeddings as `real[]`, ranking shared with the
/// in-memory store.
#[derive(Debug, Clone)]
pub struct PgMemoryStore {
    pool: PgPool,
}

impl PgMemoryStore {
    /// A memory store on `pool` (migrated).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use parlance_core::ProductId;
    /// use parlance_core::turn::{OwnerId, ProceduralProfile, ThreadId};
    /// use parlance_ports::MemoryStore;
    /// use parlance_postgres::PgMemoryStore;
    /// use serde_json::json;
    ///
    /// // A fresh, migrated database; an application opens its pool with
    /// // `connect` and runs `migrate`. `None` where no PostgreSQL is configured.
    /// let Some(pool) = parlance_postgres::testing::test_pool().await else { return Ok(()) };
    /// let store = PgMemoryStore::new(pool);
    /// let (acme, owner) = (ProductId::parse("acme")?, OwnerId::parse("user-7")?);
    /// let profile = ProceduralProfile {
    ///     procedural_rules: vec!["Answer briefly.".to_owned()],
    ///     proactive_recall_enabled: true,
    /// };
    /// store.put_profile(&acme, &owner, &profile).await?;
    /// assert_eq!(store.profile(&acme, &owner).await?, profile);
    ///
    /// let session = ThreadId::parse("t-1")?;
    /// store.put_session_memory(&acme, &owner, &session, &json!({"topic": "billing"})).await?;
    /// let kept = store.session_memory(&acme, &owner, &session).await?;
    /// assert_eq!(kept, Some(json!({"topic": "billing"})));
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

const RECORD_COLUMNS: &str = "id, owner_id, entry, embedding, at";

fn decode_record(row: &PgRow) -> PortResult<MemoryRecord> {
    let owner: String = row.try_get("owner_id").map_err(pg_err("decode memory"))?;
    let entry: Value = row.try_get("entry").map_err(pg_err("decode memory"))?;
    Ok(MemoryRecord {
        id: MemoryId::from_uuid(row.try_get("id").map_err(pg_err("decode memory"))?),
        owner: OwnerId::parse(owner)
            .map_err(|e| PortError::other(format!("stored owner id: {e}")))?,
        entry: serde_json::from_value::<MemoryEntry>(entry)
            .map_err(|e| PortError::other(format!("stored memory entry: {e}")))?,
        embedding: row.try_get("embedding").map_err(pg_err("decode memory"))?,
        at: from_pg(row.try_get("at").map_err(pg_err("decode memory"))?),
    })
}

/// Distinct tokens, in first-seen order.
fn distinct_tokens(text: &str) -> Vec<String> {
    let mut seen = BTreeSet::new();
    tokenize(text)
        .into_iter()
        .filter(|t| seen.insert(t.clone()))
        .collect()
}

#[async_trait]
impl MemoryStore for PgMemoryStore {
    async fn add(&self, product_id: &ProductId, record: &MemoryRecord) -> PortResult<()> {
        let entry = serde_json::to_value(&record.entry)
            .map_err(|e| PortError::invalid(format!("memory entry does not encode: {e}")))?;
        sqlx::query(
            "INSERT INTO memory_entry \
               (product_id, id, owner_id, kind, category, subject, entry, search, embedding, at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, array_to_tsvector($8::text[]), $9, $10)",
        )
        .bind(product_id.as_str())
        .bind(record.id.as_uuid())
        .bind(record.owner.as_str())
        .bind(record.entry.kind().as_str())
        .bind(record.entry.category())
        .bind(record.entry.subject())
        .bind(&entry)
        .bind(distinct_tokens(&record.entry.search_text()))
        .bind(record.embedding.as_deref())
        .bind(to_pg(record.at))
        .execute(&self.pool)
        .await
        .map_err(pg_err("add memory entry"))?;
        Ok(())
    }

    async fn erase_owner(&self, product_id: &ProductId, owner: &OwnerId) -> PortResult<usize> {
        let gone: i64 = sqlx::query_scalar(
            "WITH p AS ( \
                DELETE FROM memory_profile WHERE product_id = $1 AND owner_id = $2 \
             ), s AS ( \
                DELETE FROM memory_session WHERE product_id = $1 AND owner_id = $2 \
             ), e AS ( \
                DELETE FROM memory_entry WHERE product_id = $1 AND owner_id = $2 RETURNING 1 \
             ) \
             SELECT count(*) FROM e",
        )
        .bind(product_id.as_str())
        .bind(owner.as_str())
        .fetch_one(&self.pool)
        .await
        .map_err(pg_err("erase memory"))?;
        Ok(usize::try_from(gone).unwrap_or(usize::MAX))
    }

    async fn list(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        kind: Option<MemoryKind>,
    ) -> PortResult<Vec<MemoryRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {RECORD_COLUMNS} FROM memory_entry \
             WHERE product_id = $1 AND owner_id = $2 AND ($3::text IS NULL OR kind = $3) \
             ORDER BY at, id"
        ))
        .bind(product_id.as_str())
        .bind(owner.as_str())
        .bind(kind.map(MemoryKind::as_str))
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("list memory entries"))?;
        rows.iter().map(decode_record).collect()
    }

    async fn delete(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        id: MemoryId,
    ) -> PortResult<()> {
        let done = sqlx::query(
            "DELETE FROM memory_entry WHERE product_id = $1 AND owner_id = $2 AND id = $3",
        )
        .bind(product_id.as_str())
        .bind(owner.as_str())
        .bind(id.as_uuid())
        .execute(&self.pool)
        .await
        .map_err(pg_err("delete memory entry"))?;
        if done.rows_affected() == 0 {
            return Err(PortError::not_found(format!("memory entry {id}")));
        }
        Ok(())
    }

    async fn delete_where(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        filter: &MemoryFilter,
    ) -> PortResult<usize> {
        let done = sqlx::query(
            "DELETE FROM memory_entry WHERE product_id = $1 AND owner_id = $2 \
               AND ($3::text IS NULL OR kind = $3) \
               AND ($4::text IS NULL OR category = $4) \
               AND ($5::text IS NULL OR subject = $5) \
               AND ($6::timestamptz IS NULL OR at < $6)",
        )
        .bind(product_id.as_str())
        .bind(owner.as_str())
        .bind(filter.kind.map(MemoryKind::as_str))
        .bind(filter.category.as_deref())
        .bind(filter.subject.as_deref())
        .bind(filter.before.map(to_pg))
        .execute(&self.pool)
        .await
        .map_err(pg_err("delete memory entries"))?;
        Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
    }

    async fn profile(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
    ) -> PortResult<ProceduralProfile> {
        let row = sqlx::query(
            "SELECT procedural_rules, proactive_recall_enabled FROM memory_profile \
             WHERE product_id = $1 AND owner_id = $2",
        )
        .bind(product_id.as_str())
        .bind(owner.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(pg_err("load procedural profile"))?;
        let Some(row) = row else {
            return Ok(ProceduralProfile::default());
        };
        let rules: Value = row
            .try_get("procedural_rules")
            .map_err(pg_err("decode procedural profile"))?;
        Ok(ProceduralProfile {
            procedural_rules: serde_json::from_value(rules)
                .map_err(|e| PortError::other(format!("stored procedural rules: {e}")))?,
            proactive_recall_enabled: row
                .try_get("proactive_recall_enabled")
                .map_err(pg_err("decode procedural profile"))?,
        })
    }

    async fn put_profile(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        profile: &ProceduralProfile,
    ) -> PortResult<()> {
        sqlx::query(
            "INSERT INTO memory_profile (product_id, owner_id, procedural_rules, proactive_recall_enabled) \
             VALUES ($1, $2, $3, $4) \
             ON CONFLICT (product_id, owner_id) DO UPDATE \
             SET procedural_rules = EXCLUDED.procedural_rules, \
                 proactive_recall_enabled = EXCLUDED.proactive_recall_enabled",
        )
        .bind(product_id.as_str())
        .bind(owner.as_str())
        .bind(json!(profile.procedural_rules))
        .bind(profile.proactive_recall_enabled)
        .execute(&self.pool)
        .await
        .map_err(pg_err("save procedural profile"))?;
        Ok(())
    }

    async fn session_memory(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        session: &ThreadId,
    ) -> PortResult<Option<Value>> {
        sqlx::query_scalar(
            "SELECT value FROM memory_session \
             WHERE product_id = $1 AND owner_id = $2 AND session_id = $3",
        )
        .bind(product_id.as_str())
        .bind(owner.as_str())
        .bind(session.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(pg_err("load session memory"))
    }

    async fn put_session_memory(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        session: &ThreadId,
        value: &Value,
    ) -> PortResult<()> {
        sqlx::query(
            "INSERT INTO memory_session (product_id, owner_id, session_id, value) \
             VALUES ($1, $2, $3, $4) \
             ON CONFLICT (product_id, owner_id, session_id) DO UPDATE SET value = EXCLUDED.value",
        )
        .bind(product_id.as_str())
        .bind(owner.as_str())
        .bind(session.as_str())
        .bind(value)
        .execute(&self.pool)
        .await
        .map_err(pg_err("save session memory"))?;
        Ok(())
    }

    async fn retrieve(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        query: &str,
        k: usize,
        embedding: QueryEmbedding<'_>,
    ) -> PortResult<Retrieved> {
        let mut candidates: BTreeMap<MemoryId, MemoryRecord> = BTreeMap::new();
        let tokens = distinct_tokens(query);
        if !tokens.is_empty() {
            // Tokens are runs of letters and digits, so quoting is enough.
            let tsquery = tokens
                .iter()
                .map(|t| format!("'{t}'"))
                .collect::<Vec<_>>()
                .join(" | ");
            let rows = sqlx::query(&format!(
                "SELECT {RECORD_COLUMNS} FROM memory_entry \
                 WHERE product_id = $1 AND owner_id = $2 AND search @@ $3::tsquery \
                 ORDER BY ts_rank(search, $3::tsquery) DESC, at DESC LIMIT $4"
            ))
            .bind(product_id.as_str())
            .bind(owner.as_str())
            .bind(&tsquery)
            .bind(i64::try_from(RETRIEVE_CANDIDATES).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(pg_err("recall memory entries"))?;
            for row in &rows {
                let r = decode_record(row)?;
                candidates.insert(r.id, r);
            }
        }
        if let QueryEmbedding::Vector(v) = embedding {
            let rows = sqlx::query(&format!(
                "SELECT {RECORD_COLUMNS} FROM memory_entry \
                 WHERE product_id = $1 AND owner_id = $2 AND embedding IS NOT NULL \
                   AND cardinality(embedding) = $3"
            ))
            .bind(product_id.as_str())
            .bind(owner.as_str())
            .bind(i32::try_from(v.len()).unwrap_or(i32::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(pg_err("load memory embeddings"))?;
            for row in &rows {
                let r = decode_record(row)?;
                candidates.insert(r.id, r);
            }
        }
        let candidates: Vec<MemoryRecord> = candidates.into_values().collect();
        Ok(retrieve_from(&candidates, query, k, embedding))
    }
}
