//! The breaker's ladder under concurrency (DESIGN.md §11, LyRouter seed 003): a trip starts a
//! fresh window; outcomes of requests admitted before a trip, or that end while the key is
//! blocked, never start the next trip; no trip is ever recorded after the ban. Requests are held
//! in flight at the mock upstream and let go at once, on one gateway and on two.

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::both_backends;
use crate::breaker::{bad, good, send};
use crate::helpers::{ResourcesBuilder, Setup, TestApp, TestDb, spawn_app};
use crate::proxy::KEY;

/// One upstream serving one model without fallbacks, room for every held request, and an owner
/// who reads the key's breaker through the admin API.
fn resources(mock: &MockUpstream) -> String {
    ResourcesBuilder::acme(KEY)
        .member_with_password("acme", "boss@acme.test", "owner", "boss-password-1")
        .upstream("acme", "lone", &mock.base_url(), "cred-lone", &["gpt-4o-mini"])
        .with("max_in_flight", 1000)
        .into()
}

/// `n` requests held at the upstream until [`MockUpstream::release`], then answered 400 (an
/// error about the request: no credential lock, no failover). Returns once all `n` are in flight;
/// the handle yields their statuses.
async fn in_flight(app: &TestApp, mock: &MockUpstream, n: usize) -> tokio::task::JoinHandle<Vec<u16>> {
    mock.hold();
    let bad_request = json!({"error": {"message": "mock says no", "type": "invalid_request_error"}});
    mock.script(
        Script::any()
            .times(u32::try_from(n).unwrap())
            .error(400, bad_request),
    );
    let requests: Vec<_> = (0..n)
        .map(|_| {
            let (client, url) = (app.client.clone(), format!("{}/v1/chat/completions", app.address));
            tokio::spawn(async move {
                let r = client.post(url).bearer_auth(KEY).json(&good()).send().await;
                r.map_or(0, |r| r.status().as_u16())
            })
        })
        .collect();
    tokio::time::timeout(std::time::Duration::from_secs(60), mock.until_held(n))
        .await
        .expect("every request reached the upstream");
    tokio::spawn(async move {
        let mut statuses = Vec::with_capacity(requests.len());
        for r in requests {
            statuses.push(r.await.unwrap_or(0));
        }
        statuses
    })
}

