//! The admin API under `/admin/v1/` (DESIGN.md §3, §7, §8), described in `openapi.yaml`.
//!
//! Access is denied by default: [`ROUTES`] is the one table of every admin route with the least
//! role it needs, the router is built from it, and [`guard`] checks every request against it
//! before any handler runs (a route missing from the table cannot be reached). Handlers narrow
//! further where the role is not the whole story: a member sees only their own keys and logs,
//! and sets budgets only on keys they created. Everything is scoped to the caller's workspace; an
//! id of another workspace answers 404, as if it did not exist.

mod alerts;
mod audit_log;
mod auth;
mod key_limits;
mod keys;
mod labels;
mod logs;
mod models;
mod policies;
mod policy_labels;
mod policy_names;
pub mod session;
mod sso;
mod tenancy;
mod tokens;
mod upstream_figures;
mod upstream_keys;
mod upstreams;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{AdminStore, AuditEntry, Role, StoreError};
use session::Actor;

/// The least role a route needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Need {
    /// No token (sign-in).
    Public,
    /// Any signed-in member.
    Member,
    /// An owner or admin.
    Admin,
    /// The owner.
    Owner,
}

impl Need {
    /// Whether `role` meets this need.
    pub fn allows(self, role: Role) -> bool {
        let rank = match role {
            Role::Member => Need::Member,
            Role::Admin => Need::Admin,
            Role::Owner => Need::Owner,
        };
        rank >= self
    }
}

/// One admin route: method (lowercase), path as the router matches it, least role.
#[derive(Clone, Copy, Debug)]
pub struct AdminRoute {
    /// `get`, `post`, `patch` or `delete`.
    pub method: &'static str,
    /// The path template, e.g. `/admin/v1/keys/{id}`.
    pub path: &'static str,
    /// Who may call it.
    pub need: Need,
}

/// Builds both [`ROUTES`] and the router from one list, so they cannot disagree.
macro_rules! admin_routes {
    ($($method:ident $path:literal $need:ident => $handler:path;)*) => {
        /// Every admin route with the least role it needs (the access table).
        pub const ROUTES: &[AdminRoute] = &[
            $(AdminRoute { method: stringify!($method), path: $path, need: Need::$need },)*
        ];

        fn table() -> Router<AppState> {
            Router::new()$(.route($path, axum::routing::$method($handler)))*
        }
    };
}

