-- Months of logs (issue 24 §3). The console lists logs newest first by (ts, id), and the
-- workspace, key and member indexes end in (ts, id): a page of any time range is read straight
-- from an index. The other filters (status, source, model) read the workspace's index and skip
-- what does not match: an index each would cost every insert. The retention task deletes by ts
-- in bounded batches; a log's detail is found by its request id.
DROP INDEX request_logs_ws_ts;
DROP INDEX request_logs_key_ts;
DROP INDEX request_logs_member_ts;
CREATE INDEX request_logs_ws_ts ON request_logs (workspace_id, ts, id);
CREATE INDEX request_logs_key_ts ON request_logs (key_id, ts, id);
CREATE INDEX request_logs_member_ts ON request_logs (member_id, ts, id);
CREATE INDEX request_logs_ts ON request_logs (ts);
CREATE INDEX request_logs_request_id ON request_logs (workspace_id, request_id);

-- Usage per hour and workspace by model and by department, written with the logs in the same
-- transaction, so that a workspace's usage by day, model or department reads a few dozen rows
-- per hour instead of every log. Exact: each row is the sum of the logs of its hour (UTC) and
-- group; the retention task prunes logs and rollups at the same hour boundary. dimension
-- 'model': group_key is 'served:' and the model that served, or 'asked:' and the model asked
-- for when nothing served; 'dept': the department's id, '' for none.
CREATE TABLE usage_rollup (
    workspace_id      BIGINT NOT NULL,
    hour_start        BIGINT NOT NULL,
    dimension         TEXT NOT NULL,
    group_key         TEXT NOT NULL,
    requests          BIGINT NOT NULL DEFAULT 0,
    prompt_tokens     BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0,
    total_tokens      BIGINT NOT NULL DEFAULT 0,
    credits           BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (workspace_id, hour_start, dimension, group_key)
);
CREATE INDEX usage_rollup_hour ON usage_rollup (hour_start);

-- The logs already stored.
INSERT INTO usage_rollup (workspace_id, hour_start, dimension, group_key, requests, prompt_tokens,
    completion_tokens, total_tokens, credits)
SELECT workspace_id, hour_start, 'model', group_key, COUNT(*), CAST(TOTAL(prompt_tokens) AS INTEGER), CAST(TOTAL(completion_tokens) AS INTEGER), CAST(TOTAL(total_tokens) AS INTEGER), CAST(TOTAL(credits) AS INTEGER)
FROM (
    SELECT workspace_id, CASE WHEN ts >= 0 THEN (ts / 3600000) * 3600000 ELSE -((-ts + 3599999) / 3600000) * 3600000 END AS hour_start,
        CASE WHEN model_served IS NOT NULL THEN 'served:' || model_served
             ELSE 'asked:' || COALESCE(model_requested, '') END AS group_key,
        prompt_tokens, completion_tokens, total_tokens, credits
    FROM request_logs
) logs
GROUP BY workspace_id, hour_start, group_key;
INSERT INTO usage_rollup (workspace_id, hour_start, dimension, group_key, requests, prompt_tokens,
    completion_tokens, total_tokens, credits)
SELECT workspace_id, hour_start, 'dept', group_key, COUNT(*), CAST(TOTAL(prompt_tokens) AS INTEGER), CAST(TOTAL(completion_tokens) AS INTEGER), CAST(TOTAL(total_tokens) AS INTEGER), CAST(TOTAL(credits) AS INTEGER)
FROM (
    SELECT workspace_id, CASE WHEN ts >= 0 THEN (ts / 3600000) * 3600000 ELSE -((-ts + 3599999) / 3600000) * 3600000 END AS hour_start,
        COALESCE(CAST(department_id AS TEXT), '') AS group_key,
        prompt_tokens, completion_tokens, total_tokens, credits
    FROM request_logs
) logs
GROUP BY workspace_id, hour_start, group_key;
