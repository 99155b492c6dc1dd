//! One quota across gateways through Redis (issue 44, DESIGN.md §11): two gateways on one
//! database and one Redis enforce one limit; Redis away, the gateways serve on their own and say
//! so; Redis back, what they counted meanwhile is added once.
//!
//! Each test starts its own `redis-server` on a free port, with no persistence, and kills it at
//! the end: the machine's Redis (6379) is never touched, and no Redis this suite did not start is
//! ever written to.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aigw::mock_upstream::MockUpstream;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::both_backends;
use crate::helpers::{Setup, TestApp, TestDb, spawn_app};
use crate::proxy::{KEY, resources};

/// The installed binary `name` (Debian's `redis-server`, `redis-cli`), if any; CI installs
/// Redis (.ci/run), so there a missing one fails the run instead of skipping the test.
pub(crate) fn installed(name: &str) -> Option<String> {
    let found = ["/usr/bin", "/usr/local/bin"]
        .into_iter()
        .map(|d| format!("{d}/{name}"))
        .find(|p| std::path::Path::new(p).exists());
    assert!(
        found.is_some() || std::env::var("CI").as_deref() != Ok("true"),
        "{name} is not installed"
    );
    found
}

/// A `redis-server` of this test's own, killed when dropped.
pub(crate) struct RedisServer {
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts one on a free port, without persistence; `None` (the test is skipped) where
    /// `redis-server` is not installed.
    pub(crate) fn start() -> Option<RedisServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let mut r = RedisServer { port, child: None };
        r.launch()?;
        Some(r)
    }

    fn launch(&mut self) -> Option<()> {
        let bin = installed("redis-server")?;
        let child = Command::new(bin)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(())
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills it (its data is gone: no persistence).
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub(crate) fn restart(&mut self) {
        self.kill();
        self.launch().expect("redis-server restarts");
    }

    /// Pauses (SIGSTOP) or resumes (SIGCONT) it: a Redis that does not answer, then answers
    /// everything it was sent meanwhile.
    pub(crate) fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    }

    /// Every ambiguous failure the quota groups' sets hold (`aigw:corroboration:*`).
    pub(crate) async fn witnesses(&self) -> usize {
        let client = redis::Client::open(self.url()).expect("url");
        let mut c = client.get_multiplexed_async_connection().await.expect("connect");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("aigw:corroboration:*")
            .query_async(&mut c)
            .await
            .expect("keys");
        let mut total = 0;
        for k in keys {
            let n: usize = redis::cmd("ZCARD")
                .arg(&k)
                .query_async(&mut c)
                .await
                .expect("zcard");
            total += n;
        }
        total
    }

    /// Every quota counter this Redis holds, summed.
    async fn counted(&self) -> i64 {
        quota_total(&self.url()).await
    }
}

/// Every quota counter the Redis server (or cluster node) at `url` holds, summed; the writers'
/// sequence numbers, under the same hash tags, left out.
pub(crate) async fn quota_total(url: &str) -> i64 {
    quota_counters(url).await.iter().map(|(_, v)| v).sum()
}

/// Every quota counter the Redis server (or cluster node) at `url` holds (every workspace's hash
/// tag, `aigw:{quota:<id>}:`), with its value; the writers' sequence numbers left out.
pub(crate) async fn quota_counters(url: &str) -> Vec<(String, i64)> {
    let client = redis::Client::open(url).expect("url");
    let mut c = client.get_multiplexed_async_connection().await.expect("connect");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("aigw:{quota:*")
        .query_async(&mut c)
        .await
        .expect("keys");
    let mut counters = Vec::new();
    for k in keys.into_iter().filter(|k| !k.contains("}:writer:")) {
        let v: i64 = redis::cmd("GET").arg(&k).query_async(&mut c).await.expect("get");
        counters.push((k, v));
    }
    counters
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A paused server would not die of SIGKILL's cleanup otherwise in time.
            let _ = Command::new("kill").args(["-CONT", &c.id().to_string()]).status();
        }
        self.kill();
    }
}