admin_routes! {
    post "/admin/v1/auth/login" Public => auth::login;
    post "/admin/v1/auth/logout" Member => auth::logout;
    post "/admin/v1/auth/password" Member => auth::change_password;
    get "/admin/v1/auth/methods" Public => sso::methods;
    get "/admin/v1/auth/oidc/start" Public => sso::start;
    get "/admin/v1/auth/oidc/callback" Public => sso::callback;
    get "/admin/v1/me" Member => auth::me;
    get "/admin/v1/me/quota" Member => auth::my_quota;

    get "/admin/v1/workspace" Member => tenancy::workspace;
    patch "/admin/v1/workspace" Owner => tenancy::update_workspace;
    get "/admin/v1/departments" Member => tenancy::departments;
    post "/admin/v1/departments" Admin => tenancy::create_department;
    patch "/admin/v1/departments/{id}" Admin => tenancy::update_department;
    delete "/admin/v1/departments/{id}" Admin => tenancy::delete_department;
    get "/admin/v1/members" Admin => tenancy::members;
    post "/admin/v1/members" Admin => tenancy::invite_member;
    get "/admin/v1/members/{id}" Admin => tenancy::member;
    patch "/admin/v1/members/{id}" Admin => tenancy::update_member;
    post "/admin/v1/members/{id}/reset-password" Admin => tenancy::reset_password;

    get "/admin/v1/keys" Member => keys::list;
    post "/admin/v1/keys" Member => keys::create;
    get "/admin/v1/keys/{id}" Member => keys::get;
    patch "/admin/v1/keys/{id}" Admin => keys::update;
    delete "/admin/v1/keys/{id}" Member => keys::delete;
    post "/admin/v1/keys/{id}/rotate" Member => keys::rotate;
    get "/admin/v1/keys/{id}/breaker" Member => keys::breaker;

    get "/admin/v1/policies" Member => policies::list;
    post "/admin/v1/policies" Member => policies::create;
    get "/admin/v1/policies/{id}" Member => policies::get;
    patch "/admin/v1/policies/{id}" Member => policies::update;
    delete "/admin/v1/policies/{id}" Member => policies::delete;
    get "/admin/v1/quota/standings" Admin => policies::standings;
    get "/admin/v1/labels" Admin => labels::list;
    delete "/admin/v1/labels" Admin => labels::prune;
    get "/admin/v1/alerts" Admin => alerts::list;
    post "/admin/v1/alerts/{id}/retry" Admin => alerts::retry;

    get "/admin/v1/upstreams" Admin => upstreams::list;
    get "/admin/v1/upstreams/figures" Admin => upstream_figures::figures;
    post "/admin/v1/upstreams" Admin => upstreams::create;
    get "/admin/v1/upstreams/{id}" Admin => upstreams::get;
    patch "/admin/v1/upstreams/{id}" Admin => upstreams::update;
    delete "/admin/v1/upstreams/{id}" Admin => upstreams::delete;
    post "/admin/v1/upstreams/{id}/test" Admin => upstreams::test;

    get "/admin/v1/models" Member => models::list;
    post "/admin/v1/models" Admin => models::create;
    get "/admin/v1/models/{id}" Member => models::get;
    patch "/admin/v1/models/{id}" Admin => models::update;
    delete "/admin/v1/models/{id}" Admin => models::delete;

    get "/admin/v1/logs" Member => logs::list;
    get "/admin/v1/logs/export" Member => logs::export;
    get "/admin/v1/logs/{request_id}" Member => logs::get;
    get "/admin/v1/usage" Member => logs::usage;
    get "/admin/v1/audit" Admin => audit_log::list;

    get "/admin/v1/tokens" Admin => tokens::list;
    post "/admin/v1/tokens" Admin => tokens::create;
    delete "/admin/v1/tokens/{id}" Admin => tokens::revoke;
}

/// The admin routes, every one behind [`guard`].
pub fn routes(state: AppState) -> Router<AppState> {
    table()
        .route_layer(middleware::from_fn_with_state(state.clone(), guard))
        .route_layer(middleware::from_fn_with_state(state, at_home))
}

/// Runs an admin request — its guard and its handler — on the main runtime when it arrived on
/// another (a serving thread's): every admin answer is the database's, whose connections the main runtime
/// drives ([`crate::store::Store::at_home`]), and a slow admin query then holds up no proxied
/// connection.
async fn at_home(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if tokio::runtime::Handle::current().id() == state.runtime.id() {
        return next.run(req).await;
    }
    match state.runtime.spawn(next.run(req)).await {
        Ok(response) => response,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The main runtime is shutting down.
        Err(_) => ApiError::StoreUnavailable.into_response(),
    }
}

