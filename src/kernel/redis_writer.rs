//! The one way the gateway writes its shared counts to Redis (issue 44, docs/redis.md): a writer
//! task per kind of count (quota counters, the breaker's outcomes, the upstreams' own limits),
//! each sending what has queued in one script per round trip.
//!
//! Invariants:
//! - Nothing on the request path waits on a write: requests queue what they counted and wake the
//!   writer ([`Batches::take`] takes a batch of what has queued).
//! - Exactly once: each batch carries this writer's sequence number, and its script applies a
//!   batch only if its number is above the last one applied for this writer. A batch that failed
//!   or timed out is sent again unchanged until Redis answers, so a batch Redis ran late (a
//!   paused or slow server) and then again is applied once; what was counted meanwhile goes in
//!   the next batch.
//! - A failed write takes Redis for away for every user of the link ([`RedisLink::went_down`]);
//!   while it is, the writer probes it every [`RETRY`] (or at a wake) and sends again once a
//!   probe finds it back. Writers whose users queue nothing while Redis is away find nothing to
//!   send; the batch a writer held is sent again all the same. A writer with nothing to send
//!   starts probing as soon as any user of the link finds Redis away, so that an idle gateway
//!   learns it is back without a request.
//! - At shutdown the writer sends what has queued, one last try each; what Redis has not got is
//!   logged ([`Batches::left`]): the store has it.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::redis_link::RedisLink;

/// How long a writer waits before it tries an absent Redis again.
pub const RETRY: Duration = Duration::from_millis(200);

/// What one writer sends: its queue, and how a batch is written and what its answer teaches.
pub trait Batches: Send + Sync {
    /// One queued thing: a counter and its delta, a key's outcomes.
    type Item: Send + Sync;

    /// Takes up to one batch of what has queued (empty: nothing queued).
    fn take(&self) -> Vec<Self::Item>;

    /// Runs the script on batch number `seq` (applied once whatever the number of tries) and
    /// learns from its answer; `Err`: why Redis gave none.
    fn write(&self, seq: u64, items: &[Self::Item]) -> impl Future<Output = Result<(), String>> + Send;

    /// Stopping with `items` that Redis has not got (the store has them).
    fn left(&self, items: &[Self::Item]);
}

