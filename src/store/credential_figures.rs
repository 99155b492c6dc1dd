//! What the console shows of each upstream credential beyond its settings (issue 46), from what
//! the gateway already writes off the request path:
//!
//! - `upstream_rollup`: per hour (UTC), workspace and credential, the upstream attempts, those
//!   that failed, the requests served with their latency, tokens and credits; added by the log
//!   writer in the same transaction as the logs it sums (as the usage rollups are), read for the
//!   figures of the last day.
//! - `upstream_lock_events`: each lock a failure wrote (credential, what it parks, from when,
//!   until when, the rule, the provider's words), written with the locks by the same background
//!   task; the card of a parked credential shows the words of its running locks, and the figures
//!   its time under a lock.

use serde::Deserialize;

use super::{LogRecord, NARROW_STATEMENT_ROWS, SqlBuilder, Store, StoreResult, hour_of, statements};

/// What the log says of a credential whose in-flight slots stayed full (kRouter's "busy, try
/// another"): an attempt that sent nothing, so not counted as one.
pub const BUSY_ATTEMPT: &str = "credential busy: no in-flight slot came free in time";

/// A lock a failure wrote.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct ParkEvent {
    /// The credential.
    pub credential_id: i64,
    /// What it parks: an upstream model, `*:free` or `*` (as `upstream_locks.target`).
    pub target: String,
    /// When it was written, Unix ms.
    pub since_ms: i64,
    /// Its end, Unix ms.
    pub until_ms: i64,
    /// The classification rule.
    pub rule: String,
    /// The provider's words, masked and bounded, when it answered an error.
    pub message: Option<String>,
}

/// A credential's figures summed over some hours.
#[derive(Clone, Debug, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct CredentialFigures {
    /// The credential.
    pub upstream_id: i64,
    /// Requests sent to it (retries and failovers count once each).
    pub attempts: i64,
    /// Of those, the ones that failed: no answer, or a status of 400 or more.
    pub failures: i64,
    /// Requests it served (the client's answer was a success).
    pub served: i64,
    /// Sum of the served requests' whole latency, ms.
    pub latency_ms: i64,
    /// Sum of the served requests' time until the credential's response headers, ms.
    pub upstream_ms: i64,
    /// Served requests with a time until the headers.
    pub timed: i64,
    /// Tokens of the served requests.
    pub total_tokens: i64,
    /// Micro-credits of the served requests.
    pub credits: i64,
}

/// An attempt as the log's `attempts_detail` holds it, as far as the figures need it.
#[derive(Deserialize)]
struct LoggedAttempt {
    credential_id: i64,
    #[serde(default)]
    status: Option<i64>,
    #[serde(default)]
    error: Option<String>,
}

/// The columns of a rollup row, after its key.
const FIGURES: [&str; 8] = [
    "attempts",
    "failures",
    "served",
    "latency_ms",
    "upstream_ms",
    "timed",
    "total_tokens",
    "credits",
];

/// One row's figures in [`FIGURES`]' order.
pub(super) type Figures = [i64; 8];

