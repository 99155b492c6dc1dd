//! The workspace's labels (issue 40 item 3): the tag values and end users its requests brought,
//! each with the key that brought it first and when a request last brought it, listed and pruned
//! by an owner or admin (`GET`/`DELETE /admin/v1/labels`). A pruned label frees its place under
//! the workspace's caps and its key's at once on this gateway, within a minute on the others; a
//! label a policy names is never pruned (the policy's target is its id). Prunes are audited.

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use super::session::Actor;
use super::{AdminResult, Params, audit, store_error};
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{AdminStore, ApiKeyRow, LabelFilter, LabelKind, LabelRow, Table};

/// Most labels one page lists.
const MAX_LIMIT: i64 = 1000;

/// The query of both routes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelQuery {
    /// `tag` or `end_user`.
    kind: String,
    /// One label by id.
    id: Option<i64>,
    /// Those the key with this id brought.
    api_key_id: Option<i64>,
    /// Tags of this key only.
    tag_key: Option<String>,
    /// This value (a tag's value, or the end user's id).
    value: Option<String>,
    /// Those no request brought for this many days.
    unseen_days: Option<i64>,
    /// Listing only: at most this many (default 100, at most 1000), least recently seen first.
    limit: Option<i64>,
}

impl LabelQuery {
    /// The kind and the filter, checked; `now` dates `unseen_days`.
    fn parse(&self, now: i64) -> AdminResult<(LabelKind, LabelFilter)> {
        let kind = match self.kind.as_str() {
            "tag" => LabelKind::Tag,
            "end_user" => LabelKind::EndUser,
            other => {
                return Err(ApiError::field(
                    "kind",
                    format!("kind must be `tag` or `end_user`, not `{other}`"),
                ));
            }
        };
        if kind == LabelKind::EndUser && self.tag_key.is_some() {
            return Err(ApiError::field("tag_key", "tag_key narrows tags only (kind=tag)"));
        }
        let unseen_since = match self.unseen_days {
            Some(d) if !(1..=36_500).contains(&d) => {
                return Err(ApiError::field("unseen_days", "unseen_days must be 1..=36500"));
            }
            Some(d) => Some(now - d * 86_400_000),
            None => None,
        };
        let filter = LabelFilter {
            id: self.id,
            api_key_id: self.api_key_id,
            tag_key: self.tag_key.clone(),
            value: self.value.clone(),
            unseen_since,
        };
        Ok((kind, filter))
    }
}

/// A label as the API shows it.
fn label_json(kind: LabelKind, l: &LabelRow, keys: &[ApiKeyRow]) -> Value {
    let name = match &l.tag_key {
        Some(k) => format!("{k}={}", l.value),
        None => l.value.clone(),
    };
    json!({
        "id": l.id,
        "kind": kind.as_str(),
        "tag_key": l.tag_key,
        "value": l.value,
        "name": name,
        "api_key_id": l.api_key_id,
        "api_key_name": l.api_key_id.and_then(|id| keys.iter().find(|k| k.id == id)).map(|k| k.name.clone()),
        "created_at": l.created_at,
        "last_seen_at": l.last_seen_at,
    })
}

/// `GET /admin/v1/labels?kind=…` (owner or admin): the workspace's labels of one kind that the
/// filters select, least recently seen first, their total, and the caps they are held to.
pub async fn list(State(state): State<AppState>, actor: Actor, Params(q): Params<LabelQuery>) -> AdminResult {
    let (kind, filter) = q.parse(state.clock.now_ms())?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::field("limit", "limit must be 1..=1000"));
    }
    let ws = actor.workspace_id();
    let (rows, total) = state
        .store
        .labels_in(ws, kind, &filter, limit)
        .await
        .map_err(store_error)?;
    let mut key_ids: Vec<i64> = rows.iter().filter_map(|l| l.api_key_id).collect();
    key_ids.sort_unstable();
    key_ids.dedup();
    let keys: Vec<ApiKeyRow> = if key_ids.is_empty() {
        Vec::new()
    } else {
        state
            .store
            .rows_with_ids(Table::ApiKeys, ws, &key_ids)
            .await
            .map_err(store_error)?
    };
    let s = &state.settings;
    let caps = match kind {
        LabelKind::Tag => json!({
            "max_tag_keys": s.max_tag_keys, "max_tag_values": s.max_tag_values,
            "max_tag_keys_per_key": s.max_tag_keys_per_key,
            "max_tag_values_per_key": s.max_tag_values_per_key,
            "label_expiry_days": s.label_expiry_days,
        }),
        LabelKind::EndUser => json!({
            "max_end_users": s.max_end_users, "max_end_users_per_key": s.max_end_users_per_key,
            "label_expiry_days": s.label_expiry_days,
        }),
    };
    let data: Vec<Value> = rows.iter().map(|l| label_json(kind, l, &keys)).collect();
    Ok(Json(json!({"data": data, "total": total, "caps": caps})).into_response())
}

/// `DELETE /admin/v1/labels?kind=…&…` (owner or admin): deletes the workspace's labels of one
/// kind that the filters select (at least one filter), never one a policy names, and answers
/// how many went. This gateway's sightings are written first, so that a label in use here is
/// not taken for unseen.
pub async fn prune(
    State(state): State<AppState>,
    actor: Actor,
    Params(q): Params<LabelQuery>,
) -> AdminResult {
    let (kind, filter) = q.parse(state.clock.now_ms())?;
    if q.limit.is_some() {
        return Err(ApiError::field(
            "limit",
            "limit is for listing; a prune deletes every match",
        ));
    }
    if filter == LabelFilter::default() {
        return Err(ApiError::field(
            "kind",
            "name what to prune: id, api_key_id, tag_key, value or unseen_days (nothing prunes every label)",
        ));
    }
    state
        .labels
        .write_sightings(&state.store)
        .await
        .map_err(store_error)?;
    let gone = state
        .store
        .prune_labels(actor.workspace_id(), kind, &filter)
        .await
        .map_err(store_error)?;
    state.labels.forget(kind, &gone);
    let after = json!({
        "kind": kind.as_str(),
        "id": q.id,
        "api_key_id": q.api_key_id,
        "tag_key": q.tag_key,
        "value": q.value,
        "unseen_days": q.unseen_days,
        "deleted": gone.len(),
    });
    audit(&state, &actor, "prune", "labels", 0, None, Some(after)).await;
    Ok(Json(json!({"deleted": gone.len()})).into_response())
}
