-- Every tenant table keyed by product first, so the schema could be
-- distributed by `product_id` (docs/distributed.md): a unique constraint or
-- foreign key on a distributed table must include the distribution column.
-- Identity columns stay: ids remain unique in one database.

-- Append-only logs: (product, seq). Their read indexes are product-first
-- already.
ALTER TABLE audit_log DROP CONSTRAINT audit_log_pkey,
    ADD PRIMARY KEY (product_id, seq);

ALTER TABLE crisis_log DROP CONSTRAINT crisis_log_pkey,
    ADD PRIMARY KEY (product_id, seq);

-- DAG nodes and edges carry their run's product.
ALTER TABLE dag_nodes ADD COLUMN product_id text;
UPDATE dag_nodes n SET product_id = r.product_id FROM dag_runs r WHERE r.id = n.dag_run_id;
ALTER TABLE dag_nodes ALTER COLUMN product_id SET NOT NULL;

ALTER TABLE dag_edges ADD COLUMN product_id text;
UPDATE dag_edges e SET product_id = r.product_id FROM dag_runs r WHERE r.id = e.dag_run_id;
ALTER TABLE dag_edges ALTER COLUMN product_id SET NOT NULL;

-- The foreign keys name the run by (product, id) from now on.
ALTER TABLE dag_nodes DROP CONSTRAINT dag_nodes_dag_run_id_fkey;
ALTER TABLE dag_edges DROP CONSTRAINT dag_edges_dag_run_id_fkey;

ALTER TABLE dag_runs DROP CONSTRAINT dag_runs_pkey,
    ADD PRIMARY KEY (product_id, id);

ALTER TABLE dag_nodes DROP CONSTRAINT dag_nodes_pkey,
    DROP CONSTRAINT dag_nodes_dag_run_id_key_key,
    ADD PRIMARY KEY (product_id, id),
    ADD CONSTRAINT dag_nodes_run_key UNIQUE (product_id, dag_run_id, key),
    ADD CONSTRAINT dag_nodes_run_fkey FOREIGN KEY (product_id, dag_run_id)
        REFERENCES dag_runs (product_id, id) ON DELETE CASCADE;

ALTER TABLE dag_edges DROP CONSTRAINT dag_edges_pkey,
    ADD PRIMARY KEY (product_id, parent_id, child_id),
    ADD CONSTRAINT dag_edges_run_fkey FOREIGN KEY (product_id, dag_run_id)
        REFERENCES dag_runs (product_id, id) ON DELETE CASCADE;

DROP INDEX dag_edges_child;
CREATE INDEX dag_edges_child ON dag_edges (product_id, child_id, position);

-- Jobs: (product, id). The claim, rescue and retention indexes scan across
-- products by design and stay as they are; the others lead with the product.
ALTER TABLE jobs DROP CONSTRAINT jobs_pkey,
    ADD PRIMARY KEY (product_id, id);

-- Dedup keys are per product: the same key under two products names two
-- tasks.
DROP INDEX jobs_dedup;
CREATE UNIQUE INDEX jobs_dedup ON jobs (product_id, dedup_key)
    WHERE dedup_key IS NOT NULL AND state IN (0, 1);

DROP INDEX jobs_dag;
CREATE INDEX jobs_dag ON jobs (product_id, dag_run_id)
    WHERE dag_run_id IS NOT NULL AND state IN (0, 1);

-- `workers` (liveness of processes, not tenant data) and the global
-- `api_keys_by_hash` lookup are unchanged: see docs/distributed.md.
