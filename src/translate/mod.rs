//! OpenAI chat ⇄ Anthropic messages: a request made to one endpoint, served by a credential that
//! speaks the other. Pure functions over JSON, no I/O; the request path calls them at three
//! points: the body of each attempt ([`request`]), the complete answer ([`answer`]) and the event
//! stream ([`stream::StreamTranslator`]). An upstream error is classified in its own shape and only
//! then rendered in the client's ([`error_body`]).
//!
//! A request field the target cannot express is refused with a 400 naming it ([`Refused`]),
//! never dropped: `docs/translation.md` lists what maps and what is refused.
//!
//! - `chat_to_messages`: `POST /v1/chat/completions` served by an `anthropic` credential.
//! - `messages_to_chat`: `POST /v1/messages` served by an OpenAI-family credential.

pub mod chat_to_messages;
pub mod messages_to_chat;
pub mod stream;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::kernel::usage::Usage;
use crate::provider::Credential;
use crate::provider::Provider;
use crate::provider::adapter::{self, Endpoint, Fields, Outgoing};

/// A translation between the endpoint the client called and the one its credential speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Translation {
    /// An OpenAI chat request, sent as an Anthropic Messages request.
    ChatToMessages,
    /// An Anthropic Messages request, sent as an OpenAI chat request.
    MessagesToChat,
}

impl Translation {
    /// The translation a request to `endpoint` needs on a credential of `provider`; none when
    /// the provider speaks the endpoint natively (or the endpoint has no counterpart).
    pub fn of(endpoint: Endpoint, provider: Provider) -> Option<Translation> {
        match (endpoint, provider.speaks_anthropic()) {
            (Endpoint::ChatCompletions, true) => Some(Translation::ChatToMessages),
            (Endpoint::Messages, false) => Some(Translation::MessagesToChat),
            _ => None,
        }
    }

    /// The endpoint the upstream is called on.
    pub fn upstream_endpoint(self) -> Endpoint {
        match self {
            Translation::ChatToMessages => Endpoint::Messages,
            Translation::MessagesToChat => Endpoint::ChatCompletions,
        }
    }

    /// Name in the request log's attempts.
    pub fn name(self) -> &'static str {
        match self {
            Translation::ChatToMessages => "chat.completions→messages",
            Translation::MessagesToChat => "messages→chat.completions",
        }
    }
}

/// The endpoint an attempt on a credential of `provider` calls for a request to `endpoint`.
pub fn upstream_endpoint(endpoint: Endpoint, provider: Provider) -> Endpoint {
    Translation::of(endpoint, provider).map_or(endpoint, Translation::upstream_endpoint)
}

/// A request field the target format cannot express: a 400 naming it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The field, as a path in the client's request (`n`, `messages[2].content[0]`).
    pub param: String,
    /// Why it cannot be sent.
    pub message: String,
}

impl Refused {
    fn new(param: impl Into<String>, why: impl std::fmt::Display) -> Self {
        Refused {
            param: param.into(),
            message: why.to_string(),
        }
    }
}

impl From<Refused> for ApiError {
    fn from(r: Refused) -> Self {
        ApiError::invalid(r.message, Some(&r.param))
    }
}

/// The attempt's request: the client's body as is for the credential's own format, else
/// translated into it, with the upstream model name. `max_output_tokens` is the model's own
/// output limit, the `max_tokens` an Anthropic credential is sent for a chat request that names
/// none (its family's limit, [`chat_to_messages::default_max_tokens`], when the model has none).
pub fn request(
    endpoint: Endpoint,
    cred: &Credential,
    body: &Fields,
    upstream_model: &str,
    max_output_tokens: Option<u64>,
) -> Result<Outgoing, Refused> {
    let Some(t) = Translation::of(endpoint, cred.provider) else {
        return Ok(adapter::outgoing(endpoint, cred, body, upstream_model));
    };
    let fields = fields_as_map(body)?;
    let mut max_tokens_chosen = None;
    let translated = match t {
        Translation::ChatToMessages => {
            let bound =
                max_output_tokens.unwrap_or_else(|| chat_to_messages::default_max_tokens(upstream_model));
            let named = ["max_tokens", "max_completion_tokens"]
                .iter()
                .any(|k| fields.get(*k).is_some_and(|v| !v.is_null()));
            if !named {
                max_tokens_chosen = Some(bound);
            }
            chat_to_messages::request(&fields, upstream_model, bound)?
        }
        Translation::MessagesToChat => messages_to_chat::request(&fields, upstream_model, cred.provider)?,
    };
    Ok(Outgoing {
        url: cred.url(t.upstream_endpoint(), upstream_model).clone(),
        body: Bytes::from(translated.to_string()),
        max_tokens_chosen,
    })
}

