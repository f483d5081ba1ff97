-- API keys: only the SHA-256 digest of each key is stored; the key itself
-- is shown once, when it is made.
CREATE TABLE api_keys (
    product_id  text        NOT NULL,
    id          bigint GENERATED ALWAYS AS IDENTITY,
    key_hash    bytea       NOT NULL,
    label       text        NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL,
    revoked_at  timestamptz,
    PRIMARY KEY (product_id, id),
    CONSTRAINT api_keys_hash_len CHECK (octet_length(key_hash) = 32)
);

CREATE UNIQUE INDEX api_keys_by_hash ON api_keys (key_hash);
