//! Classification of upstream failures (kRouter's rule order, seed 000; groot ADR 0008, seed 001).
//!
//! [`classify`] is a pure function of one failed upstream response (status, headers, body,
//! provider, model, the clock and the credential's backoff level). It answers three questions:
//! what to park ([`Lock::models`] and [`Lock::sharing`]), until when ([`Lock::until`]), and where
//! the request goes now ([`NextStep`]). The checks run in kRouter's order and stop at the first
//! match:
//!
//! 1. monthly holds on the whole credential (Copilot 402, Anthropic spend caps);
//! 2. OpenRouter's free daily cap on an OpenRouter credential's 429 (every free model at once);
//! 3. a reset time the provider names (every named reset, the earliest), capped at 6 h, for any
//!    status — after Google's per-day quotas (midnight Pacific, `classify/google.rs`), and before
//!    its per-minute quotas that name no delay; then Bedrock's error types that have a rule of
//!    their own (`classify/bedrock.rs`);
//! 4. a 429 worded like a rate limit that names no reset: 90 s, unless the wording puts the reset
//!    hours or days away (then the table's backoff);
//! 5. the table: text rules first (account-wide, Kiro's monthly limit, no capacity, model gone,
//!    prompt too long, credential-shaped 4xx, overloaded/capacity), then the status code.
//!
//! Whatever rule matched, no hold is shorter than the wait the provider told the client to
//! observe (`Retry-After`, `retry-after-ms`, Gemini's `RetryInfo`), up to the 6 h cap
//! ([`named_wait`]). The durations are seed 000's, on a quota group's shared rest too: groot's
//! "up to 300 s" (seed 001) is not taken (DESIGN.md §6; the reason is in `dispatch/park.rs`).
//!
//! A new rule is one named function (or one named branch of the table) in this order, plus one
//! row in the table test (`classify/tests.rs`).
//!
//! Whether credentials of one quota group rest together is groot's question ([`Sharing`]); the
//! corroboration state an ambiguous 429 needs lives with the caller (`corroboration.rs`), which
//! keeps this pure.
//!
//! The caller bounds the body it reads from upstream; the whole of `body` is examined.

mod bedrock;
mod evidence;
mod google;
mod times;
mod verdict;

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::Value;

/// kRouter rule 3: no hold a provider names, or that its wording implies, outlasts six hours.
const RESET_CAP: TimeDelta = TimeDelta::hours(6);
/// kRouter rule 1: a named monthly date further away than this is not believed.
const MONTHLY_HORIZON: TimeDelta = TimeDelta::days(32);
/// kRouter rule 2: a free-daily reset further away than this is not believed.
const FREE_DAILY_HORIZON: TimeDelta = TimeDelta::hours(25);
/// kRouter rule 2: a free-daily reset already past is tried again after a minute.
const FREE_DAILY_RETRY: TimeDelta = TimeDelta::minutes(1);
/// kRouter rule 4: a per-minute window has cleared after 90 seconds.
const RATE_LIMIT_GUESS: TimeDelta = TimeDelta::seconds(90);
/// kRouter rule 4 veto: a reset worded at least this far away is not a per-minute window.
const HOURS_OR_DAYS_AWAY: TimeDelta = TimeDelta::hours(1);
/// kRouter rule 5: 401/402/403/404 and the credential-shaped 4xx.
const AUTH_OR_NOT_FOUND_HOLD: TimeDelta = TimeDelta::minutes(2);
/// kRouter rule 5: 500 to 504 (and kRouter's old default for anything unrecognised).
const SERVER_ERROR_HOLD: TimeDelta = TimeDelta::seconds(30);
/// kRouter rule 5: "no capacity available" naming no reset.
const NO_CAPACITY_HOLD: TimeDelta = TimeDelta::seconds(5);
/// kRouter rule 5: suspended, deactivated, "verify your account".
const ACCOUNT_WIDE_HOLD: TimeDelta = TimeDelta::hours(24);
/// kRouter rule 5: Kiro's monthly limit, the first time since the credential's last success.
const KIRO_MONTHLY_HOLD: TimeDelta = TimeDelta::days(30);
/// kRouter rule 5: the backoff ceiling, five minutes.
const BACKOFF_CEILING_SECS: i64 = 300;

