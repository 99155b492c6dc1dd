//! The one error enum of the gateway's own refusals, rendered in one place as OpenAI-shaped JSON
//! with a stable `code`, and the `x-aigw-error-source: gateway` header.

use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

mod label_message;
use label_message::label_limit_message;

/// Header naming who produced an error: `gateway` or `upstream`.
pub const ERROR_SOURCE: HeaderName = HeaderName::from_static("x-aigw-error-source");
/// Header the official SDKs read to decide whether to retry by themselves.
pub const SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");
/// The longest wait the official SDKs are left to sit out by themselves (DESIGN.md §7): a
/// refusal or passed-on upstream error that names a longer one also says `x-should-retry: false`.
pub const MAX_SDK_WAIT_SECS: u64 = 60;

/// `Retry-After` of a `store_unavailable` refusal.
pub const STORE_RETRY_AFTER_SECS: u64 = 2;

/// `Retry-After` of a `concurrency_limit` refusal: short, as a slot frees when any of the
/// caller's requests ends.
pub const CONCURRENCY_RETRY_AFTER_SECS: u64 = 2;

/// What a quota refusal reports.
#[derive(Debug)]
pub struct QuotaRefusal {
    /// `apikey`, `member`, `dept` or `ws`.
    pub subject: &'static str,
    /// The metric.
    pub metric: &'static str,
    /// The window, canonical form.
    pub window: String,
    /// The limit (credits as a decimal number).
    pub limit: Value,
    /// Used so far (same unit).
    pub used: Value,
    /// RFC 3339 with the zone's offset; none for `total`.
    pub reset_at: Option<String>,
    /// For a `tag` or `end_user` policy: which one (`team=search`, the end user's id).
    pub subject_name: Option<String>,
}

