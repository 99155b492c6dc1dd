//! What the calling thread is: a serving thread (whose runtime ends with its last request), and
//! whether its stop has cut the connections still running. Set by `serving`, read by the store
//! and the handlers, which need not know how serving is laid out.

thread_local! {
    /// Whether this thread is a serving thread (set once, when it starts).
    static SERVING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Whether this serving thread's stop has closed the connections still running.
    static CUT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether what ends now on this thread was cut by the gateway's stop (`shutdown_grace_secs`
/// over), not by its client.
pub fn cut_by_stop() -> bool {
    CUT.with(std::cell::Cell::get)
}

/// Whether the calling thread is a serving thread, whose runtime ends with its last request:
/// what must outlive a request (the database's connections) is not created here.
pub fn on_serving_thread() -> bool {
    SERVING.with(std::cell::Cell::get)
}

/// Marks the calling thread as a serving thread (once, when it starts).
pub(crate) fn mark_serving() {
    SERVING.with(|s| s.set(true));
}

/// Marks the calling serving thread's remaining connections as cut by the gateway's stop.
pub(crate) fn mark_cut() {
    CUT.with(|c| c.set(true));
}