/// kRouter rule 4: the wording of a per-minute rate limit, the seed's three phrases exactly.
/// OpenRouter's provider-side "temporarily rate-limited upstream" is not among them: it takes the
/// table's short backoff.
const RATE_LIMIT_WORDING: &[&str] = &["rate limit", "too many requests", "quota reached"];
/// kRouter rule 5: text that takes the whole credential out and marks it banned.
const ACCOUNT_WIDE_WORDING: &[&str] = &["suspended", "deactivated", "verify your account"];
/// kRouter rule 5: Kiro's monthly limit (`ServiceQuotaExceededException`, reason
/// `MONTHLY_REQUEST_COUNT`, "You have reached the limit."); "reached the limit" matches any
/// provider's error, as in kRouter.
const KIRO_MONTHLY_WORDING: &[&str] = &["monthly_request_count", "reached the limit"];
/// kRouter rule 5: the prompt does not fit this model; another model may take it.
const PROMPT_TOO_LONG_WORDING: &[&str] = &[
    "prompt is too long",
    "context_length_exceeded",
    "maximum context length",
];
/// kRouter rule 5: 4xx worded about the credential, not the request.
const CREDENTIAL_SHAPED_WORDING: &[&str] = &[
    "credit balance is too low",
    "api key not valid",
    "api_key_invalid",
    "user location is not supported",
];
/// kRouter rule 1: Anthropic's own spend limit (400) in its two wordings.
const ANTHROPIC_SPEND_LIMIT_WORDING: &[&str] = &[
    "you have reached your specified api usage limits",
    "you have reached your specified workspace api usage limits",
];

pub use super::worded_reset::parse_worded_wait;
pub use crate::provider::Provider;
pub use times::{
    first_of_next_month_utc, next_utc_midnight, parse_go_duration, parse_named_date, parse_reset_value,
    parse_retry_after,
};
pub use verdict::{
    Classification, Lock, LockModels, NextStep, Rule, Sharing, UpstreamFailure, shared_quota_models,
};

use evidence::{Evidence, is_4xx, json_number};
use times::{after, epoch_number, seconds_f64};

/// Classifies one failed upstream attempt in kRouter's order (seed 000), with groot's quota
/// sharing (seed 001).
pub fn classify(f: &UpstreamFailure<'_>) -> Classification {
    // kRouter rule 5: the gateway's own "busy, try another" takes the short backoff, because the
    // slots free up in seconds. Nothing upstream answered, so no other rule can apply.
    if f.gateway_busy {
        return backoff(f, LockModels::One, Sharing::Route);
    }
    let ev = Evidence::read(f);
    let mut class = monthly_hold(f, &ev)
        .or_else(|| openrouter_free_daily(f, &ev))
        .or_else(|| google::daily_quota(f, &ev))
        .or_else(|| provider_named_reset(f, &ev))
        .or_else(|| google::per_minute_quota(f, &ev))
        .or_else(|| bedrock::aws_error(f, &ev))
        .or_else(|| rate_limit_wording(f, &ev))
        .unwrap_or_else(|| rule_table(f, &ev));
    // No rest is shorter than the wait the provider told the client to observe, up to the cap.
    if let (Some(lock), Some(wait)) = (&mut class.lock, named_wait(f, &ev)) {
        lock.until = lock.until.max(wait);
    }
    class
}

