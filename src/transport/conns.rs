//! Upstream connections: HTTP/1.1 ones each driven by the task of the request that uses it;
//! HTTP/2, where the upstream offers it in the TLS handshake (ALPN), on shared connections with
//! a task each, as hyper drives them, at most [`MAX_STREAMS_PER_H2`] requests on each.
//! HTTP/1.1 connections in use are capped per upstream ([`HostCaps`]).
//!
//! hyper's pooled client runs every connection as a task of its own and passes the response
//! across through channels: each chunk of a streamed body costs a scheduler round of both tasks,
//! and the serving task re-polls its whole stack for it. Here the request's own task drives the
//! connection: while it waits for the head or for the next chunk it polls the connection itself,
//! so whatever the socket already holds is read in the same poll, and when the connection has
//! nothing more, nothing more has arrived.
//!
//! Between requests a connection waits in the pool, unpolled. It is polled once when it is
//! taken out, so one that the upstream closed meanwhile is dropped there; a request that a
//! pooled connection closed under before it was written goes out once more on a new one.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http_body::Frame;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::{Connection as _, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustc_hash::FxHashMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_service::Service;

/// How long an idle connection is kept (by this pool and by the proxied client's).
pub const IDLE_FOR: Duration = Duration::from_secs(90);
/// How often idle connections of every upstream are checked for age.
const SWEEP_EVERY: Duration = Duration::from_secs(30);
/// The most idle connections kept per upstream (by each serving thread's pool): after a burst
/// of thousands of streams, the rest are closed as they come back instead of holding a socket
/// and their buffers (about 20 KiB) for [`IDLE_FOR`]. A steady load reuses connections as they
/// come back and parks few at a time.
const MAX_IDLE_PER_UPSTREAM: usize = 256;
/// The most requests one HTTP/2 connection carries at once; past it another is opened. A
/// server announces its own limit of concurrent streams (RFC 9113 §6.5.2 recommends no fewer
/// than 100; 100 is common, hyper's server allows 200) and hyper queues a request beyond it on
/// that connection until one of its streams ends, which for a stream of completions can be
/// minutes. 100 stays within what servers commonly allow.
pub const MAX_STREAMS_PER_H2: usize = 100;

type Io = MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>;
type Conn = Pin<Box<http1::Connection<Io, Full<Bytes>>>>;
type Key = (Scheme, Authority);

/// Idle connections per upstream (scheme and authority), most recently used last.
pub struct Pool {
    connector: HttpsConnector<HttpConnector>,
    /// The most a new connection may take to open, TLS handshake included (the connector's
    /// own timeout covers the TCP connect only).
    connect_within: Duration,
    idle: Mutex<Idle>,
    /// The HTTP/2 connections of each upstream that negotiated it, shared by its requests.
    h2: Mutex<FxHashMap<Key, Http2Conns>>,
    /// The cap on HTTP/1.1 connections in use, shared with every pool made by [`Pool::fresh`].
    caps: Arc<HostCaps>,
}

/// At most `per_host` HTTP/1.1 requests in flight (so connections in use) per upstream, across
/// every serving thread's pool: past it a request waits for one to finish (within its own
/// deadline), so a burst cannot open thousands of sockets to one provider. An HTTP/2 upstream
/// multiplexes its requests on one connection and sets its own limit of concurrent streams.
pub struct HostCaps {
    per_host: usize,
    by_host: Mutex<FxHashMap<Key, Arc<Semaphore>>>,
}

impl HostCaps {
    /// A cap of `per_host` (at least 1).
    pub fn new(per_host: usize) -> HostCaps {
        HostCaps {
            per_host: per_host.clamp(1, Semaphore::MAX_PERMITS),
            by_host: Mutex::default(),
        }
    }

    /// A slot for one request to `key`'s upstream, waiting while they are all taken.
    async fn slot(&self, key: &Key) -> OwnedSemaphorePermit {
        let host = {
            let mut by_host = self.by_host.lock().unwrap_or_else(|e| e.into_inner());
            by_host
                .entry(key.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_host)))
                .clone()
        };
        match host.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => host.acquire_owned().await.expect("the semaphore is never closed"),
        }
    }
}

