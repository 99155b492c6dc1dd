//! The gateway: shared state, start-up (store, secrets, resources, bootstrap owner), the router,
//! and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::time::Duration;

use arc_swap::ArcSwap;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::Clock;
use crate::config::{Secret, Settings};
use crate::crypto::{self, MasterKey};
use crate::error::ApiError;
use crate::proxy::auth::KeyResolver;
use crate::quota::engine::{Policies, QuotaCounters};
use crate::request_log::{self, LogSink};
use crate::resources;
use crate::store::{MemberStore, NewMember, Store, WorkspaceStore};
use crate::upstream::pool::Routes;

/// Everything a handler may need. Built only by [`Gateway::build`].
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

/// The contents of [`AppState`].
pub struct Inner {
    /// Resolved settings.
    pub settings: Settings,
    /// The database.
    pub store: Store,
    /// Source of "now" (manual in tests).
    pub clock: Clock,
    /// Seals and opens upstream secrets.
    pub master_key: MasterKey,
    /// Signs admin tokens.
    pub jwt_secret: Secret,
    /// The routing snapshot, swapped whole when the configuration changes.
    pub routes: ArcSwap<Routes>,
    /// Every quota policy, swapped whole when the configuration changes.
    pub policies: ArcSwap<Policies>,
    /// Quota counters, flushed in batches.
    pub quota: QuotaCounters,
    /// Learned locks on upstream credentials.
    pub locks: crate::upstream::locks::Locks,
    /// Upstream credentials' own-limit usage and in-flight slots: decided in memory, the counts
    /// shared through the store at each flush, the slots per process.
    pub admission: crate::upstream::admission::Admission,
    /// Recent ambiguous 429s per quota group (groot ADR 0008 corroboration).
    pub corroboration: crate::upstream::corroboration::Corroboration,
    /// Every key's error-rate breaker.
    pub breakers: crate::breaker::Breakers,
    /// Admin sign-in and tokens.
    pub sessions: crate::admin::session::Sessions,
    /// Gateway API keys on the request path.
    pub keys: KeyResolver,
    /// Queue of request logs for the batch writer.
    pub logs: LogSink,
    /// The HTTP client to upstreams (no retries of its own, no redirects); each serving thread
    /// uses one of the same kind with a connection pool of its own.
    pub http: crate::upstream::http::Client,
    /// Prometheus rendering.
    pub metrics: PrometheusHandle,
    /// Cancelled when the gateway shuts down; background tasks watch it.
    pub shutdown: CancellationToken,
    /// Background tasks, drained at shutdown.
    pub tasks: TaskTracker,
    /// The writes handed off the request path by [`AppState::spawn_background`] and still
    /// running (closed from the start: waiting on it waits until none is left).
    pending_writes: TaskTracker,
    /// How often the configuration epoch and other gateways' locks are read.
    config_poll: Duration,
    /// The main runtime, where background tasks run (requests run on the serving threads').
    pub runtime: tokio::runtime::Handle,
    /// Open client connections, counted against `max_client_connections`.
    pub connections: crate::client_conn::ConnectionSlots,
    /// The entities the resources file applied at start declares (marked in the admin API).
    pub managed: crate::managed::Managed,
}

impl AppState {
    /// Runs `task` in the background on the main runtime, drained at shutdown (a serving thread's
    /// runtime stops with its last request).
    pub fn spawn_background(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks
            .spawn_on(self.pending_writes.track_future(task), &self.runtime);
    }