/// A refusal or failure produced by the gateway itself.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No key, or a key the gateway does not know.
    #[error(
        "invalid API key: provide a valid gateway key as `Authorization: Bearer sk-aigw-…` or `x-api-key`"
    )]
    InvalidApiKey,
    /// A known key past its `expires_at` (issue 25 item 2). Neither counted toward the key's
    /// breaker nor logged, like every 401: nothing was attempted for the key, and counting would
    /// let a forgotten client ban a key for good before an admin extends it.
    #[error(
        "this API key expired at {expired_at}; ask its owner or a workspace admin to extend it or \
         to issue a new key"
    )]
    KeyExpired {
        /// When it expired, RFC 3339.
        expired_at: String,
    },
    /// The key's breaker is open (DESIGN.md §5).
    #[error("{message}")]
    CircuitOpen {
        /// Localised message (LyRouter's wording).
        message: String,
        /// Whole seconds to wait.
        retry_after: u64,
        /// End of the block, RFC 3339.
        blocked_until: String,
    },
    /// The key is banned for good (DESIGN.md §5).
    #[error("{message}")]
    KeyBanned {
        /// Localised message (first or later wording).
        message: String,
    },
    /// An admin resource that does not exist in the caller's workspace (or is not theirs).
    #[error("{what} not found")]
    NotFound {
        /// What was looked for.
        what: &'static str,
    },
    /// Every credential of every model in the chain is parked (DESIGN.md §6, LyRouter).
    #[error("all upstream credentials for this model are rate limited")]
    UpstreamQuotaExhausted {
        /// Milliseconds until the earliest lock ends (`retry-after-ms`, exact; `Retry-After` and
        /// the body's `retry_after` round it up to whole seconds).
        retry_after_ms: u64,
    },
    /// The signed-in member's role may not do this (admin API).
    #[error("{message}")]
    Forbidden {
        /// What was refused and which role it needs.
        message: String,
    },
    /// A name already taken, or a change that would break an invariant (admin API).
    #[error("{message}")]
    Conflict {
        /// What conflicts.
        message: String,
    },
    /// A well-formed request with a field whose value is not acceptable (admin API).
    #[error("{message}")]
    InvalidField {
        /// The field, as named in the request body or query.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// Wrong email or password at sign-in.
    #[error("invalid email or password")]
    InvalidCredentials,
    /// `/metrics` without the configured `metrics_token`.
    #[error("missing or invalid metrics token: send `Authorization: Bearer <metrics_token>`")]
    InvalidMetricsToken,
    /// Missing, malformed, expired or forged admin token.
    #[error(
        "missing or invalid admin token: sign in at POST /admin/v1/auth/login and send `Authorization: Bearer <token>`"
    )]
    InvalidToken,
    /// Too many failed authentications from one address.
    #[error("too many failed authentication attempts from this address; retry in {retry_after} seconds")]
    AuthThrottled {
        /// Seconds to wait.
        retry_after: u64,
    },
    /// The model is not offered in the caller's workspace.
    #[error("the model `{model}` does not exist or you do not have access to it")]
    ModelNotFound {
        /// The model asked for.
        model: String,
    },
    /// The model is outside the key's or its member's allow-list (issue 25 item 3). Logged, and
    /// counted toward the key's breaker like every gateway refusal.
    #[error(
        "the model `{model}` is not allowed for {}; GET /v1/models lists the models it may call",
        .by.described()
    )]
    ModelNotAllowed {
        /// The model asked for.
        model: String,
        /// Whose list refused it.
        by: crate::kernel::caller::Guarded,
    },
    /// A tag outside the key's `allowed_tags` (issue 25 item 6). Logged, and counted toward the
    /// key's breaker like `model_not_allowed`.
    #[error(
        "the tag `{tag}` is not allowed for this API key; send only the tags its allowed_tags list, \
         or ask an admin to add it"
    )]
    TagNotAllowed {
        /// The first tag refused, `key=value`.
        tag: String,
    },
    /// A tag value or end user new to the workspace, past its cap (settings `max_tag_keys`,
    /// `max_tag_values`, `max_end_users`; issue 25 item 6), or past the caps on what one key
    /// brings (`max_*_per_key`; issue 40 item 3). Values already seen keep working.
    #[error("{}", label_limit_message(*over, tag_key.as_deref(), *limit, *per_key))]
    LabelLimit {
        /// Which cap.
        over: crate::store::OverCap,
        /// The tag key, for a tag.
        tag_key: Option<String>,
        /// The cap.
        limit: i64,
        /// The key's own cap, not the workspace's.
        per_key: bool,
    },
    /// The key or its member already has `max_in_flight` requests in flight on this gateway
    /// (issue 25 item 4). Logged, and counted toward the key's breaker like every gateway 429.
    #[error(
        "{} already has {limit} requests in flight, its max_in_flight; retry when one of them ends",
        .by.described()
    )]
    ConcurrencyLimit {
        /// Whose cap.
        by: crate::kernel::caller::Guarded,
        /// The cap.
        limit: u32,
    },
    /// Malformed JSON, wrong types, missing fields.
    #[error("{message}")]
    InvalidRequest {
        /// What is wrong, naming the field.
        message: String,
        /// The field, if one.
        param: Option<String>,
    },
    /// The body exceeds the configured limit.
    #[error("request body exceeds the limit of {limit} bytes")]
    RequestTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The request line and headers exceed the configured limit (a protocol-level refusal).
    #[error("the request line and headers exceed the limit of {limit} bytes")]
    HeaderTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The request target is longer than the HTTP parser accepts (a protocol-level refusal).
    #[error("the request URI is too long")]
    UriTooLong,
    /// The gateway holds as many client connections as it may; this one is closed after the answer.
    #[error("the gateway has reached its limit of {limit} open client connections; retry shortly")]
    TooManyConnections {
        /// The configured limit.
        limit: usize,
    },
    /// No such route.
    #[error("no route for {method} {path}")]
    RouteNotFound {
        /// Method.
        method: String,
        /// Path.
        path: String,
    },
    /// The route exists, but not with this method.
    #[error("{method} is not allowed on {path}")]
    MethodNotAllowed {
        /// Method.
        method: String,
        /// Path.
        path: String,
    },
    /// The upstream could not be reached or answered garbage, and no candidate remained.
    #[error("upstream request failed: {message}")]
    UpstreamUnreachable {
        /// What happened (no secrets: the URL's host and the error kind).
        message: String,
    },
    /// The upstream answered something other than what the endpoint promises (a success that
    /// is not the endpoint's JSON, an event stream to a request that asked for none, a status
    /// outside 100–599), and no candidate remained.
    #[error("the upstream's answer was not a valid response: {reason}")]
    UpstreamInvalidResponse {
        /// What was wrong with it (never the body itself).
        reason: String,
    },
    /// An upstream deadline passed (DESIGN.md §9: every wait is bounded): what did not come in
    /// time, and the setting that bounds it.
    #[error("{0}")]
    Timeout(crate::deadline::Missed),
    /// The client did not send its whole request body within `client_body_timeout_secs`.
    #[error("the request body did not arrive within {seconds} s (client_body_timeout_secs)")]
    RequestTimeout {
        /// The bound.
        seconds: u64,
    },
    /// A guardrail quota is used up (LyRouter's contract, DESIGN.md §4).
    #[error("rate limit exceeded on {} {}/{}", .0.subject, .0.metric, .0.window)]
    QuotaExceeded(Box<QuotaRefusal>),
    /// The database is unreachable and the answer needs it (a key or quota counter this gateway
    /// has not seen, a sign-in, an admin call).
    #[error("the gateway's database is unreachable; retry in a few seconds")]
    StoreUnavailable,
    /// The store failed otherwise.
    #[error("internal error; the request id identifies it in the gateway's logs")]
    Internal,
}

