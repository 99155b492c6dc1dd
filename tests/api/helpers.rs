//! The test harness: a real gateway on port 0 with a fresh database (a SQLite file, or a fresh
//! Postgres schema from `AIGW_TEST_POSTGRES_URL`), a manual clock, and the mock upstream.

use std::path::PathBuf;
use std::sync::OnceLock;

use aigw::mock_upstream::MockUpstream;
use aigw::state::AppState;
use aigw::{BuildOptions, Clock, Gateway, Settings};
use chrono::{DateTime, Utc};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Runs each named `async fn(TestDb)` on SQLite and on Postgres.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name($crate::helpers::TestDb::sqlite()).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                if let Some(db) = $crate::helpers::TestDb::postgres().await {
                    super::$name(db).await
                }
            }
        }
    )*};
}

/// A fresh database for one test, kept until the test ends.
pub struct TestDb {
    /// The URL the gateway connects to.
    pub url: String,
    /// Folder for files of this test (SQLite file, resources files, secrets).
    pub dir: tempfile::TempDir,
    /// Which backend.
    pub backend: &'static str,
    /// The same database without a [`DbSwitch`] in between (the test reads through it while the
    /// gateway's way is cut).
    pub direct_url: String,
}

/// The Postgres test server (`AIGW_TEST_POSTGRES_URL`, default the machine's local one).
pub fn postgres_url() -> String {
    std::env::var("AIGW_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

impl TestDb {
    /// A fresh SQLite file.
    pub fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("aigw.db").display());
        TestDb {
            direct_url: url.clone(),
            url,
            dir,
            backend: "sqlite",
        }
    }

    /// A fresh schema on the test Postgres; `None` (test skipped) when Postgres is unreachable,
    /// unless `CI=true`, where that fails the test.
    pub async fn postgres() -> Option<TestDb> {
        use sqlx::Connection;
        let base = postgres_url();
        let conn = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            sqlx::PgConnection::connect(&base),
        )
        .await;
        let mut conn = match conn {
            Ok(Ok(c)) => c,
            other => {
                let why = match other {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_owned(),
                };
                if std::env::var("CI").as_deref() == Ok("true") {
                    panic!("CI=true and Postgres at {base} is unreachable: {why}");
                }
                eprintln!("SKIPPED: Postgres at {base} is unreachable ({why}); set AIGW_TEST_POSTGRES_URL");
                return None;
            }
        };
        static CLEANED: OnceLock<()> = OnceLock::new();
        let now = Utc::now().timestamp();
        if CLEANED.set(()).is_ok() {
            // Schemas of earlier runs older than an hour: drop them so the database does not grow.
            let old: Vec<String> =
                sqlx::query_scalar("SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'aigw_t_%'")
                    .fetch_all(&mut conn)
                    .await
                    .unwrap_or_default();
            for name in old {
                let born: i64 = name.split('_').nth(2).and_then(|s| s.parse().ok()).unwrap_or(0);
                if now - born > 3600 {
                    let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                        .execute(&mut conn)
                        .await;
                }
            }
        }
        let schema = format!("aigw_t_{now}_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&mut conn)
            .await
            .expect("create schema");
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
        let dir = tempfile::tempdir().expect("tempdir");
        Some(TestDb {
            direct_url: url.clone(),
            url,
            dir,
            backend: "postgres",
        })
    }

    /// A fresh Postgres schema reached through a [`DbSwitch`], so the test can take the database
    /// away from the gateway and give it back.
    pub async fn postgres_behind_switch() -> Option<(TestDb, DbSwitch)> {
        let mut db = TestDb::postgres().await?;
        let (at, rest) = db.url.split_once('@').expect("postgres URL with user@host");
        let (host_port, tail) = rest.split_once('/').expect("postgres URL with a database");
        let switch = DbSwitch::start(host_port.to_owned()).await;
        db.url = format!("{at}@127.0.0.1:{}/{tail}", switch.port);
        Some((db, switch))
    }

    /// Writes a file in this test's folder and returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write test file");
        path
    }
}

/// A TCP relay in front of the test Postgres. `cut` takes the database away (every open
/// connection is dropped, new ones are closed at once, as a stopped server's would be refused);
/// `restore` gives it back.
pub struct DbSwitch {
    /// The relay's port on 127.0.0.1.
    pub port: u16,
    up: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
}

impl DbSwitch {
    async fn start(target: String) -> DbSwitch {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind relay");
        let port = listener.local_addr().expect("relay addr").port();
        let up = std::sync::Arc::new(tokio::sync::watch::channel(true).0);
        let watch = up.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut rx = watch.subscribe();
                if !*rx.borrow() {
                    continue; // dropped: closed at once
                }
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = rx.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        DbSwitch { port, up }
    }

