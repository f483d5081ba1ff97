-- Flow sessions: one row per session, saved with compare-and-swap on version.
CREATE TABLE flow_sessions (
    product_id   text        NOT NULL,
    session_id   text        NOT NULL,
    flow         text        NOT NULL,
    state        text        NOT NULL,
    version      bigint      NOT NULL,
    data         jsonb       NOT NULL,
    dialogue_len bigint      NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    PRIMARY KEY (product_id, session_id)
);

-- The dialogue, append-only: one row per element, so a turn writes O(1).
CREATE TABLE flow_dialogue (
    product_id text        NOT NULL,
    session_id text        NOT NULL,
    seq        bigint      NOT NULL,
    actor      text        NOT NULL CHECK (actor IN ('system', 'assistant', 'user')),
    event      text        NOT NULL,
    actor_text text,
    at         timestamptz NOT NULL,
    PRIMARY KEY (product_id, session_id, seq),
    FOREIGN KEY (product_id, session_id) REFERENCES flow_sessions (product_id, session_id) ON DELETE CASCADE
);

-- Progress per invoker chain: totals accumulate across invoker->invoker hops.
CREATE TABLE flow_progress (
    product_id text   NOT NULL,
    session_id text   NOT NULL,
    chain_id   text   NOT NULL,
    label      text   NOT NULL,
    total      bigint NOT NULL CHECK (total >= 0),
    done       bigint NOT NULL CHECK (done >= 0),
    PRIMARY KEY (product_id, session_id, chain_id),
    FOREIGN KEY (product_id, session_id) REFERENCES flow_sessions (product_id, session_id) ON DELETE CASCADE
);
