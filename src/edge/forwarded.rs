//! The client's address behind reverse proxies. A connection from a trusted proxy
//! (`trusted_proxies`) brings the address it served in `X-Forwarded-For`; each proxy on the way
//! appends the address it received the request from, so the header reads left to right from the
//! client towards the gateway, and anything left of the first proxy the operator runs is whatever
//! the client chose to send. The client is therefore the rightmost address not in a trusted
//! network, walking from the connection's end; an address from an untrusted connection is the
//! connection's own, whatever the header says.

use std::net::IpAddr;

use axum::http::HeaderMap;
use ipnet::IpNet;

/// The header proxies append the address they served to.
const X_FORWARDED_FOR: &str = "x-forwarded-for";

/// The client's address: `peer` (the connection's), or, when `peer` is a trusted proxy, the
/// rightmost address of `X-Forwarded-For` outside `trusted`. With every address trusted, the
/// leftmost; an entry that is not an address stops the walk at the proxy that passed it on.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let peer = peer.to_canonical();
    if trusted.is_empty() || !is_trusted(peer, trusted) {
        return peer;
    }
    let mut client = peer;
    // Several header lines are one list, in order.
    let entries = headers
        .get_all(X_FORWARDED_FOR)
        .iter()
        .rev()
        .flat_map(|v| v.to_str().unwrap_or("").rsplit(','));
    for entry in entries {
        let Some(addr) = parse_entry(entry.trim()) else {
            return client;
        };
        client = addr;
        if !is_trusted(addr, trusted) {
            return addr;
        }
    }
    client
}

fn is_trusted(addr: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|net| net.contains(&addr))
}

/// An address as proxies write it: `203.0.113.7`, `2001:db8::1`, and with a port
/// `203.0.113.7:5123` or `[2001:db8::1]:5123`.
fn parse_entry(entry: &str) -> Option<IpAddr> {
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(socket) = entry.parse::<std::net::SocketAddr>() {
        return Some(socket.ip().to_canonical());
    }
    None
}

/// An address as its `Display` writes it (`203.0.113.7`, `2001:db8::1`); an IPv4 one, the
/// common case on every request, without `fmt` (a tenth of its instructions).
pub fn ip_text(ip: IpAddr) -> String {
    let IpAddr::V4(v4) = ip else {
        return ip.to_string();
    };
    let mut out = String::with_capacity(15);
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(itoa::Buffer::new().format(octet));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_text_is_display() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "203.0.113.7",
            "255.255.255.255",
            "10.20.0.100",
            "::1",
            "2001:db8::1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_text(ip), ip.to_string());
        }
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn the_client_is_the_rightmost_untrusted_address() {
        // (connection, X-Forwarded-For lines, trusted networks, client)
        type Case<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a str);
        let cases: &[Case] = &[
            // No trusted proxy: the header is ignored.
            ("10.0.0.5", &["203.0.113.7"], &[], "10.0.0.5"),
            // The connection is not a trusted proxy: the header is anyone's.
            ("198.51.100.1", &["203.0.113.7"], &["10.0.0.0/8"], "198.51.100.1"),
            // One proxy.
            ("10.0.0.5", &["203.0.113.7"], &["10.0.0.0/8"], "203.0.113.7"),
            // A client that sends its own header: the proxy appends the real address.
            (
                "10.0.0.5",
                &["1.2.3.4, 203.0.113.7"],
                &["10.0.0.0/8"],
                "203.0.113.7",
            ),
            // Two proxies, both trusted.
            (
                "10.0.0.5",
                &["1.2.3.4, 203.0.113.7, 10.0.0.9"],
                &["10.0.0.0/8"],
                "203.0.113.7",
            ),
            // Several header lines are one list.
            (
                "10.0.0.5",
                &["1.2.3.4", "203.0.113.7, 10.0.0.9"],
                &["10.0.0.0/8"],
                "203.0.113.7",
            ),
            // Every hop trusted: the leftmost.
            ("10.0.0.5", &["10.1.1.1, 10.0.0.9"], &["10.0.0.0/8"], "10.1.1.1"),
            // A trusted connection without the header.
            ("10.0.0.5", &[], &["10.0.0.0/8"], "10.0.0.5"),
            // Ports and IPv6 as proxies write them.
            ("10.0.0.5", &["203.0.113.7:5123"], &["10.0.0.0/8"], "203.0.113.7"),
            ("10.0.0.5", &["[2001:db8::1]:443"], &["10.0.0.0/8"], "2001:db8::1"),
            ("::1", &["2001:db8::7"], &["::1/128"], "2001:db8::7"),
            // A connection over IPv6 from an IPv4 proxy (a dual-stack listener).
            (
                "::ffff:10.0.0.5",
                &["203.0.113.7"],
                &["10.0.0.0/8"],
                "203.0.113.7",
            ),
            // Garbage stops the walk at the proxy that passed it on.
            ("10.0.0.5", &["203.0.113.7, unknown"], &["10.0.0.0/8"], "10.0.0.5"),
            (
                "10.0.0.5",
                &["nonsense, 203.0.113.7, 10.0.0.9"],
                &["10.0.0.0/8"],
                "203.0.113.7",
            ),
            (
                "10.0.0.5",
                &["1.2.3.4, junk, 10.0.0.9"],
                &["10.0.0.0/8"],
                "10.0.0.9",
            ),
        ];
        for (peer, lines, trusted, want) in cases {
            let mut h = HeaderMap::new();
            for l in *lines {
                h.append(X_FORWARDED_FOR, l.parse().unwrap());
            }
            let got = client_ip(peer.parse().unwrap(), &h, &nets(trusted));
            assert_eq!(
                got,
                want.parse::<IpAddr>().unwrap(),
                "{peer} {lines:?} {trusted:?}"
            );
        }
    }
}
