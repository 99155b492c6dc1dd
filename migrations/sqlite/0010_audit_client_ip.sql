-- Where each configuration change came from: the client's address (behind a trusted proxy, the
-- one it forwarded). Null for changes recorded before.
ALTER TABLE audit_log ADD COLUMN client_ip TEXT;
