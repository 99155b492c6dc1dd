//! One link to the Redis of `redis_url` (issue 44, DESIGN.md §11, docs/redis.md): a single server
//! (Redis or Valkey) or a Redis Cluster, behind one type every Redis user of the gateway holds,
//! so that none of them branches on which it is.
//!
//! Invariants:
//! - `redis_url` is one URL or a cluster's seed nodes, comma-separated ([`seeds`]). Several seeds
//!   are a cluster. One seed is asked at the first contact (`INFO cluster`): a node with
//!   `cluster_enabled:1` is taken as the cluster's seed, anything else is a single server, used
//!   exactly as before (one reconnecting `ConnectionManager`).
//! - The link is made in the background from its creation: an absent Redis does not stop the
//!   gateway. A contact that fails leaves the link unmade, and the next call tries again, one
//!   contact at a time. Every call is bounded by its caller (`quota::shared::bounded`), the
//!   contact itself by four of the link's timeouts.
//! - On a cluster, commands are routed by their keys' hash slots. Every script and multi-key
//!   command of the gateway names keys of one slot (its users put their keys under one hash tag:
//!   `aigw:{quota:<workspace id>}:…`, `aigw:{breaker}:…`, `aigw:{own}:…`), so no call is refused
//!   as `CROSSSLOT`.
//! - Or the sentinels of a primary (`redis+sentinel://` or `rediss+sentinel://`, [`Sentinels`]):
//!   the connection is made to the primary the sentinels name, and made anew, asking them again,
//!   when the one made fails (closed, timed out, or demoted to a replica: `READONLY`), so a
//!   failover is followed from the next call after it.
//! - Pub/sub needs no cluster routing: a classic `PUBLISH` reaches every node of a cluster, so the
//!   subscriber listens on one seed ([`RedisLink::seed`]), another at each reconnection.
//! - One word on whether Redis answers, for every user of the link and its other connections
//!   ([`RedisLink::is_up`]): any exchange that fails takes Redis for away, and only a `PING`
//!   answered within the checks' bound (`redis_timeout_ms`) brings it back, so a Redis slower than
//!   the checks stays away instead of coming and going with every write. The change is logged
//!   once each way, and `/readyz` and `aigw_redis_up` show it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::timeout as within;

use redis::aio::MultiplexedConnection;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use super::redis_sentinel::{Sentinels, lost, sentinel_url};

/// The seed URLs of `redis_url`: one server's, or a cluster's seed nodes separated by commas.
pub fn seeds(url: &str) -> Vec<&str> {
    url.split(',').map(str::trim).filter(|s| !s.is_empty()).collect()
}

/// The connection once made.
#[derive(Clone)]
enum Made {
    /// One server: reconnects by itself.
    Single(ConnectionManager),
    /// A cluster: a connection per node, routed by hash slot; follows the cluster's changes.
    Cluster(ClusterConnection),
    /// The primary the sentinels named: made anew when it fails ([`lost`]).
    Sentinel(MultiplexedConnection),
}

/// A link to the Redis of `redis_url`, made in the background; cheap to clone (clones share it).
#[derive(Clone)]
pub struct RedisLink {
    /// One client per seed URL (parsed at construction).
    seeds: Arc<[redis::Client]>,
    /// The seed URLs, as written (a cluster client is built from them).
    urls: Arc<[String]>,
    /// Longest a check's round trip may take (`redis_timeout_ms`): a read before dispatch, a
    /// probe of a Redis taken for away.
    timeout: Duration,
    /// The connection, once made, and the contact that makes it.
    contact: Arc<Contact>,
    /// The sentinels, when `redis_url` names them.
    sentinels: Option<Arc<Sentinels>>,
    /// Whether Redis answers: one word for every connection of the link.
    up: Arc<AtomicBool>,
    /// Wakes the writers waiting with nothing to send when Redis is taken for away, so that they
    /// probe it (a gateway with no traffic learns it is back too).
    gone: Arc<tokio::sync::Notify>,
    /// This link's number in the process (shared by its other connections): names its
    /// connection on each serving thread ([`RedisLink::on_this_thread`]).
    id: u64,
}

/// Links made so far in the process: the next link's [`RedisLink::id`].
static LINKS: AtomicU64 = AtomicU64::new(0);

/// Links a serving thread keeps a connection of at most (one a gateway: more only in a test
/// process running several gateways, whose threads outlive none of them).
const THREAD_LINKS: usize = 4;

