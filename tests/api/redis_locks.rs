//! Credential locks, group rests and backoff levels shared through Redis (issue 44, DESIGN.md
//! §11): a park through one gateway is skipped by the others at once, not at their next store
//! poll; the backoff level belongs to the account and survives a restart of every gateway; Redis
//! away, the store poll still brings every lock and no request fails because of Redis.
//!
//! Each test starts its own `redis-server` on a free port ([`RedisServer`]).

use std::time::{Duration, Instant};

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, Setup, TestApp, TestDb, chat, default_start, spawn_app};
use crate::proxy::KEY;
use crate::redis_quota::RedisServer;
use crate::upstream::pool_of;

/// Two credentials serving `m1`.
pub(crate) fn pair(mock: &MockUpstream) -> String {
    let url = &mock.base_url();
    ResourcesBuilder::acme(KEY)
        .upstream("acme", "one", url, "cred-one", &["m1"])
        .with("priority", 0)
        .upstream("acme", "two", url, "cred-two", &["m1"])
        .with("priority", 1)
        .into()
}

/// A gateway on `db` with `resources`, Redis at `redis` (none: without), whose store poll of
/// other gateways' locks runs every `poll`.
pub(crate) async fn gateway(
    db: &TestDb,
    resources: String,
    redis: Option<String>,
    poll: Duration,
) -> TestApp {
    let setup = Setup {
        config_poll: Some(poll),
        settings: Box::new(move |s| {
            s.redis_url = redis.map(aigw::config::Secret::new);
            s.redis_timeout_ms = 100;
        }),
        ..Setup::resources(resources)
    };
    spawn_app(db, setup).await
}

/// The poll of a gateway that must learn nothing from the store during a test.
pub(crate) const NEVER: Duration = Duration::from_secs(3600);

/// Waits (10 s at most) until `app` holds a running lock on each of `credentials`.
pub(crate) async fn until_parked(app: &TestApp, credentials: &[i64]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while credentials
        .iter()
        .any(|c| app.state.locks.of(*c, app.clock.now_ms()).is_empty())
    {
        assert!(Instant::now() < deadline, "the locks never reached this gateway");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Parks both credentials of [`pair`] for 300 s through `a` (two upstream calls).
pub(crate) async fn park_both(a: &TestApp, mock: &MockUpstream) {
    let limited = json!({"error": {"message": "slow down"}});
    mock.script(Script::any().header("retry-after", "300").error(429, limited));
    let r = a.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(mock.call_count(), 2, "both credentials tried and parked");
}

both_backends!(
    a_park_reaches_the_other_gateway_at_once_through_redis,
    without_redis_the_other_gateway_calls_until_its_store_poll,
    the_backoff_level_survives_a_restart_of_every_gateway,
    redis_away_leaves_locks_to_the_store_poll,
);

/// `b` reads the store only once an hour: with Redis it learns `a`'s parks at once and answers
/// `upstream_quota_exhausted` without calling upstream.
async fn a_park_reaches_the_other_gateway_at_once_through_redis(db: TestDb) {
    let Some(redis) = RedisServer::start() else { return };
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, pair(&mock), Some(redis.url()), NEVER).await;
    let b = gateway(&db, pair(&mock), Some(redis.url()), NEVER).await;
    park_both(&a, &mock).await;
    until_parked(&b, &[b.credential_id("one").await, b.credential_id("two").await]).await;
    let r = b.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted", "{body}");
    assert!(body["error"]["retry_after"].as_i64().unwrap_or(0) > 290, "{body}");
    assert_eq!(mock.call_count(), 2, "nothing sent upstream by the other gateway");
    a.stop().await;
    b.stop().await;
}

/// The same without Redis: the locks are in the store, but `b` calls the parked credentials
/// until its poll reads them (what the test above shows Redis removes).
async fn without_redis_the_other_gateway_calls_until_its_store_poll(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, pair(&mock), None, NEVER).await;
    let b = gateway(&db, pair(&mock), None, NEVER).await;
    park_both(&a, &mock).await;
    a.sync().await;
    let r = b.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(mock.call_count(), 4, "`b` called both parked credentials again");
    a.stop().await;
    b.stop().await;
}

/// kRouter rule 5, "the backoff level belongs to the account": two overloads in a row through
/// `a` (2 s, then 4 s); `a` stops; a new gateway on the same Redis parks the next overload for
/// 8 s, the third step, not the first.
async fn the_backoff_level_survives_a_restart_of_every_gateway(db: TestDb) {
    let Some(redis) = RedisServer::start() else { return };
    let mock = MockUpstream::start().await.unwrap();
    let solo = || pool_of(&[("solo", &mock.base_url(), "cred-solo", r#"["m1"]"#, "")]);
    let a = gateway(&db, solo(), Some(redis.url()), NEVER).await;
    let overloaded = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    mock.script(Script::any().error(529, overloaded));
    for wait in [2, 4] {
        let r = a.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
        assert_eq!(r.status(), 529);
        a.clock.advance(chrono::Duration::seconds(wait));
    }
    assert_eq!(a.state.locks.backoff_level(a.credential_id("solo").await), 2);
    a.stop().await;

    // Started after `a`'s last lock ended, with no level of its own.
    let c = spawn_app(
        &db,
        Setup {
            start: default_start() + chrono::Duration::seconds(10),
            settings: Box::new({
                let url = redis.url();
                move |s| s.redis_url = Some(aigw::config::Secret::new(url))
            }),
            ..Setup::resources(solo())
        },
    )
    .await;
    let r = c.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 529, "the credential is not parked any more");
    let r = c.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted", "{body}");
    assert_eq!(body["error"]["retry_after"], 8, "the third backoff step: {body}");
    assert_eq!(mock.call_count(), 3);
    c.stop().await;
}

/// Redis gone (its port closed): every request is served as without it, and `b` learns `a`'s
/// parks through its store poll (every 50 ms here).
async fn redis_away_leaves_locks_to_the_store_poll(db: TestDb) {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    redis.kill();
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, pair(&mock), Some(url.clone()), NEVER).await;
    let b = gateway(&db, pair(&mock), Some(url), Duration::from_millis(50)).await;
    for app in [&a, &b] {
        let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
        assert_eq!(r.status(), 200, "served without Redis");
    }
    mock.reset();
    park_both(&a, &mock).await;
    a.sync().await;
    until_parked(&b, &[b.credential_id("one").await, b.credential_id("two").await]).await;
    let r = b.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted", "{body}");
    assert_eq!(mock.call_count(), 2, "nothing sent upstream by the other gateway");
    a.stop().await;
    b.stop().await;
}
