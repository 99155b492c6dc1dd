//! AWS Bedrock Runtime: the Converse and ConverseStream APIs, signed with SigV4.
//!
//! A `bedrock` credential is an AWS key pair for one region ([`Keys`]): the access key id, the
//! secret access key, an optional session token (temporary credentials), and the region. The
//! gateway speaks OpenAI chat to it: a chat request (or a `/v1/messages` request, first translated
//! to chat by `translate`) is turned into a Converse request ([`request`]), sent to
//! `{base}/model/{modelId}/converse` (or `/converse-stream`) and signed by the AWS SDK's own
//! signing crate (`aws-sigv4`; [`Target::sign`]); the answer is turned back into a chat completion
//! ([`answer`]), and the stream's AWS event-stream frames, decoded by `aws-smithy-eventstream`,
//! into chat completion chunks ([`stream`]). Everything after the exchange (usage, the SSE tap,
//! the messages translation) sees OpenAI's shapes.
//!
//! The base URL is `https://bedrock-runtime.{region}.amazonaws.com` unless one is named (a VPC
//! endpoint, the mock upstream). The keys are sealed at rest as one secret, in [`Keys::to_secret`]'s
//! form; the region and access key id are not secret, and the admin API shows them
//! ([`Keys::public_view`]).

pub mod answer;
pub mod request;
pub mod stream;

use std::collections::HashMap;
use std::fmt;
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_smithy_runtime_api::client::identity::Identity;
use axum::http::{HeaderName, HeaderValue, Request, Uri};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The header naming an AWS error's type (`ThrottlingException:http://…`); kept with an error
/// for its classification.
pub const AWS_ERROR_TYPE: &str = "x-amzn-errortype";

/// The signing name of the Bedrock Runtime service.
const SERVICE: &str = "bedrock";

/// The Bedrock Runtime endpoint of `region`.
pub fn default_base_url(region: &str) -> String {
    format!("https://bedrock-runtime.{region}.amazonaws.com")
}

/// A `bedrock` credential's AWS keys, as the resources file and the admin API name them
/// (`region`, `access_key_id`, `secret_access_key`, `session_token`; the names of AWS's own
/// configuration files). Never printed: `Debug` shows the region and access key id only.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Keys {
    /// The AWS region, e.g. `us-east-1`; part of every signature.
    pub region: String,
    /// The access key id (`AKIA…`, `ASIA…` for temporary credentials); not secret.
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: String,
    /// The session token of temporary credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token: Option<String>,
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keys")
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"***")
            .field("session_token", &self.session_token.as_ref().map(|_| "***"))
            .finish()
    }
}

impl Keys {
    /// Checks every field; the error names the field.
    pub fn check(&self) -> Result<(), String> {
        let region_ok = !self.region.is_empty()
            && self.region.len() <= 32
            && self
                .region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !region_ok {
            return Err("region must be an AWS region such as \"us-east-1\"".into());
        }
        let printable = |field: &str, v: &str, max: usize| {
            if v.trim().is_empty() || v.len() > max || v.chars().any(|c| c.is_control() || c.is_whitespace())
            {
                Err(format!(
                    "{field} must be 1 to {max} printable characters without spaces"
                ))
            } else {
                Ok(())
            }
        };
        printable("access_key_id", &self.access_key_id, 128)?;
        printable("secret_access_key", &self.secret_access_key, 256)?;
        if let Some(t) = &self.session_token {
            printable("session_token", t, 4096)?;
        }
        Ok(())
    }

