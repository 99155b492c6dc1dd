//! DESIGN.md §11: a policy created in the middle of a window counts the usage already recorded
//! in that window (for `total`, all of the recorded history), on every gateway.
//!
//! Counters belong to a subject, metric and window, not to a policy (DESIGN.md §4), and a
//! request adds only to the counters of the policies that apply to it when it completes: a
//! subject with no policy of that metric and window has no counter, so a new policy used to
//! start from 0. When a policy appears (the admin API creates it, or a resources file at start),
//! the counter of each subject it covers that has none yet is created in the store with the
//! usage the rollups and logs hold for its current window (`store::RecordedUsageStore`): every
//! gateway reads it with the counter's first check, or its next flush. A counter that exists is
//! kept: a policy of the same subject, metric and window has been counting into it.
//!
//! What is counted is what is recorded: requests an upstream served and their tokens and
//! credits, as in the request logs once written (a request that completed within the last
//! moment, its log not yet written, is not). Tag and end-user policies start from their counters
//! alone: the rollups keep neither subject.

use chrono::{DateTime, FixedOffset, Utc};
use chrono_tz::Tz;

use super::{CounterKey, PolicyRule, QuotaCounters};
use crate::quota::SubjectKind;
use crate::quota::window;
use crate::store::{RecordedUsage, RecordedUsageStore, Store, StoreResult, UsageCounterRow};

/// What a new policy counted of the usage recorded before it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    /// The subjects whose counter it started from their recorded usage.
    pub subjects: usize,
    /// Their recorded usage, summed (micro-credits for `credits`).
    pub used: i64,
    /// The start of the window counted from, in its zone; none for `total`.
    pub since: Option<DateTime<FixedOffset>>,
}

/// Starts the counters of `rule` (a policy of workspace `workspace_id` whose windows align in
/// `tz`) that have none yet from the usage recorded in the window current at `now`, in the
/// store; returns what was counted and the counters created, with their totals.
pub async fn count_recorded(
    store: &Store,
    workspace_id: i64,
    rule: &PolicyRule,
    now: DateTime<Utc>,
    tz: Tz,
) -> StoreResult<(Counted, Vec<(CounterKey, i64)>)> {
    let bounds = window::bounds(rule.window, now, tz);
    let since = bounds.map(|b| b.start.with_timezone(&tz).fixed_offset());
    if matches!(rule.subject, SubjectKind::Tag | SubjectKind::EndUser) {
        let counted = Counted {
            since,
            ..Counted::default()
        };
        return Ok((counted, Vec::new()));
    }
    let range = bounds.map_or((0, i64::MAX), |b| {
        (b.start.timestamp_millis(), b.end.timestamp_millis())
    });
    let recorded = store
        .recorded_usage(&RecordedUsage {
            workspace_id,
            subject: rule.subject.as_str(),
            target: (rule.target_id != 0).then_some(rule.target_id),
            department: (rule.scope_department_id != 0).then_some(rule.scope_department_id),
            metric: rule.metric.as_str(),
            range,
        })
        .await?;
    let key = |subject_id: i64| CounterKey {
        subject: rule.subject,
        subject_id,
        metric: rule.metric,
        window: rule.window,
        start: bounds.map_or(0, |b| b.start.timestamp()),
    };
    let rows: Vec<(UsageCounterRow, i64)> = recorded
        .into_iter()
        .map(|(id, used)| (key(id).row(), used))
        .collect();
    let created: Vec<(CounterKey, i64)> = store
        .seed_usage_counters(&rows)
        .await?
        .into_iter()
        .map(|(id, used)| (key(id), used))
        .collect();
    let counted = Counted {
        subjects: created.len(),
        used: created.iter().fold(0i64, |sum, (_, u)| sum.saturating_add(*u)),
        since,
    };
    Ok((counted, created))
}

impl Counted {
    /// As the admin API tells it (`counted_before`): the usage in `metric`'s unit for people,
    /// the subjects, the window's start.
    pub fn json(&self, metric: crate::quota::Metric) -> serde_json::Value {
        serde_json::json!({
            "used": super::display_value(metric, self.used),
            "subjects": self.subjects,
            "since": self.since.as_ref().map(window::format_reset_at),
        })
    }
}

impl QuotaCounters {
    /// [`QuotaCounters::count_recorded`] for a policy as stored (nothing for one that does not
    /// parse).
    pub async fn count_recorded_for(
        &self,
        store: &Store,
        row: &crate::store::PolicyRow,
        now: DateTime<Utc>,
        tz: Tz,
    ) -> StoreResult<Counted> {
        match PolicyRule::from_row(row) {
            Some(rule) => self.count_recorded(store, row.workspace_id, &rule, now, tz).await,
            None => Ok(Counted::default()),
        }
    }

    /// [`count_recorded`]; a counter this gateway holds for one of the subjects (it had no row:
    /// it holds only what this gateway has not written yet) starts from the recorded usage at
    /// once. The other gateways learn it at their next flush, or their counter's first check.
    pub async fn count_recorded(
        &self,
        store: &Store,
        workspace_id: i64,
        rule: &PolicyRule,
        now: DateTime<Utc>,
        tz: Tz,
    ) -> StoreResult<Counted> {
        let (counted, created) = count_recorded(store, workspace_id, rule, now, tz).await?;
        let mut map = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        for (key, used) in &created {
            if let Some(c) = map.all.get_mut(key) {
                c.global = c.global.max(*used);
            }
        }
        Ok(counted)
    }
}
