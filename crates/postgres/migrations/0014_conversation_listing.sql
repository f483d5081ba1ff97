-- Listing a product's conversation instances in creation order (`seq`),
-- either way and from a cursor: all of them, and those in some states (the
-- operator console asks for each group of states, newest first).
CREATE INDEX conversation_by_product
    ON conversation_instances (product_id, seq);
CREATE INDEX conversation_by_state
    ON conversation_instances (product_id, state, seq);
