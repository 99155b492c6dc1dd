//! Where a budget alert's webhook may be delivered (DESIGN.md §11). A webhook is set by a
//! workspace's owner or admin, and the gateway sends its requests from inside the operator's
//! network, so by default it reaches public addresses only. Refused:
//!
//! 1. the gateway's own listeners (an address this host answers on, at a listener's port),
//!    whatever the allow list says;
//! 2. unless `alert_webhook_allow` names the URL's host or a network holding the address, every
//!    address of [`reserved`]: loopback, link-local (cloud metadata at 169.254.169.254), private
//!    (RFC 1918, carrier-grade NAT, IPv6 unique local), unspecified, multicast, documentation
//!    and the other special-purpose ranges, and the IPv4-mapped, NAT64 and 6to4 forms of those.
//!
//! The address is the one the URL spells, in any of its forms (`2130706433`, `0x7f.1`,
//! `0177.0.0.1` and `[::ffff:127.0.0.1]` are 127.0.0.1 once the URL is parsed), or the ones its
//! name resolves to. It is checked when the alert is set ([`Destinations::check_url`]: a literal
//! address or a `localhost` name, no lookup) and again before each delivery
//! ([`Destinations::resolve`]): the name is resolved, every address checked, and the delivery
//! connects to those checked addresses only, so a name that resolves elsewhere a moment later
//! is never reached.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use reqwest::Url;

use crate::config::AllowedDestination;

/// What the alert history says of a refused destination (the address itself goes to the
/// gateway's log only).
pub const REFUSED: &str = "destination not allowed: loopback, link-local, private and other \
     reserved addresses are refused unless the setting alert_webhook_allow lists the host or \
     range, and this gateway's own listeners always";

/// The longest wait for a webhook's name to resolve.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a webhook's address is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// In a reserved range (named), and not allowed.
    Reserved(IpAddr, &'static str),
    /// One of this gateway's listeners.
    OwnListener(SocketAddr),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Reserved(ip, range) => write!(f, "{ip} is {range}"),
            Refused::OwnListener(l) => write!(f, "this gateway listens on {l}"),
        }
    }
}

/// Why an alert could not be sent where its webhook says.
#[derive(Debug)]
pub enum Undeliverable {
    /// An address is refused.
    Refused(Refused),
    /// The name did not resolve (in time).
    Unresolved(String),
}

/// The destinations webhooks may reach: the allow list and the listeners to stay away from.
#[derive(Clone, Debug, Default)]
pub struct Destinations {
    allow: Vec<AllowedDestination>,
    own: Vec<SocketAddr>,
}

impl Destinations {
    /// With `allow` (`alert_webhook_allow`) and this gateway's listeners, as bound.
    pub fn new(allow: Vec<AllowedDestination>, own: Vec<SocketAddr>) -> Destinations {
        Destinations { allow, own }
    }

    /// Whether `addr`, reached through a URL whose host is `host`, may be sent to; `on_this_host`
    /// says whether an address is one of this machine's (for listeners on every address).
    pub fn check(
        &self,
        host: &str,
        addr: SocketAddr,
        on_this_host: impl Fn(IpAddr) -> bool,
    ) -> Result<(), Refused> {
        let ip = addr.ip().to_canonical();
        for listener in &self.own {
            let bound = listener.ip().to_canonical();
            let reaches = bound == ip || ip.is_unspecified() || (bound.is_unspecified() && on_this_host(ip));
            if listener.port() == addr.port() && reaches {
                return Err(Refused::OwnListener(*listener));
            }
        }
        if self.allow.iter().any(|a| a.allows(host, ip)) {
            return Ok(());
        }
        match reserved(ip) {
            Some(range) => Err(Refused::Reserved(ip, range)),
            None => Ok(()),
        }
    }

