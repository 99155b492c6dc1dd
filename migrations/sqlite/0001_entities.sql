-- Tenancy and configuration entities (DESIGN.md §3). Times are Unix milliseconds; flags are 0/1
-- BIGINTs so one set of queries serves both backends.

CREATE TABLE workspaces (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL UNIQUE,
    timezone    TEXT,
    created_at  BIGINT NOT NULL
);

CREATE TABLE departments (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace_id BIGINT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    UNIQUE (workspace_id, name)
);

CREATE TABLE members (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace_id  BIGINT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    department_id BIGINT REFERENCES departments(id) ON DELETE SET NULL,
    email         TEXT NOT NULL UNIQUE,
    role          TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'member')),
    password_hash TEXT,
    active        BIGINT NOT NULL DEFAULT 1,
    created_at    BIGINT NOT NULL
);

CREATE TABLE api_keys (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace_id BIGINT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    member_id    BIGINT NOT NULL REFERENCES members(id) ON DELETE CASCADE,
    created_by   BIGINT REFERENCES members(id) ON DELETE SET NULL,
    name         TEXT NOT NULL,
    key_hash     TEXT NOT NULL UNIQUE,
    prefix       TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    last_used_at BIGINT,
    UNIQUE (member_id, name)
);

CREATE TABLE upstreams (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace_id        BIGINT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name                TEXT NOT NULL,
    provider            TEXT NOT NULL,
    base_url            TEXT NOT NULL,
    secret_sealed       TEXT NOT NULL,
    models              TEXT NOT NULL,
    priority            BIGINT NOT NULL DEFAULT 0,
    weight              BIGINT NOT NULL DEFAULT 1,
    max_in_flight       BIGINT NOT NULL DEFAULT 64,
    requests_per_minute BIGINT,
    tokens_per_minute   BIGINT,
    requests_per_day    BIGINT,
    quota_group         TEXT,
    enabled             BIGINT NOT NULL DEFAULT 1,
    created_at          BIGINT NOT NULL,
    updated_at          BIGINT NOT NULL,
    UNIQUE (workspace_id, name)
);

CREATE TABLE models (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace_id     BIGINT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name             TEXT NOT NULL,
    fallbacks        TEXT NOT NULL DEFAULT '[]',
    price_prompt     BIGINT NOT NULL DEFAULT 0,
    price_completion BIGINT NOT NULL DEFAULT 0,
    created_at       BIGINT NOT NULL,
    UNIQUE (workspace_id, name)
);

-- target_id 0 = "each" subject of that kind; scope_department_id 0 = the whole workspace.
CREATE TABLE policies (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace_id        BIGINT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    subject             TEXT NOT NULL CHECK (subject IN ('apikey', 'member', 'dept', 'ws')),
    target_id           BIGINT NOT NULL DEFAULT 0,
    scope_department_id BIGINT NOT NULL DEFAULT 0,
    metric              TEXT NOT NULL,
    time_window         TEXT NOT NULL,
    limit_value         BIGINT NOT NULL CHECK (limit_value >= 0),
    mode                TEXT NOT NULL CHECK (mode IN ('enforce', 'shadow')),
    created_by          BIGINT,
    created_at          BIGINT NOT NULL,
    updated_at          BIGINT NOT NULL,
    UNIQUE (workspace_id, subject, target_id, scope_department_id, metric, time_window)
);
