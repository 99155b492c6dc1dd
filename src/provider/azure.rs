//! Azure OpenAI: where a request for one deployment goes, and how the `api-version` is named.
//!
//! An `azure` credential's `base_url` is the resource's endpoint
//! (`https://NAME.openai.azure.com`); each model it serves names its deployment as the model's
//! upstream name. Two APIs are spoken, chosen by the base URL's path:
//!
//! - the deployments API (any other path, usually none):
//!   `{base}/openai/deployments/{deployment}/chat/completions?api-version=V` (and `/embeddings`),
//!   where `V` is the base URL's own `?api-version=` ([`DEFAULT_API_VERSION`] when it names none);
//! - the v1 API (a base URL ending in `/openai/v1`): `{base}/chat/completions` with the
//!   deployment as the body's `model`, and no `api-version` unless the base URL carries one.
//!
//! The key goes in the `api-key` header, never `Authorization`. Microsoft Entra ID tokens are
//! not spoken yet (docs/upstreams.md).

use axum::http::Uri;

use super::adapter::Endpoint;

/// The `api-version` of the deployments API when the base URL names none: the latest generally
/// available data-plane version.
pub const DEFAULT_API_VERSION: &str = "2024-10-21";

/// The query parameter naming the API version.
const API_VERSION: &str = "api-version";