    /// Shares everything this gateway has done so far and learns what the others did, without
    /// waiting for the background intervals: waits for the writes handed off the request path
    /// (locks, breaker trips), writes the queued request logs, flushes the quota, own-limit and
    /// breaker counts, then reloads the configuration, locks and trips from the store. The
    /// background tasks keep their intervals; this is the sync point of the behaviour tests
    /// (`TestApp::sync`), which would otherwise wait on those intervals.
    pub async fn sync(&self) {
        self.pending_writes.wait().await;
        self.logs.flush().await;
        self.flush_counters().await;
        self.reload().await;
    }
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

/// Why the gateway could not start. Each message names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting is wrong.
    #[error("{0}")]
    Config(String),
    /// The database could not be opened or migrated.
    #[error("cannot open the database: {0}")]
    Store(#[from] crate::store::StoreError),
    /// The resources file was refused.
    #[error("{0}")]
    Resources(#[from] resources::ResourcesError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The generated-secrets file could not be read or written.
    #[error("secrets file {path}: {message}")]
    SecretsFile {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

/// The shortest JWT secret started without a warning.
const MIN_JWT_SECRET_BYTES: usize = 32;

/// Options for building a gateway beyond its settings.
#[derive(Clone, Debug, Default)]
pub struct BuildOptions {
    /// The resources file to apply at start.
    pub resources: Option<PathBuf>,
    /// A manual clock (tests); the system clock when `None`.
    pub clock: Option<Clock>,
    /// How often the configuration epoch and other gateways' locks are read; half a second
    /// when `None`.
    pub config_poll: Option<Duration>,
}

/// A built gateway, bound to its address, not yet serving.
pub struct Gateway {
    listener: TcpListener,
    /// The listener of `admin_listen`, when set.
    admin_listener: Option<TcpListener>,
    state: AppState,
}

impl Gateway {
    /// Binds the listen address, resolves secrets, opens the store and, under the database's
    /// start lock, migrates it, applies the resources file and creates the first owner if none
    /// exists.
    ///
    /// The start lock makes gateways started at the same instant on one database (replicas of a
    /// deployment) do the writing one after another, so each entity is created once.
    pub async fn build(settings: Settings, options: BuildOptions) -> Result<Gateway, StartError> {
        let clock = options.clock.unwrap_or(Clock::System);
        let env = |k: &str| std::env::var(k).ok();
        // Bound first: a gateway that cannot serve stops before it writes anything (secrets
        // file, database, owner, generated keys).
        crate::client_conn::raise_open_file_limit(settings.max_client_connections);
        let listener = TcpListener::bind(settings.listen)
            .await
            .map_err(|source| StartError::Listen {
                addr: settings.listen,
                source,
            })?;
        let admin_listener = match settings.admin_listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| StartError::Listen { addr, source })?,
            ),
            None => None,
        };
        check_folders(&settings)?;
        let (master_text, jwt_secret) = resolve_secrets(&settings)?;
        let master_key = MasterKey::parse(master_text.expose())
            .map_err(|e| StartError::Config(format!("bad setting master_key (AIGW_MASTER_KEY): {e}")))?;
        // HS256 wants a key at least as long as its 256-bit hash (RFC 7518 §3.2); a short one can
        // be guessed offline from any token. Warned, not refused: an existing deployment keeps
        // starting while its operator replaces the secret.
        if jwt_secret.expose().len() < MIN_JWT_SECRET_BYTES {
            tracing::warn!(
                "jwt_secret (AIGW_JWT_SECRET) is shorter than {MIN_JWT_SECRET_BYTES} bytes: admin tokens \
                 signed with it can be forged by guessing it offline; replace it with e.g. the output of \
                 `openssl rand -base64 32` (every admin signs in again)"
            );
        }

        let store = Store::open(&settings.database_url).await?;
        let start_lock = store.start_lock().await?;
        store.migrate().await?;
        let mut managed = crate::managed::Managed::default();
        if let Some(path) = &options.resources {
            let mut summary = resources::apply_file(&store, &master_key, path, &env, clock.now_ms()).await?;
            managed = std::mem::take(&mut summary.managed);
            tracing::info!(file = %path.display(), %summary, "resources applied");
            for (address, key) in &summary.generated_keys {
                // Printed once, on stdout only: the plaintext is never stored or logged.
                println!("aigw: generated API key {address}: {key}");
            }
        }
        bootstrap_owner(&store, &settings, clock.now_ms()).await?;
        start_lock.release().await;

        let routes = Routes::load(&store, &master_key).await?;
        let policies = Policies::load(&store).await?;
        let epoch = store.config_epoch().await?;
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let pending_writes = TaskTracker::new();
        pending_writes.close();
        let logs = request_log::start_writer(
            store.clone(),
            Duration::from_millis(settings.flush_interval_ms),
            shutdown.clone(),
            &tasks,
        );
        request_log::start_retention(
            store.clone(),
            clock.clone(),
            settings.log_retention_days,
            shutdown.clone(),
            &tasks,
        );
        let connect_timeout = Duration::from_secs(settings.connect_timeout_secs);
        let http = crate::upstream::http::Client::from_env(
            connect_timeout,
            settings.max_upstream_connections_per_host,
        )
        .map_err(StartError::Config)?;
        let sessions = crate::admin::session::Sessions::new(jwt_secret.expose());
        let breakers = crate::breaker::Breakers::default();
        breakers.load(&store).await?;
        let locks = crate::upstream::locks::Locks::default();
        locks.load(&store, clock.now_ms(), true).await?;
        let connections = crate::client_conn::ConnectionSlots::new(settings.max_client_connections);
        let quota = QuotaCounters::new(settings.store_outage_counters);
        let state = AppState(Arc::new(Inner {
            settings,
            store,
            clock,
            master_key,
            jwt_secret,
            routes: ArcSwap::from_pointee(routes),
            policies: ArcSwap::from_pointee(policies),
            quota,
            keys: KeyResolver::new(),
            sessions,
            breakers,
            locks,
            admission: Default::default(),
            corroboration: Default::default(),
            logs,
            http,
            metrics: crate::telemetry::metrics_handle(),
            shutdown,
            tasks,
            pending_writes,
            config_poll: options.config_poll.unwrap_or(CONFIG_POLL),
            runtime: tokio::runtime::Handle::current(),
            connections,
            managed,
        }));
        start_config_watch(state.clone(), epoch);
        start_quota_flush(state.clone());
        Ok(Gateway {
            listener,
            admin_listener,
            state,
        })
    }

    /// The address actually bound (port 0 resolves here).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.state.settings.listen)
    }

