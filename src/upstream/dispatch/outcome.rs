//! What dispatch hands back: each attempt as the log shows it, an upstream's error kept to pass
//! back, and how the walk through the candidates ended.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::ApiError;
use crate::provider::Credential;
use crate::provider::Provider;
use crate::transport::http;
use crate::upstream::pool::admission::Slot;
use crate::upstream::pool::routes::ModelRoute;

/// One upstream attempt, as the request log shows it.
#[derive(Clone, Debug, Serialize)]
pub struct Attempt {
    /// Credential name.
    pub credential: String,
    /// Credential id.
    pub credential_id: i64,
    /// Public model tried.
    pub model: String,
    /// Status answered; none when the connection failed.
    pub status: Option<u16>,
    /// The classification rule that matched a failure.
    pub rule: Option<&'static str>,
    /// What went wrong, when the connection failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The provider's own words, when it answered an error: its message, masked and bounded
    /// ([`provider_words`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The lock the failure wrote, RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_until: Option<String>,
    /// The credential's provider.
    #[serde(serialize_with = "provider_name")]
    pub provider: Provider,
    /// The translation the request went through (set when the request completes), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub translated: Option<&'static str>,
    /// The `max_tokens` the gateway chose for the translated request of the attempt that
    /// served, the client having named none: the model's `max_output_tokens`, else its family's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens_chosen: Option<u64>,
    /// Its span, when the request is traced and this attempt sent a request.
    #[serde(skip)]
    pub span: Option<crate::observability::otel::AttemptSpan>,
    /// Whether a request went upstream: false for the gateway's own "credential busy" (no slot
    /// came free, nothing was sent). `x-aigw-attempts` counts only requests sent.
    #[serde(skip)]
    pub sent: bool,
}

/// Where dispatch writes: the request's attempts, and its trace (each request sent carries it).
pub struct AttemptLog<'a> {
    /// Every attempt, for the log.
    pub attempts: &'a mut Vec<Attempt>,
    /// The credential and model whose request is out, until its attempt is logged among
    /// `attempts`: what a request abandoned meanwhile was waiting for.
    pub under_way: &'a mut Option<(Arc<Credential>, Arc<ModelRoute>)>,
    /// The request's trace, when traces are exported.
    pub trace: Option<&'a crate::observability::otel::RequestTrace>,
}

fn provider_name<S: serde::Serializer>(p: &Provider, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(p.as_str())
}

impl Attempt {
    /// An attempt of `model` on `cred`, outcome still to be filled in.
    pub fn of(cred: &Credential, model: &ModelRoute) -> Self {
        Attempt {
            credential: cred.name.clone(),
            credential_id: cred.id,
            model: model.name.clone(),
            status: None,
            rule: None,
            error: None,
            message: None,
            lock_until: None,
            provider: cred.provider,
            translated: None,
            max_tokens_chosen: None,
            span: None,
            sent: true,
        }
    }
}

/// An upstream's error response, kept to pass back as is.
#[derive(Debug)]
pub struct UpstreamError {
    /// Status.
    pub status: u16,
    /// Headers worth passing on (content type, Retry-After).
    pub headers: HeaderMap,
    /// Body, in the provider's own format (classified as such; rendered for the client by
    /// `translate::error_body` when the client called the other format).
    pub body: Bytes,
    /// The provider that answered it.
    pub provider: Provider,
    /// The end of the lock its classification wrote, if any: the wait the client is told
    /// when the error is passed on (DESIGN.md §7).
    pub lock_until: Option<DateTime<Utc>>,
}

/// What a candidate that served answered.
pub enum Answer {
    /// The event stream the request asked for, to pass on as it comes.
    Stream(http::Response),
    /// A complete answer, read whole and checked to be what the endpoint promises.
    Complete(Complete),
}

/// A complete (not streamed) answer.
pub struct Complete {
    /// Status (a success).
    pub status: u16,
    /// The upstream's content type.
    pub content_type: Option<HeaderValue>,
    /// The body, the endpoint's JSON.
    pub body: Bytes,
    /// The answer's usage block as the upstream sent it (`None` when absent or `null`), read
    /// when the answer was checked (one parse of the body), and the endpoint whose format that
    /// is: a translated answer's (`body` is in the client's format) is checked in the provider's
    /// own words, as a translation may hide what was wrong with it.
    pub usage: (
        crate::provider::adapter::Endpoint,
        Option<Box<serde_json::value::RawValue>>,
    ),
}

