//! Starting up: several replicas started at the same instant on one database all come up with
//! every entity once; a taken port stops the start before the database is touched; a database
//! that cannot be opened is named with the reason at once.

use aigw::store::{DepartmentStore, KeyStore, MemberStore, ModelStore, UpstreamStore, WorkspaceStore};

use crate::both_backends;
use crate::helpers::{Setup, TestDb, try_spawn_app};

both_backends!(
    a_database_migrated_by_a_newer_aigw_is_named_as_such,
    three_replicas_started_together_all_come_up_with_each_entity_once,
    a_taken_port_fails_before_the_database_is_touched,
    the_start_lock_admits_one_gateway_at_a_time_and_is_freed_by_a_dropped_holder,
    a_refused_file_on_a_new_database_writes_nothing,
    postgres_over_tls_when_the_url_asks_for_it
);

/// A resources file refused on the first start leaves the database as it was: no SQLite file,
/// no migrated Postgres schema. The same file without its mistake then applies.
async fn a_refused_file_on_a_new_database_writes_nothing(db: TestDb) {
    let bad = REPLICA_RESOURCES.replace("name = \"generated\"", "name = \"generated\"\nexpires = \"soon\"");
    let err = try_spawn_app(&db, Setup::resources(bad))
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("unknown field `expires`"), "{err}");
    if db.backend == "sqlite" {
        assert!(!db.dir.path().join("aigw.db").exists(), "no database file");
    } else {
        let store = aigw::store::Store::open(&db.url).await.unwrap();
        assert!(!store.has_schema().await.unwrap(), "the schema is not migrated");
        store.close().await;
    }
    let app = try_spawn_app(&db, Setup::resources(REPLICA_RESOURCES))
        .await
        .expect("starts");
    assert!(app.state.store.workspace_by_name("acme").await.unwrap().is_some());
    app.stop().await;
}

/// `sslmode=require` in a Postgres URL connects over TLS (a managed server refuses anything
/// else), and `sslmode=verify-full` checks the server's certificate against the trusted roots:
/// the test server's self-signed one is refused. The pool has `database_max_connections`. SQLite
/// has nothing to check.
async fn postgres_over_tls_when_the_url_asks_for_it(db: TestDb) {
    if db.backend == "sqlite" {
        return;
    }
    let with = |mode: &str| {
        let url = format!("{}&sslmode={mode}", db.url);
        move |s: &mut aigw::Settings| s.database_url = url
    };
    let setup = |mode: &str| Setup {
        settings: Box::new(with(mode)),
        ..Setup::default()
    };
    let app = try_spawn_app(&db, setup("require"))
        .await
        .expect("starts over TLS");
    assert_eq!(app.state.store.max_connections(), 16, "the default pool");
    app.stop().await;
    let small = Setup {
        settings: Box::new(|s: &mut aigw::Settings| s.database_max_connections = 3),
        ..Setup::default()
    };
    let app = try_spawn_app(&db, small).await.expect("starts");
    assert_eq!(app.state.store.max_connections(), 3, "database_max_connections");
    app.stop().await;
    let err = try_spawn_app(&db, setup("verify-full"))
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");
}

/// A resources file with one of every kind of entity, two keys (one generated).
pub const REPLICA_RESOURCES: &str = r#"
[[workspace]]
name = "acme"

[[department]]
workspace = "acme"
name = "research"

[[member]]
workspace = "acme"
department = "research"
email = "ada@acme.test"
role = "member"
password = "ada-password-1"

[[api_key]]
member = "ada@acme.test"
name = "ci"
key = "sk-aigw-0123456789abcdefghijABCDEFGHIJ01"

[[api_key]]
member = "ada@acme.test"
name = "generated"

[[upstream]]
workspace = "acme"
name = "openai-main"
provider = "openai-compatible"
base_url = "http://127.0.0.1:9"
api_key = "sk-upstream-replica-secret"
models = ["gpt-4o-mini"]

[[model]]
workspace = "acme"
name = "gpt-4o-mini"
price = { prompt = 0.15, completion = 0.60 }

[[policy]]
workspace = "acme"
subject = "member"
target = "*"
metric = "requests"
window = "day"
limit = 100
mode = "enforce"
"#;

async fn three_replicas_started_together_all_come_up_with_each_entity_once(db: TestDb) {
    let (a, b, c) = tokio::join!(
        try_spawn_app(&db, Setup::resources(REPLICA_RESOURCES)),
        try_spawn_app(&db, Setup::resources(REPLICA_RESOURCES)),
        try_spawn_app(&db, Setup::resources(REPLICA_RESOURCES)),
    );
    let apps: Vec<_> = [a, b, c]
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or_else(|e| panic!("replica {i} did not start: {e}")))
        .collect();
    for app in &apps {
        assert_eq!(app.get("/readyz").await.status(), 200);
    }
    let store = &apps[0].state.store;
    let workspaces = store.workspaces().await.unwrap();
    let names: Vec<_> = workspaces.iter().map(|w| w.name.as_str()).collect();
    // The resources file's workspace; the bootstrap owner joins it rather than making another.
    assert_eq!(names, ["acme"], "each workspace once");
    let acme = &workspaces[0];
    assert_eq!(store.departments(acme.id).await.unwrap().len(), 1);
    assert_eq!(store.count_owners().await.unwrap(), 1, "one bootstrap owner");
    let ada = store.member_by_email("ada@acme.test").await.unwrap().unwrap();
    let keys = store.keys_of_member(ada.id).await.unwrap();
    let mut key_names: Vec<_> = keys.iter().map(|k| k.name.as_str()).collect();
    key_names.sort_unstable();
    assert_eq!(key_names, ["ci", "generated"], "each key once");
    assert_eq!(store.all_upstreams().await.unwrap().len(), 1);
    assert_eq!(store.all_models().await.unwrap().len(), 1);
    for app in apps {
        app.stop().await;
    }
}

