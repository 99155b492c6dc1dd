//! What a classified failure parks: the credential's (or its quota group's) locks, its backoff
//! level and its ban, written in memory at once and persisted off the request path.

use chrono::{DateTime, Utc};
use rustc_hash::FxHashMap;

use super::{Attempt, Upstreams};
use crate::deadline::Missed;
use crate::provider::Credential;
use crate::store::{ParkEvent, WHOLE_CREDENTIAL_TARGET};
use crate::upstream::pool::classify::{self, Classification, LockModels, Sharing, UpstreamFailure};
use crate::upstream::pool::corroboration::{GroupRest, Witness};
use crate::upstream::pool::locks::{LockEntry, LockTarget};

/// Persists what a failure parked (extend-only) and a ban, off the request path, so that every
/// gateway on the database honours them.
pub trait PersistLocks: Sync {
    /// Hands `rows` (and `banned`, a credential to mark banned) to a background write.
    fn persist_locks(&self, rows: Vec<(i64, LockTarget, LockEntry)>, banned: Option<i64>);
    /// Hands the record of what a failure parked, with the provider's words, to a background
    /// write (the credential's card and figures read it).
    fn record_parks(&self, events: Vec<ParkEvent>);
    /// Shares the credential's backoff level, just raised to `level` (0: reset by a success),
    /// with the other gateways, off the request path (kRouter rule 5: "the backoff level belongs
    /// to the account"); nothing without `redis_url`.
    fn share_backoff(&self, credential: i64, level: u32);
    /// Counts an ambiguous failure across gateways, off the request path; when that
    /// corroborates it, the group rests with `rest` ([`rest_group`]). `rest` is `None` when this
    /// gateway's own traffic corroborated it (the group already rests). Nothing without
    /// `redis_url` (groot ADR 0008; `corroboration.rs`).
    fn witness(&self, witness: Witness, rest: Option<GroupRest>);
    /// Whether ambiguous failures are counted across gateways (`redis_url` is set): without it
    /// no witness is even built.
    fn counts_across_gateways(&self) -> bool;
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

/// groot ADR 0008: a failure of a quota group's shared quota — the account's, or an ambiguous
/// one (corroborated or not) — closes the models the quota covers
/// ([`classify::shared_quota_models`]) on every credential of the group. The request that met
/// it stops walking them at once; the same closure is the rest [`park`] writes on the group when
/// the failure is the account's or corroborated. One rule, so that no later request walks into
/// the quota this one found closed.
#[derive(Clone, Debug)]
pub(super) struct GroupClosure {
    /// The quota group.
    group: String,
    /// Which models of its credentials are closed.
    models: LockModels,
    /// The upstream model that failed.
    failed_model: String,
}

impl GroupClosure {
    /// The closure a classified failure of `upstream_model` on `cred` makes, if any: a lock on
    /// the account (or maybe the account) of a credential that has a quota group.
    pub(super) fn of(cred: &Credential, upstream_model: &str, class: &Classification) -> Option<Self> {
        let lock = class.lock.as_ref()?;
        if !matches!(lock.sharing, Sharing::Account | Sharing::AccountIfCorroborated) {
            return None;
        }
        Some(GroupClosure {
            group: cred.quota_group.clone()?,
            models: classify::shared_quota_models(lock.models, upstream_model),
            failed_model: upstream_model.to_owned(),
        })
    }