impl From<&crate::store::StoreError> for ApiError {
    /// A store failure on a request: 503 `store_unavailable` when the database is out of reach,
    /// else logged and answered 500 without detail.
    fn from(e: &crate::store::StoreError) -> Self {
        if e.is_unreachable() {
            ApiError::StoreUnavailable
        } else {
            tracing::error!(error = %e, "store call failed");
            ApiError::Internal
        }
    }
}

impl From<&crate::deadline::Deadline> for ApiError {
    /// The answer when a deadline passed before any byte went to the client: 408
    /// `request_timeout` for the client's body, else 504 `timeout`.
    fn from(d: &crate::deadline::Deadline) -> Self {
        let missed = d.missed();
        match missed.wait {
            crate::deadline::Wait::ClientBody => ApiError::RequestTimeout {
                seconds: missed.seconds,
            },
            _ => ApiError::Timeout(missed),
        }
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> Self {
        ApiError::from(&e)
    }
}

impl ApiError {
    /// A 400 naming the field.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError::InvalidRequest {
            message: message.into(),
            param: param.map(str::to_owned),
        }
    }

    /// A 422 naming the field.
    pub fn field(field: &str, message: impl Into<String>) -> Self {
        ApiError::InvalidField {
            field: field.to_owned(),
            message: message.into(),
        }
    }

    /// HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidApiKey
            | ApiError::KeyExpired { .. }
            | ApiError::InvalidCredentials
            | ApiError::InvalidToken
            | ApiError::InvalidMetricsToken => StatusCode::UNAUTHORIZED,
            ApiError::AuthThrottled { .. }
            | ApiError::QuotaExceeded(_)
            | ApiError::CircuitOpen { .. }
            | ApiError::ConcurrencyLimit { .. }
            | ApiError::UpstreamQuotaExhausted { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::KeyBanned { .. }
            | ApiError::Forbidden { .. }
            | ApiError::ModelNotAllowed { .. }
            | ApiError::TagNotAllowed { .. } => StatusCode::FORBIDDEN,
            ApiError::Conflict { .. } => StatusCode::CONFLICT,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::InvalidField { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::ModelNotFound { .. } | ApiError::RouteNotFound { .. } | ApiError::NotFound { .. } => {
                StatusCode::NOT_FOUND
            }
            ApiError::InvalidRequest { .. } | ApiError::LabelLimit { .. } => StatusCode::BAD_REQUEST,
            ApiError::RequestTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::HeaderTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::UriTooLong => StatusCode::URI_TOO_LONG,
            ApiError::TooManyConnections { .. } | ApiError::StoreUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::UpstreamUnreachable { .. } | ApiError::UpstreamInvalidResponse { .. } => {
                StatusCode::BAD_GATEWAY
            }
            ApiError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::RequestTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable machine-readable code (also the metric label).
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidApiKey => "invalid_api_key",
            ApiError::KeyExpired { .. } => "api_key_expired",
            ApiError::InvalidCredentials => "invalid_credentials",
            ApiError::Forbidden { .. } => "forbidden",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::Conflict { .. } => "conflict",
            ApiError::InvalidField { .. } => "invalid_field",
            ApiError::InvalidToken => "invalid_token",
            ApiError::InvalidMetricsToken => "invalid_metrics_token",
            ApiError::AuthThrottled { .. } => "auth_rate_limited",
            ApiError::ModelNotFound { .. } => "model_not_found",
            ApiError::ModelNotAllowed { .. } => "model_not_allowed",
            ApiError::TagNotAllowed { .. } => "tag_not_allowed",
            ApiError::LabelLimit {
                over: crate::store::OverCap::EndUsers,
                ..
            } => "end_user_limit",
            ApiError::LabelLimit { .. } => "tag_value_limit",
            ApiError::ConcurrencyLimit { .. } => "concurrency_limit",
            ApiError::InvalidRequest { .. } => "invalid_request_error",
            ApiError::RequestTooLarge { .. } => "request_too_large",
            ApiError::HeaderTooLarge { .. } => "request_header_too_large",
            ApiError::UriTooLong => "uri_too_long",
            ApiError::TooManyConnections { .. } => "too_many_connections",
            ApiError::RouteNotFound { .. } | ApiError::NotFound { .. } => "not_found",
            ApiError::UpstreamUnreachable { .. } => "upstream_unreachable",
            ApiError::UpstreamInvalidResponse { .. } => "upstream_invalid_response",
            ApiError::Timeout(_) => "timeout",
            ApiError::RequestTimeout { .. } => "request_timeout",
            ApiError::StoreUnavailable => "store_unavailable",
            ApiError::Internal => "internal_error",
            ApiError::QuotaExceeded(_) => "quota_exceeded",
            ApiError::CircuitOpen { .. } => "api_key_circuit_open",
            ApiError::UpstreamQuotaExhausted { .. } => "upstream_quota_exhausted",
            ApiError::KeyBanned { .. } => "api_key_permanently_banned",
        }
    }

    /// The OpenAI error `type`.
    pub fn error_type(&self) -> &'static str {
        match self {
            ApiError::InvalidApiKey
            | ApiError::KeyExpired { .. }
            | ApiError::InvalidCredentials
            | ApiError::InvalidToken
            | ApiError::InvalidMetricsToken => "authentication_error",
            ApiError::AuthThrottled { .. }
            | ApiError::QuotaExceeded(_)
            | ApiError::CircuitOpen { .. }
            | ApiError::ConcurrencyLimit { .. }
            | ApiError::UpstreamQuotaExhausted { .. } => "rate_limit_error",
            ApiError::KeyBanned { .. }
            | ApiError::Forbidden { .. }
            | ApiError::ModelNotAllowed { .. }
            | ApiError::TagNotAllowed { .. } => "permission_error",
            ApiError::Conflict { .. } | ApiError::InvalidField { .. } | ApiError::MethodNotAllowed { .. } => {
                "invalid_request_error"
            }
            ApiError::ModelNotFound { .. }
            | ApiError::InvalidRequest { .. }
            | ApiError::LabelLimit { .. }
            | ApiError::RequestTooLarge { .. }
            | ApiError::RequestTimeout { .. }
            | ApiError::HeaderTooLarge { .. }
            | ApiError::UriTooLong
            | ApiError::RouteNotFound { .. }
            | ApiError::NotFound { .. } => "invalid_request_error",
            ApiError::UpstreamUnreachable { .. }
            | ApiError::UpstreamInvalidResponse { .. }
            | ApiError::Timeout(_)
            | ApiError::TooManyConnections { .. }
            | ApiError::StoreUnavailable
            | ApiError::Internal => "api_error",
        }
    }

    /// Seconds the client should wait before retrying, if the refusal names a wait.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::AuthThrottled { retry_after } | ApiError::CircuitOpen { retry_after, .. } => {
                Some(*retry_after)
            }
            ApiError::UpstreamQuotaExhausted { retry_after_ms } => Some(retry_after_ms.div_ceil(1000).max(1)),
            // A connection slot frees as soon as any client's request or idle time ends.
            ApiError::TooManyConnections { .. } => Some(1),
            // The gateway checks the database every half second; most outages are restarts.
            ApiError::StoreUnavailable => Some(STORE_RETRY_AFTER_SECS),
            ApiError::ConcurrencyLimit { .. } => Some(CONCURRENCY_RETRY_AFTER_SECS),
            _ => None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        let mut error = json!({
            "message": self.to_string(),
            "type": self.error_type(),
            "code": self.code(),
            "param": Value::Null,
        });
        match self {
            ApiError::InvalidRequest { param: Some(p), .. } => error["param"] = json!(p),
            ApiError::InvalidField { field, .. } => error["param"] = json!(field),
            ApiError::ModelNotFound { .. } => error["param"] = json!("model"),
            ApiError::ModelNotAllowed { model, by } => {
                error["param"] = json!("model");
                error["model"] = json!(model);
                error["subject"] = json!(by.as_str());
            }
            ApiError::LabelLimit {
                over, tag_key, limit, ..
            } => {
                error["param"] = json!(match over {
                    crate::store::OverCap::EndUsers => crate::kernel::tags::END_USER_HEADER,
                    _ => crate::kernel::tags::TAGS_HEADER,
                });
                error["limit"] = json!(limit);
                if let Some(k) = tag_key {
                    error["tag_key"] = json!(k);
                }
            }
            ApiError::TagNotAllowed { tag } => {
                error["param"] = json!(crate::kernel::tags::TAGS_HEADER);
                error["tag"] = json!(tag);
            }
            ApiError::ConcurrencyLimit { by, limit } => {
                error["subject"] = json!(by.as_str());
                error["limit"] = json!(limit);
            }
            ApiError::QuotaExceeded(q) => {
                error["subject"] = json!(q.subject);
                error["metric"] = json!(q.metric);
                error["window"] = json!(q.window);
                error["limit"] = q.limit.clone();
                error["used"] = q.used.clone();
                error["reset_at"] = json!(q.reset_at);
                if let Some(name) = &q.subject_name {
                    error[q.subject] = json!(name);
                }
            }
            ApiError::CircuitOpen { blocked_until, .. } => error["blocked_until"] = json!(blocked_until),
            ApiError::KeyExpired { expired_at } => error["expired_at"] = json!(expired_at),
            _ => {}
        }
        if let Some(s) = self.retry_after() {
            error["retry_after"] = json!(s);
        }
        json!({ "error": error })
    }

    /// The error as the last event of a stream whose head has gone, in the format the client's
    /// endpoint streams: OpenAI's `data: {"error":…}` (the body a non-streamed answer carries),
    /// or Anthropic's `event: error`.
    pub fn stream_event(&self, anthropic: bool) -> String {
        if anthropic {
            let data = json!({"type": "error", "error": {"type": self.anthropic_type(), "message": self.to_string()}});
            format!("event: error\ndata: {data}\n\n")
        } else {
            format!("data: {}\n\n", self.body())
        }
    }

    /// The error `type` in Anthropic's words, where they differ from OpenAI's.
    fn anthropic_type(&self) -> &'static str {
        anthropic_type_of(self.error_type(), self.status())
    }
}

