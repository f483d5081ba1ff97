-- A thread's history: one immutable row per checkpoint, written by the
-- commit that made it. `patch` holds the objects that checkpoint replaced
-- (its list entries are the `turn_list_entry` rows of its version);
-- `snapshot` every few checkpoints holds all of the thread's objects, so
-- the state at a checkpoint folds at most that many patches. The first
-- checkpoint of a fork names the checkpoint it was forked from.
CREATE TABLE turn_checkpoint (
    product_id      text        NOT NULL,
    owner_id        text        NOT NULL,
    thread_id       text        NOT NULL,
    version         bigint      NOT NULL CHECK (version > 0),
    at              timestamptz NOT NULL,
    source          text        NOT NULL CHECK (source IN ('turn', 'resume', 'update', 'fork')),
    interrupted     boolean     NOT NULL,
    patch           jsonb       NOT NULL,
    snapshot        jsonb,
    forked_owner    text,
    forked_thread   text,
    forked_version  bigint,
    PRIMARY KEY (product_id, owner_id, thread_id, version)
);

-- Threads stored before there was a history start theirs at their current
-- version, with a full copy of their objects.
INSERT INTO turn_checkpoint (product_id, owner_id, thread_id, version, at, source, interrupted,
                             patch, snapshot)
SELECT product_id, owner_id, thread_id, version, updated_at, 'turn', false, objects, objects
FROM turn_thread;

-- An owner's threads, newest first.
CREATE INDEX turn_thread_owner_recent
    ON turn_thread (product_id, owner_id, updated_at DESC, thread_id COLLATE "C");