    /// The text sealed as the credential's secret: one JSON object, fields in a fixed order, so
    /// the same keys always make the same text (the resources file keeps the stored ciphertext
    /// when they did not change).
    pub fn to_secret(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The keys of an opened secret.
    pub fn from_secret(secret: &str) -> Result<Keys, String> {
        serde_json::from_str(secret).map_err(|_| "not a bedrock credential's keys".to_owned())
    }

    /// What the admin API shows of the keys: the region, the access key id and whether a
    /// session token is set; never the secret key or the token.
    pub fn public_view(&self) -> serde_json::Value {
        serde_json::json!({
            "region": self.region,
            "access_key_id": self.access_key_id,
            "has_session_token": self.session_token.is_some(),
        })
    }
}

/// Where and how a `bedrock` credential's requests go: its region, its signing identity and,
/// for each upstream model, the Converse and ConverseStream URLs (parsed once, when the routing
/// snapshot is built).
pub struct Target {
    region: String,
    identity: Identity,
    /// Upstream model id → [converse, converse-stream].
    urls: HashMap<String, [Uri; 2]>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("region", &self.region)
            .field("models", &self.urls.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Target {
    /// The target of `keys` at `base_url` for `models` (upstream model ids); `None` when a URL
    /// does not parse.
    pub fn new<'a>(keys: &Keys, base_url: &str, models: impl IntoIterator<Item = &'a str>) -> Option<Target> {
        let base = base_url.trim_end_matches('/');
        let mut urls = HashMap::new();
        for model in models {
            let url = |action: &str| -> Option<Uri> {
                let url =
                    reqwest::Url::parse(&format!("{base}/model/{}/{action}", encode_label(model))).ok()?;
                url.as_str().parse::<Uri>().ok()
            };
            urls.insert(model.to_owned(), [url("converse")?, url("converse-stream")?]);
        }
        let credentials = Credentials::new(
            keys.access_key_id.clone(),
            keys.secret_access_key.clone(),
            keys.session_token.clone(),
            None,
            "aigw-bedrock-credential",
        );
        Some(Target {
            region: keys.region.clone(),
            identity: credentials.into(),
            urls,
        })
    }

    /// The URL of a Converse (or, with `stream`, ConverseStream) call of `model`.
    pub fn url(&self, model: &str, stream: bool) -> Option<&Uri> {
        self.urls.get(model).map(|u| &u[usize::from(stream)])
    }

    /// Signs `req` with SigV4 at `time`: `authorization`, `x-amz-date` and, with temporary
    /// credentials, `x-amz-security-token` are added (the first and last marked sensitive). The
    /// signature covers the method, path, query, every header already set and the body.
    pub fn sign(&self, req: &mut Request<Bytes>, time: SystemTime) -> Result<(), String> {
        use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
        use aws_sigv4::sign::v4;
        let params = v4::SigningParams::builder()
            .identity(&self.identity)
            .region(&self.region)
            .name(SERVICE)
            .time(time)
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| format!("signing parameters: {e}"))?
            .into();
        let uri = req.uri().to_string();
        let headers: Vec<(&str, &str)> = req
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)))
            .collect();
        let signable = SignableRequest::new(
            req.method().as_str(),
            uri,
            headers.into_iter(),
            SignableBody::Bytes(req.body()),
        )
        .map_err(|e| format!("signing: {e}"))?;
        let (instructions, _) = sign(signable, &params)
            .map_err(|e| format!("signing: {e}"))?
            .into_parts();
        let (headers, _) = instructions.into_parts();
        for h in headers {
            let mut value =
                HeaderValue::from_str(h.value()).map_err(|_| "signing: a header value".to_owned())?;
            value.set_sensitive(h.sensitive() || h.name() == "authorization");
            req.headers_mut().insert(HeaderName::from_static(h.name()), value);
        }
        Ok(())
    }
}

