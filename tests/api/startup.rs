//! Starting up: a taken port stops the start before the database is touched.

use crate::both_backends;
use crate::helpers::{Setup, TestDb, try_spawn_app};

both_backends!(a_taken_port_fails_before_the_database_is_touched);

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
