//! The upstream HTTP client: hyper-util's pooled client, HTTP/1.1 or HTTP/2 as TLS's ALPN
//! negotiates (rustls with the webpki roots), so the request path pays for no URL re-parsing,
//! redirect or retry layer of its own: dispatch is the one retry layer, and an upstream's
//! redirect is passed back as its answer. When the environment names an outbound proxy
//! (`HTTPS_PROXY`, `HTTP_PROXY` or `ALL_PROXY`, in either case), requests go through reqwest
//! instead, which honours those variables and `NO_PROXY`.

use std::fmt;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::{ConfigBuilderExt, HttpsConnector};
use hyper_util::client::legacy::Client as Pooled;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// An upstream's response; its body is read, or streamed, by the caller.
pub type Response = http::Response<Body>;

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an idle connection is kept (by either client).
pub const IDLE_FOR: Duration = Duration::from_secs(90);
/// The variables that name an outbound proxy.
const PROXY_VARS: [&str; 6] = [
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// The client every upstream request goes out on; cheap to clone (the pool is shared).
#[derive(Clone)]
#[expect(
    clippy::large_enum_variant,
    reason = "one client per process, used in place; a box would add an indirection per request"
)]
pub enum Client {
    /// Straight to the upstream.
    Direct(Pooled<HttpsConnector<HttpConnector>, Full<Bytes>>),
    /// Through the outbound proxy the environment names.
    Proxied(reqwest::Client),
}

/// A request that got no response: what went wrong, and with which host (no URL, no secret).
#[derive(Debug)]
pub struct SendError {
    kind: &'static str,
    host: Option<String>,
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Some(host) => write!(f, "{} ({host})", self.kind),
            None => f.write_str(self.kind),
        }
    }
}

impl Client {
    /// The client this process uses: proxied when the environment names a proxy.
    pub fn from_env() -> Result<Client, String> {
        if proxy_named(|k| std::env::var_os(k).filter(|v| !v.is_empty()).is_some()) {
            Client::proxied(None)
        } else {
            Ok(Client::direct())
        }
    }

    /// Straight to the upstream, on a shared connection pool, trusting the webpki roots.
    pub fn direct() -> Client {
        let tls = rustls::ClientConfig::builder()
            .with_webpki_roots()
            .with_no_client_auth();
        Client::direct_with(tls)
    }

    /// Straight to the upstream, with `tls` (its ALPN offers are set here).
    fn direct_with(tls: rustls::ClientConfig) -> Client {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_all_versions()
            .wrap_connector(http);
        let client = Pooled::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE_FOR)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            // Only a request that a reused connection failed before it was written goes out once
            // more (on another connection): it never reached the upstream.
            .retry_canceled_requests(true)
            .build(https);
        Client::Direct(client)
    }

    /// Through reqwest: via `proxy` when given, else via the proxy the environment names.
    pub fn proxied(proxy: Option<&str>) -> Result<Client, String> {
        let mut b = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(IDLE_FOR)
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none());
        if let Some(p) = proxy {
            b = b.proxy(reqwest::Proxy::all(p).map_err(|e| format!("bad proxy URL: {e}"))?);
        }
        b.build()
            .map(Client::Proxied)
            .map_err(|e| format!("cannot build the HTTP client: {e}"))
    }

    /// Sends `req` and waits for the response's head.
    pub async fn send(&self, req: http::Request<Bytes>) -> Result<Response, SendError> {
        // The authority is shared bytes: the host is copied out only when the request failed.
        let authority = req.uri().authority().cloned();
        let sent = match self {
            Client::Direct(c) => c
                .request(req.map(Full::new))
                .await
                .map(|r| r.map(Body::new))
                .map_err(|e| {
                    let timed_out = source_chain(&e).any(|s| {
                        s.downcast_ref::<std::io::Error>()
                            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
                    });
                    failure(timed_out, e.is_connect())
                }),
            Client::Proxied(c) => match reqwest::Request::try_from(req) {
                Ok(req) => c
                    .execute(req)
                    .await
                    .map(|r| http::Response::from(r).map(Body::new))
                    .map_err(|e| failure(e.is_timeout(), e.is_connect())),
                Err(_) => Err("request failed"),
            },
        };
        sent.map_err(|kind| SendError {
            kind,
            host: authority.map(|a| a.host().to_owned()),
        })
    }
}

/// What a request that got no response ran into, in the words of the request log.
fn failure(timed_out: bool, connect: bool) -> &'static str {
    if timed_out {
        "timed out"
    } else if connect {
        "connection failed"
    } else {
        "request failed"
    }
}

/// A copy of `req`, for a retry (the body is shared bytes).
pub fn duplicate(req: &http::Request<Bytes>) -> http::Request<Bytes> {
    let mut copy = http::Request::new(req.body().clone());
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.headers_mut() = req.headers().clone();
    copy
}

