//! The upstream credentials' own-limit counts through Redis (issue 44, DESIGN.md §1, §6 and §11,
//! docs/upstreams.md): two gateways on one database and one Redis hold a credential to its own
//! requests and tokens per minute between them, each learning the other's counts from Redis's
//! answers instead of the store; Redis away, the store path shares them as before.
//!
//! The gateways here flush to the store once a minute and never poll it (unless a test flushes
//! them by hand): what they learn of each other within a test, Redis told them. Each test starts
//! its own `redis-server` on a free port ([`RedisServer`]).

use std::time::{Duration, Instant};

use aigw::mock_upstream::MockUpstream;
use serde_json::Value;

use crate::both_backends;
use crate::helpers::{TestApp, TestDb, chat};
use crate::proxy::KEY;
use crate::redis_quota::{RedisServer, redis_only_gateway};
use crate::upstream::{credentials_called, pool_of};

/// A gateway on `db` serving `resources` through the Redis at `redis`, taught by Redis alone.
async fn gateway(db: &TestDb, resources: &str, redis: String) -> TestApp {
    redis_only_gateway(db, resources.to_owned(), redis).await
}

/// A pool of `one` (serving m1 with its own `limits`) and `two` (m1, no limit), both on `url`.
fn one_then_two(url: &str, limits: &str) -> String {
    pool_of(&[
        ("one", url, "cred-one", r#"["m1"]"#, limits),
        ("two", url, "cred-two", r#"["m1"]"#, ""),
    ])
}

/// Waits (20 s at most: a loaded host) until `app` counts at least `want` of `credential`'s
/// current windows (requests and tokens of the minute, requests of the day: `which` 0, 1, 2).
async fn until_counted(app: &TestApp, credential: i64, which: usize, want: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while app.state.admission.used(credential, app.clock.now_ms())[which] < want {
        assert!(
            Instant::now() < deadline,
            "this gateway never learnt {want} of count {which}: {:?}",
            app.state.admission.used(credential, app.clock.now_ms())
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (20 s at most) until `app` takes Redis for `up` or away.
async fn until_redis(app: &TestApp, up: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let shared = app.state.admission.redis().expect("redis_url is set");
    while shared.is_up() != up {
        assert!(Instant::now() < deadline, "Redis never taken for up = {up}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Redis's count of `credential`'s requests in `app`'s current minute.
async fn in_redis(redis: &RedisServer, app: &TestApp, credential: i64) -> Option<i64> {
    use aigw::upstream::pool::{admission::Count, own_shared::redis_key};
    let now = app.clock.now_ms();
    let key = redis_key(credential, Count::MinuteRequests, now - now.rem_euclid(60_000));
    let client = redis::Client::open(redis.url()).expect("url");
    let mut c = client.get_multiplexed_async_connection().await.expect("connect");
    redis::cmd("GET").arg(key).query_async(&mut c).await.expect("get")
}

async fn status(app: &TestApp) -> u16 {
    app.post_json("/v1/chat/completions", KEY, &chat("m1"))
        .await
        .status()
        .as_u16()
}

/// Asserts `app` answers the exhausted pool's 429 (DESIGN.md §6), the minute's end 60 s away.
async fn assert_exhausted(app: &TestApp) {
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "60");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted", "{body}");
    assert_eq!(
        body["error"]["message"],
        "all upstream credentials for this model are rate limited"
    );
}

both_backends!(
    requests_per_minute_split_across_two_gateways,
    a_full_credential_fails_over_on_the_other_gateway_at_once,
    tokens_per_minute_counted_at_completion_reach_the_other_gateway,
    redis_away_the_store_still_shares_own_limits,
    a_batch_a_paused_redis_ran_late_counts_once,
);

/// 4 requests/minute, 2 sent on each gateway: the next one on either is refused at once, though
/// neither has flushed to the store.
async fn requests_per_minute_split_across_two_gateways(db: TestDb) {
    let Some(redis) = RedisServer::start() else { return };
    let mock = MockUpstream::start().await.unwrap();
    let limits = "limits = { requests_per_minute = 4 }";
    let text = pool_of(&[("solo", &mock.base_url(), "cred-solo", r#"["m1"]"#, limits)]);
    let a = gateway(&db, &text, redis.url()).await;
    let b = gateway(&db, &text, redis.url()).await;
    let solo = a.credential_id("solo").await;
    for app in [&a, &b, &a, &b] {
        assert_eq!(status(app).await, 200);
    }
    until_counted(&a, solo, 0, 4).await;
    until_counted(&b, solo, 0, 4).await;
    assert_exhausted(&a).await;
    assert_exhausted(&b).await;
    assert_eq!(mock.call_count(), 4, "4 between both gateways, not 4 each");
    assert!(a.state.admission.redis().is_some_and(|r| r.is_up()));
    a.stop().await;
    b.stop().await;
}

/// `one` allows 2 requests/minute: one sent on each gateway, A's next request goes to `two`.
async fn a_full_credential_fails_over_on_the_other_gateway_at_once(db: TestDb) {
    let Some(redis) = RedisServer::start() else { return };
    let mock = MockUpstream::start().await.unwrap();
    let text = one_then_two(&mock.base_url(), "limits = { requests_per_minute = 2 }");
    let a = gateway(&db, &text, redis.url()).await;
    let b = gateway(&db, &text, redis.url()).await;
    let one = a.credential_id("one").await;
    assert_eq!(status(&a).await, 200);
    assert_eq!(status(&b).await, 200);
    until_counted(&a, one, 0, 2).await;
    assert_eq!(status(&a).await, 200);
    assert_eq!(credentials_called(&mock), ["cred-one", "cred-one", "cred-two"]);
    a.stop().await;
    b.stop().await;
}

/// `one` allows 10 tokens/minute (the mock reports 6 a request): a request completed on each
/// gateway, A's next request goes to `two`.
async fn tokens_per_minute_counted_at_completion_reach_the_other_gateway(db: TestDb) {
    let Some(redis) = RedisServer::start() else { return };
    let mock = MockUpstream::start().await.unwrap();
    let text = one_then_two(&mock.base_url(), "limits = { tokens_per_minute = 10 }");
    let a = gateway(&db, &text, redis.url()).await;
    let b = gateway(&db, &text, redis.url()).await;
    let one = a.credential_id("one").await;
    assert_eq!(status(&a).await, 200);
    until_counted(&b, one, 1, 6).await;
    assert_eq!(status(&b).await, 200, "6 of 10 tokens: `one` still has room");
    until_counted(&a, one, 1, 12).await;
    assert_eq!(status(&a).await, 200);
    assert_eq!(
        credentials_called(&mock),
        ["cred-one", "cred-one", "cred-two"],
        "12 tokens this minute between both gateways: `one` is skipped"
    );
    a.stop().await;
    b.stop().await;
}

/// Redis stopped: the gateways share the counts through the store's flushes as without Redis.
async fn redis_away_the_store_still_shares_own_limits(db: TestDb) {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let limits = "limits = { requests_per_minute = 2 }";
    let text = pool_of(&[("solo", &mock.base_url(), "cred-solo", r#"["m1"]"#, limits)]);
    let a = gateway(&db, &text, redis.url()).await;
    let b = gateway(&db, &text, redis.url()).await;
    redis.kill();
    let flush = || async {
        for g in [&a, &b, &a, &b] {
            let s = &g.state;
            s.admission.flush(&s.store, g.clock.now_ms()).await.unwrap();
        }
    };
    assert_eq!(status(&a).await, 200);
    flush().await;
    assert_eq!(status(&b).await, 200);
    flush().await;
    assert_exhausted(&a).await;
    assert_exhausted(&b).await;
    assert_eq!(mock.call_count(), 2, "2 between both gateways through the store");
    until_redis(&a, false).await;
    a.stop().await;
    b.stop().await;
}

/// Redis paused (SIGSTOP) while A writes its request: the write times out and is sent again until
/// Redis answers; resumed, Redis runs every copy it was sent, and the request counts once.
async fn a_batch_a_paused_redis_ran_late_counts_once(db: TestDb) {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let limits = "limits = { requests_per_minute = 3 }";
    let text = pool_of(&[("solo", &mock.base_url(), "cred-solo", r#"["m1"]"#, limits)]);
    let a = gateway(&db, &text, redis.url()).await;
    let b = gateway(&db, &text, redis.url()).await;
    let solo = a.credential_id("solo").await;
    redis.signal("-STOP");
    assert_eq!(status(&a).await, 200, "admitted in memory, Redis paused");
    until_redis(&a, false).await;
    redis.signal("-CONT");
    until_redis(&a, true).await;
    // Any writer's probe may find Redis back before the own limits' writer's batch is in.
    let deadline = Instant::now() + Duration::from_secs(20);
    while in_redis(&redis, &a, solo).await.is_none() {
        assert!(Instant::now() < deadline, "the batch never reached Redis");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(in_redis(&redis, &a, solo).await, Some(1), "counted once");
    assert_eq!(a.state.admission.used(solo, a.clock.now_ms())[0], 1);
    assert_eq!(status(&b).await, 200);
    until_counted(&a, solo, 0, 2).await;
    assert_eq!(status(&a).await, 200);
    until_counted(&b, solo, 0, 3).await;
    assert_exhausted(&a).await;
    assert_exhausted(&b).await;
    assert_eq!(mock.call_count(), 3);
    a.stop().await;
    b.stop().await;
}
