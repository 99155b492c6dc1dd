//! What a client connection is doing, and its byte stream as the HTTP server sees it.
//!
//! [`Watch`] follows a connection through its phases and gives the deadline of the current one:
//!
//! | phase | from | deadline |
//! |---|---|---|
//! | head | the accept, or the first byte of a later request | header timeout |
//! | in service | the router got a request | none here (the request's own budgets) |
//! | idle | the last response in service ended | idle timeout |
//!
//! The HTTP server drives the transitions without knowing: its reads go through [`ClientIo`]
//! (idle → head), and the request and its response body carry an [`InService`] (head → in
//! service → idle). Each transition is a few atomic operations; no timer is touched per read.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::ClientLimits;
use super::refusal::canned_refusal;

/// `deadline_ms` while a request is in service.
const NO_DEADLINE: u64 = u64::MAX;

/// Which bound closed a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expired {
    /// The request line and headers did not arrive within the header timeout.
    Header,
    /// No request came within the idle timeout.
    Idle,
}

impl Expired {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Expired::Header => "header",
            Expired::Idle => "idle",
        }
    }
}

/// One client connection's phase and deadline (see the module comment).
pub struct Watch {
    started: Instant,
    header_timeout: Duration,
    idle_timeout: Duration,
    /// Requests handed to the router whose response has not ended (HTTP/2 runs several).
    in_service: AtomicUsize,
    /// Waiting for the first byte of the next request after a response.
    idle: AtomicBool,
    /// Bytes arrived while no request was in service: a request head is being read.
    reading_head: AtomicBool,
    /// The current phase's deadline in milliseconds after `started`, or [`NO_DEADLINE`].
    deadline_ms: AtomicU64,
    /// The connection's task, woken when a response ends on another task (HTTP/2 streams).
    waker: AtomicWaker,
    /// An HTTP/1 request's body has not been read to its end (see [`Watch::body_unread`]).
    body_unread: AtomicBool,
}

impl Watch {
    /// A connection accepted now: in the head phase.
    pub fn new(header_timeout: Duration, idle_timeout: Duration) -> Watch {
        Watch {
            started: Instant::now(),
            header_timeout,
            idle_timeout,
            in_service: AtomicUsize::new(0),
            idle: AtomicBool::new(false),
            reading_head: AtomicBool::new(false),
            deadline_ms: AtomicU64::new(millis(header_timeout)),
            waker: AtomicWaker::new(),
            body_unread: AtomicBool::new(false),
        }
    }

    /// Marks the body of the HTTP/1 request in service as unread (`true`) or read to its end.
    /// HTTP/1 serves one request at a time on a connection, so one flag is enough.
    pub fn set_body_unread(&self, unread: bool) {
        self.body_unread.store(unread, Ordering::Release);
    }

    /// Whether the body of the HTTP/1 request whose response leaves now was left unread; clears
    /// the mark for the next request.
    pub fn body_unread(&self) -> bool {
        self.body_unread.swap(false, Ordering::AcqRel)
    }

    /// The current deadline and the bound it enforces; `None` while a request is in service.
    pub fn deadline(&self) -> Option<(Instant, Expired)> {
        if self.in_service.load(Ordering::Acquire) > 0 {
            return None;
        }
        let ms = self.deadline_ms.load(Ordering::Acquire);
        if ms == NO_DEADLINE {
            return None;
        }
        let bound = if self.idle.load(Ordering::Acquire) {
            Expired::Idle
        } else {
            Expired::Header
        };
        Some((self.started + Duration::from_millis(ms), bound))
    }

    /// Registers the task to wake when a response ends elsewhere.
    pub fn register(&self, cx: &Context<'_>) {
        self.waker.register(cx.waker());
    }

    /// Whether a request head is being read (the only time the server writes a canned refusal).
    fn reading_head(&self) -> bool {
        self.reading_head.load(Ordering::Acquire) && self.in_service.load(Ordering::Acquire) == 0
    }

    /// The client sent bytes.
    fn received(&self) {
        if self.in_service.load(Ordering::Acquire) > 0 {
            return; // a request body
        }
        self.reading_head.store(true, Ordering::Release);
        if self.idle.swap(false, Ordering::AcqRel) {
            // The first byte of the next request: its head has the header timeout from now.
            self.set_deadline(self.header_timeout);
        }
    }

    /// The router got a request.
    fn request_started(&self) {
        self.in_service.fetch_add(1, Ordering::AcqRel);
        self.reading_head.store(false, Ordering::Release);
        self.idle.store(false, Ordering::Release);
        self.deadline_ms.store(NO_DEADLINE, Ordering::Release);
    }

    /// A response ended (written whole, or dropped).
    fn request_ended(&self) {
        if self.in_service.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.store(true, Ordering::Release);
            self.set_deadline(self.idle_timeout);
            self.waker.wake();
        }
    }

    fn set_deadline(&self, after: Duration) {
        let since_start = millis(self.started.elapsed());
        self.deadline_ms
            .store(since_start.saturating_add(millis(after)), Ordering::Release);
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(NO_DEADLINE - 1)
}

/// A request in the router: held by the request's future, then by its response body, so the
/// connection counts as in service until the response ended or was dropped.
pub struct InService(Arc<Watch>);

