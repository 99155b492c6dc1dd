//! Budget alerts (issue 25 item 1, docs/quotas.md "Budget alerts"): a policy may carry thresholds
//! (percents of its limit) and a webhook. Nothing here runs on the request path:
//!
//! 1. After each quota flush, when the counters hold the global totals of every replica,
//!    [`Alerts::fire`] finds the thresholds a total has reached for a policy that counted into
//!    it and puts one alert per policy, subject, window and threshold in the outbox (the store's
//!    unique key: replicas that see the same crossing fire it once; a new window fires again).
//! 2. [`Alerts::deliver_due`] (a background task, and [`crate::state::AppState::sync`]) takes the
//!    due alerts under a lease, so two gateways never send one at the same time, POSTs each to
//!    its webhook, and on anything but a 2xx tries again with exponential backoff until a day
//!    has passed ([`delivery`]). The outbox is in the database: a receiver that is down, or a
//!    gateway restart, loses no alert.

pub mod delivery;
pub mod destination;
pub mod settings;

use std::collections::HashMap;

use arc_swap::ArcSwap;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde_json::json;

use crate::quota::engine::{Crossing, PolicyRule, QuotaCounters, display_value};
use crate::quota::window::{self, Window, format_reset_at};
use crate::store::{AlertStore, NewAlert, PolicyAlertRow, PolicyStore, Store, StoreResult};

/// Most thresholds one policy may carry.
pub const MAX_THRESHOLDS: usize = 10;
/// The highest threshold, in percent of the limit (an alert on overshoot is allowed).
pub const MAX_PERCENT: u16 = 1000;

/// One policy's alert settings, ready to evaluate and deliver.
#[derive(Clone, Debug)]
pub struct AlertRule {
    /// The policy's workspace.
    pub workspace_id: i64,
    /// The policy.
    pub rule: PolicyRule,
    /// Percents of the limit, ascending, distinct.
    pub thresholds: Vec<u16>,
    /// Where alerts are POSTed.
    pub webhook: String,
    /// The signing secret, sealed under the master key.
    pub secret_sealed: Option<String>,
}

/// Every policy's alert settings, by policy id.
#[derive(Debug, Default)]
pub struct AlertRules {
    by_policy: HashMap<i64, AlertRule>,
}

impl AlertRules {
    /// Loads the alert settings of every policy that has them.
    pub async fn load(store: &Store) -> StoreResult<AlertRules> {
        let alerts = store.all_policy_alerts().await?;
        if alerts.is_empty() {
            return Ok(AlertRules::default());
        }
        let rules: HashMap<i64, PolicyRule> = store
            .all_policies()
            .await?
            .iter()
            .filter_map(|p| PolicyRule::from_row(p).map(|r| (p.id, r)))
            .collect();
        let by_policy = alerts
            .into_iter()
            .filter_map(|a| {
                let rule = rules.get(&a.policy_id)?.clone();
                Some((a.policy_id, AlertRule::of(a, rule)))
            })
            .collect();
        Ok(AlertRules { by_policy })
    }

    /// A policy's alert settings.
    pub fn get(&self, policy_id: i64) -> Option<&AlertRule> {
        self.by_policy.get(&policy_id)
    }
}

impl AlertRule {
    fn of(row: PolicyAlertRow, rule: PolicyRule) -> AlertRule {
        AlertRule {
            workspace_id: row.workspace_id,
            thresholds: row.percents(),
            webhook: row.webhook,
            secret_sealed: row.secret_sealed,
            rule,
        }
    }
}

/// The thresholds (percents of `limit`) that `used` has reached: `used >= limit × percent / 100`,
/// exactly, in the policy's own units (micro-credits for credits). Nothing is reached before
/// anything was used (a limit of 0 refuses everything, and is not "full" of nothing).
pub fn reached(limit: i64, used: i64, thresholds: &[u16]) -> Vec<u16> {
    if used <= 0 {
        return Vec::new();
    }
    thresholds
        .iter()
        .copied()
        .filter(|t| i128::from(used) * 100 >= i128::from(limit) * i128::from(*t))
        .collect()
}