/// What a new connection turned out to be.
enum Link {
    Http1(Lease),
    Http2(http2::SendRequest<Full<Bytes>>, Stream),
}

/// An HTTP/2 upstream's connections.
#[derive(Default)]
struct Http2Conns {
    conns: Vec<Shared>,
    /// Held while another connection is opened because all are full (or closed): a burst waits
    /// for one new connection instead of opening one per request.
    opening: Arc<tokio::sync::Mutex<()>>,
}

/// Whether an upstream's HTTP/2 connections have room for a request.
enum Http2 {
    /// Not known to speak HTTP/2 (yet).
    Unknown,
    /// A place on one of them.
    Room(http2::SendRequest<Full<Bytes>>, Stream),
    /// Each is full or closed: whoever holds this opens the next.
    Full(Arc<tokio::sync::Mutex<()>>),
}

/// An HTTP/2 connection, shared by up to [`MAX_STREAMS_PER_H2`] requests at once.
struct Shared {
    sender: http2::SendRequest<Full<Bytes>>,
    in_flight: Arc<AtomicUsize>,
}

/// A request's place on a shared HTTP/2 connection, freed with its response body.
struct Stream(Arc<AtomicUsize>);

impl Stream {
    fn on(conn: &Shared) -> Stream {
        conn.in_flight.fetch_add(1, Ordering::Relaxed);
        Stream(conn.in_flight.clone())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Idle {
    by_upstream: FxHashMap<Key, Vec<Parked>>,
    swept: Option<Instant>,
    /// [`MAX_IDLE_PER_UPSTREAM`], smaller in tests.
    max_per_upstream: usize,
}

impl Default for Idle {
    fn default() -> Idle {
        Idle {
            by_upstream: FxHashMap::default(),
            swept: None,
            max_per_upstream: MAX_IDLE_PER_UPSTREAM,
        }
    }
}

/// An idle connection.
struct Parked {
    sender: http1::SendRequest<Full<Bytes>>,
    conn: Conn,
    since: Instant,
}

/// A connection in use: its request's response body drives it, and gives it back at the end.
struct Lease {
    pool: Arc<Pool>,
    key: Key,
    sender: http1::SendRequest<Full<Bytes>>,
    /// `None` once the connection has ended (closed or failed).
    conn: Option<Conn>,
}

/// Why a request got no response: at the connection, or after it.
pub enum Failure {
    /// No connection: refused, timed out, name or TLS failure.
    Connect(Box<dyn std::error::Error + Send + Sync>),
    /// Connected, but the exchange failed before a response's head.
    Send(hyper::Error),
    /// The URL has no scheme or host.
    BadUrl,
}

impl Pool {
    /// An empty pool that opens connections with `connector`, each within `connect_within`
    /// (TLS included), at most `caps` of them in use per upstream.
    pub fn new(
        connector: HttpsConnector<HttpConnector>,
        connect_within: Duration,
        caps: Arc<HostCaps>,
    ) -> Pool {
        Pool {
            connector,
            connect_within,
            idle: Mutex::new(Idle::default()),
            h2: Mutex::default(),
            caps,
        }
    }

    /// An empty pool that opens connections as this one does, under the same caps.
    pub fn fresh(&self) -> Pool {
        Pool::new(self.connector.clone(), self.connect_within, self.caps.clone())
    }

    /// Sends `req` (with an absolute URL) and waits for the response's head. The response's
    /// body drives the connection from then on.
    pub async fn send(self: Arc<Self>, req: http::Request<Bytes>) -> Result<http::Response<Body>, Failure> {
        let (mut parts, body) = req.into_parts();
        let (Some(scheme), Some(authority)) = (parts.uri.scheme().cloned(), parts.uri.authority().cloned())
        else {
            return Err(Failure::BadUrl);
        };
        let key = (scheme, authority);
        if let Some((h2, stream)) = self.http2_room(&key).await? {
            return send_h2(h2, stream, http::Request::from_parts(parts, Full::new(body))).await;
        }
        // HTTP/1.1 on the wire: the path alone, and the host in its header.
        let absolute = std::mem::take(&mut parts.uri);
        let path = absolute.path_and_query().map_or("/", |p| p.as_str());
        parts.uri = http::Uri::try_from(path).map_err(|_| Failure::BadUrl)?;
        if !parts.headers.contains_key(http::header::HOST) {
            let host = key.1.as_str().rsplit('@').next().unwrap_or_default();
            let host = http::HeaderValue::from_str(host).map_err(|_| Failure::BadUrl)?;
            parts.headers.insert(http::header::HOST, host);
        }
        let mut req = http::Request::from_parts(parts, Full::new(body));
        let slot = self.caps.slot(&key).await;
        loop {
            let (mut lease, reused) = match self.take(&key) {
                Some(lease) => (lease, true),
                // Boxed: the connect's state (TLS, both handshakes) is far larger than the rest
                // of a send, and moved with it on every request though it runs on few.
                None => match Box::pin(self.connect(key.clone())).await? {
                    Link::Http1(lease) => (lease, false),
                    // The upstream chose HTTP/2: the request goes out as such, in absolute form.
                    Link::Http2(h2, stream) => {
                        drop(slot);
                        *req.uri_mut() = absolute;
                        return send_h2(h2, stream, req).await;
                    }
                },
            };
            match lease.exchange(req).await {
                Ok(response) => {
                    return Ok(response.map(|body| {
                        Body::new(Driven {
                            body,
                            lease: Some(lease),
                            _slot: slot,
                        })
                    }));
                }
                // A pooled connection closed before the request went out: once more on a new one.
                Err(mut e) if reused && e.message().is_some() => {
                    req = e.take_message().expect("checked");
                }
                Err(e) => return Err(Failure::Send(e.into_error())),
            }
        }
    }

    /// A new connection to `key`'s upstream: HTTP/2 when the TLS handshake chose it (its
    /// connection then runs as a task of its own and is shared by the upstream's requests; this
    /// request is its first).
    async fn connect(self: &Arc<Self>, key: Key) -> Result<Link, Failure> {
        let uri = http::Uri::builder()
            .scheme(key.0.clone())
            .authority(key.1.clone())
            .path_and_query("/")
            .build()
            .map_err(|_| Failure::BadUrl)?;
        // An upstream that accepts the connection and then stalls the TLS handshake fails as a
        // connect that timed out, and the request fails over, instead of waiting out its deadline.
        let io = tokio::time::timeout(self.connect_within, self.connector.clone().call(uri))
            .await
            .map_err(|_| {
                let stalled =
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "connection not open in time");
                Failure::Connect(stalled.into())
            })?
            .map_err(Failure::Connect)?;
        if io.connected().is_negotiated_h2() {
            let (h2, conn) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .handshake(io)
                .await
                .map_err(|e| Failure::Connect(e.into()))?;
            tokio::spawn(conn);
            let shared = Shared {
                sender: h2.clone(),
                in_flight: Arc::default(),
            };
            let stream = Stream::on(&shared);
            self.h2
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(key)
                .or_default()
                .conns
                .push(shared);
            return Ok(Link::Http2(h2, stream));
        }
        let (sender, conn) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(|e| Failure::Connect(e.into()))?;
        Ok(Link::Http1(Lease {
            pool: self.clone(),
            key,
            sender,
            conn: Some(Box::pin(conn)),
        }))
    }

    /// For an upstream known to speak HTTP/2, a place for one request on one of its
    /// connections, opening another when each is full (one at a time per upstream, so a burst
    /// opens one per [`MAX_STREAMS_PER_H2`] requests). None for an upstream not known to, or no
    /// longer: it answered the new connection in HTTP/1.1.
    async fn http2_room(
        self: &Arc<Self>,
        key: &Key,
    ) -> Result<Option<(http2::SendRequest<Full<Bytes>>, Stream)>, Failure> {
        let opening = match self.http2_of(key) {
            Http2::Unknown => return Ok(None),
            Http2::Room(h2, stream) => return Ok(Some((h2, stream))),
            Http2::Full(opening) => opening,
        };
        let _turn = opening.lock().await;
        if let Http2::Room(h2, stream) = self.http2_of(key) {
            return Ok(Some((h2, stream)));
        }
        match Box::pin(self.connect(key.clone())).await? {
            Link::Http2(h2, stream) => Ok(Some((h2, stream))),
            Link::Http1(_closed_unused) => {
                self.h2.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
                Ok(None)
            }
        }
    }

    /// Whether `key`'s upstream has an HTTP/2 connection with room, taking a place on it if so.
    /// Closed connections are forgotten here, and all idle ones but one: after a burst, the
    /// connections it opened close as their streams end.
    fn http2_of(&self, key: &Key) -> Http2 {
        let mut h2 = self.h2.lock().unwrap_or_else(|e| e.into_inner());
        let Some(upstream) = h2.get_mut(key) else {
            return Http2::Unknown;
        };
        let mut one_idle = false;
        upstream.conns.retain(|c| {
            let idle = c.in_flight.load(Ordering::Relaxed) == 0;
            // Closed ones go, and every idle one after the first.
            let keep = !(c.sender.is_closed() || idle && one_idle);
            one_idle |= keep && idle;
            keep
        });
        // The first with room: the later ones empty and close.
        match upstream
            .conns
            .iter()
            .find(|c| c.in_flight.load(Ordering::Relaxed) < MAX_STREAMS_PER_H2)
        {
            Some(conn) => Http2::Room(conn.sender.clone(), Stream::on(conn)),
            None => Http2::Full(upstream.opening.clone()),
        }
    }

    /// How many HTTP/2 connections are open to any upstream (for tests).
    #[cfg(test)]
    fn http2_conns(&self) -> usize {
        let h2 = self.h2.lock().unwrap();
        h2.values()
            .flat_map(|u| &u.conns)
            .filter(|c| !c.sender.is_closed())
            .count()
    }

    /// An idle connection to `key`'s upstream that is still open, if there is one.
    fn take(self: &Arc<Self>, key: &Key) -> Option<Lease> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let parked = idle.by_upstream.get_mut(key)?;
        let now = Instant::now();
        while let Some(mut p) = parked.pop() {
            if now.duration_since(p.since) > IDLE_FOR {
                // The rest are older still.
                parked.clear();
                break;
            }
            // One poll reads what came while it was idle: a close ends it.
            let open = p
                .conn
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_pending();
            if open && p.sender.is_ready() {
                return Some(Lease {
                    pool: self.clone(),
                    key: key.clone(),
                    sender: p.sender,
                    conn: Some(p.conn),
                });
            }
        }
        None
    }

