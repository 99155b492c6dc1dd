//! The gateway's shared state: what a handler may need, built by `app::Gateway::build` from
//! narrow handles. Admin and proxy depend on it; it depends on neither.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::keys::KeyResolver;
use crate::config::{Secret, Settings};
use crate::kernel::clock::Clock;
use crate::kernel::crypto::MasterKey;
use crate::quota::engine::{Policies, QuotaCounters};
use crate::request_log::LogSink;
use crate::store::Store;
use crate::upstream::pool::routes::Routes;
use crate::upstream::pool::shared::Share;

/// Everything a handler may need. Built only by [`Gateway::build`].
#[derive(Clone)]
pub struct AppState(pub(crate) Arc<Inner>);

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
    /// Budget alerts: fired after each quota flush, delivered from the outbox in the background.
    pub alerts: crate::alerts::Alerts,
    /// Learned locks on upstream credentials.
    pub locks: crate::upstream::pool::locks::Locks,
    /// Locks, rests, banned marks and backoff levels shared with the other gateways at once
    /// through Redis, when `redis_url` is set.
    pub shared_locks: Option<Arc<crate::upstream::pool::shared::SharedLocks>>,
    /// Upstream credentials' own-limit usage and in-flight slots: decided in memory, the counts
    /// shared through the store at each flush (and through Redis after each dispatch and
    /// completion, when `redis_url` is set), the slots per process.
    pub admission: crate::upstream::pool::admission::Admission,
    /// Recent ambiguous 429s per quota group (groot ADR 0008 corroboration).
    pub corroboration: crate::upstream::pool::corroboration::Corroboration,
    /// Every key's error-rate breaker.
    pub breakers: crate::breaker::Breakers,
    /// Admin sign-in and tokens.
    pub sessions: crate::auth::session::Sessions,
    /// Gateway API keys on the request path.
    pub keys: KeyResolver,
    /// The subject ids of tag values and end users this gateway has seen.
    pub labels: crate::quota::labels::LabelIds,
    /// Requests in flight per capped key and member (per process: a cap holds per replica).
    pub in_flight: crate::kernel::in_flight::InFlight,
    /// Queue of request logs for the batch writer.
    pub logs: LogSink,
    /// The HTTP client to upstreams (no retries of its own, no redirects); each serving thread
    /// uses one of the same kind with a connection pool of its own.
    pub http: crate::transport::http::Client,
    /// Prometheus rendering.
    pub metrics: PrometheusHandle,
    /// Cancelled when the gateway shuts down; background tasks watch it.
    pub shutdown: CancellationToken,
    /// Cancelled by the serving threads when the stop's grace (`shutdown_grace_secs`) is over,
    /// before they drop the requests still running: their accounting then records them as cut
    /// by the stop, not by their client.
    pub grace_over: CancellationToken,
    /// Background tasks, drained at shutdown.
    pub tasks: TaskTracker,
    /// The writes handed off the request path by [`AppState::spawn_background`] and still
    /// running (closed from the start: waiting on it waits until none is left).
    pub(crate) pending_writes: TaskTracker,
    /// How often the configuration epoch and other gateways' locks are read.
    pub(crate) config_poll: Duration,
    /// The main runtime, where background tasks run (requests run on the serving threads').
    pub runtime: tokio::runtime::Handle,
    /// Open client connections, counted against `max_client_connections`.
    pub connections: crate::edge::client_conn::ConnectionSlots,
    /// Open connections on `admin_listen`, counted against `max_admin_connections`.
    pub admin_connections: crate::edge::client_conn::ConnectionSlots,
    /// The entities the resources file applied at start declares (marked in the admin API).
    pub managed: crate::kernel::managed::Managed,
    /// OpenTelemetry traces: off unless `otel_endpoint` is set.
    pub tracer: crate::observability::otel::Tracer,
    /// The identity provider of the console's single sign-on, if `oidc_issuer` is set.
    pub oidc: Option<crate::auth::oidc::Oidc>,
}

impl AppState {
    /// Runs `task` in the background on the main runtime, drained at shutdown (a serving thread's
    /// runtime stops with its last request).
    pub fn spawn_background(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks
            .spawn_on(self.pending_writes.track_future(task), &self.runtime);
    }
}

impl AppState {
    /// What a request's dispatch needs of the gateway.
    pub fn upstreams(&self) -> crate::upstream::dispatch::Upstreams<'_> {
        crate::upstream::dispatch::Upstreams {
            settings: &self.settings,
            clock: &self.clock,
            locks: &self.locks,
            admission: &self.admission,
            corroboration: &self.corroboration,
            http: &self.http,
            persist: self,
        }
    }
}

