//! Structured logs (tracing) and Prometheus metrics.
//!
//! [`FAMILIES`] lists every metric family `/metrics` exports, with its type, labels and help
//! text: the recorder's families are described from it at start, the gauges read from the
//! gateway's state at scrape time ([`Exposition`]) take their `# HELP` and `# TYPE` from it, and
//! `docs/reference.md` is tested against it. Counters with a known set of label values are
//! registered at zero at start, so a rate over them works from the first scrape.

use std::fmt::Write;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the process-wide log subscriber (once; later calls do nothing).
pub fn init_logs(format: LogFormat) {
    let filter = EnvFilter::try_from_env("AIGW_LOG").unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// The Prometheus type of a family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (until the process restarts).
    Counter,
    /// A value now.
    Gauge,
    /// Observations in buckets.
    Histogram,
}

impl Kind {
    /// The word `# TYPE` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric family.
#[derive(Debug)]
pub struct Family {
    /// The name, `aigw_…`.
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Its labels, in order.
    pub labels: &'static [&'static str],
    /// The `# HELP` text (one line).
    pub help: &'static str,
}

const fn family(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    help: &'static str,
) -> Family {
    Family {
        name,
        kind,
        labels,
        help,
    }
}

/// Every family `/metrics` exports.
pub const FAMILIES: &[Family] = &[
    family(
        "aigw_build_info",
        Kind::Gauge,
        &["version"],
        "Always 1; the version of the running aigw is its label.",
    ),
    family(
        "aigw_requests_total",
        Kind::Counter,
        &["endpoint", "status", "code", "source"],
        "Proxied requests by endpoint, HTTP status, error code and who produced the error (gateway or upstream; empty on success).",
    ),
    family(
        "aigw_request_duration_seconds",
        Kind::Histogram,
        &["endpoint"],
        "Time from a proxied request's arrival to the end of its answer (a stream's last byte).",
    ),
    family(
        "aigw_upstream_duration_seconds",
        Kind::Histogram,
        &["provider"],
        "Time one upstream attempt took until its response head, by provider.",
    ),
    family(
        "aigw_tokens_total",
        Kind::Counter,
        &["kind"],
        "Tokens served, prompt and completion, as counted for quotas.",
    ),
    family(
        "aigw_stream_errors_total",
        Kind::Counter,
        &[],
        "Streams that ended with an error after their first byte reached the client.",
    ),
    family(
        "aigw_quota_refusals_total",
        Kind::Counter,
        &["subject", "mode"],
        "Requests a guardrail quota refused (mode enforce) or would have refused (mode shadow), by the quota's subject kind.",
    ),
    family(
        "aigw_budget_alerts_total",
        Kind::Counter,
        &["event"],
        "Budget alerts by event: fired (put in the outbox), delivered, retried (a try failed, another follows), given_up.",
    ),
    family(
        "aigw_trace_spans_exported_total",
        Kind::Counter,
        &[],
        "Spans sent to the OpenTelemetry collector.",
    ),
    family(
        "aigw_trace_spans_dropped_total",
        Kind::Counter,
        &[],
        "Spans dropped: the export queue was full or an export failed.",
    ),
    family(
        "aigw_breaker_trips_total",
        Kind::Counter,
        &["step"],
        "Key breaker trips by step of the ladder (1 to 4, or ban).",
    ),
    family(
        "aigw_breaker_open_keys",
        Kind::Gauge,
        &[],
        "Gateway API keys whose breaker is open now (refused until the block ends).",
    ),
    family(
        "aigw_breaker_banned_keys",
        Kind::Gauge,
        &[],
        "Gateway API keys banned for good by their breaker.",
    ),
    family(
        "aigw_upstream_parked",
        Kind::Gauge,
        &["scope", "rule"],
        "Running locks on upstream credentials, by what they park (model, free_models, credential) and the classification rule that wrote them.",
    ),
    family(
        "aigw_upstream_banned_credentials",
        Kind::Gauge,
        &[],
        "Upstream credentials out of rotation until a connection test passes (suspended, deactivated or unverified accounts).",
    ),
    family(
        "aigw_upstream_in_flight",
        Kind::Gauge,
        &["credential_id", "credential"],
        "Requests this gateway has in flight on each upstream credential (its slots in use out of max_in_flight).",
    ),
    family(
        "aigw_store_flush_duration_seconds",
        Kind::Histogram,
        &["kind"],
        "Time one flush of in-memory state to the database took (quota counters, own-limit counts, breaker windows, request logs).",
    ),
    family(
        "aigw_store_flush_failures_total",
        Kind::Counter,
        &["kind"],
        "Flushes to the database that failed; what they held is kept for the next flush.",
    ),
    family(
        "aigw_store_available",
        Kind::Gauge,
        &[],
        "1 while the database answers, 0 during an outage (keys, policies and routes then serve from memory).",
    ),
    family(
        "aigw_redis_up",
        Kind::Gauge,
        &[],
        "With redis_url set: 1 while Redis answers and quota counters are shared, 0 while each gateway counts alone.",
    ),
    family(
        "aigw_log_queue_depth",
        Kind::Gauge,
        &[],
        "Request logs waiting for the batch writer.",
    ),
    family(
        "aigw_log_queue_bytes",
        Kind::Gauge,
        &[],
        "Memory the request logs waiting for the batch writer take, in bytes (bounded by max_log_queue_bytes).",
    ),
    family(
        "aigw_request_logs_dropped_total",
        Kind::Counter,
        &[],
        "Request logs dropped because the queue held max_log_queue_bytes (the database took fewer than were served); quota counters are not affected.",
    ),
    family(
        "aigw_client_connections",
        Kind::Gauge,
        &[],
        "Client connections open now (bounded by max_client_connections).",
    ),
    family(
        "aigw_admin_connections",
        Kind::Gauge,
        &[],
        "Connections open now on admin_listen (bounded by max_admin_connections, apart from the proxy's cap).",
    ),
    family(
        "aigw_client_connections_refused_total",
        Kind::Counter,
        &[],
        "Client connections answered 503 too_many_connections and closed because their listener's cap (max_client_connections, max_admin_connections) was reached.",
    ),
    family(
        "aigw_client_connections_timed_out_total",
        Kind::Counter,
        &["bound"],
        "Client connections closed by a bound: header (client_header_timeout_secs) or idle (client_idle_timeout_secs).",
    ),
    family(
        "aigw_client_accept_failures_total",
        Kind::Counter,
        &[],
        "Failed accepts of client connections (most often the open-file limit).",
    ),
];

