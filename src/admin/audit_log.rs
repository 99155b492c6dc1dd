//! The audit log as the API shows it: who changed what, when, from where, with which service
//! token, and the target by its name (`ada@acme.test/ci`, not `api_key #5`).

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use super::session::Actor;
use super::{AdminResult, Params, store_error};
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{AdminStore, ApiKeyRow, AuditRow, Department, MemberRow, ModelRow, Table, UpstreamRow};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    #[serde(default)]
    cursor: Option<i64>,
    #[serde(default)]
    limit: Option<i64>,
}

/// How a target is named, from the entity as the API showed it after the change (before it, for
/// a deletion): a key as `email/name`, a member by email, a policy by what it limits, the rest
/// by name. None when neither says (a password reset, a connection test).
fn named(kind: &str, before: Option<&Value>, after: Option<&Value>) -> Option<String> {
    [after, before].into_iter().flatten().find_map(|v| {
        let text = |k: &str| v.get(k).and_then(Value::as_str);
        match kind {
            "api_key" => match (text("member_email"), text("name")) {
                (Some(email), Some(name)) => Some(format!("{email}/{name}")),
                (None, name) => name.map(str::to_owned),
                _ => None,
            },
            "member" => text("email").map(str::to_owned),
            "policy" => {
                let limit = v.get("limit").map(Value::to_string).unwrap_or_default();
                Some(format!(
                    "{} {} {} {}/{}",
                    text("subject")?,
                    text("target")?,
                    limit,
                    text("metric")?,
                    text("window")?
                ))
            }
            _ => text("name").map(str::to_owned),
        }
    })
}

/// The names of the targets a page's entries do not name themselves, looked up as they are now.
async fn current_names(
    state: &AppState,
    ws: i64,
    rows: &[AuditRow],
) -> AdminResult<Vec<((String, i64), String)>> {
    let ids = |kind: &str| -> Vec<i64> {
        let mut ids: Vec<i64> = rows
            .iter()
            .filter(|r| r.target_kind == kind)
            .filter_map(|r| r.target_id)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    };
    let store = &state.store;
    let mut out = Vec::new();
    let member_ids = ids("member");
    let key_ids = ids("api_key");
    let keys: Vec<ApiKeyRow> = if key_ids.is_empty() {
        Vec::new()
    } else {
        store
            .rows_with_ids(Table::ApiKeys, ws, &key_ids)
            .await
            .map_err(store_error)?
    };
    let mut wanted: Vec<i64> = member_ids.clone();
    wanted.extend(keys.iter().map(|k| k.member_id));
    wanted.sort_unstable();
    wanted.dedup();
    let members: Vec<MemberRow> = if wanted.is_empty() {
        Vec::new()
    } else {
        store
            .rows_with_ids(Table::Members, ws, &wanted)
            .await
            .map_err(store_error)?
    };
    let email = |id: i64| members.iter().find(|m| m.id == id).map(|m| m.email.clone());
    for id in member_ids {
        if let Some(e) = email(id) {
            out.push((("member".to_owned(), id), e));
        }
    }
    for k in &keys {
        let name = match email(k.member_id) {
            Some(e) => format!("{e}/{}", k.name),
            None => k.name.clone(),
        };
        out.push((("api_key".to_owned(), k.id), name));
    }
    let upstream_ids = ids("upstream");
    if !upstream_ids.is_empty() {
        let ups: Vec<UpstreamRow> = store
            .rows_with_ids(Table::Upstreams, ws, &upstream_ids)
            .await
            .map_err(store_error)?;
        out.extend(ups.into_iter().map(|u| (("upstream".to_owned(), u.id), u.name)));
    }
    let model_ids = ids("model");
    if !model_ids.is_empty() {
        let models: Vec<ModelRow> = store
            .rows_with_ids(Table::Models, ws, &model_ids)
            .await
            .map_err(store_error)?;
        out.extend(models.into_iter().map(|m| (("model".to_owned(), m.id), m.name)));
    }
    let dept_ids = ids("department");
    if !dept_ids.is_empty() {
        let depts: Vec<Department> = store
            .rows_with_ids(Table::Departments, ws, &dept_ids)
            .await
            .map_err(store_error)?;
        out.extend(
            depts
                .into_iter()
                .map(|d| (("department".to_owned(), d.id), d.name)),
        );
    }
    Ok(out)
}