/// Anthropic's error `type` for one of the gateway's OpenAI-shaped ones: the same words, but
/// where Anthropic names the status more precisely.
fn anthropic_type_of(openai_type: &str, status: StatusCode) -> &'static str {
    match status.as_u16() {
        404 => "not_found_error",
        413 => "request_too_large",
        504 => "timeout_error",
        _ => match openai_type {
            "authentication_error" => "authentication_error",
            "permission_error" => "permission_error",
            "rate_limit_error" => "rate_limit_error",
            "invalid_request_error" => "invalid_request_error",
            _ => "api_error",
        },
    }
}

/// A gateway refusal's JSON ([`ApiError::body`]) in the envelope of Anthropic's format, for
/// `/v1/messages`: `{"type":"error","error":{…}}` whose `type` is in Anthropic's words, every
/// other field (`message`, the stable `code`, `param`, `retry_after`, `reset_at`, …) kept.
pub fn anthropic_envelope(body: Value, status: StatusCode) -> Value {
    let mut error = match body {
        Value::Object(mut o) => o.remove("error").unwrap_or(Value::Null),
        _ => Value::Null,
    };
    if !error.is_object() {
        error = json!({"message": "error"});
    }
    let kind = anthropic_type_of(error["type"].as_str().unwrap_or_default(), status);
    error["type"] = json!(kind);
    json!({"type": "error", "error": error})
}