    /// The check when a webhook is set: the address the URL spells, or loopback for a
    /// `localhost` name (RFC 6761); any other name is checked when it is resolved, at delivery.
    pub fn check_url(&self, url: &Url) -> Result<(), Refused> {
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return Ok(());
        };
        let ips = match literal(host) {
            Some(ip) => vec![ip],
            None if is_localhost(host) => vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()],
            None => return Ok(()),
        };
        for ip in ips {
            self.check(host, SocketAddr::new(ip, port), on_this_host)?;
        }
        Ok(())
    }

    /// The addresses a delivery to `url` may connect to: the literal one, or every one its name
    /// resolves to now, each checked; refused when any of them is.
    pub async fn resolve(&self, url: &Url) -> Result<Vec<SocketAddr>, Undeliverable> {
        let unresolved = |why: String| Undeliverable::Unresolved(why);
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return Err(unresolved("no host".into()));
        };
        let mut addrs: Vec<SocketAddr> = match literal(host) {
            Some(ip) => vec![SocketAddr::new(ip, port)],
            None => match tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host, port))).await {
                Ok(Ok(found)) => found.collect(),
                Ok(Err(e)) => return Err(unresolved(e.to_string())),
                Err(_) => return Err(unresolved("the lookup timed out".into())),
            },
        };
        addrs.sort_unstable();
        addrs.dedup();
        if addrs.is_empty() {
            return Err(unresolved("no address".into()));
        }
        for addr in &addrs {
            self.check(host, *addr, on_this_host)
                .map_err(Undeliverable::Refused)?;
        }
        Ok(addrs)
    }
}

/// The address a URL's host spells, if it is one (`[::1]` included).
fn literal(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

/// A URL's host if it is a name, not an address.
pub fn domain(host: &str) -> Option<&str> {
    literal(host).is_none().then_some(host)
}

/// `localhost` and its subdomains, which resolve to loopback (RFC 6761 §6.3).
fn is_localhost(host: &str) -> bool {
    let h = host.trim_end_matches('.').to_ascii_lowercase();
    h == "localhost" || h.ends_with(".localhost")
}

/// Whether `ip` is an address of this machine: one a socket can be bound to.
fn on_this_host(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// The special-purpose range (IANA's registries) that holds `ip`, if any: no webhook goes there
/// unless allowed.
pub fn reserved(ip: IpAddr) -> Option<&'static str> {
    match ip.to_canonical() {
        IpAddr::V4(v4) => reserved_v4(v4),
        IpAddr::V6(v6) => reserved_v6(v6),
    }
}

fn reserved_v4(ip: Ipv4Addr) -> Option<&'static str> {
    const RANGES: &[([u8; 4], u32, &str)] = &[
        ([0, 0, 0, 0], 8, "\"this network\" (0.0.0.0/8)"),
        ([10, 0, 0, 0], 8, "private (10.0.0.0/8)"),
        (
            [100, 64, 0, 0],
            10,
            "shared address space (100.64.0.0/10, carrier-grade NAT)",
        ),
        ([127, 0, 0, 0], 8, "loopback (127.0.0.0/8)"),
        (
            [169, 254, 0, 0],
            16,
            "link-local (169.254.0.0/16, cloud metadata)",
        ),
        ([172, 16, 0, 0], 12, "private (172.16.0.0/12)"),
        ([192, 0, 0, 0], 24, "IETF protocol assignments (192.0.0.0/24)"),
        ([192, 0, 2, 0], 24, "documentation (192.0.2.0/24)"),
        ([192, 88, 99, 0], 24, "6to4 relay anycast (192.88.99.0/24)"),
        ([192, 168, 0, 0], 16, "private (192.168.0.0/16)"),
        ([198, 18, 0, 0], 15, "benchmarking (198.18.0.0/15)"),
        ([198, 51, 100, 0], 24, "documentation (198.51.100.0/24)"),
        ([203, 0, 113, 0], 24, "documentation (203.0.113.0/24)"),
        ([224, 0, 0, 0], 4, "multicast (224.0.0.0/4)"),
        ([240, 0, 0, 0], 4, "reserved (240.0.0.0/4, broadcast included)"),
    ];
    let bits = u32::from(ip);
    RANGES
        .iter()
        .find(|(net, len, _)| bits & (u32::MAX << (32 - len)) == u32::from_be_bytes(*net))
        .map(|r| r.2)
}

