//! Google's quota errors (`RESOURCE_EXHAUSTED` with a `google.rpc.QuotaFailure`), on a `google`
//! (Gemini's own API) or `gemini` (its OpenAI-compatible endpoint) credential: both answer the
//! same error body.
//!
//! - A violation whose `quotaId` is per day (`GenerateRequestsPerDayPerProjectPerModel-FreeTier`,
//!   `…PerDay…`) is used up until midnight Pacific time, when Google resets requests-per-day
//!   quotas (seed 002): that model parks until then, with the credential's quota group (the
//!   quota is the project's, groot ADR 0008). Checked before kRouter rule 3, because such a 429
//!   also carries a `RetryInfo.retryDelay` of seconds that would have the model retried, and
//!   refused, all day.
//! - A per-minute violation (`…PerMinute…`) that names no `retryDelay` (one that names it is
//!   kRouter rule 3's) parks the model one minute, the window's length, checked before rule 4's
//!   90 s guess.
//!
//! Everything else (`INVALID_ARGUMENT` 400: the request's fault; `API_KEY_INVALID`,
//! `PERMISSION_DENIED`: the credential's; `UNAVAILABLE` 503 and 500: transient) takes kRouter's
//! table, as on every provider.

use chrono::{DateTime, NaiveTime, TimeDelta, TimeZone, Utc};
use chrono_tz::America::Los_Angeles;
use serde_json::Value;

use super::{
    Classification, Evidence, LockModels, NextStep, Provider, Rule, Sharing, UpstreamFailure, after,
};

/// A per-minute quota's window.
const PER_MINUTE_HOLD: TimeDelta = TimeDelta::minutes(1);

/// The quota ids of every `QuotaFailure` violation in the error's details.
fn quota_ids(ev: &Evidence) -> Vec<String> {
    let Some(details) = ev
        .error
        .as_ref()
        .and_then(|e| e.get("details"))
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    details
        .iter()
        .filter(|d| {
            d.get("@type")
                .and_then(Value::as_str)
                .is_some_and(|t| t.ends_with("google.rpc.QuotaFailure"))
        })
        .filter_map(|d| d.get("violations").and_then(Value::as_array))
        .flatten()
        .filter_map(|v| v.get("quotaId").and_then(Value::as_str))
        .map(str::to_owned)
        .collect()
}

fn is_google(f: &UpstreamFailure<'_>) -> bool {
    matches!(f.provider, Provider::Google | Provider::Gemini) && f.status == 429
}

/// Seed 002: a per-day Gemini quota used up parks its model until the next midnight Pacific time.
pub(super) fn daily_quota(f: &UpstreamFailure<'_>, ev: &Evidence) -> Option<Classification> {
    if !is_google(f) || !quota_ids(ev).iter().any(|id| id.contains("PerDay")) {
        return None;
    }
    Some(Classification::hold(
        Rule::GoogleDailyQuota,
        LockModels::One,
        Sharing::Account,
        next_pacific_midnight(f.now),
        NextStep::NextCredential,
    ))
}

/// A per-minute Gemini quota that named no `retryDelay`: one minute on that model.
pub(super) fn per_minute_quota(f: &UpstreamFailure<'_>, ev: &Evidence) -> Option<Classification> {
    if !is_google(f) || !quota_ids(ev).iter().any(|id| id.contains("PerMinute")) {
        return None;
    }
    Some(Classification::hold(
        Rule::GooglePerMinuteQuota,
        LockModels::One,
        Sharing::Account,
        after(f.now, PER_MINUTE_HOLD),
        NextStep::NextCredential,
    ))
}

/// The first 00:00 in America/Los_Angeles strictly after `now` (PST or PDT, whichever is in force
/// that night: Google's daily quotas reset at midnight Pacific time, seed 002).
pub fn next_pacific_midnight(now: DateTime<Utc>) -> DateTime<Utc> {
    let today = now.with_timezone(&Los_Angeles).date_naive();
    let mut day = today;
    loop {
        day = day.succ_opt().unwrap_or(day);
        // Midnight exists on every US DST change day (the clocks move at 02:00).
        if let Some(m) = Los_Angeles
            .from_local_datetime(&day.and_time(NaiveTime::MIN))
            .earliest()
        {
            let m = m.with_timezone(&Utc);
            if m > now {
                return m;
            }
        }
        if day == today {
            // The calendar's end: nothing later to name; a day from now.
            return now + TimeDelta::days(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn midnight_pacific_follows_daylight_saving() {
        // (now UTC, next midnight Pacific in UTC)
        let cases = [
            // Winter, PST (UTC-8): midnight is 08:00 UTC.
            ("2026-01-15T10:00:00Z", "2026-01-16T08:00:00Z"),
            ("2026-01-15T07:59:59Z", "2026-01-15T08:00:00Z"),
            // Exactly at midnight: the next one, a day on.
            ("2026-01-15T08:00:00Z", "2026-01-16T08:00:00Z"),
            // Summer, PDT (UTC-7): midnight is 07:00 UTC.
            ("2026-07-01T12:00:00Z", "2026-07-02T07:00:00Z"),
            // The night before DST starts (2026-03-08 02:00 PST → 03:00 PDT): midnight of the
            // 8th is still PST.
            ("2026-03-07T20:00:00Z", "2026-03-08T08:00:00Z"),
            // During the 8th (a 23-hour day): midnight of the 9th is PDT.
            ("2026-03-08T12:00:00Z", "2026-03-09T07:00:00Z"),
            // DST ends 2026-11-01 02:00 PDT → 01:00 PST: midnight of the 1st is PDT…
            ("2026-10-31T20:00:00Z", "2026-11-01T07:00:00Z"),
            // …and of the 2nd PST, after a 25-hour day.
            ("2026-11-01T10:00:00Z", "2026-11-02T08:00:00Z"),
            // Across the year's end.
            ("2026-12-31T23:00:00Z", "2027-01-01T08:00:00Z"),
        ];
        for (now, want) in cases {
            let now: DateTime<Utc> = now.parse().unwrap();
            assert_eq!(
                next_pacific_midnight(now).to_rfc3339(),
                want.parse::<DateTime<Utc>>().unwrap().to_rfc3339(),
                "{now}"
            );
        }
    }
}