/// The wait the provider told the client to observe before retrying — `Retry-After` (seconds or
/// an HTTP-date), `retry-after-ms`, Gemini's `RetryInfo.retryDelay` — the latest still ahead,
/// capped at 6 h. No rest is shorter: RFC 9110 makes it the wait before a follow-up request,
/// Anthropic says earlier retries will fail, and seeds 002 and 004 read it as a minimum ("never
/// retry a 429 sooner than it says"). A departure from kRouter rule 3, which takes the earliest
/// of every named reset, window resets included: a window reset (`x-ratelimit-reset-*`) still
/// counts at its earliest, but never cuts this wait short. A date rules 1 and 2 do not believe
/// (a monthly date over 32 days away, a free-daily reset over 25 h away) is a window's date, not
/// this wait, and 6 h bounds it as every named reset (DESIGN.md §6).
fn named_wait(f: &UpstreamFailure<'_>, ev: &Evidence) -> Option<DateTime<Utc>> {
    retry_instructions(f, ev)
        .into_iter()
        .filter(|at| *at > f.now)
        .max()
        .map(|at| at.min(after(f.now, RESET_CAP)))
}

/// Every `Retry-After`, `retry-after-ms` and Gemini `RetryInfo.retryDelay` of the failure, past
/// or not.
fn retry_instructions(f: &UpstreamFailure<'_>, ev: &Evidence) -> Vec<DateTime<Utc>> {
    let mut waits = Vec::new();
    for (name, value) in &ev.headers {
        match name.as_str() {
            "retry-after" => waits.extend(parse_retry_after(value, f.now)),
            "retry-after-ms" => waits.extend(
                value
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .and_then(|ms| seconds_f64(ms / 1000.0))
                    .map(|wait| after(f.now, wait)),
            ),
            _ => {}
        }
    }
    waits.extend(gemini_retry_delay(f.now, ev));
    waits
}

/// DESIGN.md §9: an upstream answer that is not what its endpoint promises is classified like a
/// 5xx (kRouter rule 5's 30 s on that model, next credential): the upstream is broken, not the
/// request and not the account.
pub fn invalid_response(now: DateTime<Utc>) -> Classification {
    Classification::hold(
        Rule::InvalidResponse,
        LockModels::One,
        Sharing::Route,
        after(now, SERVER_ERROR_HOLD),
        NextStep::NextCredential,
    )
}

/// kRouter rule 1: the two monthly allowances, held on the whole credential.
fn monthly_hold(f: &UpstreamFailure<'_>, ev: &Evidence) -> Option<Classification> {
    // kRouter rule 1: Copilot's 402 "additional usage limit" holds until 00:00 UTC on the 1st.
    if f.status == 402 && ev.says("additional usage limit") {
        return Some(Classification::hold(
            Rule::MonthlyCopilot,
            LockModels::All,
            Sharing::Account,
            first_of_next_month_utc(f.now),
            NextStep::NextCredential,
        ));
    }
    let spend_cap = is_4xx(f.status)
        && (ev.says("enforced_spend_limit_reached") || ev.says_any(ANTHROPIC_SPEND_LIMIT_WORDING));
    if !spend_cap {
        return None;
    }
    let until = match parse_named_date(ev.message().unwrap_or(f.body)) {
        // kRouter rule 1: a date already past holds nothing; the error is handled like any other.
        Some(date) if date <= f.now => return None,
        // kRouter rule 1: the named date, if no more than 32 days away.
        Some(date) if date - f.now <= MONTHLY_HORIZON => date,
        // kRouter rule 1: otherwise (or no date at all) 00:00 UTC on the 1st of next month.
        _ => first_of_next_month_utc(f.now),
    };
    Some(Classification::hold(
        Rule::MonthlyAnthropicSpendCap,
        LockModels::All,
        Sharing::Account,
        until,
        NextStep::NextCredential,
    ))
}

