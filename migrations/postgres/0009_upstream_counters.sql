-- Upstream credentials' own limits shared by every gateway: requests and tokens per credential,
-- counter ("minute_requests", "minute_tokens", "day_requests") and UTC window start (Unix ms).
-- Gateways add their deltas in batches with an atomic upsert that returns the global total;
-- windows that have ended are deleted by the next flush.
CREATE TABLE upstream_counters (
    credential_id BIGINT NOT NULL,
    counter       TEXT NOT NULL,
    window_start  BIGINT NOT NULL,
    used          BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (credential_id, counter, window_start)
);
