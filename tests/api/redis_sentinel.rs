//! Redis Sentinel as `redis_url` (issue 44, docs/redis.md): gateways given the sentinels
//! (`redis+sentinel://…/<primary>`) share one quota on the primary they name, and follow a
//! failover: writes to the demoted primary are refused (`READONLY`), the gateway asks the
//! sentinels again and goes on with the new primary.
//!
//! Each test starts a primary, a replica and one sentinel of its own (`redis-server`, free
//! ports, no persistence) and kills them at the end.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aigw::mock_upstream::MockUpstream;

use crate::both_backends;
use crate::helpers::{TestApp, TestDb};
use crate::proxy::KEY;
use crate::redis_quota::{chat, gateway, installed, quota_total, redis_up_metric};

/// A primary, its replica and a sentinel watching them (the primary named `main`), killed when
/// dropped, their folders deleted.
struct Sentinelled {
    /// The primary's, the replica's and the sentinel's ports.
    ports: [u16; 3],
    children: Vec<Child>,
    /// The sentinel's configuration file (it rewrites it).
    _dir: tempfile::TempDir,
}

impl Sentinelled {
    /// Starts them; `None` (the test is skipped) where Redis is not installed (CI installs it).
    /// One start at a time: the free ports picked stay free until the servers listen on them,
    /// not taken by the same test on the other backend meanwhile.
    async fn start() -> Option<Sentinelled> {
        static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let _one = ONE_AT_A_TIME.lock().await;
        let bin = installed("redis-server")?;
        let listeners: Vec<std::net::TcpListener> = (0..3)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"))
            .collect();
        let ports: Vec<u16> = listeners.iter().map(|l| l.local_addr().unwrap().port()).collect();
        drop(listeners);
        let ports = [ports[0], ports[1], ports[2]];
        let dir = tempfile::tempdir().expect("tempdir");
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {}\nbind 127.0.0.1\nsentinel monitor main 127.0.0.1 {} 1\n\
                 sentinel down-after-milliseconds main 1000\nsentinel failover-timeout main 10000\n",
                ports[2], ports[0]
            ),
        )
        .expect("sentinel.conf");
        let spawn = |args: Vec<String>| {
            Command::new(&bin)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server starts")
        };
        // Each in a folder of its own: a replica writes the data it syncs to `dump.rdb` in its
        // folder, which a server started there later would load.
        let server = |port: u16| -> Vec<String> {
            let home = dir.path().join(port.to_string());
            std::fs::create_dir_all(&home).expect("a server's folder");
            let home = home.display().to_string();
            [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ]
            .into_iter()
            .chain(["--dir", &home])
            .map(str::to_owned)
            .collect()
        };
        let mut replica = server(ports[1]);
        replica.extend([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            ports[0].to_string(),
        ]);
        let children = vec![
            spawn(server(ports[0])),
            spawn(replica),
            spawn(vec![conf.display().to_string(), "--sentinel".to_owned()]),
        ];
        let set = Sentinelled {
            ports,
            children,
            _dir: dir,
        };
        // Ready once the sentinel knows the replica (it can fail over to it).
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let replicas: Result<Vec<redis::Value>, _> = set
                .ask(ports[2], redis::cmd("SENTINEL").arg("REPLICAS").arg("main"))
                .await;
            if replicas.is_ok_and(|r| !r.is_empty()) {
                break;
            }
            assert!(Instant::now() < deadline, "the sentinel never saw the replica");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Some(set)
    }

    async fn ask<T: redis::FromRedisValue>(&self, port: u16, cmd: &mut redis::Cmd) -> redis::RedisResult<T> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
        let mut c = client.get_multiplexed_async_connection().await?;
        cmd.query_async(&mut c).await
    }

    fn url(&self) -> String {
        format!("redis+sentinel://127.0.0.1:{}/main", self.ports[2])
    }

    fn server_url(&self, i: usize) -> String {
        format!("redis://127.0.0.1:{}/", self.ports[i])
    }

    /// Fails over to the replica and waits (20 s at most) until it is the primary the sentinel
    /// names and says so itself, and the old primary says it is a replica: until then the old
    /// one still takes writes, which it drops when it resyncs (what a failover may lose, the
    /// store still has).
    async fn fail_over(&self) {
        let _: String = self
            .ask(self.ports[2], redis::cmd("SENTINEL").arg("FAILOVER").arg("main"))
            .await
            .expect("failover");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let named: Result<Vec<String>, _> = self
                .ask(
                    self.ports[2],
                    redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg("main"),
                )
                .await;
            let swapped = self.role(1).await == "master" && self.role(0).await == "slave";
            if named.is_ok_and(|n| n.get(1) == Some(&self.ports[1].to_string())) && swapped {
                return;
            }
            assert!(Instant::now() < deadline, "the failover never ended");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Sentinelled {
    /// What server `i` says it is (`ROLE`): "master", "slave", or "" when it does not answer.
    async fn role(&self, i: usize) -> String {
        let role: Result<Vec<redis::Value>, _> = self.ask(self.ports[i], &mut redis::cmd("ROLE")).await;
        role.ok()
            .and_then(|r| {
                r.first()
                    .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
            })
            .unwrap_or_default()
    }
}

impl Drop for Sentinelled {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

both_backends!(gateways_share_a_quota_through_sentinels_and_follow_a_failover);

/// Waits (20 s at most) until the server at `url` holds `want` requests of quota counters.
async fn until_total(url: &str, want: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = quota_total(url).await;
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{url} holds {got}, never {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The status of one more request, and its body when it is refused.
async fn status(app: &TestApp) -> (u16, String) {
    let r = app.post_json("/v1/chat/completions", KEY, &chat()).await;
    let status = r.status().as_u16();
    let body = if status == 200 {
        String::new()
    } else {
        r.text().await.unwrap_or_default()
    };
    (status, body)
}

/// 6 requests a minute between two gateways: 2 on each before a failover, 1 on each after it,
/// then both refuse; the counts reach the new primary.
async fn gateways_share_a_quota_through_sentinels_and_follow_a_failover(db: TestDb) {
    let Some(set) = Sentinelled::start().await else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let a = gateway(&db, &mock, 6, Some(set.url())).await;
    let b = gateway(&db, &mock, 6, Some(set.url())).await;
    for app in [&a, &b, &a, &b] {
        let (status, body) = status(app).await;
        assert_eq!(status, 200, "{body}");
    }
    until_total(&set.server_url(0), 4).await;
    until_total(&set.server_url(1), 4).await; // replicated before the failover
    set.fail_over().await;
    for app in [&a, &b] {
        let (status, body) = status(app).await;
        assert_eq!(status, 200, "{body}");
    }
    // Each gateway's first write went to the demoted primary, was refused, and was sent again to
    // the new one once the sentinel named it.
    until_total(&set.server_url(1), 6).await;
    until_total(&set.server_url(0), 6).await; // the demoted primary now replicates it
    // The refused write took Redis for away (each gateway counted alone meanwhile, the bound
    // without Redis); the writer's probe brings it back.
    for app in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(20);
        while redis_up_metric(app).await.as_deref() != Some("1") {
            assert!(Instant::now() < deadline, "Redis never taken for back");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for app in [&a, &b] {
        let (status, body) = status(app).await;
        assert_eq!(status, 429, "6 of 6 used across both gateways");
        assert!(body.contains("quota_exceeded"), "{body}");
    }
    a.stop().await;
    b.stop().await;
}