impl ApiError {
    /// The headers every rendering of this error carries (besides the content type and length).
    fn headers(&self) -> axum::http::HeaderMap {
        let mut h = axum::http::HeaderMap::new();
        h.insert(ERROR_SOURCE, HeaderValue::from_static("gateway"));
        if let Some(s) = self.retry_after() {
            h.insert(axum::http::header::RETRY_AFTER, HeaderValue::from(s));
            // Exact where the gateway knows the instant (a lock's end): a client that honours
            // it comes back on time, not up to a second late.
            let ms = match self {
                ApiError::UpstreamQuotaExhausted { retry_after_ms } => (*retry_after_ms).max(1),
                _ => s.saturating_mul(1000),
            };
            h.insert(HeaderName::from_static("retry-after-ms"), HeaderValue::from(ms));
            if s > MAX_SDK_WAIT_SECS {
                h.insert(SHOULD_RETRY, HeaderValue::from_static("false"));
            }
        }
        // A used-up quota has no Retry-After (the client reads reset_at); the SDKs must not
        // retry it by themselves (each retry is one more failure toward the key's breaker).
        if matches!(self, ApiError::QuotaExceeded(_) | ApiError::KeyBanned { .. }) {
            h.insert(SHOULD_RETRY, HeaderValue::from_static("false"));
        }
        h
    }