/// Whether any proxy variable is set, as `is_set` tells.
fn proxy_named(is_set: impl Fn(&str) -> bool) -> bool {
    PROXY_VARS.iter().any(|k| is_set(k))
}

fn source_chain<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |&e| e.source())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_proxy_variable_in_either_case_selects_the_proxied_client() {
        let cases: &[(&[&str], bool)] = &[
            (&[], false),
            (&["NO_PROXY"], false),
            (&["HTTPS_PROXY"], true),
            (&["https_proxy"], true),
            (&["HTTP_PROXY"], true),
            (&["all_proxy"], true),
        ];
        for (set, proxied) in cases {
            assert_eq!(proxy_named(|k| set.contains(&k)), *proxied, "{set:?}");
        }
    }

    #[test]
    fn send_error_names_the_host_only() {
        let e = SendError {
            kind: "connection failed",
            host: Some("api.example.com".into()),
        };
        assert_eq!(e.to_string(), "connection failed (api.example.com)");
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connection_failure() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let req = http::Request::post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
            .body(Bytes::new())
            .unwrap();
        for client in [Client::direct(), Client::proxied(None).unwrap()] {
            let e = client.send(duplicate(&req)).await.unwrap_err();
            assert_eq!(e.to_string(), "connection failed (127.0.0.1)");
        }
    }

    /// The proxied client goes through the proxy it is given: a relay that counts connections.
    #[tokio::test]
    async fn the_proxied_client_goes_through_the_proxy() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::net::{TcpListener, TcpStream};

        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream_addr = upstream.local_addr().unwrap();
        let app = axum::Router::new().route("/v1/ping", axum::routing::post(|| async { "pong" }));
        tokio::spawn(async move { axum::serve(upstream, app).await });

        let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay_addr = relay.local_addr().unwrap();
        let relayed = Arc::new(AtomicUsize::new(0));
        let count = relayed.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = relay.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let mut server = TcpStream::connect(upstream_addr).await.unwrap();
                tokio::spawn(async move { tokio::io::copy_bidirectional(&mut client, &mut server).await });
            }
        });

        let client = Client::proxied(Some(&format!("http://{relay_addr}"))).unwrap();
        let req = http::Request::post(format!("http://{upstream_addr}/v1/ping"))
            .body(Bytes::from_static(b"{}"))
            .unwrap();
        let resp = client.send(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let body = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap();
        assert_eq!(body.to_bytes(), "pong");
        assert_eq!(relayed.load(Ordering::SeqCst), 1);
    }

    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Answers each request with its version, target, path and host; `/endless` with a body that
    /// never ends.
    async fn answer(
        req: http::Request<Incoming>,
    ) -> Result<http::Response<axum::body::Body>, std::convert::Infallible> {
        if req.uri().path() == "/endless" {
            let chunk = futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from("a")) });
            let endless = futures::StreamExt::chain(chunk, futures::stream::pending());
            return Ok(http::Response::new(axum::body::Body::from_stream(endless)));
        }
        let host = req
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("-");
        let text = format!("{:?} {} {} {host}", req.version(), req.uri(), req.uri().path());
        Ok(http::Response::new(text.into()))
    }

    /// An HTTP/1.1 upstream that answers with [`answer`] and counts connections.
    async fn upstream() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), hyper::service::service_fn(answer)),
                );
            }
        });
        (addr, accepted)
    }

    /// A raw upstream that counts connections and answers each request on a connection with
    /// `answer`; with `keep_open` false, closes the connection after the first.
    async fn raw_upstream(
        answer: &'static [u8],
        keep_open: bool,
    ) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = tcp.read(&mut buf).await {
                        if n == 0 || tcp.write_all(answer).await.is_err() || !keep_open {
                            break;
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    async fn get(client: &Client, url: &str) -> String {
        let req = http::Request::post(url).body(Bytes::new()).unwrap();
        let Ok(resp) = client.send(req).await else {
            panic!("no response from {url}");
        };
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn requests_go_out_in_origin_form_and_reuse_the_connection() {
        let (addr, accepted) = upstream().await;
        let client = Client::direct();
        for path in ["/v1/a?x=1", "/v1/b"] {
            let got = get(&client, &format!("http://{addr}{path}")).await;
            let bare = path.split('?').next().unwrap();
            assert_eq!(got, format!("HTTP/1.1 {path} {bare} {addr}"));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    /// A pooled connection that the upstream closed while it was idle is not used: the request
    /// goes out on a new one and succeeds.
    #[tokio::test]
    async fn a_connection_closed_while_idle_is_replaced() {
        // Each connection answers one request and then closes, without saying so in a header.
        let (addr, accepted) = raw_upstream(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", false).await;
        let client = Client::direct();
        for _ in 0..3 {
            assert_eq!(get(&client, &format!("http://{addr}/")).await, "ok");
            // Let the close arrive.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    /// What the upstream's answer does to the connection: one it keeps open carries the next
    /// request, one it said it closes does not; a chunked body arrives whole.
    #[tokio::test]
    async fn the_answer_decides_whether_the_connection_is_kept() {
        let cases: &[(&[u8], &str, usize)] = &[
            (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", "ok", 1),
            (
                b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
                "ok",
                2,
            ),
            (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", "ok", 2),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
                "abcde",
                1,
            ),
        ];
        for (answer, body, connections) in cases {
            let (addr, accepted) = raw_upstream(answer, true).await;
            let client = Client::direct();
            for _ in 0..2 {
                assert_eq!(get(&client, &format!("http://{addr}/")).await, *body);
            }
            let answer = String::from_utf8_lossy(answer);
            assert_eq!(accepted.load(Ordering::SeqCst), *connections, "{answer}");
        }
    }

    /// A response that is not HTTP is a failed request, not a hang or a panic.
    #[tokio::test]
    async fn a_garbled_answer_is_a_failed_request() {
        let (addr, _) = raw_upstream(b"SSH-2.0-OpenSSH_9.2\r\n", true).await;
        let req = http::Request::post(format!("http://{addr}/"))
            .body(Bytes::new())
            .unwrap();
        let e = Client::direct().send(req).await.unwrap_err();
        assert_eq!(e.to_string(), "request failed (127.0.0.1)");
    }

    /// A body dropped before its end (the client went away mid-stream) does not leave its
    /// connection to the next request.
    #[tokio::test]
    async fn a_body_dropped_midway_does_not_hold_up_the_next_request() {
        let (addr, accepted) = upstream().await;
        let client = Client::direct();
        let req = http::Request::post(format!("http://{addr}/endless"))
            .body(Bytes::new())
            .unwrap();
        let Ok(resp) = client.send(req).await else {
            panic!("no response");
        };
        let mut body = resp.into_body();
        assert!(body.frame().await.is_some());
        drop(body);
        let next = format!("http://{addr}/x");
        let got = tokio::time::timeout(Duration::from_secs(5), get(&client, &next)).await;
        assert!(got.expect("the next request was held up").contains(" /x "));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_url_without_a_host_is_a_failed_request() {
        let req = http::Request::post("/v1/chat").body(Bytes::new()).unwrap();
        let e = Client::direct().send(req).await.unwrap_err();
        assert_eq!(e.to_string(), "request failed");
    }

    /// Over TLS the client offers HTTP/2 and HTTP/1.1 (ALPN) and speaks what the upstream
    /// chose; on HTTP/2 concurrent requests share one connection.
    #[tokio::test]
    async fn over_tls_the_upstream_chooses_http2_or_http1() {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.cert.der().clone()).unwrap();
        // (the upstream's ALPN protocols, the version spoken, whether requests share a connection)
        for (offered, version, shared) in [
            (&[&b"h2"[..], b"http/1.1"][..], "HTTP/2.0", true),
            (&[&b"http/1.1"[..]][..], "HTTP/1.1", false),
        ] {
            let mut tls = rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_single_cert(
                    vec![cert.cert.der().clone()],
                    rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into()),
                )
                .unwrap();
            tls.alpn_protocols = offered.iter().map(|p| p.to_vec()).collect();
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let accepted = Arc::new(AtomicUsize::new(0));
            let count = accepted.clone();
            tokio::spawn(async move {
                while let Ok((tcp, _)) = listener.accept().await {
                    count.fetch_add(1, Ordering::SeqCst);
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        let tls = acceptor.accept(tcp).await.unwrap();
                        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                        let io = TokioIo::new(tls);
                        let svc = hyper::service::service_fn(answer);
                        if h2 {
                            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                .serve_connection(io, svc)
                                .await
                        } else {
                            hyper::server::conn::http1::Builder::new()
                                .serve_connection(io, svc)
                                .await
                        }
                    });
                }
            });

            let client = Client::direct_with(
                rustls::ClientConfig::builder()
                    .with_root_certificates(roots.clone())
                    .with_no_client_auth(),
            );
            let url = format!("https://localhost:{port}/v1/chat");
            // The first request settles the protocol; the next ones go out at once.
            assert!(get(&client, &url).await.starts_with(version));
            let (a, b) = tokio::join!(
                client.send(http::Request::post(&url).body(Bytes::new()).unwrap()),
                client.send(http::Request::post(&url).body(Bytes::new()).unwrap()),
            );
            let mut bodies = Vec::new();
            for resp in [a, b] {
                let resp = resp.unwrap_or_else(|e| panic!("{e}"));
                // Hold both responses' bodies open, so HTTP/1.1 needs a connection per request.
                bodies.push(resp.into_body());
            }
            for body in bodies {
                let text = body.collect().await.unwrap().to_bytes();
                assert!(text.starts_with(version.as_bytes()), "{text:?}");
            }
            let connections = accepted.load(Ordering::SeqCst);
            assert_eq!(connections == 1, shared, "{version}: {connections} connections");
        }
    }
}