/// Runs the writer of `batches` on `link` until `shutdown` (then one last try): takes what has
/// queued when `wake` is notified, one batch per round trip.
pub async fn run<B: Batches>(
    link: &RedisLink,
    batches: &B,
    wake: &tokio::sync::Notify,
    shutdown: CancellationToken,
) {
    let mut seq: u64 = 0;
    let mut batch: Option<(u64, Vec<B::Item>)> = None;
    loop {
        let stopping = shutdown.is_cancelled();
        if batch.is_none() {
            let taken = batches.take();
            if taken.is_empty() {
                if stopping {
                    return;
                }
                // Nothing to send: wait for something, probing an absent Redis meanwhile (from
                // the moment any user of the link finds it away, traffic or not).
                let gone = link.taken_for_away();
                tokio::pin!(gone);
                gone.as_mut().enable();
                if link.is_up() || !link.probe().await {
                    let retry = async {
                        if link.is_up() {
                            gone.await;
                        } else {
                            tokio::time::sleep(RETRY).await;
                        }
                    };
                    tokio::select! {
                        () = wake.notified() => {},
                        () = retry => {},
                        () = shutdown.cancelled() => {},
                    }
                }
                continue;
            }
            seq += 1;
            batch = Some((seq, taken));
        }
        let Some((n, items)) = &batch else { continue };
        match batches.write(*n, items).await {
            Ok(()) => {
                batch = None;
                // A write may wait longer than a check may: only a probe within the checks'
                // bound says Redis is back.
                if !link.is_up() {
                    link.probe().await;
                }
            }
            Err(e) => {
                link.went_down(&e);
                if stopping {
                    batches.left(items);
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(RETRY) => {},
                    () = shutdown.cancelled() => {},
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A queue of numbers whose writes fail until `fail` runs out, noting every try.
    #[derive(Default)]
    struct Script {
        queued: Mutex<Vec<u32>>,
        fail: Mutex<u32>,
        tries: Mutex<Vec<(u64, Vec<u32>)>>,
        handed_back: Mutex<Vec<u32>>,
    }

    impl Batches for Script {
        type Item = u32;

        fn take(&self) -> Vec<u32> {
            std::mem::take(&mut *self.queued.lock().unwrap())
        }

        async fn write(&self, seq: u64, items: &[u32]) -> Result<(), String> {
            self.tries.lock().unwrap().push((seq, items.to_vec()));
            let mut fail = self.fail.lock().unwrap();
            if *fail == 0 {
                return Ok(());
            }
            *fail -= 1;
            Err("refused".to_owned())
        }

        fn left(&self, items: &[u32]) {
            self.handed_back.lock().unwrap().extend_from_slice(items);
        }
    }

    /// A failed batch is sent again unchanged, under its number, until it goes; what queued
    /// meanwhile goes in the next batch; a failure is the link's word for every user of it;
    /// a batch still failing at shutdown is handed back.
    #[tokio::test(start_paused = true)]
    async fn a_failed_batch_is_sent_again_under_its_number() {
        let link = RedisLink::new("redis://127.0.0.1:1/", Duration::from_millis(50)).expect("a url");
        let script = Script::default();
        *script.fail.lock().unwrap() = 2;
        script.queued.lock().unwrap().extend([1, 2]);
        let (wake, shutdown) = (tokio::sync::Notify::new(), CancellationToken::new());
        let writer = run(&link, &script, &wake, shutdown.clone());
        let driver = async {
            while script.tries.lock().unwrap().len() < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(!link.another_connection().is_up(), "one word for the link");
            script.queued.lock().unwrap().push(3);
            wake.notify_one();
            while script.tries.lock().unwrap().len() < 4 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            *script.fail.lock().unwrap() = u32::MAX;
            script.queued.lock().unwrap().push(4);
            wake.notify_one();
            while script.tries.lock().unwrap().len() < 5 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            shutdown.cancel();
        };
        tokio::join!(writer, driver);
        let tries = script.tries.lock().unwrap().clone();
        let firsts: Vec<(u64, Vec<u32>)> = tries.iter().take(4).cloned().collect();
        assert_eq!(
            firsts,
            [(1, vec![1, 2]), (1, vec![1, 2]), (1, vec![1, 2]), (2, vec![3])]
        );
        assert!(tries[4..].iter().all(|t| *t == (3, vec![4])), "{tries:?}");
        assert_eq!(*script.handed_back.lock().unwrap(), [4]);
    }

    /// A writer with nothing to send waits while Redis answers, and starts probing (a round of
    /// its loop each [`RETRY`]) as soon as another user of the link finds Redis away.
    #[tokio::test(start_paused = true)]
    async fn an_idle_writer_probes_once_another_user_finds_redis_away() {
        #[derive(Default)]
        struct Idle(Mutex<u32>);
        impl Batches for Idle {
            type Item = u32;
            fn take(&self) -> Vec<u32> {
                *self.0.lock().unwrap() += 1;
                Vec::new()
            }
            async fn write(&self, _: u64, _: &[u32]) -> Result<(), String> {
                Ok(())
            }
            fn left(&self, _: &[u32]) {}
        }
        let link = RedisLink::new("redis://127.0.0.1:1/", Duration::from_millis(50)).expect("a url");
        let idle = Idle::default();
        let (wake, shutdown) = (tokio::sync::Notify::new(), CancellationToken::new());
        let writer = run(&link, &idle, &wake, shutdown.clone());
        let driver = async {
            tokio::time::sleep(RETRY * 10).await;
            assert_eq!(
                *idle.0.lock().unwrap(),
                1,
                "no round while Redis answers and nothing queues"
            );
            link.another_connection().went_down("a check timed out");
            tokio::time::sleep(RETRY * 10).await;
            assert!(
                *idle.0.lock().unwrap() >= 5,
                "a round each RETRY once Redis is away"
            );
            shutdown.cancel();
        };
        tokio::join!(writer, driver);
    }
}
