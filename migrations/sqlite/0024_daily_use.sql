-- Admin service tokens (DESIGN.md §11, `/admin/v1/tokens`): for automation (CI, Terraform,
-- scripts). Created by an owner or admin, scoped to a workspace and a role, shown once, stored as
-- the SHA-256 of the secret plus a display prefix, revocable (the row stays, so the list and the
-- audit log keep naming it), optionally expiring. A token acts for the member who created it,
-- with the lower of its role and theirs, while that member is active.
CREATE TABLE service_tokens (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace_id BIGINT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    role         TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'member')),
    token_hash   TEXT NOT NULL UNIQUE,
    prefix       TEXT NOT NULL,
    created_by   BIGINT NOT NULL REFERENCES members(id) ON DELETE CASCADE,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT,
    last_used_at BIGINT,
    revoked_at   BIGINT,
    revoked_by   BIGINT
);
CREATE INDEX service_tokens_by_workspace ON service_tokens (workspace_id, id);

-- The service token a change was made with (its name and display prefix), if any.
ALTER TABLE audit_log ADD COLUMN actor_token TEXT;

-- Each credential's figures per hour (UTC) and workspace, added by the log writer in the same
-- transaction as the logs they sum (as the usage rollups, 0011): the upstream attempts made on
-- it (a failover or a retry is one more), those that failed (no answer, or a status of 400 or
-- more), the requests it served with the sum of their latency and of their time until its
-- response headers, their tokens and credits. The retention task deletes an hour once the logs
-- of all of it are gone. Counted from the first logs written after this migration.
CREATE TABLE upstream_rollup (
    workspace_id BIGINT NOT NULL,
    hour_start   BIGINT NOT NULL,
    upstream_id  BIGINT NOT NULL,
    attempts     BIGINT NOT NULL DEFAULT 0,
    failures     BIGINT NOT NULL DEFAULT 0,
    served       BIGINT NOT NULL DEFAULT 0,
    latency_ms   BIGINT NOT NULL DEFAULT 0,
    upstream_ms  BIGINT NOT NULL DEFAULT 0,
    timed        BIGINT NOT NULL DEFAULT 0,
    total_tokens BIGINT NOT NULL DEFAULT 0,
    credits      BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (workspace_id, hour_start, upstream_id)
);
CREATE INDEX upstream_rollup_hour ON upstream_rollup (hour_start);

-- Each lock a failure wrote on a credential (what it parks, from when, until when, the rule, and
-- the provider's words, masked), written with the lock off the request path. A connection test
-- (or a new secret, for the per-model locks) ends the running ones. Kept as long as the logs.
CREATE TABLE upstream_lock_events (
    credential_id BIGINT NOT NULL,
    target        TEXT NOT NULL,
    since_ms      BIGINT NOT NULL,
    until_ms      BIGINT NOT NULL,
    rule          TEXT NOT NULL,
    message       TEXT
);
CREATE INDEX upstream_lock_events_by_credential ON upstream_lock_events (credential_id, until_ms);
CREATE INDEX upstream_lock_events_until ON upstream_lock_events (until_ms);