    /// The address of the admin listener actually bound, when `admin_listen` is set.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The shared state (tests reach the store and clock through it).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `signal` resolves, then stops taking requests, lets running ones finish,
    /// drains background tasks and closes the store.
    pub async fn run_until_stopped(
        self,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let state = self.state.clone();
        let stop = state.shutdown.clone();
        let stopping = CancellationToken::new();
        let stop_admin = stopping.clone();
        let stopped = async move {
            tokio::select! {
                () = signal => {},
                () = stop.cancelled() => {},
            }
            stop_admin.cancel();
        };
        let limits = crate::client_conn::ClientLimits::new(&state.settings);
        let (main_surface, admin) = match self.admin_listener {
            Some(listener) => {
                let serving = crate::serving::serve_light(
                    listener,
                    router(state.clone(), Surface::Admin),
                    limits.clone(),
                    state.connections.clone(),
                    stopping.clone(),
                );
                (Surface::Proxy, Some(tokio::spawn(serving)))
            }
            None => (Surface::Everything, None),
        };
        let (result, threads) = crate::serving::serve(
            self.listener,
            router(state.clone(), main_surface),
            &state.http,
            Duration::from_micros(state.settings.idle_poll_us),
            limits,
            state.connections.clone(),
            stopped,
        )
        .await;
        stopping.cancel();
        if let Some(admin) = admin {
            let _ = admin.await;
        }
        // No request is running any more: stop the background tasks, which flush what they hold.
        state.shutdown.cancel();
        state.tasks.close();
        state.tasks.wait().await;
        state.store.close().await;
        if let Some(threads) = threads {
            threads.join().await;
        }
        tracing::info!("aigw stopped");
        result
    }
}

