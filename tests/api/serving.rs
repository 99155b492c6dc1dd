//! Client connections, driven over raw TCP: the header and idle timeouts, the connection cap,
//! and the protocol-level refusals (431, 400, 405) in the gateway's JSON error shape.
//!
//! No storage is involved, so each test runs on SQLite only.

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{Setup, TestApp, TestDb, spawn_app};

/// A gateway with these client timeouts (seconds) and connection cap.
async fn start(db: &TestDb, header: u64, idle: u64, max_connections: usize) -> TestApp {
    let setup = Setup {
        settings: Box::new(move |s| {
            s.client_header_timeout_secs = header;
            s.client_idle_timeout_secs = idle;
            s.max_client_connections = max_connections;
        }),
        ..Setup::default()
    };
    spawn_app(db, setup).await
}

async fn connect(app: &TestApp) -> TcpStream {
    let addr = app.address.trim_start_matches("http://");
    TcpStream::connect(addr).await.expect("connect")
}

/// A response read off a raw connection.
#[derive(Debug)]
struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?} (status {})",
                String::from_utf8_lossy(&self.body),
                self.status
            )
        })
    }

    /// Asserts the gateway's JSON error shape with `status` and `code`.
    /// The response's `x-request-id`, a UUID (DESIGN.md §7: on every response).
    fn request_id(&self) -> uuid::Uuid {
        let id = self
            .header("x-request-id")
            .unwrap_or_else(|| panic!("no x-request-id: {self:?}"));
        id.parse().unwrap_or_else(|e| panic!("x-request-id {id:?}: {e}"))
    }

    fn assert_gateway_error(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.header("x-aigw-error-source"), Some("gateway"), "{self:?}");
        assert!(
            self.header("content-type")
                .is_some_and(|v| v.starts_with("application/json")),
            "{self:?}"
        );
        let body = self.json();
        assert_eq!(body["error"]["code"], code, "{body}");
        assert!(
            body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
        assert!(body["error"]["type"].is_string(), "{body}");
        // DESIGN.md §7: every response carries a request id, protocol refusals included.
        assert!(
            self.header("x-request-id").is_some_and(|v| !v.is_empty()),
            "{self:?}"
        );
    }
}

/// Reads one response (head, then `content-length` bytes, or to the end when it has none).
async fn read_response(tcp: &mut TcpStream) -> RawResponse {
    let mut buf = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = read_some(tcp, &mut buf, deadline).await;
        assert!(
            n > 0,
            "connection closed before a response head: {:?}",
            String::from_utf8_lossy(&buf)
        );
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let length = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse::<usize>().ok());
    let mut body = buf[head_end..].to_vec();
    match length {
        Some(len) => {
            while body.len() < len {
                let n = read_some(tcp, &mut body, deadline).await;
                assert!(n > 0, "connection closed inside a body");
            }
            body.truncate(len);
        }
        None => while read_some(tcp, &mut body, deadline).await > 0 {},
    }
    RawResponse {
        status,
        headers,
        body,
    }
}

async fn read_some(tcp: &mut TcpStream, buf: &mut Vec<u8>, deadline: Instant) -> usize {
    let mut chunk = [0u8; 8192];
    let left = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout(left, tcp.read(&mut chunk)).await {
        Ok(Ok(n)) => {
            buf.extend_from_slice(&chunk[..n]);
            n
        }
        Ok(Err(_)) => 0, // reset: closed
        Err(_) => panic!(
            "no answer within 5 s; read so far: {:?}",
            String::from_utf8_lossy(buf)
        ),
    }
}

/// Sends `request` on a fresh connection and reads the one response.
async fn exchange(app: &TestApp, request: &[u8]) -> RawResponse {
    exchange_at(app.address.trim_start_matches("http://"), request).await
}

/// Sends `request` on a fresh connection to `addr` and reads the one response.
async fn exchange_at(addr: &str, request: &[u8]) -> RawResponse {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(request).await.expect("write");
    read_response(&mut tcp).await
}