/// Denied by default: finds the route in [`ROUTES`], checks the token (signature, expiry,
/// audience, the member still active and not signed out) and the role, and hands the handler an
/// [`Actor`].
async fn guard(
    State(state): State<AppState>,
    matched: MatchedPath,
    mut req: Request,
    next: Next,
) -> Response {
    let method = match req.method().as_str() {
        "HEAD" => "get".to_owned(),
        m => m.to_ascii_lowercase(),
    };
    let Some(route) = ROUTES
        .iter()
        .find(|r| r.path == matched.as_str() && r.method == method)
    else {
        // The path matched, the method did not (axum routes it here only for a method it knows).
        return ApiError::MethodNotAllowed {
            method: req.method().to_string(),
            path: matched.as_str().to_owned(),
        }
        .into_response();
    };
    // Every admin answer needs the database: while it is known to be away, say so at once.
    if !state.store.available() {
        return ApiError::StoreUnavailable.into_response();
    }
    if route.need == Need::Public {
        return next.run(req).await;
    }
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0)
        .unwrap_or_else(|| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
    let client_ip = state.client_ip(peer, req.headers());
    let actor = match Actor::authenticate(&state, req.headers(), client_ip).await {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    if !route.need.allows(actor.role()) {
        let needed = match route.need {
            Need::Owner => "the owner",
            _ => "an owner or admin",
        };
        let who = match &actor.token {
            Some(_) => "this service token acts as",
            None => "you are signed in as",
        };
        return ApiError::Forbidden {
            message: format!(
                "{} {} needs {needed}; {who} {}",
                req.method(),
                matched.as_str(),
                actor.role().as_str()
            ),
        }
        .into_response();
    }
    req.extensions_mut().insert(actor);
    next.run(req).await
}

/// A JSON body in the admin API's error format: malformed JSON, a wrong type, a missing or an
/// unknown field is a 400 naming the field.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned> axum::extract::FromRequest<AppState> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::invalid(format!("cannot read the request body: {e}"), None))?;
        let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { &bytes };
        // serde reads a struct from a JSON array too, field by field in order: refuse anything
        // but an object (`[null]` must not become `{"first_field": null}`).
        if bytes.trim_ascii_start().first() != Some(&b'{') {
            return Err(ApiError::invalid("the request body must be a JSON object", None));
        }
        serde_json::from_slice(bytes).map(Body).map_err(|e| {
            let message = e.to_string();
            // serde names the field in backticks: "unknown field `x`", "missing field `y`".
            let field = message.split('`').nth(1).map(str::to_owned);
            ApiError::InvalidRequest {
                message: format!("invalid JSON body: {message}"),
                param: field.filter(|_| message.contains("field")),
            }
        })
    }
}

/// Query parameters in the admin API's error format.
pub struct Params<T>(pub T);

impl<T: DeserializeOwned> FromRequestParts<AppState> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &AppState) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|q| Params(q.0))
            .map_err(|e| ApiError::invalid(format!("invalid query: {}", e.body_text()), None))
    }
}

/// The `{id}` of a path: not a whole number identifies nothing, so 404.
pub struct Id(pub i64);

impl FromRequestParts<AppState> for Id {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let axum::extract::Path(raw) = axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::NotFound { what: "resource" })?;
        raw.parse()
            .map(Id)
            .map_err(|_| ApiError::NotFound { what: "resource" })
    }
}

/// A text segment of a path (e.g. a request id); one that does not decode identifies nothing.
pub struct PathText(pub String);

impl FromRequestParts<AppState> for PathText {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|p| PathText(p.0))
            .map_err(|_| ApiError::NotFound { what: "resource" })
    }
}

/// A store failure on the admin path: a duplicate name 409; an unreachable database 503
/// `store_unavailable`; anything else logged and answered 500 without detail.
pub fn store_error(e: StoreError) -> ApiError {
    if e.is_unique_violation() {
        return ApiError::Conflict {
            message: "a resource with this name already exists".into(),
        };
    }
    ApiError::from(e)
}

/// The result of an admin handler.
pub type AdminResult<T = Response> = Result<T, ApiError>;

/// After a configuration change: announce it to every gateway and apply it here at once, so the
/// next proxied request sees it.
pub async fn config_changed(state: &AppState) -> AdminResult<()> {
    state.store.bump_config_epoch().await.map_err(store_error)?;
    state.reload().await;
    Ok(())
}

/// Records a change in the audit log (a failure to record is logged, not shown to the caller:
/// the change itself has happened).
pub async fn audit(
    state: &AppState,
    actor: &Actor,
    action: &str,
    target_kind: &str,
    target_id: i64,
    before: Option<serde_json::Value>,
    after: Option<serde_json::Value>,
) {
    let client_ip = actor.client_ip.to_string();
    let token = actor.token_label();
    let entry = AuditEntry {
        client_ip: &client_ip,
        workspace_id: actor.workspace_id(),
        at: state.clock.now_ms(),
        actor_id: actor.member.id,
        actor_email: &actor.member.email,
        actor_token: token.as_deref(),
        action,
        target_kind,
        target_id,
        before,
        after,
    };
    if let Err(e) = state.store.audit(&entry).await {
        tracing::error!(error = %e, action, target_kind, target_id, "could not write the audit log");
    }
}

