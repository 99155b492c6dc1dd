//! The quotas of a decision as people read them: the "My quota" card of the client
//! (`GET /v1/quota`) and of the console (`GET /admin/v1/me/quota`).

use serde_json::{Value, json};

use super::Metric;
use super::engine::{QuotaDecision, display_value};
use super::policy::Labels;
use super::window::format_reset_at;

/// The quotas of a decision as JSON rows: limit, used, remaining, reset. A row of a tag or an
/// end user names its subject as a quota refusal does (`"tag": "team=search"`,
/// `"end_user": "alice"`), from the `labels` the decision was made for. `metric_name` names the
/// metric: [`Metric::client_name`] for clients (`tokens`, as the headers say), [`Metric::as_str`]
/// for the console, which speaks the policies' names.
pub fn rows(
    decision: &QuotaDecision,
    labels: &Labels,
    metric_name: fn(Metric) -> &'static str,
) -> Vec<Value> {
    decision
        .standings
        .iter()
        .map(|s| {
            let m = s.rule.metric;
            let mut row = json!({
                "subject": s.rule.subject.as_str(),
                "metric": metric_name(m),
                "window": s.rule.window.to_string(),
                "mode": s.rule.mode.as_str(),
                "limit": display_value(m, s.rule.limit),
                "used": display_value(m, s.used),
                "remaining": display_value(m, s.remaining(0)),
                "reset_at": s.reset_at.as_ref().map(format_reset_at),
            });
            if let Some(name) = labels.name_of(s.rule.subject, s.key.subject_id) {
                row[s.rule.subject.as_str()] = json!(name);
            }
            row
        })
        .collect()
}
