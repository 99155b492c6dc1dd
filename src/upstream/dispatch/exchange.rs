//! One exchange with an upstream: the request an attempt sends, and its answer read — a success
//! checked to be what the endpoint promises, or an error kept (masked) to pass back.

use std::borrow::Cow;
use std::time::SystemTime;

use axum::http::{HeaderMap, HeaderValue, Method, Request, header};
use bytes::Bytes;
use futures::StreamExt;

use super::{Answer, Complete, UpstreamError};
use crate::provider::Credential;
use crate::provider::Provider;
use crate::provider::adapter::{self, Endpoint, Fields};
use crate::provider::{bedrock, google};
use crate::translate::{self, Refused, Translation};
use crate::transport::http;

/// Most bytes of an upstream error body read (and passed back).
const MAX_ERROR_BODY: usize = 256 * 1024;

/// The attempt's request: the client's body translated where the credential speaks the other
/// format (`translate::request`); for a `bedrock` credential that chat request as a Converse
/// request to the model's Converse (or ConverseStream) URL, for a `google` one as a
/// `generateContent` request to the model's URL (streamed or not).
pub(crate) fn outgoing(
    endpoint: Endpoint,
    cred: &Credential,
    body: &Fields,
    upstream_model: &str,
    max_output_tokens: Option<u64>,
) -> Result<adapter::Outgoing, Refused> {
    let out = translate::request(endpoint, cred, body, upstream_model, max_output_tokens)?;
    if cred.bedrock.is_none() && cred.google.is_none() {
        return Ok(out);
    }
    let refused = |param: &str, message: String| Refused {
        param: param.to_owned(),
        message,
    };
    let chat: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&out.body)
        .map_err(|e| refused("messages", format!("unreadable request: {e}")))?;
    let stream = chat.get("stream").and_then(serde_json::Value::as_bool) == Some(true);
    let (url, body) = if let Some(target) = &cred.bedrock {
        let converse = bedrock::request::converse(&chat).map_err(|r| refused(&r.param, r.message))?;
        let url = target.url(upstream_model, stream).ok_or_else(|| {
            refused(
                "model",
                format!("no Bedrock URL for the model {upstream_model:?}"),
            )
        })?;
        (url.clone(), converse.to_string())
    } else if let Some(target) = &cred.google {
        let no_url = || refused("model", format!("no Gemini URL for the model {upstream_model:?}"));
        if endpoint == Endpoint::Embeddings {
            let batch = google::embed::batch_request(&chat, upstream_model)
                .map_err(|r| refused(&r.param, r.message))?;
            let url = target.embed_url(upstream_model).ok_or_else(no_url)?;
            return Ok(adapter::Outgoing {
                url: url.clone(),
                body: Bytes::from(batch.to_string()),
                max_tokens_chosen: None,
            });
        }
        let generate = google::request::generate_content(&chat).map_err(|r| refused(&r.param, r.message))?;
        let url = target.url(upstream_model, stream).ok_or_else(no_url)?;
        (url.clone(), generate.to_string())
    } else {
        return Ok(out);
    };
    Ok(adapter::Outgoing {
        url,
        body: Bytes::from(body),
        max_tokens_chosen: out.max_tokens_chosen,
    })
}

/// The HTTP request of one attempt: the provider's auth and version headers on `out` (for
/// `bedrock`, the SigV4 signature).
pub(crate) fn request(
    cred: &Credential,
    client_headers: &HeaderMap,
    out: adapter::Outgoing,
) -> Request<Bytes> {
    let mut req = Request::new(out.body);
    *req.method_mut() = Method::POST;
    *req.uri_mut() = out.url;
    let h = req.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if cred.provider.speaks_anthropic() {
        h.insert("x-api-key", cred.auth.clone());
        let version = client_headers
            .get("anthropic-version")
            .cloned()
            .unwrap_or(HeaderValue::from_static("2023-06-01"));
        h.insert("anthropic-version", version);
        if let Some(beta) = client_headers.get("anthropic-beta") {
            h.insert("anthropic-beta", beta.clone());
        }
    } else if cred.provider == Provider::Azure {
        h.insert("api-key", cred.auth.clone());
    } else if cred.provider == Provider::Google {
        h.insert("x-goog-api-key", cred.auth.clone());
    } else if let Some(target) = &cred.bedrock {
        // Signed last: the signature covers the headers above and the body.
        if let Err(e) = target.sign(&mut req, SystemTime::now()) {
            tracing::error!(credential = %cred.name, error = %e, "bedrock request not signed");
        }
        return req;
    } else {
        h.insert(header::AUTHORIZATION, cred.auth.clone());
    }
    req
}

/// Why a success was not served.
pub(super) enum Unread {
    /// It is not what the endpoint promises.
    Invalid(String),
    /// Its body could not be read.
    Broken(String),
}

