-- Every transition of every machine, append-only.
CREATE TABLE audit_log (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    product_id  text        NOT NULL,
    entity_kind text        NOT NULL,
    entity_id   text        NOT NULL,
    from_state  text,
    to_state    text        NOT NULL,
    cause       text        NOT NULL,
    at          timestamptz NOT NULL,
    payload     jsonb       NOT NULL DEFAULT '{}'::jsonb
);

CREATE INDEX audit_log_entity ON audit_log (product_id, entity_kind, entity_id, seq);
