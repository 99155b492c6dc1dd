//! Settings: defaults, then the TOML file, then `AIGW_*` variables (env wins). This is the one
//! place that reads configuration; a bad setting stops the start with a message naming it.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use chrono_tz::Tz;
use serde::Deserialize;

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

/// The gateway's settings, fully resolved.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Address the gateway listens on.
    pub listen: SocketAddr,
    /// `sqlite://…` (default `sqlite://aigw.db`) or `postgres://…`.
    pub database_url: String,
    /// Time zone that quota windows align to, unless a workspace overrides it.
    pub timezone: Tz,
    /// Language of the gateway's own messages.
    pub locale: Locale,
    /// 32-byte key (base64 or hex) that encrypts upstream secrets; never stored in the database.
    pub master_key: Option<Secret>,
    /// Secret that signs admin JWTs.
    pub jwt_secret: Option<Secret>,
    /// Email of the first owner, created when no owner exists.
    pub bootstrap_email: Option<String>,
    /// Password of the first owner; generated and printed once when absent.
    pub bootstrap_password: Option<Secret>,
    /// Largest request body accepted on the proxy, in bytes.
    pub max_body_bytes: usize,
    /// Upstream attempts per request, across credentials and fallback models.
    pub max_attempts: u32,
    /// A non-streamed request's whole time, head and body, across every upstream attempt, in
    /// seconds (the official SDKs wait 600 s).
    pub request_timeout_secs: u64,
    /// How long opening a connection to an upstream may take, in seconds; short, so that an
    /// unreachable upstream fails over quickly.
    pub connect_timeout_secs: u64,
    /// A streamed request's time until the upstream's first byte, across every upstream attempt,
    /// in seconds.
    pub stream_first_byte_timeout_secs: u64,
    /// The longest gap between two chunks of an upstream stream, in seconds.
    pub stream_idle_timeout_secs: u64,
    /// How long the client may take to send its whole request body, in seconds.
    pub client_body_timeout_secs: u64,
    /// How long a request waits for an in-flight slot when every candidate credential's slots
    /// are full, in milliseconds (kRouter: then "credential busy", a short backoff).
    pub slot_wait_ms: u64,
    /// Shortest wait before the single-candidate retry, in milliseconds (groot ADR 0008: 1 to 3 s
    /// with jitter).
    pub single_candidate_retry_min_ms: u64,
    /// Longest wait before the single-candidate retry, in milliseconds.
    pub single_candidate_retry_max_ms: u64,
    /// How often in-memory counters and request logs are flushed to the store, in milliseconds.
    pub flush_interval_ms: u64,
    /// Request logs older than this many days are deleted.
    pub log_retention_days: u32,
    /// Where generated secrets (`aigw.keys`) are kept; default: beside the SQLite file, else `.`.
    pub data_dir: PathBuf,
    /// Log line format.
    pub log_format: LogFormat,
    /// Most a serving thread polls for I/O before it sleeps, in microseconds (adaptive, as KVM's
    /// halt polling; 0 turns it off).
    pub idle_poll_us: u64,
    /// Longest a client may take to send a request's line and headers, in seconds: from the
    /// connection's accept, or from the first byte of a later request on a kept-alive connection.
    pub client_header_timeout_secs: u64,
    /// Longest a kept-alive client connection may wait for its next request, in seconds.
    pub client_idle_timeout_secs: u64,
    /// Most client connections open at once; past it a new connection is answered 503 and closed.
    pub max_client_connections: usize,
    /// Largest request line and headers accepted, in bytes; larger is refused with 431.
    pub max_header_bytes: usize,
    /// Most tokens one call may report: usage from an upstream above it (in any count, or in
    /// all) is invalid, and the gateway's estimate is counted instead.
    pub max_usage_tokens: u64,
    /// Most HTTP/1.1 requests in flight to one upstream (scheme, host and port) at once; past it
    /// a request waits for one to finish. HTTP/2 upstreams multiplex on one connection.
    pub max_upstream_connections_per_host: usize,
    /// While the database is unreachable, a quota counter never read before: `serve` (count
    /// from 0 in memory) or `refuse` (503 `store_unavailable`).
    pub store_outage_counters: OutageCounters,
    /// Proxies (CIDRs) whose `X-Forwarded-For` is believed: the client's address, for request
    /// logs, the audit log and sign-in throttling, is the rightmost address of that header not
    /// in these networks. Empty: the connection's own address, the header ignored.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The bearer token `/metrics` asks for; open to anyone who reaches it when unset.
    pub metrics_token: Option<Secret>,
    /// A second address serving the admin API, the console and `/metrics`; the main address
    /// then serves only the proxy and the health endpoints.
    pub admin_listen: Option<SocketAddr>,
}

