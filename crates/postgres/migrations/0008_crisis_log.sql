-- The support agent's crisis log: every crisis-gate assessment with its
-- provenance, append-only, per owner.
CREATE TABLE crisis_log (
    seq                    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    product_id             text        NOT NULL,
    owner_id               text        NOT NULL,
    thread_id              text        NOT NULL,
    turn                   bigint      NOT NULL CHECK (turn >= 0),
    at                     timestamptz NOT NULL,
    level                  smallint    NOT NULL CHECK (level BETWEEN 0 AND 3),
    confidence             double precision NOT NULL,
    reason                 text        NOT NULL,
    needs_crisis_response  boolean     NOT NULL,
    needs_clarification    boolean     NOT NULL,
    classifier_path        text        NOT NULL,
    override_kind          text,
    llm_failure_occurred   boolean     NOT NULL,
    route                  text        NOT NULL
);

CREATE INDEX crisis_log_owner ON crisis_log (product_id, owner_id, seq);
