//! OpenTelemetry traces: one span per proxied request and one child span per upstream attempt,
//! following the GenAI semantic conventions (`gen_ai.*`), exported over OTLP/HTTP.
//!
//! Nothing on the request path waits for the exporter: a finished request's spans are offered to
//! a bounded queue (`try_send`); when the queue is full they are dropped and counted in
//! `aigw_trace_spans_dropped_total`. One task on the main runtime batches the queue and exports;
//! a collector that is down or slow costs dropped spans, never a request's time. (The SDK's own
//! batch processor drops silently; counting the drops is why the queue is ours.)
//!
//! The caller's W3C `traceparent`/`tracestate` are continued: the request span is their child and
//! follows their sampled flag; without one, `otel_sample_ratio` of new traces are sampled. Each
//! upstream attempt carries a `traceparent` naming its own span.

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::HeaderMap;
use metrics::Counter;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue, Value};
use opentelemetry_http::{HeaderExtractor, HeaderInjector, HttpClient, HttpError};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Secret, Settings};

/// Spans waiting for export at most; past it new spans are dropped (and counted).
const QUEUE_SPANS: usize = 8192;
/// Most spans in one export request.
const BATCH_SPANS: usize = 512;
/// How often the queue is exported when it does not fill a batch.
const EXPORT_EVERY: Duration = Duration::from_secs(1);
/// How long one export request may take before it is abandoned (its spans dropped).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The tracer of a gateway: off (the default) or exporting to a collector.
#[derive(Clone, Default)]
pub struct Tracer(Option<Arc<Exporting>>);

/// A tracer that exports.
struct Exporting {
    queue: mpsc::Sender<Queued>,
    /// Of traces started here (no sampled parent), the share sampled.
    ratio: f64,
    scope: InstrumentationScope,
    dropped: Counter,
}

/// What the export task receives.
enum Queued {
    Span(Box<SpanData>),
    /// Export everything queued before this, then answer (the tests' sync point).
    Flush(oneshot::Sender<()>),
}

