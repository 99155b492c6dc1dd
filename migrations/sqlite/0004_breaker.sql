-- The per-key error-rate breaker (DESIGN.md §5): trips over the key's whole life, never reset.
CREATE TABLE breaker_state (
    key_id        BIGINT PRIMARY KEY,
    trips         BIGINT NOT NULL DEFAULT 0,
    blocked_until BIGINT,
    banned        BIGINT NOT NULL DEFAULT 0
);

-- One row per trip: when, what the window held, and what it did.
CREATE TABLE breaker_trips (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    key_id        BIGINT NOT NULL,
    trip          BIGINT NOT NULL,
    at            BIGINT NOT NULL,
    requests      BIGINT NOT NULL,
    failures      BIGINT NOT NULL,
    blocked_until BIGINT,
    banned        BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX breaker_trips_key ON breaker_trips (key_id, at);
