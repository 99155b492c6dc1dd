//! How one request goes out to a provider and what a complete answer must be. OpenAI,
//! OpenRouter, Gemini (OpenAI-compatible endpoint) and any OpenAI-compatible URL share the OpenAI
//! adapter; Anthropic's Messages API has its own. Streams coming back are tapped in `sse.rs`.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::Credential;
use super::Provider;
pub use super::usage::UsageReport;

/// A proxied endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    ChatCompletions,
    /// `POST /v1/embeddings`.
    Embeddings,
    /// `POST /v1/messages` (Anthropic format).
    Messages,
}

impl Endpoint {
    /// Every endpoint, in declaration order (`self as usize` indexes it).
    pub const ALL: [Endpoint; 3] = [
        Endpoint::ChatCompletions,
        Endpoint::Embeddings,
        Endpoint::Messages,
    ];

    /// Path under the provider's base URL.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/chat/completions",
            Endpoint::Embeddings => "/embeddings",
            Endpoint::Messages => "/messages",
        }
    }

    /// Name in logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat.completions",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Messages => "messages",
        }
    }

    /// Whether a credential of `provider` can serve this endpoint: natively, or translated
    /// between chat and messages (`crate::translate`). Embeddings have no Anthropic counterpart,
    /// and Bedrock's are not spoken (Converse is chat only).
    pub fn served_by(self, provider: Provider) -> bool {
        match self {
            Endpoint::Embeddings => !provider.speaks_anthropic() && provider != Provider::Bedrock,
            Endpoint::ChatCompletions | Endpoint::Messages => true,
        }
    }
}

/// A JSON object's top-level fields, in the client's order, each value kept as the client wrote
/// it. The gateway reads and rewrites a few fields (`model`, `stream_options`) and forwards the
/// rest byte for byte, without building the nested values (a long conversation would be
/// thousands of allocations). A repeated key keeps its last value, as a JSON map does.
#[derive(Debug, Default)]
pub struct Fields(Vec<(String, Box<RawValue>)>);

impl Fields {
    /// The raw value of `key`.
    pub fn get(&self, key: &str) -> Option<&RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| &**v)
    }

    /// Whether the request asks for a stream (`"stream": true`).
    pub fn asks_stream(&self) -> bool {
        self.get("stream").is_some_and(|v| v.get() == "true")
    }

    /// Sets `key`: in place when present, else at the end.
    pub fn set(&mut self, key: String, value: Box<RawValue>) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => self.0.push((key, value)),
        }
    }

    /// The object as JSON, with `model` as its `model` field.
    pub fn to_json_with_model(&self, model: &str) -> Vec<u8> {
        let len: usize = self.0.iter().map(|(k, v)| k.len() + v.get().len() + 4).sum();
        let mut out = Vec::with_capacity(len + model.len() + 16);
        out.push(b'{');
        let mut has_model = false;
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_json_str(&mut out, k);
            out.push(b':');
            if k == "model" {
                has_model = true;
                write_json_str(&mut out, model);
            } else {
                out.extend_from_slice(v.get().as_bytes());
            }
        }
        if !has_model {
            if !self.0.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(b"\"model\":");
            write_json_str(&mut out, model);
        }
        out.push(b'}');
        out
    }
}

/// Appends `s` as a JSON string.
fn write_json_str(out: &mut Vec<u8>, s: &str) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(out, s);
}

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> serde::de::Visitor<'de> for Object {
            type Value = Fields;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
                let mut fields = Fields(Vec::with_capacity(map.size_hint().unwrap_or(8)));
                while let Some((k, v)) = map.next_entry::<String, Box<RawValue>>()? {
                    fields.set(k, v);
                }
                Ok(fields)
            }
        }
        d.deserialize_map(Object)
    }
}

/// The outgoing request for one attempt.
pub struct Outgoing {
    /// Full URL.
    pub url: axum::http::Uri,
    /// JSON body.
    pub body: Bytes,
    /// The `max_tokens` the gateway chose itself, the client having named none (a chat request
    /// translated for an Anthropic credential, which requires one), for the request log.
    pub max_tokens_chosen: Option<u64>,
}