    /// Parks an idle connection; now and then drops those idle too long, of every upstream.
    fn park(&self, key: Key, sender: http1::SendRequest<Full<Bytes>>, conn: Conn) {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.swept.is_none_or(|at| now.duration_since(at) > SWEEP_EVERY) {
            idle.swept = Some(now);
            idle.by_upstream.retain(|_, parked| {
                parked.retain(|p| now.duration_since(p.since) <= IDLE_FOR);
                !parked.is_empty()
            });
        }
        let max = idle.max_per_upstream;
        let parked = idle.by_upstream.entry(key).or_default();
        if parked.len() >= max {
            // The longest idle goes: it is the likeliest to have been closed by the upstream.
            parked.remove(0);
        }
        parked.push(Parked {
            sender,
            conn,
            since: now,
        });
    }

    /// How many idle connections are parked (for tests).
    #[cfg(test)]
    fn parked(&self) -> usize {
        let idle = self.idle.lock().unwrap();
        idle.by_upstream.values().map(Vec::len).sum()
    }
}

impl Lease {
    /// Sends `req` on this connection and drives it until the response's head has arrived.
    async fn exchange(
        &mut self,
        req: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<Incoming>, hyper::client::conn::TrySendError<http::Request<Full<Bytes>>>> {
        let mut response = std::pin::pin!(self.sender.try_send_request(req));
        std::future::poll_fn(|cx| {
            self.drive(cx);
            response.as_mut().poll(cx)
        })
        .await
    }

    /// Lets the connection read and write what it can; drops it once it has ended (which also
    /// fails whatever still waited on it).
    fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(conn) = &mut self.conn
            && conn.as_mut().poll(cx).is_ready()
        {
            self.conn = None;
        }
    }

