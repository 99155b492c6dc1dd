//! The background tasks that keep a gateway in step with the database and the other replicas:
//! the configuration poll (which also reads other gateways' locks and is the store's health
//! probe), the counter flushes, one task per kind of counter (the quota flush fires budget
//! alerts), the alert delivery; and [`AppState::sync`], which does all of them at once.

use std::sync::Arc;
use std::time::Duration;

use crate::quota::engine::Policies;
use crate::state::AppState;
use crate::upstream::pool::routes::Routes;

/// How often each gateway checks the configuration epoch by default (changes apply within a
/// second).
pub(super) const CONFIG_POLL: Duration = Duration::from_millis(500);

/// Polls the configuration epoch; on a change, reloads the routing snapshot and forgets cached
/// keys, so edits from the console or another replica apply within a second.
pub(super) fn start_config_watch(state: AppState, mut epoch: i64) {
    let s = state.clone();
    state.tasks.spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(s.config_poll) => {},
                () = s.shutdown.cancelled() => break,
            }
            // The epoch read is also the database's health probe: it ends an outage, and finds
            // one that a busy pool hides (store/health.rs).
            match s.store.probe_epoch().await {
                Ok(now) => {
                    s.store.note_success();
                    if now != epoch && s.reload().await {
                        epoch = now;
                    }
                }
                Err(e) => {
                    s.store.log_failure(&e, "configuration poll failed");
                    continue;
                }
            }
            // Locks written by other gateways (every poll: they are not configuration changes).
            if let Err(e) = s.locks.load(&s.store, s.clock.now_ms(), false).await {
                s.store.log_failure(&e, "lock poll failed");
            }
        }
    });
}

/// With `redis_url`: the writer of what this gateway shares through Redis, and the subscriber
/// that applies what the others publish (`upstream::pool::shared`). `first` is the subscription
/// made at start, if Redis answered then; when it is lost, the subscriber reconnects with a
/// doubling wait and, once back, reads the backoff levels again (it may have missed some).
pub(super) fn start_shared_locks(state: AppState, first: Option<redis::aio::PubSubStream>) {
    use crate::upstream::pool::shared::SharedLocks;
    use futures::StreamExt;
    let Some(shared) = state.shared_locks.clone() else {
        return;
    };
    let (s, writer) = (state.clone(), shared.clone());
    state.tasks.spawn(async move {
        let rest = |r| crate::upstream::dispatch::rest_group(s.upstreams(), r);
        writer.run_writer(&s.locks, &rest, s.shutdown.clone()).await;
    });
    let s = state.clone();
    state.tasks.spawn(async move {
        let mut next = first;
        let mut failures = 0;
        loop {
            let mut stream = match next.take() {
                Some(stream) => stream,
                None => match shared.resubscribe(&s.locks).await {
                    Ok(stream) => {
                        failures = 0;
                        stream
                    }
                    Err(e) => {
                        shared.note_subscribed(false, &e);
                        let wait = SharedLocks::reconnect_wait(failures);
                        failures = failures.saturating_add(1);
                        tokio::select! {
                            () = tokio::time::sleep(wait) => continue,
                            () = s.shutdown.cancelled() => return,
                        }
                    }
                },
            };
            loop {
                tokio::select! {
                    message = stream.next() => match message {
                        // A breaker notice is the breaker's, an own-limit notice admission's; anything
                        // else the locks'.
                        Some(m) if s.breakers.hear(m.get_payload_bytes(), s.clock.now_ms()) => {}
                        Some(m) if s.admission.hear(m.get_payload_bytes(), s.clock.now_ms()) => {}
                        Some(m) => shared.hear(&s.locks, m.get_payload_bytes(), s.clock.now_ms()),
                        None => break,
                    },
                    () = s.shutdown.cancelled() => return,
                }
            }
            shared.note_subscribed(false, "connection closed");
        }
    });
}

/// With `redis_url`: the writer of the breaker's outcomes and trips to Redis
/// (`breaker::shared`). A trip Redis's script made in this gateway's write is adopted here and
/// persisted as a trip decided here is; the others hear it on the locks' channel.
pub(super) fn start_shared_breakers(state: AppState) {
    let Some(shared) = state.breakers.redis().cloned() else {
        return;
    };
    let s = state.clone();
    state.tasks.spawn(async move {
        let now_ms = || s.clock.now_ms();
        let learn = |standing: crate::breaker::shared::Standing| {
            s.breakers.learn(&standing);
            let Some(t) = standing.tripped else { return };
            tracing::warn!(
                key = standing.key_id,
                trip = t.trip,
                banned = t.banned,
                "API key breaker tripped across gateways"
            );
            let (state, key) = (s.clone(), standing.key_id);
            s.spawn_background(async move {
                state
                    .store
                    .write_until_done("persisting a breaker trip", &state.shutdown, || {
                        crate::breaker::persist(&state.store, key, &t)
                    })
                    .await;
            });
        };
        shared.run(&now_ms, &learn, s.shutdown.clone()).await;
    });
}

