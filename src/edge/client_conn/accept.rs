//! Taking client connections: the connection cap, failed accepts, the open-file limit.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Over-capacity connections being answered at once (each holds a file descriptor for up to
/// [`REFUSAL_LINGER`]); past this the accept loop waits for one to end, and the next
/// connections wait in the listen backlog for their answer.
pub const REFUSALS_AT_ONCE: usize = 256;
/// Most of an over-capacity request read to find its request line.
const REQUEST_LINE_BYTES: usize = 4096;
/// Longest an over-capacity connection is kept to deliver its answer.
const REFUSAL_LINGER: Duration = Duration::from_secs(2);
/// Most of the client's request read (and dropped) after the answer, so closing does not reset
/// the connection before the client read the answer.
const REFUSAL_DRAIN_BYTES: usize = 64 * 1024;
/// File descriptors kept beyond the client connections: the database pool, upstream connections,
/// refusals in progress, log files.
const OTHER_DESCRIPTORS: u64 = 1024;
/// At most one warning about failed accepts per this interval.
const ACCEPT_WARNING_EVERY: Duration = Duration::from_secs(10);
/// Pause after an accept failed for want of resources (out of descriptors): the waiting
/// connection stays queued, and accepting again at once would only fail again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The open client connections, counted against `max_client_connections`. Shared by the accept
/// loop (which takes a [`Slot`] per connection) and `/metrics`.
#[derive(Clone)]
pub struct ConnectionSlots {
    slots: Arc<Semaphore>,
    max: usize,
    /// Connections answered 503 at the cap.
    refused: Arc<AtomicU64>,
}

/// One open client connection's place under the cap, given back when dropped.
pub struct Slot {
    _permit: OwnedSemaphorePermit,
}

impl ConnectionSlots {
    /// At most `max` connections at once.
    pub fn new(max: usize) -> ConnectionSlots {
        let max = max.min(Semaphore::MAX_PERMITS);
        ConnectionSlots {
            slots: Arc::new(Semaphore::new(max)),
            max,
            refused: Arc::default(),
        }
    }

    /// Connections answered 503 `too_many_connections` at the cap so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// A slot, unless `max` connections are open.
    pub fn try_take(&self) -> Option<Slot> {
        Arc::clone(&self.slots)
            .try_acquire_owned()
            .ok()
            .map(|permit| Slot { _permit: permit })
    }

    /// Client connections open now.
    pub fn open(&self) -> usize {
        self.max.saturating_sub(self.slots.available_permits())
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }
}

/// The accept loop's side of client connections: each accepted connection gets a [`Slot`] or,
/// past the cap, an immediate 503 in the gateway's shape and a close — so a client is answered
/// fast instead of waiting in the listen queue, and the gateway never runs out of descriptors
/// for its own work. Past the cap `/healthz` is still answered 200: liveness never depends on
/// the cap (a probe must not restart a gateway that is only busy). Every over-capacity
/// connection is answered: when [`REFUSALS_AT_ONCE`] answers are in progress, the loop waits for
/// one to end before it accepts again.
pub struct Acceptor {
    slots: ConnectionSlots,
    refusing: Arc<Semaphore>,
    failures: AcceptFailures,
}

impl Acceptor {
    /// Takes connections under `slots`.
    pub fn new(slots: ConnectionSlots) -> Acceptor {
        Acceptor {
            slots,
            refusing: Arc::new(Semaphore::new(REFUSALS_AT_ONCE)),
            failures: AcceptFailures::default(),
        }
    }

    /// The next client connection with its slot. Connections past the cap are answered and
    /// closed in the background; failed accepts are warned about (at most every
    /// [`ACCEPT_WARNING_EVERY`]) and, when the system is out of resources, waited out briefly.
    pub async fn accept(&mut self, listener: &TcpListener) -> (TcpStream, SocketAddr, Slot) {
        loop {
            match listener.accept().await {
                Ok((tcp, peer)) => {
                    if let Some(slot) = self.slots.try_take() {
                        return (tcp, peer, slot);
                    }
                    // A flood must not turn the answers into a descriptor leak, nor leave a
                    // client unanswered: past REFUSALS_AT_ONCE the next connections wait in the
                    // listen backlog until an answer ends (each within REFUSAL_LINGER).
                    let Ok(permit) = Arc::clone(&self.refusing).acquire_owned().await else {
                        continue;
                    };
                    // A slot may have freed meanwhile.
                    if let Some(slot) = self.slots.try_take() {
                        return (tcp, peer, slot);
                    }
                    self.refuse(tcp, permit);
                }
                Err(e) => {
                    if let Some(pause) = self.failed(&e) {
                        tokio::time::sleep(pause).await;
                    }
                }
            }
        }
    }