    /// The response has been read to its end: the connection goes back to the pool, unless it
    /// has ended or cannot take another request.
    fn give_back(mut self, cx: &mut Context<'_>) {
        // One more poll lets it settle into waiting for the next request.
        self.drive(cx);
        if let Some(conn) = self.conn
            && self.sender.is_ready()
        {
            self.pool.park(self.key, self.sender, conn);
        }
    }
}

/// Sends `req` (absolute form) on a shared HTTP/2 connection, holding `stream` (its place on
/// it) until the response's body has been dropped.
async fn send_h2(
    mut h2: http2::SendRequest<Full<Bytes>>,
    stream: Stream,
    req: http::Request<Full<Bytes>>,
) -> Result<http::Response<Body>, Failure> {
    h2.ready().await.map_err(Failure::Send)?;
    let response = h2.send_request(req).await.map_err(Failure::Send)?;
    Ok(response.map(|body| {
        Body::new(OnStream {
            body,
            _stream: stream,
        })
    }))
}

/// An upstream response's body on a shared HTTP/2 connection.
struct OnStream {
    body: Incoming,
    _stream: Stream,
}

impl http_body::Body for OnStream {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// An upstream response's body, driving its connection as it is read.
struct Driven {
    body: Incoming,
    /// `None` once the body has ended.
    lease: Option<Lease>,
    /// The request's place under its upstream's cap, freed with the body.
    _slot: OwnedSemaphorePermit,
}

impl http_body::Body for Driven {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let mut polled = Pin::new(&mut this.body).poll_frame(cx);
        if polled.is_pending()
            && let Some(lease) = &mut this.lease
        {
            // Nothing waiting: let the connection read its socket, then look again.
            lease.drive(cx);
            polled = Pin::new(&mut this.body).poll_frame(cx);
        }
        if let Poll::Ready(None) = polled
            && let Some(lease) = this.lease.take()
        {
            lease.give_back(cx);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// The production client's pool (its connector: HTTP/2 or 1.1 by ALPN, timeouts, no delay).
    fn pool() -> Arc<Pool> {
        pool_within(Duration::from_secs(5))
    }

    /// The same, with connections opened within `connect_timeout`.
    fn pool_within(connect_timeout: Duration) -> Arc<Pool> {
        match crate::transport::http::Client::direct(connect_timeout, 64, &[]) {
            crate::transport::http::Client::Direct(pool) => pool,
            crate::transport::http::Client::Proxied(_) => unreachable!("direct() is never proxied"),
        }
    }

    /// An upstream that answers each request with its path and counts connections.
    async fn upstream() -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let svc = hyper::service::service_fn(|req: http::Request<Incoming>| async move {
                    let host = req.headers()[http::header::HOST].to_str().unwrap().to_owned();
                    let text = format!("{} {} {host}", req.uri(), req.uri().path());
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(text))))
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), svc),
                );
            }
        });
        (addr, accepted)
    }

    async fn get(pool: &Arc<Pool>, url: &str) -> String {
        let req = http::Request::post(url).body(Bytes::new()).unwrap();
        let Ok(resp) = pool.clone().send(req).await else {
            panic!("no response from {url}");
        };
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn requests_go_out_in_origin_form_and_reuse_the_connection() {
        let (addr, accepted) = upstream().await;
        let pool = pool();
        for path in ["/v1/a?x=1", "/v1/b"] {
            let got = get(&pool, &format!("http://{addr}{path}")).await;
            let bare = path.split('?').next().unwrap();
            assert_eq!(got, format!("{path} {bare} {addr}"));
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(pool.parked(), 1);
    }

    /// After a burst, at most the cap of idle connections stays parked; the rest are closed.
    #[tokio::test]
    async fn idle_connections_are_capped_per_upstream() {
        let (addr, accepted) = upstream().await;
        let pool = pool();
        pool.idle.lock().unwrap().max_per_upstream = 2;
        let url = format!("http://{addr}/burst");
        let burst = futures::future::join_all((0..5).map(|_| get(&pool, &url))).await;
        assert!(burst.iter().all(|got| got.starts_with("/burst")), "{burst:?}");
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 5);
        assert_eq!(pool.parked(), 2);
        // The parked ones serve the next requests.
        for _ in 0..3 {
            get(&pool, &url).await;
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 5);
    }

    /// A pooled connection that the upstream closed while it was idle is not used: the request
    /// goes out on a new one and succeeds.
    #[tokio::test]
    async fn a_connection_closed_while_idle_is_replaced() {
        // Each connection answers one request and then closes, without saying so in a header.
        let addr = raw_upstream(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", false).await;
        let pool = pool();
        for _ in 0..3 {
            assert_eq!(get(&pool, &format!("http://{addr}/")).await, "ok");
            // Let the close arrive.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A raw upstream: answers each request on a connection with `answer`; with `keep_open`
    /// false, closes the connection after the first.
    async fn raw_upstream(answer: &'static [u8], keep_open: bool) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
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
        addr
    }

    /// What the upstream's answer leaves in the pool: a connection it keeps open goes back, one it
    /// said it closes does not; a chunked body arrives whole.
    #[tokio::test]
    async fn the_answer_decides_whether_the_connection_is_kept() {
        let cases: &[(&[u8], &str, usize)] = &[
            (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", "ok", 1),
            (
                b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
                "ok",
                0,
            ),
            (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", "ok", 0),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
                "abcde",
                1,
            ),
        ];
        for (answer, body, kept) in cases {
            let addr = raw_upstream(answer, true).await;
            let pool = pool();
            assert_eq!(get(&pool, &format!("http://{addr}/")).await, *body);
            assert_eq!(pool.parked(), *kept, "{}", String::from_utf8_lossy(answer));
        }
    }

    /// A response that is not HTTP is a send failure, not a hang or a panic.
    #[tokio::test]
    async fn a_garbled_answer_is_a_send_failure() {
        let addr = raw_upstream(b"SSH-2.0-OpenSSH_9.2\r\n", true).await;
        let req = http::Request::post(format!("http://{addr}/"))
            .body(Bytes::new())
            .unwrap();
        assert!(matches!(pool().send(req).await, Err(Failure::Send(_))));
    }

    #[tokio::test]
    async fn a_dropped_body_does_not_return_its_connection() {
        let (addr, accepted) = upstream().await;
        let pool = pool();
        let req = http::Request::post(format!("http://{addr}/"))
            .body(Bytes::new())
            .unwrap();
        let Ok(resp) = pool.clone().send(req).await else {
            panic!("no response");
        };
        drop(resp);
        assert_eq!(pool.parked(), 0);
        assert!(get(&pool, &format!("http://{addr}/x")).await.starts_with("/x"));
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_url_without_a_host_is_refused() {
        let req = http::Request::post("/v1/chat").body(Bytes::new()).unwrap();
        assert!(matches!(pool().send(req).await, Err(Failure::BadUrl)));
    }

    /// An upstream that holds each answer 50 ms and records the most connections open at once.
    async fn slow_upstream() -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let seen = most.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (open, most) = (open.clone(), most.clone());
                most.fetch_max(open.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                let svc = hyper::service::service_fn(|_req: http::Request<Incoming>| async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from("ok"))))
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        (addr, seen)
    }

    /// An upstream that accepts the connection and never answers the TLS handshake fails as a
    /// connect timed out, within the connect timeout, not the request's deadline.
    #[tokio::test]
    async fn a_stalled_tls_handshake_times_out_as_a_connect() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((tcp, _)) = listener.accept().await {
                held.push(tcp); // accepted, never read from or written to
            }
        });
        let pool = pool_within(Duration::from_millis(200));
        let req = http::Request::get(format!("https://localhost:{port}/"))
            .body(Bytes::new())
            .unwrap();
        let sent = tokio::time::timeout(Duration::from_secs(10), pool.send(req))
            .await
            .expect("bounded by the connect timeout");
        let Err(Failure::Connect(e)) = sent else {
            panic!("a connect failure")
        };
        let io = e.downcast_ref::<std::io::Error>().expect("an I/O error");
        assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
    }

    /// Past the cap, a request waits for one in flight to finish instead of opening another
    /// connection; every request is still answered.
    #[tokio::test]
    async fn connections_in_use_per_upstream_are_capped() {
        let (addr, most) = slow_upstream().await;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .build();
        let pool = Arc::new(Pool::new(
            connector,
            Duration::from_secs(5),
            Arc::new(HostCaps::new(2)),
        ));
        let sends = (0..8).map(|_| {
            let pool = pool.clone();
            async move {
                let req = http::Request::get(format!("http://{addr}/"))
                    .body(Bytes::new())
                    .unwrap();
                let body = pool.send(req).await.ok().unwrap().into_body();
                body.collect().await.unwrap().to_bytes()
            }
        });
        let answers = futures::future::join_all(sends).await;
        assert!(answers.iter().all(|a| a == "ok"), "{answers:?}");
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// A TLS upstream offering HTTP/2 that allows `max_streams` concurrent streams a
    /// connection: its port, the connections it accepted, and a pool that trusts it. A request
    /// to `/held` is answered once `held` of them have arrived; any other at once, with its
    /// version and URL.
    async fn http2_upstream(max_streams: u32, held: usize) -> (u16, Arc<AtomicUsize>, Arc<Pool>) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let der = rustls::pki_types::CertificateDer::from(cert.cert.der().to_vec());
        let key = rustls::pki_types::PrivateKeyDer::try_from(cert.key_pair.serialize_der()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![der.clone()], key)
            .unwrap();
        server.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let barrier = Arc::new(tokio::sync::Barrier::new(held.max(1)));
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    let tls = acceptor.accept(tcp).await.unwrap();
                    let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                        let barrier = barrier.clone();
                        async move {
                            if req.uri().path() == "/held" {
                                barrier.wait().await;
                            }
                            let text = format!("{:?} {}", req.version(), req.uri());
                            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(
                                text,
                            ))))
                        }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .max_concurrent_streams(max_streams)
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });

        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(client)
            .https_or_http()
            .enable_all_versions()
            .build();
        (
            port,
            accepted,
            Arc::new(Pool::new(
                connector,
                Duration::from_secs(5),
                Arc::new(HostCaps::new(1)),
            )),
        )
    }

    /// Sends a GET of `path` to the upstream on `port`; the body of its HTTP/2 answer.
    async fn get_h2(pool: Arc<Pool>, port: u16, path: &str) -> String {
        let req = http::Request::get(format!("https://localhost:{port}{path}"))
            .body(Bytes::new())
            .unwrap();
        let response = pool.send(req).await.ok().unwrap();
        assert_eq!(response.version(), http::Version::HTTP_2);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    /// An upstream that offers HTTP/2 in its TLS handshake gets it: its requests share one
    /// connection, concurrent ones included.
    #[tokio::test]
    async fn an_upstream_offering_http2_shares_one_connection() {
        let (port, accepted, pool) = http2_upstream(200, 0).await;
        assert_eq!(
            get_h2(pool.clone(), port, "/first").await,
            format!("HTTP/2.0 https://localhost:{port}/first")
        );
        // Concurrent, and more than the HTTP/1.1 cap of 1: streams of the one connection.
        let answers = futures::future::join_all((0..4).map(|_| get_h2(pool.clone(), port, "/again"))).await;
        assert!(answers.iter().all(|a| a.ends_with("/again")), "{answers:?}");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for every request"
        );
    }

    /// Past [`MAX_STREAMS_PER_H2`] requests in flight, another connection is opened (one for a
    /// whole burst) instead of queueing behind streams that may last minutes; once the burst
    /// is over, one idle connection is kept.
    #[tokio::test]
    async fn a_full_http2_connection_gets_a_second_one() {
        let burst = 2 * MAX_STREAMS_PER_H2 + 50;
        // The upstream allows exactly the cap: a request queued on a full connection would never
        // reach it, and the burst would never be answered.
        let (port, accepted, pool) = http2_upstream(MAX_STREAMS_PER_H2 as u32, burst).await;
        get_h2(pool.clone(), port, "/first").await;
        let held = futures::future::join_all((0..burst).map(|_| get_h2(pool.clone(), port, "/held")));
        let answers = tokio::time::timeout(Duration::from_secs(20), held)
            .await
            .expect("every request of the burst reached the upstream");
        assert!(answers.iter().all(|a| a.ends_with("/held")), "{answers:?}");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            3,
            "one connection per 100 requests in flight"
        );
        get_h2(pool.clone(), port, "/after").await;
        assert_eq!(pool.http2_conns(), 1, "the burst's idle connections closed");
    }
}
