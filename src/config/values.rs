//! How each type of setting is read from the TOML file and from its variable.

use std::net::SocketAddr;
use std::path::PathBuf;

use chrono_tz::Tz;

use std::fmt;
use std::str::FromStr;

use super::{ConfigError, Locale, LogFormat, OutageCounters, Secret, parse_tz};

/// How a setting's type is read from the TOML file and from its variable, and how its default
/// is shown in the docs.
pub(super) trait SettingValue: Sized {
    /// What the TOML file holds for it (the file's parser checks that type, with the line).
    type File: serde::de::DeserializeOwned;
    /// The file's value; `name` is the file and key, for messages.
    fn from_file(name: &str, v: Self::File) -> Result<Self, ConfigError>;
    /// The variable's value; `name` is the variable, for messages.
    fn from_env(name: &str, v: &str) -> Result<Self, ConfigError>;
    /// The value as the settings tables show a default; `None` when it is unset or derived.
    fn shown(&self) -> Option<String>;
}

/// Types that the file holds as themselves and a variable spells as their `FromStr` form: the
/// numbers, with the kind of number a bad value is told it should be, and the choices of words,
/// whose own parse error lists the choices.
macro_rules! plain_setting_values {
    ($($t:ty => $parse:expr),* $(,)?) => {$(
        impl SettingValue for $t {
            type File = $t;
            fn from_file(_: &str, v: $t) -> Result<Self, ConfigError> {
                Ok(v)
            }
            fn from_env(name: &str, v: &str) -> Result<Self, ConfigError> {
                let parse: fn(&str, &str) -> Result<$t, ConfigError> = $parse;
                parse(name, v)
            }
            fn shown(&self) -> Option<String> {
                Some(self.to_string())
            }
        }
    )*};
}
plain_setting_values!(
    u32 => |n, v| parse_number(n, v, "a whole number from 0 to 4294967295"),
    u64 => |n, v| parse_number(n, v, "a whole number from 0 to 18446744073709551615"),
    usize => |n, v| parse_number(n, v, "a whole number"),
    f64 => |n, v| parse_number(n, v, "a number such as 0.5"),
    String => parse_value,
    Locale => parse_value,
    LogFormat => parse_value,
    OutageCounters => parse_value,
);

impl SettingValue for Secret {
    type File = Secret;
    fn from_file(_: &str, v: Secret) -> Result<Self, ConfigError> {
        Ok(v)
    }
    fn from_env(_: &str, v: &str) -> Result<Self, ConfigError> {
        Ok(Secret::new(v))
    }
    fn shown(&self) -> Option<String> {
        None
    }
}

impl SettingValue for PathBuf {
    type File = PathBuf;
    fn from_file(_: &str, v: PathBuf) -> Result<Self, ConfigError> {
        Ok(v)
    }
    fn from_env(_: &str, v: &str) -> Result<Self, ConfigError> {
        Ok(PathBuf::from(v))
    }
    fn shown(&self) -> Option<String> {
        (!self.as_os_str().is_empty()).then(|| self.display().to_string())
    }
}

impl SettingValue for SocketAddr {
    type File = String;
    fn from_file(name: &str, v: String) -> Result<Self, ConfigError> {
        parse_listen(name, &v)
    }
    fn from_env(name: &str, v: &str) -> Result<Self, ConfigError> {
        parse_listen(name, v)
    }
    fn shown(&self) -> Option<String> {
        Some(self.to_string())
    }
}

impl SettingValue for Tz {
    type File = String;
    fn from_file(name: &str, v: String) -> Result<Self, ConfigError> {
        parse_tz(name, &v)
    }
    fn from_env(name: &str, v: &str) -> Result<Self, ConfigError> {
        parse_tz(name, v)
    }
    fn shown(&self) -> Option<String> {
        Some(self.name().to_owned())
    }
}

/// Networks: a TOML list, comma-separated in the variable.
impl SettingValue for Vec<ipnet::IpNet> {
    type File = Vec<String>;
    fn from_file(name: &str, v: Vec<String>) -> Result<Self, ConfigError> {
        parse_networks(name, v.iter().map(String::as_str))
    }
    fn from_env(name: &str, v: &str) -> Result<Self, ConfigError> {
        parse_networks(name, v.split(','))
    }
    fn shown(&self) -> Option<String> {
        (!self.is_empty()).then(|| format!("{self:?}"))
    }
}