/// A success: the event stream the request asked for, passed on as it comes; else the body,
/// read whole, checked to be the JSON of the endpoint `provider` was called on, and translated
/// into the client's format where it differs. The one place a complete answer is read.
pub(super) async fn read_answer(
    endpoint: Endpoint,
    provider: Provider,
    upstream_model: &str,
    stream: bool,
    response: http::Response,
) -> Result<Answer, Unread> {
    let response = match provider {
        Provider::Bedrock => bedrock_stream_as_sse(response, upstream_model),
        Provider::Google => google_stream_as_sse(response, upstream_model),
        _ => response,
    };
    let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
    let is_sse = content_type
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if is_sse {
        return if stream {
            Ok(Answer::Stream(response))
        } else {
            Err(Unread::Invalid(
                "an event stream to a request that asked for none".to_owned(),
            ))
        };
    }
    let status = response.status().as_u16();
    let body = match http_body_util::BodyExt::collect(response.into_body()).await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Err(Unread::Broken(format!("reading the response failed: {e}"))),
    };
    let body = match provider {
        Provider::Google if endpoint == Endpoint::Embeddings => Bytes::from(
            google::embed::embeddings(&body, upstream_model)
                .map_err(Unread::Invalid)?
                .to_string(),
        ),
        Provider::Google => {
            let (id, created) = answer_id();
            let chat = google::answer::chat_completion(&body, upstream_model, &id, created)
                .map_err(Unread::Invalid)?;
            Bytes::from(chat.to_string())
        }
        Provider::Bedrock => {
            let (id, created) = answer_id();
            let chat = bedrock::answer::chat_completion(&body, upstream_model, &id, created)
                .map_err(Unread::Invalid)?;
            Bytes::from(chat.to_string())
        }
        _ => body,
    };
    let translation = Translation::of(endpoint, provider);
    let native = translation.map_or(endpoint, Translation::upstream_endpoint);
    let usage = adapter::check_answer(native, &body).map_err(Unread::Invalid)?;
    let body = match translation {
        Some(t) => translate::answer(t, &body).map_err(Unread::Invalid)?,
        None => body,
    };
    Ok(Answer::Complete(Complete {
        status,
        content_type,
        body,
        usage: (native, usage),
    }))
}

/// A Bedrock event stream (ConverseStream's answer) as an OpenAI chat completion stream, read
/// as it comes; any other response as it is.
fn bedrock_stream_as_sse(response: http::Response, upstream_model: &str) -> http::Response {
    let is_event_stream = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(bedrock::stream::EVENT_STREAM));
    if !is_event_stream {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    let (id, created) = answer_id();
    let writer = bedrock::stream::ChunkWriter::new(id, upstream_model.to_owned(), created);
    http::Response::from_parts(parts, bedrock::stream::sse_body(body, writer))
}

/// A Gemini SSE answer as an OpenAI chat completion stream, read as it comes; any other
/// response as it is.
fn google_stream_as_sse(response: http::Response, upstream_model: &str) -> http::Response {
    let is_sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_sse {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let (id, created) = answer_id();
    let writer = google::stream::ChunkWriter::new(id, upstream_model.to_owned(), created);
    http::Response::from_parts(parts, google::stream::sse_body(body, writer))
}

/// The id and `created` (Unix seconds) of a chat completion the gateway writes for an upstream
/// whose answer is not one (Bedrock, Google).
fn answer_id() -> (String, i64) {
    let created = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0));
    (format!("chatcmpl-{}", uuid::Uuid::now_v7().simple()), created)
}

/// A Bedrock or Gemini error, classified in the provider's own shape, rewritten in OpenAI's (the
/// format the gateway speaks to a `bedrock` or `google` credential) before it is passed on: the
/// client's chat error, or what `translate` renders for a messages client. Other providers'
/// errors stay as they came.
pub(super) fn in_openai_shape(error: &mut UpstreamError) {
    let body = match error.provider {
        Provider::Bedrock => {
            let errortype = error
                .headers
                .get(bedrock::AWS_ERROR_TYPE)
                .and_then(|v| v.to_str().ok());
            bedrock::answer::openai_error(error.status, errortype, &error.body)
        }
        Provider::Google => google::answer::openai_error(error.status, &error.body),
        _ => return,
    };
    error.body = Bytes::from(body.to_string());
    error
        .headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
}

/// An upstream's error answer, kept to pass back: the headers worth passing on and at most
/// [`MAX_ERROR_BODY`] bytes of the body, the credential's secret masked out of both (DESIGN.md
/// §9: an error body may echo the key; everything after this — classification, the answer, the
/// log — sees only the masked bytes).
pub(super) async fn read_error(response: http::Response, cred: &Credential) -> UpstreamError {
    let mask = &cred.mask;
    let status = response.status().as_u16();
    let mut headers = HeaderMap::new();
    for (k, v) in response.headers() {
        let name = k.as_str();
        if name == "content-type"
            || name == "retry-after"
            || name == "retry-after-ms"
            || name.starts_with("x-ratelimit-")
            || name.starts_with("anthropic-ratelimit-")
            || name == bedrock::AWS_ERROR_TYPE
        {
            let masked = match mask.mask(v.as_bytes()) {
                Cow::Borrowed(_) => v.clone(),
                Cow::Owned(m) => match HeaderValue::from_bytes(&m) {
                    Ok(m) => m,
                    Err(_) => continue,
                },
            };
            headers.append(k.clone(), masked);
        }
    }
    let mut body = Vec::new();
    let mut stream = response.into_body().into_data_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        let room = MAX_ERROR_BODY.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= MAX_ERROR_BODY {
            break;
        }
    }
    let body = match mask.mask(&body) {
        Cow::Borrowed(_) => Bytes::from(body),
        Cow::Owned(masked) => Bytes::from(masked),
    };
    UpstreamError {
        status,
        headers,
        body,
        provider: cred.provider,
        lock_until: None,
    }
}
