-- Conversation instances: one row each, the full record as jsonb beside the
-- columns that queries and constraints need.
CREATE TABLE conversation_instances (
    product_id       text        NOT NULL,
    instance_id      uuid        NOT NULL,
    contact_id       text        NOT NULL,
    state            text        NOT NULL,
    holds_contact    boolean     NOT NULL,
    version          bigint      NOT NULL,
    heartbeat_due_at timestamptz,
    claimed_until    timestamptz,
    created_at       timestamptz NOT NULL,
    seq              bigint GENERATED ALWAYS AS IDENTITY,
    record           jsonb       NOT NULL,
    PRIMARY KEY (product_id, instance_id)
);

-- At most one instance holds a contact: the database, not hope, enforces it.
CREATE UNIQUE INDEX conversation_one_holder
    ON conversation_instances (product_id, contact_id) WHERE holds_contact;

-- Promotion and listing by contact, oldest first.
CREATE INDEX conversation_by_contact
    ON conversation_instances (product_id, contact_id, seq);

-- The heartbeat deadline index: the sweeper reads only what is due.
CREATE INDEX conversation_due
    ON conversation_instances (heartbeat_due_at) WHERE heartbeat_due_at IS NOT NULL;

-- A row per contact to serialise creation and promotion for that contact.
CREATE TABLE conversation_contacts (
    product_id text NOT NULL,
    contact_id text NOT NULL,
    PRIMARY KEY (product_id, contact_id)
);

-- The append-only transcript.
CREATE TABLE conversation_messages (
    product_id   text        NOT NULL,
    instance_id  uuid        NOT NULL,
    seq          bigint GENERATED ALWAYS AS IDENTITY,
    role         text        NOT NULL,
    text         text        NOT NULL,
    at           timestamptz NOT NULL,
    outbound_seq integer,
    PRIMARY KEY (product_id, instance_id, seq)
);

-- Idempotency keys of outbound messages, recorded before delivery.
CREATE TABLE conversation_deliveries (
    product_id   text        NOT NULL,
    instance_id  uuid        NOT NULL,
    outbound_seq integer     NOT NULL,
    recorded_at  timestamptz NOT NULL,
    PRIMARY KEY (product_id, instance_id, outbound_seq)
);