/// The figures a batch of logs adds, per (workspace, hour, credential). A request served at the
/// first try is read from the log's own columns; only one that failed or failed over has its
/// attempts read from `attempts_detail`.
pub(super) fn figures_of(records: &[LogRecord]) -> std::collections::BTreeMap<(i64, i64, i64), Figures> {
    let mut out: std::collections::BTreeMap<(i64, i64, i64), Figures> = std::collections::BTreeMap::new();
    let mut add = |ws: i64, ts: i64, credential: i64, f: Figures| {
        let row = out.entry((ws, hour_of(ts), credential)).or_default();
        for (acc, v) in row.iter_mut().zip(f) {
            *acc = acc.saturating_add(v);
        }
    };
    for r in records {
        let served = r.status < 400 && r.attempts > 0;
        if let (true, Some(credential)) = (served, r.upstream_id) {
            let timed = r.upstream_latency_ms.map_or(0, |_| 1);
            let one_try = r.attempts == 1;
            add(
                r.workspace_id,
                r.ts,
                credential,
                [
                    i64::from(one_try),
                    0,
                    1,
                    r.latency_ms,
                    r.upstream_latency_ms.unwrap_or(0),
                    timed,
                    r.total_tokens,
                    r.credits,
                ],
            );
            if one_try {
                continue;
            }
        }
        if r.attempts == 0 {
            continue;
        }
        let attempts: Vec<LoggedAttempt> = serde_json::from_str(&r.attempts_detail).unwrap_or_default();
        let last = attempts.len().saturating_sub(1);
        for (i, a) in attempts.iter().enumerate() {
            if a.status.is_none() && a.error.as_deref() == Some(BUSY_ATTEMPT) {
                continue;
            }
            // The last attempt of a served request is its success, counted above.
            if served && i == last {
                add(r.workspace_id, r.ts, a.credential_id, [1, 0, 0, 0, 0, 0, 0, 0]);
                continue;
            }
            let failed = a.status.is_none_or(|s| s >= 400);
            add(
                r.workspace_id,
                r.ts,
                a.credential_id,
                [1, i64::from(failed), 0, 0, 0, 0, 0, 0],
            );
        }
    }
    out
}

/// The statement adding rows to `upstream_rollup`: what comes before the rows' values, and after.
fn upsert_parts() -> (String, String) {
    let head = format!(
        "INSERT INTO upstream_rollup (workspace_id, hour_start, upstream_id, {}) VALUES ",
        FIGURES.join(", ")
    );
    let set: Vec<String> = FIGURES
        .iter()
        .map(|c| {
            format!(
                "{c} = CASE WHEN upstream_rollup.{c} > 9223372036854775807 - excluded.{c} \
                 THEN 9223372036854775807 ELSE upstream_rollup.{c} + excluded.{c} END"
            )
        })
        .collect();
    let tail = format!(
        " ON CONFLICT (workspace_id, hour_start, upstream_id) DO UPDATE SET {}",
        set.join(", ")
    );
    (head, tail)
}

/// The statement adding one row to `upstream_rollup`, its 11 values as `?` (SQLite).
pub(super) fn upsert_one_sql() -> String {
    let (head, tail) = upsert_parts();
    format!("{head}({}){tail}", vec!["?"; 3 + FIGURES.len()].join(", "))
}

/// Adds `records` to `upstream_rollup`, in `tx`, in key order.
pub(super) async fn add(
    store: &Store,
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    records: &[LogRecord],
) -> StoreResult<()> {
    let rows: Vec<((i64, i64, i64), Figures)> = figures_of(records).into_iter().collect();
    let (head, tail) = upsert_parts();
    for chunk in statements(&rows, NARROW_STATEMENT_ROWS) {
        let mut b = SqlBuilder::new(store, &head);
        for (i, ((ws, hour, credential), f)) in chunk.iter().enumerate() {
            b.push(if i == 0 { "(" } else { ", (" });
            b.bind(*ws).push(", ").bind(*hour).push(", ").bind(*credential);
            for v in f {
                b.push(", ").bind(*v);
            }
            b.push(")");
        }
        b.push(&tail);
        let (sql, args) = b.finish();
        sqlx::query_with(&sql, args).execute(&mut **tx).await?;
    }
    Ok(())
}

/// Credential figures and lock history.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait CredentialFigureStore {
    /// Records locks failures wrote.
    async fn record_parks(&self, events: &[ParkEvent]) -> StoreResult<()>;
    /// Ends a credential's recorded locks still running at `now_ms` (a passed connection test;
    /// with `models_only`, a new secret, which clears the per-model locks only).
    async fn end_parks(&self, credential: i64, now_ms: i64, models_only: bool) -> StoreResult<()>;
    /// The recorded locks of these credentials that end after `after_ms`.
    async fn park_events(&self, credentials: &[i64], after_ms: i64) -> StoreResult<Vec<ParkEvent>>;
    /// A workspace's credentials' figures summed over the hours from `from_hour_ms` on.
    async fn credential_figures(
        &self,
        workspace_id: i64,
        from_hour_ms: i64,
    ) -> StoreResult<Vec<CredentialFigures>>;
}

