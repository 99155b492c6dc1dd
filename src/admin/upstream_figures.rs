//! Per-credential figures over the last day (issue 46: what new-api users judge a channel by),
//! from the hourly rollup the log writer adds with the logs and from the recorded locks: nothing
//! is counted on the request path for them.

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use serde_json::{Value, json};

use super::session::Actor;
use super::{AdminResult, rfc3339, store_error};
use crate::kernel::credits::micros_to_credits;
use crate::state::AppState;
use crate::store::{
    AdminStore, CredentialFigureStore, CredentialFigures, HOUR_MS, Table, UpstreamRow, hour_of, time_parked,
};

/// Hours the figures cover: the current one and the 23 before it.
const HOURS: i64 = 24;

/// `GET /admin/v1/upstreams/figures` (owner or admin): for each credential of the workspace,
/// over the current hour and the 23 before it (UTC hours, as written by the log writer, so as
/// fresh as the request logs): upstream attempts and the share that failed, requests served and
/// their mean latency and time to the credential's response headers, tokens and credits; and
/// over the last 24 hours, the time at least one lock parked something on it.
pub async fn figures(State(state): State<AppState>, actor: Actor) -> AdminResult {
    let ws = actor.workspace_id();
    let now = state.clock.now_ms();
    let from = hour_of(now).saturating_sub((HOURS - 1) * HOUR_MS);
    let day_ago = now.saturating_sub(HOURS * HOUR_MS);
    let upstreams: Vec<UpstreamRow> = state
        .store
        .rows_in(Table::Upstreams, ws)
        .await
        .map_err(store_error)?;
    let sums = state
        .store
        .credential_figures(ws, from)
        .await
        .map_err(store_error)?;
    let ids: Vec<i64> = upstreams.iter().map(|u| u.id).collect();
    let events = super::upstreams::recent_parks(&state, &ids).await?;
    let mean = |sum: i64, n: i64| (n > 0).then(|| sum as f64 / n as f64).map(|v| v.round() as i64);
    let data: Vec<Value> = upstreams
        .iter()
        .map(|u| {
            let f = sums
                .iter()
                .find(|f| f.upstream_id == u.id)
                .cloned()
                .unwrap_or(CredentialFigures {
                    upstream_id: u.id,
                    ..CredentialFigures::default()
                });
            let mine: Vec<_> = events
                .iter()
                .filter(|e| e.credential_id == u.id)
                .cloned()
                .collect();
            json!({
                "upstream_id": u.id,
                "name": u.name,
                "attempts": f.attempts,
                "failures": f.failures,
                "error_rate": (f.attempts > 0).then(|| f.failures as f64 / f.attempts as f64),
                "served": f.served,
                "mean_latency_ms": mean(f.latency_ms, f.served),
                "mean_upstream_ms": mean(f.upstream_ms, f.timed),
                "total_tokens": f.total_tokens,
                "credits": micros_to_credits(f.credits),
                "parked_seconds": time_parked(&mine, day_ago, now) / 1000,
            })
        })
        .collect();
    Ok(Json(json!({
        "from": rfc3339(from),
        "to": rfc3339(now),
        "parked_from": rfc3339(day_ago),
        "data": data,
    }))
    .into_response())
}
