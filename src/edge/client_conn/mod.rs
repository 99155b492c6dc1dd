//! Client connections, whichever runtime layout serves them: [`serve_connection`] serves one
//! accepted connection (HTTP/1 or HTTP/2 without TLS) with the router until it ends, and
//! [`Acceptor`] takes connections under the cap. `crate::edge::serving` (one accept loop, a serving
//! thread per core) calls both; a multi-threaded runtime would call them the same way:
//!
//! ```text
//! let mut acceptor = Acceptor::new(state.connections.clone());
//! loop {
//!     let (tcp, peer, slot) = acceptor.accept(&listener).await;
//!     tasks.spawn(serve_connection(tcp, peer, router.clone(), limits.clone(), slot, stopping.clone()));
//! }
//! ```
//!
//! Every wait on the client is bounded: the request line and headers by the header timeout, the
//! wait for the next request on a kept-alive connection by the idle timeout (the phases are in
//! `io`), the number of open connections by `max_client_connections`. A request the HTTP parser
//! refuses is answered with the gateway's JSON error (`refusal`). An HTTP/1 answer sent before its
//! request's body was read says `Connection: close` ([`RequestBody`]).

mod accept;
mod io;
mod refusal;

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, Response, Version, header};
use bytes::Bytes;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower_service::Service;

pub use accept::{Acceptor, ConnectionSlots, Slot, raise_open_file_limit};

use crate::kernel::request_id::{REQUEST_ID, RequestId};

use io::{ClientIo, Expired, InService, Watch};
use refusal::ParserRefusal;

/// How client connections are served: the bounds from the settings and the HTTP server built
/// from them. Cheap to clone.
#[derive(Clone)]
pub struct ClientLimits(Arc<LimitsInner>);

struct LimitsInner {
    header_timeout: Duration,
    idle_timeout: Duration,
    /// How long the requests running at a stop may take to finish (`shutdown_grace_secs`).
    shutdown_grace: Duration,
    http: auto::Builder<TokioExecutor>,
    /// `http` for a connection whose first bytes showed HTTP/1 (see [`opening`]).
    http1: auto::Builder<TokioExecutor>,
    /// The header limit, named by the 431 standing in for the HTTP parser's own.
    max_header_bytes: usize,
}

impl ClientLimits {
    /// The limits of `settings`.
    pub fn new(settings: &crate::Settings) -> ClientLimits {
        let max_header_bytes = settings.max_header_bytes;
        let mut http = auto::Builder::new(TokioExecutor::new());
        http.http1()
            // The HTTP/1 read buffer: a request line and headers that do not fit are refused
            // with 431 (hyper's own header-size option is not offered with HTTP/2 detection).
            .max_buf_size(max_header_bytes)
            // The header and idle timeouts are the connection watch's (`io`): hyper's header
            // timer starts when it waits for the next request, so it would cut the idle wait.
            .header_read_timeout(None);
        http.http2()
            .max_header_list_size(u32::try_from(max_header_bytes).unwrap_or(u32::MAX));
        ClientLimits(Arc::new(LimitsInner {
            header_timeout: Duration::from_secs(settings.client_header_timeout_secs),
            idle_timeout: Duration::from_secs(settings.client_idle_timeout_secs),
            shutdown_grace: Duration::from_secs(settings.shutdown_grace_secs),
            http1: http.clone().http1_only(),
            http,
            max_header_bytes,
        }))
    }

    /// How long the requests running at a stop may take to finish before their connections are
    /// closed.
    pub fn shutdown_grace(&self) -> Duration {
        self.0.shutdown_grace
    }

    /// The whole HTTP/1.1 answer standing in for the parser's `refusal`, with a request id of
    /// its own (DESIGN.md §7: every response carries one; no request log row is written, as no
    /// request reached the router).
    fn parser_refusal(&self, refusal: ParserRefusal) -> Bytes {
        let id = RequestId(uuid::Uuid::now_v7());
        tracing::debug!(request_id = %id.0, ?refusal, "request refused by the HTTP parser");
        Bytes::from(refusal.error(self.0.max_header_bytes).http1_response_with_id(id))
    }
}

