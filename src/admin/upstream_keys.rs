//! A `bedrock` credential's AWS keys in the admin API: `region`, `access_key_id`,
//! `secret_access_key` and `session_token` in, sealed together as the credential's secret
//! ([`Keys::to_secret`]); out, only what is not secret (`aws`: the region, the access key id and
//! whether a session token is set). The secret key and the token are write-only like every
//! secret.

use serde_json::Value;

use super::AdminResult;
use crate::error::ApiError;
use crate::provider::Provider;
use crate::provider::bedrock::{Keys, default_base_url};
use crate::state::AppState;
use crate::store::UpstreamRow;

/// The AWS fields of a create or a change.
pub(super) struct AwsFields<'a> {
    pub(super) region: Option<&'a str>,
    pub(super) access_key_id: Option<&'a str>,
    pub(super) secret_access_key: Option<&'a str>,
    /// Absent keeps the token; `null` (or blank) removes it.
    pub(super) session_token: Option<Option<&'a str>>,
}

impl AwsFields<'_> {
    /// The first AWS field given, for a provider that has none.
    fn first_given(&self) -> Option<&'static str> {
        [
            ("region", self.region.is_some()),
            ("access_key_id", self.access_key_id.is_some()),
            ("secret_access_key", self.secret_access_key.is_some()),
            ("session_token", self.session_token.is_some()),
        ]
        .into_iter()
        .find_map(|(name, given)| given.then_some(name))
    }
}

/// Applies the AWS fields to `row` when its provider is `bedrock`: on create every key but the
/// token is required; on a change the given fields replace the stored ones. A base URL that was
/// the old region's default follows the region. Returns `Some(whether the secret changed)` for a
/// bedrock row, `None` for any other provider (which may name no AWS field and keeps `api_key`).
pub(super) fn apply(
    state: &AppState,
    row: &mut UpstreamRow,
    aws: &AwsFields<'_>,
    api_key_given: bool,
    base_url_given: bool,
    creating: bool,
) -> AdminResult<Option<bool>> {
    let provider: Provider = row
        .provider
        .parse()
        .map_err(|m: String| ApiError::field("provider", m))?;
    if provider != Provider::Bedrock {
        return match aws.first_given() {
            Some(field) => Err(ApiError::field(
                field,
                format!("{field} is only for provider \"bedrock\""),
            )),
            None => Ok(None),
        };
    }
    if api_key_given {
        return Err(ApiError::field(
            "api_key",
            "api_key is not for provider \"bedrock\": send access_key_id and secret_access_key",
        ));
    }
    let stored = (!creating)
        .then(|| state.master_key.open(&row.secret_sealed).ok())
        .flatten()
        .and_then(|s| Keys::from_secret(&s).ok());
    let required = |field: &str, given: Option<&str>, had: Option<&String>| {
        given
            .map(str::to_owned)
            .or_else(|| had.cloned())
            .ok_or_else(|| ApiError::field(field, format!("{field} is required for provider \"bedrock\"")))
    };
    let keys = Keys {
        region: required("region", aws.region, stored.as_ref().map(|k| &k.region))?,
        access_key_id: required(
            "access_key_id",
            aws.access_key_id,
            stored.as_ref().map(|k| &k.access_key_id),
        )?,
        secret_access_key: required(
            "secret_access_key",
            aws.secret_access_key,
            stored.as_ref().map(|k| &k.secret_access_key),
        )?,
        session_token: match aws.session_token {
            Some(t) => t.filter(|t| !t.trim().is_empty()).map(str::to_owned),
            None => stored.as_ref().and_then(|k| k.session_token.clone()),
        },
    };
    keys.check().map_err(|m| {
        let field = m.split_whitespace().next().unwrap_or("region").to_owned();
        ApiError::field(&field, m)
    })?;
    let old_default = stored.as_ref().map(|k| default_base_url(&k.region));
    if !base_url_given
        && (creating || row.base_url.is_empty() || old_default.as_deref() == Some(row.base_url.as_str()))
    {
        row.base_url = default_base_url(&keys.region);
    }
    if stored.as_ref() == Some(&keys) {
        return Ok(Some(false));
    }
    row.secret_sealed = state.master_key.seal(&keys.to_secret());
    Ok(Some(!creating))
}

/// What the API shows of a bedrock credential's keys (none for another provider, or when the
/// secret does not open).
pub(super) fn view(state: &AppState, row: &UpstreamRow) -> Option<Value> {
    if row.provider != Provider::Bedrock.as_str() {
        return None;
    }
    let secret = state.master_key.open(&row.secret_sealed).ok()?;
    Keys::from_secret(&secret).ok().map(|k| k.public_view())
}