thread_local! {
    /// The connections made on this thread, by link.
    static THREAD_CONNECTIONS: std::cell::RefCell<Vec<(u64, RedisLink)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The making of the connection: one contact at a time, whatever the number of callers waiting.
#[derive(Default)]
struct Contact {
    /// The connection, once made (forgotten when it fails, with sentinels only).
    made: arc_swap::ArcSwapOption<Made>,
    /// Whether a contact is under way.
    under_way: AtomicBool,
    /// Why the last contact failed.
    failed: Mutex<String>,
    /// Wakes the callers waiting for a contact when it ends.
    done: tokio::sync::Notify,
}

impl RedisLink {
    /// A link to `url` (see [`seeds`]) whose checks wait `timeout` at most (connections, writes
    /// and replies: [`RedisLink::write_timeout`]), contacted in the background. Fails on a URL
    /// the client cannot read.
    pub fn new(url: &str, timeout: Duration) -> Result<RedisLink, String> {
        let urls: Vec<String> = seeds(url).into_iter().map(str::to_owned).collect();
        let clients = urls
            .iter()
            .map(|u| match sentinel_url(u) {
                Ok(Some((info, _))) => redis::Client::open(info),
                _ => redis::Client::open(u.as_str()),
            })
            .collect::<RedisResult<Vec<_>>>()
            .map_err(|e| format!("redis_url (AIGW_REDIS_URL): {e}"))?;
        if clients.is_empty() {
            return Err("redis_url (AIGW_REDIS_URL): no URL given".to_owned());
        }
        let sentinels = Sentinels::of(&urls)
            .map_err(|e| format!("redis_url (AIGW_REDIS_URL): {e}"))?
            .map(Arc::new);
        if urls.len() > 1 && sentinels.is_none() {
            // Seeds that cannot make one cluster (passwords or TLS that differ) are refused now.
            cluster_client(&urls, write_timeout(timeout))
                .map_err(|e| format!("redis_url (AIGW_REDIS_URL): {e}"))?;
        }
        let link = RedisLink {
            seeds: clients.into(),
            urls: urls.into(),
            timeout,
            contact: Arc::default(),
            sentinels,
            up: Arc::new(AtomicBool::new(true)),
            gone: Arc::default(),
            id: LINKS.fetch_add(1, Ordering::Relaxed),
        };
        link.contact_soon();
        Ok(link)
    }

    /// A second connection to the same Redis, sharing this link's word on whether it answers:
    /// the checks before dispatch get one of their own, so that a read never waits behind a
    /// write's script on the same connection.
    pub fn another_connection(&self) -> RedisLink {
        let link = RedisLink {
            contact: Arc::default(),
            ..self.clone()
        };
        link.contact_soon();
        link
    }

    /// The link's connection on the calling thread, if it runs a single-threaded runtime (a
    /// serving thread: edge::serving) and the connection is made; else this one. A request's
    /// round trip then never leaves its thread: on a connection of the main runtime, each one
    /// paid two cross-thread wake-ups, more than Redis's own answer. The thread's connection is
    /// made in the background at its first use (and again after a failed contact), meanwhile
    /// this one serves.
    pub fn on_this_thread(&self) -> RedisLink {
        let single = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
        if !single {
            return self.clone();
        }
        THREAD_CONNECTIONS.with(|held| {
            let mut held = held.borrow_mut();
            match held.iter().find(|(id, _)| *id == self.id) {
                Some((_, own)) if own.contact.made.load().is_some() => return own.clone(),
                Some((_, own)) => {
                    if !own.contact.under_way.swap(true, Ordering::AcqRel) {
                        own.start_contact();
                    }
                }
                None => {
                    if held.len() >= THREAD_LINKS {
                        held.remove(0);
                    }
                    held.push((self.id, self.another_connection()));
                }
            }
            self.clone()
        })
    }

    /// Starts the first contact now, in the background: the first request need not wait for it
    /// (within a runtime; a failed one is tried again at the next use).
    fn contact_soon(&self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            self.contact.under_way.store(true, Ordering::Release);
            self.start_contact();
        }
    }

    /// Longest a check may wait (`redis_timeout_ms`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Longest a write may wait: it carries a batch and is off the request path, so it may take
    /// longer than a check before Redis is taken for away (500 ms at least).
    pub fn write_timeout(&self) -> Duration {
        write_timeout(self.timeout)
    }

    /// Whether Redis answered the link's last exchange (`aigw_redis_up`, `/readyz`): checks and
    /// the writers' queues use it only while it does.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Notes Redis away after an exchange failed for `why`; logs it once per outage.
    pub fn went_down(&self, why: &str) {
        if self.up.swap(false, Ordering::Relaxed) {
            self.gone.notify_waiters();
            tracing::warn!(
                error = %why,
                "redis unreachable: quotas counted by this gateway alone, breakers, own limits and locks shared through the store, until it returns"
            );
        }
    }

    /// Completes when Redis is next taken for away ([`RedisLink::went_down`]); `enable` it
    /// before looking at [`RedisLink::is_up`] so that no change falls between the two.
    pub fn taken_for_away(&self) -> tokio::sync::futures::Notified<'_> {
        self.gone.notified()
    }

    /// Asks Redis whether it is back (a `PING` within the checks' bound); notes and logs it
    /// once when it is.
    pub async fn probe(&self) -> bool {
        let mut conn = self.clone();
        let ping = redis::cmd("PING");
        let back = bounded(self.timeout, ping.query_async::<String>(&mut conn))
            .await
            .is_ok();
        if back && !self.up.swap(true, Ordering::Relaxed) {
            tracing::info!("redis reachable again: quotas, breakers, own limits and locks shared through it");
        }
        back
    }

    /// The client of one seed, by turns: the subscriber's `n`-th connection attempt uses the
    /// `n`-th seed, so a seed that went away is left for the next. With sentinels, the primary
    /// they name now.
    pub async fn seed(&self, n: usize) -> RedisResult<redis::Client> {
        match &self.sentinels {
            Some(s) => s.primary().await,
            None => Ok(self.seeds[n % self.seeds.len()].clone()),
        }
    }

    /// The connection, made now if it is not yet. The contact runs in a task of its own, one at a
    /// time: a caller that stops waiting (its bound) does not cancel it, so a slow first contact
    /// (a cluster's nodes and slots) still ends and serves the next call, and callers arriving
    /// during a contact wait for it instead of piling up contacts of their own.
    async fn made(&self) -> RedisResult<Arc<Made>> {
        let c = &self.contact;
        if let Some(made) = c.made.load_full() {
            return Ok(made);
        }
        // Registered before the checks below: the end of a contact under way wakes it.
        let done = c.done.notified();
        if let Some(made) = c.made.load_full() {
            return Ok(made);
        }
        if !c.under_way.swap(true, Ordering::AcqRel) {
            self.start_contact();
        }
        done.await;
        match c.made.load_full() {
            Some(made) => Ok(made),
            None => {
                let why = c.failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
                Err(std::io::Error::other(why).into())
            }
        }
    }

    /// Starts a contact, [`Contact::under_way`] set by the caller; bounded by four timeouts.
    fn start_contact(&self) {
        let link = self.clone();
        tokio::spawn(async move {
            let c = &link.contact;
            match within(link.write_timeout().saturating_mul(4), link.make()).await {
                Ok(Ok(made)) => c.made.store(Some(Arc::new(made))),
                Ok(Err(e)) => *c.failed.lock().unwrap_or_else(|p| p.into_inner()) = e.to_string(),
                Err(_) => *c.failed.lock().unwrap_or_else(|p| p.into_inner()) = "timed out".to_owned(),
            }
            c.under_way.store(false, Ordering::Release);
            c.done.notify_waiters();
        });
    }

    async fn make(&self) -> RedisResult<Made> {
        if let Some(sentinels) = &self.sentinels {
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.write_timeout()))
                .set_response_timeout(Some(self.write_timeout()));
            let primary = sentinels.primary().await?;
            let conn = primary
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            return Ok(Made::Sentinel(conn));
        }
        if self.seeds.len() > 1 || self.is_cluster_node().await? {
            let client = cluster_client(&self.urls, self.write_timeout())?;
            return Ok(Made::Cluster(client.get_async_connection().await?));
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.write_timeout()))
            .set_response_timeout(Some(self.write_timeout()))
            .set_number_of_retries(1);
        let manager = ConnectionManager::new_with_config(self.seeds[0].clone(), config).await?;
        Ok(Made::Single(manager))
    }

    /// Whether the one seed is a node of a cluster (`INFO cluster` says `cluster_enabled:1`; a
    /// server that does not know the section is a single server).
    async fn is_cluster_node(&self) -> RedisResult<bool> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.write_timeout()))
            .set_response_timeout(Some(self.write_timeout()));
        let mut conn = self.seeds[0]
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let info: String = redis::cmd("INFO").arg("cluster").query_async(&mut conn).await?;
        Ok(cluster_enabled(&info))
    }
}

