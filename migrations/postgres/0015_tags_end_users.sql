-- Tags and end users (issue 25 item 6). A request's tags (`x-aigw-tags`, stored sorted by key as
-- `feature=summaries,team=search`) and its end user (`x-aigw-end-user`, or the body's `user`)
-- are kept on its log. The end-user filter reads its own index, partial so that requests
-- without an end user cost no more to insert; the tag filter reads the workspace's (ts, id)
-- index and skips what does not match, like the status and source filters.
ALTER TABLE request_logs ADD COLUMN tags TEXT;
ALTER TABLE request_logs ADD COLUMN end_user TEXT;
CREATE INDEX request_logs_end_user_ts ON request_logs (workspace_id, end_user, ts, id)
    WHERE end_user IS NOT NULL;

-- A key's tag allow-list: a JSON array of `key=value` or `key=*`; null allows every tag.
ALTER TABLE api_keys ADD COLUMN allowed_tags TEXT;