/// Builds `pub const ROUTES: &[(&str, &str)]` (method, path) and a function returning the router
/// of exactly those routes from one table, so the list cannot drift from the router
/// (`tests/api/openapi.rs` compares the lists with `openapi.yaml`). `fn NAME, const LIST;` names
/// the list, for a module with more than one table.
macro_rules! route_table {
    ($(#[$doc:meta])* $vis:vis fn $name:ident; $($method:ident $path:literal => $handler:path;)*) => {
        $crate::app::route_table! {
            $(#[$doc])* $vis fn $name, const ROUTES; $($method $path => $handler;)*
        }
    };
    ($(#[$doc:meta])* $vis:vis fn $name:ident, const $list:ident; $($method:ident $path:literal => $handler:path;)*) => {
        /// Every route of this router as `(method, path)`, the method in lowercase.
        pub const $list: &[(&str, &str)] = &[$((stringify!($method), $path),)*];

        $(#[$doc])*
        $vis fn $name() -> axum::Router<$crate::app::AppState> {
            axum::Router::new()$(.route($path, axum::routing::$method($handler)))*
        }
    };
}
pub(crate) use route_table;

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
        .layer(middleware::from_fn(request_id))
        .with_state(state)
}

/// Header carrying the request's id (UUID v7), on every response.
pub const REQUEST_ID: axum::http::HeaderName = axum::http::HeaderName::from_static("x-request-id");

/// The id of the request being served, in the request's extensions.
#[derive(Clone, Copy, Debug)]
pub struct RequestId(pub uuid::Uuid);

impl RequestId {
    /// The id as text (hyphenated, lower case), written into `buf` without `fmt`.
    pub fn encode(self, buf: &mut [u8; 36]) -> &str {
        self.0.hyphenated().encode_lower(buf)
    }
}

async fn request_id(mut req: Request, next: Next) -> Response {
    let id = uuid::Uuid::now_v7();
    req.extensions_mut().insert(RequestId(id));
    let mut resp = next.run(req).await;
    if let Ok(v) = HeaderValue::from_str(RequestId(id).encode(&mut [0; 36])) {
        resp.headers_mut().insert(REQUEST_ID, v);
    }
    resp
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.store.ready().await {
        (StatusCode::OK, "ready").into_response()
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
    use sha2::{Digest, Sha256};
    let presented = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.get(..7)
                .filter(|p| p.eq_ignore_ascii_case("bearer "))
                .map(|_| v[7..].trim())
        });
    presented.is_some_and(|p| Sha256::digest(p.as_bytes()) == Sha256::digest(token.expose().as_bytes()))
}

/// The gauges of this gateway's own state, read now rather than kept up to date on every
/// request.
fn state_gauges(state: &AppState) -> String {
    let now = state.clock.now();
    let mut e = crate::telemetry::Exposition::default();
    let mut one = |name: &'static str, value: usize| {
        e.family(name).sample(name, &[], value);
    };
    one("aigw_breaker_open_keys", state.breakers.open_keys(now));
    one("aigw_breaker_banned_keys", state.breakers.banned_keys());
    one("aigw_store_available", usize::from(state.store.available()));
    one("aigw_log_queue_depth", state.logs.queued().max(0) as usize);
    one("aigw_client_connections", state.connections.open());
    one("aigw_upstream_banned_credentials", state.locks.banned_count());
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

/// How often each gateway checks the configuration epoch by default (changes apply within a
/// second).
const CONFIG_POLL: Duration = Duration::from_millis(500);

/// Polls the configuration epoch; on a change, reloads the routing snapshot and forgets cached
/// keys, so edits from the console or another replica apply within a second.
fn start_config_watch(state: AppState, mut epoch: i64) {
    let s = state.clone();
    state.tasks.spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(s.config_poll) => {},
                () = s.shutdown.cancelled() => break,
            }
            // The epoch read is also the database's health probe: it ends an outage.
            match s.store.config_epoch().await {
                Ok(now) => {
                    s.store.note_success();
                    if now != epoch && s.reload().await {
                        epoch = now;
                    }
                }
                Err(e) => {
                    s.store.log_failure(&e, "configuration poll failed");
                    continue;
                }
            }
            // Locks written by other gateways (every poll: they are not configuration changes).
            if let Err(e) = s.locks.load(&s.store, s.clock.now_ms(), false).await {
                s.store.log_failure(&e, "lock poll failed");
            }
        }
    });
}

