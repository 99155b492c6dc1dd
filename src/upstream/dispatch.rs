//! Dispatch: one attempt per candidate, in order, within the attempt and time budgets. A failure
//! is classified (`classify.rs`) and the classification says where the request goes next. This
//! is the one retry layer: the HTTP client never retries by itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use bytes::Bytes;
use rand::Rng;
use serde::Serialize;
use serde_json::{Map, Value};

use super::adapter::{self, Endpoint};
use super::classify::{self, Classification, LockModels, NextStep, Sharing, UpstreamFailure};
use super::locks::{self, LockTarget};
use super::pool::{Credential, ModelRoute};
use crate::app::AppState;
use crate::error::ApiError;

/// Most bytes of an upstream error body read (and passed back).
const MAX_ERROR_BODY: usize = 256 * 1024;

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
}

impl Attempt {
    /// An attempt of `model` on `cred`, outcome still to be filled in.
    fn of(cred: &Credential, model: &ModelRoute) -> Self {
        Attempt {
            credential: cred.name.clone(),
            credential_id: cred.id,
            model: model.name.clone(),
            status: None,
            rule: None,
            error: None,
            lock_until: None,
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
    /// Body.
    pub body: Bytes,
}

/// How dispatch ended.
pub enum Dispatched {
    /// A candidate answered with success; the body is still to be read or streamed.
    Served {
        /// The response.
        response: reqwest::Response,
        /// Who served it.
        credential: Arc<Credential>,
        /// Which public model.
        model: Arc<ModelRoute>,
        /// Time until the response headers.
        upstream_latency: Duration,
    },
    /// Every candidate failed; this is the last upstream error.
    UpstreamFailed(UpstreamError),
    /// The gateway itself could not get an answer.
    GatewayFailed(ApiError),
}

/// Tries the chain's candidates in order. `attempts` collects every attempt for the log.
pub async fn dispatch(
    state: &AppState,
    endpoint: Endpoint,
    body: &mut Map<String, Value>,
    chain: &[Arc<ModelRoute>],
    headers: &HeaderMap,
    quota_groups: Option<&HashMap<String, Vec<i64>>>,
    attempts: &mut Vec<Attempt>,
) -> Dispatched {
    let max_attempts = state.settings.max_attempts as usize;
    let mut last: Option<Dispatched> = None;
    let now_ms = state.clock.now_ms();
    // The earliest end among the locks that kept a candidate out (for upstream_quota_exhausted).
    let mut earliest_lock: Option<i64> = None;
    'models: for model in chain {
        for cred in candidates(model, endpoint) {
            if attempts.len() >= max_attempts {
                break 'models;
            }
            let Some(upstream_model) = cred.models.get(&model.name) else {
                continue;
            };
            // Filtered before dispatch: a banned credential, or a running lock on it or this model.
            if state.locks.is_banned(cred.id) {
                continue;
            }
            if let Some(until) = state.locks.parked_until(cred.id, upstream_model, now_ms) {
                earliest_lock = Some(earliest_lock.map_or(until, |e| e.min(until)));
                continue;
            }
            let out = adapter::outgoing(endpoint, &cred, body, upstream_model);
            let started = Instant::now();
            let sent = request(state, endpoint, &cred, headers, out).send().await;
            let upstream_latency = started.elapsed();
            metrics::histogram!("aigw_upstream_duration_seconds", "provider" => cred.provider.as_str())
                .record(upstream_latency.as_secs_f64());
            let response = match sent {
                Ok(r) => r,
                Err(e) => {
                    let what = connection_error(&e);
                    attempts.push(Attempt {
                        error: Some(what.clone()),
                        ..Attempt::of(&cred, model)
                    });
                    last = Some(Dispatched::GatewayFailed(ApiError::UpstreamUnreachable {
                        message: what,
                    }));
                    continue;
                }
            };
            let status = response.status().as_u16();
            if response.status().is_success() {
                attempts.push(Attempt {
                    status: Some(status),
                    ..Attempt::of(&cred, model)
                });
                state.locks.success(cred.id);
                return Dispatched::Served {
                    response,
                    credential: cred,
                    model: model.clone(),
                    upstream_latency,
                };
            }
            let error = read_error(response).await;
            let text = String::from_utf8_lossy(&error.body);
            let failure = UpstreamFailure {
                status,
                headers: &error.headers,
                body: &text,
                provider: cred.provider,
                model: upstream_model,
                now: state.clock.now(),
                backoff_level: state.locks.backoff_level(cred.id),
                gateway_busy: false,
            };
            let class = classify::classify(&failure);
            let lock_until = park(state, &cred, upstream_model, &class, quota_groups);
            attempts.push(Attempt {
                status: Some(status),
                rule: Some(class.rule.name()),
                lock_until: lock_until.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
                ..Attempt::of(&cred, model)
            });
            last = Some(Dispatched::UpstreamFailed(error));
            match class.next {
                NextStep::NextCredential => continue,
                NextStep::NextModel => continue 'models,
                NextStep::Stop => break 'models,
            }
        }
    }
    // Nothing was sent upstream because every candidate is parked.
    if attempts.is_empty()
        && let Some(until) = earliest_lock
    {
        let ms = u64::try_from(until - now_ms).unwrap_or(0);
        return Dispatched::GatewayFailed(ApiError::UpstreamQuotaExhausted {
            retry_after: ms.div_ceil(1000).max(1),
        });
    }
    last.unwrap_or_else(|| {
        Dispatched::GatewayFailed(ApiError::UpstreamUnreachable {
            message: "no upstream credential serves this model on this endpoint".to_owned(),
        })
    })
}

/// Writes what a classified failure parks (extend-only, persisted off the request path), bumps
/// the credential's backoff level and sets its banned mark; returns the lock's end.
fn park(
    state: &AppState,
    cred: &Credential,
    upstream_model: &str,
    class: &Classification,
    quota_groups: Option<&HashMap<String, Vec<i64>>>,
) -> Option<chrono::DateTime<chrono::Utc>> {
    if class.bump_backoff {
        state.locks.bump_backoff(cred.id);
    }
    if class.banned {
        state.locks.ban(cred.id);
    }
    let mut rows = Vec::new();
    if let Some(lock) = &class.lock {
        // groot ADR 0008: an account-level failure rests every credential of the quota group.
        let credentials = match (lock.sharing, &cred.quota_group) {
            (Sharing::Account, Some(g)) => quota_groups
                .and_then(|q| q.get(g))
                .cloned()
                .unwrap_or_else(|| vec![cred.id]),
            _ => vec![cred.id],
        };
        let until = lock.until.timestamp_millis();
        let rule = class.rule.name();
        let mut targets = vec![match lock.models {
            LockModels::One => LockTarget::Model(upstream_model.to_owned()),
            LockModels::AllFree => LockTarget::AllFree,
            LockModels::All => LockTarget::Credential,
        }];
        if lock.models == LockModels::AllFree && !classify::is_free_model(upstream_model) {
            targets.push(LockTarget::Model(upstream_model.to_owned()));
        }
        for t in &targets {
            rows.extend(state.locks.park(&credentials, t, until, rule));
        }
        tracing::info!(credential = %cred.name, model = upstream_model, rule, until = %lock.until, "upstream credential parked");
    }
    if !rows.is_empty() || class.banned {
        let (s, banned) = (state.clone(), class.banned.then_some(cred.id));
        state.tasks.spawn(async move {
            if let Err(e) = locks::persist(&s.store, &rows, banned).await {
                tracing::error!(error = %e, "could not persist upstream locks");
            }
        });
    }
    class.lock.as_ref().map(|l| l.until)
}

/// The chain model's credentials that serve `endpoint`, by priority, weighted random within a
/// priority (Efraimidis–Spirakis keys).
fn candidates(model: &ModelRoute, endpoint: Endpoint) -> Vec<Arc<Credential>> {
    let mut rng = rand::thread_rng();
    let mut keyed: Vec<(i64, f64, Arc<Credential>)> = model
        .credentials
        .iter()
        .filter(|c| endpoint.served_by(c.provider))
        .map(|c| {
            let u: f64 = rng.gen_range(f64::EPSILON..1.0);
            (c.priority, -u.ln() / c.weight as f64, c.clone())
        })
        .collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    keyed.into_iter().map(|(_, _, c)| c).collect()
}

fn request(
    state: &AppState,
    endpoint: Endpoint,
    cred: &Credential,
    client_headers: &HeaderMap,
    out: adapter::Outgoing,
) -> reqwest::RequestBuilder {
    let b = state
        .http
        .post(out.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(out.body);
    if endpoint == Endpoint::Messages {
        let version = client_headers
            .get("anthropic-version")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("2023-06-01");
        let b = b
            .header("x-api-key", cred.secret.expose())
            .header("anthropic-version", version);
        match client_headers.get("anthropic-beta") {
            Some(beta) => b.header("anthropic-beta", beta.clone()),
            None => b,
        }
    } else {
        b.bearer_auth(cred.secret.expose())
    }
}

/// A connection failure described without the URL's secrets (none are in URLs) or internals.
fn connection_error(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    match e.url().and_then(|u| u.host_str()) {
        Some(host) => format!("{kind} ({host})"),
        None => kind.to_owned(),
    }
}

async fn read_error(response: reqwest::Response) -> UpstreamError {
    let status = response.status().as_u16();
    let mut headers = HeaderMap::new();
    for (k, v) in response.headers() {
        let name = k.as_str();
        if name == "content-type"
            || name == "retry-after"
            || name == "retry-after-ms"
            || name.starts_with("x-ratelimit-")
            || name.starts_with("anthropic-ratelimit-")
        {
            headers.append(k.clone(), v.clone());
        }
    }
    let mut body = Vec::new();
    let mut stream = response;
    while let Ok(Some(chunk)) = stream.chunk().await {
        let room = MAX_ERROR_BODY.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= MAX_ERROR_BODY {
            break;
        }
    }
    UpstreamError {
        status,
        headers,
        body: Bytes::from(body),
    }
}
