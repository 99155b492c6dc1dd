//! The per-key error-rate breaker through the HTTP surface, with the manual clock.

use aigw::mock_upstream::MockUpstream;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, Setup, TestApp, TestDb, spawn_app};
use crate::proxy::{KEY, resources};

/// A request the upstream answers.
pub(crate) fn good() -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
}

/// A request the gateway refuses with 400 (a failure that never reaches the upstream).
pub(crate) fn bad() -> Value {
    json!({"model": "gpt-4o-mini", "messages": "not a list"})
}

/// The statuses of `n` requests of `body` with the proxy suite's key, one after the other.
pub(crate) async fn send(app: &TestApp, n: usize, body: &Value) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(
            app.post_json("/v1/chat/completions", KEY, body)
                .await
                .status()
                .as_u16(),
        );
    }
    out
}

async fn start(db: &TestDb, extra: &str) -> (TestApp, MockUpstream) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(db, Setup::resources(resources(&mock) + extra)).await;
    (app, mock)
}

both_backends!(
    ninety_one_failures_trip_and_ninety_do_not,
    ladder_ban_wordings_and_restart,
    quota_refusals_count_as_failures,
);

async fn ninety_one_failures_trip_and_ninety_do_not(db: TestDb) {
    let (app, mock) = start(&db, "").await;
    send(&app, 10, &good()).await;
    send(&app, 90, &bad()).await;
    assert_eq!(
        send(&app, 1, &good()).await,
        [200],
        "100 requests, 90 failed: not more than 90 %"
    );
    app.clock.advance(chrono::Duration::seconds(61)); // the window empties
    send(&app, 9, &good()).await;
    assert!(send(&app, 91, &bad()).await.iter().all(|s| *s == 400));
    let r = app.post_json("/v1/chat/completions", KEY, &good()).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "30");
    assert_eq!(r.headers()["x-aigw-error-source"], "gateway");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "api_key_circuit_open");
    assert_eq!(body["error"]["retry_after"], 30);
    let until =
        chrono::DateTime::parse_from_rfc3339(body["error"]["blocked_until"].as_str().unwrap()).unwrap();
    assert_eq!((until.timestamp() - app.clock.now().timestamp()), 30);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("retry in 30 seconds")
    );
    let calls = mock.call_count();
    // Refused requests are neither counted nor logged, and do not extend the block.
    app.clock.advance(chrono::Duration::seconds(10));
    for _ in 0..150 {
        let r = app.post_json("/v1/chat/completions", KEY, &good()).await;
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()["retry-after"], "20");
    }
    let r = app
        .client
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(KEY)
        .header("accept-language", "zh-CN,zh;q=0.9")
        .json(&good())
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["error"]["message"],
        "API Key 因最近 60 秒错误率过高已临时熔断，请在 20 秒后重试。"
    );
    assert_eq!(mock.call_count(), calls, "nothing went upstream");
    let logs = app.logs("acme", 201).await;
    assert_eq!(logs.len(), 201, "circuit-broken requests are not logged");
    app.clock.advance(chrono::Duration::seconds(20));
    assert_eq!(send(&app, 1, &good()).await, [200], "the block ends on time");
    app.stop().await;
}

