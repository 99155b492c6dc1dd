//! One error shape per endpoint. `/v1/chat/completions` answers every error in OpenAI's shape
//! (the gateway's refusals as rendered by [`ApiError`], an Anthropic upstream's errors translated
//! into OpenAI's words). `/v1/messages` answers every error in Anthropic's envelope
//! `{"type":"error","error":{…}}`: an upstream's errors are Anthropic-shaped already (or
//! translated into it), and the gateway's own refusals are put in it here, keeping their stable
//! `code` and every other field ([`crate::error::anthropic_envelope`]).
//!
//! [`ApiError`]: crate::error::ApiError

use axum::body::Body;
use axum::http::header;
use axum::response::Response;
use serde_json::Value;

use crate::error::{ERROR_SOURCE, anthropic_envelope};

/// Most bytes of a refusal's body read to reshape it (the gateway's refusals are small).
const MAX_REFUSAL_BYTES: usize = 64 * 1024;

/// `resp` with a gateway refusal's body in Anthropic's envelope; anything else (a success, a
/// stream, an upstream's error) as it is.
pub async fn in_anthropic_envelope(resp: Response) -> Response {
    let by_gateway = resp
        .headers()
        .get(ERROR_SOURCE)
        .is_some_and(|v| v.as_bytes() == b"gateway");
    if resp.status().is_success() || !by_gateway {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_REFUSAL_BYTES).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    let out = anthropic_envelope(v, parts.status).to_string();
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(out))
}
