-- Per-key and per-member guardrails beside quotas (issue 25 items 3 and 4): the public models
-- the key (member) may call, a JSON array of names or trailing-* patterns (null: every model),
-- and the most requests it may have in flight on one gateway (null: no cap).
ALTER TABLE api_keys ADD COLUMN allowed_models TEXT;
ALTER TABLE api_keys ADD COLUMN max_in_flight BIGINT;
ALTER TABLE members ADD COLUMN allowed_models TEXT;
ALTER TABLE members ADD COLUMN max_in_flight BIGINT;
