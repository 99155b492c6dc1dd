//! The sentinels of a primary as `redis_url` (issue 44, docs/redis.md "Redis Sentinel"): reading
//! their URLs, asking them for the primary, and telling a connection to a primary that is no
//! longer one ([`lost`]). The link ([`super::redis_link`]) makes its connection from their answer
//! and makes it anew when it is lost.

use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind};

/// `redis_url`'s sentinels: `redis+sentinel://[[user]:password@]host[:port]/<primary>[/<db>]`,
/// comma-separated for several (each naming the same primary; `rediss+sentinel://` for TLS to
/// the sentinels and the servers). The user and password are the servers'; the sentinels are
/// asked without.
pub struct Sentinels {
    /// Asks the sentinels for the primary (one question at a time).
    client: tokio::sync::Mutex<SentinelClient>,
}

impl Sentinels {
    /// The sentinels of `urls`, if they are `redis+sentinel://` URLs (`Ok(None)` if none is); an
    /// error for a mix, a URL without a primary's name, or two primaries' names.
    pub fn of(urls: &[String]) -> Result<Option<Sentinels>, String> {
        let read: Vec<Option<(redis::ConnectionInfo, String)>> =
            urls.iter().map(|u| sentinel_url(u)).collect::<Result<_, _>>()?;
        if read.iter().all(Option::is_none) {
            return Ok(None);
        }
        let read: Vec<(redis::ConnectionInfo, String)> = read
            .into_iter()
            .collect::<Option<_>>()
            .ok_or("a list of sentinels takes only redis+sentinel:// URLs")?;
        let (first, primary) = &read[0];
        if read.iter().any(|(_, p)| p != primary) {
            return Err("every sentinel URL must name the same primary".to_owned());
        }
        let server = first.redis_settings();
        let tls = matches!(first.addr(), redis::ConnectionAddr::TcpTls { .. });
        let mut b = SentinelClientBuilder::new(
            read.iter().map(|(info, _)| info.addr().clone()),
            primary,
            SentinelServerType::Master,
        )
        .map_err(|e| e.to_string())?
        .set_client_to_redis_db(server.db());
        if let Some(user) = server.username() {
            b = b.set_client_to_redis_username(user);
        }
        if let Some(password) = server.password() {
            b = b.set_client_to_redis_password(password);
        }
        if tls {
            b = b
                .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
        }
        let client = b.build().map_err(|e| e.to_string())?;
        Ok(Some(Sentinels {
            client: tokio::sync::Mutex::new(client),
        }))
    }

    /// A client of the primary the sentinels name now.
    pub async fn primary(&self) -> RedisResult<redis::Client> {
        self.client.lock().await.async_get_client().await
    }
}

/// A sentinel URL read: the sentinel's address with the servers' user, password and database,
/// and the primary's name; `None` for a URL of another scheme.
pub fn sentinel_url(url: &str) -> Result<Option<(redis::ConnectionInfo, String)>, String> {
    let (scheme, rest) = match url.split_once("://") {
        Some(("redis+sentinel", rest)) => ("redis", rest),
        Some(("rediss+sentinel", rest)) => ("rediss", rest),
        _ => return Ok(None),
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut parts = path.split('/').filter(|p| !p.is_empty());
    let primary = parts
        .next()
        .ok_or_else(|| format!("{scheme}+sentinel:// URL without the primary's name (…/<name>)"))?;
    let db = parts.next().unwrap_or("0");
    // The default port of a sentinel, where none is written.
    let authority = if authority.rsplit('@').next().is_some_and(|h| !h.contains(':')) {
        format!("{authority}:26379")
    } else {
        authority.to_owned()
    };
    let info = redis::IntoConnectionInfo::into_connection_info(format!("{scheme}://{authority}/{db}"))
        .map_err(|e| e.to_string())?;
    Ok(Some((info, primary.to_owned())))
}

/// Whether `e` says the connection made from the sentinels' answer is no use any more: closed,
/// timed out, or to a server no longer the primary.
pub fn lost(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_timeout()
        || e.is_unrecoverable_error()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_name_the_sentinel_the_primary_and_the_servers_credentials() {
        // (URL, sentinel's address, primary, db, user, password); None: not a sentinel URL.
        type Read = (
            &'static str,
            &'static str,
            i64,
            Option<&'static str>,
            Option<&'static str>,
        );
        let cases: &[(&str, Option<Read>)] = &[
            ("redis://127.0.0.1:6379/", None),
            (
                "redis+sentinel://10.0.0.1:26380/main",
                Some(("10.0.0.1:26380", "main", 0, None, None)),
            ),
            (
                "redis+sentinel://:s3cret@sentinel.internal/main/2",
                Some(("sentinel.internal:26379", "main", 2, None, Some("s3cret"))),
            ),
            (
                "rediss+sentinel://aigw:pw@10.0.0.1:26379/cache",
                Some(("10.0.0.1:26379", "cache", 0, Some("aigw"), Some("pw"))),
            ),
        ];
        for (url, want) in cases {
            let read = sentinel_url(url).expect("readable");
            let got = read.as_ref().map(|(info, primary)| {
                let host = match info.addr() {
                    redis::ConnectionAddr::Tcp(h, p) => format!("{h}:{p}"),
                    redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
                    other => other.to_string(),
                };
                let r = info.redis_settings();
                (
                    host,
                    primary.clone(),
                    r.db(),
                    r.username().map(str::to_owned),
                    r.password().map(str::to_owned),
                )
            });
            let want = want.map(|(h, p, db, u, pw)| {
                (
                    h.to_owned(),
                    p.to_owned(),
                    db,
                    u.map(str::to_owned),
                    pw.map(str::to_owned),
                )
            });
            assert_eq!(got, want, "{url}");
        }
        assert!(
            sentinel_url("redis+sentinel://127.0.0.1:26379/").is_err(),
            "no primary"
        );
    }
}