/// Default of `max_usage_tokens`: far above any model's context, far below any overflow.
pub const DEFAULT_MAX_USAGE_TOKENS: u64 = 100_000_000;
/// Highest `max_usage_tokens` accepted: a counter still takes millions of such calls before it
/// saturates.
const MAX_USAGE_TOKENS_LIMIT: u64 = 1_000_000_000_000;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: SocketAddr::from(([127, 0, 0, 1], 4000)),
            database_url: "sqlite://aigw.db".to_owned(),
            timezone: chrono_tz::Asia::Shanghai,
            locale: Locale::En,
            master_key: None,
            jwt_secret: None,
            bootstrap_email: None,
            bootstrap_password: None,
            max_body_bytes: 32 * 1024 * 1024,
            max_attempts: 3,
            request_timeout_secs: 600,
            connect_timeout_secs: 5,
            stream_first_byte_timeout_secs: 600,
            stream_idle_timeout_secs: 120,
            client_body_timeout_secs: 60,
            slot_wait_ms: 1000,
            single_candidate_retry_min_ms: 1000,
            single_candidate_retry_max_ms: 3000,
            flush_interval_ms: 250,
            log_retention_days: 30,
            data_dir: PathBuf::new(),
            log_format: LogFormat::Text,
            idle_poll_us: 200,
            client_header_timeout_secs: 30,
            client_idle_timeout_secs: 75,
            max_client_connections: 10_000,
            max_header_bytes: 16 * 1024,
            max_usage_tokens: DEFAULT_MAX_USAGE_TOKENS,
            store_outage_counters: OutageCounters::Serve,
            max_upstream_connections_per_host: 4096,
            trusted_proxies: Vec::new(),
            metrics_token: None,
            admin_listen: None,
        }
    }
}

/// The TOML settings file: every field optional, unknown fields refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    listen: Option<String>,
    database_url: Option<String>,
    timezone: Option<String>,
    locale: Option<Locale>,
    master_key: Option<Secret>,
    jwt_secret: Option<Secret>,
    bootstrap_email: Option<String>,
    bootstrap_password: Option<Secret>,
    max_body_bytes: Option<usize>,
    max_attempts: Option<u32>,
    request_timeout_secs: Option<u64>,
    connect_timeout_secs: Option<u64>,
    stream_first_byte_timeout_secs: Option<u64>,
    stream_idle_timeout_secs: Option<u64>,
    client_body_timeout_secs: Option<u64>,
    slot_wait_ms: Option<u64>,
    single_candidate_retry_min_ms: Option<u64>,
    single_candidate_retry_max_ms: Option<u64>,
    flush_interval_ms: Option<u64>,
    log_retention_days: Option<u32>,
    data_dir: Option<PathBuf>,
    log_format: Option<LogFormat>,
    idle_poll_us: Option<u64>,
    client_header_timeout_secs: Option<u64>,
    client_idle_timeout_secs: Option<u64>,
    max_client_connections: Option<usize>,
    max_header_bytes: Option<usize>,
    max_usage_tokens: Option<u64>,
    store_outage_counters: Option<OutageCounters>,
    max_upstream_connections_per_host: Option<usize>,
    trusted_proxies: Option<Vec<String>>,
    metrics_token: Option<Secret>,
    admin_listen: Option<String>,
}

