//! Guardrail quotas (DESIGN.md §4, LyRouter seed 003): policies on subject × metric × window.

pub mod engine;
pub mod headers;
pub mod labels;
pub mod policy;
pub mod report;
pub mod shared;
pub mod window;

use serde::{Deserialize, Serialize};

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

/// Micro-credits in one credit: prices and credit limits are stored as integers.
pub const MICROS_PER_CREDIT: f64 = 1_000_000.0;

/// Credits (as written by people) to integer micro-credits. The whole credits and the fraction
/// are converted apart: one product in `f64` would be off by hundreds of micro-credits near the
/// largest amounts stored (`validate::MAX_STORED_CREDITS`); this keeps every whole number of
/// credits exact. Beyond `i64` it saturates (validation refuses such amounts first).
pub fn credits_to_micros(credits: f64) -> i64 {
    let whole = credits.trunc();
    let fraction = ((credits - whole) * MICROS_PER_CREDIT).round() as i64;
    (whole as i64).saturating_mul(1_000_000).saturating_add(fraction)
}

/// Integer micro-credits to credits, for people.
pub fn micros_to_credits(micros: i64) -> f64 {
    micros as f64 / MICROS_PER_CREDIT
}