/// Builds the attempt's request: the credential's URL for `endpoint`, and the client's JSON with
/// the upstream model name (the usage chunk of a stream is asked for before, by
/// [`request_stream_usage`]).
pub fn outgoing(endpoint: Endpoint, cred: &Credential, body: &Fields, upstream_model: &str) -> Outgoing {
    Outgoing {
        url: cred.url(endpoint, upstream_model).clone(),
        body: Bytes::from(body.to_json_with_model(upstream_model)),
        max_tokens_chosen: None,
    }
}

/// For an OpenAI-family stream: asks for the usage chunk; returns true when the client had not
/// asked for it (so the gateway removes it again).
pub fn request_stream_usage(body: &mut Fields) -> bool {
    // `stream_options` is an object or null (the body check refused anything else).
    let mut options: Map<String, Value> = body
        .get("stream_options")
        .and_then(|o| serde_json::from_str::<Option<Map<String, Value>>>(o.get()).ok())
        .flatten()
        .unwrap_or_default();
    if options.get("include_usage").and_then(Value::as_bool) == Some(true) {
        return false;
    }
    options.insert("include_usage".to_owned(), Value::Bool(true));
    match serde_json::value::to_raw_value(&options) {
        Ok(raw) => {
            body.set("stream_options".to_owned(), raw);
            true
        }
        Err(_) => false,
    }
}

/// The top-level fields that say what a complete answer is.
#[derive(Deserialize)]
struct AnswerShape<'a> {
    #[serde(borrow)]
    choices: Option<&'a RawValue>,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
    #[serde(borrow, rename = "type")]
    kind: Option<&'a RawValue>,
    /// Read here too, so that the body is parsed once: the usage counted comes from this, as
    /// sent ([`super::usage::UsageReport::read_raw`]).
    #[serde(default)]
    usage: Option<Box<RawValue>>,
}

/// Parses JSON text from bytes, its UTF-8 checked once for the whole text: serde_json's reader of
/// bytes checks every string and every raw value it keeps again (docs/performance.md). Text that
/// is not UTF-8 is parsed as bytes, for serde_json's own error and its position.
pub fn parse_json<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> serde_json::Result<T> {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(bytes),
    }
}

