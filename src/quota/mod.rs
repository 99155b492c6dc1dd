//! Guardrail quotas (DESIGN.md §4, LyRouter seed 003): policies on subject × metric × window.

pub mod engine;
pub mod headers;
pub mod labels;
pub mod policy;
pub mod report;
pub mod shared;
pub mod window;

use serde::{Deserialize, Serialize};

use crate::kernel::credits::{MAX_STORED_CREDITS, MAX_STORED_CREDITS_TEXT, credits_to_micros};
use crate::validate::Range;

/// Whose usage a policy limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SubjectKind {
    /// One gateway API key.
    Apikey,
    /// One member (all of their keys).
    Member,
    /// One department (all of its members).
    Dept,
    /// The whole workspace.
    Ws,
    /// One value of a tag the request carries (`team=search`; issue 25 item 6).
    Tag,
    /// The end user the request names.
    #[serde(rename = "end_user")]
    EndUser,
}

impl SubjectKind {
    /// The wire name used in messages (`rate limit exceeded on apikey …`).
    pub fn as_str(self) -> &'static str {
        match self {
            SubjectKind::Apikey => "apikey",
            SubjectKind::Member => "member",
            SubjectKind::Dept => "dept",
            SubjectKind::Ws => "ws",
            SubjectKind::Tag => "tag",
            SubjectKind::EndUser => "end_user",
        }
    }
}

impl std::str::FromStr for SubjectKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "apikey" => Ok(SubjectKind::Apikey),
            "member" => Ok(SubjectKind::Member),
            "dept" => Ok(SubjectKind::Dept),
            "ws" => Ok(SubjectKind::Ws),
            "tag" => Ok(SubjectKind::Tag),
            "end_user" => Ok(SubjectKind::EndUser),
            other => Err(format!(
                "unknown subject {other:?} (expected apikey, member, dept, ws, tag or end_user)"
            )),
        }
    }
}

/// What a policy counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Completed requests.
    Requests,
    /// Prompt plus completion tokens.
    TotalTokens,
    /// Prompt tokens.
    PromptTokens,
    /// Completion tokens.
    CompletionTokens,
    /// Credits from the model's price, counted in micro-credits.
    Credits,
}

impl Metric {
    /// Every metric, in header order.
    pub const ALL: [Metric; 5] = [
        Metric::Requests,
        Metric::TotalTokens,
        Metric::PromptTokens,
        Metric::CompletionTokens,
        Metric::Credits,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Requests => "requests",
            Metric::TotalTokens => "total_tokens",
            Metric::PromptTokens => "prompt_tokens",
            Metric::CompletionTokens => "completion_tokens",
            Metric::Credits => "credits",
        }
    }

    /// The name a client reads: in the `x-aigw-quota-<metric>-*` headers, `RateLimit-Policy` and
    /// `GET /v1/quota`. Seed 003 calls the total-token quota `tokens` (DESIGN.md §11); the
    /// policy itself, and a refusal of it, keep `total_tokens` (§4).
    pub fn client_name(self) -> &'static str {
        match self {
            Metric::TotalTokens => "tokens",
            m => m.as_str(),
        }
    }
}

impl std::str::FromStr for Metric {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Metric::ALL.into_iter().find(|m| m.as_str() == s).ok_or_else(|| {
            format!(
                "unknown metric {s:?} (expected requests, total_tokens, prompt_tokens, completion_tokens or credits)"
            )
        })
    }
}

/// Whether a policy refuses or only reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Refuses once used up.
    Enforce,
    /// Evaluated, reported and logged (`would_refuse`), never enforced.
    Shadow,
}

impl Mode {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "enforce" => Ok(Mode::Enforce),
            "shadow" => Ok(Mode::Shadow),
            other => Err(format!("unknown mode {other:?} (expected enforce or shadow)")),
        }
    }
}

/// Past this a count limit is not stored (`i64::MAX`; 2^63 is the first `f64` above it).
const MAX_STORED_COUNT: f64 = 9_223_372_036_854_775_808.0;

/// A policy's limit: credits in micro-credits, any other metric a whole number; finite,
/// non-negative and stored as it is written: credits up to [`MAX_STORED_CREDITS`] (8.9e15
/// would not fit in micro-credits), counts below 9e15 from the admin API (a range people mean)
/// and up to `i64::MAX` from the resources file.
pub fn policy_limit(metric: Metric, limit: f64, range: Range) -> Result<i64, String> {
    let name = metric.as_str();
    if metric == Metric::Credits {
        if !(0.0..=MAX_STORED_CREDITS).contains(&limit) {
            return Err(format!(
                "limit of credits must be from 0 to {MAX_STORED_CREDITS_TEXT} credits (stored in micro-credits)"
            ));
        }
        return Ok(credits_to_micros(limit));
    }
    let (fits, bound) = match range {
        Range::Console => ((0.0..9.0e15).contains(&limit), "below 9,000,000,000,000,000"),
        Range::Operator => (
            (0.0..MAX_STORED_COUNT).contains(&limit),
            "9,223,372,036,854,775,807",
        ),
    };
    if !fits || limit.fract() != 0.0 {
        return Err(format!(
            "limit of {name} must be a whole number from 0 to {bound}"
        ));
    }
    Ok(limit as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stored limit, or the message containing the expected part.
    fn check(got: Result<i64, String>, want: &Result<i64, &str>) {
        match (got, want) {
            (Ok(got), Ok(w)) => assert_eq!(got, *w),
            (Err(got), Err(w)) => assert!(got.contains(w), "{got}"),
            (got, w) => panic!("got {got:?}, want {w:?}"),
        }
    }

    #[test]
    fn policy_limits() {
        let cases: &[(Metric, f64, Result<i64, &str>)] = &[
            (Metric::Requests, 10.0, Ok(10)),
            (Metric::Requests, 0.0, Ok(0)),
            (
                Metric::Requests,
                1.5,
                Err("limit of requests must be a whole number"),
            ),
            (Metric::Credits, 1.5, Ok(1_500_000)),
            (
                Metric::Credits,
                9_223_372_036_854.0,
                Ok(9_223_372_036_854_000_000),
            ),
            (
                Metric::Credits,
                -1.0,
                Err("limit of credits must be from 0 to 9,223,372,036,854 credits"),
            ),
            // Stored as micro-credits, 8.9e15 credits would not fit: refused, not saturated.
            (Metric::Credits, 8.9e15, Err("9,223,372,036,854 credits")),
            (
                Metric::Requests,
                f64::INFINITY,
                Err("limit of requests must be a whole number from 0 to below 9,000,000,000,000,000"),
            ),
            (Metric::TotalTokens, 9.0e15, Err("below 9,000,000,000,000,000")),
        ];
        for (metric, limit, want) in cases {
            check(policy_limit(*metric, *limit, Range::Console), want);
        }
        let operator: &[(Metric, f64, Result<i64, &str>)] = &[
            (Metric::Requests, 9.0e15, Ok(9_000_000_000_000_000)),
            (Metric::Requests, 9.2e18, Ok(9_200_000_000_000_000_000)),
            (
                Metric::Requests,
                1.0e19,
                Err("limit of requests must be a whole number from 0 to 9,223,372,036,854,775,807"),
            ),
            (Metric::Credits, 1.0e300, Err("9,223,372,036,854 credits")),
            (Metric::Credits, f64::NAN, Err("9,223,372,036,854 credits")),
            (Metric::Requests, -1.0, Err("9,223,372,036,854,775,807")),
        ];
        for (metric, limit, want) in operator {
            check(policy_limit(*metric, *limit, Range::Operator), want);
        }
    }
}