/// A relay in front of a Redis that can be made slow: each reply waits `delay_ms` before it is
/// passed on (what a congested network or an overloaded server looks like to the gateway).
struct SlowRelay {
    port: u16,
    delay_ms: Arc<AtomicU64>,
}

impl SlowRelay {
    async fn start(to: u16) -> SlowRelay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let delay_ms = Arc::new(AtomicU64::new(0));
        let delay = delay_ms.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else {
                    continue;
                };
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
                });
                let delay = delay.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0; 64 * 1024];
                    while let Ok(n @ 1..) = from_server.read(&mut buf).await {
                        let ms = delay.load(Ordering::Relaxed);
                        if ms > 0 {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                        if to_client.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        SlowRelay { port, delay_ms }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn set_delay(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::Relaxed);
    }
}

pub(crate) fn chat() -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "say hello to me"}]})
}

pub(crate) fn requests_per_minute(limit: u32) -> String {
    format!(
        "\n[[policy]]\nworkspace = \"acme\"\nsubject = \"apikey\"\ntarget = \"ada@acme.test/ci\"\nmetric = \"requests\"\nwindow = \"minute\"\nlimit = {limit}\nmode = \"enforce\"\n"
    )
}

/// A gateway on `db` sharing its counters through `redis` (none: on its own), whose own flush
/// to the store is a minute away, so what it knows of the other gateway comes from Redis alone.
pub(crate) async fn gateway(db: &TestDb, mock: &MockUpstream, limit: u32, redis: Option<String>) -> TestApp {
    let mut setup = Setup::resources(resources(mock) + &requests_per_minute(limit));
    setup.settings = Box::new(move |s| {
        s.flush_interval_ms = 60_000;
        s.redis_url = redis.map(aigw::config::Secret::new);
        s.redis_timeout_ms = 100;
    });
    spawn_app(db, setup).await
}

/// A gateway on `db` serving `resources` through the Redis at `redis`, whose store flush (a
/// minute away) and poll (never) teach it nothing within a test: what it learns of another
/// gateway, Redis told it.
pub(crate) async fn redis_only_gateway(db: &TestDb, resources: String, redis: String) -> TestApp {
    let setup = Setup {
        config_poll: Some(crate::redis_locks::NEVER),
        settings: Box::new(move |s| {
            s.redis_url = Some(aigw::config::Secret::new(redis));
            s.redis_timeout_ms = 100;
            s.flush_interval_ms = 60_000;
        }),
        ..Setup::resources(resources)
    };
    spawn_app(db, setup).await
}

async fn readyz(app: &TestApp) -> (u16, String) {
    let r = app.get("/readyz").await;
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

pub(crate) async fn redis_up_metric(app: &TestApp) -> Option<String> {
    let text = app.get("/metrics").await.text().await.unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("aigw_redis_up "))
        .map(|l| l["aigw_redis_up ".len()..].to_owned())
}