impl InService {
    /// The router got a request on the connection `watch` follows.
    pub fn start(watch: &Arc<Watch>) -> InService {
        watch.request_started();
        InService(Arc::clone(watch))
    }

    /// The connection's watch.
    pub fn watch(&self) -> &Watch {
        &self.0
    }
}

impl Drop for InService {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

/// A client connection's byte stream as the HTTP server reads and writes it: reads move the
/// [`Watch`]; hyper's canned answer to an unparsable request is replaced by the gateway's JSON
/// refusal (see `super::refusal`).
pub struct ClientIo<T> {
    inner: T,
    watch: Arc<Watch>,
    limits: ClientLimits,
    /// The refusal standing in for hyper's answer, and how much of it went out.
    replacement: Option<(Bytes, usize)>,
    /// A refusal was put in place: it is the connection's last answer.
    replaced: bool,
}

impl<T> ClientIo<T> {
    /// Wraps a client connection.
    pub fn new(inner: T, watch: Arc<Watch>, limits: ClientLimits) -> ClientIo<T> {
        ClientIo {
            inner,
            watch,
            limits,
            replacement: None,
            replaced: false,
        }
    }

    /// If `first` (the start of a write) is hyper's canned refusal, puts the gateway's in its
    /// place and returns the length taken.
    fn intercept(&mut self, first: &[u8]) -> Option<usize> {
        if self.replaced || !self.watch.reading_head() {
            return None;
        }
        let refusal = canned_refusal(first)?;
        self.replacement = Some((self.limits.parser_refusal(refusal), 0));
        self.replaced = true;
        Some(first.len())
    }
}

impl<T: AsyncWrite + Unpin> ClientIo<T> {
    /// Writes out the replacement refusal, if one is pending.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, sent)) = &mut self.replacement {
            if *sent >= bytes.len() {
                self.replacement = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *sent += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ClientIo<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.watch.received();
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ClientIo<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        if let Some(taken) = this.intercept(buf) {
            return Poll::Ready(Ok(taken));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        // hyper keeps a head in a buffer of its own: a canned answer is the first slice whole.
        if let Some(first) = bufs.iter().find(|b| !b.is_empty())
            && let Some(taken) = this.intercept(first)
        {
            return Poll::Ready(Ok(taken));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const CANNED_400: &[u8] =
        b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Tue, 01 Dec 2026 23:02:14 GMT\r\n\r\n";

    fn limits() -> ClientLimits {
        ClientLimits::new(&crate::Settings::default())
    }

    #[test]
    fn phases_move_the_deadline() {
        let watch = Arc::new(Watch::new(Duration::from_secs(30), Duration::from_secs(75)));
        let (at, bound) = watch.deadline().expect("a fresh connection has a deadline");
        assert_eq!(bound, Expired::Header);
        assert!(at <= Instant::now() + Duration::from_secs(30));

        watch.received();
        assert_eq!(
            watch.deadline().map(|d| d.1),
            Some(Expired::Header),
            "still the same head"
        );
        assert!(watch.reading_head());

        let request = InService::start(&watch);
        assert!(watch.deadline().is_none(), "no deadline while in service");
        assert!(!watch.reading_head());
        watch.received(); // the request's body
        assert!(watch.deadline().is_none());
        assert!(!watch.reading_head());

        drop(request);
        let (at, bound) = watch.deadline().expect("idle");
        assert_eq!(bound, Expired::Idle);
        assert!(at > Instant::now() + Duration::from_secs(60));
        assert!(!watch.reading_head());

        watch.received(); // the next request's first byte
        let (at, bound) = watch.deadline().expect("head");
        assert_eq!(bound, Expired::Header);
        assert!(at <= Instant::now() + Duration::from_secs(30));
    }

    #[test]
    fn concurrent_requests_keep_the_connection_in_service() {
        let watch = Arc::new(Watch::new(Duration::from_secs(30), Duration::from_secs(75)));
        let a = InService::start(&watch);
        let b = InService::start(&watch);
        drop(a);
        assert!(watch.deadline().is_none());
        drop(b);
        assert_eq!(watch.deadline().map(|d| d.1), Some(Expired::Idle));
    }

    #[tokio::test]
    async fn a_canned_refusal_while_reading_a_head_is_replaced() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let watch = Arc::new(Watch::new(Duration::from_secs(30), Duration::from_secs(75)));
        let mut io = ClientIo::new(server, Arc::clone(&watch), limits());
        client
            .write_all(b"GET / HTTP/1.1\r\nbad header\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        let _ = io.read(&mut buf).await.unwrap();
        io.write_all(CANNED_400).await.unwrap();
        io.shutdown().await.unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        let answer = String::from_utf8(answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{answer}");
        assert!(answer.contains("x-aigw-error-source: gateway\r\n"), "{answer}");
        assert!(answer.contains("\"code\":\"invalid_request_error\""), "{answer}");
    }

    #[tokio::test]
    async fn the_same_bytes_in_service_pass_through() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let watch = Arc::new(Watch::new(Duration::from_secs(30), Duration::from_secs(75)));
        let mut io = ClientIo::new(server, Arc::clone(&watch), limits());
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 64];
        let _ = io.read(&mut buf).await.unwrap();
        let request = InService::start(&watch);
        io.write_all(CANNED_400).await.unwrap();
        drop(request);
        io.shutdown().await.unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, CANNED_400);
    }
}
