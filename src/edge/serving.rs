//! Thread per core. One accept loop hands each client connection, in turn, to a serving thread;
//! each serving thread runs a single-threaded runtime and a pool of upstream connections of its
//! own. A request — its client connection, its handler, its upstream connection — never changes
//! thread, so it pays for no cross-thread wake-up; background work (log writer, flushes, config
//! watch) stays on the main runtime. What happens on a client connection — its bounds, the cap,
//! the refusals — is `crate::edge::client_conn`'s, which does not depend on this layout.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::thread::JoinHandle;

use axum::Router;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::edge::client_conn::{self, Acceptor, ClientLimits, ConnectionSlots, Slot};
use crate::edge::idle_poll;
use crate::transport::http::{self, Client};

/// A connection accepted by the main runtime, with its slot under the connection cap, on its way
/// to a serving thread.
type Handoff = (std::net::TcpStream, SocketAddr, Slot);

/// Serves `router` on `listener` with one serving thread per core until `stop` resolves, then
/// closes the listener, lets the running requests finish (for `limits`' shutdown grace at most:
/// then their connections are closed) and waits for the serving threads to end. Client
/// connections are bounded by `limits` and counted in `slots`. Dropping the returned future ends
/// the serving threads too, once their requests are done. A serving thread polls for I/O for at
/// most `idle_poll` before it sleeps ([`idle_poll`]; zero: never). `grace_over` is cancelled when
/// the grace ends, before the requests still running are dropped.
#[expect(
    clippy::too_many_arguments,
    reason = "each is a separate handle of the caller's; a struct would only rename them"
)]
pub async fn serve(
    listener: TcpListener,
    router: Router,
    upstream: &Client,
    idle_poll: std::time::Duration,
    limits: ClientLimits,
    slots: ConnectionSlots,
    stop: impl Future<Output = ()>,
    grace_over: CancellationToken,
) -> io::Result<()> {
    let count = std::thread::available_parallelism().map_or(1, |n| n.get());
    let stopping = CancellationToken::new();
    let stop_on_drop = stopping.clone().drop_guard();
    let mut threads: Vec<JoinHandle<()>> = Vec::with_capacity(count);
    let mut lanes = Vec::with_capacity(count);
    let mut drained = Vec::with_capacity(count);
    for i in 0..count {
        let (tx, mut rx) = mpsc::unbounded_channel::<Handoff>();
        let (done, done_rx) = oneshot::channel::<io::Result<()>>();
        let (router, upstream, limits) = (router.clone(), upstream.clone(), limits.clone());
        let (stopping, grace_over) = (stopping.clone(), grace_over.clone());
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
                    let connections = TaskTracker::new();
                    loop {
                        let next = tokio::select! {
                            next = rx.recv() => next,
                            () = stopping.cancelled() => None,
                        };
                        // None: the accept loop stopped; the connections finish gracefully.
                        let Some((tcp, peer, slot)) = next else { break };
                        match TcpStream::from_std(tcp) {
                            Ok(tcp) => {
                                connections.spawn(client_conn::serve_connection(
                                    tcp,
                                    peer,
                                    router.clone(),
                                    limits.clone(),
                                    slot,
                                    stopping.clone(),
                                ));
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "could not take over an accepted connection")
                            }
                        }
                    }
                    connections.close();
                    let grace = limits.shutdown_grace();
                    if tokio::time::timeout(grace, connections.wait()).await.is_err() {
                        // Before they are dropped, below: what ends now was cut by the stop.
                        grace_over.cancel();
                        tracing::warn!(
                            connections = connections.len(),
                            grace_secs = grace.as_secs(),
                            "shutdown grace over: closing the connections still running"
                        );
                    }
                });
                // What still runs is dropped with the runtime, here: a stream's accounting runs
                // in its drop (logged as cut by the stop), before the background flushes it.
                drop(rt);
                let _ = done.send(Ok(()));
            });
        match spawned {
            Ok(h) => threads.push(h),
            Err(e) => return Err(e),
        }
        lanes.push(tx);
        drained.push(done_rx);
    }

    let mut acceptor = Acceptor::new(slots);
    let accept = async {
        for next in 0.. {
            let (tcp, peer, slot) = acceptor.accept(&listener).await;
            let Ok(tcp) = tcp.into_std() else { continue };
            let _ = lanes[next % lanes.len()].send((tcp, peer, slot));
        }
    };
    tokio::select! {
        () = stop => {},
        () = accept => {},
    }
    // Stop listening before draining: a new client is refused at once (and can go to another
    // replica, knowing nothing was sent) instead of waiting in the listen backlog until the
    // running requests have finished, to be reset then.
    drop(listener);
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
    // Nothing they hold outlives them: the database's connections are the main runtime's.
    let _ = tokio::task::spawn_blocking(move || {
        for t in threads {
            let _ = t.join();
        }
    })
    .await;
    result
}

/// Serves `router` on `listener` from the current runtime until `stopping` is cancelled, then lets
/// its connections finish (for `limits`' shutdown grace at most, then they are closed): for a
/// surface with little traffic (the admin API, the console and metrics on `admin_listen`), which
/// needs no serving threads of its own. Connections are bounded by `limits` and counted in
/// `slots`, a cap of its own (`max_admin_connections`): a proxy at its cap leaves the admin
/// surfaces reachable.
pub async fn serve_light(
    listener: TcpListener,
    router: Router,
    limits: ClientLimits,
    slots: ConnectionSlots,
    stopping: CancellationToken,
) {
    let mut acceptor = Acceptor::new(slots);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (tcp, peer, slot) = tokio::select! {
            accepted = acceptor.accept(&listener) => accepted,
            () = stopping.cancelled() => break,
        };
        // Forget the connections that have ended.
        while connections.try_join_next().is_some() {}
        connections.spawn(client_conn::serve_connection(
            tcp,
            peer,
            router.clone(),
            limits.clone(),
            slot,
            stopping.clone(),
        ));
    }
    drop(listener);
    let finished = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.shutdown_grace(), finished)
        .await
        .is_err()
    {
        tracing::warn!(
            connections = connections.len(),
            "shutdown grace over: closing the admin connections still running"
        );
        connections.shutdown().await;
    }
}
