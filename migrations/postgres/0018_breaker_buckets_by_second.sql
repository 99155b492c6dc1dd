-- The upkeep deletes breaker buckets older than two breaker windows, in batches, by second.
CREATE INDEX breaker_buckets_second ON breaker_buckets (second);
