//! Redis Cluster as `redis_url` (issue 44, DESIGN.md §11): gateways on a cluster share one quota
//! and hear each other's locks, whether given the seed nodes' list or one node's URL (taken for a
//! cluster's seed at the first contact).
//!
//! Each test starts a 3-primary cluster of its own (`redis-server --cluster-enabled yes` on free
//! ports, joined by `redis-cli --cluster create`), without persistence, and kills it at the end.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aigw::mock_upstream::MockUpstream;

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, TestDb};
use crate::proxy::KEY;
use crate::redis_locks::{NEVER, pair, park_both, until_parked};
use crate::redis_quota::{chat, installed, quota_counters, quota_total, redis_up_metric, until_readyz_says};

/// The plaintext of the second workspace's key.
const BETA_KEY: &str = "sk-aigw-BetaClusterKey0123456789abcdefgh";

/// A 3-primary Redis Cluster of this test's own, killed when dropped.
struct RedisCluster {
    ports: Vec<u16>,
    children: Vec<Child>,
    /// The nodes' cluster configuration files.
    dir: tempfile::TempDir,
}

impl RedisCluster {
    /// Starts and joins three nodes; `None` (the test is skipped) where Redis is not installed.
    async fn start() -> Option<RedisCluster> {
        let server = installed("redis-server")?;
        let cli = installed("redis-cli")?;
        let dir = tempfile::tempdir().expect("tempdir");
        // Six free ports: the clients' and the cluster buses' (port + 10000 may not exist).
        let listeners: Vec<std::net::TcpListener> = (0..6)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"))
            .collect();
        let free: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().expect("addr").port())
            .collect();
        drop(listeners);
        let mut cluster = RedisCluster {
            ports: free[..3].to_vec(),
            children: Vec::new(),
            dir,
        };
        for (port, bus) in free[..3].iter().zip(&free[3..]) {
            let child = Command::new(&server)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes", "--cluster-port", &bus.to_string()])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .arg("--dir")
                .arg(cluster.dir.path())
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server starts");
            cluster.children.push(child);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for port in &cluster.ports {
            while std::net::TcpStream::connect(("127.0.0.1", *port)).is_err() {
                assert!(Instant::now() < deadline, "redis-server did not start");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let nodes: Vec<String> = cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let created = tokio::process::Command::new(&cli)
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .is_ok_and(|s| s.success());
        assert!(created, "redis-cli --cluster create");
        // Every node must know every slot's owner before a client asks it for the map.
        let deadline = Instant::now() + Duration::from_secs(30);
        for i in 0..3 {
            while !cluster.cluster_info(i).await.contains("cluster_state:ok") {
                assert!(Instant::now() < deadline, "the cluster never came up");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Some(cluster)
    }

    /// Node `i`'s URL.
    fn node(&self, i: usize) -> String {
        format!("redis://127.0.0.1:{}/", self.ports[i])
    }

    /// Every node's URL, separated by commas: `redis_url`'s seed-list form.
    fn seeds(&self) -> String {
        (0..3).map(|i| self.node(i)).collect::<Vec<_>>().join(",")
    }

    async fn cluster_info(&self, i: usize) -> String {
        let client = redis::Client::open(self.node(i)).expect("url");
        let Ok(mut c) = client.get_multiplexed_async_connection().await else {
            return String::new();
        };
        redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut c)
            .await
            .unwrap_or_default()
    }

    /// A node that does not hold `key`'s slot (it answers `MOVED`): a single-server client given
    /// its URL could not write the key.
    async fn node_without(&self, key: &str) -> usize {
        for i in 0..3 {
            let client = redis::Client::open(self.node(i)).expect("url");
            let mut c = client.get_multiplexed_async_connection().await.expect("connect");
            let read = redis::cmd("GET")
                .arg(key)
                .query_async::<Option<String>>(&mut c)
                .await;
            if read.is_err_and(|e| e.redirect_node().is_some()) {
                return i;
            }
        }
        panic!("every node holds the slot of {key}");
    }

    /// Every quota counter the cluster holds, summed over its nodes.
    async fn counted(&self) -> i64 {
        let mut total = 0;
        for i in 0..3 {
            total += quota_total(&self.node(i)).await;
        }
        total
    }

    /// Polls the cluster until its counters sum to at least `n`, for 10 s at most; the sum.
    async fn until_counted(&self, n: i64) -> i64 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let c = self.counted().await;
            if c >= n || Instant::now() > deadline {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl RedisCluster {
    /// Kills every node (their data is gone: no persistence).
    fn kill(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.kill();
    }
}

both_backends!(
    two_gateways_on_a_cluster_admit_one_limit,
    the_workspaces_counters_spread_over_the_primaries,
    a_park_reaches_the_other_gateway_through_a_cluster,
    a_cluster_away_leaves_each_gateway_counting_alone,
);

/// One gateway given the seed list, the other one node's URL (one that does not hold the quota
/// counters' slot, so only a cluster client reaches them): requests one after another,
/// alternating, admit exactly the limit across both.
async fn two_gateways_on_a_cluster_admit_one_limit(db: TestDb) {
    let Some(cluster) = RedisCluster::start().await else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let a = crate::redis_quota::gateway(&db, &mock, 4, Some(cluster.seeds())).await;
    let ws = a.workspace_id("acme").await;
    let elsewhere = cluster.node_without(&format!("aigw:{{quota:{ws}}}:x")).await;
    let b = crate::redis_quota::gateway(&db, &mock, 4, Some(cluster.node(elsewhere))).await;
    // The first contact (the cluster's map, a connection per node) may outlast a first check.
    for app in [&a, &b] {
        until_readyz_says(app, "redis up").await;
    }
    let mut admitted = 0;
    for i in 0..10 {
        let app = if i % 2 == 0 { &a } else { &b };
        let r = app.post_json("/v1/chat/completions", KEY, &chat()).await;
        match r.status().as_u16() {
            200 => {
                admitted += 1;
                assert_eq!(cluster.until_counted(admitted).await, admitted);
            }
            429 => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(admitted, 4, "one limit across both gateways");
    for app in [&a, &b] {
        assert_eq!(redis_up_metric(app).await.as_deref(), Some("1"));
    }
}

/// Two workspaces' counters live under their own hash tags, each on the primary holding its
/// slot: the quota work of a cluster is spread by workspace, and each workspace's limit holds.
async fn the_workspaces_counters_spread_over_the_primaries(db: TestDb) {
    let Some(cluster) = RedisCluster::start().await else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let beta = ResourcesBuilder::new()
        .workspace("beta")
        .member("beta", "bo@beta.test", "member")
        .api_key("bo@beta.test", "ci", BETA_KEY)
        .upstream("beta", "primary", &mock.base_url(), "cred-beta", &["gpt-4o-mini"])
        .model("beta", "gpt-4o-mini")
        .policy("beta", "apikey", "bo@beta.test/ci", ("requests", "minute"), 3.0);
    let resources =
        crate::proxy::resources(&mock) + &crate::redis_quota::requests_per_minute(2) + &String::from(beta);
    let app = crate::redis_quota::redis_only_gateway(&db, resources, cluster.seeds()).await;
    until_readyz_says(&app, "redis up").await;
    let mut admitted = [0, 0];
    for _ in 0..5 {
        for (i, key) in [KEY, BETA_KEY].into_iter().enumerate() {
            let r = app.post_json("/v1/chat/completions", key, &chat()).await;
            match r.status().as_u16() {
                200 => admitted[i] += 1,
                429 => {}
                other => panic!("unexpected status {other}"),
            }
        }
    }
    assert_eq!(admitted, [2, 3], "each workspace's limit");
    assert_eq!(cluster.until_counted(5).await, 5);

    let mut homes = Vec::new();
    for name in ["acme", "beta"] {
        let tag = format!("aigw:{{quota:{}}}:", app.workspace_id(name).await);
        let mut found = Vec::new();
        for i in 0..3 {
            let held = quota_counters(&cluster.node(i)).await;
            if held.iter().any(|(k, _)| k.starts_with(&tag)) {
                found.push(i);
            }
        }
        assert_eq!(found.len(), 1, "{name}'s counters on one primary: {found:?}");
        let home = found[0];
        assert_ne!(cluster.node_without(&format!("{tag}x")).await, home, "its slot's");
        homes.push(home);
    }
    // A fresh store numbers them 1 and 2: tags `{quota:1}` and `{quota:2}`, slots 11851 and
    // 7720, held by two of the three primaries `--cluster create` gives equal ranges.
    assert_ne!(homes[0], homes[1], "two workspaces, two primaries");
}

/// A park through `a` (the seed list) reaches `b` (one node's URL, subscribed there) at once
/// through the cluster's publish, not its store poll (an hour away).
async fn a_park_reaches_the_other_gateway_through_a_cluster(db: TestDb) {
    let Some(cluster) = RedisCluster::start().await else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let gateway = crate::redis_locks::gateway;
    let a = gateway(&db, pair(&mock), Some(cluster.seeds()), NEVER).await;
    let b = gateway(&db, pair(&mock), Some(cluster.node(2)), NEVER).await;
    park_both(&a, &mock).await;
    until_parked(&b, &[b.credential_id("one").await, b.credential_id("two").await]).await;
    let r = b
        .post_json("/v1/chat/completions", KEY, &crate::helpers::chat("m1"))
        .await;
    assert_eq!(r.status(), 429);
    assert_eq!(mock.call_count(), 2, "nothing sent upstream by the other gateway");
    a.stop().await;
    b.stop().await;
}

/// The cluster gone: requests are still served, counted by the gateway alone, and `/readyz` and
/// `aigw_redis_up` say Redis is away, as with one server.
async fn a_cluster_away_leaves_each_gateway_counting_alone(db: TestDb) {
    let Some(mut cluster) = RedisCluster::start().await else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let a = crate::redis_quota::gateway(&db, &mock, 100, Some(cluster.seeds())).await;
    until_readyz_says(&a, "redis up").await;
    let r = a.post_json("/v1/chat/completions", KEY, &chat()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(cluster.until_counted(1).await, 1);

    cluster.kill();
    for _ in 0..2 {
        let r = a.post_json("/v1/chat/completions", KEY, &chat()).await;
        assert_eq!(r.status(), 200, "served from the gateway's own counters");
    }
    until_readyz_says(&a, "redis unreachable").await;
    assert_eq!(redis_up_metric(&a).await.as_deref(), Some("0"));
}
