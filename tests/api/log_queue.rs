//! The request-log queue's bound (issue 40 item 6, issue 43): while the database takes no logs
//! (an outage, or SQLite's one writer falling behind), the logs waiting in memory never take more
//! than `max_log_queue_bytes`; past it a log is dropped and counted
//! (`aigw_request_logs_dropped_total`, one warning per episode), and the quota counters, kept
//! apart from the logs, lose nothing.
//!
//! The test stops the log writes by holding a lock on the database from outside the gateway:
//! `LOCK TABLE request_logs` on Postgres, the file's write lock on SQLite.

use std::time::{Duration, Instant};

use aigw::mock_upstream::MockUpstream;
use serde_json::{Value, json};
use sqlx::Connection;

use crate::both_backends;
use crate::helpers::{Setup, TestApp, TestDb, logged_warnings, spawn_app};
use crate::proxy::{KEY, resources};

fn chat() -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "say hello to me"}]})
}

/// A transaction outside the gateway that keeps it from writing request logs until dropped.
async fn hold_log_writes(db: &TestDb) -> sqlx::AnyConnection {
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&db.direct_url).await.unwrap();
    let statements: &[&str] = if db.backend == "sqlite" {
        &["BEGIN EXCLUSIVE"]
    } else {
        &["BEGIN", "LOCK TABLE request_logs IN EXCLUSIVE MODE"]
    };
    for s in statements {
        sqlx::query(s).execute(&mut conn).await.unwrap();
    }
    conn
}

async fn metric(app: &TestApp, name: &str) -> u64 {
    let text = app.get("/metrics").await.text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics")) as u64
}

async fn stored_requests(db: &TestDb) -> i64 {
    let mut conn = sqlx::AnyConnection::connect(&db.direct_url).await.unwrap();
    sqlx::query_scalar(
        "SELECT CAST(COALESCE(SUM(used), 0) AS BIGINT) FROM usage_counters
         WHERE subject = 'apikey' AND metric = 'requests'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap()
}

async fn stored_logs(db: &TestDb) -> i64 {
    let mut conn = sqlx::AnyConnection::connect(&db.direct_url).await.unwrap();
    sqlx::query_scalar("SELECT CAST(COUNT(*) AS BIGINT) FROM request_logs")
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

const POLICY: &str = "\n[[policy]]\nworkspace = \"acme\"\nsubject = \"apikey\"\ntarget = \"ada@acme.test/ci\"\nmetric = \"requests\"\nwindow = \"day\"\nlimit = 100000\n";

both_backends!(a_stalled_log_writer_drops_and_counts_past_the_bound_and_loses_no_counter);

async fn a_stalled_log_writer_drops_and_counts_past_the_bound_and_loses_no_counter(db: TestDb) {
    logged_warnings(); // installs the capture before the stall
    // 64 KiB, one byte apart per backend: the warning names it, so each test finds its own.
    let max = 65_536 + u64::from(db.backend == "postgres");
    let mock = MockUpstream::start().await.unwrap();
    let setup = Setup {
        settings: Box::new(move |s| s.max_log_queue_bytes = max),
        ..Setup::resources(resources(&mock) + POLICY)
    };
    let app = spawn_app(&db, setup).await;
    // The key is known and one log written before the stall.
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat()).await.status(),
        200
    );
    app.sync().await;
    assert_eq!(stored_logs(&db).await, 1);

    let held = hold_log_writes(&db).await;
    let sent = 300;
    for i in 0..sent {
        let r = app.post_json("/v1/chat/completions", KEY, &chat()).await;
        assert_eq!(r.status(), 200, "request {i} during the stall");
    }
    let queued = metric(&app, "aigw_log_queue_bytes").await;
    let dropped = metric(&app, "aigw_request_logs_dropped_total").await;
    assert!(queued <= max, "{queued} bytes queued, over the bound {max}");
    assert!(dropped > 0 && dropped < sent, "{dropped} of {sent} logs dropped");
    let warned = |w: &Vec<String>| {
        w.iter()
            .filter(|l| l.contains("request log queue full") && l.contains(&format!("max_bytes={max}")))
            .count()
    };
    assert_eq!(warned(&logged_warnings()), 1, "warned once while dropping");

    // The database takes writes again: every counter is stored, every log not dropped too.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(30);
    let want_logs = 1 + sent as i64 - dropped as i64;
    loop {
        app.sync().await;
        let (requests, logs) = (stored_requests(&db).await, stored_logs(&db).await);
        if requests == 1 + sent as i64 && logs == want_logs {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stored {requests} requests (want {}) and {logs} logs (want {want_logs})",
            1 + sent
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(metric(&app, "aigw_log_queue_bytes").await, 0);
    assert_eq!(
        metric(&app, "aigw_request_logs_dropped_total").await,
        dropped,
        "nothing dropped once the queue drains"
    );
    app.stop().await;
}