impl RedisLink {
    /// If `failed` says `made` (a connection to the primary the sentinels named) is lost: forgets
    /// it (a connection made since is kept) and makes one anew, asking the sentinels again, for
    /// the call to be sent once more. A failover kills the old primary's connections and makes
    /// it refuse writes: the call goes to the new primary instead of failing. Sent again, a call
    /// the old primary ran before its connection closed runs twice: the gateway's scripts apply
    /// a batch once, and a notice heard twice changes nothing.
    async fn remade_if_lost(
        &self,
        made: &Arc<Made>,
        failed: Option<&RedisError>,
    ) -> Option<RedisResult<MultiplexedConnection>> {
        if !failed.is_some_and(lost) {
            return None;
        }
        let _ = self.contact.made.compare_and_swap(made, None);
        Some(self.made().await.and_then(|m| match &*m {
            Made::Sentinel(c) => Ok(c.clone()),
            _ => Err(std::io::Error::other("not a sentinel's primary").into()),
        }))
    }
}

/// A client of the cluster whose seeds are `urls` (nothing contacted yet).
fn cluster_client(urls: &[String], timeout: Duration) -> RedisResult<ClusterClient> {
    ClusterClientBuilder::new(urls.iter().map(String::as_str))
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .retries(1)
        .build()
}