/// Serves one accepted client connection with `router` until the client closes it, a bound of
/// `limits` closes it, or — after `stopping` is cancelled — its running requests finished
/// (graceful stop: HTTP/1 closes after the response in progress, HTTP/2 sends GOAWAY; a
/// connection still sending a request head is closed at once). `slot` is given back when it ends. Handlers see the client's address as `ConnectInfo<SocketAddr>`.
pub async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    router: Router,
    limits: ClientLimits,
    slot: Slot,
    stopping: CancellationToken,
) {
    let _slot = slot;
    // Streamed chunks must leave at once: no Nagle delay on client connections.
    let _ = tcp.set_nodelay(true);
    let watch = Arc::new(Watch::new(limits.0.header_timeout, limits.0.idle_timeout));
    let http = match opening(&tcp, limits.0.header_timeout, &stopping, peer).await {
        Some(Opening::Http1) => &limits.0.http1,
        Some(Opening::Either) => &limits.0.http,
        None => return,
    };
    let io = TokioIo::new(ClientIo::new(tcp, Arc::clone(&watch), limits.clone()));
    let service = GatewayService {
        router,
        peer,
        watch: Arc::clone(&watch),
    };
    let mut conn = pin!(http.serve_connection(io, service));
    let mut stop = pin!(stopping.cancelled());
    let mut stop_sent = false;
    let mut timer = pin!(tokio::time::sleep(limits.0.header_timeout));
    let mut timer_at = None;
    let ended = poll_fn(|cx: &mut Context<'_>| {
        if !stop_sent && stop.as_mut().poll(cx).is_ready() {
            stop_sent = true;
            conn.as_mut().graceful_shutdown();
        }
        if let Poll::Ready(result) = conn.as_mut().poll(cx) {
            return Poll::Ready(result.err().map(|e| e.to_string()));
        }
        // Every phase change on this task happened inside the poll above; one on another task
        // (an HTTP/2 response ending) wakes this one.
        watch.register(cx);
        let Some((deadline, bound)) = watch.deadline() else {
            return Poll::Pending;
        };
        if stop_sent && bound == Expired::Header {
            // Stopping, and no request is in the router: a head not yet complete is not waited for.
            return Poll::Ready(None);
        }
        // The timer is moved only to an earlier deadline; one that fires early is moved on then.
        // So a busy kept-alive connection re-arms it about once per timeout, not per request.
        if timer_at.is_none_or(|at| deadline < at) {
            timer.as_mut().reset(deadline);
            timer_at = Some(deadline);
        }
        while timer.as_mut().poll(cx).is_ready() {
            if Instant::now() >= deadline {
                metrics::counter!("aigw_client_connections_timed_out_total", "bound" => bound.label())
                    .increment(1);
                tracing::debug!(%peer, bound = bound.label(), "client connection timed out; closed");
                return Poll::Ready(None);
            }
            timer.as_mut().reset(deadline);
            timer_at = Some(deadline);
        }
        Poll::Pending
    })
    .await;
    if let Some(e) = ended {
        // A client that goes away mid-request or sends garbage is not the gateway's fault.
        tracing::debug!(%peer, error = %e, "client connection ended with an error");
    }
}

/// What a client connection's first bytes show.
enum Opening {
    /// Not the start of HTTP/2's preface: an HTTP/1 request.
    Http1,
    /// Perhaps HTTP/2's preface: the server tells the versions apart.
    Either,
}

/// Waits for the client's first bytes without taking them, within the header timeout (counted
/// from the accept, as the head's) and until `stopping`; `None` when the connection ended,
/// failed or timed out first.
///
/// Knowing the version lets hyper's HTTP/1 server read the request itself. After the server's
/// own version check, the bytes that check read are handed back alone, and hyper's read buffer,
/// 8 KiB reserved for that first short read, then grows to 16 KiB for the connection's life: 8
/// KiB more per open stream (measured with `python3 bench/streams.py`).
async fn opening(
    tcp: &TcpStream,
    header_timeout: Duration,
    stopping: &CancellationToken,
    peer: SocketAddr,
) -> Option<Opening> {
    const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut first = [0u8; 3];
    tokio::select! {
        peeked = tcp.peek(&mut first) => match peeked {
            Ok(n) if n > 0 && H2_PREFACE.starts_with(&first[..n]) => Some(Opening::Either),
            Ok(n) if n > 0 => Some(Opening::Http1),
            // Closed or failed before a byte.
            _ => None,
        },
        () = tokio::time::sleep(header_timeout) => {
            let bound = Expired::Header.label();
            metrics::counter!("aigw_client_connections_timed_out_total", "bound" => bound).increment(1);
            tracing::debug!(%peer, bound, "client connection timed out; closed");
            None
        }
        // Stopping, and no request has begun: nothing to drain.
        () = stopping.cancelled() => None,
    }
}

