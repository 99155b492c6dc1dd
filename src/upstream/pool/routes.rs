//! The routing snapshot: which credentials serve which public model in each workspace, with
//! secrets opened in memory. Rebuilt from the store when the configuration epoch changes and
//! swapped in atomically; the request path only reads it.

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::{HeaderValue, Uri};
use rustc_hash::FxHashMap;

use crate::kernel::crypto::MasterKey;
use crate::store::{ModelRow, ModelStore, Store, StoreResult, UpstreamRow, UpstreamStore, WorkspaceStore};

use crate::provider::adapter::Endpoint;
use crate::provider::mask::SecretMask;
use crate::provider::{Credential, Provider};

/// A public model of a workspace: price, fallbacks, and the credentials that serve it.
#[derive(Debug)]
pub struct ModelRoute {
    /// Public name.
    pub name: String,
    /// Micro-credits per million prompt tokens.
    pub price_prompt: i64,
    /// Micro-credits per million completion tokens.
    pub price_completion: i64,
    /// Other public models to try, in order.
    pub fallbacks: Vec<String>,
    /// The model's own output limit (`max_output_tokens`), if set.
    pub max_output_tokens: Option<u64>,
    /// Credentials serving it, by priority.
    pub credentials: Vec<Arc<Credential>>,
    /// The providers of the disabled credentials that serve it: they exist but cannot serve
    /// now, so a request finding no other candidate is refused as exhausted, not unreachable.
    pub disabled: Vec<Provider>,
}

impl ModelRoute {
    /// Micro-credits for this usage: never negative (a negative price counts as free), saturated
    /// at `i64::MAX`.
    pub fn credits(&self, prompt: u64, completion: u64) -> i64 {
        let cost = |price: i64, tokens: u64| i128::from(price.max(0)).saturating_mul(i128::from(tokens));
        let micros = cost(self.price_prompt, prompt).saturating_add(cost(self.price_completion, completion))
            / 1_000_000;
        i64::try_from(micros).unwrap_or(i64::MAX)
    }
}

/// Everything routable in one workspace.
#[derive(Debug, Default)]
pub struct WorkspaceRoutes {
    /// Time zone override for quota windows.
    pub timezone: Option<chrono_tz::Tz>,
    /// Public models by name.
    pub models: FxHashMap<String, Arc<ModelRoute>>,
    /// Credentials of each quota group (groot ADR 0008: they rest together).
    pub quota_groups: FxHashMap<String, Vec<i64>>,
}

impl WorkspaceRoutes {
    /// The model and its fallback chain (each model once, unknown names skipped).
    pub fn chain(&self, model: &str) -> Vec<Arc<ModelRoute>> {
        let mut out: Vec<Arc<ModelRoute>> = Vec::new();
        let Some(first) = self.models.get(model) else {
            return out;
        };
        out.push(first.clone());
        for fb in &first.fallbacks {
            if let Some(m) = self.models.get(fb)
                && !out.iter().any(|o| o.name == m.name)
            {
                out.push(m.clone());
            }
        }
        out
    }
}

/// The routing snapshot of every workspace.
#[derive(Debug, Default)]
pub struct Routes {
    /// By workspace id.
    pub workspaces: FxHashMap<i64, WorkspaceRoutes>,
    /// A fingerprint of every stored credential's sealed secret, enabled or not, by id. Sealing
    /// draws a fresh nonce and an unchanged secret keeps its ciphertext, so a fingerprint that
    /// differs between two snapshots means the secret was edited.
    pub secrets: FxHashMap<i64, u64>,
}

