-- Request logs (DESIGN.md §7): one row per request that was not circuit-broken. Prompts and
-- completions are never stored. `attempts_detail` is JSON: one object per upstream attempt.
CREATE TABLE request_logs (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id          TEXT NOT NULL,
    ts                  BIGINT NOT NULL,
    workspace_id        BIGINT NOT NULL,
    key_id              BIGINT NOT NULL,
    member_id           BIGINT NOT NULL,
    department_id       BIGINT,
    endpoint            TEXT NOT NULL,
    model_requested     TEXT,
    model_served        TEXT,
    upstream_id         BIGINT,
    attempts            BIGINT NOT NULL DEFAULT 0,
    attempts_detail     TEXT NOT NULL DEFAULT '[]',
    status              BIGINT NOT NULL,
    code                TEXT,
    source              TEXT,
    explanation         TEXT NOT NULL DEFAULT '',
    stream              BIGINT NOT NULL DEFAULT 0,
    prompt_tokens       BIGINT NOT NULL DEFAULT 0,
    completion_tokens   BIGINT NOT NULL DEFAULT 0,
    total_tokens        BIGINT NOT NULL DEFAULT 0,
    credits             BIGINT NOT NULL DEFAULT 0,
    usage_estimated     BIGINT NOT NULL DEFAULT 0,
    latency_ms          BIGINT NOT NULL DEFAULT 0,
    ttfb_ms             BIGINT,
    upstream_latency_ms BIGINT,
    client_ip           TEXT
);
CREATE INDEX request_logs_ws_ts ON request_logs (workspace_id, ts);
CREATE INDEX request_logs_key_ts ON request_logs (key_id, ts);
CREATE INDEX request_logs_member_ts ON request_logs (member_id, ts);

-- Bumped by every configuration change; each gateway polls it and reloads (replicas included).
CREATE TABLE config_epoch (
    id    BIGINT PRIMARY KEY,
    epoch BIGINT NOT NULL
);
INSERT INTO config_epoch (id, epoch) VALUES (1, 0);
