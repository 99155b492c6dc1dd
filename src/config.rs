//! Settings: defaults, then the TOML file, then `AIGW_*` variables (env wins). This is the one
//! place that reads configuration; a bad setting stops the start with a message naming it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use chrono_tz::Tz;
use serde::Deserialize;

mod database;
pub mod destinations;
pub mod sso;
mod values;

use database::database_url_form;
pub use database::{DEFAULT_POSTGRES_CONNECTIONS, sqlite_path};
pub use destinations::AllowedDestination;

use values::SettingValue;

/// A secret value: never printed by `Debug` or `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret string.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The secret itself; call only where it is used, never to log.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

/// Language of the gateway's own messages (breaker wording has a Chinese form, seed 003).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Locale {
    /// English (default).
    En,
    /// LyRouter's exact Chinese wording.
    Zh,
}

impl fmt::Display for Locale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Locale::En => "en",
            Locale::Zh => "zh",
        })
    }
}

impl FromStr for Locale {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "en" => Ok(Locale::En),
            "zh" => Ok(Locale::Zh),
            other => Err(format!("unknown locale {other:?} (expected \"en\" or \"zh\")")),
        }
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

impl FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "unknown log format {other:?} (expected \"text\" or \"json\")"
            )),
        }
    }
}

/// What a quota check does, while the database is unreachable, with a counter this gateway has
/// never read (its first request in a new window, or a subject it has not served yet).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutageCounters {
    /// Count from 0 in memory and add what was counted to the stored total on recovery (each
    /// gateway may admit up to one limit more than the stored total allowed).
    #[default]
    Serve,
    /// Answer 503 `store_unavailable` for that subject until the database answers.
    Refuse,
}

impl fmt::Display for OutageCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutageCounters::Serve => "serve",
            OutageCounters::Refuse => "refuse",
        })
    }
}

impl FromStr for OutageCounters {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "serve" => Ok(OutageCounters::Serve),
            "refuse" => Ok(OutageCounters::Refuse),
            other => Err(format!(
                "unknown choice {other:?} (expected \"serve\" or \"refuse\")"
            )),
        }
    }
}

/// The longest any deadline setting may be, in seconds: a day.
const MAX_WAIT_SECS: u64 = 86_400;

/// Default of `max_usage_tokens`: far above any model's context, far below any overflow.
pub const DEFAULT_MAX_USAGE_TOKENS: u64 = 100_000_000;
/// Highest `max_usage_tokens` accepted: a counter still takes millions of such calls before it
/// saturates.
const MAX_USAGE_TOKENS_LIMIT: u64 = 1_000_000_000_000;

/// One setting as operators meet it: its file key, its variable and what it is.
#[derive(Clone, Copy, Debug)]
pub struct SettingInfo {
    /// The TOML file's key, also the field of [`Settings`].
    pub key: &'static str,
    /// The `AIGW_*` variable.
    pub env: &'static str,
    /// Its documentation comment.
    pub doc: &'static str,
}

/// A setting's own bound: `Err` says what the value must be.
type Check<T> = fn(&T) -> Result<(), String>;

