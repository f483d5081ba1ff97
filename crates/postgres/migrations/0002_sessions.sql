-- Session assistance states: one row per (product, session), the snapshot as
-- jsonb, a version for compare-and-swap saves and the next deadline for the
-- sweeper.
CREATE TABLE sessions (
    product_id    text        NOT NULL,
    session_id    text        NOT NULL,
    version       bigint      NOT NULL,
    next_deadline timestamptz,
    snapshot      jsonb       NOT NULL,
    PRIMARY KEY (product_id, session_id)
);

-- The sweeper reads only what is due: `next_deadline <= now` in deadline
-- order (ties by key, so the order is total and the index supplies it).
CREATE INDEX sessions_next_deadline ON sessions (next_deadline, product_id, session_id)
    WHERE next_deadline IS NOT NULL;

-- Each product's tour catalog (per-tour timeout and cooldown overrides).
CREATE TABLE tour_catalogs (
    product_id text  PRIMARY KEY,
    catalog    jsonb NOT NULL
);
