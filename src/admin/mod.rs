//! The admin API under `/admin/v1/` (DESIGN.md §7, §8): JWT sign-in and what a signed-in member
//! reads about themself. Every route requires a valid token unless it is the sign-in itself.

pub mod session;

use std::net::SocketAddr;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;

use crate::app::AppState;
use crate::breaker;
use crate::crypto;
use crate::error::ApiError;
use crate::proxy::auth::Caller;
use crate::quota::engine::QuotaDecision;
use crate::store::{KeyStore, MemberStore, Role, UpstreamRow, UpstreamStore, WorkspaceStore};
use session::Session;

/// The admin routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin/v1/auth/login", post(login))
        .route("/admin/v1/me", get(me))
        .route("/admin/v1/me/quota", get(my_quota))
        .route("/admin/v1/keys/{id}/breaker", get(key_breaker))
        .route("/admin/v1/upstreams/{id}", get(upstream_detail))
        .route("/admin/v1/upstreams/{id}/test", post(upstream_test))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginRequest {
    email: String,
    password: String,
}

/// `POST /admin/v1/auth/login` `{email, password}` → `{token, expires_at}`.
async fn login(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    body: Bytes,
) -> Response {
    let req: LoginRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return ApiError::invalid(format!("expected {{\"email\", \"password\"}}: {e}"), None)
                .into_response();
        }
    };
    if let Err(retry_after) = state.sessions.may_try(peer.ip(), &req.email) {
        return ApiError::AuthThrottled { retry_after }.into_response();
    }
    let member = match state.store.member_by_email(&req.email).await {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(error = %e, "sign-in lookup failed");
            return ApiError::Internal.into_response();
        }
    };
    // Verify against a dummy hash when the member is unknown, so timing tells nothing.
    let hash = member.as_ref().and_then(|m| m.password_hash.clone());
    let ok = crypto::verify_password(
        &req.password,
        hash.as_deref().unwrap_or(session::DUMMY_HASH.as_str()),
    );
    match member {
        Some(m) if ok && hash.is_some() && m.active == 1 => {
            let (token, expires_at) = state.sessions.issue(&m, state.clock.now());
            axum::Json(json!({"token": token, "expires_at": expires_at.to_rfc3339(), "role": m.role}))
                .into_response()
        }
        _ => {
            state.sessions.failed(peer.ip(), &req.email);
            ApiError::InvalidCredentials.into_response()
        }
    }
}

/// `GET /admin/v1/me`: who is signed in.
async fn me(State(state): State<AppState>, session: Session) -> Response {
    let member = match state.store.member(session.member_id).await {
        Ok(Some(m)) => m,
        Ok(None) => return ApiError::InvalidToken.into_response(),
        Err(_) => return ApiError::Internal.into_response(),
    };
    let workspace = state.store.workspace(member.workspace_id).await.ok().flatten();
    axum::Json(json!({
        "id": member.id,
        "email": member.email,
        "role": member.role,
        "workspace": workspace.map(|w| json!({"id": w.id, "name": w.name, "timezone": w.timezone})),
        "department_id": member.department_id,
    }))
    .into_response()
}

/// `GET /admin/v1/me/quota`: every quota that applies to the signed-in member — their member,
/// department and workspace policies, and the budgets on each of their keys.
async fn my_quota(State(state): State<AppState>, session: Session) -> Response {
    let member = match state.store.member(session.member_id).await {
        Ok(Some(m)) => m,
        Ok(None) => return ApiError::InvalidToken.into_response(),
        Err(_) => return ApiError::Internal.into_response(),
    };
    let keys = match state.store.keys_of_member(member.id).await {
        Ok(k) => k,
        Err(_) => return ApiError::Internal.into_response(),
    };
    let tz = state.timezone_of(member.workspace_id);
    let policies = state.policies.load();
    let now = state.clock.now();
    let caller = |key_id: i64, key_name: &str| Caller {
        key_id,
        key_name: key_name.to_owned(),
        member_id: member.id,
        department_id: member.department_id,
        workspace_id: member.workspace_id,
    };
    // Member, department and workspace quotas (no key: key id 0 matches no key policy).
    let mut rows = Vec::new();
    match state
        .quota
        .check(&state.store, &policies, &caller(0, ""), now, tz)
        .await
    {
        Ok(d) => rows.extend(rows_of(&d, None)),
        Err(_) => return ApiError::Internal.into_response(),
    }
    for k in &keys {
        match state
            .quota
            .check(&state.store, &policies, &caller(k.id, &k.name), now, tz)
            .await
        {
            Ok(mut d) => {
                d.standings
                    .retain(|s| s.rule.subject == crate::quota::SubjectKind::Apikey);
                rows.extend(rows_of(&d, Some((k.id, &k.name))));
            }
            Err(_) => return ApiError::Internal.into_response(),
        }
    }
    axum::Json(json!({"timezone": tz.name(), "quotas": rows})).into_response()
}

