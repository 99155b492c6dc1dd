//! The types of the single sign-on settings: which identity-provider groups give access to which
//! workspace, with which role and department.

use serde::Deserialize;

use super::{ConfigError, SettingValue};

/// One identity-provider group and what membership in it gives.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SsoGroup {
    /// The group, as the groups claim names it.
    pub group: String,
    /// The workspace its members sign in to (by name).
    pub workspace: String,
    /// `owner`, `admin` or `member`.
    pub role: String,
    /// The department new members join (by name), if any.
    #[serde(default)]
    pub department: Option<String>,
}

impl SsoGroup {
    fn checked(self, name: &str) -> Result<SsoGroup, ConfigError> {
        let bad = |why: String| ConfigError(format!("bad setting {name}: {why}"));
        if self.group.trim().is_empty() || self.workspace.trim().is_empty() {
            return Err(bad("a group mapping needs a group and a workspace".into()));
        }
        if !matches!(self.role.as_str(), "owner" | "admin" | "member") {
            return Err(bad(format!(
                "group {:?}: role {:?} is not owner, admin or member",
                self.group, self.role
            )));
        }
        Ok(self)
    }
}

/// The file holds a list of tables (`[[oidc_groups]]`); the variable holds
/// `group=workspace:role[:department]` items separated by commas.
impl SettingValue for Vec<SsoGroup> {
    type File = Vec<SsoGroup>;
    fn from_file(name: &str, v: Vec<SsoGroup>) -> Result<Self, ConfigError> {
        v.into_iter().map(|g| g.checked(name)).collect()
    }
    fn from_env(name: &str, v: &str) -> Result<Self, ConfigError> {
        v.split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| {
                let form = || {
                    ConfigError(format!(
                        "bad setting {name}: {item:?} is not group=workspace:role[:department]"
                    ))
                };
                let (group, rest) = item.split_once('=').ok_or_else(form)?;
                let mut parts = rest.split(':');
                let (Some(workspace), Some(role)) = (parts.next(), parts.next()) else {
                    return Err(form());
                };
                let department = parts.next().map(str::to_owned);
                if parts.next().is_some() {
                    return Err(form());
                }
                SsoGroup {
                    group: group.trim().to_owned(),
                    workspace: workspace.trim().to_owned(),
                    role: role.trim().to_owned(),
                    department,
                }
                .checked(name)
            })
            .collect()
    }
    fn shown(&self) -> Option<String> {
        None
    }
}

/// Names: a TOML list, comma-separated in the variable.
impl SettingValue for Vec<String> {
    type File = Vec<String>;
    fn from_file(_: &str, v: Vec<String>) -> Result<Self, ConfigError> {
        Ok(v)
    }
    fn from_env(_: &str, v: &str) -> Result<Self, ConfigError> {
        Ok(v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect())
    }
    fn shown(&self) -> Option<String> {
        (!self.is_empty()).then(|| self.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_mappings_from_the_variable() {
        let v = Vec::<SsoGroup>::from_env("X", "aigw-admins=acme:admin, eng=acme:member:search").unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].role, "admin");
        assert_eq!(v[0].department, None);
        assert_eq!(v[1].department.as_deref(), Some("search"));
        for bad in [
            "nogroup",
            "g=acme",
            "g=acme:boss",
            "g=acme:member:d:extra",
            "=acme:member",
        ] {
            assert!(Vec::<SsoGroup>::from_env("X", bad).is_err(), "{bad}");
        }
    }
}
