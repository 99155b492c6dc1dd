-- Labels per key and their expiry (issue 40 item 3). Each tag value and end user remembers the
-- API key that brought it first (caps per key: max_tag_keys_per_key, max_tag_values_per_key,
-- max_end_users_per_key) and when a request last brought it, written in batches (at most a
-- minute late), so that upkeep deletes those unseen for label_expiry_days and an admin can list
-- and prune them. Rows made before this migration, or by an admin's policy, have no key; their
-- last_seen_at of 0 reads as their created_at.
ALTER TABLE tag_values ADD COLUMN api_key_id BIGINT;
ALTER TABLE tag_values ADD COLUMN last_seen_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE end_users ADD COLUMN api_key_id BIGINT;
ALTER TABLE end_users ADD COLUMN last_seen_at BIGINT NOT NULL DEFAULT 0;
CREATE INDEX tag_values_api_key ON tag_values (workspace_id, api_key_id, tag_key)
    WHERE api_key_id IS NOT NULL;
CREATE INDEX end_users_api_key ON end_users (workspace_id, api_key_id)
    WHERE api_key_id IS NOT NULL;
CREATE INDEX tag_values_last_seen ON tag_values (last_seen_at);
CREATE INDEX end_users_last_seen ON end_users (last_seen_at);
