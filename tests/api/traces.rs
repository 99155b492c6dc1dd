//! OpenTelemetry traces (issue 26): an in-test OTLP/HTTP receiver gets one span per proxied
//! request and one child per upstream attempt, with the GenAI attributes and the right parents,
//! for a plain request, a stream, a failover and refusals; the caller's `traceparent` is
//! continued and the upstream gets the attempt's; a collector that is down costs dropped spans.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aigw::mock_upstream::{MockUpstream, Script};
use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{Setup, TestApp, TestDb, spawn_app};
use crate::proxy::{KEY, resources};

const CALLER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CALLER_SPAN: &str = "b7ad6b7169203331";

/// One exported span, flattened.
#[derive(Clone, Debug)]
struct Span {
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    /// 2 server, 3 client.
    kind: i32,
    /// 0 unset, 2 error.
    status: i32,
    attrs: HashMap<String, Value>,
}

impl Span {
    fn attr(&self, k: &str) -> &Value {
        self.attrs.get(k).unwrap_or(&Value::Null)
    }
}

/// An OTLP/HTTP (protobuf) receiver: every span it got, and every body's bytes.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
    raw: Arc<Mutex<Vec<u8>>>,
    service: Arc<Mutex<Option<String>>>,
}

impl Receiver {
    async fn start() -> (Receiver, String) {
        let r = Receiver::default();
        let rx = r.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| {
                let rx = rx.clone();
                async move {
                    rx.take(&body);
                    ""
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (r, url)
    }

    fn take(&self, body: &[u8]) {
        self.raw.lock().unwrap().extend_from_slice(body);
        let req = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
        for rs in req.resource_spans {
            if let Some(res) = &rs.resource {
                for kv in &res.attributes {
                    if kv.key == "service.name" {
                        *self.service.lock().unwrap() = kv.value.as_ref().map(|v| format!("{:?}", v.value));
                    }
                }
            }
            for ss in rs.scope_spans {
                for s in ss.spans {
                    let attrs = s
                        .attributes
                        .iter()
                        .map(|kv| {
                            let v = match kv.value.as_ref().and_then(|v| v.value.clone()) {
                                Some(Any::StringValue(s)) => json!(s),
                                Some(Any::IntValue(i)) => json!(i),
                                Some(Any::BoolValue(b)) => json!(b),
                                Some(Any::DoubleValue(d)) => json!(d),
                                Some(Any::ArrayValue(a)) => a
                                    .values
                                    .iter()
                                    .map(|v| match &v.value {
                                        Some(Any::StringValue(s)) => json!(s),
                                        other => json!(format!("{other:?}")),
                                    })
                                    .collect(),
                                other => json!(format!("{other:?}")),
                            };
                            (kv.key.clone(), v)
                        })
                        .collect();
                    self.spans.lock().unwrap().push(Span {
                        name: s.name,
                        trace_id: hex::encode(&s.trace_id),
                        span_id: hex::encode(&s.span_id),
                        parent: hex::encode(&s.parent_span_id),
                        kind: s.kind,
                        status: s.status.map_or(0, |st| st.code),
                        attrs,
                    });
                }
            }
        }
    }

    /// Takes the spans received so far.
    fn drain(&self) -> Vec<Span> {
        std::mem::take(&mut *self.spans.lock().unwrap())
    }
}

async fn start(db: &TestDb, collector: &str, ratio: f64, extra: &str) -> (TestApp, MockUpstream) {
    let mock = MockUpstream::start().await.unwrap();
    let endpoint = collector.to_owned();
    let setup = Setup {
        settings: Box::new(move |s| {
            s.otel_endpoint = Some(endpoint);
            s.otel_sample_ratio = ratio;
            s.otel_headers = Some(aigw::config::Secret::new("x-collector-token=tok-123"));
        }),
        ..Setup::resources(format!("{}\n{extra}", resources(&mock)))
    };
    (spawn_app(db, setup).await, mock)
}

fn chat(stream: bool) -> Value {
    json!({"model": "gpt-4o-mini", "stream": stream, "messages": [{"role": "user", "content": "a secret prompt"}]})
}

async fn call(app: &TestApp, key: &str, body: &Value, traceparent: Option<&str>) -> u16 {
    let mut req = app
        .client
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(key)
        .json(body);
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp).header("tracestate", "caller=1");
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    r.bytes().await.unwrap();
    status
}

/// The request span of `spans` and its children, checked to be one trace.
fn split(spans: &[Span]) -> (Span, Vec<Span>) {
    let roots: Vec<&Span> = spans.iter().filter(|s| s.kind == 2).collect();
    assert_eq!(roots.len(), 1, "one request span: {spans:#?}");
    let root = roots[0].clone();
    let mut children: Vec<Span> = spans.iter().filter(|s| s.kind == 3).cloned().collect();
    for c in &children {
        assert_eq!(c.trace_id, root.trace_id, "{c:?}");
        assert_eq!(c.parent, root.span_id, "an attempt is the request's child: {c:?}");
    }
    assert_eq!(children.len() + 1, spans.len(), "{spans:#?}");
    children.sort_by_key(|c| c.attr("aigw.attempt.number").as_i64());
    (root, children)
}

async fn traced_requests_streams_and_failovers(db: TestDb) {
    let (rx, url) = Receiver::start().await;
    let (app, mock) = start(&db, &url, 1.0, "").await;

    // A plain request continuing the caller's trace.
    let tp = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    assert_eq!(call(&app, KEY, &chat(false), Some(&tp)).await, 200);
    app.sync().await;
    let (req, attempts) = split(&rx.drain());
    assert_eq!(req.trace_id, CALLER_TRACE);
    assert_eq!(req.parent, CALLER_SPAN, "the caller's span is the parent");
    assert_eq!(req.name, "chat gpt-4o-mini");
    for (k, v) in [
        ("gen_ai.operation.name", json!("chat")),
        ("gen_ai.request.model", json!("gpt-4o-mini")),
        ("gen_ai.response.model", json!("gpt-4o-mini")),
        ("gen_ai.provider.name", json!("openai-compatible")),
        ("http.response.status_code", json!(200)),
        ("aigw.quota.decision", json!("allowed")),
        ("aigw.breaker.state", json!("closed")),
        ("aigw.stream", json!(false)),
        ("aigw.attempts", json!(1)),
        ("gen_ai.response.finish_reasons", json!(["stop"])),
    ] {
        assert_eq!(req.attr(k), &v, "{k}: {req:#?}");
    }
    assert!(
        req.attr("gen_ai.usage.input_tokens").as_i64().unwrap() > 0,
        "{req:#?}"
    );
    assert!(
        req.attr("gen_ai.usage.output_tokens").as_i64().unwrap() > 0,
        "{req:#?}"
    );
    for k in ["aigw.key.id", "aigw.member.id", "aigw.workspace.id"] {
        assert!(req.attr(k).as_i64().is_some(), "{k}: {req:#?}");
    }
    assert_eq!(attempts.len(), 1);
    let a = &attempts[0];
    assert_eq!(a.attr("aigw.credential.name"), "primary");
    assert_eq!(a.attr("http.response.status_code"), 200);
    assert_eq!(a.status, 0);
    // The upstream continued the trace under the attempt's span, with the caller's tracestate.
    let calls = mock.calls();
    assert_eq!(
        calls.last().unwrap().traceparent.as_deref(),
        Some(format!("00-{CALLER_TRACE}-{}-01", a.span_id).as_str())
    );

    // A stream: its span ends with the stream, with the tokens it reported.
    assert_eq!(call(&app, KEY, &chat(true), None).await, 200);
    app.sync().await;
    let (req, attempts) = split(&rx.drain());
    assert_ne!(req.trace_id, CALLER_TRACE, "a new trace");
    assert_eq!(req.parent, "", "a root span");
    assert_eq!(req.attr("aigw.stream"), true);
    assert_eq!(req.attr("gen_ai.response.finish_reasons"), &json!(["stop"]));
    assert!(
        req.attr("gen_ai.usage.output_tokens").as_i64().unwrap() > 0,
        "{req:#?}"
    );
    assert_eq!(attempts.len(), 1);

    // A failover: the primary's 500 is one attempt, the backup's answer another.
    mock.script(
        Script::any()
            .credential("cred-primary")
            .times(1)
            .error(500, json!({"error": {"message": "boom", "type": "server_error"}})),
    );
    assert_eq!(call(&app, KEY, &chat(false), None).await, 200);
    app.sync().await;
    let (req, attempts) = split(&rx.drain());
    assert_eq!(req.attr("aigw.attempts"), 2);
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    assert_eq!(attempts[0].attr("aigw.attempt.number"), 1);
    assert_eq!(attempts[0].attr("aigw.credential.name"), "primary");
    assert_eq!(attempts[0].attr("http.response.status_code"), 500);
    assert_eq!(attempts[0].status, 2, "a failed attempt is an error span");
    assert!(
        attempts[0].attr("aigw.classification").is_string(),
        "{:#?}",
        attempts[0]
    );
    assert_eq!(attempts[1].attr("aigw.credential.name"), "backup");
    assert_eq!(attempts[1].attr("gen_ai.provider.name"), "openai");
    assert_eq!(req.attr("gen_ai.provider.name"), "openai");
    let upstream_parents: Vec<String> = mock
        .calls()
        .iter()
        .rev()
        .take(2)
        .map(|c| c.traceparent.clone().unwrap_or_default())
        .collect();
    for a in &attempts {
        assert!(
            upstream_parents.iter().any(|tp| tp.contains(&a.span_id)),
            "each upstream call names its attempt's span"
        );
    }

    // Never a secret nor a prompt in what was exported.
    let raw = String::from_utf8_lossy(&rx.raw.lock().unwrap()).into_owned();
    for secret in [KEY, "cred-primary", "cred-backup", "a secret prompt", "tok-123"] {
        assert!(!raw.contains(secret), "{secret} was exported");
    }
    assert!(
        rx.service
            .lock()
            .unwrap()
            .as_deref()
            .unwrap_or_default()
            .contains("aigw")
    );
    app.stop().await;
}

async fn traced_refusals(db: TestDb) {
    let (rx, url) = Receiver::start().await;
    let policy = "[[policy]]\nworkspace = \"acme\"\nsubject = \"apikey\"\ntarget = \"ada@acme.test/ci\"\n\
                  metric = \"requests\"\nwindow = \"day\"\nlimit = 1\n";
    let (app, mock) = start(&db, &url, 1.0, policy).await;
    assert_eq!(call(&app, KEY, &chat(false), None).await, 200);
    app.sync().await;
    rx.drain();
    let before = mock.call_count();

    // A quota refusal: one span, no attempt, nothing sent upstream.
    assert_eq!(call(&app, KEY, &chat(false), None).await, 429);
    app.sync().await;
    let (req, attempts) = split(&rx.drain());
    assert!(attempts.is_empty());
    assert_eq!(mock.call_count(), before);
    assert_eq!(req.attr("http.response.status_code"), 429);
    assert_eq!(req.attr("error.type"), "quota_exceeded");
    assert_eq!(req.attr("aigw.quota.decision"), "refused");
    assert_eq!(
        req.status, 0,
        "a refusal is the caller's error, not the gateway's"
    );

    // An unknown key: a span with no caller.
    assert_eq!(call(&app, "sk-aigw-unknown", &chat(false), None).await, 401);
    app.sync().await;
    let (req, _) = split(&rx.drain());
    assert_eq!(req.attr("error.type"), "invalid_api_key");
    assert_eq!(req.attr("aigw.key.id"), &Value::Null);
    app.stop().await;
}

async fn down_collector_and_sampling(db: TestDb) {
    // Nothing listens there: every export fails, requests do not notice.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let (app, _mock) = start(&db, &closed, 1.0, "").await;
    for _ in 0..3 {
        assert_eq!(call(&app, KEY, &chat(false), None).await, 200);
    }
    app.sync().await;
    let metrics = app.get("/metrics").await.text().await.unwrap();
    let dropped: f64 = metrics
        .lines()
        .find(|l| l.starts_with("aigw_trace_spans_dropped_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no dropped-span count in {metrics}"));
    assert!(dropped >= 6.0, "3 requests and 3 attempts dropped: {dropped}");
    app.stop().await;

    // Ratio 0: traces started here are not sampled; a caller's sampled trace still is.
    let (rx, url) = Receiver::start().await;
    let (app, mock) = start(&db, &url, 0.0, "").await;
    assert_eq!(call(&app, KEY, &chat(false), None).await, 200);
    app.sync().await;
    assert!(rx.drain().is_empty());
    let tp = mock.calls().last().unwrap().traceparent.clone().unwrap();
    assert!(
        tp.ends_with("-00"),
        "the unsampled context still goes upstream: {tp}"
    );
    let sampled = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    assert_eq!(call(&app, KEY, &chat(false), Some(&sampled)).await, 200);
    app.sync().await;
    let (req, _) = split(&rx.drain());
    assert_eq!(req.trace_id, CALLER_TRACE);
    app.stop().await;
}

both_backends!(
    traced_requests_streams_and_failovers,
    traced_refusals,
    down_collector_and_sampling
);
