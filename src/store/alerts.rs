//! Budget alerts: each policy's thresholds and webhook, and the outbox of the alerts they fired
//! (one row per policy, subject, window and threshold), with what their delivery did.

use super::{Store, StoreResult};

/// A policy's alert settings.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct PolicyAlertRow {
    /// The policy.
    pub policy_id: i64,
    /// Its workspace.
    pub workspace_id: i64,
    /// JSON list of percents of the limit, ascending.
    pub thresholds: String,
    /// Where the alerts are POSTed.
    pub webhook: String,
    /// The HMAC signing secret sealed under the master key; none: unsigned.
    pub secret_sealed: Option<String>,
    /// Unix ms.
    pub updated_at: i64,
}

impl PolicyAlertRow {
    /// The thresholds (a damaged list reads as none).
    pub fn percents(&self) -> Vec<u16> {
        serde_json::from_str(&self.thresholds).unwrap_or_default()
    }
}

/// One fired alert and its delivery.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct AlertEventRow {
    /// Row id (ascending in time); sent as the body's `id`.
    pub id: i64,
    /// Workspace.
    pub workspace_id: i64,
    /// The policy that fired it (it may have been deleted since).
    pub policy_id: i64,
    /// Subject kind.
    pub subject: String,
    /// Subject id.
    pub subject_id: i64,
    /// The policy's window.
    pub time_window: String,
    /// Unix seconds of the window's start (0 for `total`).
    pub window_start: i64,
    /// Percent of the limit that was reached.
    pub threshold: i64,
    /// The JSON body, as fixed when it fired (without `id`).
    pub payload: String,
    /// `pending`, `delivered` or `failed` (given up).
    pub status: String,
    /// Deliveries tried.
    pub attempts: i64,
    /// Unix ms of the next try.
    pub next_attempt_at: i64,
    /// Unix ms after which a failed try gives up.
    pub give_up_at: i64,
    /// Unix ms until which a gateway holds it for a delivery under way.
    pub lease_until: i64,
    /// HTTP status of the last try, if one answered.
    pub last_status: Option<i64>,
    /// Why the last try failed.
    pub last_error: Option<String>,
    /// Unix ms it fired.
    pub created_at: i64,
    /// Unix ms it was delivered.
    pub delivered_at: Option<i64>,
}

/// An alert to put in the outbox.
#[derive(Clone, Debug)]
pub struct NewAlert {
    /// Workspace.
    pub workspace_id: i64,
    /// Policy.
    pub policy_id: i64,
    /// Subject kind.
    pub subject: &'static str,
    /// Subject id.
    pub subject_id: i64,
    /// Window.
    pub time_window: String,
    /// Window start, Unix seconds.
    pub window_start: i64,
    /// Percent reached.
    pub threshold: i64,
    /// JSON body.
    pub payload: String,
    /// Unix ms.
    pub now: i64,
    /// Unix ms after which delivery gives up.
    pub give_up_at: i64,
}

/// What one delivery try did.
#[derive(Clone, Debug)]
pub struct AlertAttempt<'a> {
    /// The alert.
    pub id: i64,
    /// The HTTP status, if the receiver answered.
    pub status: Option<i64>,
    /// Why it failed; none when delivered.
    pub error: Option<&'a str>,
    /// Unix ms of the try.
    pub now: i64,
    /// Unix ms of the next try; none: no more (delivered, or given up).
    pub next_attempt_at: Option<i64>,
}