fn rows_of(d: &QuotaDecision, key: Option<(i64, &str)>) -> Vec<serde_json::Value> {
    crate::proxy::quota_report(d)
        .into_iter()
        .map(|mut row| {
            if let Some((id, name)) = key {
                row["key_id"] = json!(id);
                row["key_name"] = json!(name);
            }
            row
        })
        .collect()
}

/// `GET /admin/v1/keys/{id}/breaker`: the key's breaker — trips so far, blocked until, banned —
/// and the history of its trips. Owners and admins see every key of their workspace, members
/// their own; any other key answers 404 (no existence leak). A ban cannot be lifted here or
/// anywhere: delete the key and create a new one.
async fn key_breaker(
    State(state): State<AppState>,
    session: Session,
    axum::extract::Path(id): axum::extract::Path<i64>,
) -> Response {
    let (member, key) = match (
        state.store.member(session.member_id).await,
        state.store.key(id).await,
    ) {
        (Ok(Some(m)), Ok(k)) => (m, k),
        (Ok(None), _) => return ApiError::InvalidToken.into_response(),
        _ => return ApiError::Internal.into_response(),
    };
    let visible = key.as_ref().is_some_and(|k| {
        k.workspace_id == member.workspace_id
            && (k.member_id == member.id || matches!(member.role(), Role::Owner | Role::Admin))
    });
    let Some(key) = key.filter(|_| visible) else {
        return ApiError::NotFound { what: "API key" }.into_response();
    };
    let row: Result<Option<(i64, Option<i64>, i64)>, _> =
        sqlx::query_as("SELECT trips, blocked_until, banned FROM breaker_state WHERE key_id = $1")
            .bind(key.id)
            .fetch_optional(state.store.pool())
            .await;
    let (Ok(row), Ok(history)) = (row, breaker::history(&state.store, key.id).await) else {
        return ApiError::Internal.into_response();
    };
    let (trips, blocked_until, banned) = row.unwrap_or((0, None, 0));
    let now = state.clock.now().timestamp_millis();
    let ms = |v: i64| chrono::DateTime::from_timestamp_millis(v).map(|t| t.to_rfc3339());
    axum::Json(json!({
        "key_id": key.id,
        "trips": trips,
        "banned": banned == 1,
        "blocked_until": blocked_until.filter(|u| *u > now).and_then(ms),
        "history": history.iter().map(|t| json!({
            "trip": t.trip,
            "at": ms(t.at),
            "requests": t.requests,
            "failures": t.failures,
            "blocked_until": t.blocked_until.and_then(ms),
            "banned": t.banned,
        })).collect::<Vec<_>>(),
    }))
    .into_response()
}

/// The credential `id` if the signed-in member may manage it (owner or admin of its workspace).
async fn managed_upstream(state: &AppState, session: &Session, id: i64) -> Result<UpstreamRow, ApiError> {
    let member = state
        .store
        .member(session.member_id)
        .await
        .map_err(|_| ApiError::Internal)?;
    let member = member.ok_or(ApiError::InvalidToken)?;
    let up = state.store.upstream(id).await.map_err(|_| ApiError::Internal)?;
    up.filter(|u| u.workspace_id == member.workspace_id && matches!(member.role(), Role::Owner | Role::Admin))
        .ok_or(ApiError::NotFound { what: "upstream" })
}

