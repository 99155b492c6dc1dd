-- A trip starts a fresh window: each second of a key's shared outcomes belongs to the window its
-- `trip`-th trip began (0: before any), and is read only while that window runs. Outcomes of
-- requests admitted before a trip never join the window after it. The rows already there belong
-- to the key's current window.
ALTER TABLE breaker_buckets ADD COLUMN trip BIGINT NOT NULL DEFAULT 0;
UPDATE breaker_buckets SET trip = COALESCE(
    (SELECT s.trips FROM breaker_state s WHERE s.key_id = breaker_buckets.key_id), 0);

-- The limits an owner or admin set on a member's keys, kept on the member and carried to every
-- key the member creates (DESIGN.md §11: they survive the key's deletion and re-creation): the
-- model allow-list (JSON), the concurrency cap of each key and the tag allow-list (JSON).
ALTER TABLE members ADD COLUMN key_allowed_models TEXT;
ALTER TABLE members ADD COLUMN key_max_in_flight BIGINT;
ALTER TABLE members ADD COLUMN key_allowed_tags TEXT;

-- An email names one identity whatever its case: members are found by the email with its ASCII
-- letters folded (not unique: members stored before this rule may differ only in case).
CREATE INDEX members_email_folded ON members (LOWER(email COLLATE "C"));