/// The family named `name`.
pub fn family_of(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.name == name)
}

/// The `kind` label values of the store flush families.
pub const FLUSH_KINDS: [&str; 5] = ["quota", "own_limits", "breakers", "request_logs", "usage_rollups"];

/// The process-wide Prometheus recorder (installed on first use).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let latency = [
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0,
            ];
            let recorder = PrometheusBuilder::new()
                .set_buckets(&latency)
                .map(|b| b.build_recorder())
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
            let handle = recorder.handle();
            // Another recorder may already be installed (embedding); then ours just stays empty.
            let _ = metrics::set_global_recorder(recorder);
            describe_and_register();
            handle
        })
        .clone()
}

/// Describes every recorded family and registers the counters whose label values are known at
/// zero.
fn describe_and_register() {
    for f in FAMILIES {
        match f.kind {
            Kind::Counter => metrics::describe_counter!(f.name, f.help),
            Kind::Gauge => metrics::describe_gauge!(f.name, f.help),
            Kind::Histogram => metrics::describe_histogram!(f.name, f.help),
        }
    }
    for name in [
        "aigw_stream_errors_total",
        "aigw_client_accept_failures_total",
        "aigw_trace_spans_exported_total",
        "aigw_trace_spans_dropped_total",
    ] {
        metrics::counter!(name).increment(0);
    }
    for step in ["1", "2", "3", "4", "ban"] {
        metrics::counter!("aigw_breaker_trips_total", "step" => step).increment(0);
    }
    for bound in ["header", "idle"] {
        metrics::counter!("aigw_client_connections_timed_out_total", "bound" => bound).increment(0);
    }
    for kind in FLUSH_KINDS {
        metrics::counter!("aigw_store_flush_failures_total", "kind" => kind).increment(0);
    }
    for event in ["fired", "delivered", "retried", "given_up"] {
        metrics::counter!("aigw_budget_alerts_total", "event" => event).increment(0);
    }
    for subject in ["apikey", "member", "dept", "ws", "tag", "end_user"] {
        for mode in ["enforce", "shadow"] {
            metrics::counter!("aigw_quota_refusals_total", "subject" => subject, "mode" => mode).increment(0);
        }
    }
}

