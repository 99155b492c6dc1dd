//! AWS Bedrock's errors, named by their type (`x-amzn-errortype`, or the body's `__type`), on a
//! `bedrock` credential only: other AWS-hosted services (Kiro's `ServiceQuotaExceededException`
//! is its monthly limit, kRouter rule 5) reuse the names with other meanings.
//!
//! Checked after kRouter rule 3 (a reset the provider names wins) and before rule 4 (whose
//! wording "too many requests" would take a ThrottlingException for a 90 s guess):
//!
//! - `ThrottlingException` (429): the account's per-minute quota for that model in that region:
//!   a minute on that model, shared with the credential's quota group (AWS quotas are the
//!   account's, groot ADR 0008).
//! - `ServiceQuotaExceededException` (400): a service quota of the account is used up: five
//!   minutes on that model, shared with the quota group (seed 002: a quota error is not retried
//!   soon).
//! - `ModelNotReadyException` (429): the model is loading: kRouter's short backoff on this
//!   credential alone, the next credential meanwhile.
//! - `UnrecognizedClientException`, `InvalidSignatureException`, `ExpiredTokenException`,
//!   `IncompleteSignatureException`, `MissingAuthenticationTokenException` (403): the keys are
//!   bad: every model of the credential for kRouter's two minutes.
//!
//! The rest take kRouter's table: `AccessDeniedException` (403, no access to that model) two
//! minutes on that model; `ServiceUnavailableException` (503) and `InternalServerException`
//! (500) the 5xx's 30 s; `ValidationException` (400) the request's fault, no lock.

use chrono::TimeDelta;

use super::{
    AUTH_OR_NOT_FOUND_HOLD, Classification, Evidence, LockModels, NextStep, Provider, Rule, Sharing,
    UpstreamFailure, after, backoff,
};

/// A throttled model rests a minute (the per-minute window has turned).
const THROTTLING_HOLD: TimeDelta = TimeDelta::minutes(1);
/// A service quota used up: the backoff ceiling, five minutes.
const SERVICE_QUOTA_HOLD: TimeDelta = TimeDelta::minutes(5);

/// The error types that say the credential's keys are not accepted.
const KEYS_REJECTED: &[&str] = &[
    "UnrecognizedClientException",
    "InvalidSignatureException",
    "ExpiredTokenException",
    "IncompleteSignatureException",
    "MissingAuthenticationTokenException",
];

/// The classification of a Bedrock error whose type has a rule of its own.
pub(super) fn aws_error(f: &UpstreamFailure<'_>, ev: &Evidence) -> Option<Classification> {
    if f.provider != Provider::Bedrock {
        return None;
    }
    let body = serde_json::from_str(f.body).unwrap_or(serde_json::Value::Null);
    let kind =
        crate::provider::bedrock::error_type(ev.header(crate::provider::bedrock::AWS_ERROR_TYPE), &body)?;
    let model = |rule, sharing, hold| {
        Classification::hold(
            rule,
            LockModels::One,
            sharing,
            after(f.now, hold),
            NextStep::NextCredential,
        )
    };
    match kind {
        "ThrottlingException" => Some(model(Rule::AwsThrottling, Sharing::Account, THROTTLING_HOLD)),
        "ServiceQuotaExceededException" => {
            Some(model(Rule::AwsServiceQuota, Sharing::Account, SERVICE_QUOTA_HOLD))
        }
        "ModelNotReadyException" => Some(backoff(f, LockModels::One, Sharing::Route)),
        k if KEYS_REJECTED.contains(&k) => Some(Classification::hold(
            Rule::AwsKeysRejected,
            LockModels::All,
            Sharing::Route,
            after(f.now, AUTH_OR_NOT_FOUND_HOLD),
            NextStep::NextCredential,
        )),
        _ => None,
    }
}
