-- Admin service tokens (DESIGN.md §11, `/admin/v1/tokens`): for automation (CI, Terraform,
-- scripts). Created by an owner or admin, scoped to a workspace and a role, shown once, stored as
-- the SHA-256 of the secret plus a display prefix, revocable (the row stays, so the list and the
-- audit log keep naming it), optionally expiring. A token acts for the member who created it,
-- with the lower of its role and theirs, while that member is active.
CREATE TABLE service_tokens (
    id           BIGSERIAL PRIMARY KEY,
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