/// kRouter rule 2: OpenRouter's free daily cap, shared by every free model of the account.
fn openrouter_free_daily(f: &UpstreamFailure<'_>, ev: &Evidence) -> Option<Classification> {
    // kRouter rule 2: "on kRouter's OpenRouter provider, a 429 that mentions free-models-per-day":
    // the same words from another provider, or on another status, fall through to the rules
    // below. Only the daily cap; `free-models-per-min` falls through too.
    let daily_cap = f.provider == Provider::OpenRouter && f.status == 429 && ev.says("free-models-per-day");
    if !daily_cap {
        return None;
    }
    let named = ev
        .header("x-ratelimit-reset")
        .and_then(|value| parse_reset_value(value, f.now));
    let until = match named {
        // kRouter rule 2: a reset already past is tried again after a minute.
        Some(at) if at <= f.now => after(f.now, FREE_DAILY_RETRY),
        // kRouter rule 2: OpenRouter's X-RateLimit-Reset, if no more than 25 h away.
        Some(at) if at - f.now <= FREE_DAILY_HORIZON => at,
        // kRouter rule 2: absent or too far: the next 00:00 UTC.
        _ => next_utc_midnight(f.now),
    };
    // groot ADR 0008: the daily allowance is the account's, so the whole quota group rests.
    Some(Classification::hold(
        Rule::OpenRouterFreeDaily,
        LockModels::AllFree,
        Sharing::Account,
        until,
        NextStep::NextCredential,
    ))
}

/// kRouter rule 3: a reset the provider names, for any status: the earliest still ahead among
/// all of them, capped at 6 h (and never before the provider's retry instruction: [`classify`]
/// applies [`named_wait`] to every rule).
fn provider_named_reset(f: &UpstreamFailure<'_>, ev: &Evidence) -> Option<Classification> {
    let mut resets = retry_instructions(f, ev);
    // OpenAI sends its window headers on every answer: on an error about the request itself
    // (400, 413, 422) they name no reason to wait, and counting them would send a request that
    // cannot succeed to every other credential. A deliberate narrowing of "any status".
    if !matches!(f.status, 400 | 413 | 422) {
        resets.extend(window_resets(f, ev));
    }
    resets.extend(codex_usage_limit_resets(f.now, ev));
    let earliest = resets.into_iter().filter(|at| *at > f.now).min()?;
    let until = earliest.min(after(f.now, RESET_CAP));
    let (models, sharing) = limit_scope(f, ev);
    Some(Classification::hold(
        Rule::ProviderNamedReset,
        models,
        sharing,
        until,
        NextStep::NextCredential,
    ))
}

/// kRouter rule 3: every rate-limit window reset header, `x-ratelimit-reset*` and
/// `anthropic-ratelimit-*-reset` (requests, tokens, input-tokens, output-tokens, ...).
///
/// The seed reads the whole family on any status and takes the earliest reset among them: a
/// window's remaining count does not decide whether its reset counts.
fn window_resets(f: &UpstreamFailure<'_>, ev: &Evidence) -> Vec<DateTime<Utc>> {
    ev.headers
        .iter()
        .filter(|(name, _)| is_window_reset_header(name))
        .filter_map(|(_, value)| parse_reset_value(value, f.now))
        .collect()
}

/// Whether a (lowercase) header name is one of the window reset families kRouter rule 3 reads.
fn is_window_reset_header(name: &str) -> bool {
    name.starts_with("x-ratelimit-reset")
        || name
            .strip_prefix("anthropic-ratelimit-")
            .and_then(|rest| rest.strip_suffix("-reset"))
            .is_some_and(|window| !window.is_empty())
}

/// kRouter rule 3: Gemini's `google.rpc.RetryInfo.retryDelay` in `error.details[]`.
fn gemini_retry_delay(now: DateTime<Utc>, ev: &Evidence) -> Vec<DateTime<Utc>> {
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
        .filter(|detail| {
            detail
                .get("@type")
                .and_then(Value::as_str)
                .is_some_and(|kind| kind.ends_with("google.rpc.RetryInfo"))
        })
        .filter_map(|detail| match detail.get("retryDelay")? {
            Value::String(delay) => parse_go_duration(delay),
            // The protobuf Duration as an object: {"seconds": 37, "nanos": 0}.
            delay => {
                let seconds = delay.get("seconds").and_then(json_number).unwrap_or(0.0);
                let nanos = delay.get("nanos").and_then(json_number).unwrap_or(0.0);
                seconds_f64(seconds + nanos / 1e9)
            }
        })
        .map(|delay| after(now, delay))
        .collect()
}

