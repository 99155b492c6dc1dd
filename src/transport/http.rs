//! The upstream HTTP client. Requests go out over HTTP/2 where an upstream offers it over TLS,
//! else over HTTP/1.1 on pooled connections that the request's own task drives
//! ([`conns`](super::conns); rustls with the webpki roots), so the
//! request path pays for no URL re-parsing, redirect or retry layer: dispatch is the one retry
//! layer, and an upstream's redirect is passed back as its answer. When the environment names an
//! outbound proxy (`HTTPS_PROXY`, `HTTP_PROXY` or `ALL_PROXY`, in either case), requests go
//! through reqwest instead, which honours those variables and `NO_PROXY`. Each serving thread
//! gets a pool of its own ([`use_own_pool`]), so its connections are registered with its own
//! runtime and never wake another thread.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;

use super::conns::{Failure, HostCaps, IDLE_FOR, Pool};

/// An upstream's response; its body is read, or streamed, by the caller.
pub type Response = http::Response<Body>;

/// A certificate authority an operator adds to the public ones (DER).
pub type Ca = rustls::pki_types::CertificateDer<'static>;

/// The certificates of the PEM file `path`, for `upstream_ca_file`: an error names the file
/// when it cannot be read or holds no certificate.
pub fn read_cas(path: &std::path::Path) -> Result<Vec<Ca>, String> {
    use rustls::pki_types::pem::PemObject;
    let bad = |why: String| format!("bad setting upstream_ca_file ({}): {why}", path.display());
    let cas = Ca::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if cas.is_empty() {
        return Err(bad("no PEM certificate in the file".into()));
    }
    for ca in &cas {
        rustls::RootCertStore::empty()
            .add(ca.clone())
            .map_err(|e| bad(format!("not a usable CA certificate: {e}")))?;
    }
    Ok(cas)
}

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
pub enum Client {
    /// Straight to the upstream.
    Direct(Arc<Pool>),
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
    /// The client this process uses: proxied when the environment names a proxy. A connection
    /// that does not open within `connect_timeout` fails (the request fails over); at most
    /// `per_host` HTTP/1.1 requests are in flight to one upstream (direct connections).
    /// TLS connections trust the public roots and `own_cas`.
    pub fn from_env(connect_timeout: Duration, per_host: usize, own_cas: &[Ca]) -> Result<Client, String> {
        if proxy_named(|k| std::env::var_os(k).filter(|v| !v.is_empty()).is_some()) {
            Client::proxied(None, connect_timeout, own_cas)
        } else {
            Ok(Client::direct(connect_timeout, per_host, own_cas))
        }
    }

    /// Straight to the upstream, on a shared connection pool: HTTP/2 where the upstream offers
    /// it over TLS, else HTTP/1.1 with a connection driven by the one request that uses it, at
    /// most `per_host` in use per upstream.
    pub fn direct(connect_timeout: Duration, per_host: usize, own_cas: &[Ca]) -> Client {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        let tls = hyper_rustls::HttpsConnectorBuilder::new();
        let tls = if own_cas.is_empty() {
            tls.with_webpki_roots()
        } else {
            let mut roots = rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            };
            roots.add_parsable_certificates(own_cas.iter().cloned());
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            tls.with_tls_config(
                rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .expect("ring supports the default protocol versions")
                    .with_root_certificates(roots)
                    .with_no_client_auth(),
            )
        };
        let https = tls.https_or_http().enable_all_versions().wrap_connector(http);
        Client::Direct(Arc::new(Pool::new(
            https,
            connect_timeout,
            Arc::new(HostCaps::new(per_host)),
        )))
    }

    /// Through reqwest: via `proxy` when given, else via the proxy the environment names.
    pub fn proxied(proxy: Option<&str>, connect_timeout: Duration, own_cas: &[Ca]) -> Result<Client, String> {
        let mut b = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .pool_idle_timeout(IDLE_FOR)
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none());
        for ca in own_cas {
            let ca = reqwest::Certificate::from_der(ca).map_err(|e| format!("bad CA certificate: {e}"))?;
            b = b.add_root_certificate(ca);
        }
        if let Some(p) = proxy {
            b = b.proxy(reqwest::Proxy::all(p).map_err(|e| format!("bad proxy URL: {e}"))?);
        }
        b.build()
            .map(Client::Proxied)
            .map_err(|e| format!("cannot build the HTTP client: {e}"))
    }

    /// A client of the same kind with a pool of its own (a proxied client shares its pool).
    fn fresh(&self) -> Client {
        match self {
            Client::Direct(pool) => Client::Direct(Arc::new(pool.fresh())),
            Client::Proxied(c) => Client::Proxied(c.clone()),
        }
    }

    /// Sends `req` and waits for the response's head, on this thread's own pool if it has one.
    pub async fn send(&self, req: http::Request<Bytes>) -> Result<Response, SendError> {
        // The authority is shared bytes: the host is copied out only when the request failed.
        let authority = req.uri().authority().cloned();
        let pending = OWN.with(|own| own.get().unwrap_or(self).start(req));
        pending.await.map_err(|kind| SendError {
            kind,
            host: authority.map(|a| a.host().to_owned()),
        })
    }

    /// Starts sending `req`; the future owns what it needs.
    fn start(
        &self,
        req: http::Request<Bytes>,
    ) -> impl Future<Output = Result<Response, &'static str>> + use<> {
        let pending = match self {
            Client::Direct(pool) => Pending::Direct(Box::pin(pool.clone().send(req))),
            Client::Proxied(c) => match reqwest::Request::try_from(req) {
                Ok(req) => Pending::Proxied(Box::pin(c.execute(req))),
                Err(_) => Pending::Invalid,
            },
        };
        async move {
            match pending {
                Pending::Direct(f) => f.await.map_err(|e| match e {
                    Failure::Connect(e) => {
                        let timed_out = source_chain(&*e).any(|s| {
                            s.downcast_ref::<std::io::Error>()
                                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
                        });
                        // A refused certificate, say (rustls' own error, wrapped in I/O errors).
                        let tls = source_chain(&*e).any(|s| s.is::<rustls::Error>());
                        if tls {
                            "TLS handshake failed"
                        } else {
                            failure(timed_out, true)
                        }
                    }
                    Failure::Send(e) => failure(e.is_timeout(), false),
                    Failure::BadUrl => "request failed",
                }),
                Pending::Proxied(f) => f
                    .await
                    .map(|r| http::Response::from(r).map(Body::new))
                    .map_err(|e| failure(e.is_timeout(), e.is_connect())),
                Pending::Invalid => Err("request failed"),
            }
        }
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