impl Tracer {
    /// The tracer `settings` ask for; it starts its export task on `tasks` (the current runtime).
    pub fn start(
        settings: &Settings,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Result<Tracer, String> {
        let Some(endpoint) = &settings.otel_endpoint else {
            return Ok(Tracer(None));
        };
        // Metric handles taken before the recorder is installed would record nowhere.
        crate::observability::telemetry::metrics_handle();
        let headers = parse_headers(settings.otel_headers.as_ref())?;
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(traces_url(endpoint))
            .with_timeout(EXPORT_TIMEOUT)
            .with_headers(headers)
            .with_http_client(Collector::new()?)
            .build()
            .map_err(|e| format!("otel_endpoint: {e}"))?;
        exporter.set_resource(
            &Resource::builder_empty()
                .with_service_name(settings.otel_service_name.clone())
                .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                .build(),
        );
        let (queue, rx) = mpsc::channel(QUEUE_SPANS);
        tasks.spawn(export(exporter, rx, shutdown));
        Ok(Tracer(Some(Arc::new(Exporting {
            queue,
            ratio: settings.otel_sample_ratio,
            scope: InstrumentationScope::builder("aigw")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
            dropped: metrics::counter!("aigw_trace_spans_dropped_total"),
        }))))
    }

    /// Whether traces are exported.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// The trace of a request that arrived with `headers`: the caller's, continued, or a new one
    /// (sampled by ratio). None when tracing is off.
    pub fn request(&self, headers: &HeaderMap) -> Option<RequestTrace> {
        let on = self.0.as_ref()?;
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
        let parent = parent.span().span_context().clone();
        let (trace_id, flags, state, parent_id) = if parent.is_valid() {
            (
                parent.trace_id(),
                parent.trace_flags(),
                parent.trace_state().clone(),
                Some(parent.span_id()),
            )
        } else {
            let trace_id = TraceId::from_bytes(nonzero_id());
            let flags = if sampled_by_ratio(trace_id, on.ratio) {
                TraceFlags::SAMPLED
            } else {
                TraceFlags::NOT_SAMPLED
            };
            (trace_id, flags, TraceState::NONE, None)
        };
        Some(RequestTrace {
            context: SpanContext::new(trace_id, span_id(), flags, false, state),
            parent: parent_id,
            start: SystemTime::now(),
        })
    }

    /// Offers a finished request's spans to the export queue; never waits. Unsampled traces
    /// record nothing.
    pub fn finish(&self, trace: &RequestTrace, request: SpanRecord, attempts: Vec<SpanRecord>) {
        let Some(on) = &self.0 else { return };
        if !trace.context.is_sampled() {
            return;
        }
        let end = SystemTime::now();
        let request_span = on.span(
            &trace.context,
            trace.parent.unwrap_or(SpanId::INVALID),
            trace.parent.is_some(),
            trace.start,
            end,
            request,
        );
        on.offer(request_span);
        for a in attempts {
            let Some(id) = a.span_id else { continue };
            let context = SpanContext::new(
                trace.context.trace_id(),
                id,
                trace.context.trace_flags(),
                false,
                trace.context.trace_state().clone(),
            );
            let (start, stop) = (a.start.unwrap_or(trace.start), a.end.unwrap_or(end));
            let span = on.span(&context, trace.context.span_id(), false, start, stop, a);
            on.offer(span);
        }
    }

    /// Exports every span finished so far (the behaviour tests' sync point).
    pub async fn flush(&self) {
        let Some(on) = &self.0 else { return };
        let (done, wait) = oneshot::channel();
        if on.queue.send(Queued::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }
}

impl Exporting {
    fn offer(&self, span: SpanData) {
        if self.queue.try_send(Queued::Span(Box::new(span))).is_err() {
            self.dropped.increment(1);
        }
    }

    fn span(
        &self,
        context: &SpanContext,
        parent: SpanId,
        parent_remote: bool,
        start: SystemTime,
        end: SystemTime,
        record: SpanRecord,
    ) -> SpanData {
        SpanData {
            span_context: context.clone(),
            parent_span_id: parent,
            parent_span_is_remote: parent_remote,
            span_kind: record.kind,
            name: record.name,
            start_time: start,
            end_time: end.max(start),
            attributes: record.attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: record.status,
            instrumentation_scope: self.scope.clone(),
        }
    }
}

/// The trace context of one request: the ids of its span, its parent (the caller's span, when the
/// caller sent one) and its start.
#[derive(Clone, Debug)]
pub struct RequestTrace {
    context: SpanContext,
    parent: Option<SpanId>,
    start: SystemTime,
}

impl RequestTrace {
    /// Starts an upstream attempt: its span id and start, with its `traceparent` (and the caller's
    /// `tracestate`) written on `headers`, so the upstream continues the trace under the attempt.
    pub fn attempt(&self, headers: &mut HeaderMap) -> AttemptSpan {
        let id = span_id();
        let context = SpanContext::new(
            self.context.trace_id(),
            id,
            self.context.trace_flags(),
            false,
            self.context.trace_state().clone(),
        );
        let cx = Context::new().with_remote_span_context(context);
        TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
        AttemptSpan {
            id,
            start: SystemTime::now(),
            answered: None,
        }
    }

    /// Whether this trace's spans are recorded.
    pub fn sampled(&self) -> bool {
        self.context.is_sampled()
    }

    /// The trace id, as W3C writes it (32 hex digits).
    pub fn trace_id(&self) -> String {
        self.context.trace_id().to_string()
    }
}

/// One upstream attempt's span: its id, when it was sent and when its answer came.
#[derive(Clone, Copy, Debug)]
pub struct AttemptSpan {
    /// The span's id (the upstream saw it as its parent).
    pub id: SpanId,
    /// When the request was sent.
    pub start: SystemTime,
    /// When the answer's head came (or the connection failed); the span ends there, or, for the
    /// attempt that served, when the response to the client ended.
    pub answered: Option<SystemTime>,
}

/// What a span says: its name, kind, status and attributes, and for an attempt its id and times.
pub struct SpanRecord {
    name: Cow<'static, str>,
    kind: SpanKind,
    status: Status,
    attributes: Vec<KeyValue>,
    span_id: Option<SpanId>,
    start: Option<SystemTime>,
    end: Option<SystemTime>,
}

impl SpanRecord {
    /// The request's span (a server span).
    pub fn request(name: String) -> SpanRecord {
        SpanRecord {
            name: name.into(),
            kind: SpanKind::Server,
            status: Status::Unset,
            attributes: Vec::with_capacity(24),
            span_id: None,
            start: None,
            end: None,
        }
    }

    /// An upstream attempt's span (a client span); the one that served lasts until the response
    /// to the client ends, the others until their answer's head came.
    pub fn attempt(name: String, span: &AttemptSpan, served: bool) -> SpanRecord {
        SpanRecord {
            name: name.into(),
            kind: SpanKind::Client,
            status: Status::Unset,
            attributes: Vec::with_capacity(12),
            span_id: Some(span.id),
            start: Some(span.start),
            end: if served { None } else { span.answered },
        }
    }

    /// Adds an attribute.
    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        self.attributes.push(KeyValue::new(key, value));
    }

    /// Marks the span failed, with `why`.
    pub fn failed(&mut self, why: impl Into<Cow<'static, str>>) {
        self.status = Status::error(why);
    }
}

/// Whether a new trace is sampled: the TraceIdRatioBased rule of the OpenTelemetry SDK
/// specification, on the trace id's low 63 bits.
fn sampled_by_ratio(trace_id: TraceId, ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    let bytes = trace_id.to_bytes();
    let mut low = [0u8; 8];
    low.copy_from_slice(&bytes[8..]);
    let x = u64::from_be_bytes(low) >> 1;
    (x as f64) < ratio * (1u64 << 63) as f64
}

fn nonzero_id<const N: usize>() -> [u8; N] {
    loop {
        let id: [u8; N] = std::array::from_fn(|_| rand::random::<u8>());
        if id.iter().any(|b| *b != 0) {
            return id;
        }
    }
}

fn span_id() -> SpanId {
    SpanId::from_bytes(nonzero_id())
}

/// The traces URL of `endpoint`: a collector's base URL gets `/v1/traces` (as
/// `OTEL_EXPORTER_OTLP_ENDPOINT` does); a URL already ending in it is kept.
fn traces_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}

