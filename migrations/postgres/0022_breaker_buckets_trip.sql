-- A trip starts a fresh window: each second of a key's shared outcomes belongs to the window its
-- `trip`-th trip began (0: before any), and is read only while that window runs. Outcomes of
-- requests admitted before a trip never join the window after it. The rows already there belong
-- to the key's current window.
ALTER TABLE breaker_buckets ADD COLUMN trip BIGINT NOT NULL DEFAULT 0;
UPDATE breaker_buckets SET trip = COALESCE(
    (SELECT s.trips FROM breaker_state s WHERE s.key_id = breaker_buckets.key_id), 0);
