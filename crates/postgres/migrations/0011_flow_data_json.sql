-- A flow session is stored as `json`, not `jsonb`: jsonb reorders object
-- keys, and the flow's model fields (and the objects assigned to them) keep
-- the order they were declared or written in, as the reference's Python
-- dicts do. Rows written before keep the order jsonb gave them.
ALTER TABLE flow_sessions ALTER COLUMN data TYPE json USING data::json;