/// `otel_headers`: `name=value` pairs separated by commas (the form of
/// `OTEL_EXPORTER_OTLP_HEADERS`); values may hold `=`.
fn parse_headers(raw: Option<&Secret>) -> Result<HashMap<String, String>, String> {
    let mut out = HashMap::new();
    let Some(raw) = raw else { return Ok(out) };
    for pair in raw.expose().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((name, value)) = pair.split_once('=') else {
            return Err("otel_headers: expected name=value pairs separated by commas".into());
        };
        let name = name.trim();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err()
            || http::HeaderValue::from_str(value.trim()).is_err()
        {
            return Err(format!("otel_headers: {name:?} is not a valid header"));
        }
        out.insert(name.to_owned(), value.trim().to_owned());
    }
    Ok(out)
}

/// Exports the queue every [`EXPORT_EVERY`], when a batch is full, or when a flush asks; a failed
/// export drops its batch (counted). Ends at shutdown after one last export of what is queued.
async fn export(
    exporter: opentelemetry_otlp::SpanExporter,
    mut rx: mpsc::Receiver<Queued>,
    shutdown: CancellationToken,
) {
    let dropped = metrics::counter!("aigw_trace_spans_dropped_total");
    let exported = metrics::counter!("aigw_trace_spans_exported_total");
    let mut batch: Vec<SpanData> = Vec::with_capacity(BATCH_SPANS);
    let mut flushes: Vec<oneshot::Sender<()>> = Vec::new();
    let mut every = tokio::time::interval(EXPORT_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (due, stopping) = tokio::select! {
            q = rx.recv() => match q {
                Some(q) => {
                    take(q, &mut batch, &mut flushes);
                    (batch.len() >= BATCH_SPANS || !flushes.is_empty(), false)
                }
                None => (true, true),
            },
            _ = every.tick() => (true, false),
            () = shutdown.cancelled() => (true, true),
        };
        if stopping {
            // What was queued before shutdown still goes.
            while let Ok(q) = rx.try_recv() {
                take(q, &mut batch, &mut flushes);
            }
        }
        if !due {
            continue;
        }
        while !batch.is_empty() {
            let n = batch.len().min(BATCH_SPANS);
            let chunk: Vec<SpanData> = batch.drain(..n).collect();
            match exporter.export(chunk).await {
                Ok(()) => exported.increment(n as u64),
                Err(e) => {
                    dropped.increment(n as u64);
                    tracing::warn!(spans = n, error = %e, "trace export failed; spans dropped");
                }
            }
        }
        for f in flushes.drain(..) {
            let _ = f.send(());
        }
        if stopping {
            break;
        }
    }
}

fn take(q: Queued, batch: &mut Vec<SpanData>, flushes: &mut Vec<oneshot::Sender<()>>) {
    match q {
        Queued::Span(s) => batch.push(*s),
        Queued::Flush(f) => flushes.push(f),
    }
}