/// Checks that a complete (not streamed) answer is what `endpoint` promises (DESIGN.md §9): one
/// well-formed JSON object, whole, with the endpoint's defining field — `choices` (chat), `data`
/// (embeddings) as arrays, `content` as an array or `"type":"message"` (messages). Fields beyond
/// those are not looked at but `usage`, the answer's usage block, returned (`None` when absent or
/// `null`) for [`super::usage::UsageReport::read_raw`]: one parse of the body serves both. The error
/// says what is wrong without quoting the body.
pub fn check_answer(endpoint: Endpoint, body: &[u8]) -> Result<Option<Box<RawValue>>, String> {
    let Some(&first) = body.trim_ascii_start().first() else {
        return Err("an empty body".to_owned());
    };
    if first != b'{' {
        return Err(if first == b'<' {
            "not JSON (markup)".to_owned()
        } else if serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok() {
            "JSON, but not an object".to_owned()
        } else {
            "not JSON".to_owned()
        });
    }
    let shape: AnswerShape = parse_json(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Eof => "truncated JSON".to_owned(),
        // Position only: a serde message may quote the body.
        _ => format!("malformed JSON at line {} column {}", e.line(), e.column()),
    })?;
    let is_array = |v: Option<&RawValue>| v.is_some_and(|v| v.get().starts_with('['));
    let ok = match endpoint {
        Endpoint::ChatCompletions => is_array(shape.choices),
        Endpoint::Embeddings => is_array(shape.data),
        Endpoint::Messages => is_array(shape.content) || shape.kind.is_some_and(|k| k.get() == "\"message\""),
    };
    if ok {
        Ok(shape.usage)
    } else {
        Err(match endpoint {
            Endpoint::ChatCompletions => "a JSON object without a `choices` array",
            Endpoint::Embeddings => "a JSON object without a `data` array",
            Endpoint::Messages => "a JSON object that is not a message",
        }
        .to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_usage_is_requested_once() {
        let mut m: Fields = serde_json::from_str(r#"{"stream":true}"#).unwrap();
        assert!(request_stream_usage(&mut m));
        assert_eq!(
            m.get("stream_options").unwrap().get(),
            r#"{"include_usage":true}"#
        );
        let mut m: Fields =
            serde_json::from_str(r#"{"stream":true,"stream_options":{"include_usage":true}}"#).unwrap();
        assert!(!request_stream_usage(&mut m));
        // The client's other options stay; null becomes an object.
        let mut m: Fields = serde_json::from_str(r#"{"stream_options":{"x":1}}"#).unwrap();
        assert!(request_stream_usage(&mut m));
        assert_eq!(
            m.get("stream_options").unwrap().get(),
            r#"{"include_usage":true,"x":1}"#
        );
        let mut m: Fields = serde_json::from_str(r#"{"stream_options":null}"#).unwrap();
        assert!(request_stream_usage(&mut m));
        assert_eq!(
            m.get("stream_options").unwrap().get(),
            r#"{"include_usage":true}"#
        );
    }

    #[test]
    fn fields_forward_the_body_with_the_upstream_model() {
        let body = r#"{"model":"public","messages":[{"role":"user","content":"h\u00e9 \"x\""}], "n" : 2,"model":"last"}"#;
        let fields: Fields = serde_json::from_str(body).unwrap();
        assert_eq!(fields.get("model").unwrap().get(), r#""last""#);
        let out = String::from_utf8(fields.to_json_with_model("up/\"m\"")).unwrap();
        assert_eq!(
            out,
            r#"{"model":"up/\"m\"","messages":[{"role":"user","content":"h\u00e9 \"x\""}],"n":2}"#
        );
        let fields: Fields = serde_json::from_str(r#"{"a\nb":true}"#).unwrap();
        assert_eq!(
            String::from_utf8(fields.to_json_with_model("m")).unwrap(),
            r#"{"a\nb":true,"model":"m"}"#
        );
        assert!(serde_json::from_str::<Fields>("[1]").is_err());
    }

    #[test]
    fn endpoints_index_all() {
        for (i, e) in Endpoint::ALL.into_iter().enumerate() {
            assert_eq!(e as usize, i);
        }
    }

    #[test]
    fn complete_answers_must_be_the_endpoints_json() {
        use Endpoint::{ChatCompletions as Chat, Embeddings, Messages};
        let cases: &[(Endpoint, &str, Result<(), &str>)] = &[
            (
                Chat,
                r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}"#,
                Ok(()),
            ),
            (Chat, r#" {"choices":[],"extra":{"x":[1,2]}} "#, Ok(())),
            (Chat, "", Err("an empty body")),
            (Chat, "  \n", Err("an empty body")),
            (
                Chat,
                "<html><body><h1>502 Bad Gateway</h1></body></html>",
                Err("not JSON (markup)"),
            ),
            (
                Chat,
                r#"{"choices":[{"index":0,"message":{"#,
                Err("truncated JSON"),
            ),
            (Chat, "[1,2]", Err("JSON, but not an object")),
            (Chat, r#""ok""#, Err("JSON, but not an object")),
            (Chat, "null", Err("JSON, but not an object")),
            (Chat, "OK", Err("not JSON")),
            (
                Chat,
                "data: {\"choices\":[]}\n\ndata: [DONE]\n\n",
                Err("not JSON"),
            ),
            (
                Chat,
                r#"{"error":{"message":"upstream overloaded"}}"#,
                Err("a JSON object without a `choices` array"),
            ),
            (
                Chat,
                r#"{"choices":null}"#,
                Err("a JSON object without a `choices` array"),
            ),
            (Chat, r#"{"choices":[]} trailing"#, Err("malformed JSON")),
            (
                Embeddings,
                r#"{"object":"list","data":[{"embedding":[0.1]}]}"#,
                Ok(()),
            ),
            (
                Embeddings,
                r#"{"object":"list"}"#,
                Err("a JSON object without a `data` array"),
            ),
            (
                Messages,
                r#"{"id":"m","type":"message","content":[{"type":"text","text":"hi"}]}"#,
                Ok(()),
            ),
            (Messages, r#"{"type":"message"}"#, Ok(())),
            (
                Messages,
                r#"{"type":"error","error":{"type":"overloaded_error"}}"#,
                Err("a JSON object that is not a message"),
            ),
        ];
        for (endpoint, body, want) in cases {
            let got = check_answer(*endpoint, body.as_bytes()).map(|_| ());
            match (got, want) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(w)) => assert!(e.starts_with(w), "{body}: {e}"),
                (got, want) => panic!("{body}: got {got:?}, want {want:?}"),
            }
        }
    }
}