impl Routes {
    /// Builds the snapshot from the store. A credential whose secret cannot be opened (another
    /// master key) is left out with an error in the log, not a failed start.
    pub async fn load(store: &Store, master: &MasterKey) -> StoreResult<Routes> {
        let upstreams = store.all_upstreams().await?;
        let models = store.all_models().await?;
        let mut routes = Routes::default();
        for ws in store.workspaces().await? {
            routes.workspaces.insert(
                ws.id,
                WorkspaceRoutes {
                    timezone: ws.timezone.as_deref().and_then(|t| t.parse().ok()),
                    models: FxHashMap::default(),
                    quota_groups: FxHashMap::default(),
                },
            );
        }
        routes.secrets = upstreams
            .iter()
            .map(|u| (u.id, fingerprint(&u.secret_sealed)))
            .collect();
        let mut creds: Vec<Arc<Credential>> = Vec::new();
        for u in upstreams.iter().filter(|u| u.enabled == 1) {
            match Credential::from_row(u, master) {
                Some(c) => creds.push(Arc::new(c)),
                None => tracing::error!(
                    upstream = %u.name,
                    "cannot open this upstream's secret (different master key?) or parse its base URL; \
                     it is not routed"
                ),
            }
        }
        creds.sort_by_key(|c| (c.priority, c.id));
        for c in &creds {
            if let Some(g) = &c.quota_group {
                let ws = routes.workspaces.entry(c.workspace_id).or_default();
                ws.quota_groups.entry(g.clone()).or_default().push(c.id);
            }
        }
        let by_ws_model: HashMap<(i64, &str), &ModelRow> = models
            .iter()
            .map(|m| ((m.workspace_id, m.name.as_str()), m))
            .collect();
        // Public models: those declared, plus those a credential serves without a declaration.
        let mut names: Vec<(i64, String)> = models.iter().map(|m| (m.workspace_id, m.name.clone())).collect();
        // A disabled credential's models stay known: asked for, they are exhausted, not unknown.
        for u in &upstreams {
            for m in u.served_models() {
                names.push((u.workspace_id, m.name));
            }
        }
        names.sort();
        names.dedup();
        for (ws, name) in names {
            let row = by_ws_model.get(&(ws, name.as_str()));
            let credentials: Vec<Arc<Credential>> = creds
                .iter()
                .filter(|c| c.workspace_id == ws && c.models.contains_key(&name))
                .cloned()
                .collect();
            let disabled: Vec<Provider> = upstreams
                .iter()
                .filter(|u| u.enabled != 1 && u.workspace_id == ws)
                .filter(|u| u.served_models().iter().any(|m| m.name == name))
                .filter_map(|u| u.provider.parse().ok())
                .collect();
            let route = ModelRoute {
                price_prompt: row.map_or(0, |r| r.price_prompt),
                price_completion: row.map_or(0, |r| r.price_completion),
                fallbacks: row.map(|r| r.fallback_names()).unwrap_or_default(),
                max_output_tokens: row
                    .and_then(|r| r.max_output_tokens)
                    .and_then(|n| u64::try_from(n).ok()),
                name: name.clone(),
                credentials,
                disabled,
            };
            routes
                .workspaces
                .entry(ws)
                .or_default()
                .models
                .insert(name, Arc::new(route));
        }
        Ok(routes)
    }

    /// The credentials whose secret was edited since the `earlier` snapshot (a credential new
    /// since then, or gone, was not edited).
    pub fn secrets_replaced_since(&self, earlier: &Routes) -> Vec<i64> {
        let mut ids: Vec<i64> = self
            .secrets
            .iter()
            .filter(|(id, now)| earlier.secrets.get(id).is_some_and(|before| before != *now))
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }
}

/// A sealed secret's fingerprint: enough to tell two ciphertexts apart, nothing to open.
fn fingerprint(sealed: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    sealed.hash(&mut h);
    h.finish()
}