/// Times one flush to the database and counts it when it fails: `kind` is one of
/// [`FLUSH_KINDS`].
pub async fn timed_flush<T, E>(
    kind: &'static str,
    flush: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let started = std::time::Instant::now();
    let result = flush.await;
    metrics::histogram!("aigw_store_flush_duration_seconds", "kind" => kind)
        .record(started.elapsed().as_secs_f64());
    if result.is_err() {
        metrics::counter!("aigw_store_flush_failures_total", "kind" => kind).increment(1);
    }
    result
}

/// Prometheus text of families read at scrape time, each with the `# HELP` and `# TYPE` of its
/// entry in [`FAMILIES`].
#[derive(Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// Starts a family (its `# HELP` and `# TYPE` lines). A name missing from [`FAMILIES`] is a
    /// bug the reference test catches; it is written without help rather than dropped.
    pub fn family(&mut self, name: &'static str) -> &mut Self {
        let (help, kind) = family_of(name).map_or(("", "untyped"), |f| (f.help, f.kind.as_str()));
        let _ = write!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
        self
    }

    /// One sample of the family last started; label values are escaped.
    pub fn sample(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        value: impl std::fmt::Display,
    ) -> &mut Self {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"");
                for c in v.chars() {
                    match c {
                        '\\' => self.text.push_str("\\\\"),
                        '"' => self.text.push_str("\\\""),
                        '\n' => self.text.push_str("\\n"),
                        c => self.text.push(c),
                    }
                }
                self.text.push('"');
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
        self
    }

    /// The text.
    pub fn finish(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_unique_and_named_by_convention() {
        let mut names: Vec<_> = FAMILIES.iter().map(|f| f.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FAMILIES.len(), "a family listed twice");
        for f in FAMILIES {
            assert!(f.name.starts_with("aigw_"), "{}", f.name);
            assert_eq!(
                f.kind == Kind::Counter,
                f.name.ends_with("_total"),
                "{}: counters and only counters end in _total",
                f.name
            );
            assert!(!f.help.is_empty() && !f.help.contains('\n'), "{}", f.name);
        }
    }

    /// `docs/reference.md` lists every family with its type and labels, and no other.
    #[test]
    fn the_reference_documents_every_family() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference.md"))
            .expect("docs/reference.md");
        let start = doc.find("## Metrics").expect("a Metrics section");
        let mut documented: Vec<(String, String, String)> = doc[start..]
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .map(|l| {
                let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
                assert_eq!(cells.len(), 4, "name, type, labels, meaning: {l}");
                let labels = cells[2].replace('`', "");
                (cells[0].trim_matches('`').to_owned(), cells[1].to_owned(), labels)
            })
            .collect();
        documented.sort();
        let mut actual: Vec<(String, String, String)> = FAMILIES
            .iter()
            .map(|f| (f.name.to_owned(), f.kind.as_str().to_owned(), f.labels.join(", ")))
            .collect();
        actual.sort();
        assert_eq!(
            documented, actual,
            "docs/reference.md's metrics table against FAMILIES"
        );
    }

    #[test]
    fn exposition_escapes_label_values() {
        let mut e = Exposition::default();
        e.family("aigw_upstream_in_flight").sample(
            "aigw_upstream_in_flight",
            &[("credential_id", "1"), ("credential", "a\"b\\c")],
            3,
        );
        let text = e.finish();
        assert!(
            text.starts_with("# HELP aigw_upstream_in_flight Requests"),
            "{text}"
        );
        assert!(text.contains("# TYPE aigw_upstream_in_flight gauge\n"), "{text}");
        assert!(
            text.ends_with("aigw_upstream_in_flight{credential_id=\"1\",credential=\"a\\\"b\\\\c\"} 3\n"),
            "{text}"
        );
    }
}