async fn ladder_ban_wordings_and_restart(db: TestDb) {
    let (app, _mock) = start(&db, "").await;
    for (trip, secs) in [(1, 30), (2, 120), (3, 600), (4, 43_200)] {
        send(&app, 100, &bad()).await;
        let r = app.post_json("/v1/chat/completions", KEY, &good()).await;
        assert_eq!(r.status(), 429, "trip {trip}");
        assert_eq!(
            r.headers()["retry-after"].to_str().unwrap(),
            secs.to_string(),
            "trip {trip}"
        );
        assert_eq!(
            r.headers().get("x-should-retry").is_some(),
            secs > 60,
            "trip {trip}"
        );
        app.clock.advance(chrono::Duration::seconds(secs));
    }
    let later = app.clock.now();
    app.stop().await;
    // A restart keeps the trips: the 5th bans.
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(
        &db,
        Setup {
            start: later,
            ..Setup::resources(resources(&mock))
        },
    )
    .await;
    let statuses = send(&app, 100, &bad()).await;
    assert!(statuses[..99].iter().all(|s| *s == 400));
    assert_eq!(statuses[99], 403, "the request that bans the key is told so");
    let r = app.post_json("/v1/chat/completions", KEY, &good()).await;
    assert_eq!(r.status(), 403);
    assert_eq!(r.headers()["x-should-retry"], "false");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "api_key_permanently_banned");
    assert_eq!(
        body["error"]["message"],
        "This API key has been permanently banned and cannot be restored; delete it and create a new API key."
    );
    let r = app
        .client
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(KEY)
        .header("accept-language", "zh")
        .json(&good())
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["error"]["message"],
        "该 API Key 已被永久封禁，无法恢复，请删除后创建新的 API Key。"
    );
    app.clock.advance(chrono::Duration::days(400));
    assert_eq!(send(&app, 1, &good()).await, [403], "a ban never ends");
    let key_id = app.logs("acme", 1).await[0].key_id;
    // A trip is persisted in the background; stopping drains that, so read the history after.
    app.stop().await;
    let (app, _mock) = start(&db, "").await;
    let history = aigw::breaker::history(&app.state.store, key_id).await.unwrap();
    assert_eq!(history.len(), 5);
    assert!(history[4].banned && history[4].requests == 100 && history[4].failures == 100);
    assert_eq!(send(&app, 1, &good()).await, [403], "the ban survives a restart");
    app.stop().await;
}

async fn quota_refusals_count_as_failures(db: TestDb) {
    let policy = ResourcesBuilder::new().policy("acme", "apikey", "*", ("requests", "minute"), 1.0);
    let (app, _mock) = start(&db, &String::from(policy)).await;
    let statuses = send(&app, 100, &good()).await;
    assert_eq!(statuses[0], 200);
    assert!(statuses[1..].iter().all(|s| *s == 429));
    let r = app.post_json("/v1/chat/completions", KEY, &good()).await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["error"]["code"], "api_key_circuit_open",
        "99 quota refusals of 100 tripped the key"
    );
    app.stop().await;
}

/// Two gateways on one Postgres see one breaker: fewer than 100 failing requests on each trip the
/// key once, and the trip made through one is enforced by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_share_one_breaker_on_postgres() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let a = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let b = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let mut refused = 0;
    let mut sent = 0;
    while refused == 0 && sent < 180 {
        for app in [&a, &b] {
            let status = app.post_json("/v1/chat/completions", KEY, &bad()).await.status();
            refused += usize::from(status == 429);
            sent += 1;
        }
        // Each gateway shares its outcomes and learns the other's before the next pair.
        a.sync().await;
        b.sync().await;
    }
    assert!(
        refused > 0,
        "neither gateway alone reached 100 requests, together they tripped the key"
    );
    assert!(
        sent <= 104,
        "tripped at the 100th failure of the two, not later: {sent}"
    );
    // Whichever tripped it has written the trip; the other has read it: both refuse.
    a.sync().await;
    b.sync().await;
    a.sync().await;
    for app in [&a, &b] {
        let status = app.post_json("/v1/chat/completions", KEY, &good()).await.status();
        assert_eq!(status, 429, "both gateways refuse the tripped key");
    }
    let key_id = a.logs("acme", 1).await[0].key_id;
    // Trips are persisted in the background; stopping drains that, so read the history after.
    a.stop().await;
    b.stop().await;
    let store = aigw::store::Store::connect(&db.url).await.unwrap();
    let history = aigw::breaker::history(&store, key_id).await.unwrap();
    assert_eq!(history.len(), 1, "one trip, recorded once");
    assert_eq!(history[0].trip, 1);
}

both_backends!(a_gateway_reads_the_key_the_other_uses_at_every_flush);

/// Two gateways on one store: while the other gateway uses a key, each flush reads its outcomes,
/// with or without an outcome here since (a key only one gateway uses is read back only with its
/// outcomes there), so the first gateway judges the key by both.
async fn a_gateway_reads_the_key_the_other_uses_at_every_flush(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let a = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let b = spawn_app(&db, Setup::resources(resources(&mock))).await;
    send(&a, 50, &bad()).await;
    a.sync().await;
    send(&b, 1, &bad()).await;
    b.sync().await;
    send(&a, 40, &bad()).await;
    a.sync().await;
    // No outcome on B since its last flush: it reads A's 40 all the same.
    b.sync().await;
    assert!(send(&b, 8, &bad()).await.iter().all(|s| *s == 400), "99 failures");
    assert_eq!(
        send(&b, 1, &good()).await,
        [200],
        "the 100th request trips the key"
    );
    assert_eq!(
        send(&b, 1, &good()).await,
        [429],
        "B counted A's 90 failures: 60 of its own view would not trip"
    );
}