/// A model id as one path label, as the AWS SDKs encode it: everything but `A–Z a–z 0–9 - . _ ~`
/// percent-encoded (an inference profile's ARN keeps its `:` and `/` inside the label).
fn encode_label(s: &str) -> String {
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

/// The AWS error type of a failed call: the `x-amzn-errortype` header's name
/// (`ThrottlingException:http://internal.amazon.com/…`), else the body's `__type`
/// (`com.amazon.coral.service#UnrecognizedClientException`), else its `code`.
pub fn error_type<'a>(header: Option<&'a str>, body: &'a serde_json::Value) -> Option<&'a str> {
    let from_header = header.and_then(|h| h.split(':').next()).map(str::trim);
    let from_body = || {
        body.get("__type")
            .or_else(|| body.get("code"))
            .and_then(serde_json::Value::as_str)
            .map(|t| t.rsplit('#').next().unwrap_or(t))
    };
    from_header.filter(|t| !t.is_empty()).or_else(from_body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(token: Option<&str>) -> Keys {
        Keys {
            region: "us-east-1".into(),
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: token.map(str::to_owned),
        }
    }

    #[test]
    fn keys_seal_as_one_stable_text_and_never_print_the_secret() {
        let k = keys(Some("tok"));
        assert_eq!(
            k.to_secret(),
            r#"{"region":"us-east-1","access_key_id":"AKIDEXAMPLE","secret_access_key":"wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY","session_token":"tok"}"#
        );
        assert_eq!(Keys::from_secret(&k.to_secret()), Ok(k.clone()));
        assert!(!keys(None).to_secret().contains("session_token"));
        assert!(Keys::from_secret("sk-plain-api-key").is_err());
        let printed = format!("{k:?}");
        assert!(
            !printed.contains("wJalr") && !printed.contains("tok\""),
            "{printed}"
        );
    }

    #[test]
    fn keys_are_checked_by_field() {
        let cases: &[(Keys, Result<(), &str>)] = &[
            (keys(None), Ok(())),
            (
                Keys {
                    region: "US East".into(),
                    ..keys(None)
                },
                Err("region"),
            ),
            (
                Keys {
                    access_key_id: " ".into(),
                    ..keys(None)
                },
                Err("access_key_id"),
            ),
            (
                Keys {
                    secret_access_key: String::new(),
                    ..keys(None)
                },
                Err("secret_access_key"),
            ),
            (keys(Some("a b")), Err("session_token")),
        ];
        for (k, want) in cases {
            match (k.check(), want) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(w)) => assert!(e.starts_with(w), "{e}"),
                (got, want) => panic!("{k:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_model_has_its_converse_urls() {
        let t = Target::new(
            &keys(None),
            "https://bedrock-runtime.us-east-1.amazonaws.com/",
            [
                "anthropic.claude-3-5-sonnet-20240620-v1:0",
                "arn:aws:bedrock:us-east-1:123:inference-profile/us.x",
            ],
        )
        .unwrap();
        assert_eq!(
            t.url("anthropic.claude-3-5-sonnet-20240620-v1:0", false)
                .unwrap()
                .to_string(),
            "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
        );
        assert_eq!(
            t.url("arn:aws:bedrock:us-east-1:123:inference-profile/us.x", true)
                .unwrap()
                .to_string(),
            "https://bedrock-runtime.us-east-1.amazonaws.com/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123%3Ainference-profile%2Fus.x/converse-stream"
        );
        assert!(t.url("other", false).is_none());
        assert_eq!(
            default_base_url("eu-west-3"),
            "https://bedrock-runtime.eu-west-3.amazonaws.com"
        );
    }

    #[test]
    fn requests_are_signed_with_sigv4() {
        let uri = "https://bedrock-runtime.us-east-1.amazonaws.com/model/m/converse";
        for token in [None, Some("FwoGZXIvYXdzEXAMPLE")] {
            let t = Target::new(
                &keys(token),
                "https://bedrock-runtime.us-east-1.amazonaws.com",
                ["m"],
            )
            .unwrap();
            let mut req = Request::new(Bytes::from_static(b"{}"));
            *req.method_mut() = axum::http::Method::POST;
            *req.uri_mut() = uri.parse().unwrap();
            req.headers_mut()
                .insert("content-type", HeaderValue::from_static("application/json"));
            let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_764_930_000);
            t.sign(&mut req, at).unwrap();
            let auth = req.headers()["authorization"].to_str().unwrap();
            assert!(
                auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20251205/us-east-1/bedrock/aws4_request, SignedHeaders=content-type;host;x-amz-date"),
                "{auth}"
            );
            assert!(req.headers()["authorization"].is_sensitive());
            assert_eq!(req.headers()["x-amz-date"], "20251205T102000Z");
            assert_eq!(
                req.headers().get("x-amz-security-token").is_some(),
                token.is_some()
            );
            if token.is_some() {
                assert!(auth.contains("x-amz-security-token"), "{auth}");
            }
            let signature = auth.rsplit("Signature=").next().unwrap();
            assert_eq!(signature.len(), 64);
        }
    }

    #[test]
    fn the_error_type_comes_from_the_header_or_the_body() {
        use serde_json::json;
        let none = json!({"message": "x"});
        let rows: &[(Option<&str>, serde_json::Value, Option<&str>)] = &[
            (
                Some("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"),
                none.clone(),
                Some("ThrottlingException"),
            ),
            (
                Some("ValidationException"),
                none.clone(),
                Some("ValidationException"),
            ),
            (
                None,
                json!({"__type": "com.amazon.coral.service#UnrecognizedClientException", "message": "x"}),
                Some("UnrecognizedClientException"),
            ),
            (None, none, None),
        ];
        for (header, body, want) in rows {
            assert_eq!(error_type(*header, body), *want, "{header:?} {body}");
        }
    }
}
