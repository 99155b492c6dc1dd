//! The database busy, not down (Postgres, where several gateways share the rows they flush): a
//! flush held up by row locks delays only its own kind of count, and a pool whose connections
//! all wait on locks is not taken for an outage. Locks are taken by the test on a connection of
//! its own, as another gateway's long flush would hold them.

use std::time::{Duration, Instant};

use aigw::mock_upstream::MockUpstream;
use serde_json::json;

use crate::helpers::{Setup, TestApp, TestDb, spawn_app};
use crate::proxy::{KEY, resources};

const POLICY: &str = "\n[[policy]]\nworkspace = \"acme\"\nsubject = \"apikey\"\ntarget = \"ada@acme.test/ci\"\nmetric = \"requests\"\nwindow = \"day\"\nlimit = 1000\nmode = \"enforce\"\n";

async fn start() -> Option<(TestDb, TestApp, MockUpstream)> {
    let db = TestDb::postgres().await?;
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock) + POLICY)).await;
    Some((db, app, mock))
}

async fn chat(app: &TestApp, key: &str) -> u16 {
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    app.post_json("/v1/chat/completions", key, &body)
        .await
        .status()
        .as_u16()
}

/// Takes `lock` (a `LOCK TABLE …` statement) in a transaction of its own, held until dropped
/// or rolled back.
async fn hold(db: &TestDb, lock: &str) -> sqlx::Transaction<'static, sqlx::Any> {
    let pool = sqlx::AnyPool::connect(&db.direct_url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(lock).execute(&mut *tx).await.unwrap();
    tx
}

/// Waits (5 s at most) until the stored request count of the test key is `want`.
async fn wait_stored(db: &TestDb, want: i64) {
    let pool = sqlx::AnyPool::connect(&db.direct_url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let used: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(used), 0) AS BIGINT) FROM usage_counters
             WHERE subject = 'apikey' AND metric = 'requests'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if used == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the stored count stayed {used}, want {want}: the quota flush is held up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_flush_stuck_on_row_locks_does_not_hold_up_the_quota_flush() {
    let Some((db, app, _mock)) = start().await else {
        return;
    };
    // A failure: from then on the key's outcomes are shared through `breaker_buckets`.
    let bad = json!({"model": "gpt-4o-mini", "messages": "not a list"});
    let status = app.post_json("/v1/chat/completions", KEY, &bad).await.status();
    assert_eq!(status, 400);
    let lock = hold(&db, "LOCK TABLE breaker_buckets IN EXCLUSIVE MODE").await;
    // The next request's breaker outcome makes the next breaker flush wait on the lock.
    assert_eq!(chat(&app, KEY).await, 200);
    wait_stored(&db, 1).await;
    for want in 2..=3 {
        assert_eq!(chat(&app, KEY).await, 200);
        wait_stored(&db, want).await;
    }
    lock.rollback().await.unwrap();
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_waiting_on_locks_is_not_an_outage() {
    let Some((db, app, _mock)) = start().await else {
        return;
    };
    assert_eq!(chat(&app, KEY).await, 200);
    // Every first sight of a key reads `api_keys`: with the table locked, each holds a pooled
    // connection until the lock goes, and the calls beyond the pool's size time out waiting.
    let lock = hold(&db, "LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE").await;
    let waiting: Vec<_> = (0..24)
        .map(|i| {
            let (address, client) = (app.address.clone(), app.client.clone());
            tokio::spawn(async move {
                client
                    .post(format!("{address}/v1/chat/completions"))
                    .bearer_auth(format!("sk-aigw-BusyPoolUnseenKey{i:015}"))
                    .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            })
        })
        .collect();
    // Past the pool's acquire timeout (750 ms) and several health probes (every 500 ms).
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        assert!(
            app.state.store.available(),
            "a pool busy waiting on row locks was taken for an outage"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(app.get("/readyz").await.status(), 200, "still ready");
    assert_eq!(chat(&app, KEY).await, 200, "a known key is served meanwhile");
    lock.rollback().await.unwrap();
    for w in waiting {
        let status = w.await.unwrap().unwrap();
        // Unknown keys: refused once read, or 503 for those that found no connection in time.
        assert!(matches!(status, 401 | 429 | 503), "got {status}");
    }
    assert!(app.state.store.available());
    app.stop().await;
}