/// With `redis_url`: the writer of the credentials' own-limit counts to Redis
/// (`upstream::pool::own_shared`); the totals it answers are kept by admission, and the others
/// hear them on the locks' channel.
pub(super) fn start_shared_own_limits(state: AppState) {
    let Some(shared) = state.admission.redis().cloned() else {
        return;
    };
    let s = state.clone();
    state.tasks.spawn(async move {
        shared.run(&s.admission, s.shutdown.clone()).await;
    });
}

/// The counts a gateway shares with the others through the store, each flushed by its own task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Counts {
    /// Quota counters (`usage_counters`).
    Quota,
    /// Upstream credentials' own-limit counts (`upstream_counters`).
    OwnLimits,
    /// The key breakers' shared window (`breaker_buckets`).
    Breakers,
}

impl Counts {
    const ALL: [Counts; 3] = [Counts::Quota, Counts::OwnLimits, Counts::Breakers];
}

/// Flushes each kind of count every flush interval, and once more at shutdown (after the last
/// request finished), so a graceful stop loses nothing. One task per kind: a flush slowed by row
/// locks (the breaker window's rows are shared by every gateway) delays only its own kind, never
/// the quota counters.
pub(super) fn start_counter_flushes(state: AppState) {
    let every = Duration::from_millis(state.settings.flush_interval_ms);
    for counts in Counts::ALL {
        let s = state.clone();
        state.tasks.spawn(async move {
            loop {
                let stopping = tokio::select! {
                    () = tokio::time::sleep(every) => false,
                    () = s.shutdown.cancelled() => true,
                };
                s.flush(counts).await;
                if stopping {
                    break;
                }
            }
        });
    }
}

/// How often the store's upkeep runs ([`crate::store::Store::optimize`]).
const UPKEEP: Duration = Duration::from_secs(3600);

/// How often the shared counters' ended rows are deleted.
const COUNTS_UPKEEP: Duration = Duration::from_secs(60);

/// Runs the store's upkeep: every hour the planner's statistics (SQLite: `PRAGMA optimize`;
/// nothing on Postgres), every minute the deletion of breaker buckets and quota counters whose
/// windows ended (every gateway does it; a second one finds nothing left).
pub(super) fn start_store_upkeep(state: AppState) {
    let s = state.clone();
    state.tasks.spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(UPKEEP) => s.store.optimize().await,
                () = s.shutdown.cancelled() => break,
            }
        }
    });
    let s = state.clone();
    state.tasks.spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(COUNTS_UPKEEP) => {}
                () = s.shutdown.cancelled() => break,
            }
            let now_s = s.clock.now().timestamp();
            if let Err(e) = s.store.delete_ended_counts(now_s, crate::breaker::BUCKETS_KEPT_SECS).await {
                tracing::warn!(error = %e, "deleting ended breaker buckets and quota counters failed; tried again in a minute");
            }
            s.label_upkeep().await;
        }
    });
}

/// How often each gateway looks for budget alerts due for delivery (retries and other
/// gateways' alerts); an alert fired here is sent at once.
const ALERT_POLL: Duration = Duration::from_secs(1);

/// Delivers budget alerts from the outbox: at once when this gateway fired one, else every
/// [`ALERT_POLL`]. At shutdown a delivery under way is dropped: its lease runs out and it is sent
/// again by whichever gateway runs next (receivers deduplicate by the alert's `id`).
pub(super) fn start_alert_delivery(state: AppState) {
    let s = state.clone();
    state.tasks.spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(ALERT_POLL) => {},
                () = s.alerts.wake.notified() => {},
                () = s.shutdown.cancelled() => break,
            }
            tokio::select! {
                _ = s.alerts.deliver_due(&s.store, &s.master_key, &s.clock) => {},
                () = s.shutdown.cancelled() => break,
            }
        }
    });
}