    /// The whole HTTP/1.1 response, `connection: close`, for a refusal written straight to a
    /// client connection where no request reached the router (an over-capacity connection, a
    /// request the HTTP parser refused). The same status, headers and body as `into_response`.
    pub fn http1_response(&self) -> Vec<u8> {
        self.http1_answer(None)
    }

    /// [`Self::http1_response`] carrying `request_id` as its `x-request-id` (DESIGN.md §7: every
    /// response carries one, protocol refusals included).
    pub fn http1_response_with_id(&self, request_id: crate::kernel::request_id::RequestId) -> Vec<u8> {
        self.http1_answer(Some(request_id))
    }

    fn http1_answer(&self, request_id: Option<crate::kernel::request_id::RequestId>) -> Vec<u8> {
        use std::io::Write;
        let body = self.body().to_string();
        let status = self.status();
        let mut out = Vec::with_capacity(256 + body.len());
        let _ = write!(
            out,
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            body.len()
        );
        if let Some(id) = request_id {
            out.extend_from_slice(b"x-request-id: ");
            out.extend_from_slice(id.encode(&mut [0; 36]).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        for (name, value) in &self.headers() {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body.as_bytes());
        out
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body();
        let mut resp = (self.status(), axum::Json(body)).into_response();
        resp.headers_mut().extend(self.headers());
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deadline::{Deadline, Missed, Wait};

    /// One value of every variant. The match below has no wildcard: a new variant does not
    /// compile until it has a number there, and `every_variant_is_listed` fails until it is
    /// listed here, so `docs/reference.md` is checked against it.
    fn every_variant() -> Vec<ApiError> {
        let refusal = QuotaRefusal {
            subject: "apikey",
            metric: "requests",
            window: "day".into(),
            limit: json!(1),
            used: json!(1),
            reset_at: None,
            subject_name: None,
        };
        let text = || "x".to_owned();
        vec![
            ApiError::InvalidApiKey,
            ApiError::CircuitOpen {
                message: text(),
                retry_after: 30,
                blocked_until: text(),
            },
            ApiError::KeyBanned { message: text() },
            ApiError::NotFound { what: "key" },
            ApiError::UpstreamQuotaExhausted { retry_after_ms: 1000 },
            ApiError::Forbidden { message: text() },
            ApiError::Conflict { message: text() },
            ApiError::InvalidField {
                field: text(),
                message: text(),
            },
            ApiError::InvalidCredentials,
            ApiError::InvalidToken,
            ApiError::AuthThrottled { retry_after: 1 },
            ApiError::ModelNotFound { model: text() },
            ApiError::InvalidRequest {
                message: text(),
                param: None,
            },
            ApiError::RequestTooLarge { limit: 1 },
            ApiError::HeaderTooLarge { limit: 1 },
            ApiError::UriTooLong,
            ApiError::TooManyConnections { limit: 1 },
            ApiError::RouteNotFound {
                method: text(),
                path: text(),
            },
            ApiError::MethodNotAllowed {
                method: text(),
                path: text(),
            },
            ApiError::UpstreamUnreachable { message: text() },
            ApiError::UpstreamInvalidResponse { reason: text() },
            ApiError::Timeout(Missed {
                wait: Wait::Answer,
                seconds: 1,
            }),
            ApiError::RequestTimeout { seconds: 1 },
            ApiError::QuotaExceeded(Box::new(refusal)),
            ApiError::Internal,
            ApiError::InvalidMetricsToken,
            ApiError::StoreUnavailable,
            ApiError::ModelNotAllowed {
                model: text(),
                by: crate::kernel::caller::Guarded::Key,
            },
            ApiError::ConcurrencyLimit {
                by: crate::kernel::caller::Guarded::Member,
                limit: 2,
            },
            ApiError::KeyExpired { expired_at: text() },
            ApiError::TagNotAllowed { tag: text() },
            ApiError::LabelLimit {
                over: crate::store::OverCap::TagValues,
                tag_key: Some(text()),
                limit: 1,
                per_key: false,
            },
            ApiError::LabelLimit {
                over: crate::store::OverCap::EndUsers,
                tag_key: None,
                limit: 1,
                per_key: true,
            },
        ]
    }

    fn variant_number(e: &ApiError) -> usize {
        match e {
            ApiError::InvalidApiKey => 0,
            ApiError::CircuitOpen { .. } => 1,
            ApiError::KeyBanned { .. } => 2,
            ApiError::NotFound { .. } => 3,
            ApiError::UpstreamQuotaExhausted { .. } => 4,
            ApiError::Forbidden { .. } => 5,
            ApiError::Conflict { .. } => 6,
            ApiError::InvalidField { .. } => 7,
            ApiError::InvalidCredentials => 8,
            ApiError::InvalidToken => 9,
            ApiError::AuthThrottled { .. } => 10,
            ApiError::ModelNotFound { .. } => 11,
            ApiError::InvalidRequest { .. } => 12,
            ApiError::RequestTooLarge { .. } => 13,
            ApiError::HeaderTooLarge { .. } => 14,
            ApiError::UriTooLong => 15,
            ApiError::TooManyConnections { .. } => 16,
            ApiError::RouteNotFound { .. } => 17,
            ApiError::MethodNotAllowed { .. } => 18,
            ApiError::UpstreamUnreachable { .. } => 19,
            ApiError::UpstreamInvalidResponse { .. } => 20,
            ApiError::Timeout(_) => 21,
            ApiError::RequestTimeout { .. } => 22,
            ApiError::QuotaExceeded(_) => 23,
            ApiError::Internal => 24,
            ApiError::InvalidMetricsToken => 25,
            ApiError::StoreUnavailable => 26,
            ApiError::ModelNotAllowed { .. } => 27,
            ApiError::ConcurrencyLimit { .. } => 28,
            ApiError::KeyExpired { .. } => 29,
            ApiError::TagNotAllowed { .. } => 30,
            ApiError::LabelLimit {
                over: crate::store::OverCap::EndUsers,
                ..
            } => 32,
            ApiError::LabelLimit { .. } => 31,
        }
    }

    /// On `/v1/messages` every refusal comes in Anthropic's envelope, its `type` one of
    /// Anthropic's, every other field of the OpenAI-shaped body kept as is.
    #[test]
    fn the_anthropic_envelope_keeps_every_field() {
        let anthropic = [
            "invalid_request_error",
            "authentication_error",
            "permission_error",
            "not_found_error",
            "request_too_large",
            "rate_limit_error",
            "api_error",
            "timeout_error",
        ];
        for e in every_variant() {
            let body = e.body();
            let out = anthropic_envelope(body.clone(), e.status());
            assert_eq!(out["type"], "error", "{e:?}");
            let kind = out["error"]["type"].as_str().unwrap();
            assert!(anthropic.contains(&kind), "{e:?}: {kind}");
            let mut kept = out["error"].clone();
            kept["type"] = body["error"]["type"].clone();
            assert_eq!(kept, body["error"], "{e:?}");
        }
        let rows = [
            (ApiError::ModelNotFound { model: "m".into() }, "not_found_error"),
            (ApiError::RequestTooLarge { limit: 1 }, "request_too_large"),
            (ApiError::StoreUnavailable, "api_error"),
            (
                ApiError::UpstreamQuotaExhausted { retry_after_ms: 1 },
                "rate_limit_error",
            ),
        ];
        for (e, kind) in rows {
            assert_eq!(
                anthropic_envelope(e.body(), e.status())["error"]["type"],
                kind,
                "{e:?}"
            );
        }
    }

    #[test]
    fn every_variant_is_listed() {
        let mut numbers: Vec<usize> = every_variant().iter().map(variant_number).collect();
        numbers.sort_unstable();
        let expected: Vec<usize> = (0..numbers.len()).collect();
        assert_eq!(numbers, expected, "every_variant() lists each variant once");
        assert_eq!(
            numbers.len(),
            33,
            "a variant added to variant_number is listed too"
        );
    }

    /// The rows of the table under `heading` in `text`: each row's cells, trimmed, without the
    /// header and separator rows.
    fn table_rows<'a>(text: &'a str, heading: &str) -> Vec<Vec<&'a str>> {
        let start = text
            .find(heading)
            .unwrap_or_else(|| panic!("{heading:?} missing from docs/reference.md"));
        text[start..]
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
            .collect()
    }

    /// `docs/reference.md` lists every error code the gateway answers with, with its status and
    /// type, and no other: a new code without documentation fails here.
    #[test]
    fn the_reference_documents_every_error_code() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference.md"))
            .expect("docs/reference.md");
        let mut documented: Vec<(String, String, String)> = table_rows(&doc, "## Error codes")
            .into_iter()
            .map(|cells| {
                assert!(
                    cells.len() >= 5,
                    "a row has code, status, type, meaning, what to do: {cells:?}"
                );
                let code = cells[0].trim_matches('`').to_owned();
                (code, cells[1].to_owned(), cells[2].trim_matches('`').to_owned())
            })
            .collect();
        documented.sort();
        let mut actual: Vec<(String, String, String)> = every_variant()
            .iter()
            .map(|e| {
                (
                    e.code().to_owned(),
                    e.status().as_u16().to_string(),
                    e.error_type().to_owned(),
                )
            })
            .collect();
        actual.sort();
        actual.dedup();
        assert_eq!(
            documented, actual,
            "docs/reference.md's error table against ApiError"
        );
    }

