-- Usage per day (UTC) and workspace by key and by member (issue 24 §3), written with the logs in
-- the same transaction as the hourly rollup (0011), so that a workspace's usage by key or by
-- member over a month reads a row per key (or member) and day instead of every log; the partial
-- days at the edges of a range are read from the logs. Daily, not hourly: with thousands of keys
-- nearly every hour has a row per active key, about as many rows as logs. dimension 'key':
-- group_key is the key's id; 'member': the member's id. The retention task deletes a day once
-- the logs of all of it are gone.
CREATE TABLE usage_rollup_daily (
    workspace_id      BIGINT NOT NULL,
    day_start         BIGINT NOT NULL,
    dimension         TEXT NOT NULL,
    group_key         TEXT NOT NULL,
    requests          BIGINT NOT NULL DEFAULT 0,
    prompt_tokens     BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0,
    total_tokens      BIGINT NOT NULL DEFAULT 0,
    credits           BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (workspace_id, day_start, dimension, group_key)
);
CREATE INDEX usage_rollup_daily_day ON usage_rollup_daily (day_start);

-- The logs already stored.
INSERT INTO usage_rollup_daily (workspace_id, day_start, dimension, group_key, requests,
    prompt_tokens, completion_tokens, total_tokens, credits)
SELECT workspace_id, day_start, 'key', CAST(key_id AS TEXT), COUNT(*), CAST(TOTAL(prompt_tokens) AS INTEGER), CAST(TOTAL(completion_tokens) AS INTEGER), CAST(TOTAL(total_tokens) AS INTEGER), CAST(TOTAL(credits) AS INTEGER)
FROM (
    SELECT workspace_id, CASE WHEN ts >= 0 THEN (ts / 86400000) * 86400000 ELSE -((-ts + 86399999) / 86400000) * 86400000 END AS day_start,
        key_id, prompt_tokens, completion_tokens, total_tokens, credits
    FROM request_logs
) logs
GROUP BY workspace_id, day_start, key_id;
INSERT INTO usage_rollup_daily (workspace_id, day_start, dimension, group_key, requests,
    prompt_tokens, completion_tokens, total_tokens, credits)
SELECT workspace_id, day_start, 'member', CAST(member_id AS TEXT), COUNT(*), CAST(TOTAL(prompt_tokens) AS INTEGER), CAST(TOTAL(completion_tokens) AS INTEGER), CAST(TOTAL(total_tokens) AS INTEGER), CAST(TOTAL(credits) AS INTEGER)
FROM (
    SELECT workspace_id, CASE WHEN ts >= 0 THEN (ts / 86400000) * 86400000 ELSE -((-ts + 86399999) / 86400000) * 86400000 END AS day_start,
        member_id, prompt_tokens, completion_tokens, total_tokens, credits
    FROM request_logs
) logs
GROUP BY workspace_id, day_start, member_id;