    fn refuse(&self, tcp: TcpStream, permit: OwnedSemaphorePermit) {
        // Rendered per connection: every response carries a request id of its own (DESIGN.md §7).
        let id = crate::kernel::request_id::RequestId(uuid::Uuid::now_v7());
        let error = crate::error::ApiError::TooManyConnections {
            limit: self.slots.max(),
        };
        let answer = error.http1_response_with_id(id);
        let refused = Arc::clone(&self.slots.refused);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REFUSAL_LINGER, answer_and_close(tcp, &answer, &refused)).await;
            drop(permit);
        });
    }

    /// Logs a failed accept (rate-limited) and says how long to pause.
    fn failed(&mut self, e: &io::Error) -> Option<Duration> {
        use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
        // A connection reset before it was taken is the client's business.
        if matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
            return None;
        }
        metrics::counter!("aigw_client_accept_failures_total").increment(1);
        if let Some(unreported) = self.failures.failed(Instant::now()) {
            tracing::warn!(
                error = %e,
                failures_not_logged = unreported,
                open_client_connections = self.slots.open(),
                "accepting a client connection failed; if out of file descriptors, raise the \
                 hard open-file limit or lower max_client_connections"
            );
        }
        Some(ACCEPT_BACKOFF)
    }
}

/// Once the client sent its request line, writes the answer (`/healthz`'s own, else the 503
/// `over_capacity`, counted in `refused`), ends the sending side, and reads what the client sends
/// until it closes. An answer before the request would reach an HTTP client that is not reading
/// yet, and some (hyper's) take it for a broken connection instead of an answer.
async fn answer_and_close(mut tcp: TcpStream, over_capacity: &[u8], refused: &AtomicU64) -> io::Result<()> {
    let _ = tcp.set_nodelay(true);
    let mut head = [0u8; REQUEST_LINE_BYTES];
    let mut got = 0;
    while got < head.len() && !head[..got].contains(&b'\n') {
        let n = tcp.read(&mut head[got..]).await?;
        if n == 0 {
            return Ok(());
        }
        got += n;
    }
    match health_check(&head[..got]) {
        Some(method) => tcp.write_all(&healthz_answer(method)).await?,
        None => {
            refused.fetch_add(1, Ordering::Relaxed);
            tcp.write_all(over_capacity).await?;
        }
    }
    let mut sink = [0u8; 4096];
    tcp.shutdown().await?;
    let mut drained = 0;
    while drained < REFUSAL_DRAIN_BYTES {
        let n = tcp.read(&mut sink).await?;
        if n == 0 {
            break;
        }
        drained += n;
    }
    Ok(())
}

/// The method of a liveness check (`GET` or `HEAD /healthz`, HTTP/1) that `start` begins.
fn health_check(start: &[u8]) -> Option<&'static str> {
    let (method, rest) = if let Some(rest) = start.strip_prefix(b"GET ") {
        ("GET", rest)
    } else {
        ("HEAD", start.strip_prefix(b"HEAD ")?)
    };
    let target = rest.strip_prefix(b"/healthz")?;
    matches!(target.first(), Some(b' ' | b'?')).then_some(method)
}

/// `/healthz`'s answer, as the router gives it, on a connection about to be closed.
fn healthz_answer(method: &str) -> Vec<u8> {
    let id = uuid::Uuid::now_v7();
    let mut out = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 2\r\n\
         connection: close\r\nx-request-id: {}\r\n\r\n",
        id.hyphenated()
    )
    .into_bytes();
    if method == "GET" {
        out.extend_from_slice(b"ok");
    }
    out
}

/// Rate limit of the failed-accept warning: the first failure warns, later ones within
/// [`ACCEPT_WARNING_EVERY`] of the last warning are only counted, and the next warning says how
/// many were not logged.
#[derive(Debug, Default)]
pub struct AcceptFailures {
    last_warning: Option<Instant>,
    unreported: u64,
}

