-- Budget alerts (issue 25 item 1): a policy's thresholds and webhook, and the outbox of the
-- alerts they fired. One alert per policy, subject, window and threshold (the unique key), so
-- replicas that see the same crossing fire it once; it stays pending until its webhook answered
-- 2xx, so a receiver that is down loses nothing.
CREATE TABLE policy_alerts (
    policy_id       BIGINT PRIMARY KEY REFERENCES policies(id) ON DELETE CASCADE,
    workspace_id    BIGINT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    thresholds      TEXT NOT NULL,
    webhook         TEXT NOT NULL,
    secret_sealed   TEXT,
    updated_at      BIGINT NOT NULL
);

CREATE TABLE alert_events (
    id              BIGSERIAL PRIMARY KEY,
    workspace_id    BIGINT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    policy_id       BIGINT NOT NULL,
    subject         TEXT NOT NULL,
    subject_id      BIGINT NOT NULL,
    time_window     TEXT NOT NULL,
    window_start    BIGINT NOT NULL,
    threshold       BIGINT NOT NULL,
    payload         TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    give_up_at      BIGINT NOT NULL,
    lease_until     BIGINT NOT NULL DEFAULT 0,
    last_status     BIGINT,
    last_error      TEXT,
    created_at      BIGINT NOT NULL,
    delivered_at    BIGINT,
    UNIQUE (policy_id, subject_id, time_window, window_start, threshold)
);
CREATE INDEX alert_events_due ON alert_events (status, next_attempt_at);
CREATE INDEX alert_events_history ON alert_events (workspace_id, id);
