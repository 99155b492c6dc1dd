//! Provider wire formats: each provider's request, answer, stream, usage and error shape, and
//! the credential that speaks them. Depends on nothing above it (DESIGN.md §6).

pub mod adapter;
pub mod azure;
pub mod bedrock;
pub mod credential;
pub mod google;
pub mod mask;
pub mod sse;
pub mod usage;

pub use credential::Credential;

/// The kind of provider behind a credential.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Provider {
    /// OpenAI.
    OpenAi,
    /// Anthropic (Messages API).
    Anthropic,
    /// OpenRouter (OpenAI-compatible).
    OpenRouter,
    /// Google Gemini through its OpenAI-compatible endpoint.
    Gemini,
    /// Any OpenAI-compatible base URL.
    OpenAiCompatible,
    /// Azure OpenAI: a resource endpoint, a deployment per model, the `api-key` header
    /// (`azure.rs`).
    Azure,
    /// AWS Bedrock Runtime: Converse and ConverseStream, SigV4-signed (`bedrock/`).
    Bedrock,
    /// Gemini's own API: `generateContent` and `streamGenerateContent`, the `x-goog-api-key`
    /// header (`google/`).
    Google,
}

impl Provider {
    /// The wire and config name.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
            Provider::OpenRouter => "openrouter",
            Provider::Gemini => "gemini",
            Provider::OpenAiCompatible => "openai-compatible",
            Provider::Azure => "azure",
            Provider::Bedrock => "bedrock",
            Provider::Google => "google",
        }
    }

    /// The provider's public API base URL; `None` for `openai-compatible` and `azure` (a
    /// resource's own endpoint), which must name one, and `bedrock`, whose endpoint is its
    /// region's ([`bedrock::default_base_url`]).
    pub fn default_base_url(self) -> Option<&'static str> {
        match self {
            Provider::OpenAi => Some("https://api.openai.com/v1"),
            Provider::Anthropic => Some("https://api.anthropic.com/v1"),
            Provider::OpenRouter => Some("https://openrouter.ai/api/v1"),
            Provider::Gemini => Some("https://generativelanguage.googleapis.com/v1beta/openai"),
            Provider::Google => Some(google::DEFAULT_BASE_URL),
            Provider::OpenAiCompatible | Provider::Azure | Provider::Bedrock => None,
        }
    }

    /// Whether requests go out in Anthropic's Messages format (else OpenAI's).
    pub fn speaks_anthropic(self) -> bool {
        self == Provider::Anthropic
    }
}

impl std::str::FromStr for Provider {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "openai" => Ok(Provider::OpenAi),
            "anthropic" => Ok(Provider::Anthropic),
            "openrouter" => Ok(Provider::OpenRouter),
            "gemini" => Ok(Provider::Gemini),
            "openai-compatible" => Ok(Provider::OpenAiCompatible),
            "azure" => Ok(Provider::Azure),
            "bedrock" => Ok(Provider::Bedrock),
            "google" => Ok(Provider::Google),
            other => Err(format!(
                "unknown provider {other:?} (expected openai, anthropic, openrouter, gemini, openai-compatible, azure, bedrock or google)"
            )),
        }
    }
}