/// `GET /admin/v1/audit`: who changed which guardrail, credential, key, member, model or service
/// token, when, from what to what, from which address and with which service token; each target
/// named (`target_name`); newest first.
pub async fn list(State(state): State<AppState>, actor: Actor, Params(q): Params<AuditQuery>) -> AdminResult {
    let limit = q.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::field("limit", "limit must be between 1 and 500"));
    }
    let ws = actor.workspace_id();
    let mut rows = state
        .store
        .audit_page(ws, q.cursor, limit + 1)
        .await
        .map_err(store_error)?;
    let next_cursor = if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        rows.last().map(|r| r.id)
    } else {
        None
    };
    let parse = |v: &Option<String>| v.as_deref().and_then(|s| serde_json::from_str::<Value>(s).ok());
    let parsed: Vec<(Option<Value>, Option<Value>)> = rows
        .iter()
        .map(|r| (parse(&r.before_json), parse(&r.after_json)))
        .collect();
    let unnamed: Vec<AuditRow> = rows
        .iter()
        .zip(&parsed)
        .filter(|(r, (b, a))| named(&r.target_kind, b.as_ref(), a.as_ref()).is_none())
        .map(|(r, _)| r.clone())
        .collect();
    let now_named = current_names(&state, ws, &unnamed).await?;
    let data: Vec<Value> = rows
        .iter()
        .zip(parsed)
        .map(|(r, (before, after))| {
            let name = named(&r.target_kind, before.as_ref(), after.as_ref()).or_else(|| {
                r.target_id.and_then(|id| {
                    now_named
                        .iter()
                        .find(|((k, i), _)| *k == r.target_kind && *i == id)
                        .map(|(_, n)| n.clone())
                })
            });
            json!({
                "id": r.id,
                "at": r.at,
                "actor_id": r.actor_id,
                "actor_email": r.actor_email,
                "actor_token": r.actor_token,
                "action": r.action,
                "target_kind": r.target_kind,
                "target_id": r.target_id,
                "target_name": name,
                "before": before,
                "after": after,
                "client_ip": r.client_ip,
            })
        })
        .collect();
    Ok(Json(json!({"data": data, "next_cursor": next_cursor})).into_response())
}

#[cfg(test)]
mod tests {
    use super::named;
    use serde_json::json;

    /// Each case: the target's kind, the entity before and after, and its name.
    #[test]
    fn targets_are_named_as_people_know_them() {
        let key = json!({"id": 5, "name": "ci", "member_email": "ada@acme.test"});
        let policy = json!({"subject": "apikey", "target": "ada@acme.test/ci", "limit": 100, "metric": "requests", "window": "day"});
        let cases = [
            ("api_key", None, Some(&key), Some("ada@acme.test/ci")),
            ("api_key", Some(&key), None, Some("ada@acme.test/ci")),
            (
                "member",
                None,
                Some(&json!({"email": "bob@acme.test"})),
                Some("bob@acme.test"),
            ),
            (
                "policy",
                None,
                Some(&policy),
                Some("apikey ada@acme.test/ci 100 requests/day"),
            ),
            (
                "upstream",
                Some(&json!({"name": "primary"})),
                Some(&json!({"ok": true})),
                Some("primary"),
            ),
            (
                "service_token",
                None,
                Some(&json!({"name": "terraform"})),
                Some("terraform"),
            ),
            ("member", None, None, None),
            ("upstream", None, Some(&json!({"ok": false})), None),
        ];
        for (kind, before, after, want) in cases {
            assert_eq!(
                named(kind, before, after).as_deref(),
                want,
                "{kind} {before:?} {after:?}"
            );
        }
    }
}