/// `GET /admin/v1/upstreams/{id}`: the credential (its secret is never returned) with its running
/// locks — what is parked, by which rule, until when, time left — and `resumes_at`, the end of the
/// latest running lock (the countdown, as kRouter shows it).
async fn upstream_detail(
    State(state): State<AppState>,
    session: Session,
    axum::extract::Path(id): axum::extract::Path<i64>,
) -> Response {
    let up = match managed_upstream(&state, &session, id).await {
        Ok(u) => u,
        Err(e) => return e.into_response(),
    };
    let now = state.clock.now().timestamp_millis();
    let ms = |v: i64| chrono::DateTime::from_timestamp_millis(v).map(|t| t.to_rfc3339());
    let mut locks = state.locks.of(up.id, now);
    locks.sort_by_key(|(_, until, _)| *until);
    let resumes_at = locks.last().map(|(_, until, _)| *until);
    axum::Json(json!({
        "id": up.id,
        "name": up.name,
        "provider": up.provider,
        "base_url": up.base_url,
        "models": up.served_models(),
        "priority": up.priority,
        "weight": up.weight,
        "max_in_flight": up.max_in_flight,
        "limits": {
            "requests_per_minute": up.requests_per_minute,
            "tokens_per_minute": up.tokens_per_minute,
            "requests_per_day": up.requests_per_day,
        },
        "quota_group": up.quota_group,
        "enabled": up.enabled == 1,
        "banned": state.locks.is_banned(up.id),
        "backoff_level": state.locks.backoff_level(up.id),
        "locks": locks.iter().map(|(target, until, rule)| json!({
            "target": target,
            "rule": rule,
            "until": ms(*until),
            "seconds_left": (until - now + 999).div_euclid(1000),
        })).collect::<Vec<_>>(),
        "resumes_at": resumes_at.and_then(ms),
    }))
    .into_response()
}

/// `POST /admin/v1/upstreams/{id}/test`: sends a minimal real request (one token) with the
/// credential; a success clears every lock, the backoff and the banned mark, on every gateway.
async fn upstream_test(
    State(state): State<AppState>,
    session: Session,
    axum::extract::Path(id): axum::extract::Path<i64>,
) -> Response {
    let up = match managed_upstream(&state, &session, id).await {
        Ok(u) => u,
        Err(e) => return e.into_response(),
    };
    let Ok(secret) = state.master_key.open(&up.secret_sealed) else {
        return ApiError::invalid(
            "this upstream's secret cannot be decrypted with the current master key",
            None,
        )
        .into_response();
    };
    let Some(model) = up.served_models().into_iter().next() else {
        return ApiError::invalid("this upstream serves no model to test with", None).into_response();
    };
    let anthropic = up.provider == "anthropic";
    let base = up.base_url.trim_end_matches('/');
    let body =
        json!({"model": model.upstream, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]});
    let req = if anthropic {
        state
            .http
            .post(format!("{base}/messages"))
            .header("x-api-key", secret)
            .header("anthropic-version", "2023-06-01")
    } else {
        state
            .http
            .post(format!("{base}/chat/completions"))
            .bearer_auth(secret)
    };
    let started = std::time::Instant::now();
    let result = tokio::time::timeout(std::time::Duration::from_secs(30), req.json(&body).send()).await;
    let latency_ms = started.elapsed().as_millis() as u64;
    match result {
        Ok(Ok(r)) if r.status().is_success() => {
            state.locks.clear(up.id);
            if let Err(e) = crate::upstream::locks::clear(&state.store, up.id).await {
                tracing::error!(error = %e, "could not clear the upstream's locks in the store");
                return ApiError::Internal.into_response();
            }
            axum::Json(
                json!({"ok": true, "status": r.status().as_u16(), "latency_ms": latency_ms, "cleared": true}),
            )
            .into_response()
        }
        Ok(Ok(r)) => {
            let status = r.status().as_u16();
            let text = r.text().await.unwrap_or_default();
            let excerpt: String = text.chars().take(500).collect();
            axum::Json(json!({"ok": false, "status": status, "latency_ms": latency_ms, "error": excerpt}))
                .into_response()
        }
        Ok(Err(e)) => axum::Json(json!({"ok": false, "status": null, "latency_ms": latency_ms,
            "error": format!("request failed: {}", e.without_url())}))
        .into_response(),
        Err(_) => axum::Json(
            json!({"ok": false, "status": null, "latency_ms": latency_ms, "error": "timed out after 30 s"}),
        )
        .into_response(),
    }
}
