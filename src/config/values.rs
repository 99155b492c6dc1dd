//! How each type of setting is read from the TOML file and from its variable.

use std::net::SocketAddr;
use std::path::PathBuf;

use chrono_tz::Tz;

use super::{
    ConfigError, Locale, LogFormat, OutageCounters, Secret, parse_listen, parse_networks, parse_tz,
    parse_value,
};

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

/// Types that the file holds as themselves and a variable spells as their `FromStr` form.
macro_rules! plain_setting_values {
    ($($t:ty),*) => {$(
        impl SettingValue for $t {
            type File = $t;
            fn from_file(_: &str, v: $t) -> Result<Self, ConfigError> {
                Ok(v)
            }
            fn from_env(name: &str, v: &str) -> Result<Self, ConfigError> {
                parse_value(name, v)
            }
            fn shown(&self) -> Option<String> {
                Some(self.to_string())
            }
        }
    )*};
}
plain_setting_values!(u32, u64, usize, f64, String, Locale, LogFormat, OutageCounters);

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