/// The key's breaker as the owner reads it: `{trips, banned, blocked_until, history}`.
async fn breaker(app: &TestApp) -> Value {
    app.sync().await;
    let key_id = app.logs("acme", 1).await[0].key_id;
    let token = app.login("boss@acme.test", "boss-password-1").await;
    let r = app
        .get_as(&format!("/admin/v1/keys/{key_id}/breaker"), &token)
        .await;
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

fn advance(apps: &[&TestApp], secs: i64) {
    for app in apps {
        app.clock.advance(chrono::Duration::seconds(secs));
    }
}

both_backends!(
    outcomes_that_end_while_blocked_never_start_the_next_trip,
    outcomes_admitted_before_a_trip_never_start_the_next,
    no_trip_is_recorded_after_the_ban,
    a_trip_on_one_gateway_starts_a_fresh_window_on_both,
);

/// 160 requests fail together: the 100th outcome trips the key, the 60 after it end while the
/// key is blocked and are not in the next window.
async fn outcomes_that_end_while_blocked_never_start_the_next_trip(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let burst = in_flight(&app, &mock, 160).await;
    mock.release();
    assert!(burst.await.unwrap().iter().all(|s| *s == 400));
    app.logs("acme", 160).await; // every outcome recorded
    let b = breaker(&app).await;
    assert_eq!(b["trips"], 1, "one burst, one trip: {b}");
    advance(&[&app], 30);
    let s40 = send(&app, 40, &bad()).await;
    assert!(s40.iter().all(|s| *s == 400), "{s40:?}");
    assert_eq!(
        send(&app, 1, &good()).await,
        [200],
        "the 60 that ended while the key was blocked are not in the window"
    );
    assert!(send(&app, 59, &bad()).await.iter().all(|s| *s == 400));
    let r = app.post_json("/v1/chat/completions", KEY, &good()).await;
    assert_eq!(r.status(), 429, "a fresh window of 100 requests trips the key");
    assert_eq!(r.headers()["retry-after"], "120", "the 2nd trip");
    assert_eq!(breaker(&app).await["history"].as_array().unwrap().len(), 2);
    app.stop().await;
}

/// Requests admitted before a trip that end after its block: their failures are not the next
/// window's, however late they come.
async fn outcomes_admitted_before_a_trip_never_start_the_next(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let held = in_flight(&app, &mock, 100).await;
    assert!(send(&app, 100, &bad()).await.iter().all(|s| *s == 400));
    assert_eq!(
        send(&app, 1, &good()).await,
        [429],
        "the 100th failure tripped the key"
    );
    advance(&[&app], 30);
    mock.release();
    let h = held.await.unwrap();
    assert!(h.iter().all(|s| *s == 400), "{h:?}");
    app.logs("acme", 200).await;
    assert_eq!(
        send(&app, 1, &good()).await,
        [200],
        "100 failures of requests admitted before the trip do not trip the key again"
    );
    let b = breaker(&app).await;
    assert_eq!(b["trips"], 1, "{b}");
    app.stop().await;
}

/// Trips 1 to 4, then 100 requests in flight as the 5th trip bans the key: their failures record
/// no 6th trip, and the history ends with the ban.
async fn no_trip_is_recorded_after_the_ban(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    for secs in [30, 120, 600, 43_200] {
        assert!(send(&app, 100, &bad()).await.iter().all(|s| *s == 400));
        advance(&[&app], secs);
    }
    let held = in_flight(&app, &mock, 100).await;
    let statuses = send(&app, 100, &bad()).await;
    assert_eq!(statuses[99], 403, "the 5th trip bans the key");
    mock.release();
    let h = held.await.unwrap();
    assert!(h.iter().all(|s| *s == 400), "{h:?}");
    app.logs("acme", 500).await;
    let b = breaker(&app).await;
    assert_eq!(b["trips"], 5, "{b}");
    assert_eq!(b["banned"], true);
    let history = b["history"].as_array().unwrap();
    assert_eq!(history.len(), 5, "no trip after the ban: {b}");
    assert_eq!(history[4]["banned"], true);
    assert_eq!(send(&app, 1, &good()).await, [403]);
    app.stop().await;
}

/// Two gateways on one database: gateway A trips the key while gateway B has 50 requests in
/// flight; B learns of the trip only after their failures were shared. Those failures are not in
/// the window either gateway judges the key by after the block.
async fn a_trip_on_one_gateway_starts_a_fresh_window_on_both(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let a = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let b = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let held = in_flight(&b, &mock, 50).await;
    assert!(send(&a, 100, &bad()).await.iter().all(|s| *s == 400));
    a.sync().await; // A records the trip
    mock.release();
    let h = held.await.unwrap();
    assert!(h.iter().all(|s| *s == 400), "{h:?}");
    b.logs("acme", 150).await;
    b.sync().await; // B shares the 50 failures, then reads the trip
    assert_eq!(send(&b, 1, &good()).await, [429], "B enforces A's trip");
    advance(&[&a, &b], 30);
    a.sync().await;
    b.sync().await;
    assert!(send(&a, 50, &bad()).await.iter().all(|s| *s == 400));
    assert_eq!(
        send(&a, 1, &good()).await,
        [200],
        "B's 50 failures of requests admitted before the trip are not in A's window"
    );
    a.sync().await;
    assert_eq!(send(&b, 1, &bad()).await, [400]);
    b.sync().await; // B shares its failure and reads A's 51 requests
    assert!(
        send(&b, 46, &bad()).await.iter().all(|s| *s == 400),
        "nor in B's: it judges the key by the two gateways' requests since the block"
    );
    assert_eq!(send(&b, 1, &good()).await, [200]);
    assert_eq!(send(&b, 1, &bad()).await, [400]);
    assert_eq!(
        send(&b, 1, &good()).await,
        [429],
        "the 100th request of the two since the block, 98 failed, tripped the key"
    );
    let history = breaker(&a).await["history"].as_array().unwrap().clone();
    assert_eq!(history.len(), 2, "{history:?}");
    a.stop().await;
    b.stop().await;
}