/// Flushes quota counters and upstream own-limit counts every flush interval, and once more at shutdown (after the last
/// request finished), so a graceful stop loses nothing.
fn start_quota_flush(state: AppState) {
    let s = state.clone();
    let every = Duration::from_millis(state.settings.flush_interval_ms);
    state.tasks.spawn(async move {
        loop {
            let stopping = tokio::select! {
                () = tokio::time::sleep(every) => false,
                () = s.shutdown.cancelled() => true,
            };
            s.flush_counters().await;
            if stopping {
                break;
            }
        }
    });
}

impl AppState {
    /// Writes the quota counters, upstream own-limit counts and breaker windows to the store and
    /// reads back what the other gateways counted; a failed flush keeps its counts for the next.
    async fn flush_counters(&self) {
        use crate::telemetry::timed_flush;
        if let Err(e) = timed_flush("quota", self.quota.flush(&self.store, self.clock.now())).await {
            self.store
                .log_failure(&e, "quota flush failed; usage kept for the next flush");
        }
        let own_limits = self.admission.flush(&self.store, self.clock.now_ms());
        if let Err(e) = timed_flush("own_limits", own_limits).await {
            self.store
                .log_failure(&e, "own-limit flush failed; counts kept for the next flush");
        }
        if let Err(e) = timed_flush("breakers", self.breakers.flush(&self.store, self.clock.now())).await {
            self.store.log_failure(
                &e,
                "breaker window flush failed; outcomes kept for the next flush",
            );
        }
    }

    /// The client's address: the connection's, or behind a trusted proxy the one it forwarded
    /// (`trusted_proxies`, [`crate::forwarded`]).
    pub fn client_ip(&self, peer: SocketAddr, headers: &axum::http::HeaderMap) -> std::net::IpAddr {
        crate::forwarded::client_ip(peer.ip(), headers, &self.settings.trusted_proxies)
    }

    /// The zone a workspace's quota windows align to: its own, else the gateway's.
    pub fn timezone_of(&self, workspace_id: i64) -> chrono_tz::Tz {
        self.routes
            .load()
            .workspaces
            .get(&workspace_id)
            .and_then(|w| w.timezone)
            .unwrap_or(self.settings.timezone)
    }