    /// Takes the database away.
    pub fn cut(&self) {
        self.up.send_replace(false);
    }

    /// Gives the database back.
    pub fn restore(&self) {
        self.up.send_replace(true);
    }
}

/// The fixed instant tests start at unless they choose one: 2026-12-01 10:00 Beijing time.
pub fn default_start() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-12-01T02:00:00Z")
        .expect("valid")
        .with_timezone(&Utc)
}

/// How to start a test gateway.
pub struct Setup {
    /// Resources file contents, applied at start.
    pub resources: Option<String>,
    /// Starting instant of the manual clock.
    pub start: DateTime<Utc>,
    /// Adjusts settings before the start.
    pub settings: Box<dyn FnOnce(&mut Settings) + Send>,
    /// How often the gateway polls the configuration epoch (the default when `None`). Tests
    /// that need another gateway's change call [`TestApp::sync`] instead of waiting for it.
    pub config_poll: Option<std::time::Duration>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            resources: None,
            start: default_start(),
            settings: Box::new(|_| {}),
            config_poll: None,
        }
    }
}

impl Setup {
    /// With this resources file.
    pub fn resources(text: impl Into<String>) -> Setup {
        Setup {
            resources: Some(text.into()),
            ..Setup::default()
        }
    }
}

/// Settings every test gateway shares: port 0, fixed secrets, the test database.
pub fn test_settings(db: &TestDb) -> Settings {
    let mut s = Settings::load(None, |_| None).expect("defaults");
    s.listen = "127.0.0.1:0".parse().expect("addr");
    s.database_url = db.url.clone();
    s.master_key = Some(aigw::config::Secret::new("ab".repeat(32)));
    s.jwt_secret = Some(aigw::config::Secret::new("test-jwt-secret-0123456789abcdef"));
    s.bootstrap_email = Some("owner@example.test".into());
    s.bootstrap_password = Some(aigw::config::Secret::new("owner-password"));
    s.data_dir = db.dir.path().to_path_buf();
    s
}

/// A running gateway.
pub struct TestApp {
    /// `http://127.0.0.1:PORT`.
    pub address: String,
    /// `http://127.0.0.1:PORT` of the admin listener, when `admin_listen` is set.
    #[allow(dead_code, reason = "used by the deployment suite")]
    pub admin_address: Option<String>,
    /// The gateway's state (store, clock).
    pub state: AppState,
    /// The manual clock.
    #[allow(dead_code, reason = "used by the time-based suites")]
    pub clock: Clock,
    /// A plain HTTP client.
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

/// Starts a gateway on `db`.
pub async fn spawn_app(db: &TestDb, setup: Setup) -> TestApp {
    try_spawn_app(db, setup)
        .await
        .unwrap_or_else(|e| panic!("gateway did not start: {e}"))
}

/// Starts a gateway on `db`, or returns why it refused to start.
pub async fn try_spawn_app(db: &TestDb, setup: Setup) -> Result<TestApp, aigw::app::StartError> {
    let mut settings = test_settings(db);
    (setup.settings)(&mut settings);
    let clock = Clock::manual(setup.start);
    let resources = setup.resources.map(|text| db.write("resources.toml", &text));
    let gateway = Gateway::build(
        settings,
        BuildOptions {
            resources,
            clock: Some(clock.clone()),
            config_poll: setup.config_poll,
        },
    )
    .await?;
    let address = format!("http://{}", gateway.local_addr());
    let admin_address = gateway.admin_addr().map(|a| format!("http://{a}"));
    let state = gateway.state().clone();
    let (tx, rx) = oneshot::channel();
    let task = tokio::spawn(gateway.run_until_stopped(async {
        let _ = rx.await;
    }));
    Ok(TestApp {
        address,
        admin_address,
        state,
        clock,
        client: reqwest::Client::new(),
        stop: Some(tx),
        task: Some(task),
    })
}

impl TestApp {
    /// `GET {address}{path}`.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{path}", self.address))
            .send()
            .await
            .expect("request")
    }

    /// `GET {address}{path}` with `token` (a gateway key or an admin token) as the bearer.
    pub async fn get_as(&self, path: &str, token: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{path}", self.address))
            .bearer_auth(token)
            .send()
            .await
            .expect("request")
    }

