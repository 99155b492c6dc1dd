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

-- Each tag value and each end user a workspace has seen gets an id, the subject id its quota
-- counters and policies use (as a key's or member's). Rows are created on first sight, refused
-- past the caps (settings max_tag_keys, max_tag_values, max_end_users), never deleted by
-- traffic. A row whose tag_value is '*' stands for every value of its key: the target of a
-- policy on each value of that tag (`target = "team=*"`); no request sends '*' as a value.
CREATE TABLE tag_values (
    id           BIGSERIAL PRIMARY KEY,
    workspace_id BIGINT NOT NULL,
    tag_key      TEXT NOT NULL,
    tag_value    TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    UNIQUE (workspace_id, tag_key, tag_value)
);
CREATE TABLE end_users (
    id           BIGSERIAL PRIMARY KEY,
    workspace_id BIGINT NOT NULL,
    end_user     TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    UNIQUE (workspace_id, end_user)
);

-- Policies on a tag value and on end users (subject "tag", "end_user").
ALTER TABLE policies DROP CONSTRAINT policies_subject_check;
ALTER TABLE policies ADD CONSTRAINT policies_subject_check
    CHECK (subject IN ('apikey', 'member', 'dept', 'ws', 'tag', 'end_user'));