/// Budget alerts.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait AlertStore {
    /// Every policy's alert settings (all workspaces), of policies that exist.
    async fn all_policy_alerts(&self) -> StoreResult<Vec<PolicyAlertRow>>;
    /// The alert settings of the policies of one workspace.
    async fn policy_alerts_in(&self, workspace_id: i64) -> StoreResult<Vec<PolicyAlertRow>>;
    /// Sets (`Some`) or removes (`None`) a policy's alert settings.
    async fn set_policy_alerts(&self, policy_id: i64, row: Option<&PolicyAlertRow>) -> StoreResult<()>;
    /// Puts an alert in the outbox unless the same one is there; whether it was new.
    async fn insert_alert(&self, a: &NewAlert) -> StoreResult<bool>;
    /// Takes up to `limit` pending alerts due at `now` that no gateway holds, holding them until
    /// `lease_until`.
    async fn claim_due_alerts(
        &self,
        now: i64,
        lease_until: i64,
        limit: i64,
    ) -> StoreResult<Vec<AlertEventRow>>;
    /// Records a delivery try: delivered (no error), retried later, or given up.
    async fn record_alert_attempt(&self, a: &AlertAttempt<'_>) -> StoreResult<()>;
    /// A page of a workspace's alerts, newest first, ids below `cursor`; optionally one policy's.
    async fn alert_page(
        &self,
        workspace_id: i64,
        policy_id: Option<i64>,
        cursor: Option<i64>,
        limit: i64,
    ) -> StoreResult<Vec<AlertEventRow>>;
    /// One alert of a workspace.
    async fn alert_in(&self, workspace_id: i64, id: i64) -> StoreResult<Option<AlertEventRow>>;
    /// Sends an alert again from `now` (pending, due at once, giving up at `give_up_at`).
    async fn requeue_alert(&self, id: i64, now: i64, give_up_at: i64) -> StoreResult<()>;
    /// How people name a subject: a key `email/name`, a member's email, a department's or
    /// workspace's name.
    async fn subject_name(&self, subject: &str, id: i64) -> StoreResult<Option<String>>;
    /// Deletes at most `limit` alerts fired before `cutoff_ms` (Unix ms), oldest first, in one
    /// short statement; returns how many (0: nothing left). Kept whatever their age: pending
    /// alerts (still being delivered), alerts of `total` windows, and alerts whose window may
    /// still count usage at the cutoff ([`window_over_by`]). Their row is what stops a crossing
    /// from firing twice: a restarted gateway, or another replica, that sees the same total again
    /// finds it in the outbox (the unique key) and sends nothing.
    async fn prune_alerts_batch(&self, cutoff_ms: i64, limit: i64) -> StoreResult<u64>;
}

/// The latest start (Unix seconds) of a window of kind `month`, `week`, or any shorter one (day,
/// minutes), that has surely ended at `cutoff_ms` with no request still counting into it: its
/// longest length (31 days, 7 days, 1 day, each with an hour of DST) and a day more for a request
/// that began in it and completes later (every request is bounded by minutes).
pub fn window_over_by(cutoff_ms: i64) -> [i64; 3] {
    const DAY: i64 = 86_400;
    let cutoff = cutoff_ms.div_euclid(1000);
    [cutoff - 32 * DAY, cutoff - 8 * DAY, cutoff - 2 * DAY]
}

impl AlertStore for Store {
    async fn all_policy_alerts(&self) -> StoreResult<Vec<PolicyAlertRow>> {
        Ok(sqlx::query_as(
            "SELECT a.* FROM policy_alerts a JOIN policies p ON p.id = a.policy_id ORDER BY a.policy_id",
        )
        .fetch_all(self.pool())
        .await?)
    }

