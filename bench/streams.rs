//! The many-streams load generator: opens COUNT streamed chat completions, each on its own
//! connection, ramped at RATE new streams a second with at most 512 connects in progress, holds
//! them all until their upstream ends them, and times every event as it arrives.
//!
//! `cargo build --release --example streams`, then
//! `target/release/examples/streams ADDR PATH KEY COUNT RATE [HEADER: VALUE]...` with the request
//! body on stdin; each argument after RATE is one more request header (how bench/streams.py routes
//! the same load through another gateway, such as Portkey's `x-portkey-provider`).
//! Prints one line (times in µs; `ttfb`: from writing the request to the end of the first event;
//! `gap`: between the ends of consecutive events of one stream; `peak_open`: most streams open at
//! once, head received and body not ended):
//! `STREAMS streams=… completed=… errors=… peak_open=… events=… ttfb_p50=… ttfb_p99=… gap_p50=…
//! gap_p99=… gap_max=… duration_us=… errors_by=kind:n,…`. A stream counts as completed when it
//! ends with `data: [DONE]`; anything else is an error (connect, header, handshake, send, status, body,
//! unfinished, timeout; `status-CODE` for an answer other than 200). bench/streams.py builds and runs it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// Connects in progress at most: a ramp never floods the listener's backlog.
const CONNECTING: usize = 512;
/// A stream that has not ended by then is an error.
const STREAM_TIMEOUT: Duration = Duration::from_secs(300);

/// What one stream saw.
#[derive(Default)]
struct Seen {
    ttfb_us: Option<u32>,
    gaps_us: Vec<u32>,
    events: u64,
    error: Option<String>,
}

/// What every stream shares.
struct Shared {
    addr: SocketAddr,
    path: String,
    key: String,
    body: Bytes,
    headers: Vec<(String, String)>,
    connecting: Semaphore,
    open: AtomicUsize,
    peak_open: AtomicUsize,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 6 {
        eprintln!("usage: streams ADDR PATH KEY COUNT RATE [HEADER: VALUE]... < body");
        std::process::exit(2);
    }
    let addr: SocketAddr = args[1].parse().unwrap_or_else(|_| fail("ADDR must be IP:PORT"));
    let count: usize = args[4].parse().unwrap_or_else(|_| fail("COUNT must be a number"));
    let rate: f64 = args[5].parse().unwrap_or_else(|_| fail("RATE must be a number"));
    let headers = args[6..]
        .iter()
        .map(|h| header(h).unwrap_or_else(|| fail("an extra header must read NAME: VALUE")))
        .collect();
    let mut body = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin(), &mut body)
        .unwrap_or_else(|e| fail(&format!("stdin: {e}")));
    let shared = Arc::new(Shared {
        addr,
        path: args[2].clone(),
        key: args[3].clone(),
        body: Bytes::from(body),
        headers,
        connecting: Semaphore::new(CONNECTING),
        open: AtomicUsize::new(0),
        peak_open: AtomicUsize::new(0),
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&format!("runtime: {e}")));
    let start = Instant::now();
    let seen = rt.block_on(run(shared.clone(), count, rate));
    let duration_us = start.elapsed().as_micros();
    report(&seen, shared.peak_open.load(Ordering::Relaxed), duration_us);
}

async fn run(shared: Arc<Shared>, count: usize, rate: f64) -> Vec<Seen> {
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate.max(1.0))).await;
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            match tokio::time::timeout(STREAM_TIMEOUT, one(&shared)).await {
                Ok(seen) => seen,
                Err(_) => Seen {
                    error: Some("timeout".to_owned()),
                    ..Seen::default()
                },
            }
        }));
    }
    let mut seen = Vec::with_capacity(count);
    for t in tasks {
        seen.push(t.await.unwrap_or_else(|_| Seen {
            error: Some("panic".to_owned()),
            ..Seen::default()
        }));
    }
    seen
}