    /// Reloads the routing snapshot and forgets cached keys; false if the store failed.
    pub async fn reload(&self) -> bool {
        let loaded = async {
            Ok::<_, crate::store::StoreError>((
                Routes::load(&self.store, &self.master_key).await?,
                Policies::load(&self.store).await?,
            ))
        };
        match loaded.await {
            Ok((routes, policies)) => {
                if let Err(e) = self.locks.load(&self.store, self.clock.now_ms(), true).await {
                    self.store.log_failure(&e, "lock reload failed");
                }
                // kRouter: an edited secret clears its per-model locks and backoff level on every
                // gateway, this one included (the backoff level is kept in memory only).
                for id in routes.secrets_replaced_since(&self.routes.load()) {
                    self.locks.secret_replaced(id);
                }
                // Trips, blocks and bans written by another gateway.
                if let Err(e) = self.breakers.load(&self.store).await {
                    self.store.log_failure(&e, "breaker reload failed");
                }
                self.routes.store(Arc::new(routes));
                self.policies.store(Arc::new(policies));
                self.keys.invalidate_all();
                true
            }
            Err(e) => {
                self.store.log_failure(&e, "configuration reload failed");
                false
            }
        }
    }
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

/// The folders the start writes into exist: the SQLite file's, and `data_dir` when set. Checked
/// before anything is written, so a missing folder is named as such rather than through the
/// first file that could not be created in it. Folders are not created: a missing one is more
/// often a typo than an intention.
fn check_folders(settings: &Settings) -> Result<(), StartError> {
    if settings.is_sqlite() {
        let file = crate::config::sqlite_path(&settings.database_url);
        let folder = Path::new(file).parent().filter(|p| !p.as_os_str().is_empty());
        if let Some(folder) = folder
            && !file.starts_with(":memory:")
            && !folder.is_dir()
        {
            return Err(StartError::Config(format!(
                "the database folder {} does not exist (database_url, AIGW_DATABASE_URL = {:?}): \
                 create it, or choose a path in an existing folder",
                folder.display(),
                settings.database_url
            )));
        }
    }
    let data_dir = &settings.data_dir;
    if !data_dir.as_os_str().is_empty() && !data_dir.is_dir() {
        return Err(StartError::Config(format!(
            "the data folder {} does not exist (data_dir, AIGW_DATA_DIR): create it, or leave \
             the setting out to keep aigw.keys beside the database",
            data_dir.display()
        )));
    }
    Ok(())
}

/// The master key and JWT secret: from settings, else from `aigw.keys` beside the database,
/// else generated into that file (0600) with a warning.
fn resolve_secrets(settings: &Settings) -> Result<(Secret, Secret), StartError> {
    if let (Some(m), Some(j)) = (&settings.master_key, &settings.jwt_secret) {
        return Ok((m.clone(), j.clone()));
    }
    let path = settings.secrets_dir().join("aigw.keys");
    let err = |message: String| StartError::SecretsFile {
        path: path.clone(),
        message,
    };
    #[derive(serde::Deserialize, serde::Serialize)]
    struct KeysFile {
        master_key: String,
        jwt_secret: String,
    }
    let read = |path: &Path| -> Result<KeysFile, StartError> {
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        toml::from_str::<KeysFile>(&text).map_err(|e| err(e.to_string()))
    };
    let file = if path.exists() {
        read(&path)?
    } else {
        let file = KeysFile {
            master_key: MasterKey::generate_text(),
            jwt_secret: MasterKey::generate_text(),
        };
        let text = toml::to_string(&file).map_err(|e| err(e.to_string()))?;
        match publish_private(&path, &text) {
            Ok(()) => {
                tracing::warn!(
                    file = %path.display(),
                    "no master key or JWT secret configured: generated them into this file; back it up \
                     (upstream secrets cannot be decrypted without it) or set AIGW_MASTER_KEY and AIGW_JWT_SECRET"
                );
                file
            }
            // Another gateway started at the same instant in this folder published its file
            // first: use that one, so both open the same sealed secrets.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read(&path)?,
            Err(e) => return Err(err(e.to_string())),
        }
    };
    Ok((
        settings
            .master_key
            .clone()
            .unwrap_or(Secret::new(file.master_key)),
        settings
            .jwt_secret
            .clone()
            .unwrap_or(Secret::new(file.jwt_secret)),
    ))
}

/// Writes `text` to `path` (mode 0600) only if `path` does not exist, atomically: the text goes
/// to a private temporary file that is then hard-linked into place, so a reader never sees a
/// partial file and of two writers exactly one wins (the other gets `AlreadyExists`).
fn publish_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut temp_name = path.as_os_str().to_owned();
    temp_name.push(format!(".{}.tmp", uuid::Uuid::now_v7().simple()));
    let temp = PathBuf::from(temp_name);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let written = opts.open(&temp).and_then(|mut f| {
        f.write_all(text.as_bytes())?;
        f.sync_all()
    });
    let published = written.and_then(|()| std::fs::hard_link(&temp, path));
    let _ = std::fs::remove_file(&temp);
    published
}