/// kRouter rule 3: Codex's `usage_limit_reached` (`error.resets_at`, `error.resets_in_seconds`).
fn codex_usage_limit_resets(now: DateTime<Utc>, ev: &Evidence) -> Vec<DateTime<Utc>> {
    let Some(error) = ev.error.as_ref() else {
        return Vec::new();
    };
    let is_usage_limit = ["type", "code"]
        .iter()
        .any(|key| error.get(key).and_then(Value::as_str) == Some("usage_limit_reached"));
    if !is_usage_limit {
        return Vec::new();
    }
    let mut resets = Vec::new();
    if let Some(at) = error.get("resets_at").and_then(json_number) {
        resets.extend(epoch_number(at));
    }
    if let Some(wait) = error
        .get("resets_in_seconds")
        .and_then(json_number)
        .and_then(seconds_f64)
    {
        resets.push(after(now, wait));
    }
    resets
}

/// kRouter rule 4: a 429 worded like a rate limit that named no reset above.
fn rate_limit_wording(f: &UpstreamFailure<'_>, ev: &Evidence) -> Option<Classification> {
    if f.status != 429 || !ev.says_any(RATE_LIMIT_WORDING) {
        return None;
    }
    // kRouter rule 4 veto: the message says the reset is hours or days away ("Resets in 3h",
    // "resets in 2 days", "try again in an hour", "resets at 17:00 UTC", "try again tomorrow"):
    // not a per-minute window, so no 90 s guess; the table's backoff applies. A free-text wait is
    // not a named reset: it parks nothing by itself.
    let hours_or_days_away = parse_worded_wait(f.body, f.now).is_some_and(|wait| wait >= HOURS_OR_DAYS_AWAY);
    if hours_or_days_away {
        return None;
    }
    // kRouter rule 4: a per-minute window has cleared after 90 s.
    let (models, sharing) = limit_scope(f, ev);
    Some(Classification::hold(
        Rule::RateLimitWording,
        models,
        sharing,
        after(f.now, RATE_LIMIT_GUESS),
        NextStep::NextCredential,
    ))
}

