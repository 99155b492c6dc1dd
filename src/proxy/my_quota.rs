//! `GET /v1/quota`: the caller's quotas, as the "My quota" card shows them (DESIGN.md §4).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::authenticated::Authenticated;
use super::{header_labels, tags_allowed};
use crate::error::ApiError;
use crate::kernel::caller::Caller;
use crate::quota;
use crate::state::AppState;

/// `GET /v1/quota`: every quota that applies to the calling key, as the "My quota" card shows it;
/// with `x-aigw-tags` and `x-aigw-end-user`, also those of these tag values and end user, as a
/// request carrying them meets them (the checks, refusals and caps of steps 3b and 5 of
/// [`super::handle`]).
pub(super) async fn my_quota(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    Authenticated(caller): Authenticated,
) -> Response {
    match quota_rows(&state, &headers, &caller).await {
        Ok(rows) => axum::Json(json!({"object": "list", "data": rows})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The rows of `GET /v1/quota`.
async fn quota_rows(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    caller: &Caller,
) -> Result<Vec<serde_json::Value>, ApiError> {
    let (tags, end_user) = header_labels(headers, &[])?;
    tags_allowed(&tags, caller)?;
    let labels = state
        .labels
        .resolve(
            &state.store,
            state.label_caps(),
            state.labels_brought_by(caller.key_id),
            caller.workspace_id,
            &tags,
            end_user.as_deref(),
            state.clock.now_ms(),
        )
        .await?;
    let tz = state.timezone_of(caller.workspace_id);
    let decision = state
        .quota
        .check_request(
            &state.store,
            &state.policies.load(),
            caller,
            &labels,
            state.clock.now(),
            tz,
        )
        .await?;
    // The metric as the quota headers name it (`tokens`: seed 003, DESIGN.md §11).
    Ok(quota::report::rows(
        &decision,
        &labels,
        quota::Metric::client_name,
    ))
}