/// How dispatch ended.
pub enum Dispatched {
    /// A candidate answered with success.
    Served {
        /// The stream to pass on, or the complete answer.
        answer: Answer,
        /// Who served it.
        credential: Arc<Credential>,
        /// Which public model.
        model: Arc<ModelRoute>,
        /// Time until the response headers.
        upstream_latency: Duration,
        /// The credential's in-flight slot, to hold until the response (or stream) is complete.
        slot: Slot,
    },
    /// Every candidate failed; this is the last upstream error.
    UpstreamFailed(UpstreamError),
    /// The gateway itself could not get an answer.
    GatewayFailed(ApiError),
}

/// The most characters of a provider's words kept for the log and the credential's card.
pub const WORDS_MAX_CHARS: usize = 300;

/// What a provider said in an error answer, for people: the error's message where the body is one
/// of the known JSON shapes (OpenAI, Anthropic, Gemini and OpenRouter's `error.message`, with
/// OpenRouter's `metadata.raw` after its "Provider returned error"; a top-level `message`,
/// `detail` or string `error`; the first element of an array), else the body's text; whitespace
/// runs and control characters become one space, and at most [`WORDS_MAX_CHARS`] characters are
/// kept. `body` is already masked (`exchange::read_error`). None for an empty body.
pub fn provider_words(body: &[u8]) -> Option<String> {
    let json = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .map(|v| match v {
            serde_json::Value::Array(mut items) if !items.is_empty() => items.swap_remove(0),
            other => other,
        });
    let text = |v: Option<&serde_json::Value>| v.and_then(serde_json::Value::as_str).map(str::to_owned);
    let found = json.as_ref().and_then(|v| {
        let error = v.get("error");
        let message = text(error.and_then(|e| e.get("message")));
        let raw = text(error.and_then(|e| e.get("metadata")).and_then(|m| m.get("raw")));
        match (message, raw) {
            (Some(m), Some(r)) => Some(format!("{m}: {r}")),
            (Some(m), None) => Some(m),
            (None, _) => text(error)
                .or_else(|| text(v.get("message")))
                .or_else(|| text(v.get("detail"))),
        }
    });
    let words = found.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let mut out = String::new();
    let mut kept = 0;
    for part in words
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|p| !p.is_empty())
    {
        if kept > 0 {
            out.push(' ');
            kept += 1;
        }
        for c in part.chars() {
            if kept == WORDS_MAX_CHARS {
                out.push('…');
                return Some(out);
            }
            out.push(c);
            kept += 1;
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::{WORDS_MAX_CHARS, provider_words};

    /// Real error bodies of each provider, and what the log and the card show of them.
    #[test]
    fn the_providers_words_are_their_message() {
        let cases: [(&str, Option<&str>); 10] = [
            (
                r#"{"error":{"message":"Rate limit reached for gpt-4o-mini in organization org-abc123 on requests per day (RPD): Limit 10000, Used 10000, Requested 1.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
                Some(
                    "Rate limit reached for gpt-4o-mini in organization org-abc123 on requests per day (RPD): Limit 10000, Used 10000, Requested 1.",
                ),
            ),
            (
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011CUaT9x2"}"#,
                Some("Overloaded"),
            ),
            (
                r#"{"error":{"message":"Provider returned error","code":429,"metadata":{"raw":"qwen/qwen3-coder:free is temporarily rate-limited upstream.","provider_name":"ModelRun"}}}"#,
                Some("Provider returned error: qwen/qwen3-coder:free is temporarily rate-limited upstream."),
            ),
            (
                r#"[{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}]"#,
                Some("Resource has been exhausted (e.g. check quota)."),
            ),
            (r#"{"error":"invalid api key ***"}"#, Some("invalid api key ***")),
            (r#"{"detail":"Not Found"}"#, Some("Not Found")),
            (
                r#"{"message":"Internal\n\tserver   error"}"#,
                Some("Internal server error"),
            ),
            (
                "<html>\r\n<h1>502 Bad Gateway</h1>\r\n</html>",
                Some("<html> <h1>502 Bad Gateway</h1> </html>"),
            ),
            ("", None),
            ("  \n ", None),
        ];
        for (body, want) in cases {
            assert_eq!(provider_words(body.as_bytes()).as_deref(), want, "{body}");
        }
    }

    /// A long message is cut at a character, never inside one; bytes that are not UTF-8 are
    /// replaced, not refused.
    #[test]
    fn long_or_broken_words_are_bounded() {
        let body = format!(r#"{{"error":{{"message":"{}"}}}}"#, "é".repeat(400));
        let words = provider_words(body.as_bytes()).unwrap();
        assert_eq!(words.chars().count(), WORDS_MAX_CHARS + 1);
        assert!(words.ends_with('…'));
        assert_eq!(provider_words(&[0xff, b'x']).as_deref(), Some("\u{fffd}x"));
    }
}
