//! Quota counters read back since a horizon (Postgres, migration 0021): a flush learns every
//! counter another gateway changed, including one whose transaction commits after a later one,
//! without reading the counters nobody changed.

use aigw::store::{Store, UsageCounterRow, UsageStore};
use sqlx::Connection;

use crate::helpers::TestDb;

fn row(subject_id: i64) -> UsageCounterRow {
    UsageCounterRow {
        subject: "member",
        subject_id,
        metric: "requests",
        time_window: "day".to_owned(),
        window_start: 1_800_000_000,
    }
}

/// The zero deltas of a flush that holds counters 1 to 4.
fn idle() -> Vec<(UsageCounterRow, i64)> {
    (1..=4).map(|id| (row(id), 0)).collect()
}

/// The totals a read back learned, by subject id (the last of each, the newest).
fn learned(read: &aigw::store::ReadBack) -> std::collections::BTreeMap<i64, i64> {
    read.totals.iter().map(|t| (t.1, t.5)).collect()
}

#[tokio::test]
async fn a_flush_reads_back_what_others_changed_since_its_horizon() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let a = Store::connect(&db.url).await.unwrap();
    let b = Store::connect(&db.url).await.unwrap();

    // The first flush has no horizon: it writes its deltas and reads its idle counters by key.
    let first = a.add_usage(&[(row(1), 5), (row(2), 0)], None).await.unwrap();
    assert_eq!(learned(&first), [(1, 5), (2, 0)].into());
    let mut horizon = first.horizon.expect("Postgres gives a horizon");

    // Another gateway adds to counter 2; the next flush learns it, and its own write.
    b.add_usage(&[(row(2), 3)], None).await.unwrap();
    let read = a.add_usage(&idle(), Some(horizon)).await.unwrap();
    assert_eq!(learned(&read).get(&2), Some(&3), "{read:?}");
    assert!(!learned(&read).contains_key(&3), "no row, nothing read: {read:?}");
    horizon = read.horizon.unwrap();

    // A transaction that writes counter 3 and stays open while a later one writes counter 4
    // and commits: the read back sees 4 only, and its horizon keeps 3 for the next.
    let mut slow = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut open = slow.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO usage_counters (subject, subject_id, metric, time_window, window_start, used)
         VALUES ('member', 3, 'requests', 'day', 1800000000, 11)",
    )
    .execute(&mut *open)
    .await
    .unwrap();
    b.add_usage(&[(row(4), 2)], None).await.unwrap();
    let read = a.add_usage(&idle(), Some(horizon)).await.unwrap();
    assert_eq!(learned(&read).get(&4), Some(&2), "{read:?}");
    assert!(!learned(&read).contains_key(&3), "not committed yet: {read:?}");
    horizon = read.horizon.unwrap();
    open.commit().await.unwrap();
    let read = a.add_usage(&idle(), Some(horizon)).await.unwrap();
    assert_eq!(
        learned(&read).get(&3),
        Some(&11),
        "committed after a later one: {read:?}"
    );

    // A horizon ahead of the database's (another database, restored from a backup): read by key.
    let read = a.add_usage(&idle(), Some(i64::MAX)).await.unwrap();
    assert_eq!(learned(&read), [(1, 5), (2, 3), (3, 11), (4, 2)].into());
}

/// SQLite has no horizon: every flush reads its idle counters by key.
#[tokio::test]
async fn on_sqlite_a_flush_reads_its_counters_by_key() {
    let db = TestDb::sqlite();
    let store = Store::connect(&db.url).await.unwrap();
    let read = store.add_usage(&[(row(1), 5)], None).await.unwrap();
    assert_eq!(read.horizon, None);
    let read = store.add_usage(&idle(), read.horizon).await.unwrap();
    assert_eq!(learned(&read), [(1, 5), (2, 0), (3, 0), (4, 0)].into());
}