/// A request on its way.
enum Pending {
    Direct(std::pin::Pin<Box<dyn Future<Output = Result<Response, Failure>> + Send>>),
    Proxied(std::pin::Pin<Box<dyn Future<Output = reqwest::Result<reqwest::Response>> + Send>>),
    Invalid,
}

thread_local! {
    /// The calling thread's own client, when it has one.
    static OWN: std::cell::OnceCell<Client> = const { std::cell::OnceCell::new() };
}

/// Gives the calling thread a client of `shared`'s kind with its own connection pool. A serving
/// thread calls this once: the connections its requests open are then registered with its own
/// runtime, and its pool's lock is never contended.
pub fn use_own_pool(shared: &Client) {
    OWN.with(|own| {
        let _ = own.set(shared.fresh());
    });
}

/// A copy of `req` (the body is shared bytes), for tests that send one request twice.
#[cfg(test)]
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
    // An I/O error that wraps another names, as its source, the wrapped one's source: the
    // wrapped error itself comes next here.
    std::iter::successors(Some(e), |&e| {
        match e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        }
    })
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
        let connect = Duration::from_secs(5);
        for client in [
            Client::direct(connect, 64, &[]),
            Client::proxied(None, connect, &[]).unwrap(),
        ] {
            let e = client.send(duplicate(&req)).await.unwrap_err();
            assert_eq!(e.to_string(), "connection failed (127.0.0.1)");
        }
    }

    /// A connection the upstream never completes fails within the connect timeout, on either
    /// client: a listener whose accept queue is full answers no further handshake.
    #[tokio::test]
    async fn a_connection_that_does_not_open_in_time_fails_as_timed_out() {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(1).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut queued = Vec::new();
        while queued.len() < 16 {
            let connect = tokio::net::TcpStream::connect(addr);
            match tokio::time::timeout(Duration::from_millis(200), connect).await {
                Ok(Ok(tcp)) => queued.push(tcp),
                _ => break,
            }
        }
        assert!(queued.len() < 16, "the accept queue never filled");
        let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
            .body(Bytes::new())
            .unwrap();
        let connect = Duration::from_millis(300);
        for client in [
            Client::direct(connect, 64, &[]),
            Client::proxied(None, connect, &[]).unwrap(),
        ] {
            let started = std::time::Instant::now();
            let e = client.send(duplicate(&req)).await.unwrap_err();
            assert_eq!(e.to_string(), "timed out (127.0.0.1)");
            assert!(
                started.elapsed() < Duration::from_millis(900),
                "{:?}",
                started.elapsed()
            );
        }
        drop(listener);
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

        let client =
            Client::proxied(Some(&format!("http://{relay_addr}")), Duration::from_secs(5), &[]).unwrap();
        let req = http::Request::post(format!("http://{upstream_addr}/v1/ping"))
            .body(Bytes::from_static(b"{}"))
            .unwrap();
        let resp = client.send(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let body = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap();
        assert_eq!(body.to_bytes(), "pong");
        assert_eq!(relayed.load(Ordering::SeqCst), 1);
    }
}
