//! Adaptive idle polling for the serving threads, as KVM's halt polling does it for a virtual CPU.
//!
//! A thread that runs out of work sleeps in `epoll_wait`; the next packet has to wake it, which
//! costs tens of microseconds where the CPU halts in between (a virtual machine without guest
//! halt polling: each wake-up is an interrupt through the hypervisor). A proxied request waits
//! twice — for the upstream's answer and for the client's next request — so it paid two such
//! wake-ups on top of the direct path. A serving thread that has just run out of work therefore
//! keeps polling for I/O (never blocking) for a short window before it sleeps, and gives way to
//! any other runnable thread on its core at every turn.
//!
//! The window adapts as KVM's does: it grows (doubling from [`START`] up to the configured most)
//! while the thread keeps being woken within that most of going idle, so that polling would have
//! caught the wake-up; it shrinks (halving, then off) when the thread sleeps longer, so a gateway
//! whose work arrives far apart — most LLM traffic: an upstream answers in hundreds of
//! milliseconds — polls not at all. Setting the most to 0 turns it off.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The first window once polling starts to pay.
pub const START: Duration = Duration::from_micros(10);
/// A round trip through the scheduler longer than this ran other work (a bare poll of the I/O
/// driver is about a microsecond).
const BUSY: Duration = Duration::from_micros(5);

/// The next window, after the thread went idle for `gap` and was woken (KVM's grow and shrink).
pub fn next_window(window: Duration, gap: Duration, most: Duration) -> Duration {
    if gap <= most {
        (window * 2).clamp(START, most)
    } else {
        let half = window / 2;
        if half < START { Duration::ZERO } else { half }
    }
}

thread_local! {
    /// This thread's window.
    static WINDOW: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    /// When this thread last ran out of work, while it is idle.
    static IDLE_SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
    /// When the poller last stopped, and the last work it had seen then.
    static POLLED: Cell<Option<(Instant, Instant)>> = const { Cell::new(None) };
}

/// Adds idle polling of at most `most` to a current-thread runtime being built; call
/// [`spawn_poller`] inside it once it runs. Returns the poller's wake-up, or `None` when `most`
/// is zero (polling off).
pub fn install(rt: &mut tokio::runtime::Builder, most: Duration) -> Option<Arc<Notify>> {
    if most.is_zero() {
        return None;
    }
    let unparked = Arc::new(Notify::new());
    let wake = unparked.clone();
    rt.on_thread_park(|| {
        let now = Instant::now();
        // Idle since the poller's last work if it has just stopped polling, else from now.
        let since = match POLLED.with(Cell::take) {
            Some((stopped, last_work)) if now - stopped <= BUSY => last_work,
            _ => now,
        };
        IDLE_SINCE.with(|s| {
            if s.get().is_none() {
                s.set(Some(since));
            }
        });
    })
    .on_thread_unpark(move || {
        if let Some(since) = IDLE_SINCE.with(Cell::take) {
            WINDOW.with(|w| w.set(next_window(w.get(), since.elapsed(), most)));
        }
        wake.notify_one();
    });
    Some(unparked)
}

/// Starts the poller on the current (serving) thread's runtime: after each wake-up it keeps the
/// thread polling for I/O until the thread has had no work for its window.
pub fn spawn_poller(unparked: Arc<Notify>) {
    tokio::spawn(async move {
        loop {
            unparked.notified().await;
            if WINDOW.with(Cell::get).is_zero() {
                continue;
            }
            let mut last_work = Instant::now();
            loop {
                let window = WINDOW.with(Cell::get);
                // Another thread that can run on this core goes first.
                std::thread::yield_now();
                let before = Instant::now();
                // With this task the only one ready, the scheduler polls the I/O driver without
                // blocking and runs what that woke before coming back here.
                tokio::task::yield_now().await;
                let now = Instant::now();
                if now - before > BUSY {
                    last_work = now;
                } else if now - last_work >= window {
                    break;
                }
            }
            POLLED.with(|p| p.set(Some((Instant::now(), last_work))));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_grows_while_wake_ups_come_soon_and_shrinks_when_they_do_not() {
        let us = Duration::from_micros;
        let most = us(200);
        // (window, gap, next)
        let cases = [
            (us(0), us(60), us(10)),     // off, woken soon: start
            (us(10), us(60), us(20)),    // doubles
            (us(160), us(60), us(200)),  // capped at the most
            (us(200), us(200), us(200)), // a gap of exactly the most still pays
            (us(200), us(201), us(100)), // slept longer: halves
            (us(20), us(5000), us(10)),
            (us(10), us(5000), us(0)), // below the start: off
            (us(0), us(5000), us(0)),
        ];
        for (window, gap, next) in cases {
            assert_eq!(next_window(window, gap, most), next, "{window:?} after {gap:?}");
        }
    }
}
