//! Limits an owner or admin sets on a member's key survive what the member does to their keys
//! (DESIGN.md §11): deleting and re-creating it, re-creating it under another name, opening a
//! second one. A member creates and deletes their own keys freely, so a limit tied to one key
//! row would go with it:
//!
//! - **Allow-lists and caps are carried**: the model allow-list, concurrency cap and tag
//!   allow-list an owner or admin last set on any of a member's keys are kept on the member
//!   ([`KeyLimits`]) and every key the member creates carries them; the member may narrow them
//!   when creating the key, never widen them.
//! - **Budgets move to the member**: when the member deletes a key or creates another, the
//!   budgets an owner or admin (or the resources file) set on their keys become budgets on the
//!   member, which count every key of theirs together, with what the keys had used so far in
//!   the window. A per-key budget copied to each new key would start from 0 on every re-created
//!   key.
//!
//! Only plain members' keys: an owner or admin may change the limits of their own keys anyway.

use serde_json::json;

use super::session::Actor;
use super::{AdminResult, audit, store_error};
use crate::error::ApiError;
use crate::quota::SubjectKind;
use crate::quota::policy::PolicyRule;
use crate::state::AppState;
use crate::store::{
    AdminStore, KeyGuardrails, KeyLimits, KeyStore, MemberRow, PolicyRow, PolicyStore, Role, Table,
};

/// Whether the limits set over `holder`'s keys are kept on them: a plain member's.
pub(super) fn kept_for(holder: &MemberRow) -> bool {
    holder.role() == Role::Member
}

/// The guardrails of a key `holder` creates for themself: what they asked, within the limits
/// they carry (an owner's or admin's list or cap where they asked none).
pub(super) fn carried(holder: &MemberRow, asked: KeyGuardrails) -> AdminResult<KeyGuardrails> {
    let limits = KeyLimits::of(holder);
    let allowed_models = within_list(
        "allowed_models",
        asked.allowed_models,
        limits.allowed_models,
        model_covers,
    )?;
    let allowed_tags = within_list(
        "allowed_tags",
        asked.allowed_tags,
        limits.allowed_tags,
        tag_covers,
    )?;
    let max_in_flight = match (asked.max_in_flight, limits.max_in_flight) {
        (Some(a), Some(cap)) if a > cap => {
            return Err(ApiError::field(
                "max_in_flight",
                format!("max_in_flight must be at most {cap}, the cap an owner or admin set on your keys"),
            ));
        }
        (asked, cap) => asked.or(cap),
    };
    Ok(KeyGuardrails {
        allowed_models,
        max_in_flight,
        allowed_tags,
        ..asked
    })
}

/// A stored list asked for, within the stored list carried (none: not limited): each entry asked
/// must be covered by one carried.
fn within_list(
    field: &str,
    asked: Option<String>,
    carried: Option<String>,
    covers: fn(&str, &str) -> bool,
) -> AdminResult<Option<String>> {
    let decode = |stored: Option<&str>| {
        crate::kernel::caller::decode_model_list(stored).map_err(|e| {
            tracing::error!(error = %e, field, "unreadable stored allow-list");
            ApiError::Internal
        })
    };
    let Some(limit) = decode(carried.as_deref())? else {
        return Ok(asked);
    };
    let Some(list) = decode(asked.as_deref())? else {
        return Ok(carried);
    };
    match list.iter().find(|a| !limit.iter().any(|l| covers(l, a))) {
        None => Ok(asked),
        Some(outside) => Err(ApiError::field(
            field,
            format!(
                "{field}: {outside:?} is outside what an owner or admin allowed your keys ({})",
                limit.join(", ")
            ),
        )),
    }
}

/// Whether model allow-list entry `limit` allows everything entry `entry` does.
fn model_covers(limit: &str, entry: &str) -> bool {
    match entry.strip_suffix('*') {
        Some(prefix) => limit.ends_with('*') && crate::kernel::caller::pattern_matches(limit, prefix),
        None => crate::kernel::caller::pattern_matches(limit, entry),
    }
}

/// Whether tag allow-list entry `limit` (`key=value` or `key=*`) allows everything `entry` does.
fn tag_covers(limit: &str, entry: &str) -> bool {
    limit == entry
        || limit
            .strip_suffix('*')
            .is_some_and(|key| key.ends_with('=') && entry.starts_with(key) && !entry.ends_with("=*"))
}