/// The first owner's email when `bootstrap_email` is not set.
const DEFAULT_OWNER_EMAIL: &str = "owner@aigw.local";

/// First start with no owner: a workspace and an owner from the bootstrap settings, or with a
/// generated password printed once.
async fn bootstrap_owner(store: &Store, settings: &Settings, now: i64) -> Result<(), StartError> {
    if store.count_owners().await? > 0 {
        warn_if_bootstrap_ignored(store, settings).await?;
        return Ok(());
    }
    let workspace = match store.workspaces().await?.into_iter().next() {
        Some(w) => w,
        None => store.create_workspace("default", None, now).await?,
    };
    let email = settings
        .bootstrap_email
        .clone()
        .unwrap_or_else(|| DEFAULT_OWNER_EMAIL.to_owned());
    let (password, generated) = match &settings.bootstrap_password {
        Some(p) => (p.expose().to_owned(), false),
        None => (crypto::generate_password(), true),
    };
    let hash = crypto::hash_password(&password);
    match store.member_by_email(&email).await? {
        Some(existing) => {
            store
                .update_member(existing.id, existing.department_id, "owner")
                .await?;
            store.set_member_password(existing.id, &hash).await?;
        }
        None => {
            let new = NewMember {
                workspace_id: workspace.id,
                department_id: None,
                email: &email,
                role: "owner",
                password_hash: Some(&hash),
            };
            store.create_member(&new, now).await?;
        }
    }
    tracing::info!(email = %email, workspace = %workspace.name, "created the first owner");
    if generated {
        // Printed once, on stdout only; set AIGW_BOOTSTRAP_PASSWORD to choose it instead.
        println!(
            "aigw: first owner {email} in workspace {:?}, password: {password}",
            workspace.name
        );
    }
    Ok(())
}

/// The bootstrap settings only act while there is no owner. Set on a later start for an email
/// that is not an owner (a walkthrough run against an old database, a changed email), they would
/// otherwise be ignored without a word, and the sign-in with them fails.
async fn warn_if_bootstrap_ignored(store: &Store, settings: &Settings) -> Result<(), StartError> {
    if settings.bootstrap_email.is_none() && settings.bootstrap_password.is_none() {
        return Ok(());
    }
    let email = settings.bootstrap_email.as_deref().unwrap_or(DEFAULT_OWNER_EMAIL);
    let is_owner = store
        .member_by_email(email)
        .await?
        .is_some_and(|m| m.role == "owner");
    if !is_owner {
        tracing::warn!(
            email = %email,
            "AIGW_BOOTSTRAP_EMAIL / AIGW_BOOTSTRAP_PASSWORD (bootstrap_email, bootstrap_password) \
             are ignored: the database already has an owner, and the bootstrap settings only \
             create the first one; sign in as the existing owner, or start on a new database"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gateways started at the same instant in one folder with no secrets configured: exactly one
    /// generates `aigw.keys`, and every one of them uses that file's secrets.
    #[test]
    fn secrets_generated_at_the_same_instant_are_one_file() {
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let mut settings = Settings::load(None, |_| None).unwrap();
            settings.master_key = None;
            settings.jwt_secret = None;
            settings.data_dir = dir.path().to_path_buf();
            let barrier = std::sync::Barrier::new(6);
            let resolved: Vec<(String, String)> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..6)
                    .map(|_| {
                        scope.spawn(|| {
                            barrier.wait();
                            let (m, j) = resolve_secrets(&settings).unwrap();
                            (m.expose().to_owned(), j.expose().to_owned())
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(resolved.iter().all(|r| r == &resolved[0]), "{resolved:?}");
            let names: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, ["aigw.keys"], "no temporary file left behind");
        }
    }
}
