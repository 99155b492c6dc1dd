//! Thread per core. One accept loop hands each client connection, in turn, to a serving thread;
//! each serving thread runs a single-threaded runtime and a pool of upstream connections of its
//! own. A request — its client connection, its handler, its upstream connection — never changes
//! thread, so it pays for no cross-thread wake-up; background work (log writer, flushes, config
//! watch) stays on the main runtime.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::thread::JoinHandle;

use axum::Router;
use axum::serve::ListenerExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::idle_poll;
use crate::upstream::http::{self, Client};

/// A connection accepted by the main runtime, on its way to a serving thread.
type Handoff = (std::net::TcpStream, SocketAddr);

/// The serving threads, kept alive after they stopped serving until [`Threads::join`]: database
/// connections opened on a serving thread are driven by its runtime, and the gateway still uses
/// them while it shuts down.
pub struct Threads {
    release: DropGuard,
    handles: Vec<JoinHandle<()>>,
}

impl Threads {
    /// Lets the serving threads end, and waits for them.
    pub async fn join(self) {
        drop(self.release);
        let handles = self.handles;
        let _ = tokio::task::spawn_blocking(move || {
            for h in handles {
                let _ = h.join();
            }
        })
        .await;
    }
}

/// Serves `router` on `listener` with one serving thread per core until `stop` resolves, then
/// stops accepting and lets the running requests finish. Dropping the returned future (or the
/// [`Threads`]) ends the serving threads too. A serving thread polls for I/O for at most
/// `idle_poll` before it sleeps ([`idle_poll`]; zero: never).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    upstream: &Client,
    idle_poll: std::time::Duration,
    stop: impl Future<Output = ()>,
) -> (io::Result<()>, Option<Threads>) {
    let count = std::thread::available_parallelism().map_or(1, |n| n.get());
    let local = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => return (Err(e), None),
    };
    let stopping = CancellationToken::new();
    let stop_on_drop = stopping.clone().drop_guard();
    let release = CancellationToken::new();
    let mut threads = Threads {
        release: release.clone().drop_guard(),
        handles: Vec::with_capacity(count),
    };
    let mut lanes = Vec::with_capacity(count);
    let mut drained = Vec::with_capacity(count);
    for i in 0..count {
        let (tx, rx) = mpsc::unbounded_channel::<Handoff>();
        let (done, done_rx) = oneshot::channel::<io::Result<()>>();
        let (router, upstream) = (router.clone(), upstream.clone());
        let (stopping, release) = (stopping.clone(), release.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("aigw-serve-{i}"))
            .spawn(move || {
                let mut builder = tokio::runtime::Builder::new_current_thread();
                let poller = idle_poll::install(builder.enable_all(), idle_poll);
                let rt = match builder.build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = done.send(Err(e));
                        return;
                    }
                };
                rt.block_on(async move {
                    http::use_own_pool(&upstream);
                    // tokio's timer driver wakes itself (a write to its eventfd) whenever a new
                    // timer is due before its next planned wake — with no other timer, at every
                    // request's time budget. A standing one-second tick keeps that wake near.
                    tokio::spawn(async {
                        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
                        loop {
                            tick.tick().await;
                        }
                    });
                    if let Some(unparked) = poller {
                        idle_poll::spawn_poller(unparked);
                    }
                    let app = router.into_make_service_with_connect_info::<SocketAddr>();
                    // Streamed chunks must leave at once: no Nagle delay on client connections.
                    let lane = Lane { rx, local }.tap_io(|tcp| {
                        let _ = tcp.set_nodelay(true);
                    });
                    let served = axum::serve(lane, app)
                        .with_graceful_shutdown(stopping.cancelled_owned())
                        .await;
                    let _ = done.send(served);
                    release.cancelled().await;
                });
            });
        match spawned {
            Ok(h) => threads.handles.push(h),
            Err(e) => return (Err(e), Some(threads)),
        }
        lanes.push(tx);
        drained.push(done_rx);
    }

    let accept = async {
        for next in 0.. {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            };
            let Ok(tcp) = tcp.into_std() else { continue };
            let _ = lanes[next % lanes.len()].send((tcp, peer));
        }
    };
    tokio::select! {
        () = stop => {},
        () = accept => {},
    }
    drop(lanes);
    drop(stop_on_drop);
    let mut result = Ok(());
    for d in drained {
        let served = d
            .await
            .unwrap_or_else(|_| Err(io::Error::other("a serving thread ended unexpectedly")));
        if let Err(e) = served {
            result = Err(e);
        }
    }
    (result, Some(threads))
}

/// A failed accept: a connection reset before it was taken is nothing; anything else (out of
/// file descriptors, say) is logged and waited out for a second, as axum's own listener does.
async fn accept_failed(e: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
        return;
    }
    tracing::error!(error = %e, "accepting a connection failed");
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
}

/// A serving thread's listener: the connections the accept loop hands it.
struct Lane {
    rx: mpsc::UnboundedReceiver<Handoff>,
    local: SocketAddr,
}

impl axum::serve::Listener for Lane {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            let Some((tcp, peer)) = self.rx.recv().await else {
                // The accept loop stopped: graceful shutdown ends this lane's serve.
                return std::future::pending().await;
            };
            match TcpStream::from_std(tcp) {
                Ok(tcp) => return (tcp, peer),
                Err(e) => tracing::warn!(error = %e, "could not take over an accepted connection"),
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}
