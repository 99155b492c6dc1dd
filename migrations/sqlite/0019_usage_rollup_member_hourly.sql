-- A member's own usage per hour (UTC) (issue 24 §3): a member's usage by day in a workspace whose
-- days are not UTC days (the default zone, Asia/Shanghai, is UTC+8) cannot be summed from UTC
-- days, and read up to 100,000 of the member's logs for 30 days. Local days that start on the
-- hour are whole hours: the report sums the member's hours (PRIMARY KEY prefix: workspace, member,
-- hour; about 720 rows for 30 days) and reads only the partial hours at the edges from the logs.
-- Written with the logs in the same transaction as the other rollups: one upsert per distinct
-- (member, hour) of a flushed batch. Days at half-hour offsets still read the logs. The retention
-- task deletes an hour once the logs of all of it are gone.
CREATE TABLE usage_rollup_member_hourly (
    workspace_id      BIGINT NOT NULL,
    member_id         BIGINT NOT NULL,
    hour_start        BIGINT NOT NULL,
    requests          BIGINT NOT NULL DEFAULT 0,
    prompt_tokens     BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0,
    total_tokens      BIGINT NOT NULL DEFAULT 0,
    credits           BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (workspace_id, member_id, hour_start)
);
CREATE INDEX usage_rollup_member_hourly_hour ON usage_rollup_member_hourly (hour_start);

-- The logs already stored.
INSERT INTO usage_rollup_member_hourly (workspace_id, member_id, hour_start,
    requests, prompt_tokens, completion_tokens, total_tokens, credits)
SELECT workspace_id, member_id, hour_start, COUNT(*), CAST(TOTAL(prompt_tokens) AS INTEGER), CAST(TOTAL(completion_tokens) AS INTEGER), CAST(TOTAL(total_tokens) AS INTEGER), CAST(TOTAL(credits) AS INTEGER)
FROM (
    SELECT workspace_id, member_id, CASE WHEN ts >= 0 THEN (ts / 3600000) * 3600000 ELSE -((-ts + 3599999) / 3600000) * 3600000 END AS hour_start,
        prompt_tokens, completion_tokens, total_tokens, credits
    FROM request_logs
) logs
GROUP BY workspace_id, member_id, hour_start;
