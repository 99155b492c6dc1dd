//! The breaker's shared window and standings through Redis (issue 44, DESIGN.md §5 and §11,
//! LyRouter seed 003 "Error-rate circuit breaker"): two gateways on one database and one Redis
//! judge a key by their combined 60 s window, trip it once, and each refuses it from its next
//! request after the other's trip; Redis away, the store-shared window still trips it.
//!
//! The gateways here flush to the store once a minute and never poll it (unless a test syncs
//! them): what they learn of each other within a test, Redis told them. Each test starts its own
//! `redis-server` on a free port ([`RedisServer`]).

use std::time::{Duration, Instant};

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::both_backends;
use crate::breaker::{bad, good, send};
use crate::helpers::{ResourcesBuilder, TestApp, TestDb};
use crate::proxy::KEY;
use crate::redis_quota::{RedisServer, redis_only_gateway};

/// One upstream serving the model, room for every held request.
fn resources(mock: &MockUpstream) -> String {
    ResourcesBuilder::acme(KEY)
        .upstream("acme", "lone", &mock.base_url(), "cred-lone", &["gpt-4o-mini"])
        .with("max_in_flight", 1000)
        .into()
}

/// A gateway on `db` and the Redis at `redis`, taught by Redis alone.
async fn gateway(db: &TestDb, mock: &MockUpstream, redis: String) -> TestApp {
    redis_only_gateway(db, resources(mock), redis).await
}