/// Declares every setting once: its documentation, type, default, variable and own bound. From
/// it come [`Settings`], its `Default`, the TOML file's fields, the variables read, the bounds
/// checked, and [`SETTINGS`], which the docs' tables are tested against.
macro_rules! settings {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident: $ty:ty = $default:expr, $env:literal $(, check $check:expr)?;
    )*) => {
        /// The gateway's settings, fully resolved.
        #[derive(Clone, Debug)]
        pub struct Settings {
            $($(#[doc = $doc])* pub $field: $ty,)*
        }

        impl Default for Settings {
            fn default() -> Self {
                Settings { $($field: $default,)* }
            }
        }

        /// Every setting, in the order of the docs' tables.
        pub const SETTINGS: &[SettingInfo] = &[
            $(SettingInfo { key: stringify!($field), env: $env, doc: concat!($($doc, "\n"),*) },)*
        ];

        impl Settings {
            /// Reads the file's keys, each on its own: every bad value and every unknown key is
            /// noted in `errors` with its line, not only the first.
            fn apply_file(
                &mut self,
                path: &Path,
                text: &str,
                mut table: BTreeMap<String, toml::Spanned<toml::Value>>,
                errors: &mut Vec<String>,
            ) {
                let line = |span: std::ops::Range<usize>| line_of(text, span.start);
                let mut found = Vec::new();
                $(if let Some(v) = table.remove(stringify!($field)) {
                    let at = line(v.span());
                    let name = format!("{}, line {at} ({})", path.display(), stringify!($field));
                    let read = <<$ty as SettingValue>::File as Deserialize>::deserialize(v.into_inner())
                        .map_err(|e| ConfigError(format!("bad setting {name}: {}", e.to_string().trim())))
                        .and_then(|v| <$ty as SettingValue>::from_file(&name, v));
                    match read {
                        Ok(v) => self.$field = v,
                        Err(e) => found.push((at, e.0)),
                    }
                })*
                for (key, v) in table {
                    let at = line(v.span());
                    found.push((at, format!("config file {}, line {at}: {}", path.display(), unknown_setting(&key))));
                }
                found.sort_by_key(|(at, _)| *at);
                errors.extend(found.into_iter().map(|(_, e)| e));
            }

            /// Reads the variables set and not empty; every bad one is noted in `errors`.
            fn apply_env(&mut self, var: impl Fn(&str) -> Option<String>, errors: &mut Vec<String>) {
                $(if let Some(v) = var($env) {
                    let name = concat!(stringify!($field), " (", $env, ")");
                    match <$ty as SettingValue>::from_env(name, &v) {
                        Ok(v) => self.$field = v,
                        Err(e) => errors.push(e.0),
                    }
                })*
            }

            /// Each setting within its own bound; every one out of it is noted in `errors`.
            fn check_each(&self, errors: &mut Vec<String>) {
                $($(
                    let check: Check<$ty> = $check;
                    if let Err(why) = check(&self.$field) {
                        errors.push(format!("bad setting {} ({}): {why}", stringify!($field), $env));
                    }
                )?)*
            }

            /// Each setting's default as the docs' tables show it, by key.
            pub fn shown_defaults() -> Vec<(&'static str, Option<String>)> {
                let d = Settings::default();
                vec![$((stringify!($field), SettingValue::shown(&d.$field)),)*]
            }
        }
    };
}

fn at_least_1<T: PartialOrd + From<u8>>(v: &T) -> Result<(), String> {
    if *v >= T::from(1) {
        Ok(())
    } else {
        Err("must be at least 1".into())
    }
}

fn wait_secs(v: &u64) -> Result<(), String> {
    // Every wait is bounded, by at most a day (a deadline is an instant; a day keeps its sum far
    // from overflowing).
    if (1..=MAX_WAIT_SECS).contains(v) {
        Ok(())
    } else {
        Err("must be 1..=86400 (seconds)".into())
    }
}

fn client_wait_secs(v: &u64) -> Result<(), String> {
    if (1..=3600).contains(v) {
        Ok(())
    } else {
        Err("must be 1..=3600".into())
    }
}

fn at_most_60000(v: &u64) -> Result<(), String> {
    if *v <= 60_000 {
        Ok(())
    } else {
        Err("must be at most 60000".into())
    }
}

settings! {
    /// Address the gateway listens on.
    listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 4000)), "AIGW_LISTEN";
    /// `sqlite://…` (default `sqlite://aigw.db`) or `postgres://…`.
    database_url: String = "sqlite://aigw.db".to_owned(), "AIGW_DATABASE_URL", check |v| database_url_form(v);
    /// Most connections one gateway opens to Postgres for its work (the start lock and the
    /// health probe take one more each while they run); SQLite keeps four.
    database_max_connections: u32 = DEFAULT_POSTGRES_CONNECTIONS, "AIGW_DATABASE_MAX_CONNECTIONS", check |v| {
        if (1..=1000).contains(v) { Ok(()) } else { Err("must be 1..=1000".into()) }
    };
    /// Time zone that quota windows align to, unless a workspace overrides it.
    timezone: Tz = chrono_tz::Asia::Shanghai, "AIGW_TIMEZONE";
    /// Language of the gateway's own messages.
    locale: Locale = Locale::En, "AIGW_LOCALE";
    /// 32-byte key (base64 or hex) that encrypts upstream secrets; never stored in the database.
    master_key: Option<Secret> = None, "AIGW_MASTER_KEY";
    /// Secret that signs admin JWTs.
    jwt_secret: Option<Secret> = None, "AIGW_JWT_SECRET";
    /// Email of the first owner, created when no owner exists.
    bootstrap_email: Option<String> = None, "AIGW_BOOTSTRAP_EMAIL", check |v| match v {
        Some(email) if crate::validate::email(email).is_err() => Err("not an email address".into()),
        _ => Ok(()),
    };
    /// Password of the first owner; generated and printed once when absent.
    bootstrap_password: Option<Secret> = None, "AIGW_BOOTSTRAP_PASSWORD";
    /// Largest request body accepted on the proxy, in bytes.
    max_body_bytes: usize = 32 * 1024 * 1024, "AIGW_MAX_BODY_BYTES", check at_least_1;
    /// Upstream attempts per request, across credentials and fallback models.
    max_attempts: u32 = 3, "AIGW_MAX_ATTEMPTS", check at_least_1;
    /// A non-streamed request's whole time, head and body, across every upstream attempt, in
    /// seconds (the official SDKs wait 600 s).
    request_timeout_secs: u64 = 600, "AIGW_REQUEST_TIMEOUT_SECS", check wait_secs;
    /// How long opening a connection to an upstream may take, TCP and TLS handshake, in
    /// seconds; short, so that an unreachable upstream fails over quickly.
    connect_timeout_secs: u64 = 5, "AIGW_CONNECT_TIMEOUT_SECS", check wait_secs;
    /// A streamed request's time until the upstream's first byte, across every upstream attempt,
    /// in seconds.
    stream_first_byte_timeout_secs: u64 = 600, "AIGW_STREAM_FIRST_BYTE_TIMEOUT_SECS", check wait_secs;
    /// The longest gap between two chunks of an upstream stream, in seconds.
    stream_idle_timeout_secs: u64 = 120, "AIGW_STREAM_IDLE_TIMEOUT_SECS", check wait_secs;
    /// How long the client may take to send its whole request body, in seconds.
    client_body_timeout_secs: u64 = 60, "AIGW_CLIENT_BODY_TIMEOUT_SECS", check wait_secs;
    /// How long a request waits for an in-flight slot when every candidate credential's slots
    /// are full, in milliseconds (kRouter: then "credential busy", a short backoff).
    slot_wait_ms: u64 = 1000, "AIGW_SLOT_WAIT_MS", check at_most_60000;
    /// Shortest wait before the single-candidate retry, in milliseconds (groot ADR 0008: 1 to 3 s
    /// with jitter).
    single_candidate_retry_min_ms: u64 = 1000, "AIGW_SINGLE_CANDIDATE_RETRY_MIN_MS";
    /// Longest wait before the single-candidate retry, in milliseconds.
    single_candidate_retry_max_ms: u64 = 3000, "AIGW_SINGLE_CANDIDATE_RETRY_MAX_MS", check at_most_60000;
    /// How often in-memory counters and request logs are flushed to the store, in milliseconds.
    flush_interval_ms: u64 = 250, "AIGW_FLUSH_INTERVAL_MS", check |v| {
        if (10..=60_000).contains(v) { Ok(()) } else { Err("must be 10..=60000".into()) }
    };
    /// Most tag keys (`x-aigw-tags`) per workspace; a new one past it: `tag_value_limit`.
    max_tag_keys: u32 = 50, "AIGW_MAX_TAG_KEYS", check at_least_1;
    /// Most values of one tag key per workspace; a new one past it: `tag_value_limit`.
    max_tag_values: u32 = 1000, "AIGW_MAX_TAG_VALUES", check at_least_1;
    /// Most end users per workspace; a new one past it: `end_user_limit`.
    max_end_users: u32 = 100_000, "AIGW_MAX_END_USERS", check at_least_1;
    /// Most tag keys among the tag values one API key brought to its workspace (issue 40 item
    /// 3: no key fills the workspace's `max_tag_keys` alone); past it: `tag_value_limit`.
    max_tag_keys_per_key: u32 = 20, "AIGW_MAX_TAG_KEYS_PER_KEY", check at_least_1;
    /// Most values of one tag key one API key brought to its workspace; past it:
    /// `tag_value_limit`.
    max_tag_values_per_key: u32 = 250, "AIGW_MAX_TAG_VALUES_PER_KEY", check at_least_1;
    /// Most end users one API key brought to its workspace; past it: `end_user_limit`.
    max_end_users_per_key: u32 = 25_000, "AIGW_MAX_END_USERS_PER_KEY", check at_least_1;
    /// A tag value or end user no request has brought for this many days is deleted, freeing
    /// its place under the caps (one a policy names never is); 0 keeps them for ever.
    label_expiry_days: u32 = 90, "AIGW_LABEL_EXPIRY_DAYS", check |v| {
        if *v <= 36_500 { Ok(()) } else { Err("must be 0..=36500 (days; 0: never)".into()) }
    };
    /// Request logs older than this many days are deleted, and the budget alert history with
    /// them (docs/quotas.md "Budget alerts").
    log_retention_days: u32 = 30, "AIGW_LOG_RETENTION_DAYS", check at_least_1;
    /// Most memory, in bytes, the request logs waiting for the database may take (during an
    /// outage, or while the database takes fewer than are served); past it a log is dropped
    /// and counted (`aigw_request_logs_dropped_total`). Quota counters are never dropped.
    max_log_queue_bytes: u64 = 128 * 1024 * 1024, "AIGW_MAX_LOG_QUEUE_BYTES", check |v| {
        if *v >= 65_536 { Ok(()) } else { Err("must be at least 65536 (64 KiB)".into()) }
    };
    /// How often each gateway writes the usage rollups' sums of the logs it stored, in
    /// milliseconds: a rollup row is written once per interval rather than with every batch of
    /// logs. The usage reports read the logs for the last two intervals (docs/performance.md,
    /// "Known cost: CPU per request at many keys").
    rollup_interval_ms: u64 = 60_000, "AIGW_ROLLUP_INTERVAL_MS", check |v| {
        if (1_000..=3_600_000).contains(v) { Ok(()) } else { Err("must be 1000..=3600000".into()) }
    };
    /// Where generated secrets (`aigw.keys`) are kept; default: beside the SQLite file, else `.`.
    data_dir: PathBuf = PathBuf::new(), "AIGW_DATA_DIR";
    /// Log line format.
    log_format: LogFormat = LogFormat::Text, "AIGW_LOG_FORMAT";
    /// Most a serving thread polls for I/O before it sleeps, in microseconds (adaptive, as KVM's
    /// halt polling; 0 turns it off).
    idle_poll_us: u64 = 200, "AIGW_IDLE_POLL_US", check |v| {
        if *v <= 10_000 { Ok(()) } else { Err("must be at most 10000".into()) }
    };
    /// How long the requests running when a stop begins (SIGTERM) may take to finish, in seconds;
    /// then their connections are closed (a stream cut so is logged `gateway_stopped`, its usage
    /// estimated) and what the gateway holds is written. Below the supervisor's kill timeout.
    shutdown_grace_secs: u64 = 25, "AIGW_SHUTDOWN_GRACE_SECS", check |v| {
        if *v <= 86_400 { Ok(()) } else { Err("must be at most 86400".into()) }
    };
    /// Longest a client may take to send a request's line and headers, in seconds: from the
    /// connection's accept, or from the first byte of a later request on a kept-alive connection.
    client_header_timeout_secs: u64 = 30, "AIGW_CLIENT_HEADER_TIMEOUT_SECS", check client_wait_secs;
    /// Longest a kept-alive client connection may wait for its next request, in seconds.
    client_idle_timeout_secs: u64 = 75, "AIGW_CLIENT_IDLE_TIMEOUT_SECS", check client_wait_secs;
    /// Most client connections open at once; past it a new connection is answered 503 and closed.
    max_client_connections: usize = 10_000, "AIGW_MAX_CLIENT_CONNECTIONS", check at_least_1;
    /// Largest request line and headers accepted, in bytes; larger is refused with 431.
    max_header_bytes: usize = 16 * 1024, "AIGW_MAX_HEADER_BYTES", check |v| {
        // The HTTP/1 parser's buffer cannot be smaller than 8 KiB.
        if (8192..=1024 * 1024).contains(v) { Ok(()) } else { Err("must be 8192..=1048576".into()) }
    };
    /// Most tokens one call may report: usage from an upstream above it (in any count, or in
    /// all) is invalid, and the gateway's estimate is counted instead.
    max_usage_tokens: u64 = DEFAULT_MAX_USAGE_TOKENS, "AIGW_MAX_USAGE_TOKENS", check |v| {
        if (1..=MAX_USAGE_TOKENS_LIMIT).contains(v) { Ok(()) } else { Err("must be 1..=1000000000000".into()) }
    };
    /// Where quota counters, credential locks and backoff levels are shared across gateways in
    /// real time, `redis://` or `rediss://`, one server or a Redis Cluster (one node's URL, or the
    /// seed nodes' separated by commas) (issue 44, docs/redis.md). Unset: each gateway
    /// learns the others' usage at its flush and their locks at its store poll.
    redis_url: Option<Secret> = None, "AIGW_REDIS_URL", check values::redis_url_form;
    /// Longest a Redis round trip may take, in ms; past it the gateway counts alone until it answers.
    redis_timeout_ms: u64 = 50, "AIGW_REDIS_TIMEOUT_MS", check values::redis_timeout;
    /// While the database is unreachable, a quota counter never read before: `serve` (count
    /// from 0 in memory) or `refuse` (503 `store_unavailable`).
    store_outage_counters: OutageCounters = OutageCounters::Serve, "AIGW_STORE_OUTAGE_COUNTERS";
    /// Most HTTP/1.1 requests in flight to one upstream (scheme, host and port) at once; past it
    /// a request waits for one to finish. HTTP/2 upstreams multiplex, 100 requests a connection.
    max_upstream_connections_per_host: usize = 4096, "AIGW_MAX_UPSTREAM_CONNECTIONS_PER_HOST", check at_least_1;
    /// A PEM file of certificate authorities that upstream TLS connections trust besides the
    /// public ones (a self-hosted endpoint behind a company CA); read at start.
    upstream_ca_file: Option<PathBuf> = None, "AIGW_UPSTREAM_CA_FILE";
    /// A second address serving the admin API, the console and `/metrics`; the main address
    /// then serves only the proxy and the health endpoints.
    admin_listen: Option<SocketAddr> = None, "AIGW_ADMIN_LISTEN";
    /// Most connections open at once on `admin_listen`, a cap of its own (the proxy's
    /// `max_client_connections` leaves the admin surfaces reachable).
    max_admin_connections: usize = 512, "AIGW_MAX_ADMIN_CONNECTIONS", check at_least_1;
    /// The bearer token `/metrics` asks for; open to anyone who reaches it when unset.
    metrics_token: Option<Secret> = None, "AIGW_METRICS_TOKEN", check |v| match v {
        Some(t) if t.expose().trim().is_empty() => Err("must not be blank".into()),
        _ => Ok(()),
    };
    /// Proxies (CIDRs) whose `X-Forwarded-For` is believed: the client's address, for request
    /// logs, the audit log and sign-in throttling, is the rightmost address of that header not
    /// in these networks. Empty: the connection's own address, the header ignored.
    trusted_proxies: Vec<ipnet::IpNet> = Vec::new(), "AIGW_TRUSTED_PROXIES";
    /// Hosts (by the name a webhook URL gives) and networks (CIDRs or addresses) that budget
    /// alert webhooks may reach although they are loopback, link-local, private or otherwise
    /// reserved. The gateway's own listeners are never reached.
    alert_webhook_allow: Vec<AllowedDestination> = Vec::new(), "AIGW_ALERT_WEBHOOK_ALLOW";
    /// Where traces go: an OTLP/HTTP collector's base URL (`http://collector:4318`, to which
    /// `/v1/traces` is added) or its full traces URL. Unset: no traces.
    otel_endpoint: Option<String> = None, "AIGW_OTEL_ENDPOINT", check |v| http_url(v.as_deref());
    /// Headers sent with every export, `name=value` pairs separated by commas (a collector's API
    /// key, for instance); never shown.
    otel_headers: Option<Secret> = None, "AIGW_OTEL_HEADERS";
    /// Of the traces that start at the gateway (no `traceparent` from the caller), the share
    /// sampled, 0 to 1; a caller's sampled flag is always followed.
    otel_sample_ratio: f64 = 1.0, "AIGW_OTEL_SAMPLE_RATIO", check |v| {
        if (0.0..=1.0).contains(v) { Ok(()) } else { Err("must be 0..=1".into()) }
    };
    /// `service.name` of the exported spans.
    otel_service_name: String = "aigw".to_owned(), "AIGW_OTEL_SERVICE_NAME";
    /// The OpenID Connect issuer whose sign-in the console offers (its discovery document is at
    /// `<issuer>/.well-known/openid-configuration`). Unset: no single sign-on.
    oidc_issuer: Option<String> = None, "AIGW_OIDC_ISSUER", check |v| http_url(v.as_deref());
    /// The client id aigw is registered with at the identity provider.
    oidc_client_id: Option<String> = None, "AIGW_OIDC_CLIENT_ID";
    /// The client secret (a confidential client); unset for a public client (PKCE alone).
    oidc_client_secret: Option<Secret> = None, "AIGW_OIDC_CLIENT_SECRET";
    /// The redirect URI registered at the identity provider: this gateway's
    /// `…/admin/v1/auth/oidc/callback` as browsers reach it.
    oidc_redirect_url: Option<String> = None, "AIGW_OIDC_REDIRECT_URL", check |v| http_url(v.as_deref());
    /// Scopes asked for, separated by spaces (`openid` is always asked for).
    oidc_scopes: String = "openid email profile".to_owned(), "AIGW_OIDC_SCOPES";
    /// The ID token claim that lists the member's groups.
    oidc_groups_claim: String = "groups".to_owned(), "AIGW_OIDC_GROUPS_CLAIM";
    /// Which groups give access: each to a workspace, a role and optionally a department.
    oidc_groups: Vec<sso::SsoGroup> = Vec::new(), "AIGW_OIDC_GROUPS";
    /// Workspaces (by name) whose members sign in only through single sign-on: their passwords
    /// are refused.
    sso_only_workspaces: Vec<String> = Vec::new(), "AIGW_SSO_ONLY_WORKSPACES";
}