/// kRouter rule 5: the fixed table, text rules first and then the status code.
fn rule_table(f: &UpstreamFailure<'_>, ev: &Evidence) -> Classification {
    let one_model = |rule, hold, next| {
        Classification::hold(rule, LockModels::One, Sharing::Route, after(f.now, hold), next)
    };
    // kRouter rule 5 text rule: suspension, deactivation, "verify your account" lock the whole
    // credential for 24 h and mark it banned until a connection test passes, whatever the status:
    // the wording is about the account, so a 500 saying so is believed like a 403.
    if ev.says_any(ACCOUNT_WIDE_WORDING) {
        return Classification {
            banned: true,
            ..Classification::hold(
                Rule::AccountWide,
                LockModels::All,
                Sharing::Route,
                after(f.now, ACCOUNT_WIDE_HOLD),
                NextStep::NextCredential,
            )
        };
    }
    // kRouter rule 5 text rule: Kiro's monthly limit locks the whole credential for 30 days, and
    // for 30 days more each time it comes again before a success (the credential's own count of
    // Kiro holds, which a success resets). Any provider, any status.
    if ev.says_any(KIRO_MONTHLY_WORDING) {
        return kiro_monthly(f);
    }
    // kRouter rule 5 text rule: "no capacity available" naming no reset (rule 3 took those that
    // did): 5 s on that model and stop, since another credential finds no spare capacity either.
    if ev.says("no capacity available") {
        return one_model(Rule::NoCapacity, NO_CAPACITY_HOLD, NextStep::Stop);
    }
    // kRouter rule 5 text rule: the model no longer exists: every credential would say so; park
    // it for the 404 row's 2 min and move the chain on.
    if model_gone(ev) {
        return one_model(Rule::ModelGone, AUTH_OR_NOT_FOUND_HOLD, NextStep::NextModel);
    }
    // kRouter rule 5 text rule: the prompt is too long for this model: no lock (the request is at
    // fault), no other credential, but the next model may have a longer context.
    if ev.says_any(PROMPT_TOO_LONG_WORDING) {
        return Classification::no_lock(Rule::PromptTooLong, NextStep::NextModel);
    }
    // kRouter rule 5 exemption: a 4xx about the credential (Anthropic's empty credit balance,
    // Gemini's invalid key or unsupported location): 2 min on that model, next credential.
    if is_4xx(f.status) && ev.says_any(CREDENTIAL_SHAPED_WORDING) {
        return one_model(
            Rule::CredentialShaped4xx,
            AUTH_OR_NOT_FOUND_HOLD,
            NextStep::NextCredential,
        );
    }
    // kRouter rule 5: "overloaded", "capacity" and 529 say nothing about the account: backoff on
    // this credential alone.
    if f.status == 529 || ev.says("overloaded") || ev.says("capacity") {
        return backoff(f, LockModels::One, Sharing::Route);
    }
    // kRouter rule 5: a 429 that got this far backs off; groot decides who rests with it.
    if f.status == 429 {
        let (models, sharing) = limit_scope(f, ev);
        return backoff(f, models, sharing);
    }
    match f.status {
        // kRouter rule 5: 401/402/403/404, 2 min on that model (groot: a 402 may be the account's).
        401..=404 => Classification::hold(
            Rule::AuthOrNotFound,
            LockModels::One,
            quota_sharing(f, ev),
            after(f.now, AUTH_OR_NOT_FOUND_HOLD),
            NextStep::NextCredential,
        ),
        // kRouter rule 5: any other 4xx is about the request: no lock, no other credential, but
        // the chain's next model may accept what this one refused.
        400..=499 => Classification::no_lock(Rule::RequestError, NextStep::NextModel),
        // kRouter rule 5: 500 to 504 get 30 s; other 5xx are treated alike.
        500..=599 => one_model(Rule::ServerError, SERVER_ERROR_HOLD, NextStep::NextCredential),
        // Anything else (a redirect, a 2xx carrying an error): kRouter's old 30 s default.
        _ => one_model(Rule::OtherFailure, SERVER_ERROR_HOLD, NextStep::NextCredential),
    }
}

/// kRouter rule 5: Kiro's monthly limit: 30 days on the whole credential, "longer if it happens
/// again before a success": 30 days more for each Kiro hold the credential had since its last
/// success. That count is its own ([`UpstreamFailure::kiro_holds`]), not the backoff level: the
/// level rises with every 429 and overload, so a first Kiro hold after eight overloads would
/// last 270 days; and a Kiro hold does not raise the level the next backoff reads.
fn kiro_monthly(f: &UpstreamFailure<'_>) -> Classification {
    let repeats = i32::try_from(f.kiro_holds.saturating_add(1)).unwrap_or(i32::MAX);
    let until = KIRO_MONTHLY_HOLD
        .checked_mul(repeats)
        .map_or(DateTime::<Utc>::MAX_UTC, |hold| after(f.now, hold));
    Classification {
        count_kiro_hold: true,
        ..Classification::hold(
            Rule::KiroMonthly,
            LockModels::All,
            Sharing::Route,
            until,
            NextStep::NextCredential,
        )
    }
}

/// kRouter rule 5: the model gone, in the wordings OpenAI, Anthropic, Gemini and
/// OpenAI-compatible servers use.
fn model_gone(ev: &Evidence) -> bool {
    let anthropic_not_found = ev.error_str("type") == Some("not_found_error")
        && ev.message().is_some_and(|m| m.trim_start().starts_with("model:"));
    ev.says("model_not_found")
        || ev.says("model not found")
        || (ev.says("does not exist") && ev.says("model"))
        || ev.says("is not found for api version")
        || anthropic_not_found
}

