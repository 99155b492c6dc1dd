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
//! row in the table test below.
//!
//! Whether credentials of one quota group rest together is groot's question ([`Sharing`]); the
//! corroboration state an ambiguous 429 needs lives with the caller (`corroboration.rs`), which
//! keeps this pure.
//!
//! The caller bounds the body it reads from upstream; the whole of `body` is examined.

mod bedrock;
mod google;

use std::sync::LazyLock;

use chrono::{DateTime, Datelike, NaiveDate, NaiveTime, TimeDelta, Utc};
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

/// One failed upstream attempt, everything the classifier may look at.
///
/// The rules match on the provider's wording rather than on [`Provider`], so an Anthropic- or
/// OpenRouter-shaped error that arrives through an OpenAI-compatible relay is read the same way.
#[derive(Clone, Copy, Debug)]
pub struct UpstreamFailure<'a> {
    /// The HTTP status the provider answered (the gateway's own busy failure uses 503).
    pub status: u16,
    /// The response headers.
    pub headers: &'a http::HeaderMap,
    /// The response body, as read (JSON or not).
    pub body: &'a str,
    /// The credential's provider kind.
    pub provider: Provider,
    /// The upstream model name that failed.
    pub model: &'a str,
    /// The instant the failure was seen; every lock end is computed from it.
    pub now: DateTime<Utc>,
    /// The credential's consecutive backoff failures so far (0 after a success).
    pub backoff_level: u32,
    /// The credential's Kiro monthly holds since its last success (kRouter rule 5's own count,
    /// apart from the backoff level).
    pub kiro_holds: u32,
    /// The gateway's own "credential busy, try another": no slot came free in time.
    pub gateway_busy: bool,
}

/// The headers of a failure that never reached upstream.
static NO_HEADERS: LazyLock<http::HeaderMap> = LazyLock::new(http::HeaderMap::new);

impl<'a> UpstreamFailure<'a> {
    /// The gateway's own busy failure: the credential's in-flight limit was full and no slot came
    /// free in time. Classified as kRouter's short backoff, never as an upstream answer.
    pub fn gateway_busy(provider: Provider, model: &'a str, now: DateTime<Utc>, backoff_level: u32) -> Self {
        Self {
            status: 503,
            headers: LazyLock::force(&NO_HEADERS),
            body: "credential busy, try another",
            provider,
            model,
            now,
            backoff_level,
            kiro_holds: 0,
            gateway_busy: true,
        }
    }

    /// A deadline passed while the upstream kept the gateway waiting: no response head, or a body
    /// that stalled (DESIGN.md §9). Classified as the upstream's own 504 would be: kRouter rule 5's
    /// server error, 30 s on that model, the next credential.
    pub fn timed_out(provider: Provider, model: &'a str, now: DateTime<Utc>, backoff_level: u32) -> Self {
        Self {
            status: 504,
            headers: LazyLock::force(&NO_HEADERS),
            body: "",
            provider,
            model,
            now,
            backoff_level,
            kiro_holds: 0,
            gateway_busy: false,
        }
    }
}

/// The rule that decided a classification, in kRouter's check order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// kRouter rule 1: Copilot's 402 "additional usage limit", held until the 1st.
    MonthlyCopilot,
    /// kRouter rule 1: Anthropic's tier spend cap (429) or own spend limit (400).
    MonthlyAnthropicSpendCap,
    /// kRouter rule 2: OpenRouter's `free-models-per-day`.
    OpenRouterFreeDaily,
    /// kRouter rule 3: a reset the provider named in a header or in the body.
    ProviderNamedReset,
    /// Gemini's per-day quota used up: until midnight Pacific time (`classify/google.rs`).
    GoogleDailyQuota,
    /// Gemini's per-minute quota naming no delay: a minute (`classify/google.rs`).
    GooglePerMinuteQuota,
    /// Bedrock's `ThrottlingException`: a minute on that model (`classify/bedrock.rs`).
    AwsThrottling,
    /// Bedrock's `ServiceQuotaExceededException`: five minutes on that model, account-wide.
    AwsServiceQuota,
    /// Bedrock's keys refused (`UnrecognizedClientException`, …): the whole credential.
    AwsKeysRejected,
    /// kRouter rule 4: a 429 worded like a rate limit, naming no reset: 90 s.
    RateLimitWording,
    /// kRouter rule 5 text rule: suspended, deactivated, "verify your account", any status.
    AccountWide,
    /// kRouter rule 5 text rule: Kiro's monthly limit ("reached the limit"), any provider.
    KiroMonthly,
    /// kRouter rule 5 text rule: Google's "no capacity available", naming no reset.
    NoCapacity,
    /// kRouter rule 5 text rule: the model does not exist (on this provider).
    ModelGone,
    /// kRouter rule 5 text rule: the prompt does not fit the model's context.
    PromptTooLong,
    /// kRouter rule 5 exemption: a 4xx worded about the credential (credit, key, location).
    CredentialShaped4xx,
    /// kRouter rule 5: remaining 429s, overloaded, capacity, 529, the gateway's busy.
    Backoff,
    /// kRouter rule 5: 401, 402, 403, 404.
    AuthOrNotFound,
    /// kRouter rule 5: 500 to 599.
    ServerError,
    /// kRouter rule 5: any other 4xx, a complaint about the request.
    RequestError,
    /// A status outside 4xx/5xx (e.g. a redirect): kRouter's old 30 s default.
    OtherFailure,
    /// DESIGN.md §9: an answer that is not what the endpoint promises (a success that is not
    /// its JSON, a status outside 100–599), held like a 5xx.
    InvalidResponse,
}

impl Rule {
    /// The rule's stable snake_case name, for logs and metrics labels.
    pub fn name(&self) -> &'static str {
        match self {
            Rule::MonthlyCopilot => "monthly_copilot",
            Rule::MonthlyAnthropicSpendCap => "monthly_anthropic_spend_cap",
            Rule::OpenRouterFreeDaily => "openrouter_free_daily",
            Rule::ProviderNamedReset => "provider_named_reset",
            Rule::GoogleDailyQuota => "google_daily_quota",
            Rule::GooglePerMinuteQuota => "google_per_minute_quota",
            Rule::AwsThrottling => "aws_throttling",
            Rule::AwsServiceQuota => "aws_service_quota",
            Rule::AwsKeysRejected => "aws_keys_rejected",
            Rule::RateLimitWording => "rate_limit_wording",
            Rule::AccountWide => "account_wide",
            Rule::KiroMonthly => "kiro_monthly",
            Rule::NoCapacity => "no_capacity",
            Rule::ModelGone => "model_gone",
            Rule::PromptTooLong => "prompt_too_long",
            Rule::CredentialShaped4xx => "credential_shaped_4xx",
            Rule::Backoff => "backoff",
            Rule::AuthOrNotFound => "auth_or_not_found",
            Rule::ServerError => "server_error",
            Rule::RequestError => "request_error",
            Rule::OtherFailure => "other_failure",
            Rule::InvalidResponse => "invalid_response",
        }
    }
}

/// Which models of a credential a lock parks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockModels {
    /// Only the model that failed.
    One,
    /// Every free model (see [`is_free_model`]: the `:free` variants and `openrouter/free`) and
    /// the model that failed: they share one allowance.
    AllFree,
    /// The whole credential, every model.
    All,
}

impl LockModels {
    /// Whether a lock of this kind, written for `failed_model`, parks `model`.
    pub fn covers(self, failed_model: &str, model: &str) -> bool {
        match self {
            LockModels::One => model == failed_model,
            LockModels::AllFree => model == failed_model || is_free_model(model),
            LockModels::All => true,
        }
    }
}

/// groot ADR 0008: the models a failure of a quota group's shared quota closes, on every
/// credential of the group — for the rest of the request that met it, and (when the failure is
/// the account's, or an ambiguous one corroborated) for every request until the rest ends. One
/// rule for both, so that the next request does not walk into the quota the last one found closed.
///
/// - A free model's failure (`failed_model` is one of [`is_free_model`]'s) closes every free model:
///   they draw on one allowance ("one key closes every free route for everyone"). Paid models of
///   the same keys are off that quota (groot: "a run still moves to … a paid model") and keep
///   serving.
/// - Any other failure closes every model of the group: the group is, by its definition, one
///   account quota (DESIGN.md §3), and each of its models draws on it.
pub fn shared_quota_models(models: LockModels, failed_model: &str) -> LockModels {
    match models {
        LockModels::All => LockModels::All,
        _ if is_free_model(failed_model) => LockModels::AllFree,
        // OpenRouter's free per-minute wording on a model not named free: the free allowance.
        LockModels::AllFree => LockModels::AllFree,
        LockModels::One => LockModels::All,
    }
}

/// Which credentials a lock applies to (groot ADR 0008).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sharing {
    /// This credential only.
    Route,
    /// Every credential in this credential's quota group (this one alone if it has none).
    Account,
    /// This credential now; every credential in its quota group once the caller has seen the
    /// failure corroborated (3 such failures from 2 different members within 30 s on
    /// the same quota group; see `corroboration.rs`).
    AccountIfCorroborated,
}

/// What to park and until when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lock {
    /// Which models of a credential are parked.
    pub models: LockModels,
    /// Which credentials are parked.
    pub sharing: Sharing,
    /// The instant the lock ends; a concurrent writer only ever extends it.
    pub until: DateTime<Utc>,
}

/// Where the request goes after this failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NextStep {
    /// The provider's next credential for the same model, then the chain's next model.
    NextCredential,
    /// Skip the other credentials: every one would give the same answer. The fallback chain moves
    /// on to its next model.
    NextModel,
    /// Return this error to the client: neither another credential nor another model is tried.
    Stop,
}

/// The decision for one failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classification {
    /// The rule that matched, for logs.
    pub rule: Rule,
    /// What to park and until when; `None` writes no lock.
    pub lock: Option<Lock>,
    /// Where the request goes now.
    pub next: NextStep,
    /// Mark the credential banned: out of rotation until a connection test passes, even after its
    /// lock ran out.
    pub banned: bool,
    /// Bump the credential's backoff level by one (the caller resets it on a success).
    pub bump_backoff: bool,
    /// Count one more Kiro monthly hold of the credential (the caller resets the count on a
    /// success).
    pub count_kiro_hold: bool,
}

impl Classification {
    fn hold(rule: Rule, models: LockModels, sharing: Sharing, until: DateTime<Utc>, next: NextStep) -> Self {
        Self {
            rule,
            lock: Some(Lock {
                models,
                sharing,
                until,
            }),
            next,
            banned: false,
            bump_backoff: false,
            count_kiro_hold: false,
        }
    }

    fn no_lock(rule: Rule, next: NextStep) -> Self {
        Self {
            rule,
            lock: None,
            next,
            banned: false,
            bump_backoff: false,
            count_kiro_hold: false,
        }
    }
}

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

/// What the classifier reads out of a failure, once.
struct Evidence {
    /// The body, ASCII-lowercased (byte offsets equal the body's).
    text: String,
    /// The body's `error` object (the first element's, when the body is an array).
    error: Option<Value>,
    /// A top-level `error_type` (groot's field name), if any.
    top_level_error_type: Option<Value>,
    /// Response headers and OpenRouter's `error.metadata.headers`, names lowercased; the body's
    /// come first.
    headers: Vec<(String, String)>,
}

impl Evidence {
    fn read(f: &UpstreamFailure<'_>) -> Self {
        let json = serde_json::from_str::<Value>(f.body)
            .ok()
            .map(|value| match value {
                Value::Array(mut items) if !items.is_empty() => items.swap_remove(0),
                other => other,
            });
        let mut error = None;
        let mut top_level_error_type = None;
        if let Some(Value::Object(mut top)) = json {
            top_level_error_type = top.remove("error_type");
            error = top.remove("error").filter(Value::is_object);
        }
        let mut headers = Vec::new();
        if let Some(Value::Object(body_headers)) = error
            .as_ref()
            .and_then(|e| e.get("metadata"))
            .and_then(|m| m.get("headers"))
        {
            for (name, value) in body_headers {
                let value = match value {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    _ => continue,
                };
                headers.push((name.to_ascii_lowercase(), value));
            }
        }
        for (name, value) in f.headers {
            if let Ok(value) = value.to_str() {
                headers.push((name.as_str().to_owned(), value.to_owned()));
            }
        }
        Self {
            text: f.body.to_ascii_lowercase(),
            error,
            top_level_error_type,
            headers,
        }
    }

    /// The first value of a header (name in lowercase).
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the body contains `needle` (given in lowercase), case-insensitively.
    fn says(&self, needle: &str) -> bool {
        self.text.contains(needle)
    }

    fn says_any(&self, needles: &[&str]) -> bool {
        needles.iter().any(|needle| self.says(needle))
    }