    #[test]
    fn a_timeout_mid_stream_is_the_endpoints_own_error_event() {
        let e = ApiError::Timeout(Missed {
            wait: Wait::StreamIdle,
            seconds: 120,
        });
        let openai = e.stream_event(false);
        let data: Value = serde_json::from_str(
            openai
                .strip_prefix("data: ")
                .and_then(|d| d.strip_suffix("\n\n"))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(data, e.body(), "the same body as before the head");
        assert_eq!(data["error"]["code"], "timeout");
        let anthropic = e.stream_event(true);
        let data: Value = serde_json::from_str(
            anthropic
                .strip_prefix("event: error\ndata: ")
                .and_then(|d| d.strip_suffix("\n\n"))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(data["type"], "error");
        assert_eq!(data["error"]["type"], "timeout_error");
        assert!(
            data["error"]["message"]
                .as_str()
                .unwrap()
                .contains("stream_idle_timeout_secs")
        );
    }

    #[test]
    fn deadlines_answer_with_their_status_and_code() {
        let upstream = ApiError::Timeout(Missed {
            wait: Wait::Answer,
            seconds: 600,
        });
        let client = ApiError::RequestTimeout { seconds: 60 };
        assert_eq!((upstream.status().as_u16(), upstream.code()), (504, "timeout"));
        assert_eq!(
            (client.status().as_u16(), client.code()),
            (408, "request_timeout")
        );
        assert_eq!(client.error_type(), "invalid_request_error");
        let settings = crate::config::Settings {
            client_body_timeout_secs: 13,
            request_timeout_secs: 7,
            ..crate::config::Settings::default()
        };
        let body = ApiError::from(&Deadline::for_body(&settings));
        assert_eq!(body.status(), StatusCode::REQUEST_TIMEOUT, "{body}");
        assert_eq!(
            body.to_string(),
            "the request body did not arrive within 13 s (client_body_timeout_secs)"
        );
        let answer = ApiError::from(&Deadline::for_request(&settings, false));
        assert_eq!((answer.status().as_u16(), answer.code()), (504, "timeout"));
        assert!(
            answer.to_string().contains("7 s (request_timeout_secs)"),
            "{answer}"
        );
    }

    #[test]
    fn a_raw_http1_refusal_is_the_same_answer_as_the_routed_one() {
        let e = ApiError::TooManyConnections { limit: 10 };
        let raw = String::from_utf8(e.http1_response()).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").expect("a head and a body");
        let mut lines = head.split("\r\n");
        assert_eq!(lines.next(), Some("HTTP/1.1 503 Service Unavailable"));
        let headers: Vec<(&str, &str)> = lines.filter_map(|l| l.split_once(": ")).collect();
        let header = |n: &str| headers.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        assert_eq!(header("content-length"), Some(body.len().to_string().as_str()));
        assert_eq!(header("content-type"), Some("application/json"));
        assert_eq!(header("connection"), Some("close"));
        assert_eq!(header("x-aigw-error-source"), Some("gateway"));
        assert_eq!(header("retry-after"), Some("1"));
        let routed = e.into_response();
        for (name, value) in routed.headers() {
            if name != axum::http::header::CONTENT_TYPE {
                assert_eq!(header(name.as_str()), value.to_str().ok(), "{name}");
            }
        }
        let body: Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["code"], "too_many_connections");
    }
}