/// `call` to Redis, waited on `timeout` at most: its answer, or why there is none (Redis's
/// error, or "timed out"). Every Redis call of the gateway goes through it.
pub async fn bounded<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = RedisResult<T>>,
) -> Result<T, String> {
    match within(timeout, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".to_owned()),
    }
}

/// See [`RedisLink::write_timeout`].
fn write_timeout(timeout: Duration) -> Duration {
    timeout.max(Duration::from_millis(500))
}

/// Whether an `INFO cluster` answer says the server is a cluster node.
fn cluster_enabled(info: &str) -> bool {
    info.lines().any(|l| l.trim() == "cluster_enabled:1")
}

impl ConnectionLike for RedisLink {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let made = self.made().await?;
            match &*made {
                Made::Single(c) => c.clone().req_packed_command(cmd).await,
                Made::Cluster(c) => c.clone().req_packed_command(cmd).await,
                Made::Sentinel(c) => {
                    let answer = c.clone().req_packed_command(cmd).await;
                    match self.remade_if_lost(&made, answer.as_ref().err()).await {
                        Some(c) => c?.req_packed_command(cmd).await,
                        None => answer,
                    }
                }
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let made = self.made().await?;
            match &*made {
                Made::Single(c) => c.clone().req_packed_commands(pipeline, offset, count).await,
                Made::Cluster(c) => c.clone().req_packed_commands(pipeline, offset, count).await,
                Made::Sentinel(c) => {
                    let answer = c.clone().req_packed_commands(pipeline, offset, count).await;
                    match self.remade_if_lost(&made, answer.as_ref().err()).await {
                        Some(c) => c?.req_packed_commands(pipeline, offset, count).await,
                        None => answer,
                    }
                }
            }
        })
    }

    fn get_db(&self) -> i64 {
        match self.contact.made.load().as_deref() {
            Some(Made::Single(c)) => c.get_db(),
            Some(Made::Sentinel(c)) => c.get_db(),
            Some(Made::Cluster(_)) | None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_split_on_commas() {
        let cases: &[(&str, &[&str])] = &[
            ("redis://127.0.0.1:6379/0", &["redis://127.0.0.1:6379/0"]),
            (
                "redis://h1:7000, redis://h2:7001,",
                &["redis://h1:7000", "redis://h2:7001"],
            ),
            ("", &[]),
        ];
        for (url, want) in cases {
            assert_eq!(seeds(url), *want, "{url:?}");
        }
    }

    #[test]
    fn a_cluster_node_is_told_by_its_info() {
        let node = "# Cluster\r\ncluster_enabled:1\r\n";
        let single = "# Cluster\r\ncluster_enabled:0\r\n";
        assert!(cluster_enabled(node));
        assert!(!cluster_enabled(single));
        assert!(!cluster_enabled(""), "a server without the section");
    }

    #[test]
    fn a_link_reads_its_seeds_and_refuses_unreadable_urls() {
        let link = RedisLink::new(
            "redis://127.0.0.1:1/,redis://127.0.0.1:2/",
            Duration::from_millis(50),
        );
        let link = link.expect("two seeds");
        let seed = futures::executor::block_on(link.seed(3)).expect("a seed");
        assert_eq!(seed.get_connection_info().addr().to_string(), "127.0.0.1:2");
        let refused = [
            "",
            "http://127.0.0.1:6379",
            "redis://:a@127.0.0.1:1/,redis://:b@127.0.0.1:2/",
            "redis+sentinel://127.0.0.1:26379",
            "redis+sentinel://127.0.0.1:26379/a,redis+sentinel://127.0.0.1:26380/b",
            "redis+sentinel://127.0.0.1:26379/a,redis://127.0.0.1:6379/",
        ];
        for url in refused {
            assert!(RedisLink::new(url, Duration::from_millis(50)).is_err(), "{url}");
        }
        let sentinels = "redis+sentinel://127.0.0.1/main, redis+sentinel://127.0.0.1:26380/main";
        assert!(RedisLink::new(sentinels, Duration::from_millis(50)).is_ok());
    }
}
