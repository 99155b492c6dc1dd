//! groot ADR 0008's corroboration counted across gateways through Redis (issue 44, DESIGN.md
//! §11): 3 ambiguous 429s from 2 different members within 30 s on a quota group rest the group
//! even when no gateway saw them all; without Redis each gateway counts only its own traffic;
//! failures further apart than 30 s (by the gateways' clocks) corroborate nothing; Redis away,
//! the local rule still holds.

use std::time::{Duration, Instant};

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::Value;

use crate::both_backends;
use crate::helpers::{TestApp, TestDb, chat};
use crate::proxy::KEY;
use crate::redis_locks::{NEVER, gateway, until_parked};
use crate::redis_quota::RedisServer;
use crate::upstream::{BOB_KEY, ambiguous_429, pool_of, with_bob};

/// The quota group `acct`: `one` and `two` both serve m1 to m4 on one account; Bob is a second
/// member beside Ada (whose key is [`KEY`]).
fn group(mock: &MockUpstream) -> String {
    let (url, models, group) = (
        mock.base_url(),
        r#"["m1", "m2", "m3", "m4"]"#,
        "quota_group = \"acct\"",
    );
    with_bob(pool_of(&[
        ("one", &url, "cred-one", models, group),
        ("two", &url, "cred-two", models, group),
    ]))
}

/// Moves every gateway's clock on by `secs` (they stay together, as synchronised clocks do).
fn advance(apps: &[&TestApp], secs: i64) {
    for app in apps {
        app.clock.advance(chrono::Duration::seconds(secs));
    }
}

/// Waits (10 s at most) until Redis holds exactly `n` ambiguous failures.
async fn until_witnesses(redis: &RedisServer, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis.witnesses().await != n {
        assert!(Instant::now() < deadline, "Redis never held {n} failures");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `cred-one` answers every call with an ambiguous 429: two through `a` from Ada (m1, m2), then
/// (after `gap` seconds on both clocks) one through `b` from Bob (m3). Neither gateway alone
/// sees 3 failures from 2 members. With `redis`, `b`'s failure is sent once Redis holds `a`'s.
async fn split_failures(
    a: &TestApp,
    b: &TestApp,
    mock: &MockUpstream,
    redis: Option<&RedisServer>,
    gap: i64,
) {
    mock.script(Script::any().credential("cred-one").error(429, ambiguous_429()));
    for model in ["m1", "m2"] {
        let r = a.post_json("/v1/chat/completions", KEY, &chat(model)).await;
        assert_eq!(r.status(), 429, "{model}");
        advance(&[a, b], 5);
    }
    if let Some(redis) = redis {
        until_witnesses(redis, 2).await;
    }
    advance(&[a, b], gap);
    let r = b.post_json("/v1/chat/completions", BOB_KEY, &chat("m3")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        ambiguous_429(),
        "the upstream's own 429"
    );
    assert_eq!(
        mock.call_count(),
        3,
        "only `one` was called: the request skips its group"
    );
}

/// `app` serves m4 (the group does not rest): one more upstream call, answered 200.
async fn serves_m4(app: &TestApp, mock: &MockUpstream) {
    let before = mock.call_count();
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m4")).await;
    assert_eq!(r.status(), 200, "the group does not rest");
    assert_eq!(mock.call_count(), before + 1);
}

both_backends!(
    redis_corroborates_ambiguous_429s_seen_by_different_gateways,
    without_redis_each_gateway_corroborates_only_its_own_429s,
    ambiguous_429s_over_30_s_apart_do_not_corroborate_through_redis,
    redis_away_each_gateway_still_corroborates_its_own_429s,
);

/// Two failures from Ada through `a`, one from Bob through `b`: Redis counts 3 from 2 members
/// within 30 s, `b` rests the group, and both gateways then refuse another model of the group
/// (`upstream_quota_exhausted`, the rate-limit wording's 90 s) without calling upstream.
async fn redis_corroborates_ambiguous_429s_seen_by_different_gateways(db: TestDb) {
    let Some(redis) = RedisServer::start() else { return };
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, group(&mock), Some(redis.url()), NEVER).await;
    let b = gateway(&db, group(&mock), Some(redis.url()), NEVER).await;
    split_failures(&a, &b, &mock, Some(&redis), 0).await;
    for app in [&a, &b] {
        until_parked(app, &[app.credential_id("two").await]).await;
    }
    for app in [&a, &b] {
        let r = app.post_json("/v1/chat/completions", KEY, &chat("m4")).await;
        assert_eq!(r.status(), 429);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "upstream_quota_exhausted", "{body}");
        assert_eq!(body["error"]["retry_after"], 90, "{body}");
    }
    assert_eq!(mock.call_count(), 3, "nothing sent upstream once the group rests");
    assert_eq!(redis.witnesses().await, 0, "the rest starts the count over");
    a.stop().await;
    b.stop().await;
}

/// The control: the same failures without Redis rest nothing; both gateways still serve m4.
async fn without_redis_each_gateway_corroborates_only_its_own_429s(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, group(&mock), None, NEVER).await;
    let b = gateway(&db, group(&mock), None, NEVER).await;
    split_failures(&a, &b, &mock, None, 0).await;
    mock.reset();
    serves_m4(&a, &mock).await;
    serves_m4(&b, &mock).await;
    a.stop().await;
    b.stop().await;
}

/// Bob's failure comes 31 s after Ada's (both clocks moved): Ada's have left the window, Redis
/// holds Bob's alone, and the group does not rest.
async fn ambiguous_429s_over_30_s_apart_do_not_corroborate_through_redis(db: TestDb) {
    let Some(redis) = RedisServer::start() else { return };
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, group(&mock), Some(redis.url()), NEVER).await;
    let b = gateway(&db, group(&mock), Some(redis.url()), NEVER).await;
    split_failures(&a, &b, &mock, Some(&redis), 31).await;
    until_witnesses(&redis, 1).await;
    mock.reset();
    serves_m4(&a, &mock).await;
    serves_m4(&b, &mock).await;
    a.stop().await;
    b.stop().await;
}

/// Redis gone: nothing fails, and a gateway whose own traffic corroborates (Ada twice, Bob once,
/// all through `a`) rests the group at once, as without Redis.
async fn redis_away_each_gateway_still_corroborates_its_own_429s(db: TestDb) {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    redis.kill();
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, group(&mock), Some(url), NEVER).await;
    split_failures(&a, &a, &mock, None, 0).await;
    let r = a.post_json("/v1/chat/completions", KEY, &chat("m4")).await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted", "{body}");
    assert_eq!(mock.call_count(), 3, "nothing sent upstream once the group rests");
    a.stop().await;
}