/// Polls `/readyz` until its detail contains `word` (the gateway's probe runs in the
/// background), for 10 s at most.
pub(crate) async fn until_readyz_says(app: &TestApp, word: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = readyz(app).await;
        if body.contains(word) {
            return;
        }
        assert!(Instant::now() < deadline, "/readyz never said {word:?}: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls Redis until its counters sum to at least `n`, for 10 s at most; returns the sum.
async fn until_counted(redis: &RedisServer, n: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = redis.counted().await;
        if c >= n || Instant::now() > deadline {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

both_backends!(
    two_gateways_admit_one_limit,
    redis_away_serves_alone_and_resyncs_once,
    a_slow_redis_stays_away_until_it_answers_in_time,
);

/// Requests one after another, alternating between two gateways: with Redis exactly the limit
/// is admitted (nothing is in flight at a check); each gateway alone would admit the limit.
async fn two_gateways_admit_one_limit(db: TestDb) {
    let Some(redis) = RedisServer::start() else { return };
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, &mock, 4, Some(redis.url())).await;
    let b = gateway(&db, &mock, 4, Some(redis.url())).await;
    let mut admitted = 0;
    for i in 0..10 {
        let app = if i % 2 == 0 { &a } else { &b };
        let r = app.post_json("/v1/chat/completions", KEY, &chat()).await;
        match r.status().as_u16() {
            200 => {
                admitted += 1;
                // The write after completion is in the background: a request is in flight
                // until its count is in Redis.
                assert_eq!(until_counted(&redis, admitted).await, admitted);
            }
            429 => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(admitted, 4, "one limit across both gateways");
    assert_eq!(redis_up_metric(&a).await.as_deref(), Some("1"));
}

/// Redis paused: requests are still served, `/readyz` and `aigw_redis_up` say Redis is away.
/// Resumed (it then also runs what it was sent while paused): the counts add up to the requests
/// served, not more. Restarted empty: the counters are reseeded from the gateway's own.
async fn redis_away_serves_alone_and_resyncs_once(db: TestDb) {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, &mock, 100, Some(redis.url())).await;
    for _ in 0..3 {
        let r = a.post_json("/v1/chat/completions", KEY, &chat()).await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(until_counted(&redis, 3).await, 3);
    let (status, body) = readyz(&a).await;
    assert_eq!((status, body.contains("redis up")), (200, true), "{body}");

    redis.signal("-STOP");
    for _ in 0..2 {
        let r = a.post_json("/v1/chat/completions", KEY, &chat()).await;
        assert_eq!(r.status(), 200, "served from the gateway's own counters");
    }
    until_readyz_says(&a, "redis unreachable").await;
    let (status, _) = readyz(&a).await;
    assert_eq!(status, 200, "the gateway still serves");
    assert_eq!(redis_up_metric(&a).await.as_deref(), Some("0"));

    redis.signal("-CONT");
    until_readyz_says(&a, "redis up").await;
    assert_eq!(until_counted(&redis, 5).await, 5, "counted once");
    assert_eq!(redis_up_metric(&a).await.as_deref(), Some("1"));

    redis.restart();
    let r = a.post_json("/v1/chat/completions", KEY, &chat()).await;
    assert_eq!(r.status(), 200);
    until_readyz_says(&a, "redis up").await;
    assert_eq!(
        until_counted(&redis, 6).await,
        6,
        "reseeded from the gateway's counters"
    );
}

/// Redis answering slower than `redis_timeout_ms` (100 ms here) but faster than a write's bound:
/// the gateway counts alone from the first late answer and stays so, although its writes still
/// get through (they may wait longer), until a ping is answered in time again.
async fn a_slow_redis_stays_away_until_it_answers_in_time(db: TestDb) {
    let Some(redis) = RedisServer::start() else { return };
    let relay = SlowRelay::start(redis.port).await;
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, &mock, 100, Some(relay.url())).await;
    for _ in 0..2 {
        let r = a.post_json("/v1/chat/completions", KEY, &chat()).await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(until_counted(&redis, 2).await, 2);

    relay.set_delay(300);
    for _ in 0..3 {
        let r = a.post_json("/v1/chat/completions", KEY, &chat()).await;
        assert_eq!(r.status(), 200, "served from the gateway's own counters");
    }
    until_readyz_says(&a, "redis unreachable").await;
    // The writes of those requests get through, late.
    assert_eq!(until_counted(&redis, 5).await, 5, "counted once");
    let (_, body) = readyz(&a).await;
    assert!(
        body.contains("redis unreachable"),
        "a late write does not bring Redis back: {body}"
    );
    assert_eq!(redis_up_metric(&a).await.as_deref(), Some("0"));

    relay.set_delay(0);
    until_readyz_says(&a, "redis up").await;
    assert_eq!(redis_up_metric(&a).await.as_deref(), Some("1"));
}