    async fn policy_alerts_in(&self, workspace_id: i64) -> StoreResult<Vec<PolicyAlertRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM policy_alerts WHERE workspace_id = $1 ORDER BY policy_id")
                .bind(workspace_id)
                .fetch_all(self.pool())
                .await?,
        )
    }

    async fn set_policy_alerts(&self, policy_id: i64, row: Option<&PolicyAlertRow>) -> StoreResult<()> {
        let Some(r) = row else {
            sqlx::query("DELETE FROM policy_alerts WHERE policy_id = $1")
                .bind(policy_id)
                .execute(self.pool())
                .await?;
            return Ok(());
        };
        sqlx::query(
            "INSERT INTO policy_alerts (policy_id, workspace_id, thresholds, webhook, secret_sealed, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (policy_id) DO UPDATE SET workspace_id = excluded.workspace_id,
               thresholds = excluded.thresholds, webhook = excluded.webhook,
               secret_sealed = excluded.secret_sealed, updated_at = excluded.updated_at",
        )
        .bind(policy_id)
        .bind(r.workspace_id)
        .bind(&r.thresholds)
        .bind(&r.webhook)
        .bind(r.secret_sealed.as_deref())
        .bind(r.updated_at)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn insert_alert(&self, a: &NewAlert) -> StoreResult<bool> {
        let r = sqlx::query(
            "INSERT INTO alert_events (workspace_id, policy_id, subject, subject_id, time_window, window_start,
               threshold, payload, status, attempts, next_attempt_at, give_up_at, lease_until, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', 0, $9, $10, 0, $11)
             ON CONFLICT (policy_id, subject_id, time_window, window_start, threshold) DO NOTHING",
        )
        .bind(a.workspace_id)
        .bind(a.policy_id)
        .bind(a.subject)
        .bind(a.subject_id)
        .bind(&a.time_window)
        .bind(a.window_start)
        .bind(a.threshold)
        .bind(&a.payload)
        .bind(a.now)
        .bind(a.give_up_at)
        .bind(a.now)
        .execute(self.pool())
        .await?;
        Ok(r.rows_affected() > 0)
    }

    async fn claim_due_alerts(
        &self,
        now: i64,
        lease_until: i64,
        limit: i64,
    ) -> StoreResult<Vec<AlertEventRow>> {
        // The outer conditions are checked again on each row as it is updated: of two gateways
        // that picked the same row, the second finds it held and leaves it (Postgres re-reads a
        // row another transaction changed; SQLite runs one writer at a time).
        Ok(sqlx::query_as(
            "UPDATE alert_events SET lease_until = $2
             WHERE id IN (SELECT id FROM alert_events
                          WHERE status = 'pending' AND next_attempt_at <= $1 AND lease_until <= $1
                          ORDER BY id LIMIT $3)
               AND status = 'pending' AND lease_until <= $1
             RETURNING *",
        )
        .bind(now)
        .bind(lease_until)
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }

    async fn record_alert_attempt(&self, a: &AlertAttempt<'_>) -> StoreResult<()> {
        let (status, delivered_at) = match (a.error, a.next_attempt_at) {
            (None, _) => ("delivered", Some(a.now)),
            (Some(_), Some(_)) => ("pending", None),
            (Some(_), None) => ("failed", None),
        };
        sqlx::query(
            "UPDATE alert_events SET status = $2, attempts = attempts + 1, last_status = $3, last_error = $4,
               next_attempt_at = $5, delivered_at = $6, lease_until = 0 WHERE id = $1",
        )
        .bind(a.id)
        .bind(status)
        .bind(a.status)
        .bind(a.error)
        .bind(a.next_attempt_at.unwrap_or(a.now))
        .bind(delivered_at)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn alert_page(
        &self,
        workspace_id: i64,
        policy_id: Option<i64>,
        cursor: Option<i64>,
        limit: i64,
    ) -> StoreResult<Vec<AlertEventRow>> {
        Ok(sqlx::query_as(
            "SELECT * FROM alert_events WHERE workspace_id = $1 AND id < $2 AND ($3 = 0 OR policy_id = $4)
             ORDER BY id DESC LIMIT $5",
        )
        .bind(workspace_id)
        .bind(cursor.unwrap_or(i64::MAX))
        .bind(policy_id.unwrap_or(0))
        .bind(policy_id.unwrap_or(0))
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }

    async fn alert_in(&self, workspace_id: i64, id: i64) -> StoreResult<Option<AlertEventRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM alert_events WHERE workspace_id = $1 AND id = $2")
                .bind(workspace_id)
                .bind(id)
                .fetch_optional(self.pool())
                .await?,
        )
    }

    async fn requeue_alert(&self, id: i64, now: i64, give_up_at: i64) -> StoreResult<()> {
        sqlx::query(
            "UPDATE alert_events SET status = 'pending', next_attempt_at = $2, give_up_at = $3, lease_until = 0
             WHERE id = $1 AND status <> 'delivered'",
        )
        .bind(id)
        .bind(now)
        .bind(give_up_at)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn subject_name(&self, subject: &str, id: i64) -> StoreResult<Option<String>> {
        let sql = match subject {
            "apikey" => {
                "SELECT m.email || '/' || k.name FROM api_keys k JOIN members m ON m.id = k.member_id WHERE k.id = $1"
            }
            "member" => "SELECT email FROM members WHERE id = $1",
            "dept" => "SELECT name FROM departments WHERE id = $1",
            "ws" => "SELECT name FROM workspaces WHERE id = $1",
            _ => return Ok(None),
        };
        Ok(sqlx::query_scalar(sql)
            .bind(id)
            .fetch_optional(self.pool())
            .await?)
    }

    async fn prune_alerts_batch(&self, cutoff_ms: i64, limit: i64) -> StoreResult<u64> {
        let [month, week, shorter] = window_over_by(cutoff_ms);
        let r = sqlx::query(
            "DELETE FROM alert_events WHERE id IN
               (SELECT id FROM alert_events
                WHERE created_at < $1 AND status IN ('delivered', 'failed')
                  AND ((time_window = 'month' AND window_start <= $2)
                    OR (time_window = 'week' AND window_start <= $3)
                    OR (time_window NOT IN ('month', 'week', 'total') AND window_start <= $4))
                ORDER BY created_at LIMIT $5)",
        )
        .bind(cutoff_ms)
        .bind(month)
        .bind(week)
        .bind(shorter)
        .bind(limit)
        .execute(self.pool())
        .await?;
        Ok(r.rows_affected())
    }
}