/// A setting that could not be read; the message names the setting and where it came from.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl Settings {
    /// Loads defaults, then `file` (if given), then the `AIGW_*` variables of `env`.
    pub fn load(file: Option<&Path>, env: impl Fn(&str) -> Option<String>) -> Result<Settings, ConfigError> {
        let mut s = Settings::default();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ConfigError(format!("cannot read config file {}: {e}", path.display())))?;
            let f: FileSettings = toml::from_str(&text)
                .map_err(|e| ConfigError(format!("config file {}: {e}", path.display())))?;
            let src = |key: &str| format!("{} ({key})", path.display());
            if let Some(v) = f.listen {
                s.listen = parse_listen(&src("listen"), &v)?;
            }
            if let Some(v) = f.database_url {
                s.database_url = v;
            }
            if let Some(v) = f.timezone {
                s.timezone = parse_tz(&src("timezone"), &v)?;
            }
            s.locale = f.locale.unwrap_or(s.locale);
            s.master_key = f.master_key.or(s.master_key);
            s.jwt_secret = f.jwt_secret.or(s.jwt_secret);
            s.bootstrap_email = f.bootstrap_email.or(s.bootstrap_email);
            s.bootstrap_password = f.bootstrap_password.or(s.bootstrap_password);
            s.max_body_bytes = f.max_body_bytes.unwrap_or(s.max_body_bytes);
            s.max_attempts = f.max_attempts.unwrap_or(s.max_attempts);
            s.request_timeout_secs = f.request_timeout_secs.unwrap_or(s.request_timeout_secs);
            s.connect_timeout_secs = f.connect_timeout_secs.unwrap_or(s.connect_timeout_secs);
            s.stream_first_byte_timeout_secs = f
                .stream_first_byte_timeout_secs
                .unwrap_or(s.stream_first_byte_timeout_secs);
            s.stream_idle_timeout_secs = f.stream_idle_timeout_secs.unwrap_or(s.stream_idle_timeout_secs);
            s.client_body_timeout_secs = f.client_body_timeout_secs.unwrap_or(s.client_body_timeout_secs);
            s.slot_wait_ms = f.slot_wait_ms.unwrap_or(s.slot_wait_ms);
            s.single_candidate_retry_min_ms = f
                .single_candidate_retry_min_ms
                .unwrap_or(s.single_candidate_retry_min_ms);
            s.single_candidate_retry_max_ms = f
                .single_candidate_retry_max_ms
                .unwrap_or(s.single_candidate_retry_max_ms);
            s.flush_interval_ms = f.flush_interval_ms.unwrap_or(s.flush_interval_ms);
            s.log_retention_days = f.log_retention_days.unwrap_or(s.log_retention_days);
            s.data_dir = f.data_dir.unwrap_or(s.data_dir);
            s.log_format = f.log_format.unwrap_or(s.log_format);
            s.idle_poll_us = f.idle_poll_us.unwrap_or(s.idle_poll_us);
            s.client_header_timeout_secs = f
                .client_header_timeout_secs
                .unwrap_or(s.client_header_timeout_secs);
            s.client_idle_timeout_secs = f.client_idle_timeout_secs.unwrap_or(s.client_idle_timeout_secs);
            s.max_client_connections = f.max_client_connections.unwrap_or(s.max_client_connections);
            s.max_header_bytes = f.max_header_bytes.unwrap_or(s.max_header_bytes);
            s.max_usage_tokens = f.max_usage_tokens.unwrap_or(s.max_usage_tokens);
            s.store_outage_counters = f.store_outage_counters.unwrap_or(s.store_outage_counters);
            s.max_upstream_connections_per_host = f
                .max_upstream_connections_per_host
                .unwrap_or(s.max_upstream_connections_per_host);
            if let Some(v) = f.trusted_proxies {
                s.trusted_proxies = parse_networks(&src("trusted_proxies"), v.iter().map(String::as_str))?;
            }
            s.metrics_token = f.metrics_token.or(s.metrics_token);
            if let Some(v) = f.admin_listen {
                s.admin_listen = Some(parse_listen(&src("admin_listen"), &v)?);
            }
        }

        let var = |name: &str| env(name).filter(|v| !v.is_empty());
        if let Some(v) = var("AIGW_LISTEN") {
            s.listen = parse_listen("AIGW_LISTEN", &v)?;
        }
        if let Some(v) = var("AIGW_DATABASE_URL") {
            s.database_url = v;
        }
        if let Some(v) = var("AIGW_TIMEZONE") {
            s.timezone = parse_tz("AIGW_TIMEZONE", &v)?;
        }
        if let Some(v) = var("AIGW_LOCALE") {
            s.locale = parse_value("AIGW_LOCALE", &v)?;
        }
        if let Some(v) = var("AIGW_MASTER_KEY") {
            s.master_key = Some(Secret(v));
        }
        if let Some(v) = var("AIGW_JWT_SECRET") {
            s.jwt_secret = Some(Secret(v));
        }
        if let Some(v) = var("AIGW_BOOTSTRAP_EMAIL") {
            s.bootstrap_email = Some(v);
        }
        if let Some(v) = var("AIGW_BOOTSTRAP_PASSWORD") {
            s.bootstrap_password = Some(Secret(v));
        }
        if let Some(v) = var("AIGW_MAX_BODY_BYTES") {
            s.max_body_bytes = parse_value("AIGW_MAX_BODY_BYTES", &v)?;
        }
        if let Some(v) = var("AIGW_MAX_ATTEMPTS") {
            s.max_attempts = parse_value("AIGW_MAX_ATTEMPTS", &v)?;
        }
        if let Some(v) = var("AIGW_REQUEST_TIMEOUT_SECS") {
            s.request_timeout_secs = parse_value("AIGW_REQUEST_TIMEOUT_SECS", &v)?;
        }
        if let Some(v) = var("AIGW_CONNECT_TIMEOUT_SECS") {
            s.connect_timeout_secs = parse_value("AIGW_CONNECT_TIMEOUT_SECS", &v)?;
        }
        if let Some(v) = var("AIGW_STREAM_FIRST_BYTE_TIMEOUT_SECS") {
            s.stream_first_byte_timeout_secs = parse_value("AIGW_STREAM_FIRST_BYTE_TIMEOUT_SECS", &v)?;
        }
        if let Some(v) = var("AIGW_STREAM_IDLE_TIMEOUT_SECS") {
            s.stream_idle_timeout_secs = parse_value("AIGW_STREAM_IDLE_TIMEOUT_SECS", &v)?;
        }
        if let Some(v) = var("AIGW_CLIENT_BODY_TIMEOUT_SECS") {
            s.client_body_timeout_secs = parse_value("AIGW_CLIENT_BODY_TIMEOUT_SECS", &v)?;
        }
        if let Some(v) = var("AIGW_SLOT_WAIT_MS") {
            s.slot_wait_ms = parse_value("AIGW_SLOT_WAIT_MS", &v)?;
        }
        if let Some(v) = var("AIGW_SINGLE_CANDIDATE_RETRY_MIN_MS") {
            s.single_candidate_retry_min_ms = parse_value("AIGW_SINGLE_CANDIDATE_RETRY_MIN_MS", &v)?;
        }
        if let Some(v) = var("AIGW_SINGLE_CANDIDATE_RETRY_MAX_MS") {
            s.single_candidate_retry_max_ms = parse_value("AIGW_SINGLE_CANDIDATE_RETRY_MAX_MS", &v)?;
        }
        if let Some(v) = var("AIGW_FLUSH_INTERVAL_MS") {
            s.flush_interval_ms = parse_value("AIGW_FLUSH_INTERVAL_MS", &v)?;
        }
        if let Some(v) = var("AIGW_LOG_RETENTION_DAYS") {
            s.log_retention_days = parse_value("AIGW_LOG_RETENTION_DAYS", &v)?;
        }
        if let Some(v) = var("AIGW_DATA_DIR") {
            s.data_dir = PathBuf::from(v);
        }
        if let Some(v) = var("AIGW_LOG_FORMAT") {
            s.log_format = parse_value("AIGW_LOG_FORMAT", &v)?;
        }
        if let Some(v) = var("AIGW_IDLE_POLL_US") {
            s.idle_poll_us = parse_value("AIGW_IDLE_POLL_US", &v)?;
        }
        if let Some(v) = var("AIGW_CLIENT_HEADER_TIMEOUT_SECS") {
            s.client_header_timeout_secs = parse_value("AIGW_CLIENT_HEADER_TIMEOUT_SECS", &v)?;
        }
        if let Some(v) = var("AIGW_CLIENT_IDLE_TIMEOUT_SECS") {
            s.client_idle_timeout_secs = parse_value("AIGW_CLIENT_IDLE_TIMEOUT_SECS", &v)?;
        }
        if let Some(v) = var("AIGW_MAX_CLIENT_CONNECTIONS") {
            s.max_client_connections = parse_value("AIGW_MAX_CLIENT_CONNECTIONS", &v)?;
        }
        if let Some(v) = var("AIGW_MAX_HEADER_BYTES") {
            s.max_header_bytes = parse_value("AIGW_MAX_HEADER_BYTES", &v)?;
        }
        if let Some(v) = var("AIGW_MAX_USAGE_TOKENS") {
            s.max_usage_tokens = parse_value("AIGW_MAX_USAGE_TOKENS", &v)?;
        }
        if let Some(v) = var("AIGW_STORE_OUTAGE_COUNTERS") {
            s.store_outage_counters = parse_value("AIGW_STORE_OUTAGE_COUNTERS", &v)?;
        }
        if let Some(v) = var("AIGW_MAX_UPSTREAM_CONNECTIONS_PER_HOST") {
            s.max_upstream_connections_per_host = parse_value("AIGW_MAX_UPSTREAM_CONNECTIONS_PER_HOST", &v)?;
        }
        if let Some(v) = var("AIGW_TRUSTED_PROXIES") {
            s.trusted_proxies = parse_networks("AIGW_TRUSTED_PROXIES", v.split(','))?;
        }
        if let Some(v) = var("AIGW_METRICS_TOKEN") {
            s.metrics_token = Some(Secret(v));
        }
        if let Some(v) = var("AIGW_ADMIN_LISTEN") {
            s.admin_listen = Some(parse_listen("AIGW_ADMIN_LISTEN", &v)?);
        }
        s.validate()?;
        Ok(s)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |name: &str, why: &str| Err(ConfigError(format!("bad setting {name}: {why}")));
        if !(self.database_url.starts_with("sqlite:")
            || self.database_url.starts_with("postgres://")
            || self.database_url.starts_with("postgresql://"))
        {
            return bad(
                "database_url (AIGW_DATABASE_URL)",
                "expected sqlite://PATH or postgres://…",
            );
        }
        if self.max_body_bytes == 0 {
            return bad("max_body_bytes (AIGW_MAX_BODY_BYTES)", "must be at least 1");
        }
        if self.max_attempts == 0 {
            return bad("max_attempts (AIGW_MAX_ATTEMPTS)", "must be at least 1");
        }
        if self.max_upstream_connections_per_host == 0 {
            return bad(
                "max_upstream_connections_per_host (AIGW_MAX_UPSTREAM_CONNECTIONS_PER_HOST)",
                "must be at least 1",
            );
        }
        // Every wait is bounded, by at most a day (a deadline is an instant; a day keeps its sum
        // far from overflowing).
        for (name, secs) in [
            (
                "request_timeout_secs (AIGW_REQUEST_TIMEOUT_SECS)",
                self.request_timeout_secs,
            ),
            (
                "connect_timeout_secs (AIGW_CONNECT_TIMEOUT_SECS)",
                self.connect_timeout_secs,
            ),
            (
                "stream_first_byte_timeout_secs (AIGW_STREAM_FIRST_BYTE_TIMEOUT_SECS)",
                self.stream_first_byte_timeout_secs,
            ),
            (
                "stream_idle_timeout_secs (AIGW_STREAM_IDLE_TIMEOUT_SECS)",
                self.stream_idle_timeout_secs,
            ),
            (
                "client_body_timeout_secs (AIGW_CLIENT_BODY_TIMEOUT_SECS)",
                self.client_body_timeout_secs,
            ),
        ] {
            if !(1..=MAX_WAIT_SECS).contains(&secs) {
                return bad(name, "must be 1..=86400 (seconds)");
            }
        }
        if self.slot_wait_ms > 60_000 {
            return bad("slot_wait_ms (AIGW_SLOT_WAIT_MS)", "must be at most 60000");
        }
        if self.single_candidate_retry_max_ms > 60_000 {
            return bad(
                "single_candidate_retry_max_ms (AIGW_SINGLE_CANDIDATE_RETRY_MAX_MS)",
                "must be at most 60000",
            );
        }
        if self.single_candidate_retry_min_ms > self.single_candidate_retry_max_ms {
            return bad(
                "single_candidate_retry_min_ms (AIGW_SINGLE_CANDIDATE_RETRY_MIN_MS)",
                "must not exceed single_candidate_retry_max_ms",
            );
        }
        if self.idle_poll_us > 10_000 {
            return bad("idle_poll_us (AIGW_IDLE_POLL_US)", "must be at most 10000");
        }
        if !(1..=3600).contains(&self.client_header_timeout_secs) {
            return bad(
                "client_header_timeout_secs (AIGW_CLIENT_HEADER_TIMEOUT_SECS)",
                "must be 1..=3600",
            );
        }
        if !(1..=3600).contains(&self.client_idle_timeout_secs) {
            return bad(
                "client_idle_timeout_secs (AIGW_CLIENT_IDLE_TIMEOUT_SECS)",
                "must be 1..=3600",
            );
        }
        if self.max_client_connections == 0 {
            return bad(
                "max_client_connections (AIGW_MAX_CLIENT_CONNECTIONS)",
                "must be at least 1",
            );
        }
        // The HTTP/1 parser's buffer cannot be smaller than 8 KiB.
        if !(8192..=1024 * 1024).contains(&self.max_header_bytes) {
            return bad(
                "max_header_bytes (AIGW_MAX_HEADER_BYTES)",
                "must be 8192..=1048576",
            );
        }
        if !(10..=60_000).contains(&self.flush_interval_ms) {
            return bad("flush_interval_ms (AIGW_FLUSH_INTERVAL_MS)", "must be 10..=60000");
        }
        if self.log_retention_days == 0 {
            return bad(
                "log_retention_days (AIGW_LOG_RETENTION_DAYS)",
                "must be at least 1",
            );
        }
        if !(1..=MAX_USAGE_TOKENS_LIMIT).contains(&self.max_usage_tokens) {
            return bad(
                "max_usage_tokens (AIGW_MAX_USAGE_TOKENS)",
                "must be 1..=1000000000000",
            );
        }
        if let Some(admin) = self.admin_listen
            && admin == self.listen
            && admin.port() != 0
        {
            return bad(
                "admin_listen (AIGW_ADMIN_LISTEN)",
                "must differ from listen (it is a second address for the admin surfaces)",
            );
        }
        if self
            .metrics_token
            .as_ref()
            .is_some_and(|t| t.expose().trim().is_empty())
        {
            return bad("metrics_token (AIGW_METRICS_TOKEN)", "must not be blank");
        }
        if let Some(email) = &self.bootstrap_email
            && crate::validate::email(email).is_err()
        {
            return bad("bootstrap_email (AIGW_BOOTSTRAP_EMAIL)", "not an email address");
        }
        Ok(())
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

