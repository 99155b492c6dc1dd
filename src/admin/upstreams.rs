//! Upstream credentials (DESIGN.md §3, §6): the secret is write-only (sealed at rest, never
//! returned, never logged); each credential shows its running locks and counts down to the end
//! of the latest one; a connection test that succeeds clears every lock and the banned mark.

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use super::session::Actor;
use super::{
    AdminResult, Body, Id, Page, Params, audit, checked, config_changed, created, double_option, name_field,
    no_content, page_of, rfc3339, store_error,
};
use crate::error::ApiError;
use crate::kernel::managed::Kind;
use crate::provider::Credential;
use crate::provider::Provider;
use crate::provider::adapter::{self, Endpoint};
use crate::state::AppState;
use crate::store::{
    AdminStore, CredentialFigureStore, ParkEvent, ServedModel, Table, UpstreamRow, UpstreamStore,
};
use crate::upstream::dispatch;
use crate::upstream::fields;

/// The credential as the API shows it: everything but the secret, with its locks and, from the
/// recorded locks `events` (the credential's, of the last day), the provider's words that set
/// each running lock and, when banned, the ban.
fn upstream_json(state: &AppState, up: &UpstreamRow, events: &[ParkEvent]) -> Value {
    let now = state.clock.now_ms();
    let mut locks = state.locks.of(up.id, now);
    locks.sort_by_key(|(_, until, _)| *until);
    let resumes_at = locks.last().map(|(_, until, _)| *until);
    let mine = || events.iter().filter(|e| e.credential_id == up.id);
    // The latest record of the same target still running (events come oldest first).
    let words = |target: &str| {
        mine()
            .rfind(|e| e.target == target && e.until_ms > now)
            .and_then(|e| e.message.clone())
    };
    let banned = state.locks.is_banned(up.id);
    let ban_words = banned
        .then(|| mine().next_back().and_then(|e| e.message.clone()))
        .flatten();
    json!({
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
        "banned": banned,
        "banned_message": ban_words,
        "managed_by": state.managed.by(Kind::Upstream, up.id),
        "backoff_level": state.locks.backoff_level(up.id),
        "locks": locks.iter().map(|(target, until, rule)| json!({
            "target": target,
            "rule": rule,
            "until": rfc3339(*until),
            "seconds_left": (until - now + 999).div_euclid(1000),
            "message": words(target),
        })).collect::<Vec<_>>(),
        "resumes_at": resumes_at.and_then(rfc3339),
        "created_at": up.created_at,
        "updated_at": up.updated_at,
        "aws": super::upstream_keys::view(state, up),
    })
}

async fn upstream_in(state: &AppState, actor: &Actor, id: i64) -> AdminResult<UpstreamRow> {
    state
        .store
        .row_in(Table::Upstreams, actor.workspace_id(), id)
        .await
        .map_err(store_error)?
        .ok_or(ApiError::NotFound { what: "upstream" })
}

/// `GET /admin/v1/upstreams`.
pub async fn list(State(state): State<AppState>, actor: Actor, Params(page): Params<Page>) -> AdminResult {
    let (after, limit) = page.bounds()?;
    let rows: Vec<UpstreamRow> = state
        .store
        .page_in(Table::Upstreams, actor.workspace_id(), after, limit + 1)
        .await
        .map_err(store_error)?;
    let (rows, next_cursor) = page_of(rows, limit, |u| u.id);
    let ids: Vec<i64> = rows.iter().map(|u| u.id).collect();
    let events = recent_parks(&state, &ids).await?;
    let data: Vec<Value> = rows.iter().map(|u| upstream_json(&state, u, &events)).collect();
    Ok(Json(json!({ "data": data, "next_cursor": next_cursor })).into_response())
}

/// `GET /admin/v1/upstreams/{id}`: the credential with its running locks — what is parked, by
/// which rule, until when, time left — and `resumes_at`, the end of the latest running lock (the
/// countdown, as kRouter shows it).
pub async fn get(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    let up = upstream_in(&state, &actor, id).await?;
    let events = recent_parks(&state, &[up.id]).await?;
    Ok(Json(upstream_json(&state, &up, &events)).into_response())
}

/// The locks recorded on `credentials` that ended within the last day or still run.
pub(super) async fn recent_parks(state: &AppState, credentials: &[i64]) -> AdminResult<Vec<ParkEvent>> {
    let since = state.clock.now_ms().saturating_sub(crate::store::DAY_MS);
    state
        .store
        .park_events(credentials, since)
        .await
        .map_err(store_error)
}