/// kRouter rule 5: exponential backoff, level owned by the credential.
fn backoff(f: &UpstreamFailure<'_>, models: LockModels, sharing: Sharing) -> Classification {
    Classification {
        bump_backoff: true,
        ..Classification::hold(
            Rule::Backoff,
            models,
            sharing,
            after(f.now, backoff_delay(f.backoff_level)),
            NextStep::NextCredential,
        )
    }
}

/// kRouter rule 5: the backoff for a credential with `level` consecutive backoff failures:
/// 2 s, 4 s, 8 s, ... reaching the five-minute ceiling on the ninth failure in a row (level 8).
pub fn backoff_delay(level: u32) -> TimeDelta {
    let seconds = if level >= 8 {
        BACKOFF_CEILING_SECS
    } else {
        (1_i64 << (level + 1)).min(BACKOFF_CEILING_SECS)
    };
    TimeDelta::seconds(seconds)
}

/// Which models and which credentials a rate-limit-shaped failure (rules 3 to 5) parks.
fn limit_scope(f: &UpstreamFailure<'_>, ev: &Evidence) -> (LockModels, Sharing) {
    // groot ADR 0008: OpenRouter's per-minute free limit is one allowance for every `:free`
    // model of the account, so they rest together (the timing is still rule 3, 4 or 5's).
    let models = if f.status == 429 && ev.says("free-models-per-min") {
        LockModels::AllFree
    } else {
        LockModels::One
    };
    (models, quota_sharing(f, ev))
}

/// groot ADR 0008: a 402 or 429 reads, in order, as X-RateLimit-* → account; a provider marker →
/// provider (this route); `error_type: rate_limit_exceeded` → account; else ambiguous.
fn quota_sharing(f: &UpstreamFailure<'_>, ev: &Evidence) -> Sharing {
    if !matches!(f.status, 402 | 429) {
        return Sharing::Route;
    }
    // groot ADR 0008: OpenRouter names its free per-minute limit; it is the platform's.
    if ev.says("free-models-per-min") {
        return Sharing::Account;
    }
    // groot ADR 0008: rate-limit headers describe an account-level (platform) limit.
    let names_account_limit = ev
        .headers
        .iter()
        .any(|(name, _)| name.starts_with("x-ratelimit-") || name.starts_with("anthropic-ratelimit-"));
    if names_account_limit {
        return Sharing::Account;
    }
    // groot ADR 0008: the upstream provider said it (OpenRouter's metadata.provider_name / raw).
    let metadata = ev.error.as_ref().and_then(|e| e.get("metadata"));
    let provider_marker = metadata.is_some_and(|m| {
        m.get("provider_name")
            .and_then(Value::as_str)
            .is_some_and(|p| !p.is_empty())
            || m.get("raw").is_some_and(|raw| !raw.is_null())
    });
    if provider_marker {
        return Sharing::Route;
    }
    // groot ADR 0008: `error_type: rate_limit_exceeded` names the account's limit.
    let candidates = [
        ev.error.as_ref().and_then(|e| e.get("error_type")),
        ev.error.as_ref().and_then(|e| e.get("type")),
        ev.error.as_ref().and_then(|e| e.get("code")),
        metadata.and_then(|m| m.get("error_type")),
        ev.top_level_error_type.as_ref(),
    ];
    if candidates
        .iter()
        .flatten()
        .any(|value| value.as_str() == Some("rate_limit_exceeded"))
    {
        return Sharing::Account;
    }
    // groot ADR 0008: ambiguous: this route now, the account only when corroborated.
    Sharing::AccountIfCorroborated
}

/// Whether a model id is one of OpenRouter's free models, which share one allowance: the `…:free`
/// variants and the `openrouter/free` router (groot ADR 0008 treats it as shared).
pub fn is_free_model(model: &str) -> bool {
    model.ends_with(":free") || model == "openrouter/free"
}

#[cfg(test)]
mod tests;
