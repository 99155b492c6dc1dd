//! The type of `alert_webhook_allow`: the hosts and networks a budget alert's webhook may reach
//! although they are on this machine, a private network or another reserved range.

use std::fmt;
use std::str::FromStr;

use super::{ConfigError, SettingValue};

/// One entry of `alert_webhook_allow`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllowedDestination {
    /// A host name as a webhook URL names it (lower case, without a trailing dot): whatever it
    /// resolves to.
    Host(String),
    /// Every address of a network (a single address is a /32 or a /128).
    Network(ipnet::IpNet),
}

impl AllowedDestination {
    /// Whether a webhook whose URL names `host` (lower case) and reaches `ip` is allowed by
    /// this entry.
    pub fn allows(&self, host: &str, ip: std::net::IpAddr) -> bool {
        match self {
            AllowedDestination::Host(h) => host.trim_end_matches('.') == h,
            AllowedDestination::Network(net) => net.contains(&ip),
        }
    }
}

impl FromStr for AllowedDestination {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let v = s.trim();
        let bare = v.trim_start_matches('[').trim_end_matches(']');
        if let Ok(net) = bare.parse::<ipnet::IpNet>() {
            return Ok(AllowedDestination::Network(net.trunc()));
        }
        if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
            return Ok(AllowedDestination::Network(ipnet::IpNet::from(ip.to_canonical())));
        }
        let host = v.trim_end_matches('.').to_ascii_lowercase();
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        // A last label of digits is an address in the URL's eyes (`http://10.0.0/` is 10.0.0.0).
        let numeric = host
            .rsplit('.')
            .next()
            .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()) || l.starts_with("0x"));
        if host.len() <= 253 && host.split('.').all(label_ok) && !numeric {
            Ok(AllowedDestination::Host(host))
        } else {
            Err(format!(
                "{v:?} is neither a host name nor a network (expected e.g. hooks.internal, \
                 10.0.0.0/8 or 192.168.1.5)"
            ))
        }
    }
}

impl fmt::Display for AllowedDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllowedDestination::Host(h) => f.write_str(h),
            AllowedDestination::Network(n) => write!(f, "{n}"),
        }
    }
}

/// A TOML list of strings; comma-separated in the variable.
impl SettingValue for Vec<AllowedDestination> {
    type File = Vec<String>;
    fn from_file(name: &str, v: Vec<String>) -> Result<Self, ConfigError> {
        parse(name, v.iter().map(String::as_str))
    }
    fn from_env(name: &str, v: &str) -> Result<Self, ConfigError> {
        parse(name, v.split(','))
    }
    fn shown(&self) -> Option<String> {
        (!self.is_empty()).then(|| self.iter().map(ToString::to_string).collect::<Vec<_>>().join(","))
    }
}

fn parse<'a>(
    name: &str,
    items: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<AllowedDestination>, ConfigError> {
    items
        .into_iter()
        .filter(|v| !v.trim().is_empty())
        .map(|v| {
            v.parse()
                .map_err(|why| ConfigError(format!("bad setting {name}: {why}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_host_names_or_networks() {
        let net = |s: &str| Ok(AllowedDestination::Network(s.parse().unwrap()));
        let host = |s: &str| Ok(AllowedDestination::Host(s.into()));
        let cases: &[(&str, Result<AllowedDestination, ()>)] = &[
            ("127.0.0.1", net("127.0.0.1/32")),
            (" 10.1.2.3/8 ", net("10.0.0.0/8")),
            ("::1", net("::1/128")),
            ("[::1]", net("::1/128")),
            ("::ffff:10.0.0.1", net("10.0.0.1/32")),
            ("fd00::/8", net("fd00::/8")),
            ("Hooks.Internal.", host("hooks.internal")),
            ("localhost", host("localhost")),
            ("my_host-1.corp", host("my_host-1.corp")),
            ("http://hooks.internal", Err(())),
            ("hooks.internal:8080", Err(())),
            ("a..b", Err(())),
            ("10.0.0.0/33", Err(())),
            ("*.internal", Err(())),
            ("10.0.0", Err(())),
            ("0x7f.1", Err(())),
        ];
        for (text, want) in cases {
            let got: Result<AllowedDestination, String> = text.parse();
            assert_eq!(got.clone().map_err(|_| ()), *want, "{text}: {got:?}");
        }
        let allow: Vec<AllowedDestination> =
            <Vec<AllowedDestination> as SettingValue>::from_env("X", "127.0.0.1, hooks.internal,").unwrap();
        assert_eq!(allow.len(), 2);
        assert_eq!(
            SettingValue::shown(&allow).unwrap(),
            "127.0.0.1/32,hooks.internal"
        );
        let err = <Vec<AllowedDestination> as SettingValue>::from_env("AIGW_X", "a b").unwrap_err();
        assert!(err.0.contains("AIGW_X"), "{}", err.0);
    }
}
