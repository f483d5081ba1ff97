-- A checkpoint's entries on one list are one row: what a turn appends to a
-- list is written once and read back whole, never queried inside, so the
-- entries are one `json` array, kept as the text written and sent back as
-- stored (`jsonb` is rebuilt into text on every read). Reading a thread
-- then costs a row per checkpoint and list, not a row per entry; `n` counts
-- the entries, so a window of a list's last entries reads only the rows it
-- needs.
CREATE TABLE turn_list_append (
    product_id  text     NOT NULL,
    owner_id    text     NOT NULL,
    thread_id   text     NOT NULL,
    field       text     NOT NULL,
    version     bigint   NOT NULL,
    n           integer  NOT NULL CHECK (n > 0),
    entries     json     NOT NULL,
    PRIMARY KEY (product_id, owner_id, thread_id, field, version)
);

INSERT INTO turn_list_append (product_id, owner_id, thread_id, field, version, n, entries)
SELECT product_id, owner_id, thread_id, field, version, count(*), json_agg(entry ORDER BY idx)
FROM turn_list_entry
GROUP BY product_id, owner_id, thread_id, field, version;

DROP TABLE turn_list_entry;
