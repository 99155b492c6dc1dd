-- A member's own usage per day (UTC), key, department and model (issue 24 §3): a member who is not
-- an owner or admin sees only their own usage, which read that member's logs (100,000 of them over
-- 30 days for the busiest member of 10 million logs). Written with the logs in the same transaction
-- as the other rollups; a member's report by day, key, member, department or model sums the
-- member's rows of whole days (PRIMARY KEY prefix: workspace, member, day) and reads only the
-- partial days at the edges of its range from the logs. One row per (member, key, department,
-- model group) and day: about one upsert per distinct (key, model) of a flushed batch, fewer than
-- a dimension per grouping would take, and a member's rows of 30 days are a few hundred. Its own
-- table, not usage_rollup_daily: the workspace's reports by key and member scan every row of the
-- days of their range there. dept_group: the department's id, '' without one; model_group:
-- 'served:' and the model that served or 'asked:' and the model asked for. The retention task
-- deletes a day once the logs of all of it are gone.
CREATE TABLE usage_rollup_member (
    workspace_id      BIGINT NOT NULL,
    member_id         BIGINT NOT NULL,
    day_start         BIGINT NOT NULL,
    key_id            BIGINT NOT NULL,
    dept_group        TEXT NOT NULL,
    model_group       TEXT NOT NULL,
    requests          BIGINT NOT NULL DEFAULT 0,
    prompt_tokens     BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0,
    total_tokens      BIGINT NOT NULL DEFAULT 0,
    credits           BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (workspace_id, member_id, day_start, key_id, dept_group, model_group)
);
CREATE INDEX usage_rollup_member_day ON usage_rollup_member (day_start);

-- The logs already stored.
INSERT INTO usage_rollup_member (workspace_id, member_id, day_start, key_id, dept_group, model_group,
    requests, prompt_tokens, completion_tokens, total_tokens, credits)
SELECT workspace_id, member_id, day_start, key_id, dept_group, model_group, COUNT(*), CAST(TOTAL(prompt_tokens) AS INTEGER), CAST(TOTAL(completion_tokens) AS INTEGER), CAST(TOTAL(total_tokens) AS INTEGER), CAST(TOTAL(credits) AS INTEGER)
FROM (
    SELECT workspace_id, member_id, CASE WHEN ts >= 0 THEN (ts / 86400000) * 86400000 ELSE -((-ts + 86399999) / 86400000) * 86400000 END AS day_start,
        key_id, COALESCE(CAST(department_id AS TEXT), '') AS dept_group,
        CASE WHEN model_served IS NOT NULL THEN 'served:' || model_served ELSE 'asked:' || COALESCE(model_requested, '') END AS model_group,
        prompt_tokens, completion_tokens, total_tokens, credits
    FROM request_logs
) logs
GROUP BY workspace_id, member_id, day_start, key_id, dept_group, model_group;
