//! What dispatch hands back: each attempt as the log shows it, an upstream's error kept to pass
//! back, and how the walk through the candidates ended.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use serde::Serialize;

use crate::error::ApiError;
use crate::upstream::Provider;
use crate::upstream::admission::Slot;
use crate::upstream::http;
use crate::upstream::pool::{Credential, ModelRoute};

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
    /// served, the client having named none: the model's `max_output_tokens`, else 4096.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens_chosen: Option<u64>,
    /// Its span, when the request is traced and this attempt sent a request.
    #[serde(skip)]
    pub span: Option<crate::otel::AttemptSpan>,
}

/// Where dispatch writes: the request's attempts, and its trace (each request sent carries it).
pub struct AttemptLog<'a> {
    /// Every attempt, for the log.
    pub attempts: &'a mut Vec<Attempt>,
    /// The credential and model whose request is out, until its attempt is logged among
    /// `attempts`: what a request abandoned meanwhile was waiting for.
    pub under_way: &'a mut Option<(Arc<Credential>, Arc<ModelRoute>)>,
    /// The request's trace, when traces are exported.
    pub trace: Option<&'a crate::otel::RequestTrace>,
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
            lock_until: None,
            provider: cred.provider,
            translated: None,
            max_tokens_chosen: None,
            span: None,
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
    /// A translated answer's usage block in the upstream's own format, and the endpoint whose
    /// format that is (`body` is in the client's): it is checked in the provider's own words, as a
    /// translation may hide what was wrong with it. `None` when not translated.
    pub translated_usage: Option<(crate::upstream::adapter::Endpoint, serde_json::Value)>,
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
