//! What the classifier is given (one [`UpstreamFailure`]) and what it answers (a
//! [`Classification`]: the [`Rule`] that matched, the [`Lock`] to write, the [`NextStep`]).

use std::sync::LazyLock;

use chrono::{DateTime, Utc};

use super::{Provider, is_free_model};

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
    pub(super) fn hold(
        rule: Rule,
        models: LockModels,
        sharing: Sharing,
        until: DateTime<Utc>,
        next: NextStep,
    ) -> Self {
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

    pub(super) fn no_lock(rule: Rule, next: NextStep) -> Self {
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