impl AppState {
    /// Shares everything this gateway has done so far and learns what the others did, without
    /// waiting for the background intervals: waits for the writes handed off the request path
    /// (locks, breaker trips), writes the queued request logs, exports the finished spans,
    /// flushes the quota, own-limit and breaker counts (firing budget alerts), then reloads the
    /// configuration, locks and trips from the store, and delivers the budget alerts due. The
    /// background tasks keep their intervals; this is the sync point of the behaviour tests
    /// (`TestApp::sync`), which would otherwise wait on those intervals.
    pub async fn sync(&self) {
        self.pending_writes.wait().await;
        self.logs.flush().await;
        self.tracer.flush().await;
        self.flush_counters().await;
        self.label_upkeep().await;
        self.reload().await;
        self.alerts
            .deliver_due(&self.store, &self.master_key, &self.clock)
            .await;
    }

    /// The labels' upkeep (tag values and end users: last sightings, expiry; issue 40 item 3).
    async fn label_upkeep(&self) {
        let (days, now) = (self.settings.label_expiry_days, self.clock.now_ms());
        if let Err(e) = self.labels.upkeep(&self.store, days, now).await {
            self.store.log_failure(
                &e,
                "label upkeep failed; sightings kept for the next, in a minute",
            );
        }
    }

    /// Writes the quota counters, upstream own-limit counts and breaker windows to the store and
    /// reads back what the other gateways counted, one after the other.
    async fn flush_counters(&self) {
        for counts in Counts::ALL {
            self.flush(counts).await;
        }
    }

    /// Writes one kind of count and reads back the others' totals; a failed flush keeps its
    /// counts for the next.
    async fn flush(&self, counts: Counts) {
        use crate::observability::telemetry::timed_flush;
        match counts {
            Counts::Quota => {
                // Labels first seen during an outage: stored, their counters moved to the
                // stored ids, before the flush writes them (issue 40 item 2).
                if let Err(e) = self
                    .labels
                    .settle(&self.store, &self.quota, self.clock.now_ms())
                    .await
                {
                    self.store.log_failure(
                        &e,
                        "labels seen during the outage not stored yet; kept for the next flush",
                    );
                }
                let flush = self.quota.flush(&self.store, self.clock.now());
                if let Err(e) = timed_flush("quota", flush).await {
                    self.store
                        .log_failure(&e, "quota flush failed; usage kept for the next flush");
                }
                // Budget alerts: the counters now hold every replica's totals.
                self.alerts
                    .fire(&self.store, &self.quota, self.clock.now(), |ws| {
                        self.timezone_of(ws)
                    })
                    .await;
            }
            Counts::OwnLimits => {
                let flush = self.admission.flush(&self.store, self.clock.now_ms());
                if let Err(e) = timed_flush("own_limits", flush).await {
                    self.store
                        .log_failure(&e, "own-limit flush failed; counts kept for the next flush");
                }
            }
            Counts::Breakers => {
                let flush = self.breakers.flush(&self.store, self.clock.now());
                if let Err(e) = timed_flush("breakers", flush).await {
                    self.store.log_failure(
                        &e,
                        "breaker window flush failed; outcomes kept for the next flush",
                    );
                }
            }
        }
    }

    /// Reloads the routing snapshot and forgets cached keys; false if the store failed.
    pub async fn reload(&self) -> bool {
        let loaded = async {
            Ok::<_, crate::store::StoreError>((
                Routes::load(&self.store, &self.master_key).await?,
                Policies::load(&self.store).await?,
                crate::alerts::AlertRules::load(&self.store).await?,
            ))
        };
        match loaded.await {
            Ok((routes, policies, alert_rules)) => {
                if let Err(e) = self.locks.load(&self.store, self.clock.now_ms(), true).await {
                    self.store.log_failure(&e, "lock reload failed");
                }
                // kRouter: an edited secret clears its per-model locks and backoff level on every
                // gateway, this one included, and in Redis (every gateway deletes the level there:
                // the same deletion, whichever comes first).
                for id in routes.secrets_replaced_since(&self.routes.load()) {
                    self.locks.secret_replaced(id);
                    if let Some(shared) = &self.shared_locks {
                        shared.share(crate::upstream::pool::shared::Share::Reset(id));
                    }
                }
                // Trips, blocks and bans written by another gateway.
                if let Err(e) = self.breakers.load(&self.store).await {
                    self.store.log_failure(&e, "breaker reload failed");
                }
                self.routes.store(Arc::new(routes));
                self.policies.store(Arc::new(policies));
                self.alerts.rules.store(Arc::new(alert_rules));
                self.keys.invalidate_all();
                true
            }
            Err(e) => {
                self.store.log_failure(&e, "configuration reload failed");
                false
            }
        }
    }
}
