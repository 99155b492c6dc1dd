//! Serving client connections: `axum::serve` on the process's multi-threaded runtime, which
//! spreads connections and their requests over its workers (and steals work between them).

use std::future::Future;
use std::io;
use std::net::SocketAddr;

use axum::Router;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;

/// Serves `router` on `listener` until `stop` resolves, then stops accepting and lets the
/// running requests finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    stop: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    // Streamed chunks must leave at once: no Nagle delay on client connections.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(stop)
    .await
}