    fn error_str(&self, key: &str) -> Option<&str> {
        self.error.as_ref()?.get(key)?.as_str()
    }

    /// The error's message in its original case.
    fn message(&self) -> Option<&str> {
        self.error_str("message")
    }
}

fn is_4xx(status: u16) -> bool {
    (400..500).contains(&status)
}

fn json_number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// `now + wait`, saturating at the latest representable instant.
fn after(now: DateTime<Utc>, wait: TimeDelta) -> DateTime<Utc> {
    now.checked_add_signed(wait).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A non-negative number of seconds as a [`TimeDelta`]; `None` if negative, not finite, or
/// beyond about 31 years.
fn seconds_f64(seconds: f64) -> Option<TimeDelta> {
    if !seconds.is_finite() || !(0.0..=1e9).contains(&seconds) {
        return None;
    }
    Some(TimeDelta::nanoseconds((seconds * 1e9).round() as i64))
}

/// An epoch number: milliseconds from 10^12 up, seconds from 10^9 up.
fn epoch_number(n: f64) -> Option<DateTime<Utc>> {
    if !n.is_finite() || n < 0.0 {
        return None;
    }
    let millis = if n >= 1e12 { n } else { n * 1000.0 };
    DateTime::<Utc>::from_timestamp_millis(millis.round() as i64)
}

/// The next 00:00 UTC strictly after `now`.
pub fn next_utc_midnight(now: DateTime<Utc>) -> DateTime<Utc> {
    now.date_naive()
        .succ_opt()
        .map(|day| day.and_time(NaiveTime::MIN).and_utc())
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// 00:00 UTC on the 1st of the month after `now`'s.
pub fn first_of_next_month_utc(now: DateTime<Utc>) -> DateTime<Utc> {
    let (year, month) = if now.month() == 12 {
        (now.year() + 1, 1)
    } else {
        (now.year(), now.month() + 1)
    };
    NaiveDate::from_ymd_opt(year, month, 1)
        .map(|day| day.and_time(NaiveTime::MIN).and_utc())
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Reads a `Retry-After` value: delay seconds (`"30"`, leniently `"1.5"`) or an HTTP-date
/// (`"Sun, 15 Mar 2026 10:25:00 GMT"`). Returns the instant it names, past or not.
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let value = value.trim();
    if is_plain_number(value) {
        return seconds_f64(value.parse().ok()?).map(|wait| after(now, wait));
    }
    httpdate::parse_http_date(value).ok().map(DateTime::<Utc>::from)
}

/// Reads an `x-ratelimit-reset*` (or `anthropic-ratelimit-*-reset`) value. Returns the instant it
/// names, past or not. Accepted forms:
/// - a number: epoch milliseconds from 10^12 up, epoch seconds from 10^9 up, below that a delay in
///   seconds (`"33011.38"`), since no provider means a date in 1970;
/// - an OpenAI/Go duration: `"6m0s"`, `"1s"`, `"20ms"`, `"1h2m3.5s"`;
/// - an RFC 3339 date (`"2026-03-15T10:21:00Z"`, Anthropic) or an HTTP-date.
pub fn parse_reset_value(value: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let value = value.trim();
    if is_plain_number(value) {
        let n: f64 = value.parse().ok()?;
        return if n >= 1e9 {
            epoch_number(n)
        } else {
            seconds_f64(n).map(|wait| after(now, wait))
        };
    }
    if let Some(wait) = parse_go_duration(value) {
        return Some(after(now, wait));
    }
    if let Ok(at) = DateTime::parse_from_rfc3339(value) {
        return Some(at.with_timezone(&Utc));
    }
    httpdate::parse_http_date(value).ok().map(DateTime::<Utc>::from)
}

fn is_plain_number(value: &str) -> bool {
    value.bytes().any(|b| b.is_ascii_digit())
        && value.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && value.bytes().filter(|b| *b == b'.').count() <= 1
}

/// Reads a Go-style duration as OpenAI's reset headers and protobuf's JSON Duration write it:
/// `"6m0s"`, `"1s"`, `"20ms"`, `"1h2m3.5s"`, `"37s"`, `"0"`. Units h, m, s, ms, us (µs), ns;
/// no sign, no spaces.
pub fn parse_go_duration(value: &str) -> Option<TimeDelta> {
    let mut rest = value.trim();
    if rest == "0" {
        return Some(TimeDelta::zero());
    }
    if rest.is_empty() {
        return None;
    }
    let mut nanos = 0.0_f64;
    while !rest.is_empty() {
        let number_len = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let number: f64 = rest.get(..number_len)?.parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3.6e12,
            "m" => 6e10,
            "s" => 1e9,
            "ms" => 1e6,
            "us" | "µs" | "μs" => 1e3,
            "ns" => 1.0,
            _ => return None,
        };
        nanos += number * scale;
        rest = &rest[unit_len..];
    }
    seconds_f64(nanos / 1e9)
}

/// Reads the date an Anthropic spend-limit message names ("You will regain access on 2026-04-01
/// at 00:00 UTC."): the first `YYYY-MM-DD` after "regain access on" (or anywhere, if that phrase
/// is missing), with the time from `THH:MM:SSZ` (RFC 3339) or ` at HH:MM`, else 00:00 UTC.
pub fn parse_named_date(text: &str) -> Option<DateTime<Utc>> {
    let lower = text.to_ascii_lowercase();
    let from = lower.find("regain access on").unwrap_or(0);
    let bytes = text.as_bytes();
    let start = (from..bytes.len().saturating_sub(9)).find(|&i| is_iso_date(&bytes[i..i + 10]))?;
    let day = NaiveDate::parse_from_str(&text[start..start + 10], "%Y-%m-%d").ok()?;
    let rest = &text[start + 10..];
    if rest.starts_with(['T', 't']) {
        let token_len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, ':' | '.' | '+' | '-')))
            .unwrap_or(rest.len());
        let token = format!(
            "{}{}",
            &text[start..start + 10],
            rest[..token_len].trim_end_matches('.')
        );
        if let Ok(at) = DateTime::parse_from_rfc3339(&token) {
            return Some(at.with_timezone(&Utc));
        }
    }
    let time = rest
        .strip_prefix(" at ")
        .and_then(|clock| {
            let hh_mm = clock.get(..5)?;
            NaiveTime::parse_from_str(hh_mm, "%H:%M").ok()
        })
        .unwrap_or(NaiveTime::MIN);
    Some(day.and_time(time).and_utc())
}

fn is_iso_date(b: &[u8]) -> bool {
    b.len() == 10
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            _ => c.is_ascii_digit(),
        })
}

/// Whether a model id is one of OpenRouter's free models, which share one allowance: the `…:free`
/// variants and the `openrouter/free` router (groot ADR 0008 treats it as shared).
pub fn is_free_model(model: &str) -> bool {
    model.ends_with(":free") || model == "openrouter/free"
}

#[cfg(test)]
mod tests {
    use super::*;
    use LockModels::{All, AllFree, One};
    use NextStep::{NextCredential, NextModel, Stop};
    use Sharing::{Account, AccountIfCorroborated as Corroborated, Route};

    /// The default clock of a row: mid-month, mid-morning UTC.
    const NOW: &str = "2026-03-15T10:20:30Z";

    /// One failure and what the classifier must answer for it.
    #[derive(Clone, Copy)]
    struct Case {
        name: &'static str,
        provider: Provider,
        model: &'static str,
        status: u16,
        headers: &'static [(&'static str, &'static str)],
        body: &'static str,
        now: &'static str,
        backoff_level: u32,
        kiro_holds: u32,
        gateway_busy: bool,
        rule: Rule,
        /// (models, sharing, until as RFC 3339)
        lock: Option<(LockModels, Sharing, &'static str)>,
        next: NextStep,
        banned: bool,
        bump_backoff: bool,
        count_kiro_hold: bool,
    }

    /// The inputs every row starts from; the expectations (rule, lock, next) are always set.
    const BASE: Case = Case {
        name: "",
        provider: Provider::OpenAi,
        model: "gpt-4o-mini",
        status: 0,
        headers: &[],
        body: "",
        now: NOW,
        backoff_level: 0,
        kiro_holds: 0,
        gateway_busy: false,
        rule: Rule::OtherFailure,
        lock: None,
        next: NextCredential,
        banned: false,
        bump_backoff: false,
        count_kiro_hold: false,
    };