async fn a_taken_port_fails_before_the_database_is_touched(db: TestDb) {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let setup = Setup {
        settings: Box::new(move |s| {
            s.listen = addr;
            // Generated secrets would be written beside the database: none must be.
            s.master_key = None;
            s.jwt_secret = None;
        }),
        ..Setup::resources(REPLICA_RESOURCES)
    };
    let err = match try_spawn_app(&db, setup).await {
        Ok(_) => panic!("started on a taken port"),
        Err(e) => e,
    };
    assert!(
        matches!(err, aigw::app::StartError::Listen { .. }),
        "refused for the port: {err}"
    );
    assert!(
        !db.dir.path().join("aigw.keys").exists(),
        "no secrets generated before the port is bound"
    );
    if db.backend == "sqlite" {
        assert!(
            !db.dir.path().join("aigw.db").exists(),
            "no database file created before the port is bound"
        );
    } else {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        let tables: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema()",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert_eq!(
            tables, 0,
            "no migration, no owner, no resources before the port is bound"
        );
    }
}

async fn the_start_lock_admits_one_gateway_at_a_time_and_is_freed_by_a_dropped_holder(db: TestDb) {
    use aigw::store::Store;
    use std::time::Duration;
    let first = Store::open(&db.url).await.unwrap();
    let second = Store::open(&db.url).await.unwrap();
    let held = first.start_lock().await.unwrap();
    let mut waiting = Box::pin(second.start_lock());
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut waiting)
            .await
            .is_err(),
        "a second gateway waits while the first holds the start lock"
    );
    held.release().await;
    let next = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("released to the waiting gateway")
        .unwrap();
    // A gateway whose start fails (or that dies) drops the lock without releasing it.
    drop(next);
    let third = Store::open(&db.url).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), third.start_lock())
        .await
        .expect("a dropped holder does not keep the lock")
        .unwrap()
        .release()
        .await;
}

/// A Postgres nobody listens on: the start fails at once (not after the pool's wait), naming the
/// host, the port and the cause.
#[tokio::test]
async fn an_unreachable_postgres_is_named_with_its_cause_at_once() {
    let db = TestDb::sqlite();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://aigw:hunter2-secret@127.0.0.1:{port}/aigw");
    let setup = Setup {
        settings: Box::new(move |s| s.database_url = url),
        ..Setup::default()
    };
    let started = std::time::Instant::now();
    let err = match try_spawn_app(&db, setup).await {
        Ok(_) => panic!("started without a database"),
        Err(e) => e.to_string(),
    };
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "took {:?}: {err}",
        started.elapsed()
    );
    assert!(
        err.contains(&format!("127.0.0.1:{port}")),
        "names host and port: {err}"
    );
    assert!(
        err.to_lowercase().contains("connection refused"),
        "names the cause: {err}"
    );
    assert!(!err.contains("hunter2"), "no password in the message: {err}");
}

/// A SQLite database in a folder that does not exist: the folder is named, not the secrets file
/// that would have been written there.
#[tokio::test]
async fn a_missing_sqlite_folder_is_named_as_such() {
    let db = TestDb::sqlite();
    let folder = db.dir.path().join("no-such-folder");
    let url = format!("sqlite://{}/aigw.db", folder.display());
    let setup = Setup {
        settings: Box::new(move |s| {
            s.database_url = url;
            s.data_dir = Default::default();
            s.master_key = None;
            s.jwt_secret = None;
        }),
        ..Setup::default()
    };
    let err = match try_spawn_app(&db, setup).await {
        Ok(_) => panic!("started without a database folder"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(&folder.display().to_string()) && err.contains("does not exist"),
        "names the folder: {err}"
    );
    assert!(err.contains("AIGW_DATABASE_URL"), "names the setting: {err}");
    assert!(!err.contains("secrets file"), "{err}");
    assert!(!folder.exists(), "not created behind the operator's back");
}

/// An older aigw started on a database a newer one has migrated (a rollback after an upgrade):
/// the start says so, rather than only naming a migration number.
async fn a_database_migrated_by_a_newer_aigw_is_named_as_such(db: TestDb) {
    use sqlx::Connection;
    try_spawn_app(&db, Setup::default()).await.unwrap().stop().await;
    // What a newer build leaves behind: a migration this build does not have.
    if db.backend == "sqlite" {
        let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES (99990101000000, 'from a newer aigw', TRUE, X'00', 0)",
        )
        .execute(&mut conn)
        .await
        .unwrap();
    } else {
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES (99990101000000, 'from a newer aigw', TRUE, '\\x00'::bytea, 0)",
        )
        .execute(&mut conn)
        .await
        .unwrap();
    }
    let err = match try_spawn_app(&db, Setup::default()).await {
        Ok(_) => panic!("an older build started on a newer database"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("99990101000000") && err.contains("newer aigw"),
        "{err}"
    );
}