both_backends!(a_gateway_shares_successes_once_the_other_shares_failures);

/// Two gateways on one store: what a key did on a gateway where it only succeeded is not written
/// to the shared window, but once the other gateway shares failures of the key, the first shares
/// its successes too, and the key is judged by both.
async fn a_gateway_shares_successes_once_the_other_shares_failures(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let a = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let b = spawn_app(&db, Setup::resources(resources(&mock))).await;
    send(&a, 20, &good()).await;
    a.sync().await;
    send(&b, 1, &bad()).await;
    b.sync().await; // B shares its failure,
    a.sync().await; // A finds it and takes its 20 successes to share,
    a.sync().await; // which it writes,
    send(&b, 1, &bad()).await;
    b.sync().await; // and B reads.
    assert!(send(&b, 98, &bad()).await.iter().all(|s| *s == 400));
    assert_eq!(
        send(&b, 1, &good()).await,
        [200],
        "100 failures of 121 requests are not more than 90 % (B alone would have tripped)"
    );
}

both_backends!(admins_see_breaker_state_and_history);

async fn admins_see_breaker_state_and_history(db: TestDb) {
    let other = ResourcesBuilder::new()
        .member_with_password("acme", "boss@acme.test", "admin", "boss-password-1")
        .workspace("other")
        .member_with_password("other", "eve@other.test", "owner", "eve-password-1");
    let (app, _mock) = start(&db, &String::from(other)).await;
    send(&app, 100, &bad()).await;
    let key_id = app.logs("acme", 100).await[0].key_id;
    let owner = app.login("boss@acme.test", "boss-password-1").await;
    let url = format!("{}/admin/v1/keys/{key_id}/breaker", app.address);
    // The trip is persisted off the request path.
    app.sync().await;
    let body: Value = app
        .client
        .get(&url)
        .bearer_auth(&owner)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["trips"], 1, "{body}");
    assert_eq!(body["banned"], false);
    assert!(body["blocked_until"].is_string());
    assert_eq!(body["history"][0]["requests"], 100);
    assert_eq!(body["history"][0]["failures"], 100);
    let eve = app.login("eve@other.test", "eve-password-1").await;
    let r = app.client.get(&url).bearer_auth(&eve).send().await.unwrap();
    assert_eq!(r.status(), 404, "another workspace's key does not exist for them");
    let r = app.get_as("/admin/v1/keys/999999/breaker", &owner).await;
    assert_eq!(r.status(), 404);
    app.stop().await;
}

both_backends!(a_ban_made_on_another_gateway_gets_the_second_wording);

/// Only the request that banned a key is told the first wording: a gateway that already had the
/// key in memory and learns of the ban from the store (another replica banned it) answers with
/// the second wording from its first refusal on.
async fn a_ban_made_on_another_gateway_gets_the_second_wording(db: TestDb) {
    let (app, _mock) = start(&db, "").await;
    // The key is in this gateway's memory, not banned.
    assert_eq!(send(&app, 1, &bad()).await, [400]);
    let key_id = app.logs("acme", 1).await[0].key_id;
    // Another gateway bans the key: its trip reaches the store, and this gateway reloads.
    let ban = aigw::breaker::Trip {
        trip: 5,
        at: app.clock.now().timestamp_millis(),
        requests: 100,
        failures: 100,
        blocked_until: None,
        banned: true,
    };
    aigw::breaker::persist(&app.state.store, key_id, &ban)
        .await
        .unwrap();
    assert!(app.state.reload().await);
    let r = app.post_json("/v1/chat/completions", KEY, &good()).await;
    assert_eq!(r.status(), 403);
    assert_eq!(r.headers()["x-should-retry"], "false");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "api_key_permanently_banned");
    assert_eq!(
        body["error"]["message"],
        "This API key has been permanently banned and cannot be restored; delete it and create a new API key.",
        "the second wording: the first went to the request that banned the key elsewhere"
    );
    app.stop().await;
}
