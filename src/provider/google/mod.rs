//! Gemini's own API (`google`): where a model's requests go, and the wire format spoken there.
//!
//! A `google` credential's `base_url` is the API's versioned root ([`DEFAULT_BASE_URL`]); each
//! model it serves is called at `{base}/models/{model}:generateContent`, or
//! `:streamGenerateContent?alt=sse` when the client asked for a stream, and embeddings at
//! `:batchEmbedContents` (`embed.rs`). The key goes in the
//! `x-goog-api-key` header, never in the URL (a URL reaches logs and proxies).
//!
//! The gateway speaks OpenAI's chat format inside; a chat request (or a `/v1/messages` request
//! already translated to chat) becomes a `generateContent` request (`request.rs`), and the answer
//! a chat completion (`answer.rs`) or, streamed, chat completion chunks (`stream.rs`). The
//! provider `gemini` is Google's OpenAI-compatible endpoint and needs none of this.

pub mod answer;
pub mod embed;
pub mod request;
pub mod stream;

use std::collections::HashMap;

use axum::http::Uri;

/// The public API's root.
pub const DEFAULT_BASE_URL: &str = "https://generativelanguage.googleapis.com/v1beta";

/// A model's URLs: `generateContent`, `streamGenerateContent?alt=sse`, `batchEmbedContents`.
#[derive(Clone, Debug)]
pub struct Urls {
    /// `POST {base}/models/{model}:generateContent`.
    pub generate: Uri,
    /// `POST {base}/models/{model}:streamGenerateContent?alt=sse`.
    pub stream: Uri,
    /// `POST {base}/models/{model}:batchEmbedContents`.
    pub embed: Uri,
}

/// Where a `google` credential's models are called, parsed once per routing snapshot.
#[derive(Clone, Debug, Default)]
pub struct Target {
    urls: HashMap<String, Urls>,
}

impl Target {
    /// The URLs of each of `models` under `base_url`; `None` when one does not make a URL.
    pub fn new<'a>(base_url: &str, models: impl Iterator<Item = &'a str>) -> Option<Target> {
        let mut urls = HashMap::new();
        for m in models {
            urls.insert(m.to_owned(), model_urls(base_url, m)?);
        }
        Some(Target { urls })
    }

    /// The embeddings URL for `model`.
    pub fn embed_url(&self, model: &str) -> Option<&Uri> {
        self.urls.get(model).map(|u| &u.embed)
    }

    /// The URL for `model`, streamed or not.
    pub fn url(&self, model: &str, stream: bool) -> Option<&Uri> {
        self.urls
            .get(model)
            .map(|u| if stream { &u.stream } else { &u.generate })
    }
}

/// The URLs of `model` under `base_url`. A model named `models/x` (as Google lists them) is `x`.
pub fn model_urls(base_url: &str, model: &str) -> Option<Urls> {
    let base = base_url.trim_end_matches('/');
    let model = model.strip_prefix("models/").unwrap_or(model);
    let segment: String = model
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    Some(Urls {
        generate: format!("{base}/models/{segment}:generateContent").parse().ok()?,
        stream: format!("{base}/models/{segment}:streamGenerateContent?alt=sse")
            .parse()
            .ok()?,
        embed: format!("{base}/models/{segment}:batchEmbedContents")
            .parse()
            .ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_has_its_two_urls() {
        let cases = [
            (
                DEFAULT_BASE_URL,
                "gemini-2.5-flash",
                "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent",
                "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
            ),
            (
                "http://127.0.0.1:9000/v1beta/",
                "models/gemini-2.0-flash",
                "http://127.0.0.1:9000/v1beta/models/gemini-2.0-flash:generateContent",
                "http://127.0.0.1:9000/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse",
            ),
            (
                "http://h/v1beta",
                "a/b c",
                "http://h/v1beta/models/a%2Fb%20c:generateContent",
                "http://h/v1beta/models/a%2Fb%20c:streamGenerateContent?alt=sse",
            ),
        ];
        for (base, model, generate, stream) in cases {
            let u = model_urls(base, model).unwrap();
            assert_eq!(u.generate.to_string(), generate);
            assert_eq!(u.stream.to_string(), stream);
        }
    }
}
