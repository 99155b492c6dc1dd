//! A `bedrock` upstream entry's AWS fields (`region`, `access_key_id`, `secret_access_key`,
//! `session_token`): they belong to `bedrock` alone, `api_key` does not, and together they are
//! the secret the entry seals ([`crate::provider::bedrock::Keys`]).

use super::spec::UpstreamSpec;
use crate::provider::Provider;
use crate::provider::bedrock::Keys;

/// The entry's AWS keys: `Some` for a `bedrock` entry (each field checked), `None` for any other
/// provider (which may name none of them). The error names the field.
pub(super) fn keys(u: &UpstreamSpec, provider: Provider) -> Result<Option<Keys>, String> {
    let aws = [
        ("region", &u.region),
        ("access_key_id", &u.access_key_id),
        ("secret_access_key", &u.secret_access_key),
        ("session_token", &u.session_token),
    ];
    if provider != Provider::Bedrock {
        return match aws.iter().find(|(_, v)| v.is_some()) {
            Some((field, _)) => Err(format!("{field} is only for provider \"bedrock\"")),
            None => Ok(None),
        };
    }
    if !u.api_key.is_empty() {
        return Err(
            "api_key is not for provider \"bedrock\": name access_key_id and secret_access_key".into(),
        );
    }
    let required = |field: &str, v: &Option<String>| match v {
        Some(v) if !v.is_empty() => Ok(v.clone()),
        Some(_) => Err(format!("{field} is empty (is its ${{VAR}} set?)")),
        None => Err(format!("{field} is required for provider \"bedrock\"")),
    };
    let keys = Keys {
        region: required("region", &u.region)?,
        access_key_id: required("access_key_id", &u.access_key_id)?,
        secret_access_key: required("secret_access_key", &u.secret_access_key)?,
        session_token: u.session_token.clone().filter(|t| !t.is_empty()),
    };
    keys.check()?;
    Ok(Some(keys))
}

/// The text the entry seals: a `bedrock` entry's keys, else its `api_key`.
pub(super) fn secret(u: &UpstreamSpec, provider: Provider) -> String {
    match keys(u, provider) {
        Ok(Some(k)) => k.to_secret(),
        _ => u.api_key.clone(),
    }
}
