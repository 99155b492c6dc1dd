-- The breaker's sliding window shared by every gateway: outcomes per key and second, added in
-- batches; each gateway reads the last 60 s of all of them at every flush.
CREATE TABLE breaker_buckets (
    key_id BIGINT NOT NULL,
    second BIGINT NOT NULL,
    total  BIGINT NOT NULL DEFAULT 0,
    failed BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, second)
);
