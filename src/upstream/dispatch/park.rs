//! What a classified failure parks: the credential's (or its quota group's) locks, its backoff
//! level and its ban, written in memory at once and persisted off the request path.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::{Attempt, Upstreams};
use crate::deadline::Missed;
use crate::store::{ParkEvent, WHOLE_CREDENTIAL_TARGET};
use crate::upstream::classify::{self, Classification, LockModels, Sharing, UpstreamFailure};
use crate::upstream::locks::{LockEntry, LockTarget};
use crate::upstream::pool::Credential;

/// Persists what a failure parked (extend-only) and a ban, off the request path, so that every
/// gateway on the database honours them.
pub trait PersistLocks: Sync {
    /// Hands `rows` (and `banned`, a credential to mark banned) to a background write.
    fn persist_locks(&self, rows: Vec<(i64, LockTarget, LockEntry)>, banned: Option<i64>);
    /// Hands the record of what a failure parked, with the provider's words, to a background
    /// write (the credential's card and figures read it).
    fn record_parks(&self, events: Vec<ParkEvent>);
}

/// A deadline passed while `cred` kept the gateway waiting for `upstream_model` (no response
/// head, an error body or an answer that stalled): classified as the upstream's own 504 would be
/// and parked like one. `attempt` is noted with the rule, the lock and what did not come.
pub fn time_out(
    up: Upstreams<'_>,
    cred: &Credential,
    upstream_model: &str,
    missed: &Missed,
    attempt: &mut Attempt,
) {
    let class = classify::classify(&UpstreamFailure::timed_out(
        cred.provider,
        upstream_model,
        up.clock.now(),
        up.locks.backoff_level(cred.id),
    ));
    // A server error rests this credential alone: no quota group is consulted.
    let said = missed.to_string();
    let lock_until = park(up, None, 0, cred, upstream_model, &class, Some(&said));
    tracing::warn!(credential = %cred.name, model = upstream_model, %missed, "upstream deadline passed");
    attempt.rule = Some(class.rule.name());
    attempt.lock_until = lock_until.map(rfc3339);
    attempt.error = Some(said);
}

/// Writes what a classified failure parks (extend-only, persisted off the request path), bumps
/// the credential's backoff level and sets its banned mark; returns the lock's end. An
/// account-wide lock rests `cred`'s quota group as `quota_groups` lists it (groot ADR 0008;
/// `member_id` is the caller's member, for corroboration). What it parked is recorded with
/// `said`, the provider's words (or what the gateway saw instead), for the credential's card.
pub(super) fn park(
    up: Upstreams<'_>,
    quota_groups: Option<&HashMap<String, Vec<i64>>>,
    member_id: i64,
    cred: &Credential,
    upstream_model: &str,
    class: &Classification,
    said: Option<&str>,
) -> Option<DateTime<Utc>> {
    if class.bump_backoff {
        up.locks.bump_backoff(cred.id);
    }
    if class.banned {
        up.locks.ban(cred.id);
    }
    let mut rows = Vec::new();
    if let Some(lock) = &class.lock {
        let group = |g: &String| {
            quota_groups
                .and_then(|q| q.get(g))
                .cloned()
                .unwrap_or_else(|| vec![cred.id])
        };
        let credentials = match (lock.sharing, &cred.quota_group) {
            // groot ADR 0008: an account-level failure rests every credential of the quota group.
            (Sharing::Account, Some(g)) => group(g),
            // groot ADR 0008: corroboration — an ambiguous 429 rests the quota group only once
            // 3 such failures from 2 different members fell within 30 s; else its route.
            (Sharing::AccountIfCorroborated, Some(g))
                if up
                    .corroboration
                    .observe(cred.workspace_id, g, up.clock.now_ms(), member_id) =>
            {
                tracing::info!(credential = %cred.name, quota_group = %g, "ambiguous 429 corroborated; the quota group rests");
                group(g)
            }
            _ => vec![cred.id],
        };
        let until = lock.until.timestamp_millis();
        let rule = class.rule.name();
        let mut targets = vec![match lock.models {
            LockModels::One => LockTarget::Model(upstream_model.to_owned()),
            LockModels::AllFree => LockTarget::AllFree,
            LockModels::All => LockTarget::Credential,
        }];
        if lock.models == LockModels::AllFree && !classify::is_free_model(upstream_model) {
            targets.push(LockTarget::Model(upstream_model.to_owned()));
        }
        for t in &targets {
            rows.extend(up.locks.park(&credentials, t, until, rule));
        }
        tracing::info!(credential = %cred.name, model = upstream_model, rule, until = %lock.until, "upstream credential parked");
    }
    if !rows.is_empty() || class.banned {
        let since_ms = up.clock.now_ms();
        let event = |credential_id: i64, target: String, until_ms: i64| ParkEvent {
            credential_id,
            target,
            since_ms,
            until_ms,
            rule: class.rule.name().to_owned(),
            message: said.map(str::to_owned),
        };
        let mut events: Vec<ParkEvent> = rows
            .iter()
            .map(|(c, target, entry)| event(*c, target.to_db(), entry.until_ms))
            .collect();
        // A ban has no end: recorded for its words only (it parks nothing by time).
        if class.banned {
            events.push(event(cred.id, WHOLE_CREDENTIAL_TARGET.to_owned(), since_ms));
        }
        up.persist.persist_locks(rows, class.banned.then_some(cred.id));
        up.persist.record_parks(events);
    }
    class.lock.as_ref().map(|l| l.until)
}

pub(super) fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
