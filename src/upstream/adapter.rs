//! How one request goes out to a provider and how its usage comes back. OpenAI, OpenRouter,
//! Gemini (OpenAI-compatible endpoint) and any OpenAI-compatible URL share the OpenAI adapter;
//! Anthropic's Messages API has its own. Streams are framed per SSE event and tapped for usage
//! and mid-stream errors as they pass; nothing is buffered beyond one event.

use std::sync::LazyLock;

use bytes::{Buf, Bytes, BytesMut};
use memchr::memmem::Finder;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::Provider;
use super::pool::Credential;
pub use super::usage::{Usage, UsageReport};

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

    /// Whether a credential of `provider` can serve this endpoint.
    pub fn served_by(self, provider: Provider) -> bool {
        match self {
            Endpoint::Messages => provider.speaks_anthropic(),
            Endpoint::ChatCompletions | Endpoint::Embeddings => !provider.speaks_anthropic(),
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
}

/// Builds the attempt's request: the credential's URL for `endpoint`, and the client's JSON with
/// the upstream model name (the usage chunk of a stream is asked for before, by
/// [`request_stream_usage`]).
pub fn outgoing(endpoint: Endpoint, cred: &Credential, body: &Fields, upstream_model: &str) -> Outgoing {
    Outgoing {
        url: cred.url(endpoint).clone(),
        body: Bytes::from(body.to_json_with_model(upstream_model)),
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

/// Watches a stream event by event: usage, delivered content chunks, mid-stream errors; and
/// removes what the gateway itself asked for (the extra usage chunk and `"usage":null` fields).
#[derive(Debug, Default)]
pub struct SseTap {
    anthropic: bool,
    strip_usage: bool,
    pending: BytesMut,
    /// Most tokens a call may report (`max_usage_tokens`).
    ceiling: u64,
    /// Usage reported by the upstream so far, as checked.
    pub usage: UsageReport,
    /// Content chunks forwarded to the client (an estimate of completion tokens).
    pub content_chunks: u64,
    /// A mid-stream error event passed to the client, with its message.
    pub error: Option<String>,
    /// Whether the stream ended properly (`[DONE]` or `message_stop`).
    pub finished: bool,
}

impl SseTap {
    /// A tap for this endpoint; usage blocks past `ceiling` tokens are invalid.
    pub fn new(endpoint: Endpoint, strip_usage: bool, ceiling: u64) -> Self {
        SseTap {
            anthropic: endpoint == Endpoint::Messages,
            strip_usage,
            ceiling,
            ..SseTap::default()
        }
    }

    /// Most tokens a call may report.
    pub fn ceiling(&self) -> u64 {
        self.ceiling
    }

    /// Feeds bytes from upstream; appends the complete events to forward to `out`. Events are
    /// framed in `chunk` itself; only an incomplete last event is kept back (copied) for the
    /// next chunk.
    pub fn feed(&mut self, chunk: &[u8], out: &mut BytesMut) {
        if self.pending.is_empty() {
            let rest = self.forward_events(chunk, out);
            self.pending.extend_from_slice(&chunk[rest..]);
        } else {
            let mut buf = std::mem::take(&mut self.pending);
            buf.extend_from_slice(chunk);
            let rest = self.forward_events(&buf, out);
            buf.advance(rest);
            self.pending = buf;
        }
    }

    /// Inspects and forwards each complete event of `buf`; returns where the incomplete rest
    /// starts.
    fn forward_events(&mut self, buf: &[u8], out: &mut BytesMut) -> usize {
        let mut at = 0;
        while let Some((end, sep)) = event_end(&buf[at..]) {
            self.inspect(&buf[at..at + end + sep], out);
            at += end + sep;
        }
        at
    }

    /// Appends whatever is left when the upstream ends (an unterminated last event) to `out`.
    pub fn finish(&mut self, out: &mut BytesMut) {
        let rest = std::mem::take(&mut self.pending);
        if !rest.iter().all(u8::is_ascii_whitespace) {
            self.inspect(&rest, out);
        }
    }

    fn inspect(&mut self, event: &[u8], out: &mut BytesMut) {
        if self.anthropic {
            if let Ok(text) = std::str::from_utf8(event) {
                self.inspect_anthropic(text);
            }
            out.extend_from_slice(event);
            return;
        }
        // Read as bytes: each search is one pass over the event, and nothing is decoded unless
        // it is parsed.
        let data = data_of(event);
        if data.trim_ascii() == b"[DONE]" {
            self.finished = true;
            out.extend_from_slice(event);
            return;
        }
        if NEEDLES.finish_error.find(data).is_some() || data.starts_with(b"{\"error\"") {
            self.error = Some(error_message(std::str::from_utf8(data).unwrap_or_default()));
        }
        if let Some(i) = NEEDLES.content.find(data)
            && NEEDLES.empty_content.find(&data[i..]).is_none()
        {
            self.content_chunks += 1;
        }
        // `"usage":` followed by an object (the usage chunk, perhaps) or by null.
        let (mut usage_object, mut usage_null) = (false, false);
        for i in NEEDLES.usage.find_iter(data) {
            let after = data[i + USAGE.len()..].trim_ascii_start();
            usage_object |= after.starts_with(b"{");
            usage_null |= after.starts_with(b"null");
        }
        let mut usage_chunk = false;
        if usage_object && let Ok(chunk) = serde_json::from_slice::<UsageChunk>(data) {
            if let Some(u) = chunk
                .usage
                .and_then(|u| serde_json::from_str::<Value>(u.get()).ok())
            {
                let read = UsageReport::read(Endpoint::ChatCompletions, &u, self.ceiling);
                self.usage.merge(read);
            }
            usage_chunk = chunk.choices.is_some_and(|c| {
                let c = c.get();
                c.starts_with('[') && c[1..].trim_start().starts_with(']')
            });
        }
        if self.strip_usage {
            if usage_chunk {
                return;
            }
            if usage_null && without_usage_null(event, out) {
                return;
            }
        }
        out.extend_from_slice(event);
    }

    fn inspect_anthropic(&mut self, text: &str) {
        let kind = text
            .lines()
            .find_map(|l| l.strip_prefix("event:"))
            .map(str::trim)
            .unwrap_or_default();
        match kind {
            "message_start" => {
                if let Ok(v) = serde_json::from_slice::<Value>(data_of(text.as_bytes()))
                    && let Some(u) = v.pointer("/message/usage")
                {
                    self.usage
                        .merge(UsageReport::read(Endpoint::Messages, u, self.ceiling));
                }
            }
            "message_delta" => {
                if let Ok(v) = serde_json::from_slice::<Value>(data_of(text.as_bytes()))
                    && let Some(u) = v.get("usage")
                {
                    self.usage.merge_anthropic_delta(u, self.ceiling);
                }
            }
            "content_block_delta" => self.content_chunks += 1,
            "message_stop" => self.finished = true,
            "error" => {
                let data = std::str::from_utf8(data_of(text.as_bytes())).unwrap_or_default();
                self.error = Some(error_message(data));
            }
            _ => {}
        }
    }
}

/// The end of the first complete event in `buf`: (index of the separator, its length), the
/// separator being a blank line (`\n\n` or `\r\n\r\n`).
fn event_end(buf: &[u8]) -> Option<(usize, usize)> {
    // Every separator holds a `\n`; at each, in order, look around it.
    for i in memchr::memchr_iter(b'\n', buf) {
        if i >= 1 && buf[i - 1] == b'\r' && buf[i + 1..].starts_with(b"\r\n") {
            return Some((i - 1, 4));
        }
        if buf.get(i + 1) == Some(&b'\n') {
            return Some((i, 2));
        }
    }
    None
}

/// The substrings an OpenAI-format event is searched for, each searcher built once.
struct Needles {
    finish_error: Finder<'static>,
    content: Finder<'static>,
    empty_content: Finder<'static>,
    usage: Finder<'static>,
    usage_null: Finder<'static>,
}

static NEEDLES: LazyLock<Needles> = LazyLock::new(|| Needles {
    finish_error: Finder::new(b"\"finish_reason\":\"error\""),
    content: Finder::new(b"\"content\":\""),
    empty_content: Finder::new(b"\"content\":\"\""),
    usage: Finder::new(USAGE),
    usage_null: Finder::new(USAGE_NULL),
});

const USAGE: &[u8] = b"\"usage\":";
const USAGE_NULL: &[u8] = b"\"usage\":null";

/// The two fields of a chunk that tell whether it is the usage chunk.
#[derive(Deserialize)]
struct UsageChunk<'a> {
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
    #[serde(borrow)]
    choices: Option<&'a RawValue>,
}

/// Appends `event` without its `"usage":null` fields (each with the comma joining it to a
/// neighbour) to `out`; false, having appended nothing, when it has none.
fn without_usage_null(event: &[u8], out: &mut BytesMut) -> bool {
    let Some(first) = NEEDLES.usage_null.find(event) else {
        return false;
    };
    let mut rest = event;
    let mut at = Some(first);
    while let Some(i) = at {
        let end = i + USAGE_NULL.len();
        if i > 0 && rest[i - 1] == b',' {
            out.extend_from_slice(&rest[..i - 1]);
            rest = &rest[end..];
        } else if rest.get(end) == Some(&b',') {
            out.extend_from_slice(&rest[..i]);
            rest = &rest[end + 1..];
        } else {
            // The object's only field: kept, as there is no comma to take with it.
            out.extend_from_slice(&rest[..end]);
            rest = &rest[end..];
        }
        at = NEEDLES.usage_null.find(rest);
    }
    out.extend_from_slice(rest);
    true
}

/// The `data:` payload of an event: its first data line (providers send one per event).
fn data_of(event: &[u8]) -> &[u8] {
    let mut rest = event;
    while !rest.is_empty() {
        let end = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
        if let Some(d) = rest[..end].strip_prefix(b"data:") {
            return d.strip_suffix(b"\r").unwrap_or(d).trim_ascii_start();
        }
        rest = rest.get(end + 1..).unwrap_or_default();
    }
    b""
}

fn error_message(data: &str) -> String {
    serde_json::from_str::<Value>(data)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "mid-stream error".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CEILING: u64 = 100_000_000;

    #[test]
    fn data_of_takes_the_first_data_line() {
        let cases: &[(&str, &str)] = &[
            ("data: {\"a\":1}", "{\"a\":1}"),
            ("data:{\"a\":1}\r", "{\"a\":1}"),
            ("event: message_start\ndata: {}\ndata: [x]", "{}"),
            ("event: ping\r\ndata:   [DONE]\r", "[DONE]"),
            (": comment\nid: 7", ""),
            ("", ""),
        ];
        for (event, data) in cases {
            assert_eq!(data_of(event.as_bytes()), data.as_bytes(), "{event:?}");
        }
    }

    fn feed_all(tap: &mut SseTap, parts: &[&str]) -> String {
        let mut out = BytesMut::new();
        for p in parts {
            tap.feed(p.as_bytes(), &mut out);
        }
        tap.finish(&mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn openai_usage_chunk_is_read_and_stripped_when_injected() {
        let events = [
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"total_tokens\":9}}\n\n",
            "data: [DONE]\n\n",
        ];
        let joined = events.concat();
        // Split at awkward places: the tap must frame events itself.
        let parts: Vec<&str> = vec![&joined[..10], &joined[10..95], &joined[95..]];
        let mut tap = SseTap::new(Endpoint::ChatCompletions, true, CEILING);
        let out = feed_all(&mut tap, &parts);
        assert_eq!(
            tap.usage,
            UsageReport::Valid(Usage {
                prompt: 7,
                completion: 2
            })
        );
        assert!(!out.contains("usage"), "{out}");
        assert!(out.contains("\"content\":\"Hi\""));
        assert!(out.ends_with("data: [DONE]\n\n"));
        assert!(tap.finished);
        assert_eq!(tap.content_chunks, 1);

        let mut tap = SseTap::new(Endpoint::ChatCompletions, false, CEILING);
        let out = feed_all(&mut tap, &[&joined]);
        assert_eq!(
            out, joined,
            "a client that asked for usage gets the stream untouched"
        );
        assert_eq!(
            tap.usage,
            UsageReport::Valid(Usage {
                prompt: 7,
                completion: 2
            })
        );
    }

    #[test]
    fn events_end_at_the_first_blank_line() {
        let cases: &[(&str, Option<(usize, usize)>)] = &[
            ("", None),
            ("data: x", None),
            ("data: x\n", None),
            ("data: x\r\n\r", None),
            ("data: x\n\n", Some((7, 2))),
            ("data: x\r\n\r\ndata: y\n\n", Some((7, 4))),
            ("a\nb\n\nc\r\n\r\n", Some((3, 2))),
            ("a\r\nb\r\n\r\n", Some((4, 4))),
            ("\n\n", Some((0, 2))),
        ];
        for (buf, want) in cases {
            assert_eq!(event_end(buf.as_bytes()), *want, "{buf:?}");
        }
    }

    #[test]
    fn usage_null_fields_are_removed_with_their_comma() {
        let cases: &[(&str, Option<&str>)] = &[
            (r#"data: {"a":1}"#, None),
            (r#"data: {"a":1,"usage":null}"#, Some(r#"data: {"a":1}"#)),
            (r#"data: {"usage":null,"a":1}"#, Some(r#"data: {"a":1}"#)),
            (
                r#"data: {"a":1,"usage":null,"b":2}"#,
                Some(r#"data: {"a":1,"b":2}"#),
            ),
            (r#"data: {"usage":null}"#, Some(r#"data: {"usage":null}"#)),
            (
                r#"data: {"x":{"usage":null},"usage":null}"#,
                Some(r#"data: {"x":{"usage":null}}"#),
            ),
        ];
        for (event, want) in cases {
            let mut out = BytesMut::new();
            let changed = without_usage_null(event.as_bytes(), &mut out);
            assert_eq!(
                changed.then(|| std::str::from_utf8(&out).unwrap()),
                *want,
                "{event}"
            );
            assert_eq!(changed, !out.is_empty());
        }
    }

    #[test]
    fn any_split_of_a_stream_gives_the_same_output() {
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\r\n\r\n\
                      data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":null}\n\n\
                      data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\n\
                      data: [DONE]\n\n";
        let whole = feed_all(
            &mut SseTap::new(Endpoint::ChatCompletions, true, CEILING),
            &[stream],
        );
        assert_eq!(
            whole,
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\n\
             data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n\
             data: [DONE]\n\n"
        );
        for size in 1..8 {
            let parts: Vec<&str> = stream
                .as_bytes()
                .chunks(size)
                .map(|c| std::str::from_utf8(c).unwrap())
                .collect();
            let mut tap = SseTap::new(Endpoint::ChatCompletions, true, CEILING);
            assert_eq!(feed_all(&mut tap, &parts), whole, "chunks of {size}");
            assert_eq!(
                tap.usage,
                UsageReport::Valid(Usage {
                    prompt: 4,
                    completion: 2
                })
            );
            assert_eq!((tap.content_chunks, tap.finished), (2, true));
        }
        // An unterminated last event still goes out at the end.
        let mut tap = SseTap::new(Endpoint::ChatCompletions, false, CEILING);
        assert_eq!(
            feed_all(&mut tap, &["data: {\"a\":1}\n\ndata: {\"b\""]),
            "data: {\"a\":1}\n\ndata: {\"b\""
        );
    }

    #[test]
    fn mid_stream_errors_are_noticed() {
        let mut tap = SseTap::new(Endpoint::ChatCompletions, false, CEILING);
        feed_all(
            &mut tap,
            &["data: {\"error\":{\"message\":\"boom\"},\"choices\":[{\"finish_reason\":\"error\"}]}\n\n"],
        );
        assert_eq!(tap.error.as_deref(), Some("boom"));
        let mut tap = SseTap::new(Endpoint::Messages, false, CEILING);
        feed_all(
            &mut tap,
            &[
                "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
            ],
        );
        assert_eq!(tap.error.as_deref(), Some("Overloaded"));
    }

    #[test]
    fn anthropic_usage_from_start_and_delta() {
        let mut tap = SseTap::new(Endpoint::Messages, false, CEILING);
        let s = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"cache_read_input_tokens\":3,\"output_tokens\":1}}}\r\n\r\n\
                 event: content_block_delta\ndata: {\"delta\":{\"text\":\"a\"}}\n\n\
                 event: message_delta\ndata: {\"usage\":{\"output_tokens\":9}}\n\n\
                 event: message_stop\ndata: {}\n\n";
        let out = feed_all(&mut tap, &[s]);
        assert_eq!(out, s);
        assert_eq!(
            tap.usage,
            UsageReport::Valid(Usage {
                prompt: 15,
                completion: 9
            })
        );
        assert_eq!(tap.content_chunks, 1);
        assert!(tap.finished);
    }

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
}