impl<T: SettingValue> SettingValue for Option<T> {
    type File = T::File;
    fn from_file(name: &str, v: T::File) -> Result<Self, ConfigError> {
        T::from_file(name, v).map(Some)
    }
    fn from_env(name: &str, v: &str) -> Result<Self, ConfigError> {
        T::from_env(name, v).map(Some)
    }
    fn shown(&self) -> Option<String> {
        self.as_ref().and_then(T::shown)
    }
}

/// A value of a type whose own parse error names the expected values (a choice of words).
fn parse_value<T: FromStr>(name: &str, v: &str) -> Result<T, ConfigError>
where
    T::Err: fmt::Display,
{
    v.parse()
        .map_err(|e| ConfigError(format!("bad setting {name}: {e}")))
}

/// A number: the message says what kind of number is expected, not the parser's words.
fn parse_number<T: FromStr>(name: &str, v: &str, expected: &str) -> Result<T, ConfigError> {
    v.trim()
        .parse()
        .map_err(|_| ConfigError(format!("bad setting {name}: {v:?} is not {expected}")))
}

/// The listen address is a socket address; a bare port (`4001`) is the common slip.
fn parse_listen(name: &str, v: &str) -> Result<SocketAddr, ConfigError> {
    v.parse().map_err(|e| {
        ConfigError(format!(
            "bad setting {name}: {v:?}: {e} (expected HOST:PORT, e.g. 127.0.0.1:4000 or 0.0.0.0:{})",
            if v.bytes().all(|b| b.is_ascii_digit()) && !v.is_empty() {
                v
            } else {
                "4000"
            }
        ))
    })
}

/// Networks from CIDRs (`10.0.0.0/8`, `2001:db8::/32`) or single addresses (`192.168.1.5`),
/// blanks between items ignored.
fn parse_networks<'a>(
    name: &str,
    items: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<ipnet::IpNet>, ConfigError> {
    items
        .into_iter()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.parse::<ipnet::IpNet>()
                .or_else(|_| v.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map(|net| net.trunc())
                .map_err(|_| {
                    ConfigError(format!(
                        "bad setting {name}: {v:?} is not a network (expected CIDRs such as \
                         10.0.0.0/8 or single addresses such as 192.168.1.5, comma-separated)"
                    ))
                })
        })
        .collect()
}

/// `redis_url`: a Redis URL the client understands, plain or over TLS, a cluster's seed nodes'
/// URLs separated by commas, or the sentinels of a primary (`redis+sentinel://`).
pub(super) fn redis_url_form(v: &Option<super::Secret>) -> Result<(), String> {
    let Some(u) = v else { return Ok(()) };
    let seeds: Vec<&str> = u.expose().split(',').map(str::trim).collect();
    let direct = |s: &&str| s.starts_with("redis://") || s.starts_with("rediss://");
    let sentinel = |s: &&str| s.starts_with("redis+sentinel://") || s.starts_with("rediss+sentinel://");
    if !(seeds.iter().all(direct) || seeds.iter().all(sentinel)) {
        return Err(
            "must start with redis:// or rediss:// (a cluster's seed nodes: such URLs separated \
             by commas), or redis+sentinel:// or rediss+sentinel:// naming the primary \
             (redis+sentinel://host:26379/<primary>, several sentinels separated by commas)"
                .into(),
        );
    }
    Ok(())
}

/// `redis_timeout_ms`: tens of milliseconds is the intent; up to 10 s is allowed.
pub(super) fn redis_timeout(v: &u64) -> Result<(), String> {
    if (1..=10_000).contains(v) {
        Ok(())
    } else {
        Err("must be 1..=10000".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_url_takes_plain_and_tls_urls_seed_lists_and_sentinels_only() {
        let cases = [
            (None, true),
            (Some("redis://127.0.0.1:6379/0"), true),
            (Some("redis://:secret@cache.internal:6380/2"), true),
            (Some("rediss://cache.example:6380/"), true),
            (Some("redis://h1:7000,redis://h2:7001"), true),
            (Some("rediss://h1:7000, rediss://h2:7001/"), true),
            (Some("redis://h1:7000,h2:7001"), false),
            (Some("redis://h1:7000,"), false),
            (Some("http://127.0.0.1:6379"), false),
            (Some("127.0.0.1:6379"), false),
            (Some("redis+sentinel://10.0.0.1:26379/main"), true),
            (Some("redis+sentinel://s1/main, redis+sentinel://s2/main"), true),
            (Some("rediss+sentinel://:pw@s1:26379/main/2"), true),
            (Some("redis+sentinel://s1/main,redis://h2:7001"), false),
        ];
        for (url, ok) in cases {
            let v = url.map(super::super::Secret::new);
            assert_eq!(redis_url_form(&v).is_ok(), ok, "{url:?}");
        }
    }
}