    // Real error shapes, by provider.
    const COPILOT_ADDITIONAL_USAGE: &str = r#"{"error":{"message":"You've reached your additional usage limit for your plan. Go to https://github.com/settings/copilot/features for more details.","code":"quota_exceeded"}}"#;
    const ANTHROPIC_TIER_CAP_APR_10: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your API usage limits: your organization has crossed its monthly API usage threshold, set based on your organization's API tier. You will regain access on 2026-04-10 at 00:00 UTC.","details":{"error_code":"enforced_spend_limit_reached"}},"request_id":"req_018EeWyXxfu5pfWkrYcMdjWG"}"#;
    const ANTHROPIC_TIER_CAP_MAY_1: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your API usage limits: your organization has crossed its monthly API usage threshold, set based on your organization's API tier. You will regain access on 2026-05-01 at 00:00 UTC.","details":{"error_code":"enforced_spend_limit_reached"}},"request_id":"req_018EeWyXxfu5pfWkrYcMdjWG"}"#;
    const ANTHROPIC_TIER_CAP_PAST: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your API usage limits: your organization has crossed its monthly API usage threshold, set based on your organization's API tier. You will regain access on 2026-03-01 at 00:00 UTC.","details":{"error_code":"enforced_spend_limit_reached"}},"request_id":"req_018EeWyXxfu5pfWkrYcMdjWG"}"#;
    const ANTHROPIC_TIER_CAP_NO_DATE: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your API usage limits: your organization has crossed its monthly API usage threshold.","details":{"error_code":"enforced_spend_limit_reached"}},"request_id":"req_018EeWyXxfu5pfWkrYcMdjWG"}"#;
    const ANTHROPIC_OWN_LIMIT: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"You have reached your specified API usage limits. You will regain access on 2026-04-01 at 00:00 UTC."},"request_id":"req_011CZLrUfBVkVHn5T6EqQaf7"}"#;
    const ANTHROPIC_WORKSPACE_LIMIT: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"You have reached your specified workspace API usage limits. You will regain access on 2026-03-20 at 12:00 UTC."},"request_id":"req_011CZU9ocxah4cy6JURKXhnn"}"#;
    const ANTHROPIC_OWN_LIMIT_PAST: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"You have reached your specified API usage limits. You will regain access on 2026-03-01 at 00:00 UTC."},"request_id":"req_011CZLrVFahaMRBtV6YDxYiH"}"#;
    const ANTHROPIC_RATE_LIMIT: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization (a1b2c3) of 50 requests per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits."},"request_id":"req_011CUaS4b1XkQ"}"#;
    const ANTHROPIC_OVERLOADED: &str = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011CUaT9x2"}"#;
    const ANTHROPIC_CREDIT_LOW: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."},"request_id":"req_011CUaV7"}"#;
    const ANTHROPIC_PROMPT_TOO_LONG: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 212345 tokens > 200000 maximum"},"request_id":"req_011CUaW1"}"#;
    const ANTHROPIC_MODEL_GONE: &str = r#"{"type":"error","error":{"type":"not_found_error","message":"model: claude-3-opus-20240229"},"request_id":"req_011CUaX3"}"#;
    const ANTHROPIC_NOT_FOUND: &str = r#"{"type":"error","error":{"type":"not_found_error","message":"Not found"},"request_id":"req_011CUaX4"}"#;
    const ANTHROPIC_PERMISSION: &str = r#"{"type":"error","error":{"type":"permission_error","message":"Your API key does not have permission to use the specified resource."},"request_id":"req_011CUaX5"}"#;
    const ANTHROPIC_API_ERROR: &str = r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"},"request_id":"req_011CUaX6"}"#;
    const OPENROUTER_FREE_DAY: &str = r#"{"error":{"message":"Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free model requests per day","code":429,"metadata":{"headers":{"X-RateLimit-Limit":"50","X-RateLimit-Remaining":"0","X-RateLimit-Reset":"1767225600000"},"provider_name":null}}}"#;
    const OPENROUTER_FREE_DAY_NO_RESET: &str = r#"{"error":{"message":"Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free model requests per day","code":429}}"#;
    const OPENROUTER_FREE_DAY_FAR: &str = r#"{"error":{"message":"Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free model requests per day","code":429,"metadata":{"headers":{"X-RateLimit-Limit":"50","X-RateLimit-Remaining":"0","X-RateLimit-Reset":"1773705600000"},"provider_name":null}}}"#;
    const OPENROUTER_FREE_MIN: &str = r#"{"error":{"message":"Rate limit exceeded: free-models-per-min. ","code":429,"metadata":{"headers":{"X-RateLimit-Limit":"20","X-RateLimit-Remaining":"0","X-RateLimit-Reset":"1773570070000"},"provider_name":null}}}"#;
    const OPENROUTER_UPSTREAM: &str = r#"{"error":{"message":"Provider returned error","code":429,"metadata":{"raw":"meta-llama/llama-3.3-70b-instruct:free is temporarily rate-limited upstream. Please retry shortly, or add your own key to accumulate your rate limits: https://openrouter.ai/settings/integrations","provider_name":"Venice"}},"user_id":"user_2yZ"}"#;
    const OPENROUTER_UPSTREAM_SHORT: &str = r#"{"error":{"message":"Provider returned error","code":429,"metadata":{"raw":"qwen/qwen3-coder:free is temporarily rate-limited upstream. Please retry shortly.","provider_name":"ModelRun"}},"user_id":"user_2yZ"}"#;
    const OPENROUTER_BARE: &str =
        r#"{"error":{"message":"Rate limit exceeded","code":429},"user_id":"user_2yZ"}"#;
    const OPENROUTER_ERROR_TYPE: &str = r#"{"error":{"message":"Provider returned error","code":429,"metadata":{"error_type":"rate_limit_exceeded"}},"user_id":"user_2yZ"}"#;
    const OPENROUTER_PLAIN_LIMIT: &str = r#"{"error":{"message":"Rate limit exceeded: limit_rpm/google/gemini-2.0-flash-exp/4d3c. High demand for google/gemini-2.0-flash-exp:free on OpenRouter - limited to 1 requests per minute.","code":429}}"#;
    const OPENROUTER_CREDITS: &str = r#"{"error":{"message":"Insufficient credits. Add more using https://openrouter.ai/settings/credits","code":402}}"#;
    const OPENAI_RATE_LIMIT_6M: &str = r#"{"error":{"message":"Rate limit reached for gpt-4o-mini in organization org-abc123 on requests per day (RPD): Limit 10000, Used 10000, Requested 1. Please try again in 6m0s. Visit https://platform.openai.com/account/rate-limits to learn more.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
    const OPENAI_RATE_LIMIT_TOKENS: &str = r#"{"error":{"message":"Rate limit reached for gpt-4o-mini in organization org-abc123 on tokens per min (TPM): Limit 200000, Used 199000, Requested 4000. Please try again in 1.2s. Visit https://platform.openai.com/account/rate-limits to learn more.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;
    const OPENAI_RATE_LIMIT_20S: &str = r#"{"error":{"message":"Rate limit reached for gpt-4o-mini in organization org-abc123 on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 20s. Visit https://platform.openai.com/account/rate-limits to learn more.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
    const OPENAI_CONTEXT: &str = r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
    const OPENAI_MODEL_GONE: &str = r#"{"error":{"message":"The model `gpt-5-turbo` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#;
    const OPENAI_BAD_KEY: &str = r#"{"error":{"message":"Incorrect API key provided: sk-proj-****abcd. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#;
    const OPENAI_DEACTIVATED: &str = r#"{"error":{"message":"Your OpenAI account has been deactivated, please check your email for more information. If you feel this is an error, contact us through our help center at help.openai.com.","type":"invalid_request_error","param":null,"code":"account_deactivated"}}"#;
    const OPENAI_BAD_PARAM: &str = r#"{"error":{"message":"Invalid type for 'temperature': expected a decimal, but got a string instead.","type":"invalid_request_error","param":"temperature","code":"invalid_type"}}"#;
    const OPENAI_SERVER_ERROR: &str = r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#;
    const VLLM_422: &str = r#"{"detail":[{"type":"missing","loc":["body","messages"],"msg":"Field required","input":{"model":"qwen2.5-72b"}}]}"#;
    const CLOUDFLARE_502: &str = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>cloudflare</center>\r\n</body>\r\n</html>";
    const GATEWAY_TIMEOUT_504: &str =
        r#"{"error":{"message":"Gateway Timeout","type":"server_error","code":504}}"#;
    const GEMINI_RETRY_INFO: &str = r#"{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details. For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier","quotaDimensions":{"location":"global","model":"gemini-2.5-flash"},"quotaValue":"10"}]},{"@type":"type.googleapis.com/google.rpc.Help","links":[{"description":"Learn more about Gemini API quotas","url":"https://ai.google.dev/gemini-api/docs/rate-limits"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"37s"}]}}"#;
    const GEMINI_EXHAUSTED: &str = r#"{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.","status":"RESOURCE_EXHAUSTED"}}"#;
    const GEMINI_NO_CAPACITY: &str = r#"{"error":{"code":429,"message":"No capacity available for model gemini-2.5-pro on the server","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"MODEL_CAPACITY_EXHAUSTED","domain":"cloudcode-pa.googleapis.com","metadata":{"model":"gemini-2.5-pro"}}]}}"#;
    const GEMINI_NO_CAPACITY_503: &str = r#"{"error":{"code":503,"message":"No capacity available for model gemini-2.5-pro on the server","status":"UNAVAILABLE"}}"#;
    const GEMINI_BAD_KEY: &str = r#"{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com","metadata":{"service":"generativelanguage.googleapis.com"}}]}}"#;
    const GEMINI_LOCATION: &str = r#"{"error":{"code":400,"message":"User location is not supported for the API use.","status":"FAILED_PRECONDITION"}}"#;
    const GEMINI_SUSPENDED: &str = r#"{"error":{"code":403,"message":"Permission denied: Consumer 'api_key:AIzaSyD-xxxx' has been suspended.","status":"PERMISSION_DENIED","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"CONSUMER_SUSPENDED","domain":"googleapis.com","metadata":{"consumer":"projects/123456","service":"generativelanguage.googleapis.com"}}]}}"#;
    const GEMINI_VERIFY: &str = r#"{"error":{"code":403,"message":"To continue, verify your account at https://accounts.google.com/signin/continue?sarp=1&scc=1&plt=AKgnsbs","status":"PERMISSION_DENIED"}}"#;
    const GEMINI_MODEL_GONE: &str = r#"{"error":{"code":404,"message":"models/gemini-1.0-pro is not found for API version v1beta, or is not supported for generateContent. Call ListModels to see the list of available models and their supported methods.","status":"NOT_FOUND"}}"#;
    const CODEX_USAGE_LIMIT: &str = r#"{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus","resets_at":1773705600,"eligible_promo":null,"resets_in_seconds":1800}}"#;
    const CODEX_USAGE_LIMIT_DAYS: &str = r#"{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus","resets_at":1773705600,"eligible_promo":null}}"#;

    // AWS Bedrock Runtime: `{"message": …}` with the type in `x-amzn-errortype`.
    const BEDROCK_THROTTLED: &str = r#"{"message":"Too many requests, please wait before trying again."}"#;
    const BEDROCK_TOKENS_THROTTLED: &str =
        r#"{"message":"Too many tokens, please wait before trying again."}"#;
    const BEDROCK_QUOTA: &str = r#"{"message":"Your request exceeds the service quota for your account. You can view your quotas at https://docs.aws.amazon.com/servicequotas/latest/userguide/gs-request-quota.html. You can resubmit your request later."}"#;
    const BEDROCK_NOT_READY: &str = r#"{"message":"Model is not ready for inference. Wait and try your request again. Refer to https://docs.aws.amazon.com/bedrock/latest/userguide/invoke-imported-model.html#handle-model-not-ready-exception."}"#;
    const BEDROCK_UNAVAILABLE: &str = r#"{"message":"Bedrock is unable to process your request."}"#;
    const BEDROCK_ACCESS_DENIED: &str =
        r#"{"message":"You don't have access to the model with the specified model ID."}"#;
    const BEDROCK_BAD_TOKEN: &str = r#"{"message":"The security token included in the request is invalid."}"#;
    const BEDROCK_VALIDATION: &str = r#"{"message":"The provided model identifier is invalid."}"#;
    const BEDROCK_TYPE_THROTTLING: &str =
        "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/";

    // Gemini's own API (`google`): the bodies generativelanguage.googleapis.com answers.
    const GOOGLE_PER_DAY: &str = r#"{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details. For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.\n* Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 250\nPlease retry in 17.227s.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier","quotaDimensions":{"location":"global","model":"gemini-2.5-flash"},"quotaValue":"250"}]},{"@type":"type.googleapis.com/google.rpc.Help","links":[{"description":"Learn more about Gemini API quotas","url":"https://ai.google.dev/gemini-api/docs/rate-limits"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"17s"}]}}"#;
    const GOOGLE_PER_MINUTE_NO_DELAY: &str = r#"{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_paid_tier_input_token_count","quotaId":"GenerateContentPaidTierInputTokensPerModelPerMinute","quotaDimensions":{"location":"global","model":"gemini-2.5-pro"},"quotaValue":"2000000"}]}]}}"#;
    const GOOGLE_PER_MINUTE_1_5S: &str = r#"{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier","quotaDimensions":{"location":"global","model":"gemini-2.5-flash"},"quotaValue":"10"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}"#;
    const GOOGLE_INVALID_ARGUMENT: &str = r#"{"error":{"code":400,"message":"* GenerateContentRequest.contents: contents is not specified\n","status":"INVALID_ARGUMENT"}}"#;
    const GOOGLE_PERMISSION_DENIED: &str = r#"{"error":{"code":403,"message":"Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.","status":"PERMISSION_DENIED"}}"#;
    const GOOGLE_UNAVAILABLE: &str = r#"{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}"#;
    const GOOGLE_INTERNAL: &str = r#"{"error":{"code":500,"message":"An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting","status":"INTERNAL"}}"#;

    const AZURE_429: &str = r#"{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 37 seconds. Go here for more details: https://aka.ms/oai/quotaincrease"}}"#;
    const AZURE_CONTENT_FILTER: &str = r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry. To learn more about our content filtering policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{"hate":{"filtered":false,"severity":"safe"},"jailbreak":{"filtered":false,"detected":false},"self_harm":{"filtered":false,"severity":"safe"},"sexual":{"filtered":false,"severity":"safe"},"violence":{"filtered":true,"severity":"high"}}}}}"#;

    const ANTHROPIC_INPUT_TOKENS_LIMIT: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization (a1b2c3) of 40,000 input tokens per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response headers for current usage. Please reduce the prompt length or the maximum tokens requested, or try again later."},"request_id":"req_011CUaS4c9"}"#;
    const KIRO_MONTHLY_LIMIT: &str =
        r#"{"message":"You have reached the limit.","reason":"MONTHLY_REQUEST_COUNT"}"#;
    const RELAY_SUSPENDED_500: &str = r#"{"error":{"message":"Your account has been suspended. Contact support to restore access.","type":"server_error","code":"account_suspended"}}"#;

    fn at(rfc3339: &str) -> DateTime<Utc> {
        match DateTime::parse_from_rfc3339(rfc3339) {
            Ok(t) => t.with_timezone(&Utc),
            Err(e) => panic!("bad instant {rfc3339:?} in a test row: {e}"),
        }
    }

    fn header_map(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).expect("test header name"),
                http::HeaderValue::from_str(value).expect("test header value"),
            );
        }
        map
    }

    fn cases() -> Vec<Case> {
        vec![
            // ---- kRouter rule 1: monthly holds ----
            Case {
                name: "copilot 402 additional usage limit holds the credential until the 1st",
                provider: Provider::OpenAiCompatible,
                model: "gpt-4.1",
                status: 402,
                body: COPILOT_ADDITIONAL_USAGE,
                rule: Rule::MonthlyCopilot,
                lock: Some((All, Account, "2026-04-01T00:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "copilot 402 in December holds until 1 January",
                provider: Provider::OpenAiCompatible,
                model: "gpt-4.1",
                status: 402,
                body: COPILOT_ADDITIONAL_USAGE,
                now: "2026-12-20T08:00:00Z",
                rule: Rule::MonthlyCopilot,
                lock: Some((All, Account, "2027-01-01T00:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "any other 402 is the 2 min row (ambiguous for groot)",
                provider: Provider::OpenAiCompatible,
                model: "gpt-4.1",
                status: 402,
                body: r#"{"error":{"message":"Payment required: this subscription is not active","code":"payment_required"}}"#,
                rule: Rule::AuthOrNotFound,
                lock: Some((One, Corroborated, "2026-03-15T10:22:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "anthropic 429 enforced_spend_limit_reached holds until the named date",
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5",
                status: 429,
                body: ANTHROPIC_TIER_CAP_APR_10,
                rule: Rule::MonthlyAnthropicSpendCap,
                lock: Some((All, Account, "2026-04-10T00:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "anthropic spend cap date more than 32 days away holds until the 1st",
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5",
                status: 429,
                body: ANTHROPIC_TIER_CAP_MAY_1,
                rule: Rule::MonthlyAnthropicSpendCap,
                lock: Some((All, Account, "2026-04-01T00:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "anthropic spend cap naming no date holds until the 1st",
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5",
                status: 429,
                body: ANTHROPIC_TIER_CAP_NO_DATE,
                rule: Rule::MonthlyAnthropicSpendCap,
                lock: Some((All, Account, "2026-04-01T00:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "a reset header a few seconds ahead cannot cut a monthly hold short",
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5",
                status: 429,
                headers: &[
                    ("retry-after", "5"),
                    ("anthropic-ratelimit-requests-remaining", "0"),
                    ("anthropic-ratelimit-requests-reset", "2026-03-15T10:20:40Z"),
                ],
                body: ANTHROPIC_TIER_CAP_APR_10,
                rule: Rule::MonthlyAnthropicSpendCap,
                lock: Some((All, Account, "2026-04-10T00:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "anthropic spend cap with a past date holds nothing and falls through (backoff)",
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5",
                status: 429,
                body: ANTHROPIC_TIER_CAP_PAST,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "anthropic 400 specified API usage limits holds until the named date",
                provider: Provider::Anthropic,
                model: "claude-opus-4-1",
                status: 400,
                body: ANTHROPIC_OWN_LIMIT,
                rule: Rule::MonthlyAnthropicSpendCap,
                lock: Some((All, Account, "2026-04-01T00:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "anthropic 400 workspace API usage limits holds until the named date and hour",
                provider: Provider::Anthropic,
                model: "claude-opus-4-1",
                status: 400,
                body: ANTHROPIC_WORKSPACE_LIMIT,
                rule: Rule::MonthlyAnthropicSpendCap,
                lock: Some((All, Account, "2026-03-20T12:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "anthropic 400 usage limits with a past date falls through to a request error",
                provider: Provider::Anthropic,
                model: "claude-opus-4-1",
                status: 400,
                body: ANTHROPIC_OWN_LIMIT_PAST,
                rule: Rule::RequestError,
                lock: None,
                next: NextModel,
                ..BASE
            },
            Case {
                name: "anthropic-shaped spend cap through an openai-compatible relay is read alike",
                provider: Provider::OpenAiCompatible,
                model: "claude-sonnet-4-5",
                status: 429,
                body: ANTHROPIC_TIER_CAP_APR_10,
                rule: Rule::MonthlyAnthropicSpendCap,
                lock: Some((All, Account, "2026-04-10T00:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            // ---- kRouter rule 2: OpenRouter's free daily cap ----
            Case {
                name: "openrouter free-models-per-day parks every :free model until the body's reset",
                provider: Provider::OpenRouter,
                model: "meta-llama/llama-3.3-70b-instruct:free",
                status: 429,
                body: OPENROUTER_FREE_DAY,
                now: "2025-12-31T13:00:00Z",
                rule: Rule::OpenRouterFreeDaily,
                lock: Some((AllFree, Account, "2026-01-01T00:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "free daily cap with no reset holds until the next 00:00 UTC",
                provider: Provider::OpenRouter,
                model: "deepseek/deepseek-r1:free",
                status: 429,
                body: OPENROUTER_FREE_DAY_NO_RESET,
                rule: Rule::OpenRouterFreeDaily,
                lock: Some((AllFree, Account, "2026-03-16T00:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "free daily cap whose reset has passed is tried again after a minute",
                provider: Provider::OpenRouter,
                model: "deepseek/deepseek-r1:free",
                status: 429,
                body: OPENROUTER_FREE_DAY,
                rule: Rule::OpenRouterFreeDaily,
                lock: Some((AllFree, Account, "2026-03-15T10:21:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "free daily cap whose reset is more than 25 h away holds until midnight",
                provider: Provider::OpenRouter,
                model: "deepseek/deepseek-r1:free",
                status: 429,
                body: OPENROUTER_FREE_DAY_FAR,
                rule: Rule::OpenRouterFreeDaily,
                lock: Some((AllFree, Account, "2026-03-16T00:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "free daily cap whose reset has passed waits out a longer Retry-After, not a minute",
                provider: Provider::OpenRouter,
                model: "deepseek/deepseek-r1:free",
                status: 429,
                headers: &[("retry-after", "3600")],
                body: OPENROUTER_FREE_DAY,
                rule: Rule::OpenRouterFreeDaily,
                lock: Some((AllFree, Account, "2026-03-15T11:20:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "free daily cap ten minutes before midnight waits out a Retry-After past it",
                provider: Provider::OpenRouter,
                model: "deepseek/deepseek-r1:free",
                status: 429,
                headers: &[("retry-after", "3600")],
                body: OPENROUTER_FREE_DAY_NO_RESET,
                now: "2026-03-15T23:50:00Z",
                rule: Rule::OpenRouterFreeDaily,
                lock: Some((AllFree, Account, "2026-03-16T00:50:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "free daily cap reads X-RateLimit-Reset from the response headers too",
                provider: Provider::OpenRouter,
                model: "deepseek/deepseek-r1:free",
                status: 429,
                headers: &[
                    ("x-ratelimit-limit", "50"),
                    ("x-ratelimit-remaining", "0"),
                    ("x-ratelimit-reset", "1773604800000"),
                ],
                body: OPENROUTER_FREE_DAY_NO_RESET,
                rule: Rule::OpenRouterFreeDaily,
                lock: Some((AllFree, Account, "2026-03-15T20:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "free-models-per-min falls through to the reset rule, all free models, account",
                provider: Provider::OpenRouter,
                model: "deepseek/deepseek-r1:free",
                status: 429,
                body: OPENROUTER_FREE_MIN,
                rule: Rule::ProviderNamedReset,
                lock: Some((AllFree, Account, "2026-03-15T10:21:10Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "free-models-per-day from a relay (not an OpenRouter credential) is no daily cap",
                provider: Provider::OpenAiCompatible,
                model: "deepseek/deepseek-r1:free",
                status: 429,
                body: OPENROUTER_FREE_DAY_NO_RESET,
                rule: Rule::RateLimitWording,
                lock: Some((One, Corroborated, "2026-03-15T10:22:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "free-models-per-day on an OpenRouter 402 is no daily cap (429 only)",
                provider: Provider::OpenRouter,
                model: "deepseek/deepseek-r1:free",
                status: 402,
                body: r#"{"error":{"message":"Insufficient credits for free-models-per-day. Add 10 credits to unlock 1000 free model requests per day","code":402}}"#,
                rule: Rule::AuthOrNotFound,
                lock: Some((One, Corroborated, "2026-03-15T10:22:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "openrouter/free at its daily cap parks every free model with it",
                provider: Provider::OpenRouter,
                model: "openrouter/free",
                status: 429,
                body: OPENROUTER_FREE_DAY_NO_RESET,
                rule: Rule::OpenRouterFreeDaily,
                lock: Some((AllFree, Account, "2026-03-16T00:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            // ---- kRouter rule 3: a reset the provider names ----
            Case {
                name: "Retry-After in seconds",
                provider: Provider::OpenAiCompatible,
                model: "llama-3.3-70b-versatile",
                status: 429,
                headers: &[("retry-after", "30")],
                body: r#"{"error":{"message":"Too Many Requests","type":"too_many_requests"}}"#,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Corroborated, "2026-03-15T10:21:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "Retry-After as an HTTP-date",
                provider: Provider::OpenAiCompatible,
                model: "llama-3.3-70b-versatile",
                status: 429,
                headers: &[("retry-after", "Sun, 15 Mar 2026 10:25:00 GMT")],
                body: r#"{"error":{"message":"Too Many Requests","type":"too_many_requests"}}"#,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Corroborated, "2026-03-15T10:25:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "a Retry-After date already past is ignored (wording rule takes it)",
                provider: Provider::OpenAiCompatible,
                model: "llama-3.3-70b-versatile",
                status: 429,
                headers: &[("retry-after", "Sun, 15 Mar 2026 10:00:00 GMT")],
                body: r#"{"error":{"message":"Too Many Requests","type":"too_many_requests"}}"#,
                rule: Rule::RateLimitWording,
                lock: Some((One, Corroborated, "2026-03-15T10:22:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "retry-after-ms (OpenAI) names a sub-second reset",
                status: 429,
                headers: &[("retry-after-ms", "1500")],
                body: OPENAI_RATE_LIMIT_TOKENS,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Account, "2026-03-15T10:20:31.500Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "a window reset before Retry-After does not cut the rest short of it",
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5",
                status: 429,
                headers: &[
                    ("retry-after", "120"),
                    ("anthropic-ratelimit-requests-remaining", "0"),
                    ("anthropic-ratelimit-requests-reset", "2026-03-15T10:20:50Z"),
                    ("anthropic-ratelimit-tokens-remaining", "0"),
                    ("anthropic-ratelimit-tokens-reset", "2026-03-15T10:21:15Z"),
                ],
                body: ANTHROPIC_RATE_LIMIT,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Account, "2026-03-15T10:22:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "Retry-After before every window reset: the earliest, as kRouter takes it",
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5",
                status: 429,
                headers: &[
                    ("retry-after", "10"),
                    ("anthropic-ratelimit-tokens-remaining", "0"),
                    ("anthropic-ratelimit-tokens-reset", "2026-03-15T10:21:15Z"),
                ],
                body: ANTHROPIC_RATE_LIMIT,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Account, "2026-03-15T10:20:40Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "Gemini's retryDelay is a wait to honour: an earlier window reset does not cut it",
                provider: Provider::Gemini,
                model: "gemini-2.5-flash",
                status: 429,
                headers: &[("x-ratelimit-reset", "5")],
                body: GEMINI_RETRY_INFO,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Account, "2026-03-15T10:21:07Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "a Retry-After days away is waited out for the 6 h cap, not the 30 s of a 503",
                provider: Provider::OpenAiCompatible,
                model: "qwen2.5-72b",
                status: 503,
                headers: &[("retry-after", "172800"), ("x-ratelimit-reset", "20")],
                body: r#"{"error":{"message":"Service Unavailable","type":"server_error"}}"#,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Route, "2026-03-15T16:20:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "anthropic-ratelimit-tokens-reset (RFC 3339) alone",
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5",
                status: 429,
                headers: &[
                    ("anthropic-ratelimit-tokens-remaining", "0"),
                    ("anthropic-ratelimit-tokens-reset", "2026-03-15T10:21:15Z"),
                ],
                body: ANTHROPIC_RATE_LIMIT,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Account, "2026-03-15T10:21:15Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "the earliest window reset counts, whatever the window has remaining",
                status: 429,
                headers: &[
                    ("x-ratelimit-limit-requests", "500"),
                    ("x-ratelimit-remaining-requests", "499"),
                    ("x-ratelimit-reset-requests", "120ms"),
                    ("x-ratelimit-limit-tokens", "200000"),
                    ("x-ratelimit-remaining-tokens", "0"),
                    ("x-ratelimit-reset-tokens", "2m0s"),
                ],
                body: OPENAI_RATE_LIMIT_TOKENS,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Account, "2026-03-15T10:20:30.120Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "OpenAI x-ratelimit-reset-requests 6m0s",
                status: 429,
                headers: &[
                    ("x-ratelimit-limit-requests", "10000"),
                    ("x-ratelimit-remaining-requests", "0"),
                    ("x-ratelimit-reset-requests", "6m0s"),
                ],
                body: OPENAI_RATE_LIMIT_6M,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Account, "2026-03-15T10:26:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "x-ratelimit-reset in epoch seconds",
                provider: Provider::OpenAiCompatible,
                model: "mistral-large-latest",
                status: 429,
                headers: &[
                    ("x-ratelimit-remaining", "0"),
                    ("x-ratelimit-reset", "1773570240"),
                ],
                body: r#"{"message":"Requests rate limit exceeded"}"#,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Account, "2026-03-15T10:24:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "a named reset is capped at 6 h",
                provider: Provider::OpenAiCompatible,
                model: "llama-3.3-70b-versatile",
                status: 429,
                headers: &[("retry-after", "86400")],
                body: r#"{"error":{"message":"Too Many Requests","type":"too_many_requests"}}"#,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Corroborated, "2026-03-15T16:20:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "a named reset works on a 503 too (any status)",
                provider: Provider::OpenAiCompatible,
                model: "qwen2.5-72b",
                status: 503,
                headers: &[("retry-after", "20")],
                body: r#"{"error":{"message":"Service Unavailable","type":"server_error"}}"#,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Route, "2026-03-15T10:20:50Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "Gemini RetryInfo.retryDelay 37s in the body",
                provider: Provider::Gemini,
                model: "gemini-2.5-flash",
                status: 429,
                body: GEMINI_RETRY_INFO,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Corroborated, "2026-03-15T10:21:07Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "Gemini's OpenAI-compatible endpoint wraps the error in an array: still read",
                provider: Provider::Gemini,
                model: "gemini-2.5-flash",
                status: 429,
                body: r#"[{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"12.5s"}]}}]"#,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Corroborated, "2026-03-15T10:20:42.500Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "Codex usage_limit_reached: resets_in_seconds is earlier than resets_at",
                provider: Provider::OpenAiCompatible,
                model: "gpt-5-codex",
                status: 429,
                body: CODEX_USAGE_LIMIT,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Corroborated, "2026-03-15T10:50:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "Codex usage_limit_reached days away is capped at 6 h",
                provider: Provider::OpenAiCompatible,
                model: "gpt-5-codex",
                status: 429,
                body: CODEX_USAGE_LIMIT_DAYS,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Corroborated, "2026-03-15T16:20:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "no capacity available with a Retry-After: the reset rule wins",
                provider: Provider::Gemini,
                model: "gemini-2.5-pro",
                status: 503,
                headers: &[("retry-after", "10")],
                body: GEMINI_NO_CAPACITY_503,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Route, "2026-03-15T10:20:40Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "window headers on a request error name no reset: prompt too long moves to the next model",
                status: 400,
                headers: &[
                    ("x-ratelimit-remaining-requests", "9999"),
                    ("x-ratelimit-reset-requests", "20ms"),
                ],
                body: OPENAI_CONTEXT,
                rule: Rule::PromptTooLong,
                lock: None,
                next: NextModel,
                ..BASE
            },
            Case {
                name: "a 503 naming a window reset (1m40s) holds 100 s, not the 5xx row's 30 s",
                status: 503,
                headers: &[
                    ("x-ratelimit-limit-requests", "10000"),
                    ("x-ratelimit-remaining-requests", "0"),
                    ("x-ratelimit-reset-requests", "1m40s"),
                ],
                body: OPENAI_SERVER_ERROR,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Route, "2026-03-15T10:22:10Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "a 500 naming an epoch x-ratelimit-reset holds until then",
                provider: Provider::OpenAiCompatible,
                model: "mistral-large-latest",
                status: 500,
                headers: &[("x-ratelimit-reset", "1773570240")],
                body: OPENAI_SERVER_ERROR,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Route, "2026-03-15T10:24:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "anthropic-ratelimit-input-tokens-reset alone is a named reset, not the 90 s guess",
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5",
                status: 429,
                headers: &[
                    ("anthropic-ratelimit-input-tokens-limit", "40000"),
                    ("anthropic-ratelimit-input-tokens-remaining", "0"),
                    ("anthropic-ratelimit-input-tokens-reset", "2026-03-15T10:21:15Z"),
                ],
                body: ANTHROPIC_INPUT_TOKENS_LIMIT,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Account, "2026-03-15T10:21:15Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "the earliest of every anthropic window (output-tokens), never before Retry-After",
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5",
                status: 429,
                headers: &[
                    ("retry-after", "60"),
                    ("anthropic-ratelimit-requests-remaining", "49"),
                    ("anthropic-ratelimit-requests-reset", "2026-03-15T10:21:30Z"),
                    ("anthropic-ratelimit-input-tokens-remaining", "0"),
                    ("anthropic-ratelimit-input-tokens-reset", "2026-03-15T10:21:15Z"),
                    ("anthropic-ratelimit-output-tokens-remaining", "7000"),
                    ("anthropic-ratelimit-output-tokens-reset", "2026-03-15T10:20:41Z"),
                ],
                body: ANTHROPIC_INPUT_TOKENS_LIMIT,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Account, "2026-03-15T10:21:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "a window reset already past is skipped; the next one ahead counts",
                status: 429,
                headers: &[
                    ("x-ratelimit-remaining-requests", "0"),
                    ("x-ratelimit-reset-requests", "2026-03-15T10:20:00Z"),
                    ("x-ratelimit-remaining-tokens", "0"),
                    ("x-ratelimit-reset-tokens", "45s"),
                ],
                body: OPENAI_RATE_LIMIT_TOKENS,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Account, "2026-03-15T10:21:15Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "a window reset 2 days away is capped at 6 h",
                status: 429,
                headers: &[
                    ("x-ratelimit-remaining-requests", "0"),
                    ("x-ratelimit-reset-requests", "48h0m0s"),
                ],
                body: OPENAI_RATE_LIMIT_6M,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Account, "2026-03-15T16:20:30Z")),
                next: NextCredential,
                ..BASE
            },
            // ---- kRouter rule 4: rate-limit wording naming no reset ----
            Case {
                name: "anthropic rate-limit wording with no reset: 90 s",
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5",
                status: 429,
                body: ANTHROPIC_RATE_LIMIT,
                rule: Rule::RateLimitWording,
                lock: Some((One, Corroborated, "2026-03-15T10:22:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "plain-text Too Many Requests: 90 s",
                provider: Provider::OpenAiCompatible,
                model: "llama-3.3-70b-versatile",
                status: 429,
                body: "Too Many Requests",
                rule: Rule::RateLimitWording,
                lock: Some((One, Corroborated, "2026-03-15T10:22:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "quota reached wording: 90 s",
                provider: Provider::OpenAiCompatible,
                model: "glm-4.6",
                status: 429,
                body: r#"{"error":{"message":"Concurrent quota reached for this API key","type":"quota_error"}}"#,
                rule: Rule::RateLimitWording,
                lock: Some((One, Corroborated, "2026-03-15T10:22:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "OpenAI 'try again in 20s' with no header is the per-minute guess, account-wide",
                status: 429,
                body: OPENAI_RATE_LIMIT_20S,
                rule: Rule::RateLimitWording,
                lock: Some((One, Account, "2026-03-15T10:22:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "'Resets in 3h' vetoes the 90 s guess: the table's backoff",
                provider: Provider::OpenAiCompatible,
                model: "claude-sonnet-4-5",
                status: 429,
                body: r#"{"error":{"message":"Rate limit exceeded for this model. Resets in 3h.","type":"rate_limit_error"}}"#,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "'resets in 2 days' is no named reset: no 6 h park, the backoff (level 3: 16 s)",
                provider: Provider::OpenAiCompatible,
                model: "claude-sonnet-4-5",
                status: 429,
                body: r#"{"error":{"message":"Weekly rate limit reached, resets in 2 days","type":"rate_limit_error"}}"#,
                backoff_level: 3,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:20:46Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "'try again in 5 hours' vetoes the 90 s guess",
                provider: Provider::OpenAiCompatible,
                model: "gpt-5",
                status: 429,
                body: r#"{"error":{"message":"You've hit the rate limit for this model. Please try again in 5 hours.","type":"rate_limit_error"}}"#,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "'resets at 17:00 UTC' is hours away: vetoes the 90 s guess",
                provider: Provider::OpenAiCompatible,
                model: "gpt-5",
                status: 429,
                body: r#"{"error":{"message":"Rate limit reached for requests per day. Your quota resets at 17:00 UTC.","type":"rate_limit_error"}}"#,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "a clock time with no zone is UTC's: 'resets at 5pm' vetoes",
                provider: Provider::OpenAiCompatible,
                model: "gpt-5",
                status: 429,
                body: r#"{"error":{"message":"Too many requests today; the limit resets at 5pm.","type":"rate_limit_error"}}"#,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "a clock time in the zone named: midnight Pacific vetoes",
                provider: Provider::OpenAiCompatible,
                model: "gpt-5",
                status: 429,
                body: r#"{"error":{"message":"Rate limit exceeded: daily quota resets at midnight Pacific time (PT).","type":"rate_limit_error"}}"#,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "'try again tomorrow' vetoes the 90 s guess",
                provider: Provider::OpenAiCompatible,
                model: "gpt-5",
                status: 429,
                body: r#"{"error":{"message":"Rate limit exceeded for today. Please try again tomorrow.","type":"rate_limit_error"}}"#,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "'try again in an hour' (spelled out) vetoes the 90 s guess",
                provider: Provider::OpenAiCompatible,
                model: "gpt-5",
                status: 429,
                body: r#"{"error":{"message":"You have hit the rate limit. Please try again in an hour.","type":"rate_limit_error"}}"#,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "'resets in a few hours' vetoes the 90 s guess",
                provider: Provider::OpenAiCompatible,
                model: "gpt-5",
                status: 429,
                body: r#"{"error":{"message":"Rate limit reached; your allowance resets in a few hours.","type":"rate_limit_error"}}"#,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "a clock time half an hour away does not veto: the 90 s guess",
                provider: Provider::OpenAiCompatible,
                model: "gpt-5",
                status: 429,
                body: r#"{"error":{"message":"Rate limit exceeded. Resets at 10:50 UTC.","type":"rate_limit_error"}}"#,
                rule: Rule::RateLimitWording,
                lock: Some((One, Corroborated, "2026-03-15T10:22:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "'try again in a minute' (spelled out) does not veto: the 90 s guess",
                provider: Provider::OpenAiCompatible,
                model: "gpt-5",
                status: 429,
                body: r#"{"error":{"message":"Rate limit exceeded. Try again in a minute.","type":"rate_limit_error"}}"#,
                rule: Rule::RateLimitWording,
                lock: Some((One, Corroborated, "2026-03-15T10:22:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "hours-away wording without rate-limit words parks nothing long: backoff",
                provider: Provider::OpenAiCompatible,
                model: "gpt-5",
                status: 429,
                body: r#"{"error":{"message":"You've hit your usage limit. Resets in 1h 30m.","type":"usage_limit"}}"#,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "OpenRouter 'temporarily rate-limited upstream' is none of the three phrases: backoff",
                provider: Provider::OpenRouter,
                model: "qwen/qwen3-coder:free",
                status: 429,
                body: OPENROUTER_UPSTREAM_SHORT,
                rule: Rule::Backoff,
                lock: Some((One, Route, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "the longer OpenRouter wording says 'rate limits': the seed's phrase, 90 s",
                provider: Provider::OpenRouter,
                model: "meta-llama/llama-3.3-70b-instruct:free",
                status: 429,
                body: OPENROUTER_UPSTREAM,
                rule: Rule::RateLimitWording,
                lock: Some((One, Route, "2026-03-15T10:22:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "worded hours away with a Retry-After: the named reset holds",
                provider: Provider::OpenAiCompatible,
                model: "claude-sonnet-4-5",
                status: 429,
                headers: &[("retry-after", "30")],
                body: r#"{"error":{"message":"Weekly rate limit reached, resets in 2 days","type":"rate_limit_error"}}"#,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Corroborated, "2026-03-15T10:21:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "a wait under an hour does not veto: the 90 s guess",
                provider: Provider::OpenAiCompatible,
                model: "claude-sonnet-4-5",
                status: 429,
                body: r#"{"error":{"message":"Rate limit exceeded. Resets in 59m.","type":"rate_limit_error"}}"#,
                rule: Rule::RateLimitWording,
                lock: Some((One, Corroborated, "2026-03-15T10:22:00Z")),
                next: NextCredential,
                ..BASE
            },
            // ---- kRouter rule 5: backoff ----
            Case {
                name: "a bare 429 backs off 2 s at level 0",
                provider: Provider::Gemini,
                model: "gemini-2.5-flash",
                status: 429,
                body: GEMINI_EXHAUSTED,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "backoff level 1 is 4 s",
                provider: Provider::Gemini,
                model: "gemini-2.5-flash",
                status: 429,
                body: GEMINI_EXHAUSTED,
                backoff_level: 1,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:20:34Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "backoff level 7 (eighth in a row) is 256 s, still under the ceiling",
                provider: Provider::Gemini,
                model: "gemini-2.5-flash",
                status: 429,
                body: GEMINI_EXHAUSTED,
                backoff_level: 7,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:24:46Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "backoff level 8 (ninth in a row) reaches the 300 s ceiling",
                provider: Provider::Gemini,
                model: "gemini-2.5-flash",
                status: 429,
                body: GEMINI_EXHAUSTED,
                backoff_level: 8,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:25:30Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "backoff level 20 stays at 300 s",
                provider: Provider::Gemini,
                model: "gemini-2.5-flash",
                status: 429,
                body: GEMINI_EXHAUSTED,
                backoff_level: 20,
                rule: Rule::Backoff,
                lock: Some((One, Corroborated, "2026-03-15T10:25:30Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "anthropic 529 overloaded backs off on this credential alone",
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5",
                status: 529,
                body: ANTHROPIC_OVERLOADED,
                rule: Rule::Backoff,
                lock: Some((One, Route, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "'capacity' wording on a 503 backs off (level 2: 8 s)",
                provider: Provider::OpenAiCompatible,
                model: "qwen2.5-72b",
                status: 503,
                body: r#"{"error":{"message":"The server is at capacity, please retry later","type":"server_error"}}"#,
                backoff_level: 2,
                rule: Rule::Backoff,
                lock: Some((One, Route, "2026-03-15T10:20:38Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "'overloaded' on a 429 is not the account's limit: backoff on the route",
                provider: Provider::Gemini,
                model: "gemini-2.5-pro",
                status: 429,
                body: r#"{"error":{"code":429,"message":"The model is overloaded. Please try again later.","status":"RESOURCE_EXHAUSTED"}}"#,
                rule: Rule::Backoff,
                lock: Some((One, Route, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "the gateway's own busy failure takes the short backoff (level 3: 16 s)",
                status: 503,
                body: "credential busy, try another",
                backoff_level: 3,
                gateway_busy: true,
                rule: Rule::Backoff,
                lock: Some((One, Route, "2026-03-15T10:20:46Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            // ---- kRouter rule 5: the status table ----
            Case {
                name: "401 invalid key: 2 min on that model",
                status: 401,
                body: OPENAI_BAD_KEY,
                rule: Rule::AuthOrNotFound,
                lock: Some((One, Route, "2026-03-15T10:22:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "402 OpenRouter insufficient credits: 2 min, ambiguous for groot",
                provider: Provider::OpenRouter,
                model: "anthropic/claude-sonnet-4.5",
                status: 402,
                body: OPENROUTER_CREDITS,
                rule: Rule::AuthOrNotFound,
                lock: Some((One, Corroborated, "2026-03-15T10:22:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "403 permission error: 2 min",
                provider: Provider::Anthropic,
                model: "claude-opus-4-1",
                status: 403,
                body: ANTHROPIC_PERMISSION,
                rule: Rule::AuthOrNotFound,
                lock: Some((One, Route, "2026-03-15T10:22:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "404 not naming a model: 2 min",
                provider: Provider::Anthropic,
                model: "claude-opus-4-1",
                status: 404,
                body: ANTHROPIC_NOT_FOUND,
                rule: Rule::AuthOrNotFound,
                lock: Some((One, Route, "2026-03-15T10:22:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "500: 30 s",
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5",
                status: 500,
                body: ANTHROPIC_API_ERROR,
                rule: Rule::ServerError,
                lock: Some((One, Route, "2026-03-15T10:21:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "502 HTML page: 30 s",
                provider: Provider::OpenAiCompatible,
                model: "qwen2.5-72b",
                status: 502,
                body: CLOUDFLARE_502,
                rule: Rule::ServerError,
                lock: Some((One, Route, "2026-03-15T10:21:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "503 with no reset and no capacity words: 30 s",
                status: 503,
                body: OPENAI_SERVER_ERROR,
                rule: Rule::ServerError,
                lock: Some((One, Route, "2026-03-15T10:21:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "504: 30 s",
                provider: Provider::OpenAiCompatible,
                model: "qwen2.5-72b",
                status: 504,
                body: GATEWAY_TIMEOUT_504,
                rule: Rule::ServerError,
                lock: Some((One, Route, "2026-03-15T10:21:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "400 bad request: no lock, no other credential, next model",
                status: 400,
                body: OPENAI_BAD_PARAM,
                rule: Rule::RequestError,
                lock: None,
                next: NextModel,
                ..BASE
            },
            Case {
                name: "422 validation failure: no lock, next model",
                provider: Provider::OpenAiCompatible,
                model: "qwen2.5-72b",
                status: 422,
                body: VLLM_422,
                rule: Rule::RequestError,
                lock: None,
                next: NextModel,
                ..BASE
            },
            Case {
                name: "a redirect is no known failure: kRouter's old 30 s default",
                provider: Provider::OpenAiCompatible,
                model: "qwen2.5-72b",
                status: 302,
                headers: &[("location", "https://example.test/login")],
                rule: Rule::OtherFailure,
                lock: Some((One, Route, "2026-03-15T10:21:00Z")),
                next: NextCredential,
                ..BASE
            },
            // ---- kRouter rule 5: credential-shaped 4xx ----
            Case {
                name: "anthropic credit balance too low (400): 2 min and the next credential",
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5",
                status: 400,
                body: ANTHROPIC_CREDIT_LOW,
                rule: Rule::CredentialShaped4xx,
                lock: Some((One, Route, "2026-03-15T10:22:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "gemini API key not valid (400): 2 min and the next credential",
                provider: Provider::Gemini,
                model: "gemini-2.5-flash",
                status: 400,
                body: GEMINI_BAD_KEY,
                rule: Rule::CredentialShaped4xx,
                lock: Some((One, Route, "2026-03-15T10:22:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "gemini user location is not supported (400): 2 min and the next credential",
                provider: Provider::Gemini,
                model: "gemini-2.5-flash",
                status: 400,
                body: GEMINI_LOCATION,
                rule: Rule::CredentialShaped4xx,
                lock: Some((One, Route, "2026-03-15T10:22:30Z")),
                next: NextCredential,
                ..BASE
            },
            // ---- kRouter rule 5: account-wide text ----
            Case {
                name: "gemini consumer suspended: 24 h on the whole credential, banned",
                provider: Provider::Gemini,
                model: "gemini-2.5-flash",
                status: 403,
                body: GEMINI_SUSPENDED,
                rule: Rule::AccountWide,
                lock: Some((All, Route, "2026-03-16T10:20:30Z")),
                next: NextCredential,
                banned: true,
                ..BASE
            },
            Case {
                name: "openai account deactivated: 24 h on the whole credential, banned",
                status: 401,
                body: OPENAI_DEACTIVATED,
                rule: Rule::AccountWide,
                lock: Some((All, Route, "2026-03-16T10:20:30Z")),
                next: NextCredential,
                banned: true,
                ..BASE
            },
            Case {
                name: "'verify your account': 24 h on the whole credential, banned",
                provider: Provider::Gemini,
                model: "gemini-2.5-pro",
                status: 403,
                body: GEMINI_VERIFY,
                rule: Rule::AccountWide,
                lock: Some((All, Route, "2026-03-16T10:20:30Z")),
                next: NextCredential,
                banned: true,
                ..BASE
            },
            Case {
                name: "'suspended' on a 503 takes the whole credential out too (any status)",
                provider: Provider::OpenAiCompatible,
                model: "qwen2.5-72b",
                status: 503,
                body: r#"{"error":{"message":"Service suspended for maintenance","type":"server_error"}}"#,
                rule: Rule::AccountWide,
                lock: Some((All, Route, "2026-03-16T10:20:30Z")),
                next: NextCredential,
                banned: true,
                ..BASE
            },
            Case {
                name: "a 500 'account has been suspended' takes the whole credential out, banned",
                provider: Provider::OpenAiCompatible,
                model: "qwen2.5-72b",
                status: 500,
                body: RELAY_SUSPENDED_500,
                rule: Rule::AccountWide,
                lock: Some((All, Route, "2026-03-16T10:20:30Z")),
                next: NextCredential,
                banned: true,
                ..BASE
            },
            Case {
                name: "'verify your account' on a 429 is account-wide, not a rate limit",
                provider: Provider::Gemini,
                model: "gemini-2.5-pro",
                status: 429,
                body: r#"{"error":{"code":429,"message":"To continue, verify your account at https://accounts.google.com/signin/continue?sarp=1&scc=1&plt=AKgnsbs","status":"RESOURCE_EXHAUSTED"}}"#,
                rule: Rule::AccountWide,
                lock: Some((All, Route, "2026-03-16T10:20:30Z")),
                next: NextCredential,
                banned: true,
                ..BASE
            },
            Case {
                name: "Kiro monthly limit (400): the whole credential 30 days",
                provider: Provider::OpenAiCompatible,
                model: "claude-sonnet-4-5",
                status: 400,
                body: KIRO_MONTHLY_LIMIT,
                rule: Rule::KiroMonthly,
                lock: Some((All, Route, "2026-04-14T10:20:30Z")),
                next: NextCredential,
                count_kiro_hold: true,
                ..BASE
            },
            Case {
                name: "Kiro monthly limit after eight overloads is still 30 days: the backoff level is not its count",
                provider: Provider::OpenAiCompatible,
                model: "claude-sonnet-4-5",
                status: 400,
                body: KIRO_MONTHLY_LIMIT,
                backoff_level: 8,
                rule: Rule::KiroMonthly,
                lock: Some((All, Route, "2026-04-14T10:20:30Z")),
                next: NextCredential,
                count_kiro_hold: true,
                ..BASE
            },
            Case {
                name: "Kiro monthly limit again before a success (one hold before): 60 days",
                provider: Provider::OpenAiCompatible,
                model: "claude-sonnet-4-5",
                status: 400,
                body: KIRO_MONTHLY_LIMIT,
                kiro_holds: 1,
                rule: Rule::KiroMonthly,
                lock: Some((All, Route, "2026-05-14T10:20:30Z")),
                next: NextCredential,
                count_kiro_hold: true,
                ..BASE
            },
            Case {
                name: "'reached the limit' from any provider, any status, is Kiro's rule (two holds before: 90 days)",
                provider: Provider::OpenAi,
                status: 403,
                body: r#"{"error":{"message":"You have reached the limit of requests for your plan this month.","type":"insufficient_quota","code":"insufficient_quota"}}"#,
                kiro_holds: 2,
                backoff_level: 3,
                rule: Rule::KiroMonthly,
                lock: Some((All, Route, "2026-06-13T10:20:30Z")),
                next: NextCredential,
                count_kiro_hold: true,
                ..BASE
            },
            // ---- kRouter rule 5: no capacity, model gone, prompt too long ----
            Case {
                name: "no capacity available naming no reset: 5 s and stop",
                provider: Provider::Gemini,
                model: "gemini-2.5-pro",
                status: 429,
                body: GEMINI_NO_CAPACITY,
                rule: Rule::NoCapacity,
                lock: Some((One, Route, "2026-03-15T10:20:35Z")),
                next: Stop,
                ..BASE
            },
            Case {
                name: "OpenAI 404 model_not_found: skip other credentials, next model",
                status: 404,
                body: OPENAI_MODEL_GONE,
                model: "gpt-5-turbo",
                rule: Rule::ModelGone,
                lock: Some((One, Route, "2026-03-15T10:22:30Z")),
                next: NextModel,
                ..BASE
            },
            Case {
                name: "anthropic 404 'model: …' is the model gone",
                provider: Provider::Anthropic,
                model: "claude-3-opus-20240229",
                status: 404,
                body: ANTHROPIC_MODEL_GONE,
                rule: Rule::ModelGone,
                lock: Some((One, Route, "2026-03-15T10:22:30Z")),
                next: NextModel,
                ..BASE
            },
            Case {
                name: "gemini 404 'is not found for API version' is the model gone",
                provider: Provider::Gemini,
                model: "gemini-1.0-pro",
                status: 404,
                body: GEMINI_MODEL_GONE,
                rule: Rule::ModelGone,
                lock: Some((One, Route, "2026-03-15T10:22:30Z")),
                next: NextModel,
                ..BASE
            },
            Case {
                name: "anthropic 'prompt is too long': no lock, next model",
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5",
                status: 400,
                body: ANTHROPIC_PROMPT_TOO_LONG,
                rule: Rule::PromptTooLong,
                lock: None,
                next: NextModel,
                ..BASE
            },
            // ---- groot ADR 0008: who rests with a 429 ----
            Case {
                name: "openrouter 429 with X-RateLimit headers is the account's",
                provider: Provider::OpenRouter,
                model: "google/gemini-2.0-flash-exp:free",
                status: 429,
                headers: &[
                    ("x-ratelimit-limit", "20"),
                    ("x-ratelimit-remaining", "0"),
                    ("x-ratelimit-reset", "1773570070000"),
                ],
                body: OPENROUTER_PLAIN_LIMIT,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Account, "2026-03-15T10:21:10Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "openrouter 429 with a provider marker rests the route only",
                provider: Provider::OpenRouter,
                model: "meta-llama/llama-3.3-70b-instruct:free",
                status: 429,
                body: OPENROUTER_UPSTREAM,
                rule: Rule::RateLimitWording,
                lock: Some((One, Route, "2026-03-15T10:22:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "bare ambiguous openrouter 429: the account only if corroborated",
                provider: Provider::OpenRouter,
                model: "meta-llama/llama-3.3-70b-instruct:free",
                status: 429,
                body: OPENROUTER_BARE,
                rule: Rule::RateLimitWording,
                lock: Some((One, Corroborated, "2026-03-15T10:22:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "error_type rate_limit_exceeded is the account's",
                provider: Provider::OpenRouter,
                model: "qwen/qwen3-coder:free",
                status: 429,
                body: OPENROUTER_ERROR_TYPE,
                rule: Rule::Backoff,
                lock: Some((One, Account, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "X-RateLimit headers outrank a provider marker (groot's order)",
                provider: Provider::OpenRouter,
                model: "meta-llama/llama-3.3-70b-instruct:free",
                status: 429,
                headers: &[("x-ratelimit-limit", "20"), ("x-ratelimit-remaining", "3")],
                body: OPENROUTER_UPSTREAM,
                rule: Rule::RateLimitWording,
                lock: Some((One, Account, "2026-03-15T10:22:00Z")),
                next: NextCredential,
                ..BASE
            },
            // ---- AWS Bedrock ----
            Case {
                name: "bedrock ThrottlingException rests the model a minute, with its account",
                provider: Provider::Bedrock,
                model: "anthropic.claude-3-5-sonnet-20240620-v1:0",
                status: 429,
                headers: &[("x-amzn-errortype", BEDROCK_TYPE_THROTTLING)],
                body: BEDROCK_THROTTLED,
                rule: Rule::AwsThrottling,
                lock: Some((One, Account, "2026-03-15T10:21:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "bedrock ThrottlingException on tokens, named in the body's __type: a minute too",
                provider: Provider::Bedrock,
                model: "anthropic.claude-3-5-sonnet-20240620-v1:0",
                status: 429,
                body: r#"{"__type":"com.amazonaws.bedrock#ThrottlingException","message":"Too many tokens, please wait before trying again."}"#,
                rule: Rule::AwsThrottling,
                lock: Some((One, Account, "2026-03-15T10:21:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "bedrock ThrottlingException with a Retry-After: the header's wait (rule 3)",
                provider: Provider::Bedrock,
                model: "anthropic.claude-3-5-sonnet-20240620-v1:0",
                status: 429,
                headers: &[
                    ("x-amzn-errortype", BEDROCK_TYPE_THROTTLING),
                    ("retry-after", "20"),
                ],
                body: BEDROCK_TOKENS_THROTTLED,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Corroborated, "2026-03-15T10:20:50Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "bedrock ServiceQuotaExceededException is the account's quota: five minutes",
                provider: Provider::Bedrock,
                model: "meta.llama3-70b-instruct-v1:0",
                status: 400,
                headers: &[("x-amzn-errortype", "ServiceQuotaExceededException")],
                body: BEDROCK_QUOTA,
                rule: Rule::AwsServiceQuota,
                lock: Some((One, Account, "2026-03-15T10:25:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "bedrock ModelNotReadyException is transient: the short backoff on this route",
                provider: Provider::Bedrock,
                model: "arn:aws:bedrock:us-east-1:123456789012:imported-model/abc",
                status: 429,
                headers: &[("x-amzn-errortype", "ModelNotReadyException")],
                body: BEDROCK_NOT_READY,
                rule: Rule::Backoff,
                lock: Some((One, Route, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "bedrock ServiceUnavailableException is a 5xx: 30 s",
                provider: Provider::Bedrock,
                model: "anthropic.claude-3-5-sonnet-20240620-v1:0",
                status: 503,
                headers: &[("x-amzn-errortype", "ServiceUnavailableException")],
                body: BEDROCK_UNAVAILABLE,
                rule: Rule::ServerError,
                lock: Some((One, Route, "2026-03-15T10:21:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "bedrock AccessDeniedException: no access to that model, 2 min on it",
                provider: Provider::Bedrock,
                model: "anthropic.claude-3-opus-20240229-v1:0",
                status: 403,
                headers: &[("x-amzn-errortype", "AccessDeniedException")],
                body: BEDROCK_ACCESS_DENIED,
                rule: Rule::AuthOrNotFound,
                lock: Some((One, Route, "2026-03-15T10:22:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "bedrock UnrecognizedClientException: the keys are bad, the whole credential 2 min",
                provider: Provider::Bedrock,
                model: "anthropic.claude-3-5-sonnet-20240620-v1:0",
                status: 403,
                headers: &[(
                    "x-amzn-errortype",
                    "UnrecognizedClientException:http://internal.amazon.com/coral/com.amazon.coral.service/",
                )],
                body: BEDROCK_BAD_TOKEN,
                rule: Rule::AwsKeysRejected,
                lock: Some((All, Route, "2026-03-15T10:22:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "bedrock ValidationException is the request's fault: no lock",
                provider: Provider::Bedrock,
                model: "anthropic.claude-3-5-sonnet-20240620-v1:0",
                status: 400,
                headers: &[("x-amzn-errortype", "ValidationException")],
                body: BEDROCK_VALIDATION,
                rule: Rule::RequestError,
                lock: None,
                next: NextModel,
                ..BASE
            },
            Case {
                name: "an AWS type on another provider has no Bedrock rule (Kiro's quota is monthly)",
                provider: Provider::OpenAiCompatible,
                model: "claude-sonnet-4",
                status: 429,
                headers: &[("x-amzn-errortype", "ThrottlingException")],
                body: BEDROCK_THROTTLED,
                rule: Rule::RateLimitWording,
                lock: Some((One, Corroborated, "2026-03-15T10:22:00Z")),
                next: NextCredential,
                ..BASE
            },
            // ---- Gemini's own API (google) ----
            Case {
                name: "google per-day quota: parked to midnight Pacific (PDT), not its 17 s retryDelay",
                provider: Provider::Google,
                model: "gemini-2.5-flash",
                status: 429,
                body: GOOGLE_PER_DAY,
                rule: Rule::GoogleDailyQuota,
                lock: Some((One, Account, "2026-03-16T07:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "google per-day quota in winter: midnight Pacific is 08:00 UTC (PST)",
                provider: Provider::Google,
                model: "gemini-2.5-flash",
                status: 429,
                body: GOOGLE_PER_DAY,
                now: "2026-01-10T09:00:00Z",
                rule: Rule::GoogleDailyQuota,
                lock: Some((One, Account, "2026-01-11T08:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "gemini (OpenAI-compatible endpoint) per-day quota: the same midnight Pacific",
                provider: Provider::Gemini,
                model: "gemini-2.5-flash",
                status: 429,
                body: GOOGLE_PER_DAY,
                rule: Rule::GoogleDailyQuota,
                lock: Some((One, Account, "2026-03-16T07:00:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "google per-minute quota with retryDelay 1.5s: the named wait (rule 3)",
                provider: Provider::Google,
                model: "gemini-2.5-flash",
                status: 429,
                body: GOOGLE_PER_MINUTE_1_5S,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Corroborated, "2026-03-15T10:20:31.500Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "google per-minute quota naming no delay: a minute, not the 90 s guess",
                provider: Provider::Google,
                model: "gemini-2.5-pro",
                status: 429,
                body: GOOGLE_PER_MINUTE_NO_DELAY,
                rule: Rule::GooglePerMinuteQuota,
                lock: Some((One, Account, "2026-03-15T10:21:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "google 400 INVALID_ARGUMENT is the request's fault: no lock",
                provider: Provider::Google,
                model: "gemini-2.5-flash",
                status: 400,
                body: GOOGLE_INVALID_ARGUMENT,
                rule: Rule::RequestError,
                lock: None,
                next: NextModel,
                ..BASE
            },
            Case {
                name: "google 400 API_KEY_INVALID is the credential's: 2 min, next credential",
                provider: Provider::Google,
                model: "gemini-2.5-flash",
                status: 400,
                body: GEMINI_BAD_KEY,
                rule: Rule::CredentialShaped4xx,
                lock: Some((One, Route, "2026-03-15T10:22:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "google 403 PERMISSION_DENIED is the credential's: 2 min",
                provider: Provider::Google,
                model: "gemini-2.5-flash",
                status: 403,
                body: GOOGLE_PERMISSION_DENIED,
                rule: Rule::AuthOrNotFound,
                lock: Some((One, Route, "2026-03-15T10:22:30Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "google 503 UNAVAILABLE is transient",
                provider: Provider::Google,
                model: "gemini-2.5-flash",
                status: 503,
                body: GOOGLE_UNAVAILABLE,
                rule: Rule::Backoff,
                lock: Some((One, Route, "2026-03-15T10:20:32Z")),
                next: NextCredential,
                bump_backoff: true,
                ..BASE
            },
            Case {
                name: "google 500 INTERNAL is transient: 30 s",
                provider: Provider::Google,
                model: "gemini-2.5-flash",
                status: 500,
                body: GOOGLE_INTERNAL,
                rule: Rule::ServerError,
                lock: Some((One, Route, "2026-03-15T10:21:00Z")),
                next: NextCredential,
                ..BASE
            },
            // ---- Azure OpenAI ----
            Case {
                name: "azure 429 with retry-after and retry-after-ms parks the deployment that long",
                provider: Provider::Azure,
                model: "gpt4o-prod",
                status: 429,
                headers: &[
                    ("retry-after", "37"),
                    ("retry-after-ms", "37000"),
                    ("x-ratelimit-remaining-requests", "0"),
                    ("x-ratelimit-remaining-tokens", "0"),
                ],
                body: AZURE_429,
                rule: Rule::ProviderNamedReset,
                lock: Some((One, Account, "2026-03-15T10:21:07Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "azure 429 whose headers were stripped (a proxy): the wording's 90 s, like OpenAI's",
                provider: Provider::Azure,
                model: "gpt4o-prod",
                status: 429,
                body: AZURE_429,
                rule: Rule::RateLimitWording,
                lock: Some((One, Corroborated, "2026-03-15T10:22:00Z")),
                next: NextCredential,
                ..BASE
            },
            Case {
                name: "azure content-filter 400 is the request's fault: no lock, no backoff",
                provider: Provider::Azure,
                model: "gpt4o-prod",
                status: 400,
                body: AZURE_CONTENT_FILTER,
                rule: Rule::RequestError,
                lock: None,
                next: NextModel,
                ..BASE
            },
        ]
    }

    #[test]
    fn classifier_table() {
        let cases = cases();
        assert!(cases.len() >= 45, "only {} rows", cases.len());
        let mut failures = Vec::new();
        for case in &cases {
            let headers = header_map(case.headers);
            let failure = UpstreamFailure {
                status: case.status,
                headers: &headers,
                body: case.body,
                provider: case.provider,
                model: case.model,
                now: at(case.now),
                backoff_level: case.backoff_level,
                kiro_holds: case.kiro_holds,
                gateway_busy: case.gateway_busy,
            };
            let got = classify(&failure);
            let want = Classification {
                rule: case.rule,
                lock: case.lock.map(|(models, sharing, until)| Lock {
                    models,
                    sharing,
                    until: at(until),
                }),
                next: case.next,
                banned: case.banned,
                bump_backoff: case.bump_backoff,
                count_kiro_hold: case.count_kiro_hold,
            };
            if got != want {
                failures.push(format!("{}:\n   got  {got:?}\n   want {want:?}", case.name));
            }
        }
        assert!(
            failures.is_empty(),
            "{} rows failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn the_gateway_busy_constructor_is_the_short_backoff() {
        let now = at(NOW);
        let got = classify(&UpstreamFailure::gateway_busy(
            Provider::OpenRouter,
            "x:free",
            now,
            0,
        ));
        assert_eq!(got.rule, Rule::Backoff);
        assert!(got.bump_backoff);
        assert_eq!(
            got.lock,
            Some(Lock {
                models: One,
                sharing: Route,
                until: at("2026-03-15T10:20:32Z")
            })
        );
    }

    #[test]
    fn a_deadline_passed_is_a_server_error() {
        let now = at(NOW);
        for provider in [Provider::OpenAi, Provider::Anthropic, Provider::OpenRouter] {
            let got = classify(&UpstreamFailure::timed_out(provider, "m", now, 3));
            assert_eq!(got.rule, Rule::ServerError, "{provider:?}");
            assert_eq!(got.next, NextStep::NextCredential);
            assert!(!got.bump_backoff && !got.banned);
            assert_eq!(
                got.lock,
                Some(Lock {
                    models: One,
                    sharing: Route,
                    until: at("2026-03-15T10:21:00Z")
                })
            );
        }
    }

    #[test]
    fn backoff_delays_double_to_the_ceiling() {
        let expected = [2, 4, 8, 16, 32, 64, 128, 256, 300, 300];
        for (level, seconds) in expected.iter().enumerate() {
            assert_eq!(
                backoff_delay(level as u32),
                TimeDelta::seconds(*seconds),
                "level {level}"
            );
        }
        assert_eq!(backoff_delay(u32::MAX), TimeDelta::seconds(300));
    }

    #[test]
    fn go_durations() {
        let rows: &[(&str, Option<i64>)] = &[
            ("6m0s", Some(360_000)),
            ("1s", Some(1_000)),
            ("20ms", Some(20)),
            ("1h2m3.5s", Some(3_723_500)),
            ("37s", Some(37_000)),
            ("0.5s", Some(500)),
            ("2m59.56s", Some(179_560)),
            ("0", Some(0)),
            ("1500us", Some(1)),
            ("", None),
            ("30", None),
            ("6 m", None),
            ("-1s", None),
            ("1d", None),
            ("abc", None),
        ];
        for (value, millis) in rows {
            let got = parse_go_duration(value).map(|d| d.num_milliseconds());
            assert_eq!(got, *millis, "{value:?}");
        }
    }

    #[test]
    fn reset_values() {
        let now = at(NOW);
        let rows: &[(&str, Option<&str>)] = &[
            ("1773570240", Some("2026-03-15T10:24:00Z")),
            ("1773570240000", Some("2026-03-15T10:24:00Z")),
            ("1773570240.5", Some("2026-03-15T10:24:00.500Z")),
            ("6m0s", Some("2026-03-15T10:26:30Z")),
            ("20ms", Some("2026-03-15T10:20:30.020Z")),
            ("1h2m3.5s", Some("2026-03-15T11:22:33.500Z")),
            ("33011", Some("2026-03-15T19:30:41Z")),
            ("2026-03-15T10:21:15Z", Some("2026-03-15T10:21:15Z")),
            ("2026-03-15T18:21:15+08:00", Some("2026-03-15T10:21:15Z")),
            ("Sun, 15 Mar 2026 10:25:00 GMT", Some("2026-03-15T10:25:00Z")),
            ("soon", None),
            ("", None),
        ];
        for (value, want) in rows {
            assert_eq!(parse_reset_value(value, now), want.map(at), "{value:?}");
        }
    }

    #[test]
    fn retry_after_values() {
        let now = at(NOW);
        let rows: &[(&str, Option<&str>)] = &[
            ("30", Some("2026-03-15T10:21:00Z")),
            (" 0 ", Some(NOW)),
            ("1.5", Some("2026-03-15T10:20:31.500Z")),
            ("Sun, 15 Mar 2026 10:25:00 GMT", Some("2026-03-15T10:25:00Z")),
            ("Sun, 15 Mar 2026 10:00:00 GMT", Some("2026-03-15T10:00:00Z")),
            ("-5", None),
            ("later", None),
        ];
        for (value, want) in rows {
            assert_eq!(parse_retry_after(value, now), want.map(at), "{value:?}");
        }
    }

    #[test]
    fn named_dates() {
        let rows: &[(&str, Option<&str>)] = &[
            (
                "You will regain access on 2026-04-01 at 00:00 UTC.",
                Some("2026-04-01T00:00:00Z"),
            ),
            (
                "regain access on 2026-03-20 at 12:30 UTC",
                Some("2026-03-20T12:30:00Z"),
            ),
            (
                "access returns 2026-04-02T06:00:00Z.",
                Some("2026-04-02T06:00:00Z"),
            ),
            ("limit resets 2026-04-03", Some("2026-04-03T00:00:00Z")),
            ("no date here", None),
            ("regain access on 2026-13-01", None),
        ];
        for (text, want) in rows {
            assert_eq!(parse_named_date(text), want.map(at), "{text:?}");
        }
    }

    #[test]
    fn calendar_boundaries() {
        assert_eq!(
            next_utc_midnight(at("2026-03-15T23:59:59Z")),
            at("2026-03-16T00:00:00Z")
        );
        assert_eq!(
            next_utc_midnight(at("2026-03-16T00:00:00Z")),
            at("2026-03-17T00:00:00Z")
        );
        assert_eq!(
            first_of_next_month_utc(at("2026-01-31T12:00:00Z")),
            at("2026-02-01T00:00:00Z")
        );
        assert_eq!(
            first_of_next_month_utc(at("2026-12-31T23:59:59Z")),
            at("2027-01-01T00:00:00Z")
        );
    }

    #[test]
    fn a_shared_quota_failure_closes_what_the_quota_covers() {
        // (lock's models, failed model, what the group closes, a model it covers, one it does not)
        type Row = (
            LockModels,
            &'static str,
            LockModels,
            &'static str,
            Option<&'static str>,
        );
        let rows: &[Row] = &[
            (One, "a:free", AllFree, "b:free", Some("paid")),
            (One, "openrouter/free", AllFree, "b:free", Some("paid")),
            (AllFree, "a:free", AllFree, "openrouter/free", Some("paid")),
            (AllFree, "openrouter/auto", AllFree, "b:free", Some("paid")),
            (One, "gpt-4o", All, "gpt-4o-mini", None),
            (One, "gpt-4o", All, "b:free", None),
            (All, "a:free", All, "paid", None),
        ];
        for (models, failed, want, covered, spared) in rows {
            let got = shared_quota_models(*models, failed);
            assert_eq!(got, *want, "{models:?} {failed}");
            assert!(
                got.covers(failed, failed) && got.covers(failed, covered),
                "{failed}"
            );
            if let Some(spared) = spared {
                assert!(!got.covers(failed, spared), "{failed} spares {spared}");
            }
        }
    }

    #[test]
    fn free_lock_covers_every_free_model_and_the_failed_one() {
        assert!(AllFree.covers("openrouter/free", "openrouter/free"));
        assert!(AllFree.covers("a:free", "openrouter/free"));
        assert!(AllFree.covers("openrouter/free", "a:free"));
        assert!(is_free_model("openrouter/free") && !is_free_model("openrouter/auto"));
        assert!(AllFree.covers("a:free", "b:free"));
        assert!(!AllFree.covers("a:free", "anthropic/claude-sonnet-4.5"));
        assert!(One.covers("a", "a") && !One.covers("a", "b"));
        assert!(All.covers("a", "b"));
    }

    #[test]
    fn rule_names_are_unique_snake_case() {
        let rules = [
            Rule::MonthlyCopilot,
            Rule::MonthlyAnthropicSpendCap,
            Rule::OpenRouterFreeDaily,
            Rule::ProviderNamedReset,
            Rule::AwsThrottling,
            Rule::AwsServiceQuota,
            Rule::AwsKeysRejected,
            Rule::RateLimitWording,
            Rule::AccountWide,
            Rule::KiroMonthly,
            Rule::NoCapacity,
            Rule::ModelGone,
            Rule::PromptTooLong,
            Rule::CredentialShaped4xx,
            Rule::Backoff,
            Rule::AuthOrNotFound,
            Rule::ServerError,
            Rule::RequestError,
            Rule::OtherFailure,
            Rule::InvalidResponse,
        ];
        let names: std::collections::HashSet<_> = rules.iter().map(Rule::name).collect();
        assert_eq!(names.len(), rules.len());
        assert!(names.iter().all(|n| {
            n.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        }));
    }

    #[test]
    fn an_invalid_answer_is_held_like_a_5xx() {
        let now = at(NOW);
        let c = invalid_response(now);
        assert_eq!(c.rule, Rule::InvalidResponse);
        assert_eq!(c.next, NextCredential);
        assert_eq!(
            c.lock,
            Some(Lock {
                models: One,
                sharing: Route,
                until: now + SERVER_ERROR_HOLD,
            })
        );
        assert!(!c.banned && !c.bump_backoff);
    }

    mod properties {
        //! The reset parsers read untrusted header values and bodies: they never panic, and no
        //! reset an upstream names holds a credential longer than the 6 h cap.

        use super::*;
        use proptest::prelude::*;

        /// Strings near the forms the parsers accept, and anything else.
        fn reset_text() -> impl Strategy<Value = String> {
            prop_oneof![
                "[0-9.]{0,24}",
                "[0-9.hmsuµn]{0,24}",
                "-?[0-9]{1,20}(\\.[0-9]{0,12})?",
                "[0-9]{1,6}(h|m|s|ms|us|µs|ns)([0-9]{1,6}(h|m|s|ms))?",
                "(Mon|Sun|Xyz), [0-9]{1,2} (Mar|Feb|Foo) [0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT",
                "[0-9]{4}-[0-9]{2}-[0-9]{2}(T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2}))?",
                "\\PC{0,40}",
            ]
        }

        /// Prose a provider may put a wait or a date in.
        fn reset_prose() -> impl Strategy<Value = String> {
            prop_oneof![
                (
                    "(resets|reset|try again|retry) in ",
                    "[0-9. ]{0,8}(d|h|m|s|ms|days|hours|minutes)?( and )?[0-9]{0,4}[a-z]{0,7}"
                )
                    .prop_map(|(a, b)| format!("{a}{b}")),
                (
                    "(resets|reset|try again|retry) (at|on|in|tomorrow) ",
                    "(a |an |a few |twenty-|half an |tomorrow |[0-9]{0,4}-?[0-9]{0,2}-?[0-9]{0,2}T?)?[0-9:]{0,8}( ?[ap]\\.?m\\.?)?( and a half)?",
                    "( |\\()?(utc|gmt|pt|[+-][0-9:]{0,5}|[A-Za-z_]{0,8}/[A-Za-z_]{0,12}|\\PC{0,4})",
                )
                    .prop_map(|(a, b, c)| format!("{a}{b}{c}")),
                ("(regain access on )?", reset_text(), "( at [0-9]{2}:[0-9]{2})?")
                    .prop_map(|(a, b, c)| format!("{a}{b}{c}")),
                "\\PC{0,60}",
            ]
        }

        fn now() -> impl Strategy<Value = DateTime<Utc>> {
            // 1970 to 2100, and the far ends chrono can represent.
            prop_oneof![
                (0i64..4_102_444_800).prop_map(|s| DateTime::from_timestamp(s, 0).unwrap_or_default()),
                Just(DateTime::<Utc>::MAX_UTC),
                Just(DateTime::<Utc>::MIN_UTC),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            #[test]
            fn prop_reset_parsers_never_panic(value in reset_text(), prose in reset_prose(), now in now()) {
                let _ = parse_retry_after(&value, now);
                let _ = parse_reset_value(&value, now);
                let _ = parse_go_duration(&value);
                let _ = parse_worded_wait(&prose, now);
                let _ = parse_named_date(&prose);
                let _ = parse_named_date(&value);
            }

            #[test]
            fn prop_named_resets_are_capped_at_six_hours(
                status in prop::sample::select(vec![429u16, 503, 500, 402, 403, 408]),
                retry_after in proptest::option::of(reset_text()),
                window in proptest::option::of((
                    prop::sample::select(vec![
                        "x-ratelimit-reset",
                        "x-ratelimit-reset-requests",
                        "x-ratelimit-reset-tokens",
                        "anthropic-ratelimit-requests-reset",
                        "anthropic-ratelimit-tokens-reset",
                        "anthropic-ratelimit-input-tokens-reset",
                        "anthropic-ratelimit-output-tokens-reset",
                    ]),
                    reset_text(),
                    proptest::option::of("-?[0-9]{1,3}"),
                )),
                prose in reset_prose(),
                delay in "[0-9.]{0,12}(s|ms|m|h)?",
                resets_in in "[0-9.e+-]{0,14}",
                backoff_level in 0u32..40,
                now in (1_600_000_000i64..2_200_000_000).prop_map(|s| DateTime::from_timestamp(s, 0).unwrap_or_default()),
            ) {
                let mut headers = http::HeaderMap::new();
                if let Some(v) = retry_after.as_deref().and_then(|v| http::HeaderValue::from_str(v).ok()) {
                    headers.insert("retry-after", v);
                }
                if let Some((name, value, remaining)) = &window {
                    if let Ok(v) = http::HeaderValue::from_str(value) {
                        headers.insert(*name, v);
                    }
                    if let Some(r) = remaining {
                        let remaining_name = name.replace("-reset", "-remaining");
                        if let (Ok(n), Ok(v)) = (http::HeaderName::from_bytes(remaining_name.as_bytes()), http::HeaderValue::from_str(r)) {
                            headers.insert(n, v);
                        }
                    }
                }
                // Gemini's retryDelay and Codex's resets_in_seconds next to the prose.
                let body = serde_json::json!({
                    "error": {
                        "message": prose,
                        "type": "usage_limit_reached",
                        "resets_in_seconds": resets_in,
                        "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}],
                    }
                })
                .to_string();
                let c = classify(&UpstreamFailure {
                    status,
                    headers: &headers,
                    body: &body,
                    provider: Provider::OpenAi,
                    model: "gpt-4o-mini",
                    now,
                    backoff_level,
                    kiro_holds: 0,
                    gateway_busy: false,
                });
                if let Some(lock) = c.lock {
                    prop_assert!(lock.until > now, "{c:?}");
                    prop_assert!(lock.until - now <= RESET_CAP, "{c:?} held past the cap");
                }
            }

            #[test]
            fn prop_classify_never_panics(
                status in 0u16..1000,
                headers in prop::collection::vec(("[a-z-]{1,30}", "\\PC{0,30}"), 0..6),
                body in "\\PC{0,200}",
                backoff_level in any::<u32>(),
                now in now(),
            ) {
                let mut map = http::HeaderMap::new();
                for (name, value) in &headers {
                    if let (Ok(n), Ok(v)) = (http::HeaderName::from_bytes(name.as_bytes()), http::HeaderValue::from_str(value)) {
                        map.append(n, v);
                    }
                }
                let _ = classify(&UpstreamFailure {
                    status,
                    headers: &map,
                    body: &body,
                    provider: Provider::OpenRouter,
                    model: "m:free",
                    now,
                    backoff_level,
                    kiro_holds: backoff_level,
                    gateway_busy: false,
                });
            }
        }
    }
}