/// An optional `http://` or `https://` URL.
fn http_url(v: Option<&str>) -> Result<(), String> {
    match v {
        Some(u) if !(u.starts_with("http://") || u.starts_with("https://")) => {
            Err("expected an http:// or https:// URL".into())
        }
        _ => Ok(()),
    }
}

/// A setting that could not be read; the message names the setting and where it came from.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl Settings {
    /// Loads defaults, then `file` (if given), then the `AIGW_*` variables of `env`. Every bad
    /// setting is named, one a line, not only the first.
    pub fn load(file: Option<&Path>, env: impl Fn(&str) -> Option<String>) -> Result<Settings, ConfigError> {
        let mut s = Settings::default();
        let mut errors = Vec::new();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ConfigError(format!("cannot read config file {}: {e}", path.display())))?;
            let table = toml::from_str(&text)
                .map_err(|e| ConfigError(format!("config file {}: {e}", path.display())))?;
            s.apply_file(path, &text, table, &mut errors);
        }
        s.apply_env(|name| env(name).filter(|v| !v.is_empty()), &mut errors);
        s.check_each(&mut errors);
        s.check_between(&mut errors);
        if errors.is_empty() {
            Ok(s)
        } else {
            Err(ConfigError(errors.join("\n")))
        }
    }

    /// The bounds between settings.
    fn check_between(&self, errors: &mut Vec<String>) {
        let mut bad = |name: &str, why: &str| errors.push(format!("bad setting {name}: {why}"));
        if self.single_candidate_retry_min_ms > self.single_candidate_retry_max_ms {
            bad(
                "single_candidate_retry_min_ms (AIGW_SINGLE_CANDIDATE_RETRY_MIN_MS)",
                "must not exceed single_candidate_retry_max_ms",
            );
        }
        if self.oidc_issuer.is_some() && (self.oidc_client_id.is_none() || self.oidc_redirect_url.is_none()) {
            bad(
                "oidc_issuer (AIGW_OIDC_ISSUER)",
                "single sign-on also needs oidc_client_id and oidc_redirect_url",
            );
        }
        if let Some(admin) = self.admin_listen
            && admin == self.listen
            && admin.port() != 0
        {
            bad(
                "admin_listen (AIGW_ADMIN_LISTEN)",
                "must differ from listen (it is a second address for the admin surfaces)",
            );
        }
    }

    /// Whether the database is SQLite.
    pub fn is_sqlite(&self) -> bool {
        self.database_url.starts_with("sqlite:")
    }

    /// The folder for generated secrets: `data_dir` if set, else the SQLite file's folder, else `.`.
    pub fn secrets_dir(&self) -> PathBuf {
        if !self.data_dir.as_os_str().is_empty() {
            return self.data_dir.clone();
        }
        if self.is_sqlite() {
            let path = sqlite_path(&self.database_url);
            if let Some(parent) = Path::new(path).parent()
                && !parent.as_os_str().is_empty()
            {
                return parent.to_path_buf();
            }
        }
        PathBuf::from(".")
    }
}