/// The file path of a `sqlite:` URL (without query string).
pub fn sqlite_path(url: &str) -> &str {
    let rest = url.trim_start_matches("sqlite://").trim_start_matches("sqlite:");
    rest.split('?').next().unwrap_or(rest)
}

fn parse_value<T: FromStr>(name: &str, v: &str) -> Result<T, ConfigError>
where
    T::Err: fmt::Display,
{
    v.parse()
        .map_err(|e| ConfigError(format!("bad setting {name}: {v:?}: {e}")))
}

/// The listen address is a socket address; a bare port (`4001`) is the common slip.
fn parse_listen(name: &str, v: &str) -> Result<SocketAddr, ConfigError> {
    v.parse().map_err(|e| {
        ConfigError(format!(
            "bad setting {name}: {v:?}: {e} (expected HOST:PORT, e.g. 127.0.0.1:4000 or 0.0.0.0:{})",
            if v.bytes().all(|b| b.is_ascii_digit()) && !v.is_empty() {
                v
            } else {
                "4000"
            }
        ))
    })
}

/// Networks from CIDRs (`10.0.0.0/8`, `2001:db8::/32`) or single addresses (`192.168.1.5`),
/// blanks between items ignored.
fn parse_networks<'a>(
    name: &str,
    items: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<ipnet::IpNet>, ConfigError> {
    items
        .into_iter()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.parse::<ipnet::IpNet>()
                .or_else(|_| v.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map(|net| net.trunc())
                .map_err(|_| {
                    ConfigError(format!(
                        "bad setting {name}: {v:?} is not a network (expected CIDRs such as \
                         10.0.0.0/8 or single addresses such as 192.168.1.5, comma-separated)"
                    ))
                })
        })
        .collect()
}

