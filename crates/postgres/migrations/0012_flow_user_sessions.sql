-- The user a flow session was started for is kept in `data` (`user_info`);
-- its email is copied here when the session is created (it never changes)
-- so `user_sessions` reads one index range, newest first. The column is
-- written by the insert only, so updates of a session stay heap-only.
ALTER TABLE flow_sessions ADD COLUMN user_email text;

CREATE INDEX flow_sessions_by_user
    ON flow_sessions (product_id, flow, user_email, created_at DESC, session_id COLLATE "C" DESC)
    WHERE user_email IS NOT NULL;