/// The line (from 1) of the byte `offset` of `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// A file key that is no setting: the nearest setting when it looks like a slip.
fn unknown_setting(key: &str) -> String {
    match crate::kernel::suggest::nearest(key, SETTINGS.iter().map(|s| s.key)) {
        Some(near) => format!("unknown field `{key}` (did you mean `{near}`?)"),
        None => format!(
            "unknown field `{key}` (no such setting; `aigw serve --help` and README.md, \
             \"Configuration\", list them)"
        ),
    }
}

/// The variable a mistyped `AIGW_*` name most likely meant.
pub fn nearest_variable(name: &str) -> Option<&'static str> {
    let known = SETTINGS
        .iter()
        .map(|s| s.env)
        .chain(OTHER_VARIABLES.iter().copied());
    // Compared without the common prefix, which would make every name look near.
    let word = name.strip_prefix("AIGW_")?;
    let near = crate::kernel::suggest::nearest(word, known.clone().filter_map(|k| k.strip_prefix("AIGW_")))?;
    known.into_iter().find(|k| k.strip_prefix("AIGW_") == Some(near))
}

/// The `AIGW_*` variables aigw reads besides the settings': the command line's `AIGW_CONFIG` and
/// `AIGW_RESOURCES`, and the log filter `AIGW_LOG`.
const OTHER_VARIABLES: &[&str] = &[
    "AIGW_CONFIG",
    "AIGW_RESOURCES",
    "AIGW_LOG",
    // Read by the repository's tests and scripts, not by the gateway; set beside it in CI.
    "AIGW_BIN",
];