/// Every `AIGW_*` variable aigw reads: the settings above, the command line's `AIGW_CONFIG` and
/// `AIGW_RESOURCES`, and the log filter `AIGW_LOG`.
pub const KNOWN_VARIABLES: &[&str] = &[
    "AIGW_LISTEN",
    "AIGW_DATABASE_URL",
    "AIGW_TIMEZONE",
    "AIGW_LOCALE",
    "AIGW_MASTER_KEY",
    "AIGW_JWT_SECRET",
    "AIGW_BOOTSTRAP_EMAIL",
    "AIGW_BOOTSTRAP_PASSWORD",
    "AIGW_MAX_BODY_BYTES",
    "AIGW_MAX_ATTEMPTS",
    "AIGW_REQUEST_TIMEOUT_SECS",
    "AIGW_CONNECT_TIMEOUT_SECS",
    "AIGW_STREAM_FIRST_BYTE_TIMEOUT_SECS",
    "AIGW_STREAM_IDLE_TIMEOUT_SECS",
    "AIGW_CLIENT_BODY_TIMEOUT_SECS",
    "AIGW_SLOT_WAIT_MS",
    "AIGW_SINGLE_CANDIDATE_RETRY_MIN_MS",
    "AIGW_SINGLE_CANDIDATE_RETRY_MAX_MS",
    "AIGW_FLUSH_INTERVAL_MS",
    "AIGW_LOG_RETENTION_DAYS",
    "AIGW_DATA_DIR",
    "AIGW_LOG_FORMAT",
    "AIGW_IDLE_POLL_US",
    "AIGW_CLIENT_HEADER_TIMEOUT_SECS",
    "AIGW_CLIENT_IDLE_TIMEOUT_SECS",
    "AIGW_MAX_CLIENT_CONNECTIONS",
    "AIGW_MAX_HEADER_BYTES",
    "AIGW_MAX_USAGE_TOKENS",
    "AIGW_STORE_OUTAGE_COUNTERS",
    "AIGW_MAX_UPSTREAM_CONNECTIONS_PER_HOST",
    "AIGW_TRUSTED_PROXIES",
    "AIGW_METRICS_TOKEN",
    "AIGW_ADMIN_LISTEN",
    "AIGW_CONFIG",
    "AIGW_RESOURCES",
    "AIGW_LOG",
    // Read by the repository's tests and scripts, not by the gateway; set beside it in CI.
    "AIGW_BIN",
];

/// Prefixes of variables the repository's tests and scripts read (`AIGW_TEST_POSTGRES_URL`,
/// schemathesis's `AIGW_ST_*`): not settings, and not a typo either.
const TOOLING_PREFIXES: &[&str] = &["AIGW_TEST_", "AIGW_ST_"];

/// The `AIGW_*` names among `names` that aigw does not read: most often a typo of a setting,
/// which would otherwise be ignored without a word. Sorted.
pub fn unknown_variables(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut unknown: Vec<String> = names
        .into_iter()
        .filter(|n| n.starts_with("AIGW_"))
        .filter(|n| !KNOWN_VARIABLES.contains(&n.as_str()))
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

    /// Every variable `load` reads is in `KNOWN_VARIABLES`: a setting added without it would be
    /// warned about as unknown.
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
            assert!(
                KNOWN_VARIABLES.contains(&name.as_str()),
                "{name} missing from KNOWN_VARIABLES"
            );
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
}
