//! An upstream credential as the wire formats see it: who it is, how it authenticates, where
//! its endpoints are. The routing snapshot (`upstream::pool`) builds it from a stored row.

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::{HeaderValue, Uri};

use super::Provider;
use super::adapter::Endpoint;
use super::mask::SecretMask;

/// An upstream credential ready to dispatch to.
#[derive(Debug)]
pub struct Credential {
    /// Row id.
    pub id: i64,
    /// Owning workspace.
    pub workspace_id: i64,
    /// Name, unique in the workspace.
    pub name: String,
    /// Provider kind.
    pub provider: Provider,
    /// The auth header's value, made of the opened secret (`Bearer …`, or the bare key for
    /// Anthropic); marked sensitive, so never printed.
    pub auth: HeaderValue,
    /// The secret, ready to be masked out of what the upstream sends back (built once here,
    /// not per request).
    pub mask: Arc<SecretMask>,
    /// Lower is tried first.
    pub priority: i64,
    /// Share within a priority.
    pub weight: i64,
    /// Requests in flight at most.
    pub max_in_flight: i64,
    /// Own limits.
    pub requests_per_minute: Option<i64>,
    /// Own limits.
    pub tokens_per_minute: Option<i64>,
    /// Own limits.
    pub requests_per_day: Option<i64>,
    /// Credentials sharing one account quota.
    pub quota_group: Option<String>,
    /// Public model name → upstream model name.
    pub models: HashMap<String, String>,
    /// URLs of the chat, embeddings and messages endpoints (parsed once, not per request).
    pub urls: [Uri; 3],
    /// Azure's deployments API: the URLs of each upstream model (deployment), which replace
    /// [`Credential::urls`] for it; empty for every other provider.
    pub deployment_urls: HashMap<String, [Uri; 3]>,
    /// A `bedrock` credential's region, signing keys and Converse URLs; none for every other
    /// provider.
    pub bedrock: Option<Arc<super::bedrock::Target>>,
    /// A `google` credential's `generateContent` URLs per model; none for every other provider.
    pub google: Option<Arc<super::google::Target>>,
}

impl Credential {
    /// The URL of `endpoint` on this credential's provider, for `upstream_model`.
    pub fn url(&self, endpoint: Endpoint, upstream_model: &str) -> &Uri {
        let urls = self.deployment_urls.get(upstream_model).unwrap_or(&self.urls);
        &urls[endpoint as usize]
    }
}