/// Deletes the policies of workspace `ws` that `names` says refer to something going away (a
/// key, a department), so none is left naming a missing subject.
pub async fn delete_policies(
    state: &AppState,
    ws: i64,
    names: impl Fn(&crate::store::PolicyRow) -> bool,
) -> AdminResult<()> {
    let policies: Vec<crate::store::PolicyRow> = state
        .store
        .rows_in(crate::store::Table::Policies, ws)
        .await
        .map_err(store_error)?;
    for p in policies.iter().filter(|p| names(p)) {
        state
            .store
            .delete_in(crate::store::Table::Policies, ws, p.id)
            .await
            .map_err(store_error)?;
    }
    Ok(())
}

/// When a quota's current window ends, in the zone it is aligned in: what the console shows
/// (a client is told `reset_at`, one to two minutes later, spread per subject: DESIGN.md §4).
pub fn window_end(s: &crate::quota::engine::Standing, tz: chrono_tz::Tz) -> Option<String> {
    s.window_end
        .map(|end| crate::quota::window::format_reset_at(&end.with_timezone(&tz).fixed_offset()))
}

/// Unix ms as RFC 3339, for deadlines.
pub fn rfc3339(ms: i64) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(ms).map(|t| t.to_rfc3339())
}

/// A name field: trimmed, 1–100 characters, no control characters.
pub fn name_field(field: &str, value: &str) -> AdminResult<String> {
    checked(field, crate::validate::name(field, value))
}

/// A shared field rule's answer ([`crate::validate`]) as the 422 naming `field`.
pub fn checked<T>(field: &str, rule: Result<T, String>) -> AdminResult<T> {
    rule.map_err(|m| ApiError::field(field, m))
}

/// Tells an absent field (`None`) from an explicit `null` (`Some(None)`) in a PATCH body.
pub mod double_option {
    use serde::{Deserialize, Deserializer};

    /// Deserializes a present field, `null` included.
    pub fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(d).map(Some)
    }
}

/// `201 Created` with a JSON body.
/// `?cursor=&limit=` of a list that grows with the tenancy (keys, members, policies, upstreams,
/// models): the rows with ids above `cursor`, at most `limit` (1–1,000, default 100), in id order;
/// the answer's `next_cursor` fetches the next page (null after the last).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Page {
    #[serde(default)]
    cursor: Option<i64>,
    #[serde(default)]
    limit: Option<i64>,
}

/// Rows a page holds unless `limit` says otherwise.
const PAGE_ROWS: i64 = 100;

impl Page {
    /// The id after which the page starts, and how many rows it holds at most.
    pub fn bounds(&self) -> AdminResult<(i64, i64)> {
        let limit = self.limit.unwrap_or(PAGE_ROWS);
        if !(1..=1000).contains(&limit) {
            return Err(ApiError::field("limit", "limit must be between 1 and 1000"));
        }
        Ok((self.cursor.unwrap_or(0).max(0), limit))
    }
}

/// One page's rows, read with one row more than `limit` to know whether another page follows:
/// the rows to show and the `next_cursor` (the last shown id, when more follow).
pub fn page_of<T>(mut rows: Vec<T>, limit: i64, id: impl Fn(&T) -> i64) -> (Vec<T>, Option<i64>) {
    if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        let next = rows.last().map(&id);
        (rows, next)
    } else {
        (rows, None)
    }
}

pub fn created(body: serde_json::Value) -> Response {
    (axum::http::StatusCode::CREATED, axum::Json(body)).into_response()
}

/// `204 No Content`.
pub fn no_content() -> Response {
    axum::http::StatusCode::NO_CONTENT.into_response()
}
