-- Quota usage (DESIGN.md §4): keyed by subject, metric and window start, never by policy, so
-- editing or recreating a policy keeps its usage. Gateways add their deltas in batches with an
-- atomic upsert that returns the global total. `used` is micro-credits for `credits`.
CREATE TABLE usage_counters (
    subject      TEXT NOT NULL,
    subject_id   BIGINT NOT NULL,
    metric       TEXT NOT NULL,
    time_window  TEXT NOT NULL,
    window_start BIGINT NOT NULL,
    used         BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (subject, subject_id, metric, time_window, window_start)
);

-- Shadow policies that would have refused the request, e.g. "apikey requests/day".
ALTER TABLE request_logs ADD COLUMN would_refuse TEXT;