/// Waits (20 s at most: a loaded host) until `app` holds the key at `trips` trips or more.
async fn until_trips(app: &TestApp, key_id: i64, trips: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while app.state.breakers.standing(key_id, app.clock.now_ms()).0 < trips {
        assert!(
            Instant::now() < deadline,
            "trip {trips} never reached this gateway"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (20 s at most) until `app` has written everything it queued for Redis and adopted the
/// answers.
async fn until_settled(app: &TestApp) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let shared = app.state.breakers.redis().expect("redis_url is set");
    while !shared.settled() {
        assert!(Instant::now() < deadline, "the writer never caught up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The key's trips as Redis holds them.
async fn trips_in(redis: &RedisServer, key_id: i64) -> u32 {
    let client = redis::Client::open(redis.url()).expect("url");
    let mut c = client.get_multiplexed_async_connection().await.expect("connect");
    let trips: Option<u32> = redis::cmd("HGET")
        .arg(aigw::breaker::shared::standing_key(key_id))
        .arg("trips")
        .query_async(&mut c)
        .await
        .expect("hget");
    trips.unwrap_or(0)
}

/// The answer to one more request: status, `Retry-After`, error body.
async fn refused(app: &TestApp) -> (u16, Option<String>, Value) {
    let r = app.post_json("/v1/chat/completions", KEY, &good()).await;
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap_or("").to_owned());
    (status, retry, r.json().await.unwrap_or(Value::Null))
}

/// Asserts `app` refuses the key with the breaker's open error, `secs` to wait.
async fn assert_open(app: &TestApp, secs: i64) {
    let (status, retry, body) = refused(app).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(retry.as_deref(), Some(secs.to_string().as_str()), "{body}");
    assert_eq!(body["error"]["code"], "api_key_circuit_open", "{body}");
    assert_eq!(body["error"]["retry_after"], secs, "{body}");
    let until =
        chrono::DateTime::parse_from_rfc3339(body["error"]["blocked_until"].as_str().unwrap()).unwrap();
    assert_eq!(until.timestamp() - app.clock.now().timestamp(), secs);
}

/// The key's trips as the store records them (each gateway synced first: the trips persisted).
async fn recorded(apps: &[&TestApp], key_id: i64) -> Vec<aigw::breaker::Trip> {
    for app in apps {
        app.sync().await;
    }
    aigw::breaker::history(&apps[0].state.store, key_id)
        .await
        .unwrap()
}

fn advance(apps: &[&TestApp], secs: i64) {
    for app in apps {
        app.clock.advance(chrono::Duration::seconds(secs));
    }
}

both_backends!(
    failures_split_across_two_gateways_trip_the_key_once,
    a_burst_in_flight_on_both_gateways_trips_once_per_step,
    a_ban_reaches_the_other_gateway_at_once,
    redis_away_the_store_shared_window_still_trips,
    an_emptied_redis_takes_the_trip_count_back_from_the_gateways,
    successes_on_a_gateway_without_failures_count_against_the_others,
);

/// 60 failures on A, 50 on B: neither gateway alone has 100 requests, the two together trip the
/// key once, and both refuse it from then on without a store read.
async fn failures_split_across_two_gateways_trip_the_key_once(db: TestDb) {
    let Some(redis) = RedisServer::start() else { return };
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, &mock, redis.url()).await;
    let b = gateway(&db, &mock, redis.url()).await;
    assert!(send(&a, 60, &bad()).await.iter().all(|s| *s == 400));
    let key_id = a.logs("acme", 1).await[0].key_id;
    let on_b = send(&b, 50, &bad()).await;
    assert!(on_b.iter().all(|s| *s == 400 || *s == 429), "{on_b:?}");
    until_trips(&b, key_id, 1).await;
    assert_open(&b, 30).await;
    until_trips(&a, key_id, 1).await;
    assert_open(&a, 30).await;
    let trips = recorded(&[&a, &b], key_id).await;
    assert_eq!(trips.len(), 1, "{trips:?}");
    assert_eq!(trips[0].blocked_until, Some(trips[0].at + 30_000));
    assert!(trips[0].requests >= 100 && trips[0].failures == trips[0].requests);
    a.stop().await;
    b.stop().await;
}

/// `n` requests of each gateway held at the upstream, then answered 400 together.
async fn burst(apps: &[(&TestApp, usize)], mock: &MockUpstream) {
    let total: usize = apps.iter().map(|(_, n)| n).sum();
    mock.hold();
    let says_no = json!({"error": {"message": "mock says no", "type": "invalid_request_error"}});
    mock.script(
        Script::any()
            .times(u32::try_from(total).unwrap())
            .error(400, says_no),
    );
    let mut requests = Vec::new();
    for (app, n) in apps {
        for _ in 0..*n {
            let (client, url) = (app.client.clone(), format!("{}/v1/chat/completions", app.address));
            requests.push(tokio::spawn(async move {
                let r = client.post(url).bearer_auth(KEY).json(&good()).send().await;
                r.map_or(0, |r| r.status().as_u16())
            }));
        }
    }
    tokio::time::timeout(Duration::from_secs(60), mock.until_held(total))
        .await
        .expect("every request reached the upstream");
    mock.release();
    for r in requests {
        assert_eq!(r.await.unwrap(), 400);
    }
}

/// The named defect: a burst of failures in flight on both gateways must not walk the key up the
/// ladder. Each burst, whether neither gateway alone, both, or one alone has 100 failures, trips
/// the key once: the next step of the ladder, recorded once.
async fn a_burst_in_flight_on_both_gateways_trips_once_per_step(db: TestDb) {
    let Some(redis) = RedisServer::start() else { return };
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, &mock, redis.url()).await;
    let b = gateway(&db, &mock, redis.url()).await;
    // (held on A, held on B, the trip it makes, its block in seconds)
    let cases = [(90, 90, 1, 30), (120, 120, 2, 120), (0, 150, 3, 600)];
    let mut key_id = None;
    for (on_a, on_b, trip, secs) in cases {
        burst(&[(&a, on_a), (&b, on_b)], &mock).await;
        let key = match key_id {
            Some(k) => k,
            None => *key_id.insert(b.logs("acme", 1).await[0].key_id),
        };
        for app in [&a, &b] {
            until_trips(app, key, trip).await;
            until_settled(app).await;
        }
        assert_eq!(
            trips_in(&redis, key).await,
            trip,
            "case {trip}: one step in Redis"
        );
        for app in [&a, &b] {
            let standing = app.state.breakers.standing(key, app.clock.now_ms()).0;
            assert_eq!(standing, trip, "case {trip}: one step, not more");
            assert_open(app, secs).await;
        }
        let trips = recorded(&[&a, &b], key).await;
        assert_eq!(trips.len(), trip as usize, "case {trip}: {trips:?}");
        advance(&[&a, &b], secs);
    }
    a.stop().await;
    b.stop().await;
}

/// Trips 1 to 4 and the ban, all made on A: B blocks the key at each, and refuses it with the
/// ban's second wording from its first request after the ban (the first went to A's request).
async fn a_ban_reaches_the_other_gateway_at_once(db: TestDb) {
    let Some(redis) = RedisServer::start() else { return };
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, &mock, redis.url()).await;
    let b = gateway(&db, &mock, redis.url()).await;
    let mut key_id = None;
    for (trip, secs) in [(1, 30), (2, 120), (3, 600), (4, 43_200)] {
        assert!(send(&a, 100, &bad()).await.iter().all(|s| *s == 400));
        let key = *key_id.get_or_insert(a.logs("acme", 1).await[0].key_id);
        until_trips(&b, key, trip).await;
        assert_open(&b, secs).await;
        advance(&[&a, &b], secs);
    }
    let key = key_id.unwrap();
    let statuses = send(&a, 100, &bad()).await;
    assert_eq!(statuses[99], 403, "the request that bans the key is told so");
    until_trips(&b, key, 5).await;
    let (status, _, body) = refused(&b).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "api_key_permanently_banned");
    assert_eq!(
        body["error"]["message"],
        "This API key has been permanently banned and cannot be restored; delete it and create a new API key."
    );
    let trips = recorded(&[&a, &b], key).await;
    assert_eq!(trips.len(), 5);
    assert!(trips[4].banned);
    a.stop().await;
    b.stop().await;
}