/// One stream, from the connect to its last event.
async fn one(shared: &Shared) -> Seen {
    let mut seen = Seen::default();
    let permit = shared.connecting.acquire().await.expect("never closed");
    let tcp = match TcpStream::connect(shared.addr).await {
        Ok(tcp) => tcp,
        Err(_) => return errored(seen, "connect"),
    };
    drop(permit);
    let _ = tcp.set_nodelay(true);
    let Ok((mut sender, conn)) = http1::handshake::<_, Full<Bytes>>(TokioIo::new(tcp)).await else {
        return errored(seen, "handshake");
    };
    tokio::spawn(conn);
    let mut request = http::Request::post(shared.path.as_str())
        .header("host", shared.addr.to_string())
        .header("authorization", format!("Bearer {}", shared.key))
        .header("content-type", "application/json");
    for (name, value) in &shared.headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let Ok(request) = request.body(Full::new(shared.body.clone())) else {
        return errored(seen, "header");
    };
    let sent = Instant::now();
    let Ok(response) = sender.send_request(request).await else {
        return errored(seen, "send");
    };
    if response.status() != http::StatusCode::OK {
        seen.error = Some(format!("status-{}", response.status().as_u16()));
        return seen;
    }
    let open = shared.open.fetch_add(1, Ordering::Relaxed) + 1;
    shared.peak_open.fetch_max(open, Ordering::Relaxed);
    let mut body = response.into_body();
    let mut last: Option<Instant> = None;
    // The last bytes seen, so that an event's end or `[DONE]` split across two reads is found.
    let mut tail: Vec<u8> = Vec::with_capacity(64);
    let mut done = false;
    let error = loop {
        match body.frame().await {
            None => break None,
            Some(Err(_)) => break Some("body"),
            Some(Ok(frame)) => {
                let Some(data) = frame.data_ref() else { continue };
                let now = Instant::now();
                let keep = tail.len();
                tail.extend_from_slice(data);
                let ends = memchr::memmem::find_iter(&tail, b"\n\n")
                    .filter(|&i| i + 2 > keep)
                    .count();
                done |= memchr::memmem::find(&tail, b"data: [DONE]").is_some();
                for _ in 0..ends {
                    match last {
                        None => seen.ttfb_us = Some(micros(now - sent)),
                        Some(at) => seen.gaps_us.push(micros(now - at)),
                    }
                    last = Some(now);
                    seen.events += 1;
                }
                let cut = tail.len().saturating_sub(16);
                tail.drain(..cut);
            }
        }
    };
    shared.open.fetch_sub(1, Ordering::Relaxed);
    seen.error = error.or((!done).then_some("unfinished")).map(str::to_owned);
    seen
}

/// An extra header from its argument, `NAME: VALUE` (spaces around either trimmed).
fn header(arg: &str) -> Option<(String, String)> {
    let (name, value) = arg.split_once(':')?;
    let name = name.trim();
    (!name.is_empty()).then(|| (name.to_owned(), value.trim().to_owned()))
}

fn errored(mut seen: Seen, kind: &str) -> Seen {
    seen.error = Some(kind.to_owned());
    seen
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

fn report(seen: &[Seen], peak_open: usize, duration_us: u128) {
    let mut ttfb: Vec<u32> = seen.iter().filter_map(|s| s.ttfb_us).collect();
    let mut gaps: Vec<u32> = seen.iter().flat_map(|s| s.gaps_us.iter().copied()).collect();
    ttfb.sort_unstable();
    gaps.sort_unstable();
    let mut by_kind: Vec<(&str, usize)> = Vec::new();
    for kind in seen.iter().filter_map(|s| s.error.as_deref()) {
        match by_kind.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => by_kind.push((kind, 1)),
        }
    }
    let errors: usize = by_kind.iter().map(|(_, n)| n).sum();
    let errors_by = by_kind
        .iter()
        .map(|(k, n)| format!("{k}:{n}"))
        .collect::<Vec<_>>()
        .join(",");
    println!(
        "STREAMS streams={} completed={} errors={errors} peak_open={peak_open} events={} ttfb_p50={} \
         ttfb_p99={} gap_p50={} gap_p99={} gap_max={} duration_us={duration_us} errors_by={}",
        seen.len(),
        seen.len() - errors,
        seen.iter().map(|s| s.events).sum::<u64>(),
        percentile(&ttfb, 50.0),
        percentile(&ttfb, 99.0),
        percentile(&gaps, 50.0),
        percentile(&gaps, 99.0),
        gaps.last().copied().unwrap_or(0),
        if errors_by.is_empty() { "none" } else { &errors_by },
    );
}

/// The `p`th percentile of sorted samples (nearest rank); 0 when there are none.
fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn fail(msg: &str) -> ! {
    eprintln!("streams: {msg}");
    std::process::exit(2);
}

#[cfg(test)]
mod tests {
    use super::{header, percentile};

    #[test]
    fn extra_headers_read_name_colon_value() {
        let url = "x-portkey-custom-host: http://127.0.0.1:9/v1";
        assert_eq!(
            header(url),
            Some((
                "x-portkey-custom-host".to_owned(),
                "http://127.0.0.1:9/v1".to_owned()
            ))
        );
        assert_eq!(header("a:b"), Some(("a".to_owned(), "b".to_owned())));
        assert_eq!(header("no colon"), None);
        assert_eq!(header(": value"), None);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let s: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&s, 50.0), 50);
        assert_eq!(percentile(&s, 99.0), 99);
        assert_eq!(percentile(&[], 99.0), 0);
        assert_eq!(percentile(&[7], 1.0), 7);
    }
}