    /// Whether `upstream_model` on `cred` draws on the closed quota.
    pub(super) fn covers(&self, cred: &Credential, upstream_model: &str) -> bool {
        cred.quota_group.as_deref() == Some(self.group.as_str())
            && self.models.covers(&self.failed_model, upstream_model)
    }
}

/// Writes what a classified failure parks (extend-only, persisted off the request path), bumps
/// the credential's backoff level and sets its banned mark; returns the lock's end. A rest of
/// the shared quota parks its [`GroupClosure`] on every credential of `cred`'s quota group as
/// `quota_groups` lists it (groot ADR 0008; `member_id` is the caller's member, for
/// corroboration); any other lock parks `cred` alone. What it parked is recorded with `said`,
/// the provider's words (or what the gateway saw instead), for the credential's card.
///
/// A group's rest lasts as long as the classification says: seed 000's durations (a named reset
/// up to 6 h, the free daily cap until 00:00 UTC, a monthly hold until the 1st), never shorter
/// than the wait the provider named (`classify.rs`). groot ADR 0008 rests an account "up to
/// 300 s" and a day's cap 300 s, probing a closed day 12 times an hour; DESIGN.md §6 takes seed
/// 000's instead, because each such probe is a request the provider already said it will refuse:
/// one more refused call counted against the per-minute window (seed 004), and on a shared group
/// a failed request for whoever sends it. Seed 000's caps already bound a wrong estimate.
pub(super) fn park(
    up: Upstreams<'_>,
    quota_groups: Option<&FxHashMap<String, Vec<i64>>>,
    member_id: i64,
    cred: &Credential,
    upstream_model: &str,
    class: &Classification,
    said: Option<&str>,
) -> Option<DateTime<Utc>> {
    let (until, rows) = write(up, quota_groups, member_id, cred, upstream_model, class, said);
    persist(up, rows, class.banned.then_some(cred.id), class.rule.name(), said);
    until
}

/// Hands the locks `rows` (and `banned`, a credential to mark banned) to the background write,
/// with the record of what `rule` parked and `said`, for the credential's card.
pub(super) fn persist(up: Upstreams<'_>, rows: Written, banned: Option<i64>, rule: &str, said: Option<&str>) {
    if rows.is_empty() && banned.is_none() {
        return;
    }
    let since_ms = up.clock.now_ms();
    let event = |credential_id: i64, target: String, until_ms: i64| ParkEvent {
        credential_id,
        target,
        since_ms,
        until_ms,
        rule: rule.to_owned(),
        message: said.map(str::to_owned),
    };
    let mut events: Vec<ParkEvent> = rows
        .iter()
        .map(|(c, target, entry)| event(*c, target.to_db(), entry.until_ms))
        .collect();
    // A ban has no end: recorded for its words only (it parks nothing by time).
    if let Some(c) = banned {
        events.push(event(c, WHOLE_CREDENTIAL_TARGET.to_owned(), since_ms));
    }
    up.persist.persist_locks(rows, banned);
    up.persist.record_parks(events);
}

/// [`park`] in this gateway's memory only: returns the lock's end and the rows it wrote, for
/// the caller to persist. An ambiguous failure on a quota group is also handed to the count
/// across gateways, with the rest it would bring (`said`: the provider's words).
pub(super) fn write(
    up: Upstreams<'_>,
    quota_groups: Option<&FxHashMap<String, Vec<i64>>>,
    member_id: i64,
    cred: &Credential,
    upstream_model: &str,
    class: &Classification,
    said: Option<&str>,
) -> (Option<DateTime<Utc>>, Written) {
    if class.bump_backoff {
        let level = up.locks.bump_backoff(cred.id);
        up.persist.share_backoff(cred.id, level);
    }
    if class.count_kiro_hold {
        up.locks.count_kiro_hold(cred.id);
    }
    if class.banned {
        up.locks.ban(cred.id);
    }
    let mut rows = Vec::new();
    if let Some(lock) = &class.lock {
        let closure = GroupClosure::of(cred, upstream_model, class);
        let group = |g: &str| {
            quota_groups
                .and_then(|q| q.get(g))
                .cloned()
                .unwrap_or_else(|| vec![cred.id])
        };
        let until = lock.until.timestamp_millis();
        let rule = class.rule.name();
        let rest = match (lock.sharing, &closure) {
            // groot ADR 0008: an account-level failure rests the shared quota on the group.
            (Sharing::Account, Some(c)) => Some(c),
            // groot ADR 0008: corroboration — an ambiguous 429 rests the group only once 3 such
            // failures from 2 different members fell within 30 s; else its route alone. This
            // gateway's own failures corroborate at once; with Redis, every gateway's are
            // counted too, off the request path, and rest the group when they corroborate.
            (Sharing::AccountIfCorroborated, Some(c)) => {
                let now_ms = up.clock.now_ms();
                let here = up
                    .corroboration
                    .observe(cred.workspace_id, &c.group, now_ms, member_id);
                if up.persist.counts_across_gateways() {
                    let witness = Witness {
                        workspace_id: cred.workspace_id,
                        group: c.group.clone(),
                        at_ms: now_ms,
                        member_id,
                    };
                    let shared_rest = (!here).then(|| GroupRest {
                        credentials: group(&c.group),
                        targets: targets_of(c.models, upstream_model),
                        until_ms: until,
                        rule,
                        said: said.map(str::to_owned),
                    });
                    up.persist.witness(witness, shared_rest);
                }
                if here {
                    tracing::info!(credential = %cred.name, quota_group = %c.group, "ambiguous 429 corroborated; the quota group rests");
                }
                here.then_some(c)
            }
            _ => None,
        };
        let (credentials, models) = match rest {
            Some(c) => (group(&c.group), c.models),
            None => (vec![cred.id], lock.models),
        };
        rows.extend(park_targets(
            up,
            &credentials,
            &targets_of(models, upstream_model),
            until,
            rule,
        ));
        tracing::info!(credential = %cred.name, model = upstream_model, rule, until = %lock.until, "upstream credential parked");
    }
    (class.lock.as_ref().map(|l| l.until), rows)
}

/// What a lock of `models` parks on a credential after a failure of `upstream_model`.
fn targets_of(models: LockModels, upstream_model: &str) -> Vec<LockTarget> {
    let mut targets = vec![match models {
        LockModels::One => LockTarget::Model(upstream_model.to_owned()),
        LockModels::AllFree => LockTarget::AllFree,
        LockModels::All => LockTarget::Credential,
    }];
    if models == LockModels::AllFree && !classify::is_free_model(upstream_model) {
        targets.push(LockTarget::Model(upstream_model.to_owned()));
    }
    targets
}

/// Rests a quota group whose ambiguous failures corroborated across gateways, as [`park`]
/// would have when the failure was seen: extend-only, persisted and recorded off the request
/// path (and so published to the other gateways).
pub fn rest_group(up: Upstreams<'_>, rest: GroupRest) {
    let rows = park_targets(up, &rest.credentials, &rest.targets, rest.until_ms, rest.rule);
    persist(up, rows, None, rest.rule, rest.said.as_deref());
}

/// Parks each of `targets` on each of `credentials` in memory (extend-only): the rows written.
fn park_targets(
    up: Upstreams<'_>,
    credentials: &[i64],
    targets: &[LockTarget],
    until: i64,
    rule: &str,
) -> Written {
    targets
        .iter()
        .flat_map(|t| up.locks.park(credentials, t, until, rule))
        .collect()
}

/// Locks written in memory, to persist: (credential, target, entry).
pub(super) type Written = Vec<(i64, LockTarget, LockEntry)>;

pub(super) fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