fn reserved_v6(ip: Ipv6Addr) -> Option<&'static str> {
    const RANGES: &[(u128, u32, &str)] = &[
        (0, 128, "unspecified (::)"),
        (1, 128, "loopback (::1)"),
        (0, 96, "IPv4-compatible (::/96, deprecated)"),
        (0x0064_ff9b_0001 << 80, 48, "NAT64 local use (64:ff9b:1::/48)"),
        (0x0100 << 112, 64, "discard-only (100::/64)"),
        (0x2001 << 112, 23, "IETF protocol assignments (2001::/23)"),
        (0x2001_0db8 << 96, 32, "documentation (2001:db8::/32)"),
        (0xfc00 << 112, 7, "unique local (fc00::/7)"),
        (0xfe80 << 112, 10, "link-local (fe80::/10)"),
        (0xfec0 << 112, 10, "site-local (fec0::/10, deprecated)"),
        (0xff00 << 112, 8, "multicast (ff00::/8)"),
    ];
    let bits = u128::from(ip);
    let within = |net: u128, len: u32| bits & (u128::MAX << (128 - len)) == net;
    // Forms that carry an IPv4 address reach that address: NAT64 (RFC 6052), 6to4 (RFC 3056).
    if within(0x0064_ff9b << 96, 96) {
        return reserved_v4(Ipv4Addr::from(bits as u32))
            .map(|_| "NAT64 of a reserved IPv4 address (64:ff9b::/96)");
    }
    if within(0x2002 << 112, 16) {
        return reserved_v4(Ipv4Addr::from((bits >> 80) as u32))
            .map(|_| "6to4 of a reserved IPv4 address (2002::/16)");
    }
    RANGES
        .iter()
        .find(|(net, len, _)| within(*net, *len))
        .map(|r| r.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_ranges_are_found_in_every_spelling_of_an_address() {
        // (URL, reserved)
        let cases = [
            ("http://127.0.0.1/", true),
            ("http://127.255.255.254/", true),
            ("http://127.1/", true),
            ("http://2130706433/", true),
            ("http://0x7f000001/", true),
            ("http://0x7f.0.0.1/", true),
            ("http://0177.0.0.1/", true),
            ("http://017700000001/", true),
            ("http://[::1]/", true),
            ("http://[::ffff:127.0.0.1]/", true),
            ("http://[::ffff:7f00:1]/", true),
            ("http://[::127.0.0.1]/", true),
            ("http://0.0.0.0/", true),
            ("http://0/", true),
            ("http://[::]/", true),
            ("http://10.1.2.3/", true),
            ("http://167772161/", true),
            ("http://172.16.0.1/", true),
            ("http://172.31.255.255/", true),
            ("http://172.32.0.1/", false),
            ("http://192.168.0.1/", true),
            ("http://100.64.0.1/", true),
            ("http://100.127.255.255/", true),
            ("http://100.128.0.1/", false),
            ("http://169.254.169.254/", true),
            ("http://[::ffff:169.254.169.254]/", true),
            ("http://[fd00:ec2::254]/", true),
            ("http://[fc00::1]/", true),
            ("http://[fe80::1]/", true),
            ("http://[febf::1]/", true),
            ("http://[fec0::1]/", true),
            ("http://[ff02::1]/", true),
            ("http://224.0.0.251/", true),
            ("http://255.255.255.255/", true),
            ("http://192.0.2.1/", true),
            ("http://198.18.0.1/", true),
            ("http://[64:ff9b::a9fe:a9fe]/", true),
            ("http://[64:ff9b::808:808]/", false),
            ("http://[2002:a9fe:a9fe::1]/", true),
            ("http://[2002:808:808::1]/", false),
            ("http://[2001::1]/", true),
            ("http://[2001:db8::1]/", true),
            ("http://8.8.8.8/", false),
            ("http://1.1.1.1/", false),
            ("http://[2606:4700:4700::1111]/", false),
            ("http://[::ffff:8.8.8.8]/", false),
        ];
        for (url, want) in cases {
            let parsed = Url::parse(url).unwrap();
            let ip = literal(parsed.host_str().unwrap()).unwrap_or_else(|| panic!("{url}: not an address"));
            assert_eq!(reserved(ip).is_some(), want, "{url} ({ip}): {:?}", reserved(ip));
        }
    }

    #[test]
    fn the_allow_list_opens_hosts_and_ranges_but_never_the_own_listeners() {
        let allow = |l: &[&str]| l.iter().map(|e| e.parse().unwrap()).collect::<Vec<_>>();
        let own: Vec<SocketAddr> = vec!["127.0.0.1:4000".parse().unwrap(), "0.0.0.0:4001".parse().unwrap()];
        // This machine's addresses, for the listener on every address: loopback and 10.0.0.5.
        let here = |ip: IpAddr| ip.is_loopback() || ip == IpAddr::from([10, 0, 0, 5]);
        // (allowed, host, address, outcome: Ok, "reserved" or "own")
        let cases: &[(&[&str], &str, &str, &str)] = &[
            (&[], "127.0.0.1", "127.0.0.1:9000", "reserved"),
            (&["127.0.0.1"], "127.0.0.1", "127.0.0.1:9000", "ok"),
            (&["127.0.0.1"], "127.0.0.1", "127.0.0.2:9000", "reserved"),
            (&["127.0.0.0/8"], "127.0.0.1", "127.0.0.2:9000", "ok"),
            (
                &["127.0.0.1"],
                "[::ffff:127.0.0.1]",
                "[::ffff:127.0.0.1]:9000",
                "ok",
            ),
            (&["127.0.0.1"], "[::1]", "[::1]:9000", "reserved"),
            (&["hooks.internal"], "hooks.internal", "10.0.0.7:443", "ok"),
            (&["hooks.internal"], "hooks.internal.", "10.0.0.7:443", "ok"),
            (&["hooks.internal"], "other.internal", "10.0.0.7:443", "reserved"),
            (&[], "hooks.example", "93.184.215.14:443", "ok"),
            (&["127.0.0.0/8"], "127.0.0.1", "127.0.0.1:4000", "own"),
            (&["127.0.0.0/8"], "127.0.0.1", "127.0.0.2:4000", "ok"),
            (&["0.0.0.0/0"], "0.0.0.0", "0.0.0.0:4000", "own"),
            (&["10.0.0.0/8"], "10.0.0.5", "10.0.0.5:4001", "own"),
            (&["10.0.0.0/8"], "10.0.0.6", "10.0.0.6:4001", "ok"),
            (&["127.0.0.0/8"], "127.0.0.9", "127.0.0.9:4001", "own"),
            (&["::/0"], "[::1]", "[::1]:4001", "own"),
            (&["localhost"], "localhost", "127.0.0.1:4000", "own"),
            (&[], "gw.example", "10.0.0.5:4001", "own"),
        ];
        for (allowed, host, addr, want) in cases {
            let d = Destinations::new(allow(allowed), own.clone());
            let got = match d.check(host, addr.parse().unwrap(), here) {
                Ok(()) => "ok",
                Err(Refused::Reserved(..)) => "reserved",
                Err(Refused::OwnListener(_)) => "own",
            };
            assert_eq!(got, *want, "{allowed:?} {host} {addr}");
        }
    }

    #[test]
    fn a_webhook_is_checked_as_set_by_its_literal_address_or_localhost_name() {
        let own: Vec<SocketAddr> = vec!["127.0.0.1:4000".parse().unwrap()];
        let allow = |l: &[&str]| l.iter().map(|e| e.parse().unwrap()).collect::<Vec<_>>();
        // (allowed, URL, accepted)
        let cases: &[(&[&str], &str, bool)] = &[
            (&[], "https://hooks.example/aigw", true),
            (&[], "http://8.8.8.8:8080/x", true),
            (&[], "http://localhost:9/", false),
            (&[], "http://LOCALHOST./", false),
            (&[], "http://a.b.localhost/", false),
            (&[], "http://2130706433/", false),
            (&["localhost"], "http://localhost:9/", true),
            (&["127.0.0.1"], "http://localhost:9/", false),
            (&["127.0.0.1", "::1"], "http://localhost:9/", true),
            (&["127.0.0.1"], "http://127.0.0.1:4000/hook", false),
            (&["localhost"], "http://localhost:4000/", false),
            (&["127.0.0.1"], "http://127.0.0.1/", true),
            (&[], "http://10.0.0.1/", false),
            (&["10.0.0.0/8"], "http://10.0.0.1/", true),
        ];
        for (allowed, url, ok) in cases {
            let d = Destinations::new(allow(allowed), own.clone());
            let parsed = Url::parse(url).unwrap();
            assert_eq!(d.check_url(&parsed).is_ok(), *ok, "{allowed:?} {url}");
        }
    }

    #[tokio::test]
    async fn a_delivery_resolves_and_checks_every_address_without_connecting() {
        let d = Destinations::new(Vec::new(), Vec::new());
        // localhost resolves from the hosts file, to loopback only: refused.
        let url = Url::parse("http://localhost:9/hook").unwrap();
        assert!(matches!(
            d.resolve(&url).await,
            Err(Undeliverable::Refused(Refused::Reserved(..)))
        ));
        let allowed = Destinations::new(vec!["localhost".parse().unwrap()], Vec::new());
        let addrs = allowed.resolve(&url).await.unwrap();
        assert!(!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback() && a.port() == 9));
        let literal = Url::parse("http://0x7f.1:8080/").unwrap();
        assert!(matches!(
            d.resolve(&literal).await,
            Err(Undeliverable::Refused(Refused::Reserved(ip, _))) if ip == IpAddr::from([127, 0, 0, 1])
        ));
        let public = Url::parse("https://8.8.8.8/").unwrap();
        assert_eq!(
            d.resolve(&public).await.unwrap(),
            vec!["8.8.8.8:443".parse::<SocketAddr>().unwrap()],
            "resolved, not connected to"
        );
    }
}
