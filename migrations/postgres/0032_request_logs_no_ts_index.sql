-- The retention task deletes old logs workspace by workspace through request_logs_ws_ts
-- (workspace_id, ts, id); an index on ts alone cost every log's insert for an hourly task.
DROP INDEX request_logs_ts;