/// The HTTP client of the exporter: reqwest, with the export timeout.
#[derive(Debug)]
struct Collector(reqwest::Client);

impl Collector {
    fn new() -> Result<Collector, String> {
        reqwest::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .build()
            .map(Collector)
            .map_err(|e| format!("otel exporter client: {e}"))
    }
}

impl HttpClient for Collector {
    fn send_bytes<'a, 'b>(
        &'a self,
        request: http::Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<http::Response<Bytes>, HttpError>> + Send + 'b>>
    where
        'a: 'b,
    {
        Box::pin(async move {
            let request = reqwest::Request::try_from(request)?;
            let response = self.0.execute(request).await?;
            let status = response.status();
            let body = response.bytes().await?;
            let mut out = http::Response::new(body);
            *out.status_mut() = status;
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ratio_sampler_keeps_its_share() {
        let ids: Vec<TraceId> = (0..10_000).map(|_| TraceId::from_bytes(nonzero_id())).collect();
        for (ratio, low, high) in [
            (0.0, 0, 0),
            (0.1, 800, 1200),
            (0.5, 4700, 5300),
            (1.0, 10_000, 10_000),
        ] {
            let n = ids.iter().filter(|id| sampled_by_ratio(**id, ratio)).count();
            assert!((low..=high).contains(&n), "ratio {ratio}: {n}");
        }
    }

    #[test]
    fn traces_urls() {
        for (given, url) in [
            ("http://c:4318", "http://c:4318/v1/traces"),
            ("http://c:4318/", "http://c:4318/v1/traces"),
            ("https://c/otlp/v1/traces", "https://c/otlp/v1/traces"),
        ] {
            assert_eq!(traces_url(given), url);
        }
    }

    #[test]
    fn header_settings() {
        let ok = parse_headers(Some(&Secret::new("authorization=Bearer a=b, x-team = search"))).unwrap();
        assert_eq!(ok["authorization"], "Bearer a=b");
        assert_eq!(ok["x-team"], "search");
        assert!(parse_headers(Some(&Secret::new("novalue"))).is_err());
        assert!(parse_headers(Some(&Secret::new("bad name=x"))).is_err());
        assert!(parse_headers(None).unwrap().is_empty());
    }

    #[test]
    fn a_caller_traceparent_is_continued_and_an_attempt_names_its_own_span() {
        let (tracer, _rx) = test_tracer(1.0);
        let mut headers = HeaderMap::new();
        headers.insert(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
                .parse()
                .unwrap(),
        );
        headers.insert("tracestate", "vendor=x".parse().unwrap());
        let t = tracer.request(&headers).unwrap();
        assert_eq!(t.trace_id(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(t.parent, Some(SpanId::from_hex("b7ad6b7169203331").unwrap()));
        let mut up = HeaderMap::new();
        let a = t.attempt(&mut up);
        assert_eq!(
            up["traceparent"].to_str().unwrap(),
            format!("00-0af7651916cd43dd8448eb211c80319c-{}-01", a.id)
        );
        assert_eq!(up["tracestate"], "vendor=x");
        // Not sampled by the caller: not sampled here, still propagated.
        headers.insert(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
                .parse()
                .unwrap(),
        );
        let t = tracer.request(&headers).unwrap();
        assert!(!t.context.is_sampled());
        // Garbage is ignored: a new trace.
        headers.insert("traceparent", "00-zz-b7ad6b7169203331-01".parse().unwrap());
        let t = tracer.request(&headers).unwrap();
        assert_ne!(t.trace_id(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(t.parent, None);
    }

    #[test]
    fn a_full_queue_drops_without_waiting() {
        let (tracer, _rx) = test_tracer(1.0);
        let t = tracer.request(&HeaderMap::new()).unwrap();
        for _ in 0..QUEUE_SPANS + 10 {
            tracer.finish(&t, SpanRecord::request("chat m".into()), Vec::new());
        }
        let on = tracer.0.as_ref().unwrap();
        assert_eq!(on.queue.capacity(), 0);
    }

    fn test_tracer(ratio: f64) -> (Tracer, mpsc::Receiver<Queued>) {
        let (queue, rx) = mpsc::channel(QUEUE_SPANS);
        let t = Tracer(Some(Arc::new(Exporting {
            queue,
            ratio,
            scope: InstrumentationScope::builder("aigw").build(),
            dropped: Counter::noop(),
        })));
        (t, rx)
    }
}
