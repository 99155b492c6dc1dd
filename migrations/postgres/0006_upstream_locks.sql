-- Learned locks on upstream credentials (DESIGN.md §6, kRouter): what is parked, until when, by
-- which rule. target: an upstream model name, "*:free" (every free model), or "*" (the whole
-- credential). Writers only ever extend a lock.
CREATE TABLE upstream_locks (
    credential_id BIGINT NOT NULL,
    target        TEXT NOT NULL,
    until_ms      BIGINT NOT NULL,
    rule          TEXT NOT NULL,
    PRIMARY KEY (credential_id, target)
);

-- Account-wide trouble (suspended, verify your account): out of rotation until a connection test.
CREATE TABLE upstream_health (
    credential_id BIGINT PRIMARY KEY,
    banned        BIGINT NOT NULL DEFAULT 0
);