/// The budget alerts of this gateway: the settings snapshot, where webhooks may go, and the
/// delivery task's wake-up.
pub struct Alerts {
    /// Every policy's alert settings, swapped whole when the configuration changes.
    pub rules: ArcSwap<AlertRules>,
    /// Wakes the delivery task when an alert was fired here.
    pub wake: tokio::sync::Notify,
    /// One delivery pass at a time on this gateway.
    delivering: tokio::sync::Mutex<()>,
    /// Where webhooks may be delivered.
    pub destinations: destination::Destinations,
}

impl Alerts {
    /// Alerts with these settings, delivered to `destinations` only.
    pub fn new(rules: AlertRules, destinations: destination::Destinations) -> Alerts {
        Alerts {
            rules: ArcSwap::from_pointee(rules),
            wake: tokio::sync::Notify::new(),
            delivering: tokio::sync::Mutex::new(()),
            destinations,
        }
    }

    /// Puts in the outbox every alert whose threshold a counter's total (as of the flush just
    /// done) has reached and that this gateway has not fired yet; wakes the delivery task when
    /// one is new. A failed write is logged and tried again after the next flush.
    pub async fn fire(
        &self,
        store: &Store,
        quota: &QuotaCounters,
        now: DateTime<Utc>,
        tz_of: impl Fn(i64) -> Tz,
    ) {
        let rules = self.rules.load();
        if rules.by_policy.is_empty() {
            return;
        }
        let crossings = quota.crossings(|policy_id, used| {
            rules
                .get(policy_id)
                .map(|a| reached(a.rule.limit, used, &a.thresholds))
                .unwrap_or_default()
        });
        let mut done = Vec::with_capacity(crossings.len());
        let mut fired = 0;
        let mut missed = Vec::new();
        for c in crossings {
            let Some(a) = rules.get(c.policy_id) else { continue };
            if !missed.is_empty() {
                missed.push(c);
                continue;
            }
            let tz = tz_of(a.workspace_id);
            match self.put(store, a, &c, now, tz).await {
                Ok(new) => {
                    fired += usize::from(new);
                    done.push(c);
                }
                Err(e) => {
                    store.log_failure(&e, "budget alert not written; tried again after the next flush");
                    missed.push(c);
                }
            }
        }
        quota.mark_fired(&done);
        quota.check_again(&missed);
        if fired > 0 {
            metrics::counter!("aigw_budget_alerts_total", "event" => "fired").increment(fired as u64);
            self.wake.notify_one();
        }
    }

    /// Writes one crossing's alert; whether it was new.
    async fn put(
        &self,
        store: &Store,
        a: &AlertRule,
        c: &Crossing,
        now: DateTime<Utc>,
        tz: Tz,
    ) -> StoreResult<bool> {
        let payload = payload(store, a, c, now, tz).await?;
        let now_ms = now.timestamp_millis();
        store
            .insert_alert(&NewAlert {
                workspace_id: a.workspace_id,
                policy_id: c.policy_id,
                subject: c.key.subject.as_str(),
                subject_id: c.key.subject_id,
                time_window: c.key.window.to_string(),
                window_start: c.key.start,
                threshold: i64::from(c.threshold),
                payload: payload.to_string(),
                now: now_ms,
                give_up_at: now_ms.saturating_add(delivery::GIVE_UP_AFTER_MS),
            })
            .await
    }
}

