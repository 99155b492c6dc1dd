//! Budget alerts through the admin API: a policy's `alerts` field (thresholds, webhook, a
//! write-only signing secret), the alert history, and sending an alert again.
//!
//! Only an owner or admin sets alerts: a webhook makes the gateway send requests where it says,
//! which is not a member's to choose. A member reading a budget on their key sees the webhook's
//! origin only (its path may hold the receiver's own secret).

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use super::session::Actor;
use super::{AdminResult, Id, Params, audit, checked, double_option, rfc3339, store_error};
use crate::alerts::delivery::GIVE_UP_AFTER_MS;
use crate::alerts::settings::{Thresholds, Webhook};
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{AlertEventRow, AlertStore, PolicyAlertRow};

/// A policy's `alerts` as written to the API.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsInput {
    /// Percents of the limit.
    at: Vec<i64>,
    /// Where to POST.
    webhook: String,
    /// Absent: keep the current secret; null: none (unsigned); a string: sign with it.
    #[serde(default, with = "double_option")]
    secret: Option<Option<String>>,
}

/// The sealed secret of policy `policy_id`'s alerts as stored.
pub async fn current_secret(
    state: &AppState,
    workspace_id: i64,
    policy_id: i64,
) -> AdminResult<Option<String>> {
    let rows = state
        .store
        .policy_alerts_in(workspace_id)
        .await
        .map_err(store_error)?;
    Ok(rows
        .into_iter()
        .find(|r| r.policy_id == policy_id)
        .and_then(|r| r.secret_sealed))
}

/// Refuses alerts from a member (see the module comment).
pub fn may_set(actor: &Actor) -> AdminResult<()> {
    if actor.manages() {
        Ok(())
    } else {
        Err(ApiError::Forbidden {
            message: "budget alerts (their webhook) are set by an owner or admin".into(),
        })
    }
}

/// The stored settings of `input` for policy `policy_id`, keeping the secret the policy has
/// (`current`, sealed) when the input does not mention one.
pub fn settings(
    state: &AppState,
    workspace_id: i64,
    policy_id: i64,
    input: &AlertsInput,
    current: Option<String>,
) -> AdminResult<PolicyAlertRow> {
    let thresholds = checked("alerts.at", Thresholds::parse("alerts.at", &input.at))?;
    let webhook = checked("alerts.webhook", Webhook::parse("alerts.webhook", &input.webhook))?;
    destination_allowed(state, webhook.as_str())?;
    let secret_sealed = match &input.secret {
        None => current,
        Some(None) => None,
        Some(Some(secret)) => {
            checked(
                "alerts.secret",
                crate::alerts::settings::secret("alerts.secret", secret),
            )?;
            Some(state.master_key.seal(secret))
        }
    };
    Ok(PolicyAlertRow {
        policy_id,
        workspace_id,
        thresholds: thresholds.stored(),
        webhook: webhook.into_string(),
        secret_sealed,
        updated_at: state.clock.now_ms(),
    })
}

/// Refuses a webhook whose address (as the URL spells it) is on this machine, a private network
/// or another reserved range, unless allowed (`crate::alerts::destination`); a name is checked
/// when it is resolved, before each delivery.
fn destination_allowed(state: &AppState, webhook: &str) -> AdminResult<()> {
    use crate::alerts::destination::Refused;
    let Ok(url) = reqwest::Url::parse(webhook) else {
        return Ok(());
    };
    let why = match state.alerts.destinations.check_url(&url) {
        Ok(()) => return Ok(()),
        Err(Refused::Reserved(ip, range)) => format!(
            "alerts.webhook points at {ip}, {range}: loopback, link-local, private and other \
             reserved addresses are refused unless the setting alert_webhook_allow lists the \
             host or range"
        ),
        Err(Refused::OwnListener(l)) => format!(
            "alerts.webhook points at this gateway's own listener {l}, which no \
             alert_webhook_allow opens"
        ),
    };
    Err(ApiError::field("alerts.webhook", why))
}

