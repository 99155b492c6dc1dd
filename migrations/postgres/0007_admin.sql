-- Admin API (DESIGN.md §7): sign-out and password change revoke a member's tokens by bumping
-- session_epoch (every token carries the epoch it was issued under); the audit log records who
-- changed which guardrail, credential, key, member or model, when, from what to what.

ALTER TABLE members ADD COLUMN session_epoch BIGINT NOT NULL DEFAULT 0;

CREATE TABLE audit_log (
    id           BIGSERIAL PRIMARY KEY,
    workspace_id BIGINT NOT NULL,
    at           BIGINT NOT NULL,
    actor_id     BIGINT,
    actor_email  TEXT,
    action       TEXT NOT NULL,
    target_kind  TEXT NOT NULL,
    target_id    BIGINT,
    before_json  TEXT,
    after_json   TEXT
);

CREATE INDEX audit_log_by_workspace ON audit_log (workspace_id, id);