/// The router as the HTTP server calls it, once per request, on one connection.
#[derive(Clone)]
struct GatewayService {
    router: Router,
    peer: SocketAddr,
    watch: Arc<Watch>,
}

impl hyper::service::Service<Request<Incoming>> for GatewayService {
    type Response = Response<ServedBody>;
    type Error = Infallible;
    type Future = Served;

    /// Gives the request its id (DESIGN.md §7: on every response) and its client's address, and
    /// hands it to the router.
    fn call(&self, mut req: Request<Incoming>) -> Served {
        let in_service = InService::start(&self.watch);
        let id = RequestId(uuid::Uuid::now_v7());
        req.extensions_mut().insert(ConnectInfo(self.peer));
        req.extensions_mut().insert(id);
        let req = if req.version() <= Version::HTTP_11 && !http_body::Body::is_end_stream(req.body()) {
            self.watch.set_body_unread(true);
            let watch = Arc::clone(&self.watch);
            req.map(|inner| axum::body::Body::new(RequestBody { inner, watch }))
        } else {
            req.map(axum::body::Body::new)
        };
        // A `Router` is always ready (axum documents `poll_ready` as a no-op for it).
        let mut router = self.router.clone();
        Served {
            response: router.call(req),
            id,
            in_service: Some(in_service),
        }
    }
}

/// A request in the router.
struct Served {
    response: axum::routing::future::RouteFuture<Infallible>,
    id: RequestId,
    in_service: Option<InService>,
}

impl Future for Served {
    type Output = Result<Response<ServedBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut response = match ready!(Pin::new(&mut this.response).poll(cx)) {
            Ok(response) => response,
            Err(never) => match never {},
        };
        if let Ok(v) = HeaderValue::from_str(this.id.encode(&mut [0; 36])) {
            response.headers_mut().insert(REQUEST_ID, v);
        }
        let in_service = this.in_service.take();
        if in_service.as_ref().is_some_and(|s| s.watch().body_unread()) {
            // hyper closes a connection whose unread body is not already in its buffer; the
            // client is told, so it does not send its next request on the closed connection.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        Poll::Ready(Ok(response.map(|inner| ServedBody {
            inner,
            _in_service: in_service,
        })))
    }
}

/// An HTTP/1 request's body, which clears its connection's unread mark once read to its end: an
/// answer sent before then (a refusal before the body is read: an unknown key, an open breaker,
/// an admin route's missing token) says `Connection: close`.
struct RequestBody {
    inner: Incoming,
    watch: Arc<Watch>,
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if frame.is_none() || this.inner.is_end_stream() {
            this.watch.set_body_unread(false);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A response body; the connection counts as in service until it ended or was dropped.
pub struct ServedBody {
    inner: axum::body::Body,
    _in_service: Option<InService>,
}

impl http_body::Body for ServedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// The server's end of a loopback connection whose client first sends `first` (and closes
    /// when `close`), and the client's end.
    async fn pair(first: &[u8], close: bool) -> (TcpStream, Option<TcpStream>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        client.write_all(first).await.unwrap();
        if close {
            drop(client);
            return (server, None);
        }
        (server, Some(client))
    }

    async fn opening_of(first: &[u8], close: bool) -> Option<Opening> {
        let (server, _client) = pair(first, close).await;
        let peer = server.peer_addr().unwrap();
        let got = opening(
            &server,
            Duration::from_millis(50),
            &CancellationToken::new(),
            peer,
        )
        .await;
        // Peeked, not taken: the server still reads the first bytes.
        if got.is_some() {
            let mut buf = [0u8; 1];
            server.peek(&mut buf).await.unwrap();
            assert_eq!(buf[0], first[0]);
        }
        got
    }

    #[tokio::test]
    async fn the_first_bytes_tell_http1_from_a_possible_http2_preface() {
        assert!(matches!(
            opening_of(b"POST /v1/chat", false).await,
            Some(Opening::Http1)
        ));
        assert!(matches!(
            opening_of(b"PRI * HTTP/2.0", false).await,
            Some(Opening::Either)
        ));
        assert!(matches!(opening_of(b"P", false).await, Some(Opening::Either)));
        assert!(opening_of(b"", true).await.is_none(), "closed before a byte");
        assert!(
            opening_of(b"", false).await.is_none(),
            "silent past the header timeout"
        );
    }
}