impl CredentialFigureStore for Store {
    async fn record_parks(&self, events: &[ParkEvent]) -> StoreResult<()> {
        for chunk in statements(events, NARROW_STATEMENT_ROWS) {
            let mut b = SqlBuilder::new(
                self,
                "INSERT INTO upstream_lock_events (credential_id, target, since_ms, until_ms, rule, message) VALUES ",
            );
            for (i, e) in chunk.iter().enumerate() {
                b.push(if i == 0 { "(" } else { ", (" });
                b.bind(e.credential_id)
                    .push(", ")
                    .bind(e.target.as_str())
                    .push(", ")
                    .bind(e.since_ms)
                    .push(", ")
                    .bind(e.until_ms)
                    .push(", ")
                    .bind(e.rule.as_str())
                    .push(", ")
                    .bind(e.message.as_deref())
                    .push(")");
            }
            let (sql, args) = b.finish();
            sqlx::query_with(&sql, args).execute(self.pool()).await?;
        }
        Ok(())
    }

    async fn end_parks(&self, credential: i64, now_ms: i64, models_only: bool) -> StoreResult<()> {
        let models = if models_only {
            " AND target NOT IN ('*', '*:free')"
        } else {
            ""
        };
        sqlx::query(&format!(
            "UPDATE upstream_lock_events SET until_ms = $1 WHERE credential_id = $2 AND until_ms > $1{models}"
        ))
        .bind(now_ms)
        .bind(credential)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn park_events(&self, credentials: &[i64], after_ms: i64) -> StoreResult<Vec<ParkEvent>> {
        let mut out = Vec::new();
        for chunk in credentials.chunks(500) {
            let mut b = SqlBuilder::new(
                self,
                "SELECT credential_id, target, since_ms, until_ms, rule, message FROM upstream_lock_events \
                 WHERE until_ms > ",
            );
            b.bind(after_ms).push(" AND credential_id IN (");
            for (i, c) in chunk.iter().enumerate() {
                if i > 0 {
                    b.push(", ");
                }
                b.bind(*c);
            }
            b.push(") ORDER BY since_ms");
            let (sql, args) = b.finish();
            out.extend(
                sqlx::query_as_with::<_, ParkEvent, _>(&sql, args)
                    .fetch_all(self.pool())
                    .await?,
            );
        }
        Ok(out)
    }

    async fn credential_figures(
        &self,
        workspace_id: i64,
        from_hour_ms: i64,
    ) -> StoreResult<Vec<CredentialFigures>> {
        let sums: Vec<String> = FIGURES
            .iter()
            .map(|c| format!("CAST(SUM({c}) AS BIGINT) AS {c}"))
            .collect();
        Ok(sqlx::query_as(&format!(
            "SELECT upstream_id, {} FROM upstream_rollup WHERE workspace_id = $1 AND hour_start >= $2 \
             GROUP BY upstream_id ORDER BY upstream_id",
            sums.join(", ")
        ))
        .bind(workspace_id)
        .bind(from_hour_ms)
        .fetch_all(self.pool())
        .await?)
    }
}

/// How long in `[from_ms, to_ms)` at least one of `events` was running: the length of their
/// union, so locks that overlap (a model and the whole credential, two gateways' writes of the
/// same failure) count once.
pub fn time_parked(events: &[ParkEvent], from_ms: i64, to_ms: i64) -> i64 {
    let mut spans: Vec<(i64, i64)> = events
        .iter()
        .map(|e| (e.since_ms.max(from_ms), e.until_ms.min(to_ms)))
        .filter(|(a, b)| a < b)
        .collect();
    spans.sort_unstable();
    let mut total = 0i64;
    let mut current: Option<(i64, i64)> = None;
    for (a, b) in spans {
        match current {
            Some((s, e)) if a <= e => current = Some((s, e.max(b))),
            Some((s, e)) => {
                total = total.saturating_add(e - s);
                current = Some((a, b));
            }
            None => current = Some((a, b)),
        }
    }
    if let Some((s, e)) = current {
        total = total.saturating_add(e - s);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(since_ms: i64, until_ms: i64) -> ParkEvent {
        ParkEvent {
            credential_id: 1,
            target: "*".into(),
            since_ms,
            until_ms,
            rule: "r".into(),
            message: None,
        }
    }

    /// A case: the locks (since, until), the window, and the time parked in it.
    type ParkCase = (&'static [(i64, i64)], (i64, i64), i64);

    #[test]
    fn time_parked_counts_overlaps_once_and_only_inside_the_window() {
        let cases: [ParkCase; 7] = [
            (&[], (0, 100), 0),
            (&[(10, 20)], (0, 100), 10),
            (&[(10, 30), (20, 40)], (0, 100), 30),
            (&[(10, 20), (30, 40)], (0, 100), 20),
            (&[(10, 50), (20, 30)], (0, 100), 40),
            // Clipped at both ends of the window.
            (&[(-50, 20), (90, 500)], (0, 100), 30),
            // A lock ended by a connection test before it began to count.
            (&[(40, 40)], (0, 100), 0),
        ];
        for (spans, (from, to), want) in cases {
            let events: Vec<ParkEvent> = spans.iter().map(|(a, b)| event(*a, *b)).collect();
            assert_eq!(time_parked(&events, from, to), want, "{spans:?}");
        }
    }

    fn log(status: i64, attempts: i64, upstream: Option<i64>, detail: &str) -> LogRecord {
        LogRecord {
            workspace_id: 1,
            ts: 3_600_000 * 5 + 10,
            status,
            attempts,
            upstream_id: upstream,
            attempts_detail: detail.into(),
            latency_ms: 100,
            upstream_latency_ms: Some(40),
            total_tokens: 7,
            credits: 3,
            ..LogRecord::default()
        }
    }

    /// A case: a log, and what it adds to its credentials' rows: (attempts, failures, served).
    type FigureCase<'a> = (LogRecord, &'a [(i64, [i64; 3])]);

    #[test]
    fn figures_count_each_attempt_on_its_credential() {
        let busy = format!(
            r#"[{{"credential_id":3,"status":null,"error":"{BUSY_ATTEMPT}"}},{{"credential_id":2,"status":200}}]"#
        );
        let cases: [FigureCase; 6] = [
            // Served at the first try: nothing parsed.
            (log(200, 1, Some(2), "not read"), &[(2, [1, 0, 1])]),
            // Failed over from 1 (429) to 2, which served.
            (
                log(
                    200,
                    2,
                    Some(2),
                    r#"[{"credential_id":1,"status":429},{"credential_id":2,"status":200}]"#,
                ),
                &[(1, [1, 1, 0]), (2, [1, 0, 1])],
            ),
            // Nothing served: a connection failure and a 500.
            (
                log(
                    502,
                    2,
                    Some(2),
                    r#"[{"credential_id":1,"status":null,"error":"refused"},{"credential_id":2,"status":500}]"#,
                ),
                &[(1, [1, 1, 0]), (2, [1, 1, 0])],
            ),
            // A busy credential sent nothing.
            (log(200, 2, Some(2), &busy), &[(2, [1, 0, 1])]),
            // Refused by the gateway before any attempt.
            (log(429, 0, None, "[]"), &[]),
            // A detail that does not parse counts no attempt (the log itself is kept).
            (log(500, 1, Some(2), "{broken"), &[]),
        ];
        for (record, want) in cases {
            let got: Vec<(i64, [i64; 3])> = figures_of(std::slice::from_ref(&record))
                .into_iter()
                .map(|((ws, hour, c), f)| {
                    assert_eq!((ws, hour), (1, 3_600_000 * 5));
                    (c, [f[0], f[1], f[2]])
                })
                .collect();
            assert_eq!(got, want, "{}", record.attempts_detail);
        }
    }
}