/// A complete answer of the upstream, already checked to be its endpoint's (which read its
/// usage block), in the client's format; `Err` says why it cannot be (the answer is then refused
/// like an invalid one).
pub fn answer(t: Translation, body: &[u8]) -> Result<Bytes, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("unreadable answer: {e}"))?;
    let out = match t {
        Translation::ChatToMessages => chat_to_messages::answer(&v, now_secs())?,
        Translation::MessagesToChat => messages_to_chat::answer(&v)?,
    };
    Ok(Bytes::from(out.to_string()))
}

/// A usage block in the format of `client`'s endpoint for `usage` (the gateway's estimate).
pub fn usage_block(client: Endpoint, usage: Usage) -> Value {
    match client {
        Endpoint::Messages => json!({"input_tokens": usage.prompt, "output_tokens": usage.completion,
            "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}),
        _ => json!({"prompt_tokens": usage.prompt, "completion_tokens": usage.completion,
            "total_tokens": usage.prompt.saturating_add(usage.completion)}),
    }
}

/// A translated answer (the gateway's own JSON, in `client`'s format) with `usage` in place of
/// the usage it carried: the estimate the gateway counts when the upstream's was absurd or
/// missing.
pub fn with_usage(client: Endpoint, body: &[u8], usage: Usage) -> Bytes {
    let Ok(mut v) = serde_json::from_slice::<Value>(body) else {
        return Bytes::copy_from_slice(body);
    };
    v["usage"] = usage_block(client, usage);
    Bytes::from(v.to_string())
}

/// An upstream error body rendered for a client of `client` whose credential speaks the other
/// format: the upstream's message (and type) kept, in the client's error shape. `status` is the
/// upstream's, which the response keeps.
pub fn error_body(t: Translation, status: u16, body: &[u8]) -> Bytes {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let text = || {
        let s = String::from_utf8_lossy(body);
        let s = s.trim();
        if s.is_empty() {
            format!("upstream error (status {status})")
        } else {
            s.chars().take(2000).collect()
        }
    };
    let out = match t {
        // Anthropic's `{"type":"error","error":{"type","message"}}` → OpenAI's error object, in
        // OpenAI's words.
        Translation::ChatToMessages => {
            let (kind, code) = openai_error_of(v.pointer("/error/type").and_then(Value::as_str), status);
            let message = v
                .pointer("/error/message")
                .and_then(Value::as_str)
                .map_or_else(text, str::to_owned);
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
        // OpenAI's `{"error":{"message","type","code"}}` (or a list of them) → Anthropic's.
        Translation::MessagesToChat => {
            let e = if v.is_array() { &v[0]["error"] } else { &v["error"] };
            let message = e
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(text, str::to_owned);
            json!({"type": "error", "error": {"type": anthropic_type(status), "message": message}})
        }
    };
    Bytes::from(out.to_string())
}

/// OpenAI's error `type` and `code` for an Anthropic error `type` (or, where it names none, for
/// the HTTP status): the words of OpenAI's format, so that Anthropic's never leak into a chat
/// client's error. `code` is OpenAI's own where it has one for the case, else none.
pub fn openai_error_of(anthropic_type: Option<&str>, status: u16) -> (&'static str, Option<&'static str>) {
    match anthropic_type {
        Some("invalid_request_error") => ("invalid_request_error", None),
        Some("authentication_error") => ("authentication_error", Some("invalid_api_key")),
        Some("permission_error") => ("permission_error", None),
        Some("not_found_error") => ("invalid_request_error", Some("model_not_found")),
        Some("request_too_large") => ("invalid_request_error", None),
        Some("rate_limit_error") => ("rate_limit_error", Some("rate_limit_exceeded")),
        Some("billing_error") => ("insufficient_quota", Some("insufficient_quota")),
        Some("api_error" | "overloaded_error" | "timeout_error") => ("api_error", None),
        _ => (openai_type(status), None),
    }
}

/// Anthropic's error `type` for an OpenAI-format error object (a mid-stream one): by its HTTP
/// status where it names one as its `code` (OpenRouter's `{"code": 502, …}`), else by the words
/// of its `type` and `code`.
pub fn anthropic_error_of(error: &Value) -> &'static str {
    let status = match &error["code"] {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    if let Some(status) = status
        .and_then(|s| u16::try_from(s).ok())
        .filter(|s| (400..=599).contains(s))
    {
        return anthropic_type(status);
    }
    let words = [&error["type"], &error["code"]]
        .iter()
        .filter_map(|w| w.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    let table: &[(&str, &'static str)] = &[
        ("rate_limit", "rate_limit_error"),
        ("insufficient_quota", "billing_error"),
        ("overloaded", "overloaded_error"),
        ("invalid_api_key", "authentication_error"),
        ("authentication", "authentication_error"),
        ("permission", "permission_error"),
        ("not_found", "not_found_error"),
        ("timeout", "timeout_error"),
        ("invalid_request", "invalid_request_error"),
    ];
    table
        .iter()
        .find(|(w, _)| words.contains(w))
        .map_or("api_error", |(_, t)| t)
}

/// OpenAI's error `type` for an HTTP status, where the upstream named none.
fn openai_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// Anthropic's error `type` for an HTTP status (its documented table).
pub fn anthropic_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 | 503 => "overloaded_error",
        504 => "timeout_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// The request's top-level fields as a JSON map (nested values built: a translation rewrites
/// them).
fn fields_as_map(body: &Fields) -> Result<Map<String, Value>, Refused> {
    let json = body.to_json_with_model("");
    serde_json::from_slice(&json).map_err(|e| Refused::new("messages", format!("unreadable request: {e}")))
}

/// Seconds since the Unix epoch, for `created`.
fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A JSON value's kind, for a refusal.
fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_requests_are_translated() {
        use Endpoint::*;
        let rows: &[(Endpoint, Provider, Option<Translation>)] = &[
            (ChatCompletions, Provider::OpenAi, None),
            (
                ChatCompletions,
                Provider::Anthropic,
                Some(Translation::ChatToMessages),
            ),
            (Messages, Provider::Anthropic, None),
            (Messages, Provider::OpenRouter, Some(Translation::MessagesToChat)),
            (Messages, Provider::Gemini, Some(Translation::MessagesToChat)),
            (
                Messages,
                Provider::OpenAiCompatible,
                Some(Translation::MessagesToChat),
            ),
            (Embeddings, Provider::OpenAi, None),
            (Embeddings, Provider::Anthropic, None),
        ];
        for (endpoint, provider, want) in rows {
            assert_eq!(
                Translation::of(*endpoint, *provider),
                *want,
                "{endpoint:?} {provider:?}"
            );
        }
    }

    /// A mid-stream error in OpenAI's format is typed in Anthropic's words by its status or
    /// its own words; never `api_error` for everything.
    #[test]
    fn mid_stream_errors_are_typed_for_anthropic() {
        let rows = [
            (json!({"code": 502, "message": "provider error"}), "api_error"),
            (json!({"code": 429, "message": "slow down"}), "rate_limit_error"),
            (json!({"code": "503", "message": "x"}), "overloaded_error"),
            (
                json!({"type": "requests", "code": "rate_limit_exceeded"}),
                "rate_limit_error",
            ),
            (
                json!({"type": "insufficient_quota", "code": "insufficient_quota"}),
                "billing_error",
            ),
            (
                json!({"type": "invalid_request_error", "code": "context_length_exceeded"}),
                "invalid_request_error",
            ),
            (json!({"type": "server_error"}), "api_error"),
            (json!({"message": "x"}), "api_error"),
        ];
        for (error, want) in rows {
            assert_eq!(anthropic_error_of(&error), want, "{error}");
        }
        let rows = [
            (Some("overloaded_error"), 529, ("api_error", None)),
            (
                Some("rate_limit_error"),
                429,
                ("rate_limit_error", Some("rate_limit_exceeded")),
            ),
            (
                Some("not_found_error"),
                404,
                ("invalid_request_error", Some("model_not_found")),
            ),
            (
                Some("authentication_error"),
                401,
                ("authentication_error", Some("invalid_api_key")),
            ),
            (Some("something_new"), 418, ("invalid_request_error", None)),
            (None, 500, ("api_error", None)),
        ];
        for (kind, status, want) in rows {
            assert_eq!(openai_error_of(kind, status), want, "{kind:?}");
        }
    }

    /// Errors keep the upstream's message and type, in the shape of the client's endpoint.
    #[test]
    fn errors_are_rendered_in_the_clients_shape() {
        let rows: &[(Translation, u16, &str, Value)] = &[
            (
                Translation::ChatToMessages,
                429,
                r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#,
                json!({"error": {"message": "Number of request tokens has exceeded your per-minute rate limit",
                    "type": "rate_limit_error", "param": null, "code": "rate_limit_exceeded"}}),
            ),
            (
                Translation::ChatToMessages,
                529,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                json!({"error": {"message": "Overloaded", "type": "api_error", "param": null,
                    "code": null}}),
            ),
            (
                Translation::ChatToMessages,
                502,
                "Bad Gateway",
                json!({"error": {"message": "Bad Gateway", "type": "api_error", "param": null, "code": null}}),
            ),
            (
                Translation::MessagesToChat,
                429,
                r#"{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
                json!({"type": "error", "error": {"type": "rate_limit_error",
                    "message": "Rate limit reached for requests"}}),
            ),
            (
                Translation::MessagesToChat,
                401,
                r#"[{"error":{"code":401,"message":"API key not valid.","status":"UNAUTHENTICATED"}}]"#,
                json!({"type": "error", "error": {"type": "authentication_error", "message": "API key not valid."}}),
            ),
            (
                Translation::MessagesToChat,
                503,
                "",
                json!({"type": "error", "error": {"type": "overloaded_error",
                    "message": "upstream error (status 503)"}}),
            ),
        ];
        for (t, status, body, want) in rows {
            let got: Value = serde_json::from_slice(&error_body(*t, *status, body.as_bytes())).unwrap();
            assert_eq!(&got, want, "{t:?} {status} {body}");
        }
    }
}
