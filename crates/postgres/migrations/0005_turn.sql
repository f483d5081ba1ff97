-- Turn runtime: checkpoints per thread and the long-term memory store.

-- One row per thread: its version (turns committed) and the merged objects
-- of its `merge` and last-value reducer fields, keyed by field name.
CREATE TABLE turn_thread (
    product_id  text        NOT NULL,
    owner_id    text        NOT NULL,
    thread_id   text        NOT NULL,
    version     bigint      NOT NULL CHECK (version > 0),
    objects     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (product_id, owner_id, thread_id)
);

-- `append` reducer fields, append-only: one row per entry, ordered by the
-- version that added it and its position in that commit.
CREATE TABLE turn_list_entry (
    product_id  text     NOT NULL,
    owner_id    text     NOT NULL,
    thread_id   text     NOT NULL,
    field       text     NOT NULL,
    version     bigint   NOT NULL,
    idx         integer  NOT NULL,
    entry       jsonb    NOT NULL,
    PRIMARY KEY (product_id, owner_id, thread_id, field, version, idx)
);

-- Semantic and episodic entries per owner. `search` holds the entry's
-- tokens for full-text recall; `embedding` its vector, when computed.
CREATE TABLE memory_entry (
    product_id  text        NOT NULL,
    id          uuid        NOT NULL,
    owner_id    text        NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('semantic', 'episodic')),
    category    text,
    subject     text,
    entry       jsonb       NOT NULL,
    search      tsvector    NOT NULL,
    embedding   real[],
    at          timestamptz NOT NULL,
    PRIMARY KEY (product_id, id)
);

CREATE INDEX memory_entry_owner ON memory_entry (product_id, owner_id, at);
CREATE INDEX memory_entry_search ON memory_entry USING gin (search);

-- Procedural memory: style rules and the proactive-recall flag per owner.
CREATE TABLE memory_profile (
    product_id                text    NOT NULL,
    owner_id                  text    NOT NULL,
    procedural_rules          jsonb   NOT NULL DEFAULT '[]'::jsonb,
    proactive_recall_enabled  boolean NOT NULL DEFAULT false,
    PRIMARY KEY (product_id, owner_id)
);

-- Session memory per owner and session.
CREATE TABLE memory_session (
    product_id  text  NOT NULL,
    owner_id    text  NOT NULL,
    session_id  text  NOT NULL,
    value       jsonb NOT NULL,
    PRIMARY KEY (product_id, owner_id, session_id)
);