/// Redis gone after the start: every request is served, and the key trips through the window the
/// gateways share through the store, as without Redis.
async fn redis_away_the_store_shared_window_still_trips(db: TestDb) {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, &mock, redis.url()).await;
    let b = gateway(&db, &mock, redis.url()).await;
    redis.kill();
    assert!(send(&a, 60, &bad()).await.iter().all(|s| *s == 400));
    let key_id = a.logs("acme", 1).await[0].key_id;
    a.sync().await;
    assert_eq!(send(&b, 1, &bad()).await, [400]);
    b.sync().await; // B shares its failure and reads A's 60
    assert!(send(&b, 39, &bad()).await.iter().all(|s| *s == 400));
    assert_open(&b, 30).await;
    let trips = recorded(&[&b, &a], key_id).await;
    assert_eq!(trips.len(), 1, "{trips:?}");
    assert_open(&a, 30).await;
    a.stop().await;
    b.stop().await;
}

/// Waits (20 s at most) until `app` takes Redis for up and has written all it queued.
async fn until_redis_up(app: &TestApp) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let shared = app.state.breakers.redis().expect("redis_url is set");
    while !(shared.is_up() && shared.settled()) {
        assert!(Instant::now() < deadline, "redis never came back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Redis restarted empty after the key's first trip: the next trip, made on the two gateways'
/// combined window, is the second step (2 min), the trip count taken back from the gateways,
/// never counted from 0.
async fn an_emptied_redis_takes_the_trip_count_back_from_the_gateways(db: TestDb) {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, &mock, redis.url()).await;
    let b = gateway(&db, &mock, redis.url()).await;
    assert!(send(&a, 100, &bad()).await.iter().all(|s| *s == 400));
    let key_id = a.logs("acme", 1).await[0].key_id;
    until_trips(&b, key_id, 1).await;
    advance(&[&a, &b], 30);
    redis.restart();
    assert_eq!(trips_in(&redis, key_id).await, 0, "Redis lost everything");
    // One failure on each: the writers find Redis again (or lose these to the outage).
    for app in [&a, &b] {
        assert_eq!(send(app, 1, &bad()).await, [400]);
        until_redis_up(app).await;
    }
    burst(&[(&a, 90), (&b, 90)], &mock).await;
    for app in [&a, &b] {
        until_trips(app, key_id, 2).await;
        until_settled(app).await;
    }
    assert_eq!(trips_in(&redis, key_id).await, 2);
    assert_open(&a, 120).await;
    assert_open(&b, 120).await;
    let trips = recorded(&[&a, &b], key_id).await;
    assert_eq!(trips.len(), 2, "{trips:?}");
    a.stop().await;
    b.stop().await;
}

/// Requests of the key's window in Redis (every gateway's, as the script judges it).
async fn window_in(redis: &RedisServer, key_id: i64) -> i64 {
    let client = redis::Client::open(redis.url()).expect("url");
    let mut c = client.get_multiplexed_async_connection().await.expect("connect");
    let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(aigw::breaker::shared::window_key(key_id))
        .query_async(&mut c)
        .await
        .expect("hgetall");
    fields
        .iter()
        .filter(|(f, _)| f.ends_with(":t"))
        .map(|(_, v)| v.parse::<i64>().unwrap_or(0))
        .sum()
}

/// B's 50 successes, A's 60 failures, C's 50: 110 of 160 failed (69 %), no trip. B never failed,
/// so it shares its window when it hears that A's failures reached Redis; without that, Redis
/// would judge 110 failures of 110 requests and trip the key.
async fn successes_on_a_gateway_without_failures_count_against_the_others(db: TestDb) {
    let Some(redis) = RedisServer::start() else { return };
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, &mock, redis.url()).await;
    let b = gateway(&db, &mock, redis.url()).await;
    let c = gateway(&db, &mock, redis.url()).await;
    assert!(send(&b, 50, &good()).await.iter().all(|s| *s == 200));
    assert!(send(&a, 60, &bad()).await.iter().all(|s| *s == 400));
    let key_id = a.logs("acme", 1).await[0].key_id;
    let deadline = Instant::now() + Duration::from_secs(20);
    while window_in(&redis, key_id).await < 110 {
        assert!(Instant::now() < deadline, "B's successes never reached Redis");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(send(&c, 50, &bad()).await.iter().all(|s| *s == 400));
    for app in [&a, &b, &c] {
        until_settled(app).await;
    }
    assert_eq!(window_in(&redis, key_id).await, 160);
    assert_eq!(trips_in(&redis, key_id).await, 0);
    for app in [&a, &b, &c] {
        assert_eq!(send(app, 1, &good()).await, [200]);
    }
    for app in [a, b, c] {
        app.stop().await;
    }
}
