-- Key expiry and rotation (issue 25 item 2): when the key stops working (Unix ms; null: never),
-- and the secret a rotation replaced, which keeps working until its grace ends (Unix ms).
ALTER TABLE api_keys ADD COLUMN expires_at BIGINT;
ALTER TABLE api_keys ADD COLUMN previous_key_hash TEXT;
ALTER TABLE api_keys ADD COLUMN previous_expires_at BIGINT;
CREATE INDEX api_keys_previous_key_hash ON api_keys (previous_key_hash);
