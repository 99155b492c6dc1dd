//! The gateway: shared state, start-up (store, secrets, resources, bootstrap owner), the router,
//! and graceful shutdown. The start's helpers are in `startup`, the router in `router`, the
//! background tasks that keep replicas in step in `background`.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::keys::KeyResolver;
use crate::config::Settings;
use crate::kernel::clock::Clock;
use crate::kernel::crypto::MasterKey;
use crate::quota::engine::{Policies, QuotaCounters};
use crate::request_log;
use crate::resources;
use crate::state::{AppState, Inner};
use crate::store::Store;
use crate::upstream::pool::routes::Routes;

mod background;
mod router;
mod startup;

pub use startup::empty_database;

/// What the start checks of the settings before it writes anything, beside each setting's own
/// bound: the folders it writes to, the master key's form, the upstream CA file. Each problem as
/// the start names it (`aigw check` lists them all).
pub fn check_before_start(settings: &Settings) -> Vec<String> {
    let mut problems = Vec::new();
    if let Err(e) = startup::check_folders(settings) {
        problems.push(e.to_string());
    }
    if let Some(key) = &settings.master_key
        && let Err(e) = MasterKey::parse(key.expose())
    {
        problems.push(format!("bad setting master_key (AIGW_MASTER_KEY): {e}"));
    }
    if let Some(path) = &settings.upstream_ca_file
        && let Err(e) = crate::transport::http::read_cas(path)
    {
        problems.push(e);
    }
    problems
}
pub use router::{HEALTH_ROUTES, METRICS_ROUTES, Surface, router};

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
        let admin_cap = if settings.admin_listen.is_some() {
            settings.max_admin_connections
        } else {
            0
        };
        crate::edge::client_conn::raise_open_file_limit(
            settings.max_client_connections.saturating_add(admin_cap),
        );
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
        startup::check_folders(&settings)?;
        // The resources file is read, and on a new database checked whole, before anything is
        // written: a refused file leaves no database, no secrets file and no owner behind.
        let prepared = match &options.resources {
            Some(path) => Some(resources::Prepared::read(path, &env)?),
            None => None,
        };
        let opened = startup::open_unless_new_sqlite(&settings).await?;
        if let Some(prepared) = &prepared {
            startup::check_on_new_database(opened.as_ref(), prepared).await?;
        }
        let (master_text, jwt_secret) = startup::resolve_secrets(&settings)?;
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

        // Read with the other settings: a bad file stops the start before the database is touched.
        let own_cas = match &settings.upstream_ca_file {
            Some(path) => crate::transport::http::read_cas(path).map_err(StartError::Config)?,
            None => Vec::new(),
        };
        let store = match opened {
            Some(store) => store,
            None => Store::open_with(&settings.database_url, settings.database_max_connections).await?,
        }
        .with_rollup_interval(
            clock.clone(),
            i64::try_from(settings.rollup_interval_ms).unwrap_or(i64::MAX),
        );
        let start_lock = store.start_lock().await?;
        store.migrate().await?;
        let mut managed = crate::kernel::managed::Managed::default();
        if let Some(prepared) = &prepared {
            let mut summary = prepared.apply(&store, &master_key, clock.now_ms()).await?;
            startup::count_recorded(&store, &settings, &summary.new_policies, clock.now()).await?;
            managed = std::mem::take(&mut summary.managed);
            tracing::info!(file = %prepared.path(), %summary, "resources applied");
            for (address, key) in &summary.generated_keys {
                // Printed once, on stdout only: the plaintext is never stored or logged.
                println!("aigw: generated API key {address}: {key}");
            }
        }
        startup::bootstrap_owner(&store, &settings, clock.now_ms()).await?;
        start_lock.release().await;

        let routes = Routes::load(&store, &master_key).await?;
        let policies = Policies::load(&store).await?;
        // Webhooks stay away from this gateway's own listeners, as bound.
        let own: Vec<SocketAddr> = [Some(&listener), admin_listener.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let alerts = crate::alerts::Alerts::new(
            crate::alerts::AlertRules::load(&store).await?,
            crate::alerts::destination::Destinations::new(settings.alert_webhook_allow.clone(), own),
        );
        let epoch = store.config_epoch().await?;
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let pending_writes = TaskTracker::new();
        pending_writes.close();
        let logs = request_log::start_writer(
            store.clone(),
            clock.clone(),
            request_log::WriterIntervals {
                flush: Duration::from_millis(settings.flush_interval_ms),
                rollup: Duration::from_millis(settings.rollup_interval_ms),
            },
            usize::try_from(settings.max_log_queue_bytes).unwrap_or(usize::MAX),
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
        let http = crate::transport::http::Client::from_env(
            connect_timeout,
            settings.max_upstream_connections_per_host,
            &own_cas,
        )
        .map_err(StartError::Config)?;
        let sessions = crate::auth::session::Sessions::new(jwt_secret.expose());
        let breakers = crate::breaker::Breakers::default();
        breakers.load(&store).await?;
        // With Redis (issue 44), one link for every user of it: one word on whether it answers.
        let redis = match &settings.redis_url {
            Some(url) => Some(
                crate::kernel::redis_link::RedisLink::new(
                    url.expose(),
                    Duration::from_millis(settings.redis_timeout_ms),
                )
                .map_err(StartError::Config)?,
            ),
            None => None,
        };
        let channel = crate::upstream::pool::shared::CHANNEL;
        if let Some(link) = &redis {
            // The breaker's window and standings shared at once; its trips are published on the
            // locks' channel, whose subscriber hears them.
            let shared = crate::breaker::shared::SharedBreakers::connect(link, channel);
            breakers.share_through(Arc::new(shared));
        }
        let admission = crate::upstream::pool::admission::Admission::default();
        if let Some(link) = &redis {
            // The credentials' own-limit counts shared at once; the totals each write answers
            // are published on the locks' channel, whose subscriber hears them.
            let shared = crate::upstream::pool::own_shared::SharedOwnLimits::connect(link, channel);
            admission.share_through(Arc::new(shared));
        }
        let locks = crate::upstream::pool::locks::Locks::default();
        locks.load(&store, clock.now_ms(), true).await?;
        let connections = crate::edge::client_conn::ConnectionSlots::new(settings.max_client_connections);
        let admin_connections =
            crate::edge::client_conn::ConnectionSlots::new(settings.max_admin_connections);
        let mut quota = QuotaCounters::new(settings.store_outage_counters);
        if let Some(link) = &redis {
            let shared = crate::quota::shared::SharedCounters::connect(link).await;
            quota = quota.with_shared(Arc::new(shared));
        }
        // Locks shared at once: subscribed before the gateway serves, so no park published after
        // its start is missed; the levels read so a restart keeps them.
        let (shared_locks, subscription) = match &redis {
            Some(link) => {
                let shared = crate::upstream::pool::shared::SharedLocks::connect(link);
                let subscription = match shared.resubscribe(&locks).await {
                    Ok(stream) => Some(stream),
                    Err(e) => {
                        tracing::warn!(error = %e, "redis subscriber not connected: locks of other gateways come by the store poll until it connects");
                        None
                    }
                };
                (Some(Arc::new(shared)), subscription)
            }
            None => (None, None),
        };
        let tracer = crate::observability::otel::Tracer::start(&settings, &tasks, shutdown.clone())
            .map_err(StartError::Config)?;
        let oidc = crate::auth::oidc::Oidc::from_settings(&settings).map_err(StartError::Config)?;
        let state = AppState(Arc::new(Inner {
            settings,
            store,
            clock,
            master_key,
            jwt_secret,
            routes: ArcSwap::from_pointee(routes),
            policies: ArcSwap::from_pointee(policies),
            quota,
            alerts,
            keys: KeyResolver::new(),
            in_flight: crate::kernel::in_flight::InFlight::default(),
            labels: Default::default(),
            sessions,
            breakers,
            locks,
            shared_locks,
            admission,
            corroboration: Default::default(),
            logs,
            http,
            metrics: crate::observability::telemetry::metrics_handle(),
            shutdown,
            grace_over: CancellationToken::new(),
            tasks,
            pending_writes,
            config_poll: options.config_poll.unwrap_or(background::CONFIG_POLL),
            runtime: tokio::runtime::Handle::current(),
            connections,
            admin_connections,
            managed,
            tracer,
            oidc,
        }));
        background::start_config_watch(state.clone(), epoch);
        background::start_counter_flushes(state.clone());
        background::start_store_upkeep(state.clone());
        background::start_alert_delivery(state.clone());
        background::start_shared_locks(state.clone(), subscription);
        background::start_shared_breakers(state.clone());
        background::start_shared_own_limits(state.clone());
        if let Some(shared) = state.quota.shared() {
            state.tasks.spawn(shared.clone().run(state.shutdown.clone()));
        }
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
        let limits = crate::edge::client_conn::ClientLimits::new(&state.settings);
        let (main_surface, admin) = match self.admin_listener {
            Some(listener) => {
                let serving = crate::edge::serving::serve_light(
                    listener,
                    router(state.clone(), Surface::Admin),
                    limits.clone(),
                    state.admin_connections.clone(),
                    stopping.clone(),
                );
                (Surface::Proxy, Some(tokio::spawn(serving)))
            }
            None => (Surface::Everything, None),
        };
        let result = crate::edge::serving::serve(
            self.listener,
            router(state.clone(), main_surface),
            &state.http,
            Duration::from_micros(state.settings.idle_poll_us),
            limits,
            state.connections.clone(),
            stopped,
            state.grace_over.clone(),
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
        tracing::info!("aigw stopped");
        result
    }
}
