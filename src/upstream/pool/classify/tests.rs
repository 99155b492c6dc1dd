//! The classifier's table of real bodies, one row per rule and provider error, and the unit
//! tests of the readers it uses (durations, reset times, dates).

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
const BEDROCK_TOKENS_THROTTLED: &str = r#"{"message":"Too many tokens, please wait before trying again."}"#;
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