impl Credential {
    /// The credential of a stored row: none if its secret does not open with `master` (or makes
    /// no header value), or its provider or base URL does not parse.
    pub fn from_row(u: &UpstreamRow, master: &MasterKey) -> Option<Credential> {
        let secret = master.open(&u.secret_sealed).ok()?;
        let provider: Provider = u.provider.parse().ok()?;
        // A bedrock secret is its AWS keys; requests are signed, not given a key header.
        let bedrock_keys = match provider {
            Provider::Bedrock => Some(crate::provider::bedrock::Keys::from_secret(&secret).ok()?),
            _ => None,
        };
        let secret = match &bedrock_keys {
            Some(k) => k.secret_access_key.clone(),
            None => secret,
        };
        // Anthropic's `x-api-key`, Azure's `api-key` and Google's `x-goog-api-key` carry the
        // bare key (bedrock's is never sent: its requests are signed).
        let mut auth = if matches!(
            provider,
            Provider::Anthropic | Provider::Azure | Provider::Bedrock | Provider::Google
        ) {
            HeaderValue::from_str(&secret)
        } else {
            HeaderValue::from_str(&format!("Bearer {secret}"))
        }
        .ok()?;
        auth.set_sensitive(true);
        let base_url = u.base_url.trim_end_matches('/').to_owned();
        // Parsed as a URL first: that percent-encodes and punycodes what a URI may not hold.
        let url = |e: Endpoint| {
            let url = reqwest::Url::parse(&format!("{base_url}{}", e.path())).ok()?;
            url.as_str().parse::<Uri>().ok()
        };
        let urls = [
            url(Endpoint::ChatCompletions)?,
            url(Endpoint::Embeddings)?,
            url(Endpoint::Messages)?,
        ];
        let served = u.served_models();
        let deployment_urls = if provider == Provider::Azure {
            served
                .iter()
                .map(|m| {
                    Some((
                        m.upstream.clone(),
                        crate::provider::azure::urls(&u.base_url, &m.upstream)?,
                    ))
                })
                .collect::<Option<HashMap<_, _>>>()?
        } else {
            HashMap::new()
        };
        let bedrock = match &bedrock_keys {
            Some(keys) => Some(Arc::new(crate::provider::bedrock::Target::new(
                keys,
                &u.base_url,
                served.iter().map(|m| m.upstream.as_str()),
            )?)),
            None => None,
        };
        let google = match provider {
            Provider::Google => Some(Arc::new(crate::provider::google::Target::new(
                &u.base_url,
                served.iter().map(|m| m.upstream.as_str()),
            )?)),
            _ => None,
        };
        Some(Credential {
            id: u.id,
            workspace_id: u.workspace_id,
            name: u.name.clone(),
            provider,
            auth,
            mask: Arc::new(SecretMask::new(&secret)),
            priority: u.priority,
            weight: u.weight.max(1),
            max_in_flight: u.max_in_flight.max(1),
            requests_per_minute: u.requests_per_minute,
            tokens_per_minute: u.tokens_per_minute,
            requests_per_day: u.requests_per_day,
            quota_group: u.quota_group.clone(),
            models: served.into_iter().map(|m| (m.name, m.upstream)).collect(),
            urls,
            deployment_urls,
            bedrock,
            google,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(price_prompt: i64, price_completion: i64) -> ModelRoute {
        ModelRoute {
            name: "m".into(),
            price_prompt,
            price_completion,
            fallbacks: Vec::new(),
            max_output_tokens: None,
            credentials: Vec::new(),
            disabled: Vec::new(),
        }
    }

    #[test]
    fn an_edited_secret_is_told_apart_from_new_and_unchanged_ones() {
        let snapshot = |secrets: &[(i64, &str)]| Routes {
            workspaces: FxHashMap::default(),
            secrets: secrets.iter().map(|(id, s)| (*id, fingerprint(s))).collect(),
        };
        // (case, earlier secrets, later secrets, the credentials whose secret was edited)
        type Case = (
            &'static str,
            &'static [(i64, &'static str)],
            &'static [(i64, &'static str)],
            &'static [i64],
        );
        let cases: &[Case] = &[
            (
                "nothing changed",
                &[(1, "a"), (2, "b")],
                &[(1, "a"), (2, "b")],
                &[],
            ),
            ("one edited", &[(1, "a"), (2, "b")], &[(1, "a"), (2, "c")], &[2]),
            (
                "both edited",
                &[(1, "a"), (2, "b")],
                &[(1, "x"), (2, "y")],
                &[1, 2],
            ),
            (
                "a new credential is not an edit",
                &[(1, "a")],
                &[(1, "a"), (2, "b")],
                &[],
            ),
            (
                "a deleted credential is not an edit",
                &[(1, "a"), (2, "b")],
                &[(1, "a")],
                &[],
            ),
            ("the first snapshot", &[], &[(1, "a")], &[]),
        ];
        for (case, before, after, want) in cases {
            assert_eq!(
                snapshot(after).secrets_replaced_since(&snapshot(before)),
                *want,
                "{case}"
            );
        }
    }

    #[test]
    fn credits_never_overflow() {
        /// (prices in micro-credits per million tokens, prompt and completion tokens, credits)
        type Case = ((i64, i64), (u64, u64), i64);
        let cases: &[Case] = &[
            ((1_000_000, 2_000_000), (4, 5), 14),
            ((150_000, 600_000), (1_000_000, 1_000_000), 750_000),
            ((1, 1), (999_999, 0), 0),
            ((0, 0), (u64::MAX, u64::MAX), 0),
            ((i64::MAX, i64::MAX), (100_000_000, 100_000_000), i64::MAX),
            ((i64::MAX, i64::MAX), (u64::MAX, u64::MAX), i64::MAX),
            ((i64::MAX, 0), (1_000_000, 0), i64::MAX),
            ((i64::MAX, 0), (999_999, 0), 9_223_362_813_482_738_952),
            ((-1_000_000, 2_000_000), (u64::MAX, 5), 10),
            ((i64::MIN, i64::MIN), (u64::MAX, u64::MAX), 0),
        ];
        for ((p, c), (prompt, completion), want) in cases {
            assert_eq!(
                route(*p, *c).credits(*prompt, *completion),
                *want,
                "{p} {c} {prompt} {completion}"
            );
        }
    }
}