/// Whether aigw reads the variable `name`: a setting's, or one of [`OTHER_VARIABLES`].
pub fn is_known_variable(name: &str) -> bool {
    SETTINGS.iter().any(|s| s.env == name) || OTHER_VARIABLES.contains(&name)
}

/// Prefixes of variables the repository's tests and scripts read (`AIGW_TEST_POSTGRES_URL`,
/// schemathesis's `AIGW_ST_*`): not settings, and not a typo either.
const TOOLING_PREFIXES: &[&str] = &["AIGW_TEST_", "AIGW_ST_"];

/// The `AIGW_*` names among `names` that aigw does not read: most often a typo of a setting,
/// which would otherwise be ignored without a word. Sorted.
pub fn unknown_variables(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut unknown: Vec<String> = names
        .into_iter()
        .filter(|n| n.starts_with("AIGW_"))
        .filter(|n| !is_known_variable(n))
        .filter(|n| !TOOLING_PREFIXES.iter().any(|p| n.starts_with(p)))
        .collect();
    unknown.sort_unstable();
    unknown
}

fn parse_tz(name: &str, v: &str) -> Result<Tz, ConfigError> {
    v.parse::<Tz>().map_err(|_| {
        ConfigError(format!(
            "bad setting {name}: unknown time zone {v:?} (expected an IANA name such as Asia/Shanghai)"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn unknown_variables_are_named_and_known_ones_are_not() {
        let names = [
            "AIGW_LISTN",
            "AIGW_LISTEN",
            "AIGW_LOG",
            "AIGW_CONFIG",
            "AIGW_RESOURCES",
            "AIGW_TEST_POSTGRES_URL",
            "AIGW_ST_TOKEN",
            "AIGW_BIN",
            "AIGW_MAX_USAGE_TOKENS",
            "PATH",
            "AIGW_DATABASE",
        ]
        .map(String::from);
        assert_eq!(unknown_variables(names), ["AIGW_DATABASE", "AIGW_LISTN"]);
    }

    /// Every variable `load` reads is known: none is warned about as unknown.
    #[test]
    fn every_variable_load_reads_is_known() {
        let read = std::sync::Mutex::new(Vec::new());
        let _ = Settings::load(None, |k| {
            read.lock().unwrap().push(k.to_owned());
            None
        });
        let read = read.into_inner().unwrap();
        assert!(read.len() > 20, "{read:?}");
        for name in read {
            assert!(is_known_variable(&name), "{name} is not known");
        }
    }

    #[test]
    fn a_bare_port_for_listen_says_the_expected_form() {
        let err = Settings::load(None, env(&[("AIGW_LISTEN", "4001")]))
            .unwrap_err()
            .0;
        assert!(err.contains("AIGW_LISTEN"), "{err}");
        assert!(err.contains("expected HOST:PORT"), "{err}");
        assert!(err.contains("0.0.0.0:4001"), "{err}");
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn defaults_without_any_setting() {
        let s = Settings::load(None, env(&[])).unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:4000");
        assert_eq!(s.database_url, "sqlite://aigw.db");
        assert_eq!(s.timezone, chrono_tz::Asia::Shanghai);
        assert_eq!(s.max_body_bytes, 32 * 1024 * 1024);
        assert_eq!(s.idle_poll_us, 200);
        // Deadlines fit for LLM traffic: the official SDKs wait 600 s for an answer.
        assert_eq!(
            (
                s.request_timeout_secs,
                s.connect_timeout_secs,
                s.stream_first_byte_timeout_secs,
                s.stream_idle_timeout_secs,
                s.client_body_timeout_secs
            ),
            (600, 5, 600, 120, 60)
        );
        assert_eq!(s.client_header_timeout_secs, 30);
        assert_eq!(s.client_idle_timeout_secs, 75);
        assert_eq!(s.max_client_connections, 10_000);
        assert_eq!(s.max_header_bytes, 16 * 1024);
        assert_eq!(s.max_usage_tokens, 100_000_000);
        assert_eq!(s.secrets_dir(), PathBuf::from("."));
    }

    #[test]
    fn env_wins_over_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aigw.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:5000\"\ntimezone = \"Europe/Berlin\"\n",
        )
        .unwrap();
        let s = Settings::load(Some(&path), env(&[("AIGW_LISTEN", "127.0.0.1:6000")])).unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:6000");
        assert_eq!(s.timezone, chrono_tz::Europe::Berlin);
    }

    #[test]
    fn bad_settings_name_the_setting() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("AIGW_LISTEN", "nowhere")], "AIGW_LISTEN"),
            (&[("AIGW_TIMEZONE", "Mars/Olympus")], "AIGW_TIMEZONE"),
            (&[("AIGW_LOCALE", "fr")], "AIGW_LOCALE"),
            (&[("AIGW_MAX_BODY_BYTES", "-1")], "AIGW_MAX_BODY_BYTES"),
            (&[("AIGW_MAX_BODY_BYTES", "0")], "AIGW_MAX_BODY_BYTES"),
            (&[("AIGW_DATABASE_URL", "mysql://x")], "AIGW_DATABASE_URL"),
            (&[("AIGW_FLUSH_INTERVAL_MS", "1")], "AIGW_FLUSH_INTERVAL_MS"),
            (&[("AIGW_SLOT_WAIT_MS", "60001")], "AIGW_SLOT_WAIT_MS"),
            (&[("AIGW_IDLE_POLL_US", "10001")], "AIGW_IDLE_POLL_US"),
            (&[("AIGW_IDLE_POLL_US", "-1")], "AIGW_IDLE_POLL_US"),
            (&[("AIGW_REQUEST_TIMEOUT_SECS", "0")], "AIGW_REQUEST_TIMEOUT_SECS"),
            (&[("AIGW_CONNECT_TIMEOUT_SECS", "0")], "AIGW_CONNECT_TIMEOUT_SECS"),
            (
                &[("AIGW_STREAM_FIRST_BYTE_TIMEOUT_SECS", "86401")],
                "AIGW_STREAM_FIRST_BYTE_TIMEOUT_SECS",
            ),
            (
                &[("AIGW_STREAM_IDLE_TIMEOUT_SECS", "0")],
                "AIGW_STREAM_IDLE_TIMEOUT_SECS",
            ),
            (
                &[("AIGW_CLIENT_BODY_TIMEOUT_SECS", "x")],
                "AIGW_CLIENT_BODY_TIMEOUT_SECS",
            ),
            (
                &[("AIGW_CLIENT_HEADER_TIMEOUT_SECS", "0")],
                "AIGW_CLIENT_HEADER_TIMEOUT_SECS",
            ),
            (
                &[("AIGW_CLIENT_IDLE_TIMEOUT_SECS", "3601")],
                "AIGW_CLIENT_IDLE_TIMEOUT_SECS",
            ),
            (
                &[("AIGW_MAX_CLIENT_CONNECTIONS", "0")],
                "AIGW_MAX_CLIENT_CONNECTIONS",
            ),
            (&[("AIGW_MAX_HEADER_BYTES", "4096")], "AIGW_MAX_HEADER_BYTES"),
            (&[("AIGW_MAX_USAGE_TOKENS", "0")], "AIGW_MAX_USAGE_TOKENS"),
            (&[("AIGW_MAX_USAGE_TOKENS", "-1")], "AIGW_MAX_USAGE_TOKENS"),
            (
                &[("AIGW_MAX_USAGE_TOKENS", "1000000000001")],
                "AIGW_MAX_USAGE_TOKENS",
            ),
            (
                &[("AIGW_SINGLE_CANDIDATE_RETRY_MAX_MS", "60001")],
                "AIGW_SINGLE_CANDIDATE_RETRY_MAX_MS",
            ),
            (
                &[("AIGW_SINGLE_CANDIDATE_RETRY_MIN_MS", "5000")],
                "AIGW_SINGLE_CANDIDATE_RETRY_MIN_MS",
            ),
        ];
        for (vars, name) in cases {
            let err = Settings::load(None, env(vars)).unwrap_err().to_string();
            assert!(err.contains(name), "{err} should name {name}");
        }
    }

    /// Every bad setting is named at once, each with what it should be; a mistyped key or
    /// variable gets the setting it most likely meant, not the list of every setting.
    #[test]
    fn every_bad_setting_is_named_with_what_it_should_be() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aigw.toml");
        std::fs::write(
            &path,
            "listn = \"127.0.0.1:5000\"\nmax_attempts = \"three\"\ncolour = 1\nlocale = \"fr\"\n",
        )
        .unwrap();
        let err = Settings::load(
            Some(&path),
            env(&[
                ("AIGW_MAX_BODY_BYTES", "abc"),
                ("AIGW_FLUSH_INTERVAL_MS", "1"),
                ("AIGW_ROLLUP_INTERVAL_MS", "999"),
            ]),
        )
        .unwrap_err()
        .0;
        let expected = [
            "line 1: unknown field `listn` (did you mean `listen`?)",
            "line 2 (max_attempts): invalid type: string \"three\", expected u32",
            "line 3: unknown field `colour` (no such setting; `aigw serve --help`",
            "line 4 (locale)",
            "max_body_bytes (AIGW_MAX_BODY_BYTES): \"abc\" is not a whole number",
            "flush_interval_ms (AIGW_FLUSH_INTERVAL_MS): must be 10..=60000",
            "rollup_interval_ms (AIGW_ROLLUP_INTERVAL_MS): must be 1000..=3600000",
        ];
        for needle in expected {
            assert!(err.contains(needle), "{needle:?} not in:\n{err}");
        }
        assert_eq!(err.lines().count(), expected.len(), "one line each:\n{err}");
        assert!(!err.contains("invalid digit"), "{err}");
        assert_eq!(nearest_variable("AIGW_MAX_ATTEMTPS"), Some("AIGW_MAX_ATTEMPTS"));
        assert_eq!(nearest_variable("AIGW_COLOUR"), None);
    }

    #[test]
    fn unknown_file_field_is_refused_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aigw.toml");
        std::fs::write(&path, "listen = \"127.0.0.1:5000\"\nlisten_port = 3\n").unwrap();
        let err = Settings::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(err.contains("listen_port") && err.contains("line 2"), "{err}");
    }

    #[test]
    fn max_usage_tokens_from_file_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aigw.toml");
        std::fs::write(&path, "max_usage_tokens = 5000\n").unwrap();
        let s = Settings::load(Some(&path), env(&[])).unwrap();
        assert_eq!(s.max_usage_tokens, 5000);
        let s = Settings::load(Some(&path), env(&[("AIGW_MAX_USAGE_TOKENS", "7000")])).unwrap();
        assert_eq!(s.max_usage_tokens, 7000);
        std::fs::write(&path, "max_usage_tokens = 0\n").unwrap();
        let err = Settings::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(err.contains("max_usage_tokens"), "{err}");
    }

    #[test]
    fn trusted_proxies_from_file_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aigw.toml");
        std::fs::write(
            &path,
            "trusted_proxies = [\"10.0.0.0/8\", \"192.168.1.5\", \"fd00::/8\"]\n",
        )
        .unwrap();
        let s = Settings::load(Some(&path), env(&[])).unwrap();
        let shown: Vec<String> = s.trusted_proxies.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["10.0.0.0/8", "192.168.1.5/32", "fd00::/8"]);
        let s = Settings::load(
            None,
            env(&[("AIGW_TRUSTED_PROXIES", " 127.0.0.1 , 10.1.2.3/16,")]),
        )
        .unwrap();
        let shown: Vec<String> = s.trusted_proxies.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["127.0.0.1/32", "10.1.0.0/16"], "host bits cleared");
        for bad in ["10.0.0.0/33", "proxy.internal", "10.0.0.0/8;10.1.0.0/16"] {
            let err = Settings::load(None, env(&[("AIGW_TRUSTED_PROXIES", bad)]))
                .unwrap_err()
                .0;
            assert!(
                err.contains("AIGW_TRUSTED_PROXIES") && err.contains("CIDRs"),
                "{err}"
            );
        }
    }

    #[test]
    fn admin_listen_and_metrics_token() {
        let s = Settings::load(
            None,
            env(&[
                ("AIGW_ADMIN_LISTEN", "127.0.0.1:4001"),
                ("AIGW_METRICS_TOKEN", "scrape-token"),
            ]),
        )
        .unwrap();
        assert_eq!(s.admin_listen, Some("127.0.0.1:4001".parse().unwrap()));
        assert_eq!(s.metrics_token.as_ref().map(Secret::expose), Some("scrape-token"));
        let err = Settings::load(None, env(&[("AIGW_ADMIN_LISTEN", "127.0.0.1:4000")]))
            .unwrap_err()
            .0;
        assert!(
            err.contains("admin_listen") && err.contains("must differ"),
            "{err}"
        );
        let err = Settings::load(None, env(&[("AIGW_ADMIN_LISTEN", "4001")]))
            .unwrap_err()
            .0;
        assert!(err.contains("expected HOST:PORT"), "{err}");
        assert!(
            !format!("{s:?}").contains("scrape-token"),
            "the token is not Debug-printed"
        );
    }

    #[test]
    fn secrets_dir_is_beside_the_sqlite_file() {
        let s = Settings::load(None, env(&[("AIGW_DATABASE_URL", "sqlite:///var/lib/aigw/x.db")])).unwrap();
        assert_eq!(s.secrets_dir(), PathBuf::from("/var/lib/aigw"));
    }

    #[test]
    fn secrets_are_not_debug_printed() {
        let s = Settings::load(None, env(&[("AIGW_MASTER_KEY", "topsecretvalue")])).unwrap();
        assert!(!format!("{s:?}").contains("topsecretvalue"));
    }

    /// Each variable is its file key in capitals after `AIGW_`, and each setting is documented.
    #[test]
    fn each_variable_is_its_key_in_capitals() {
        assert!(SETTINGS.len() > 30);
        for s in SETTINGS {
            assert_eq!(s.env, format!("AIGW_{}", s.key.to_uppercase()), "{}", s.key);
            assert!(!s.doc.trim().is_empty(), "{} has no doc comment", s.key);
        }
    }

    /// README.md's settings table lists every setting in the order declared, with its variable
    /// and default; every other docs table row that starts with a setting and its variable names
    /// them and the default as declared.
    #[test]
    fn the_docs_settings_tables_match_the_declaration() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let read =
            |p: PathBuf| std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        // `| `key` | `AIGW_KEY` | default… |`
        let row = |line: &str| -> Option<(String, String, String)> {
            let cells: Vec<&str> = line.trim().strip_prefix('|')?.split('|').map(str::trim).collect();
            let unquote = |c: &str| c.strip_prefix('`')?.strip_suffix('`').map(str::to_owned);
            let (key, env) = (unquote(cells.first()?)?, unquote(cells.get(1)?)?);
            env.starts_with("AIGW_")
                .then(|| (key, env, cells.get(2).copied().unwrap_or("").to_owned()))
        };
        let readme = read(root.join("README.md"));
        let table: Vec<String> = readme
            .lines()
            .skip_while(|l| !l.starts_with("| setting (file key) | variable | default |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| row(l).map_or_else(|| format!("unreadable row {l:?}"), |r| r.0))
            .collect();
        let declared: Vec<&str> = SETTINGS.iter().map(|s| s.key).collect();
        assert_eq!(table, declared, "README.md's settings table against SETTINGS");

        let defaults: HashMap<&str, Option<String>> = Settings::shown_defaults().into_iter().collect();
        let mut docs = vec![root.join("README.md")];
        for entry in std::fs::read_dir(root.join("docs")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                docs.push(path);
            }
        }
        let mut checked = 0;
        for path in docs {
            for (key, env, default) in read(path.clone()).lines().filter_map(row) {
                let Some(s) = SETTINGS.iter().find(|s| s.key == key) else {
                    panic!("{}: {key} is not a setting", path.display());
                };
                assert_eq!(env, s.env, "{}: {key}", path.display());
                if let Some(shown) = &defaults[key.as_str()] {
                    assert!(
                        default.starts_with(&format!("`{shown}`")),
                        "{}: {key}'s default is `{shown}`, the table says {default}",
                        path.display()
                    );
                }
                checked += 1;
            }
        }
        assert!(checked > SETTINGS.len(), "{checked} rows");
    }

    #[test]
    fn file_keys_are_the_settings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aigw.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:5001\"\nlocale = \"zh\"\nmax_attempts = 5\nmaster_key = \"k\"\n\
             data_dir = \"/var/lib/x\"\nadmin_listen = \"127.0.0.1:5002\"\nlog_format = \"json\"\n",
        )
        .unwrap();
        let s = Settings::load(Some(&path), env(&[])).unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:5001");
        assert_eq!(
            (s.locale, s.max_attempts, s.log_format),
            (Locale::Zh, 5, LogFormat::Json)
        );
        assert_eq!(s.master_key.as_ref().map(Secret::expose), Some("k"));
        assert_eq!(s.data_dir, PathBuf::from("/var/lib/x"));
        assert_eq!(s.admin_listen, Some("127.0.0.1:5002".parse().unwrap()));
        std::fs::write(&path, "listen = \"4001\"\n").unwrap();
        let err = Settings::load(Some(&path), env(&[])).unwrap_err().0;
        assert!(
            err.contains("(listen)") && err.contains("expected HOST:PORT"),
            "{err}"
        );
    }
}
