//! The resources file's shape (the serde types, unknown fields refused) and the `${VAR}`
//! expansion of its strings.

use serde::Deserialize;

use super::{Ctx, ResourcesError};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResourcesFile {
    #[serde(default)]
    pub(super) workspace: Vec<WorkspaceSpec>,
    #[serde(default)]
    pub(super) department: Vec<DepartmentSpec>,
    #[serde(default)]
    pub(super) member: Vec<MemberSpec>,
    #[serde(default)]
    pub(super) api_key: Vec<ApiKeySpec>,
    #[serde(default)]
    pub(super) upstream: Vec<UpstreamSpec>,
    #[serde(default)]
    pub(super) model: Vec<ModelSpec>,
    #[serde(default)]
    pub(super) policy: Vec<PolicySpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WorkspaceSpec {
    pub(super) name: String,
    pub(super) timezone: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DepartmentSpec {
    pub(super) workspace: String,
    pub(super) name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MemberSpec {
    pub(super) workspace: String,
    pub(super) department: Option<String>,
    pub(super) email: String,
    pub(super) role: String,
    pub(super) password: Option<String>,
    /// The public models the member's keys may call (names or trailing-`*` patterns); every
    /// model when absent.
    pub(super) allowed_models: Option<Vec<String>>,
    /// The most requests the member's keys together may have in flight on one gateway.
    pub(super) max_in_flight: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ApiKeySpec {
    pub(super) member: String,
    pub(super) name: String,
    pub(super) key: Option<String>,
    /// The public models the key may call (names or trailing-`*` patterns); every model when
    /// absent.
    pub(super) allowed_models: Option<Vec<String>>,
    /// The most requests the key may have in flight on one gateway.
    pub(super) max_in_flight: Option<i64>,
    /// When the key stops working (RFC 3339 with its offset); never when absent.
    pub(super) expires_at: Option<String>,
    /// The tags the key may send (`key=value` or `key=*`); every tag when absent.
    pub(super) allowed_tags: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum ServedModelSpec {
    Same(String),
    Mapped {
        /// The public name.
        name: String,
        /// The upstream's name.
        upstream: String,
    },
}

impl ServedModelSpec {
    /// The public name and the upstream's name.
    pub(super) fn pair(&self) -> (&str, &str) {
        match self {
            ServedModelSpec::Same(n) => (n, n),
            ServedModelSpec::Mapped { name, upstream } => (name, upstream),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitsSpec {
    pub(super) requests_per_minute: Option<i64>,
    pub(super) tokens_per_minute: Option<i64>,
    pub(super) requests_per_day: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UpstreamSpec {
    pub(super) workspace: String,
    pub(super) name: String,
    pub(super) provider: String,
    pub(super) base_url: Option<String>,
    /// Azure's `api-version`, stored as the base URL's `?api-version=` (`provider/azure.rs`).
    pub(super) api_version: Option<String>,
    /// Required unless the provider is `bedrock`, whose keys are the four fields below.
    #[serde(default)]
    pub(super) api_key: String,
    /// `bedrock`: the AWS region (`resources/bedrock.rs`).
    pub(super) region: Option<String>,
    /// `bedrock`: the access key id.
    pub(super) access_key_id: Option<String>,
    /// `bedrock`: the secret access key, sealed with the rest.
    pub(super) secret_access_key: Option<String>,
    /// `bedrock`: the session token of temporary credentials, sealed with the rest.
    pub(super) session_token: Option<String>,
    #[serde(default)]
    pub(super) models: Vec<ServedModelSpec>,
    #[serde(default)]
    pub(super) priority: i64,
    #[serde(default = "one")]
    pub(super) weight: i64,
    #[serde(default = "default_max_in_flight")]
    pub(super) max_in_flight: i64,
    #[serde(default)]
    pub(super) limits: LimitsSpec,
    pub(super) quota_group: Option<String>,
    #[serde(default = "yes")]
    pub(super) enabled: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PriceSpec {
    #[serde(default)]
    pub(super) prompt: f64,
    #[serde(default)]
    pub(super) completion: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ModelSpec {
    pub(super) workspace: String,
    pub(super) name: String,
    #[serde(default)]
    pub(super) fallbacks: Vec<String>,
    pub(super) price: Option<PriceSpec>,
    /// The model's own output limit (`max_tokens` sent to Anthropic when a chat request names
    /// none); none: the documented default.
    pub(super) max_output_tokens: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicySpec {
    pub(super) workspace: String,
    pub(super) subject: String,
    pub(super) target: String,
    /// With `target = "*"`: each subject inside this department only.
    pub(super) department: Option<String>,
    pub(super) metric: String,
    pub(super) window: String,
    pub(super) limit: f64,
    #[serde(default = "enforce")]
    pub(super) mode: String,
    /// Budget alerts (DESIGN.md §10); none: the policy has none.
    pub(super) alerts: Option<AlertsSpec>,
}

/// `alerts = { at = [80, 100], webhook = "https://…", secret = "${HOOK_SECRET}" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AlertsSpec {
    pub(super) at: Vec<i64>,
    pub(super) webhook: String,
    pub(super) secret: Option<String>,
}

fn one() -> i64 {
    1
}
fn default_max_in_flight() -> i64 {
    64
}
fn yes() -> bool {
    true
}
fn enforce() -> String {
    "enforce".to_owned()
}

/// `${VAR}` expansion: reads the environment; a missing variable is an error unless written
/// `${VAR:-default}`; `$${` escapes.
fn expand(value: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos..];
        if let Some(escaped) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = escaped;
        } else if let Some(body) = after.strip_prefix("${") {
            let end = body
                .find('}')
                .ok_or_else(|| format!("unclosed ${{ in {value:?}"))?;
            // `${NAME:-default}`: the default stands in when NAME is unset or empty, as in a shell.
            let (name, default) = match body[..end].split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (&body[..end], None),
            };
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(format!("bad variable name {name:?}"));
            }
            match (env(name), default) {
                (Some(v), Some(d)) if v.is_empty() => out.push_str(d),
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => return Err(format!("environment variable {name} is not set")),
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

pub(super) fn expand_file(
    ctx: &Ctx<'_>,
    f: &mut ResourcesFile,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ResourcesError> {
    fn all<'s>(
        ctx: &Ctx<'_>,
        table: &str,
        i: usize,
        label: &str,
        fields: impl IntoIterator<Item = &'s mut String>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), ResourcesError> {
        for field in fields {
            *field = expand(field, env).map_err(|m| ctx.entry(table, i, label, m))?;
        }
        Ok(())
    }
    let mut problems = Vec::new();
    for (i, w) in f.workspace.iter_mut().enumerate() {
        let label = w.name.clone();
        problems.extend(
            all(
                ctx,
                "workspace",
                i,
                &label,
                [&mut w.name].into_iter().chain(w.timezone.as_mut()),
                env,
            )
            .err(),
        );
    }
    for (i, d) in f.department.iter_mut().enumerate() {
        let label = d.name.clone();
        problems.extend(all(ctx, "department", i, &label, [&mut d.workspace, &mut d.name], env).err());
    }
    for (i, m) in f.member.iter_mut().enumerate() {
        let label = m.email.clone();
        let fields = [&mut m.workspace, &mut m.email, &mut m.role]
            .into_iter()
            .chain(m.department.as_mut())
            .chain(m.password.as_mut());
        problems.extend(all(ctx, "member", i, &label, fields, env).err());
    }
    for (i, k) in f.api_key.iter_mut().enumerate() {
        let label = format!("{}/{}", k.member, k.name);
        problems.extend(
            all(
                ctx,
                "api_key",
                i,
                &label,
                [&mut k.member, &mut k.name].into_iter().chain(k.key.as_mut()),
                env,
            )
            .err(),
        );
    }
    for (i, u) in f.upstream.iter_mut().enumerate() {
        let label = u.name.clone();
        let fields = [&mut u.workspace, &mut u.name, &mut u.provider, &mut u.api_key]
            .into_iter()
            .chain(u.base_url.as_mut())
            .chain(u.quota_group.as_mut())
            .chain(u.region.as_mut())
            .chain(u.access_key_id.as_mut())
            .chain(u.secret_access_key.as_mut())
            .chain(u.session_token.as_mut());
        problems.extend(all(ctx, "upstream", i, &label, fields, env).err());
    }
    for (i, m) in f.model.iter_mut().enumerate() {
        let label = m.name.clone();
        problems.extend(all(ctx, "model", i, &label, [&mut m.workspace, &mut m.name], env).err());
    }
    for (i, p) in f.policy.iter_mut().enumerate() {
        let label = format!("{} {}", p.subject, p.target);
        problems.extend(
            all(
                ctx,
                "policy",
                i,
                &label,
                [&mut p.workspace, &mut p.target]
                    .into_iter()
                    .chain(p.department.as_mut())
                    .chain(
                        p.alerts
                            .iter_mut()
                            .flat_map(|a| std::iter::once(&mut a.webhook).chain(a.secret.as_mut())),
                    ),
                env,
            )
            .err(),
        );
    }
    ResourcesError::many(problems).map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::expand;

    #[test]
    fn expansion() {
        let env = |k: &str| match k {
            "A" => Some("alpha".to_owned()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("plain", Ok("plain")),
            ("${A}", Ok("alpha")),
            ("x-${A}-${A}", Ok("x-alpha-alpha")),
            ("${EMPTY}", Ok("")),
            ("cost $5", Ok("cost $5")),
            ("$${A}", Ok("${A}")),
            ("${MISSING}", Err("environment variable MISSING is not set")),
            ("${A", Err("unclosed")),
            ("${A B}", Err("bad variable name")),
            ("${MISSING:-18080}", Ok("18080")),
            ("${A:-18080}", Ok("alpha")),
            ("${EMPTY:-d}", Ok("d")),
            ("${MISSING:-}", Ok("")),
            ("http://h:${MISSING:-1}/v1", Ok("http://h:1/v1")),
            ("${MISSING:-a:-b}", Ok("a:-b")),
            ("${:-x}", Err("bad variable name")),
        ];
        for (input, want) in cases {
            match (expand(input, &env), want) {
                (Ok(got), Ok(w)) => assert_eq!(&got, w, "{input}"),
                (Err(got), Err(w)) => assert!(got.contains(w), "{input}: {got}"),
                (got, w) => panic!("{input}: got {got:?}, want {w:?}"),
            }
        }
    }
}