impl AcceptFailures {
    /// An accept failed at `now`: `Some(failures not logged since the last warning)` if this one
    /// is to be logged.
    pub fn failed(&mut self, now: Instant) -> Option<u64> {
        match self.last_warning {
            Some(last) if now.saturating_duration_since(last) < ACCEPT_WARNING_EVERY => {
                self.unreported = self.unreported.saturating_add(1);
                None
            }
            _ => {
                self.last_warning = Some(now);
                Some(std::mem::take(&mut self.unreported))
            }
        }
    }
}

/// Raises the process's soft open-file limit to its hard limit, logs it, and warns when it
/// cannot hold `max_client_connections` plus the gateway's own descriptors.
pub fn raise_open_file_limit(max_client_connections: usize) {
    let needed = u64::try_from(max_client_connections)
        .unwrap_or(u64::MAX)
        .saturating_add(OTHER_DESCRIPTORS);
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) if limit < needed => tracing::warn!(
            open_file_limit = limit,
            max_client_connections,
            needed,
            "the open-file limit is too low for max_client_connections: raise the hard limit \
             (systemd LimitNOFILE=, docker --ulimit nofile=, ulimit -Hn) or lower \
             max_client_connections"
        ),
        Ok(limit) => tracing::info!(open_file_limit = limit, max_client_connections, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_accepts_warn_once_per_interval_and_count_the_rest() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut failures = AcceptFailures::default();
        let cases = [
            (0, Some(0)),
            (1, None),
            (5_000, None),
            (9_999, None),
            (10_000, Some(3)),
            (10_001, None),
            (25_000, Some(1)),
            (40_000, Some(0)),
        ];
        for (ms, expected) in cases {
            assert_eq!(failures.failed(at(ms)), expected, "at {ms} ms");
        }
    }

    #[test]
    fn liveness_checks_are_told_by_their_request_line() {
        let cases: &[(&[u8], Option<&str>)] = &[
            (b"GET /healthz HTTP/1.1\r\n", Some("GET")),
            (b"HEAD /healthz HTTP/1.1\r\n", Some("HEAD")),
            (b"GET /healthz?probe=k8s HTTP/1.1\r\n", Some("GET")),
            (b"GET /healthz HTTP/1.0\r\n", Some("GET")),
            (b"GET /healthzz HTTP/1.1\r\n", None),
            (b"GET /healthz/x HTTP/1.1\r\n", None),
            (b"GET /readyz HTTP/1.1\r\n", None),
            (b"POST /healthz HTTP/1.1\r\n", None),
            (b"get /healthz HTTP/1.1\r\n", None),
            (b"GET /healthz", None),
            (b"PRI * HTTP/2.0\r\n", None),
            (b"", None),
        ];
        for (line, want) in cases {
            assert_eq!(health_check(line), *want, "{}", String::from_utf8_lossy(line));
        }
        let head = String::from_utf8(healthz_answer("HEAD")).unwrap();
        assert!(
            head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        assert!(healthz_answer("GET").ends_with(b"\r\n\r\nok"));
    }

    #[test]
    fn slots_count_open_connections_up_to_the_cap() {
        let slots = ConnectionSlots::new(2);
        let a = slots.try_take().expect("first");
        let b = slots.try_take().expect("second");
        assert_eq!(slots.open(), 2);
        assert!(slots.try_take().is_none(), "the cap holds");
        drop(a);
        assert_eq!(slots.open(), 1);
        let _c = slots.try_take().expect("a freed slot is taken again");
        drop(b);
        assert_eq!(slots.open(), 1);
    }

    #[test]
    fn the_soft_open_file_limit_is_raised_to_the_hard_one() {
        const NOFILE: rlimit::Resource = rlimit::Resource::NOFILE;
        let (_, hard) = rlimit::getrlimit(NOFILE).unwrap();
        // One below the hard limit: low enough to see the raise, high enough for the other tests.
        rlimit::setrlimit(NOFILE, hard - 1, hard).unwrap();
        raise_open_file_limit(10);
        let (soft, hard) = rlimit::getrlimit(NOFILE).unwrap();
        assert_eq!(soft, hard);
    }
}