/// Ends the recorded locks a clear ended (so the time parked stops there); a failure is logged:
/// the clear itself has happened.
async fn end_parks(state: &AppState, credential: i64, models_only: bool) {
    if let Err(e) = state
        .store
        .end_parks(credential, state.clock.now_ms(), models_only)
        .await
    {
        tracing::warn!(error = %e, credential, "could not end the recorded locks of a credential");
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum ModelInput {
    Same(String),
    Mapped {
        name: String,
        #[serde(default)]
        upstream: Option<String>,
    },
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LimitsInput {
    #[serde(default)]
    requests_per_minute: Option<i64>,
    #[serde(default)]
    tokens_per_minute: Option<i64>,
    #[serde(default)]
    requests_per_day: Option<i64>,
}

/// A credential to create (name, provider and api_key required) or the fields to change.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamInput {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    base_url: Option<String>,
    /// Azure's `api-version`, kept as the base URL's `?api-version=` (`provider/azure.rs`).
    #[serde(default)]
    api_version: Option<String>,
    /// Write-only.
    #[serde(default)]
    api_key: Option<String>,
    /// `bedrock`: the AWS region (`upstream_keys.rs`).
    #[serde(default)]
    region: Option<String>,
    /// `bedrock`: the access key id.
    #[serde(default)]
    access_key_id: Option<String>,
    /// `bedrock`: write-only.
    #[serde(default)]
    secret_access_key: Option<String>,
    /// `bedrock`: write-only; `null` removes it.
    #[serde(default, with = "double_option")]
    session_token: Option<Option<String>>,
    #[serde(default)]
    models: Option<Vec<ModelInput>>,
    #[serde(default)]
    priority: Option<i64>,
    #[serde(default)]
    weight: Option<i64>,
    #[serde(default)]
    max_in_flight: Option<i64>,
    #[serde(default)]
    limits: Option<LimitsInput>,
    #[serde(default, with = "double_option")]
    quota_group: Option<Option<String>>,
    #[serde(default)]
    enabled: Option<bool>,
}

/// Applies `input` over `row` (a new row for create), checking every field; returns whether the
/// secret changed.
fn apply(state: &AppState, row: &mut UpstreamRow, input: UpstreamInput, creating: bool) -> AdminResult<bool> {
    if let Some(n) = &input.name {
        row.name = name_field("name", n)?;
    } else if creating {
        return Err(ApiError::field("name", "name is required"));
    }
    let provider: Provider = match (&input.provider, creating) {
        (Some(p), _) => p.parse().map_err(|m: String| ApiError::field("provider", m))?,
        (None, true) => return Err(ApiError::field("provider", "provider is required")),
        (None, false) => row
            .provider
            .parse()
            .map_err(|m: String| ApiError::field("provider", m))?,
    };
    row.provider = provider.as_str().to_owned();
    match (&input.base_url, provider.default_base_url()) {
        (Some(b), _) => row.base_url = checked("base_url", fields::base_url(b))?,
        (None, Some(d)) if creating || input.provider.is_some() => row.base_url = d.to_owned(),
        (None, None) if creating && provider == Provider::Bedrock => {}
        (None, None) if creating => {
            return Err(ApiError::field(
                "base_url",
                format!("base_url is required for provider {:?}", provider.as_str()),
            ));
        }
        _ => {}
    }
    let aws = super::upstream_keys::AwsFields {
        region: input.region.as_deref(),
        access_key_id: input.access_key_id.as_deref(),
        secret_access_key: input.secret_access_key.as_deref(),
        session_token: input.session_token.as_ref().map(Option::as_deref),
    };
    let aws_secret_changed = super::upstream_keys::apply(
        state,
        row,
        &aws,
        input.api_key.is_some(),
        input.base_url.is_some(),
        creating,
    )?;
    checked("base_url", fields::base_url(&row.base_url))?;
    if let Some(v) = &input.api_version {
        if provider != Provider::Azure {
            return Err(ApiError::field(
                "api_version",
                "api_version is only for provider \"azure\"",
            ));
        }
        // A change of the version alone replaces the stored one; with a base_url, both are
        // the caller's and must agree.
        let base = if input.base_url.is_some() {
            row.base_url.clone()
        } else {
            crate::provider::azure::without_api_version(&row.base_url)
        };
        row.base_url = checked(
            "api_version",
            crate::provider::azure::with_api_version(&base, Some(v)),
        )?;
    }
    let mut secret_changed = aws_secret_changed.unwrap_or(false);
    match &input.api_key {
        _ if aws_secret_changed.is_some() => {}
        Some(k) => {
            checked("api_key", fields::upstream_secret(k))?;
            let same =
                !creating && state.master_key.open(&row.secret_sealed).ok().as_deref() == Some(k.as_str());
            if !same {
                row.secret_sealed = state.master_key.seal(k);
                secret_changed = !creating;
            }
        }
        None if creating => return Err(ApiError::field("api_key", "api_key is required")),
        None => {}
    }
    if let Some(models) = input.models {
        let pairs = models.iter().map(|m| match m {
            ModelInput::Same(n) => (n.as_str(), n.as_str()),
            ModelInput::Mapped { name, upstream } => (name.as_str(), upstream.as_deref().unwrap_or(name)),
        });
        let served: Vec<ServedModel> = checked("models", fields::served_models(pairs))?
            .into_iter()
            .map(|(name, upstream)| ServedModel { name, upstream })
            .collect();
        row.models = serde_json::to_string(&served).map_err(|_| ApiError::Internal)?;
    }
    for (field, value, min, target) in [
        ("priority", input.priority, 0, &mut row.priority),
        ("weight", input.weight, 1, &mut row.weight),
        ("max_in_flight", input.max_in_flight, 1, &mut row.max_in_flight),
    ] {
        if let Some(v) = value {
            *target = checked(field, fields::upstream_number(field, v, min))?;
        }
    }
    if let Some(l) = input.limits {
        for (field, v) in [
            ("limits.requests_per_minute", l.requests_per_minute),
            ("limits.tokens_per_minute", l.tokens_per_minute),
            ("limits.requests_per_day", l.requests_per_day),
        ] {
            checked(field, fields::upstream_limit(field, v))?;
        }
        row.requests_per_minute = l.requests_per_minute;
        row.tokens_per_minute = l.tokens_per_minute;
        row.requests_per_day = l.requests_per_day;
    }
    if let Some(g) = input.quota_group {
        row.quota_group = match g {
            Some(g) if !g.trim().is_empty() => Some(name_field("quota_group", &g)?),
            _ => None,
        };
    }
    if let Some(e) = input.enabled {
        row.enabled = i64::from(e);
    }
    Ok(secret_changed)
}

/// `POST /admin/v1/upstreams`.
pub async fn create(
    State(state): State<AppState>,
    actor: Actor,
    Body(input): Body<UpstreamInput>,
) -> AdminResult {
    let now = state.clock.now_ms();
    let mut row = UpstreamRow {
        id: 0,
        workspace_id: actor.workspace_id(),
        name: String::new(),
        provider: String::new(),
        base_url: String::new(),
        secret_sealed: String::new(),
        models: "[]".into(),
        priority: 0,
        weight: 1,
        max_in_flight: 64,
        requests_per_minute: None,
        tokens_per_minute: None,
        requests_per_day: None,
        quota_group: None,
        enabled: 1,
        created_at: now,
        updated_at: now,
    };
    apply(&state, &mut row, input, true)?;
    row.id = state.store.save_upstream(&row).await.map_err(store_error)?;
    config_changed(&state).await?;
    let body = upstream_json(&state, &row, &[]);
    audit(
        &state,
        &actor,
        "create",
        "upstream",
        row.id,
        None,
        Some(body.clone()),
    )
    .await;
    Ok(created(body))
}

/// `PATCH /admin/v1/upstreams/{id}`: a new `api_key` clears the per-model locks and the backoff,
/// not the account holds (kRouter): here in the store, and in memory on every gateway when its
/// configuration reload sees the secret changed (`Routes::secrets_replaced_since`).
pub async fn update(
    State(state): State<AppState>,
    actor: Actor,
    Id(id): Id,
    Body(input): Body<UpstreamInput>,
) -> AdminResult {
    let before = upstream_in(&state, &actor, id).await?;
    let mut row = before.clone();
    let secret_changed = apply(&state, &mut row, input, false)?;
    row.updated_at = state.clock.now_ms();
    state.store.save_upstream(&row).await.map_err(store_error)?;
    if secret_changed {
        crate::upstream::pool::locks::clear_model_locks(&state.store, id)
            .await
            .map_err(store_error)?;
        end_parks(&state, id, true).await;
    }
    config_changed(&state).await?;
    let after = upstream_json(&state, &row, &[]);
    let mut before_json = upstream_json(&state, &before, &[]);
    if secret_changed {
        before_json["api_key"] = json!("(replaced)");
    }
    audit(
        &state,
        &actor,
        "update",
        "upstream",
        id,
        Some(before_json),
        Some(after.clone()),
    )
    .await;
    Ok(Json(after).into_response())
}

/// `DELETE /admin/v1/upstreams/{id}`.
pub async fn delete(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    let before = upstream_in(&state, &actor, id).await?;
    let before_json = upstream_json(&state, &before, &[]);
    state
        .store
        .delete_in(Table::Upstreams, actor.workspace_id(), id)
        .await
        .map_err(store_error)?;
    crate::upstream::pool::locks::clear(&state.store, id)
        .await
        .map_err(store_error)?;
    config_changed(&state).await?;
    audit(&state, &actor, "delete", "upstream", id, Some(before_json), None).await;
    Ok(no_content())
}

/// `POST /admin/v1/upstreams/{id}/test`: sends a minimal real request (one token) with the
/// credential; a success clears every lock, the backoff and the banned mark, on every gateway.
pub async fn test(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    let up = upstream_in(&state, &actor, id).await?;
    let Some(cred) = Credential::from_row(&up, &state.master_key) else {
        return Err(ApiError::Conflict {
            message: "this upstream's secret cannot be decrypted with the current master key; set its api_key again"
                .into(),
        });
    };
    let Some(model) = up.served_models().into_iter().next() else {
        return Err(ApiError::Conflict {
            message: "this upstream serves no model to test with; add one to its models".into(),
        });
    };
    // The same request an attempt sends (auth and version headers), with a one-token body.
    let endpoint = if cred.provider.speaks_anthropic() {
        Endpoint::Messages
    } else {
        Endpoint::ChatCompletions
    };
    let body: adapter::Fields =
        serde_json::from_str(r#"{"max_tokens":1,"messages":[{"role":"user","content":"ping"}]}"#)
            .unwrap_or_default();
    // Through dispatch's own builder, so a bedrock credential's ping is a signed Converse call
    // and a google credential's a generateContent call.
    let out = dispatch::outgoing(endpoint, &cred, &body, &model.upstream, None).map_err(ApiError::from)?;
    let req = dispatch::request(&cred, &axum::http::HeaderMap::new(), out);
    let started = std::time::Instant::now();
    let result = tokio::time::timeout(std::time::Duration::from_secs(30), state.http.send(req)).await;
    let latency_ms = started.elapsed().as_millis() as u64;
    let outcome = match result {
        Ok(Ok(r)) if r.status().is_success() => {
            state.locks.clear(up.id);
            // The level belongs to the account (kRouter rule 5): reset it for every gateway.
            if let Some(shared) = &state.shared_locks {
                shared.share(crate::upstream::pool::shared::Share::Reset(up.id));
            }
            crate::upstream::pool::locks::clear(&state.store, up.id)
                .await
                .map_err(store_error)?;
            end_parks(&state, up.id, false).await;
            config_changed(&state).await?;
            json!({"ok": true, "status": r.status().as_u16(), "latency_ms": latency_ms, "cleared": true})
        }
        Ok(Ok(r)) => {
            let status = r.status().as_u16();
            let body = http_body_util::BodyExt::collect(r.into_body()).await;
            let text = body.map(|b| b.to_bytes()).unwrap_or_default();
            // The body may echo the key: masked before it is shown or audited.
            let text = cred.mask.mask(&text);
            let excerpt: String = String::from_utf8_lossy(&text).chars().take(500).collect();
            json!({"ok": false, "status": status, "latency_ms": latency_ms, "cleared": false, "error": excerpt})
        }
        Ok(Err(e)) => json!({"ok": false, "status": null, "latency_ms": latency_ms, "cleared": false,
            "error": e.to_string()}),
        Err(_) => {
            json!({"ok": false, "status": null, "latency_ms": latency_ms, "cleared": false, "error": "timed out after 30 s"})
        }
    };
    audit(
        &state,
        &actor,
        "test",
        "upstream",
        id,
        None,
        Some(outcome.clone()),
    )
    .await;
    Ok(Json(outcome).into_response())
}