/// Keeps on `holder` the limits an owner or admin just set on one of their keys, field by field
/// (`None`: not changed; `Some(None)`: lifted).
pub(super) async fn record(
    state: &AppState,
    holder: &MemberRow,
    allowed_models: Option<Option<String>>,
    max_in_flight: Option<Option<i64>>,
    allowed_tags: Option<Option<String>>,
) -> AdminResult<()> {
    if !kept_for(holder) {
        return Ok(());
    }
    let before = KeyLimits::of(holder);
    let after = KeyLimits {
        allowed_models: allowed_models.unwrap_or_else(|| before.allowed_models.clone()),
        max_in_flight: max_in_flight.unwrap_or(before.max_in_flight),
        allowed_tags: allowed_tags.unwrap_or_else(|| before.allowed_tags.clone()),
    };
    if after != before {
        state
            .store
            .set_member_key_limits(holder.id, &after)
            .await
            .map_err(store_error)?;
    }
    Ok(())
}

/// Moves to `actor` (a plain member deleting a key or creating another) the budgets an owner, an
/// admin or the resources file set on `keys` of theirs, with what each key used in the current
/// window. A budget the member already has for the same metric and window keeps the tighter
/// limit. Whether any moved.
pub(super) async fn move_budgets(state: &AppState, actor: &Actor, keys: &[i64]) -> AdminResult<bool> {
    let member = &actor.member;
    if !kept_for(member) || keys.is_empty() {
        return Ok(false);
    }
    let ws = member.workspace_id;
    let policies: Vec<PolicyRow> = state
        .store
        .rows_in(Table::Policies, ws)
        .await
        .map_err(store_error)?;
    let set_over = policies
        .into_iter()
        .filter(|p| p.subject == "apikey" && keys.contains(&p.target_id) && p.created_by != Some(member.id));
    let (now, tz) = (state.clock.now(), state.timezone_of(ws));
    let mut moved = false;
    for p in set_over {
        if let Some(rule) = PolicyRule::from_row(&p) {
            let to = (SubjectKind::Member, member.id);
            state
                .quota
                .carry_usage(&state.store, &rule, p.target_id, to, now, tz)
                .await
                .map_err(store_error)?;
        }
        let existing = state
            .store
            .policy_by_key(ws, "member", member.id, 0, &p.metric, &p.time_window)
            .await
            .map_err(store_error)?;
        let updated_at = now.timestamp_millis();
        let kept = match existing {
            None => PolicyRow {
                subject: "member".to_owned(),
                target_id: member.id,
                scope_department_id: 0,
                updated_at,
                ..p.clone()
            },
            Some(e) => {
                state
                    .store
                    .delete_in(Table::Policies, ws, p.id)
                    .await
                    .map_err(store_error)?;
                let tighter = p.mode == "enforce" && (e.mode != "enforce" || p.limit_value < e.limit_value);
                if !tighter {
                    continue;
                }
                PolicyRow {
                    limit_value: p.limit_value,
                    mode: p.mode.clone(),
                    updated_at,
                    ..e
                }
            }
        };
        let id = state.store.save_policy(&kept).await.map_err(store_error)?;
        moved = true;
        let before = json!({"id": p.id, "subject": "apikey", "target_id": p.target_id});
        let after = json!({"id": id, "subject": "member", "target_id": member.id, "limit": kept.limit_value});
        audit(state, actor, "update", "policy", id, Some(before), Some(after)).await;
    }
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_limit_entry_covers() {
        // (limit, entry, covered?)
        let models = [
            ("gpt-4o", "gpt-4o", true),
            ("gpt-4o", "gpt-4o-mini", false),
            ("gpt-4o*", "gpt-4o-mini", true),
            ("gpt-4o*", "gpt-4o*", true),
            ("gpt-*", "gpt-4o*", true),
            ("gpt-4o*", "gpt-*", false),
            ("gpt-4o", "gpt-4o*", false),
            ("*", "*", true),
            ("*", "claude-3", true),
            ("gpt-*", "*", false),
        ];
        for (limit, entry, want) in models {
            assert_eq!(model_covers(limit, entry), want, "model {limit} ⊇ {entry}");
        }
        let tags = [
            ("team=search", "team=search", true),
            ("team=search", "team=ads", false),
            ("team=*", "team=ads", true),
            ("team=*", "team=*", true),
            ("team=search", "team=*", false),
            ("team=*", "teams=x", false),
        ];
        for (limit, entry, want) in tags {
            assert_eq!(tag_covers(limit, entry), want, "tag {limit} ⊇ {entry}");
        }
    }
}