/// The base URL with `api_version` as its `?api-version=` (the resources file's and admin API's
/// `api_version` field): the one place the field meets the URL, which is what is stored. A base
/// URL that already names another version is refused, so neither silently wins.
pub fn with_api_version(base_url: &str, api_version: Option<&str>) -> Result<String, String> {
    let Some(version) = api_version else {
        return Ok(base_url.to_owned());
    };
    let version = version.trim();
    let valid = !version.is_empty()
        && version.len() <= 64
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    if !valid {
        return Err("api_version must be an Azure API version such as \"2024-10-21\" or \"preview\"".into());
    }
    let mut url = reqwest::Url::parse(base_url).map_err(|e| format!("base_url is not a URL: {e}"))?;
    if let Some(named) = url
        .query_pairs()
        .find(|(k, _)| k == API_VERSION)
        .map(|(_, v)| v.into_owned())
    {
        return if named == version {
            Ok(base_url.to_owned())
        } else {
            Err(format!(
                "api_version {version:?} differs from the base_url's api-version {named:?}; name it once"
            ))
        };
    }
    url.query_pairs_mut().append_pair(API_VERSION, version);
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// The base URL without its `?api-version=` (its other query parameters kept).
pub fn without_api_version(base_url: &str) -> String {
    let Ok(mut url) = reqwest::Url::parse(base_url) else {
        return base_url.to_owned();
    };
    let rest: Vec<(String, String)> = url
        .query_pairs()
        .into_owned()
        .filter(|(k, _)| k != API_VERSION)
        .collect();
    url.set_query(None);
    if !rest.is_empty() {
        url.query_pairs_mut().extend_pairs(&rest);
    }
    url.as_str().trim_end_matches('/').to_owned()
}

/// The URLs of the chat, embeddings and messages endpoints for `deployment` on the resource at
/// `base_url` (`None` when the base URL does not parse). Messages are never sent to Azure (they
/// are translated to chat), but the slot is filled like every credential's.
pub fn urls(base_url: &str, deployment: &str) -> Option<[Uri; 3]> {
    let base = reqwest::Url::parse(base_url).ok()?;
    let mut query: Vec<(String, String)> = base.query_pairs().into_owned().collect();
    let path = base.path().trim_end_matches('/');
    let v1 = path.ends_with("/openai/v1");
    let prefix = if v1 {
        path.to_owned()
    } else {
        if !query.iter().any(|(k, _)| k == API_VERSION) {
            query.push((API_VERSION.to_owned(), DEFAULT_API_VERSION.to_owned()));
        }
        // `https://NAME.openai.azure.com/openai` names the same resource.
        let resource = path.strip_suffix("/openai").unwrap_or(path);
        format!("{resource}/openai/deployments/{}", encode_segment(deployment))
    };
    let url = |e: Endpoint| {
        let mut u = base.clone();
        u.set_path(&format!("{prefix}{}", e.path()));
        u.set_query(None);
        if !query.is_empty() {
            u.query_pairs_mut().extend_pairs(&query);
        }
        u.as_str().parse::<Uri>().ok()
    };
    Some([
        url(Endpoint::ChatCompletions)?,
        url(Endpoint::Embeddings)?,
        url(Endpoint::Messages)?,
    ])
}

/// A deployment name as one path segment (a `/` or `?` in it stays inside the segment).
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_has_its_own_urls() {
        // (base URL, deployment, chat URL, embeddings URL)
        let cases: &[(&str, &str, &str, &str)] = &[
            (
                "https://acme.openai.azure.com",
                "gpt-4o-prod",
                "https://acme.openai.azure.com/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21",
                "https://acme.openai.azure.com/openai/deployments/gpt-4o-prod/embeddings?api-version=2024-10-21",
            ),
            (
                "https://acme.openai.azure.com/?api-version=2025-04-01-preview",
                "o3",
                "https://acme.openai.azure.com/openai/deployments/o3/chat/completions?api-version=2025-04-01-preview",
                "https://acme.openai.azure.com/openai/deployments/o3/embeddings?api-version=2025-04-01-preview",
            ),
            (
                "https://acme.openai.azure.com/openai",
                "emb small",
                "https://acme.openai.azure.com/openai/deployments/emb%20small/chat/completions?api-version=2024-10-21",
                "https://acme.openai.azure.com/openai/deployments/emb%20small/embeddings?api-version=2024-10-21",
            ),
            (
                "http://127.0.0.1:9000/proxy?api-version=2024-06-01",
                "a/b",
                "http://127.0.0.1:9000/proxy/openai/deployments/a%2Fb/chat/completions?api-version=2024-06-01",
                "http://127.0.0.1:9000/proxy/openai/deployments/a%2Fb/embeddings?api-version=2024-06-01",
            ),
            // The v1 API: no deployment in the path, no api-version unless named.
            (
                "https://acme.openai.azure.com/openai/v1/",
                "gpt-4o-prod",
                "https://acme.openai.azure.com/openai/v1/chat/completions",
                "https://acme.openai.azure.com/openai/v1/embeddings",
            ),
            (
                "https://acme.openai.azure.com/openai/v1?api-version=preview",
                "gpt-4o-prod",
                "https://acme.openai.azure.com/openai/v1/chat/completions?api-version=preview",
                "https://acme.openai.azure.com/openai/v1/embeddings?api-version=preview",
            ),
        ];
        for (base, deployment, chat, embeddings) in cases {
            let urls = urls(base, deployment).unwrap_or_else(|| panic!("{base}: no URLs"));
            assert_eq!(urls[0].to_string(), *chat, "{base} {deployment}");
            assert_eq!(urls[1].to_string(), *embeddings, "{base} {deployment}");
        }
        assert!(urls("not a url", "d").is_none());
    }

    #[test]
    fn the_api_version_field_lands_in_the_base_url_once() {
        let cases: &[(&str, Option<&str>, Result<&str, &str>)] = &[
            (
                "https://acme.openai.azure.com",
                None,
                Ok("https://acme.openai.azure.com"),
            ),
            (
                "https://acme.openai.azure.com",
                Some("2024-10-21"),
                Ok("https://acme.openai.azure.com/?api-version=2024-10-21"),
            ),
            (
                "https://acme.openai.azure.com/openai/v1",
                Some("preview"),
                Ok("https://acme.openai.azure.com/openai/v1?api-version=preview"),
            ),
            (
                "https://acme.openai.azure.com/?api-version=2024-10-21",
                Some("2024-10-21"),
                Ok("https://acme.openai.azure.com/?api-version=2024-10-21"),
            ),
            (
                "https://acme.openai.azure.com/?api-version=2024-06-01",
                Some("2024-10-21"),
                Err("api_version \"2024-10-21\" differs"),
            ),
            (
                "https://acme.openai.azure.com",
                Some(""),
                Err("api_version must be"),
            ),
            (
                "https://acme.openai.azure.com",
                Some("2024&x=1"),
                Err("api_version must be"),
            ),
        ];
        for (base, version, want) in cases {
            let got = with_api_version(base, *version);
            match (&got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, w, "{base} {version:?}"),
                (Err(e), Err(w)) => assert!(e.starts_with(w), "{base} {version:?}: {e}"),
                _ => panic!("{base} {version:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}