/// The webhook's JSON body (its `id` is added at delivery): the fields of a quota refusal
/// (`subject`, `metric`, `window`, `limit`, `used`, `reset_at`), named alike, and what fired.
async fn payload(
    store: &Store,
    a: &AlertRule,
    c: &Crossing,
    now: DateTime<Utc>,
    tz: Tz,
) -> StoreResult<serde_json::Value> {
    let rule = &a.rule;
    let subject = c.key.subject.as_str();
    let subject_name = store.subject_name(subject, c.key.subject_id).await?;
    let workspace = store.subject_name("ws", a.workspace_id).await?;
    let bounds = DateTime::from_timestamp(c.key.start, 0)
        .filter(|_| rule.window != Window::Total)
        .and_then(|start| window::bounds(rule.window, start, tz));
    let spread_key = format!("{subject}:{}", c.key.subject_id);
    let reset_at = bounds.map(|b| format_reset_at(&window::reset_at(b.end, &spread_key, tz)));
    let percent = if rule.limit > 0 {
        (c.used as f64 * 1000.0 / rule.limit as f64).round() / 10.0
    } else {
        100.0
    };
    let local = |t: DateTime<Utc>| format_reset_at(&t.with_timezone(&tz).fixed_offset());
    Ok(json!({
        "type": "budget.threshold_reached",
        "workspace": workspace,
        "subject": {"kind": subject, "id": c.key.subject_id, "name": subject_name},
        "metric": rule.metric.as_str(),
        "window": rule.window.to_string(),
        "window_start": bounds.map(|b| local(b.start)),
        "limit": display_value(rule.metric, rule.limit),
        "used": display_value(rule.metric, c.used),
        "percent": percent,
        "threshold": c.threshold,
        "reset_at": reset_at,
        "policy": {
            "id": c.policy_id,
            "target": if rule.target_id == 0 { Some("*".to_owned()) } else { subject_name.clone() },
            "mode": rule.mode.as_str(),
        },
        "fired_at": local(now),
    }))
}

#[cfg(test)]
mod tests {
    use super::reached;
    use super::settings::{Thresholds, Webhook};

    #[test]
    fn alert_settings_follow_their_rules() {
        // (thresholds, stored or the start of the message)
        type Case<'a> = (&'a [i64], Result<&'a [u16], &'a str>);
        let lists: &[Case] = &[
            (&[100, 80, 80], Ok(&[80, 100])),
            (&[1, 1000], Ok(&[1, 1000])),
            (&[], Err("at must list 1 to 10")),
            (&[0], Err("at: each threshold")),
            (&[1001], Err("at: each threshold")),
            (&[-80], Err("at: each threshold")),
            (&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], Err("at must list 1 to 10")),
        ];
        for (list, want) in lists {
            match (Thresholds::parse("at", list), want) {
                (Ok(got), Ok(w)) => assert_eq!(got.percents(), *w, "{list:?}"),
                (Err(got), Err(w)) => assert!(got.starts_with(w), "{list:?}: {got}"),
                (got, w) => panic!("{list:?}: got {got:?}, want {w:?}"),
            }
        }
        // (webhook, accepted)
        let urls = [
            ("https://hooks.example/aigw?x=1", true),
            (" http://10.0.0.7:8080/hook ", true),
            ("ftp://hooks.example/x", false),
            ("https://", false),
            ("hooks.example/aigw", false),
            ("https://user:pw@hooks.example/x", false),
            ("https://hooks.example/a b", false),
            ("javascript:alert(1)", false),
        ];
        for (url, ok) in urls {
            assert_eq!(Webhook::parse("webhook", url).is_ok(), ok, "{url}");
        }
    }

    #[test]
    fn thresholds_are_reached_at_exactly_their_share() {
        // (limit, used, thresholds, reached)
        let cases: &[(i64, i64, &[u16], &[u16])] = &[
            (100, 79, &[80, 100], &[]),
            (100, 80, &[80, 100], &[80]),
            (100, 100, &[80, 100], &[80, 100]),
            (100, 250, &[80, 100, 200], &[80, 100, 200]),
            (3, 2, &[66, 67], &[66]),
            (0, 0, &[80], &[]),
            (0, 1, &[80, 1000], &[80, 1000]),
            (i64::MAX, i64::MAX, &[100, 1000], &[100]),
            (1_000_000, 800_000, &[80], &[80]),
            (10, -5, &[1], &[]),
        ];
        for (limit, used, thresholds, want) in cases {
            assert_eq!(
                reached(*limit, *used, thresholds),
                *want,
                "{limit} {used} {thresholds:?}"
            );
        }
    }
}
