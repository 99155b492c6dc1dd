-- Budget alert history follows log retention: the retention task deletes delivered and given-up
-- alerts older than its cutoff, oldest first, a bounded batch at a time; this index finds them
-- without reading the whole outbox.
CREATE INDEX alert_events_created_at ON alert_events (created_at);