impl crate::upstream::dispatch::PersistLocks for AppState {
    fn persist_locks(
        &self,
        rows: Vec<(
            i64,
            crate::upstream::pool::locks::LockTarget,
            crate::upstream::pool::locks::LockEntry,
        )>,
        banned: Option<i64>,
    ) {
        if let Some(shared) = &self.shared_locks {
            shared.share(Share::Parks(rows.clone(), banned));
        }
        let state = self.clone();
        self.spawn_background(async move {
            state
                .store
                .write_until_done("persisting upstream locks", &state.shutdown, || {
                    crate::upstream::pool::locks::persist(&state.store, &rows, banned)
                })
                .await;
        });
    }

    fn record_parks(&self, events: Vec<crate::store::ParkEvent>) {
        use crate::store::CredentialFigureStore;
        let state = self.clone();
        self.spawn_background(async move {
            state
                .store
                .write_until_done("recording upstream locks", &state.shutdown, || {
                    state.store.record_parks(&events)
                })
                .await;
        });
    }

    fn share_backoff(&self, credential: i64, level: u32) {
        if let Some(shared) = &self.shared_locks {
            shared.share(match level {
                0 => Share::Reset(credential),
                _ => Share::Bumped(credential, level),
            });
        }
    }

    fn witness(
        &self,
        witness: crate::upstream::pool::corroboration::Witness,
        rest: Option<crate::upstream::pool::corroboration::GroupRest>,
    ) {
        if let Some(shared) = &self.shared_locks {
            shared.share(Share::Witnessed(witness, rest));
        }
    }

    fn counts_across_gateways(&self) -> bool {
        self.shared_locks.is_some()
    }
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// The client's address: the connection's, or behind a trusted proxy the one it forwarded
    /// (`trusted_proxies`, [`crate::edge::forwarded`]).
    pub fn client_ip(&self, peer: SocketAddr, headers: &axum::http::HeaderMap) -> std::net::IpAddr {
        crate::edge::forwarded::client_ip(peer.ip(), headers, &self.settings.trusted_proxies)
    }

    /// Starts the counters of policy `row`, about to be saved, from the usage already recorded
    /// in its current window (DESIGN.md §11; [`QuotaCounters::count_recorded`]).
    pub async fn count_recorded(
        &self,
        row: &crate::store::PolicyRow,
    ) -> crate::store::StoreResult<crate::quota::engine::Counted> {
        let tz = self.timezone_of(row.workspace_id);
        self.quota
            .count_recorded_for(&self.store, row, self.clock.now(), tz)
            .await
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

    /// The caps on tag keys, tag values and end users per workspace (settings).
    pub fn label_caps(&self) -> crate::store::LabelCaps {
        crate::store::LabelCaps {
            tag_keys: i64::from(self.settings.max_tag_keys),
            tag_values: i64::from(self.settings.max_tag_values),
            end_users: i64::from(self.settings.max_end_users),
        }
    }

    /// Key `api_key_id` as the bringer of new labels, with the caps on what one key brings
    /// (settings `max_*_per_key`).
    pub fn labels_brought_by(&self, api_key_id: i64) -> crate::quota::labels::BroughtBy {
        crate::quota::labels::BroughtBy {
            api_key_id,
            caps: crate::store::LabelCaps {
                tag_keys: i64::from(self.settings.max_tag_keys_per_key),
                tag_values: i64::from(self.settings.max_tag_values_per_key),
                end_users: i64::from(self.settings.max_end_users_per_key),
            },
        }
    }
}

/// Builds `pub const ROUTES: &[(&str, &str)]` (method, path) and a function returning the router
/// of exactly those routes from one table, so the list cannot drift from the router
/// (`tests/api/openapi.rs` compares the lists with `openapi.yaml`). `fn NAME, const LIST;` names
/// the list, for a module with more than one table.
macro_rules! route_table {
    ($(#[$doc:meta])* $vis:vis fn $name:ident; $($method:ident $path:literal => $handler:path;)*) => {
        $crate::state::route_table! {
            $(#[$doc])* $vis fn $name, const ROUTES; $($method $path => $handler;)*
        }
    };
    ($(#[$doc:meta])* $vis:vis fn $name:ident, const $list:ident; $($method:ident $path:literal => $handler:path;)*) => {
        /// Every route of this router as `(method, path)`, the method in lowercase.
        pub const $list: &[(&str, &str)] = &[$((stringify!($method), $path),)*];

        $(#[$doc])*
        $vis fn $name() -> axum::Router<$crate::state::AppState> {
            axum::Router::new()$(.route($path, axum::routing::$method($handler)))*
        }
    };
}
pub(crate) use route_table;
