-- A request folded into a running job with its dedup key (see
-- TaskSpec::dedup_key): what the job's next run takes, as an object with
-- `queue`, `args`, `priority`, `run_at`, `max_attempts` and `timeout_ms`;
-- NULL when nothing was folded. Only a running job holds one: a finish
-- enqueues it as a fresh job with the key, a requeue moves it into the job.
-- A nullable column without a default: no rewrite, no index.
ALTER TABLE jobs ADD COLUMN rerun jsonb;
