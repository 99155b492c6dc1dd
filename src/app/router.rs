//! The router: every listener's routes from the route tables, health, readiness and metrics, and
//! the refusals of unknown routes and methods. The request id is given by the connection that
//! calls it (`edge::client_conn`), before the router and on every response.

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::config::Secret;
use crate::error::ApiError;
use crate::state::{AppState, route_table};

route_table! {
    /// Liveness and readiness, on every listener.
    fn health_routes, const HEALTH_ROUTES;
    get "/healthz" => healthz;
    get "/readyz" => readyz;
}

route_table! {
    /// Prometheus metrics, with the admin surfaces.
    fn metrics_routes, const METRICS_ROUTES;
    get "/metrics" => metrics;
}

/// Which routes a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Surface {
    /// All of them (one listener, the default).
    Everything,
    /// The proxy and health: the main listener when `admin_listen` is set.
    Proxy,
    /// The admin API, the console, metrics and health: the `admin_listen` listener.
    Admin,
}

/// The router of a listener: the routes of `surface`; any other path is `not_found`.
pub fn router(state: AppState, surface: Surface) -> Router {
    let mut routes = Router::new().merge(health_routes());
    if surface != Surface::Admin {
        routes = routes.merge(crate::proxy::routes());
    }
    if surface != Surface::Proxy {
        routes = routes
            .merge(crate::admin::routes(state.clone()))
            .merge(crate::console::routes())
            .merge(metrics_routes());
    }
    routes
        // After every route is in: it applies to the routes present (axum adds `Allow`).
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .with_state(state)
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<AppState>) -> Response {
    let ready = state.store.at_home(|s| async move { Ok(s.ready().await) });
    if ready.await.unwrap_or(false) {
        // With Redis (issue 44), whether it answers right now (one word for quotas, breakers,
        // own limits and locks): a gateway counting alone still serves, so it stays ready.
        let detail = match state.quota.shared() {
            None => "ready",
            Some(s) if s.is_up() => "ready; redis up",
            Some(_) => "ready; redis unreachable: quotas counted by this gateway alone",
        };
        (StatusCode::OK, detail).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "database unreachable or migrations not applied",
        )
            .into_response()
    }
}

async fn metrics(State(state): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    if let Some(token) = &state.settings.metrics_token
        && !bearer_is(&headers, token)
    {
        return ApiError::InvalidMetricsToken.into_response();
    }
    let mut text = state.metrics.render();
    text.push_str(&state_gauges(&state));
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        text,
    )
        .into_response()
}

/// Whether `Authorization: Bearer …` carries `token`. The digests are compared, so the time the
/// comparison takes says nothing about the token.
fn bearer_is(headers: &axum::http::HeaderMap, token: &Secret) -> bool {
    use ring::digest::{SHA256, digest};
    let presented = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.get(..7)
                .filter(|p| p.eq_ignore_ascii_case("bearer "))
                .map(|_| v[7..].trim())
        });
    presented.is_some_and(|p| {
        digest(&SHA256, p.as_bytes()).as_ref() == digest(&SHA256, token.expose().as_bytes()).as_ref()
    })
}

/// The gauges of this gateway's own state, read now rather than kept up to date on every
/// request.
fn state_gauges(state: &AppState) -> String {
    let now = state.clock.now();
    let mut e = crate::observability::telemetry::Exposition::default();
    let mut one = |name: &'static str, value: usize| {
        e.family(name).sample(name, &[], value);
    };
    one("aigw_breaker_open_keys", state.breakers.open_keys(now));
    one("aigw_breaker_banned_keys", state.breakers.banned_keys());
    one("aigw_store_available", usize::from(state.store.available()));
    one("aigw_log_queue_depth", state.logs.queued().max(0) as usize);
    one("aigw_log_queue_bytes", state.logs.queue().bytes());
    one("aigw_client_connections", state.connections.open());
    one("aigw_admin_connections", state.admin_connections.open());
    one("aigw_upstream_banned_credentials", state.locks.banned_count());
    // A sample only with `redis_url` set: a gateway without Redis has no Redis to be up.
    e.family("aigw_redis_up");
    if let Some(shared) = state.quota.shared() {
        e.sample("aigw_redis_up", &[], usize::from(shared.is_up()));
    }
    let refused = "aigw_client_connections_refused_total";
    e.family(refused).sample(
        refused,
        &[],
        state.connections.refused() + state.admin_connections.refused(),
    );
    let dropped = "aigw_request_logs_dropped_total";
    e.family(dropped)
        .sample(dropped, &[], state.logs.queue().dropped());
    let name = "aigw_build_info";
    e.family(name)
        .sample(name, &[("version", env!("CARGO_PKG_VERSION"))], 1);
    let name = "aigw_upstream_parked";
    e.family(name);
    for ((scope, rule), n) in state.locks.running_by_rule(now.timestamp_millis()) {
        e.sample(name, &[("scope", scope), ("rule", &rule)], n);
    }
    let name = "aigw_upstream_in_flight";
    e.family(name);
    let routes = state.routes.load();
    let mut credentials: Vec<(i64, &str)> = routes
        .workspaces
        .values()
        .flat_map(|w| w.models.values())
        .flat_map(|m| m.credentials.iter())
        .map(|c| (c.id, c.name.as_str()))
        .collect();
    credentials.sort_unstable();
    credentials.dedup();
    for (id, credential) in credentials {
        let id_text = id.to_string();
        e.sample(
            name,
            &[("credential_id", &id_text), ("credential", credential)],
            state.admission.in_flight(id),
        );
    }
    e.finish()
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::MethodNotAllowed {
        method: req.method().to_string(),
        path: req.uri().path().to_owned(),
    }
}

async fn not_found(req: Request) -> ApiError {
    ApiError::RouteNotFound {
        method: req.method().to_string(),
        path: req.uri().path().to_owned(),
    }
}