    /// `POST {address}{path}` with a JSON body and a gateway key.
    pub async fn post_json(&self, path: &str, key: &str, body: &serde_json::Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.address))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .expect("request")
    }

    /// `POST /admin/v1/auth/login`: the answer, whatever it is.
    pub async fn sign_in(&self, email: &str, password: &str) -> reqwest::Response {
        self.client
            .post(format!("{}/admin/v1/auth/login", self.address))
            .json(&serde_json::json!({"email": email, "password": password}))
            .send()
            .await
            .expect("request")
    }

    /// `POST {address}/v1/messages` as Anthropic's clients send it: the key in `x-api-key`, and
    /// `anthropic-version` when `version` is given.
    pub async fn post_messages(
        &self,
        key: &str,
        version: Option<&str>,
        body: &serde_json::Value,
    ) -> reqwest::Response {
        let mut request = self
            .client
            .post(format!("{}/v1/messages", self.address))
            .header("x-api-key", key);
        if let Some(version) = version {
            request = request.header("anthropic-version", version);
        }
        request.json(body).send().await.expect("request")
    }

    /// Signs in to the admin API and returns the token.
    pub async fn login(&self, email: &str, password: &str) -> String {
        let r = self.sign_in(email, password).await;
        assert_eq!(r.status(), 200, "sign-in of {email}");
        let body: serde_json::Value = r.json().await.expect("json");
        body["token"].as_str().expect("token").to_owned()
    }

    /// The id of workspace `name`.
    pub async fn workspace_id(&self, name: &str) -> i64 {
        use aigw::store::WorkspaceStore;
        let ws = self.state.store.workspace_by_name(name).await.unwrap();
        ws.unwrap_or_else(|| panic!("no workspace {name}")).id
    }

    /// The id of acme's upstream credential `name`.
    pub async fn credential_id(&self, name: &str) -> i64 {
        use aigw::store::{UpstreamStore, WorkspaceStore};
        let store = &self.state.store;
        let ws = store.workspace_by_name("acme").await.unwrap().expect("acme");
        let credential = store.upstream_by_name(ws.id, name).await.unwrap();
        credential.unwrap_or_else(|| panic!("no credential {name}")).id
    }

    /// Waits (10 s at most) until `credential` has `n` requests in flight.
    pub async fn until_in_flight(&self, credential: i64, n: usize) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.state.admission.in_flight(credential) != n {
            assert!(
                std::time::Instant::now() < deadline,
                "credential {credential} never had {n} requests in flight"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// The id of the member with `email`, as `token` (an admin token) lists the members.
    pub async fn member_id(&self, token: &str, email: &str) -> i64 {
        let members: serde_json::Value = self
            .get_as("/admin/v1/members", token)
            .await
            .json()
            .await
            .expect("the members");
        members["data"]
            .as_array()
            .expect("a list of members")
            .iter()
            .find(|m| m["email"] == email)
            .and_then(|m| m["id"].as_i64())
            .unwrap_or_else(|| panic!("no member {email}"))
    }

    /// Shares what this gateway did and learns what others did, at once: the pending writes, the
    /// queued request logs and the counters go to the store, and the configuration, locks and
    /// trips are reloaded from it ([`AppState::sync`]). Call it on the gateway that acted, then
    /// on the one that should see it, instead of waiting for the background intervals.
    pub async fn sync(&self) {
        self.state.sync().await;
    }

    /// The request logs of `workspace`, newest first, once at least `n` are written (each try
    /// writes the queued logs first; a log is queued when its request has ended, which can be a
    /// moment after the client got the last byte, so this retries for 10 s at most).
    pub async fn logs(&self, workspace: &str, n: usize) -> Vec<aigw::request_log::LogRecord> {
        use aigw::store::{RequestLogStore, WorkspaceStore};
        let ws = self
            .state
            .store
            .workspace_by_name(workspace)
            .await
            .unwrap()
            .expect("workspace");
        let filter = aigw::request_log::LogFilter {
            workspace_id: ws.id,
            limit: Some(500),
            ..Default::default()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            self.state.logs.flush().await;
            let page = self.state.store.logs(&filter).await.unwrap();
            if page.items.len() >= n || std::time::Instant::now() > deadline {
                assert!(
                    page.items.len() >= n,
                    "expected {n} request logs, found {}",
                    page.items.len()
                );
                return page.items;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// The one request log of acme is a stream that counted the upstream's own report of
    /// `(prompt, completion)` tokens, not an estimate.
    pub async fn assert_stream_logged(&self, (prompt, completion): (u64, u64)) {
        let log = &self.logs("acme", 1).await[0];
        assert_eq!(log.stream, 1);
        assert_eq!(
            (log.prompt_tokens, log.completion_tokens),
            (prompt as i64, completion as i64)
        );
        assert_eq!(log.usage_estimated, 0);
    }

    /// Stops the gateway gracefully and waits until it has drained.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await
                .expect("gateway task")
                .expect("gateway stopped cleanly");
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// Warnings and errors every gateway of this test binary logged so far, one line each (a
/// process-wide log subscriber, installed by the first call; call it before the requests whose
/// lines a test looks for). Tests running at the same time share it: find your lines by a
/// request id.
pub fn logged_warnings() -> Vec<String> {
    use std::sync::{Arc, Mutex};
    #[derive(Clone)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    static LINES: OnceLock<Sink> = OnceLock::new();
    let sink = LINES.get_or_init(|| {
        let sink = Sink(Arc::default());
        let writer = sink.clone();
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .try_init();
        sink
    });
    let bytes = sink.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
    String::from_utf8_lossy(&bytes)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A resources file (docs/resources.md) built table by table, so a test names what it sets up
/// instead of repeating TOML. Every entry is a `[[kind]]` table; [`ResourcesBuilder::with`] adds
/// a field to the last one. Turns into the file's text with `String::from`.
#[derive(Clone, Debug, Default)]
pub struct ResourcesBuilder {
    tables: Vec<(&'static str, toml::Table)>,
}

#[allow(dead_code, reason = "each suite uses the entries it needs")]
impl ResourcesBuilder {
    /// An empty file.
    pub fn new() -> ResourcesBuilder {
        ResourcesBuilder::default()
    }

    /// A `[[kind]]` table with these string fields.
    pub fn table(mut self, kind: &'static str, fields: &[(&str, &str)]) -> ResourcesBuilder {
        let table = fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), toml::Value::from(*v)))
            .collect();
        self.tables.push((kind, table));
        self
    }

    /// Adds `key = value` to the last table.
    pub fn with(mut self, key: &str, value: impl Into<toml::Value>) -> ResourcesBuilder {
        let (_, table) = self.tables.last_mut().expect("a table to add the field to");
        table.insert(key.to_owned(), value.into());
        self
    }

    /// The base most suites extend: workspace `acme`, its plain member `ada@acme.test` and her
    /// key `ci` with the plaintext `key`.
    pub fn acme(key: &str) -> ResourcesBuilder {
        ResourcesBuilder::new()
            .workspace("acme")
            .member("acme", "ada@acme.test", "member")
            .api_key("ada@acme.test", "ci", key)
    }

    /// The texts of `self` and then of `more`, as one file.
    pub fn and(mut self, more: ResourcesBuilder) -> ResourcesBuilder {
        self.tables.extend(more.tables);
        self
    }

    /// Adds `key = value` to the `[[kind]]` entry called `name` (its `name`, or a member's
    /// `email`): how a suite changes one entry of a shared fixture.
    pub fn set(
        mut self,
        kind: &str,
        name: &str,
        key: &str,
        value: impl Into<toml::Value>,
    ) -> ResourcesBuilder {
        let table = self.entry(kind, name);
        table.insert(key.to_owned(), value.into());
        self
    }

    /// Drops `key` from the `[[kind]]` entry called `name`.
    pub fn unset(mut self, kind: &str, name: &str, key: &str) -> ResourcesBuilder {
        let table = self.entry(kind, name);
        table.remove(key).expect("the field to drop");
        self
    }

    /// Drops the `[[kind]]` entry called `name`.
    pub fn without(mut self, kind: &str, name: &str) -> ResourcesBuilder {
        let before = self.tables.len();
        self.tables
            .retain(|(k, t)| !(*k == kind && ResourcesBuilder::is_called(t, name)));
        assert_eq!(self.tables.len() + 1, before, "one [[{kind}]] called {name}");
        self
    }

    fn is_called(table: &toml::Table, name: &str) -> bool {
        ["name", "email"]
            .iter()
            .any(|field| table.get(*field).and_then(toml::Value::as_str) == Some(name))
    }

    fn entry(&mut self, kind: &str, name: &str) -> &mut toml::Table {
        let mut found = self
            .tables
            .iter_mut()
            .filter(|(k, t)| *k == kind && ResourcesBuilder::is_called(t, name));
        let table = found.next().map(|(_, t)| t);
        table.unwrap_or_else(|| panic!("no [[{kind}]] called {name}"))
    }

    /// A workspace.
    pub fn workspace(self, name: &str) -> ResourcesBuilder {
        self.table("workspace", &[("name", name)])
    }

    /// A member without a password (it cannot sign in).
    pub fn member(self, workspace: &str, email: &str, role: &str) -> ResourcesBuilder {
        self.table(
            "member",
            &[("workspace", workspace), ("email", email), ("role", role)],
        )
    }

    /// A member who signs in with `password`.
    pub fn member_with_password(
        self,
        workspace: &str,
        email: &str,
        role: &str,
        password: &str,
    ) -> ResourcesBuilder {
        self.member(workspace, email, role).with("password", password)
    }

    /// A gateway API key of `member` with a fixed plaintext.
    pub fn api_key(self, member: &str, name: &str, key: &str) -> ResourcesBuilder {
        self.table("api_key", &[("member", member), ("name", name), ("key", key)])
    }

    /// An OpenAI-compatible upstream credential serving `models` (`provider`, `priority` and the
    /// rest through [`ResourcesBuilder::with`]).
    pub fn upstream(
        self,
        workspace: &str,
        name: &str,
        base_url: &str,
        secret: &str,
        models: &[&str],
    ) -> ResourcesBuilder {
        self.table(
            "upstream",
            &[
                ("workspace", workspace),
                ("name", name),
                ("provider", "openai-compatible"),
                ("base_url", base_url),
                ("api_key", secret),
            ],
        )
        .with("models", models.to_vec())
    }

    /// An upstream credential of `provider` (`azure`, `anthropic`, ...) serving `models`.
    pub fn provider_upstream(
        self,
        workspace: &str,
        (name, provider): (&str, &str),
        base_url: &str,
        secret: &str,
        models: &[&str],
    ) -> ResourcesBuilder {
        self.upstream(workspace, name, base_url, secret, models)
            .with("provider", provider)
    }

    /// A department of `workspace`.
    pub fn department(self, workspace: &str, name: &str) -> ResourcesBuilder {
        self.table("department", &[("workspace", workspace), ("name", name)])
    }

    /// A model entry (`fallbacks`, `price` and the rest through [`ResourcesBuilder::with`]).
    pub fn model(self, workspace: &str, name: &str) -> ResourcesBuilder {
        self.table("model", &[("workspace", workspace), ("name", name)])
    }

    /// A quota policy in `enforce` mode (`mode` through [`ResourcesBuilder::with`]).
    pub fn policy(
        self,
        workspace: &str,
        subject: &str,
        target: &str,
        (metric, window): (&str, &str),
        limit: f64,
    ) -> ResourcesBuilder {
        self.table(
            "policy",
            &[
                ("workspace", workspace),
                ("subject", subject),
                ("target", target),
                ("metric", metric),
                ("window", window),
            ],
        )
        .with("limit", limit)
    }
}

impl From<ResourcesBuilder> for String {
    fn from(b: ResourcesBuilder) -> String {
        let mut text = String::new();
        for (kind, table) in b.tables {
            text.push_str(&format!("\n[[{kind}]]\n"));
            // Each field on its own line with an inline value, so a nested table (a model alias,
            // a price) stays inside its entry instead of opening a section of its own.
            for (key, value) in table {
                text.push_str(&format!("{key} = {value}\n"));
            }
        }
        text
    }
}

/// A served model under its own name that the upstream calls `upstream`
/// (`{ name = "...", upstream = "..." }` in `models`).
#[allow(dead_code, reason = "each suite uses the entries it needs")]
pub fn aliased(name: &str, upstream: &str) -> toml::Value {
    let mut table = toml::Table::new();
    table.insert("name".to_owned(), name.into());
    table.insert("upstream".to_owned(), upstream.into());
    toml::Value::Table(table)
}

/// A model's price in currency units per million tokens (`{ prompt = .., completion = .. }`).
#[allow(dead_code, reason = "each suite uses the entries it needs")]
pub fn price(prompt: f64, completion: f64) -> toml::Value {
    let mut table = toml::Table::new();
    table.insert("prompt".to_owned(), prompt.into());
    table.insert("completion".to_owned(), completion.into());
    toml::Value::Table(table)
}

/// A gateway on `db` with the resources `resources` writes around a fresh mock upstream.
#[allow(dead_code, reason = "each suite uses the entries it needs")]
pub async fn spawn_on_mock(
    db: &TestDb,
    resources: impl FnOnce(&MockUpstream) -> String,
) -> (TestApp, MockUpstream) {
    let mock = MockUpstream::start().await.expect("mock upstream");
    let app = spawn_app(db, Setup::resources(resources(&mock))).await;
    (app, mock)
}

/// A chat completion request of `model` saying "hi".
#[allow(dead_code, reason = "each suite uses the entries it needs")]
pub fn chat(model: &str) -> serde_json::Value {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
}