/// A policy's `alerts` as the API shows it (the secret never: only whether there is one).
pub fn json_of(state: &AppState, policy_id: i64) -> Value {
    match state.alerts.rules.load().get(policy_id) {
        Some(a) => json!({
            "at": a.thresholds,
            "webhook": a.webhook,
            "has_secret": a.secret_sealed.is_some(),
        }),
        None => Value::Null,
    }
}

/// Shows only the webhook's origin to someone who may not manage alerts.
pub fn redact(actor: &Actor, policy: &mut Value) {
    if actor.manages() {
        return;
    }
    if let Some(url) = policy["alerts"]["webhook"].as_str() {
        let origin = reqwest::Url::parse(url)
            .map(|u| u.origin().ascii_serialization())
            .unwrap_or_default();
        policy["alerts"]["webhook"] = json!(format!("{origin}/…"));
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsQuery {
    #[serde(default)]
    cursor: Option<i64>,
    #[serde(default)]
    limit: Option<i64>,
    /// One policy's alerts only.
    #[serde(default)]
    policy_id: Option<i64>,
}

/// One alert as the history lists it: the body its webhook got and how its delivery went.
fn alert_json(a: &AlertEventRow) -> Value {
    let sent: Value = serde_json::from_str(&a.payload).unwrap_or(Value::Null);
    json!({
        "id": a.id,
        "policy_id": a.policy_id,
        "subject": sent["subject"],
        "metric": sent["metric"],
        "window": sent["window"],
        "window_start": sent["window_start"],
        "threshold": a.threshold,
        "limit": sent["limit"],
        "used": sent["used"],
        "percent": sent["percent"],
        "reset_at": sent["reset_at"],
        "fired_at": rfc3339(a.created_at),
        "status": a.status,
        "attempts": a.attempts,
        "last_status": a.last_status,
        "last_error": a.last_error,
        "next_attempt_at": (a.status == "pending").then(|| rfc3339(a.next_attempt_at)).flatten(),
        "delivered_at": a.delivered_at.and_then(rfc3339),
    })
}

/// `GET /admin/v1/alerts`: the workspace's budget alerts, newest first, `?cursor=` the last id
/// of the previous page, `?policy_id=` one policy's.
pub async fn list(
    State(state): State<AppState>,
    actor: Actor,
    Params(q): Params<AlertsQuery>,
) -> AdminResult {
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::field("limit", "limit must be between 1 and 1000"));
    }
    let rows = state
        .store
        .alert_page(
            actor.workspace_id(),
            q.policy_id.filter(|p| *p > 0),
            q.cursor.filter(|c| *c > 0),
            limit + 1,
        )
        .await
        .map_err(store_error)?;
    let (rows, next_cursor) = super::page_of(rows, limit, |a| a.id);
    let data: Vec<Value> = rows.iter().map(alert_json).collect();
    Ok(Json(json!({ "data": data, "next_cursor": next_cursor })).into_response())
}

/// `POST /admin/v1/alerts/{id}/retry`: an alert not yet delivered (given up, or waiting for its
/// next try) is sent now, and tried again for another day if that fails.
pub async fn retry(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    let ws = actor.workspace_id();
    let before = state
        .store
        .alert_in(ws, id)
        .await
        .map_err(store_error)?
        .ok_or(ApiError::NotFound { what: "alert" })?;
    if before.status == "delivered" {
        return Err(ApiError::Conflict {
            message: "this alert was delivered already".into(),
        });
    }
    let now = state.clock.now_ms();
    state
        .store
        .requeue_alert(id, now, now.saturating_add(GIVE_UP_AFTER_MS))
        .await
        .map_err(store_error)?;
    state.alerts.wake.notify_one();
    let after = state
        .store
        .alert_in(ws, id)
        .await
        .map_err(store_error)?
        .ok_or(ApiError::NotFound { what: "alert" })?;
    let body = alert_json(&after);
    audit(
        &state,
        &actor,
        "retry",
        "alert",
        id,
        Some(alert_json(&before)),
        Some(body.clone()),
    )
    .await;
    Ok(Json(body).into_response())
}
