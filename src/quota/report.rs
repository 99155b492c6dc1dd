//! The quotas of a decision as people read them: the "My quota" card of the client
//! (`GET /v1/quota`) and of the console (`GET /admin/v1/me/quota`).

use serde_json::{Value, json};

use super::engine::{QuotaDecision, display_value};
use super::window::format_reset_at;

/// The quotas of a decision as JSON rows: limit, used, remaining, reset.
pub fn rows(decision: &QuotaDecision) -> Vec<Value> {
    decision
        .standings
        .iter()
        .map(|s| {
            let m = s.rule.metric;
            json!({
                "subject": s.rule.subject.as_str(),
                "metric": m.as_str(),
                "window": s.rule.window.to_string(),
                "mode": s.rule.mode.as_str(),
                "limit": display_value(m, s.rule.limit),
                "used": display_value(m, s.used),
                "remaining": display_value(m, s.remaining(0)),
                "reset_at": s.reset_at.as_ref().map(format_reset_at),
            })
        })
        .collect()
}