/// Waits for the gateway to close `tcp` (end of stream or reset) and returns how long that took;
/// fails if it takes longer than `most` or if the gateway sends anything.
async fn closed_within(tcp: &mut TcpStream, most: Duration) -> Duration {
    let started = Instant::now();
    let mut chunk = [0u8; 1024];
    match tokio::time::timeout(most, tcp.read(&mut chunk)).await {
        Ok(Ok(0)) | Ok(Err(_)) => started.elapsed(),
        Ok(Ok(n)) => panic!(
            "expected a silent close, got {:?}",
            String::from_utf8_lossy(&chunk[..n])
        ),
        Err(_) => panic!("the connection was still open after {most:?}"),
    }
}

/// Waits until the gateway counts `n` open client connections (10 s at most).
async fn until_open_connections(app: &TestApp, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let open = app.state.connections.open();
        if open == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "expected {n} open client connections, the gateway counts {open}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n";
/// A request that needs no key to be answered (`/v1/models` without one is a 401).
const MODELS: &[u8] = b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_after_the_header_timeout() {
    let db = TestDb::sqlite();
    let app = start(&db, 1, 60, 100).await;
    let mut tcp = connect(&app).await;
    let took = closed_within(&mut tcp, Duration::from_secs(5)).await;
    assert!(took >= Duration::from_millis(800), "closed too early: {took:?}");
    until_open_connections(&app, 0).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_a_header_is_closed_after_the_header_timeout() {
    let db = TestDb::sqlite();
    let app = start(&db, 1, 60, 100).await;
    let mut tcp = connect(&app).await;
    tcp.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-")
        .await
        .unwrap();
    // A byte now and then does not keep it open: the head must be complete in time.
    let trickle = async {
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if tcp.write_all(b"x").await.is_err() {
                break;
            }
        }
    };
    let started = Instant::now();
    trickle.await;
    let took = started.elapsed() + closed_within(&mut tcp, Duration::from_secs(5)).await;
    assert!(took < Duration::from_secs(4), "open for {took:?}");
    until_open_connections(&app, 0).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let db = TestDb::sqlite();
    // The idle timeout, not the header timeout, bounds the wait for the next request.
    let app = start(&db, 30, 1, 100).await;
    let mut tcp = connect(&app).await;
    tcp.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut tcp).await.status, 200);
    let took = closed_within(&mut tcp, Duration::from_secs(5)).await;
    assert!(took >= Duration::from_millis(800), "closed too early: {took:?}");
    until_open_connections(&app, 0).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_connection_outlives_the_header_timeout_while_idle() {
    let db = TestDb::sqlite();
    let app = start(&db, 1, 30, 100).await;
    let mut tcp = connect(&app).await;
    tcp.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut tcp).await.status, 200);
    // Twice the header timeout between two requests on the same connection.
    tokio::time::sleep(Duration::from_secs(2)).await;
    tcp.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut tcp).await.status, 200);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_cap_a_client_is_answered_at_once_and_served_once_a_slot_frees() {
    let db = TestDb::sqlite();
    let app = start(&db, 2, 60, 20).await;
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(connect(&app).await);
    }
    until_open_connections(&app, 20).await;

    // The 21st connection: a 503 in the gateway's shape at once, then closed.
    let started = Instant::now();
    let r = exchange(&app, MODELS).await;
    r.assert_gateway_error(503, "too_many_connections");
    assert!(r.header("retry-after").is_some(), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    // An HTTP client gets the same answer, fast.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let url = format!("{}/readyz", app.address);
    let started = Instant::now();
    let r = client.get(&url).send().await.expect("an answer, not a hang");
    assert_eq!(r.status(), 503);
    assert!(started.elapsed() < Duration::from_secs(1));

    // The silent connections reach their header timeout; then a request gets through.
    until_open_connections(&app, 0).await;
    let r = client.get(&url).send().await.expect("request");
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "ready");
    drop(silent);
    until_open_connections(&app, 0).await;
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("aigw_client_connections_refused_total 2"),
        "{metrics}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_too_large_are_a_431_in_the_gateway_shape() {
    let db = TestDb::sqlite();
    let app = spawn_app(&db, Setup::default()).await;
    let big = "a".repeat(20 * 1024);
    let request = format!("GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Big: {big}\r\n\r\n");
    let r = exchange(&app, request.as_bytes()).await;
    r.assert_gateway_error(431, "request_header_too_large");
    assert_eq!(r.header("connection"), Some("close"));
    // DESIGN.md §7, §11: every response carries its own `x-request-id`, protocol refusals too.
    let id = r.request_id();
    assert_ne!(
        exchange(&app, request.as_bytes()).await.request_id(),
        id,
        "a fresh id each time"
    );
    // Just under the limit is served.
    let fits = "a".repeat(12 * 1024);
    let request = format!("GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Big: {fits}\r\n\r\n");
    assert_eq!(exchange(&app, request.as_bytes()).await.status, 200);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_a_400_in_the_gateway_shape() {
    let db = TestDb::sqlite();
    let app = spawn_app(&db, Setup::default()).await;
    let cases: &[(&str, &[u8])] = &[
        (
            "header line without a colon",
            b"GET /healthz HTTP/1.1\r\nHost: gw\r\nNo colon here\r\n\r\n",
        ),
        (
            "Content-Length: abc",
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: abc\r\n\r\n{}",
        ),
        (
            "two conflicting Content-Lengths",
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        ),
        ("bad request line", b"GET\r\n\r\n"),
    ];
    for (what, request) in cases {
        let r = exchange(&app, request).await;
        assert_eq!(r.status, 400, "{what}: {r:?}");
        r.assert_gateway_error(400, "invalid_request_error");
        assert_eq!(r.header("connection"), Some("close"), "{what}");
        r.request_id();
    }
    // The connection that follows is served as usual.
    assert_eq!(exchange(&app, HEALTHZ).await.status, 200);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_is_a_405_with_allow_in_the_gateway_shape() {
    let db = TestDb::sqlite();
    let app = spawn_app(&db, Setup::default()).await;
    for (method, path, allow) in [
        ("GET", "/v1/chat/completions", "POST"),
        ("DELETE", "/v1/models", "GET,HEAD"),
        ("POST", "/healthz", "GET,HEAD"),
        ("GET", "/admin/v1/auth/login", "POST"),
    ] {
        let r = app
            .client
            .request(method.parse().unwrap(), format!("{}{path}", app.address))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405, "{method} {path}");
        assert_eq!(r.headers()["x-aigw-error-source"], "gateway", "{method} {path}");
        assert_eq!(r.headers()["allow"], allow, "{method} {path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(
            body["error"]["code"], "method_not_allowed",
            "{method} {path}: {body}"
        );
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_redirects_to_the_console() {
    let db = TestDb::sqlite();
    let app = spawn_app(&db, Setup::default()).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for method in [reqwest::Method::GET, reqwest::Method::HEAD] {
        let r = client
            .request(method.clone(), format!("{}/", app.address))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 307, "{method}");
        assert_eq!(r.headers()["location"], "/console/", "{method}");
    }
    // A console file that does not exist is a refusal like any other.
    let r = app.get("/console/no-such-file.js").await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["x-aigw-error-source"], "gateway");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_without_tls_is_served_and_its_idle_connection_closed() {
    let db = TestDb::sqlite();
    let app = start(&db, 30, 1, 100).await;
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let r = client
        .get(format!("{}/healthz", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.text().await.unwrap(), "ok");
    let r = client
        .get(format!("{}/v1/chat/completions", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["x-aigw-error-source"], "gateway");
    // The client keeps its connection; the gateway's idle timeout ends it.
    until_open_connections(&app, 0).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_finishes_running_requests_and_waits_for_no_idle_client() {
    use aigw::mock_upstream::{MockUpstream, Script};
    use futures::StreamExt;

    let db = TestDb::sqlite();
    let mock = MockUpstream::start().await.unwrap();
    // Default client bounds (30 s for a head, 75 s idle): the stop must not wait for them.
    let app = spawn_app(&db, Setup::resources(crate::proxy::resources(&mock))).await;
    mock.script(Script::any().chunk_delay(300).words(3));
    let body = serde_json::json!({"model": "gpt-4o-mini", "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    let running = app
        .post_json("/v1/chat/completions", crate::proxy::KEY, &body)
        .await;
    assert_eq!(running.status(), 200);

    let mut idle = connect(&app).await;
    idle.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut idle).await.status, 200);
    let mut half_head = connect(&app).await;
    half_head
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n")
        .await
        .unwrap();
    until_open_connections(&app, 3).await;

    let started = Instant::now();
    let stopped = tokio::spawn(app.stop());
    let mut stream = running.bytes_stream();
    let mut text = Vec::new();
    while let Some(chunk) = stream.next().await {
        text.extend_from_slice(&chunk.expect("the running stream is not cut"));
    }
    assert!(String::from_utf8_lossy(&text).contains("data: [DONE]"));
    closed_within(&mut idle, Duration::from_secs(5)).await;
    closed_within(&mut half_head, Duration::from_secs(5)).await;
    tokio::time::timeout(Duration::from_secs(10), stopped)
        .await
        .expect("the stop did not wait for the client bounds")
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// A stopping gateway closes its listener at once: while running requests drain, a new client is
/// refused (and can go to another replica) instead of waiting in the listen backlog until the
/// process exits and then being reset, not knowing whether its request was served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_gateway_refuses_new_connections_while_it_drains() {
    use aigw::mock_upstream::{MockUpstream, Script};
    use futures::StreamExt;

    let db = TestDb::sqlite();
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(crate::proxy::resources(&mock))).await;
    // A stream of about three seconds keeps the stop draining.
    mock.script(Script::any().chunk_delay(300).words(10));
    let body = serde_json::json!({"model": "gpt-4o-mini", "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    let running = app
        .post_json("/v1/chat/completions", crate::proxy::KEY, &body)
        .await;
    assert_eq!(running.status(), 200);
    let addr = app.address.trim_start_matches("http://").to_owned();

    let stopped = tokio::spawn(app.stop());
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match TcpStream::connect(&addr).await {
            // Refused; or reset, when the connect raced the listener's close.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                break;
            }
            Err(e) => panic!("connect failed otherwise than refused: {e}"),
            Ok(_) => {
                assert!(
                    Instant::now() < deadline,
                    "1 s after the stop a new connection was still taken into the listen backlog"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    let mut stream = running.bytes_stream();
    let mut text = Vec::new();
    while let Some(chunk) = stream.next().await {
        text.extend_from_slice(&chunk.expect("the running stream is not cut"));
    }
    assert!(String::from_utf8_lossy(&text).contains("data: [DONE]"));
    tokio::time::timeout(Duration::from_secs(10), stopped)
        .await
        .expect("the stop finished")
        .unwrap();
}

/// Liveness never depends on the proxy's cap (issue 40 item 11): at the cap `/healthz` is still
/// 200 (a liveness probe must not restart a gateway that is only busy), anything else 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_healthz_still_answers_200() {
    let db = TestDb::sqlite();
    let app = start(&db, 5, 60, 2).await;
    let silent = [connect(&app).await, connect(&app).await];
    until_open_connections(&app, 2).await;
    let r = exchange(&app, HEALTHZ).await;
    assert_eq!((r.status, r.body.as_slice()), (200, b"ok".as_slice()), "{r:?}");
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    assert!(r.header("x-request-id").is_some(), "{r:?}");
    // HEAD: the same head, no body, then the close.
    let mut tcp = connect(&app).await;
    tcp.write_all(b"HEAD /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await
        .unwrap();
    let mut head = Vec::new();
    while read_some(&mut tcp, &mut head, Instant::now() + Duration::from_secs(5)).await > 0 {}
    let head = String::from_utf8_lossy(&head);
    assert!(
        head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"),
        "{head}"
    );
    exchange(&app, MODELS)
        .await
        .assert_gateway_error(503, "too_many_connections");
    exchange(&app, b"GET /readyz HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await
        .assert_gateway_error(503, "too_many_connections");
    exchange(&app, b"GET /healthzz HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await
        .assert_gateway_error(503, "too_many_connections");
    drop(silent);
    app.stop().await;
}

/// Past the cap every client gets an answer, however many over-cap connections are waiting for
/// theirs: beyond the answers in progress at once, the next connections wait in the listen
/// backlog for their turn instead of being closed unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_past_the_cap_leaves_no_client_unanswered() {
    let db = TestDb::sqlite();
    let app = start(&db, 10, 60, 1).await;
    let _in = connect(&app).await;
    until_open_connections(&app, 1).await;
    // More silent over-cap connections than the answers kept in progress at once (256), each
    // holding its place until the 2 s the gateway waits for its request.
    let mut flood = Vec::new();
    for _ in 0..300 {
        flood.push(connect(&app).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let (models, health) = tokio::join!(exchange(&app, MODELS), exchange(&app, HEALTHZ));
    models.assert_gateway_error(503, "too_many_connections");
    assert_eq!(health.status, 200, "{health:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered after {:?}",
        started.elapsed()
    );
    drop(flood);
    app.stop().await;
}

/// The admin listener has a cap of its own: a proxy at its cap leaves the console, the admin API
/// and the metrics reachable, and a flood of the admin listener leaves the proxy alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_has_a_connection_cap_of_its_own() {
    let db = TestDb::sqlite();
    let setup = Setup {
        settings: Box::new(|s| {
            s.client_header_timeout_secs = 5;
            s.max_client_connections = 2;
            s.max_admin_connections = 3;
            s.admin_listen = Some("127.0.0.1:0".parse().unwrap());
        }),
        ..Setup::default()
    };
    let app = spawn_app(&db, setup).await;
    let admin = app.admin_address.clone().expect("admin listener");
    let admin_addr = admin.trim_start_matches("http://");
    let proxy_flood = [connect(&app).await, connect(&app).await];
    until_open_connections(&app, 2).await;
    let metrics = b"GET /metrics HTTP/1.1\r\nHost: gw\r\n\r\n";
    let r = exchange_at(admin_addr, metrics).await;
    assert_eq!(
        r.status, 200,
        "the proxy's cap is not the admin listener's: {r:?}"
    );
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert!(text.contains("aigw_client_connections 2"), "{text}");
    assert!(text.contains("aigw_admin_connections 1"), "{text}");

    let deadline = Instant::now() + Duration::from_secs(10);
    while app.state.admin_connections.open() > 0 {
        assert!(Instant::now() < deadline, "the metrics connection stayed open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut admin_flood = Vec::new();
    for _ in 0..3 {
        admin_flood.push(TcpStream::connect(admin_addr).await.unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.state.admin_connections.open() < 3 {
        assert!(Instant::now() < deadline, "the admin flood was not taken");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    exchange_at(admin_addr, metrics)
        .await
        .assert_gateway_error(503, "too_many_connections");
    assert_eq!(exchange_at(admin_addr, HEALTHZ).await.status, 200);
    drop(proxy_flood);
    until_open_connections(&app, 0).await;
    assert_eq!(exchange(&app, HEALTHZ).await.status, 200);
    drop(admin_flood);
    app.stop().await;
}

/// A request whose body comes after the gateway's answer: refused before its body was read
/// (hyper then closes the connection), the answer says `Connection: close`, so a client with a
/// connection pool does not send its next request on the closed connection; a request whose body
/// was read keeps its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_before_the_body_is_read_says_the_connection_closes() {
    let db = TestDb::sqlite();
    let app = start(&db, 10, 60, 100).await;
    let body = r#"{"model":"m","messages":[]}"#;
    let refused_unread: &[(&str, &str, u16, &str)] = &[
        (
            "/v1/chat/completions",
            "Authorization: Bearer sk-aigw-0000000000000000000000000000bad0\r\n",
            401,
            "invalid_api_key",
        ),
        ("/admin/v1/departments", "", 401, "invalid_token"),
    ];
    for (path, auth, status, code) in refused_unread {
        let mut tcp = connect(&app).await;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: gw\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        // The answer comes before the body is sent.
        let answer = read_response(&mut tcp).await;
        answer.assert_gateway_error(*status, code);
        assert_eq!(answer.header("connection"), Some("close"), "{path}: {answer:?}");
        let _ = tcp.write_all(body.as_bytes()).await;
        closed_within(&mut tcp, Duration::from_secs(5)).await;
    }
    // The body read: the connection is kept for the next request.
    let mut tcp = connect(&app).await;
    let login = r#"{"email":"nobody@example.com","password":"wrong-password"}"#;
    let head = format!(
        "POST /admin/v1/auth/login HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{login}",
        login.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let answer = read_response(&mut tcp).await;
    assert_eq!(answer.status, 401, "{answer:?}");
    assert_eq!(answer.header("connection"), None, "{answer:?}");
    tcp.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut tcp).await.status, 200);
    app.stop().await;
}
