-- The durable task queue: tasks, DAG runs of tasks, and worker liveness.
--
-- jobs.state:      0 available, 1 running, 2 completed, 3 discarded, 4 cancelled
-- dag_runs.state:  0 running, 1 completed, 2 failed, 3 cancelled
-- dag_nodes.state: 0 pending, 1 queued, 2 completed, 3 failed, 4 cancelled
-- dag_nodes.role:  0 task, 1 combine (resolved by the queue, never a job)

-- One row per worker process, refreshed by its heartbeat; a worker silent
-- for longer than the configured staleness loses its running jobs.
CREATE TABLE workers (
    id         uuid PRIMARY KEY,
    started_at timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL
);

CREATE TABLE dag_runs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    product_id  text        NOT NULL,
    queue       text        NOT NULL,
    state       smallint    NOT NULL DEFAULT 0,
    total_nodes int         NOT NULL,
    done_nodes  int         NOT NULL DEFAULT 0,
    error       jsonb,
    created_at  timestamptz NOT NULL,
    finished_at timestamptz
);

CREATE INDEX dag_runs_finished ON dag_runs (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE dag_nodes (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dag_run_id     bigint      NOT NULL REFERENCES dag_runs (id) ON DELETE CASCADE,
    key            text        NOT NULL,
    kind           text        NOT NULL,
    role           smallint    NOT NULL DEFAULT 0,
    label          text,
    payload        jsonb       NOT NULL,
    -- For a map node: {kind, payload, label} of its elements.
    map_spec       jsonb,
    -- For a map element: its element, from the map node `input_from`.
    input_from     text,
    input          jsonb,
    priority       smallint    NOT NULL,
    max_attempts   int         NOT NULL,
    timeout_ms     bigint,
    remaining_deps int         NOT NULL,
    state          smallint    NOT NULL DEFAULT 0,
    result         jsonb,
    UNIQUE (dag_run_id, key)
);

CREATE TABLE dag_edges (
    dag_run_id bigint NOT NULL REFERENCES dag_runs (id) ON DELETE CASCADE,
    parent_id  bigint NOT NULL,
    child_id   bigint NOT NULL,
    -- Orders a child's inputs.
    position   int    NOT NULL,
    PRIMARY KEY (parent_id, child_id)
);

CREATE INDEX dag_edges_child ON dag_edges (child_id, position);

-- The hot table: narrow rows, few indexes (every claim and completion
-- changes `state`, so none of them is a HOT update). DAG results live in
-- dag_nodes, not here.
CREATE TABLE jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    product_id       text        NOT NULL,
    queue            text        NOT NULL,
    kind             text        NOT NULL,
    state            smallint    NOT NULL DEFAULT 0,
    priority         smallint    NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL,
    attempt          int         NOT NULL DEFAULT 0,
    max_attempts     int         NOT NULL,
    timeout_ms       bigint,
    lease_token      bigint,
    leased_by        uuid,
    lease_expires_at timestamptz,
    dag_run_id       bigint,
    node_id          bigint,
    dedup_key        text,
    args             jsonb       NOT NULL,
    last_error       text,
    created_at       timestamptz NOT NULL,
    finished_at      timestamptz
) WITH (
    fillfactor = 90,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_limit = 2000
);

-- Fencing tokens: every claim takes a fresh one.
CREATE SEQUENCE job_lease_tokens;

-- Claim: only runnable or retry-waiting rows, in claim order.
CREATE INDEX jobs_claim ON jobs (queue, priority, run_at, id) WHERE state = 0;
-- Rescue: running rows by deadline (the sweeper also checks their workers).
CREATE INDEX jobs_running ON jobs (lease_expires_at) WHERE state = 1;
-- Idempotent enqueue while a job with the key is live.
CREATE UNIQUE INDEX jobs_dedup ON jobs (dedup_key)
    WHERE dedup_key IS NOT NULL AND state IN (0, 1);
-- Cancelling a run's queued jobs, retention.
CREATE INDEX jobs_dag ON jobs (dag_run_id) WHERE dag_run_id IS NOT NULL AND state IN (0, 1);
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE state IN (2, 4);
