//! The one error enum of the gateway's own refusals, rendered in one place as OpenAI-shaped JSON
//! with a stable `code`, and the `x-aigw-error-source: gateway` header.

use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// Header naming who produced an error: `gateway` or `upstream`.
pub const ERROR_SOURCE: HeaderName = HeaderName::from_static("x-aigw-error-source");
/// Header the official SDKs read to decide whether to retry by themselves.
pub const SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

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
}

/// A refusal or failure produced by the gateway itself.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No key, or a key the gateway does not know.
    #[error(
        "invalid API key: provide a valid gateway key as `Authorization: Bearer sk-aigw-…` or `x-api-key`"
    )]
    InvalidApiKey,
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
        /// Whole seconds until the earliest lock ends.
        retry_after: u64,
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
    /// The request ran out of its time budget.
    #[error("the request exceeded its time budget of {seconds} s")]
    Timeout {
        /// The budget.
        seconds: u64,
    },
    /// A guardrail quota is used up (LyRouter's contract, DESIGN.md §4).
    #[error("rate limit exceeded on {} {}/{}", .0.subject, .0.metric, .0.window)]
    QuotaExceeded(Box<QuotaRefusal>),
    /// The store is unavailable or failed.
    #[error("internal error; the request id identifies it in the gateway's logs")]
    Internal,
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
            ApiError::InvalidApiKey | ApiError::InvalidCredentials | ApiError::InvalidToken => {
                StatusCode::UNAUTHORIZED
            }
            ApiError::AuthThrottled { .. }
            | ApiError::QuotaExceeded(_)
            | ApiError::CircuitOpen { .. }
            | ApiError::UpstreamQuotaExhausted { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::KeyBanned { .. } | ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::Conflict { .. } => StatusCode::CONFLICT,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::InvalidField { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::ModelNotFound { .. } | ApiError::RouteNotFound { .. } | ApiError::NotFound { .. } => {
                StatusCode::NOT_FOUND
            }
            ApiError::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::RequestTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UpstreamUnreachable { .. } | ApiError::UpstreamInvalidResponse { .. } => {
                StatusCode::BAD_GATEWAY
            }
            ApiError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable machine-readable code (also the metric label).
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidApiKey => "invalid_api_key",
            ApiError::InvalidCredentials => "invalid_credentials",
            ApiError::Forbidden { .. } => "forbidden",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::Conflict { .. } => "conflict",
            ApiError::InvalidField { .. } => "invalid_field",
            ApiError::InvalidToken => "invalid_token",
            ApiError::AuthThrottled { .. } => "auth_rate_limited",
            ApiError::ModelNotFound { .. } => "model_not_found",
            ApiError::InvalidRequest { .. } => "invalid_request_error",
            ApiError::RequestTooLarge { .. } => "request_too_large",
            ApiError::RouteNotFound { .. } | ApiError::NotFound { .. } => "not_found",
            ApiError::UpstreamUnreachable { .. } => "upstream_unreachable",
            ApiError::UpstreamInvalidResponse { .. } => "upstream_invalid_response",
            ApiError::Timeout { .. } => "timeout",
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
            ApiError::InvalidApiKey | ApiError::InvalidCredentials | ApiError::InvalidToken => {
                "authentication_error"
            }
            ApiError::AuthThrottled { .. }
            | ApiError::QuotaExceeded(_)
            | ApiError::CircuitOpen { .. }
            | ApiError::UpstreamQuotaExhausted { .. } => "rate_limit_error",
            ApiError::KeyBanned { .. } | ApiError::Forbidden { .. } => "permission_error",
            ApiError::Conflict { .. } | ApiError::InvalidField { .. } | ApiError::MethodNotAllowed { .. } => {
                "invalid_request_error"
            }
            ApiError::ModelNotFound { .. }
            | ApiError::InvalidRequest { .. }
            | ApiError::RequestTooLarge { .. }
            | ApiError::RouteNotFound { .. }
            | ApiError::NotFound { .. } => "invalid_request_error",
            ApiError::UpstreamUnreachable { .. }
            | ApiError::UpstreamInvalidResponse { .. }
            | ApiError::Timeout { .. }
            | ApiError::Internal => "api_error",
        }
    }

    /// Seconds the client should wait before retrying, if the refusal names a wait.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::AuthThrottled { retry_after }
            | ApiError::CircuitOpen { retry_after, .. }
            | ApiError::UpstreamQuotaExhausted { retry_after } => Some(*retry_after),
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
            ApiError::QuotaExceeded(q) => {
                error["subject"] = json!(q.subject);
                error["metric"] = json!(q.metric);
                error["window"] = json!(q.window);
                error["limit"] = q.limit.clone();
                error["used"] = q.used.clone();
                error["reset_at"] = json!(q.reset_at);
            }
            ApiError::CircuitOpen { blocked_until, .. } => error["blocked_until"] = json!(blocked_until),
            _ => {}
        }
        if let Some(s) = self.retry_after() {
            error["retry_after"] = json!(s);
        }
        json!({ "error": error })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body();
        let mut resp = (self.status(), axum::Json(body)).into_response();
        let h = resp.headers_mut();
        h.insert(ERROR_SOURCE, HeaderValue::from_static("gateway"));
        if let Some(s) = self.retry_after() {
            h.insert(axum::http::header::RETRY_AFTER, HeaderValue::from(s));
            h.insert(
                HeaderName::from_static("retry-after-ms"),
                HeaderValue::from(s * 1000),
            );
            if s > 60 {
                h.insert(SHOULD_RETRY, HeaderValue::from_static("false"));
            }
        }
        // A used-up quota has no Retry-After (the client reads reset_at); the SDKs must not
        // retry it by themselves (each retry is one more failure toward the key's breaker).
        if matches!(self, ApiError::QuotaExceeded(_) | ApiError::KeyBanned { .. }) {
            h.insert(SHOULD_RETRY, HeaderValue::from_static("false"));
        }
        resp
    }
}
