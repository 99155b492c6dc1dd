//! Reading and checking a proxied request body: size limit, JSON, and the fields the gateway
//! needs, each refusal naming the field.

use axum::body::Body;
use axum::http::HeaderMap;
use serde_json::value::RawValue;

use crate::deadline::Deadline;
use crate::error::ApiError;
use crate::provider::adapter::{self, Endpoint, Fields};

/// A checked request body.
#[derive(Debug)]
pub struct ProxyBody {
    /// The JSON object's fields, forwarded with the model rewritten.
    pub fields: Fields,
    /// The public model asked for.
    pub model: String,
    /// Whether a stream was asked for.
    pub stream: bool,
    /// Size of the body in bytes.
    pub len: usize,
}

/// Reads at most `limit` bytes (413 beyond), all of them by `deadline` (408 beyond), and checks
/// the body for `endpoint`.
pub async fn read(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    deadline: Deadline,
    endpoint: Endpoint,
) -> Result<ProxyBody, ApiError> {
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::RequestTooLarge { limit });
    }
    // A client that announces a body and never finishes it must not hold a request open.
    let read = deadline
        .bound(axum::body::to_bytes(body, limit))
        .await
        .ok_or_else(|| ApiError::from(&deadline))?;
    let bytes = read.map_err(|e| {
        if is_length_limit(&e) {
            ApiError::RequestTooLarge { limit }
        } else {
            ApiError::invalid(format!("could not read the request body: {e}"), None)
        }
    })?;
    parse(&bytes, endpoint)
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// Checks a body already read. Nested values are validated as JSON but not built: only the
/// fields checked here are read, each from its raw text.
pub fn parse(bytes: &[u8], endpoint: Endpoint) -> Result<ProxyBody, ApiError> {
    if bytes.is_empty() {
        return Err(ApiError::invalid(
            "the request body is empty; expected a JSON object",
            None,
        ));
    }
    let fields: Fields = adapter::parse_json(bytes).map_err(|e| match e.classify() {
        // Well-formed JSON of another type than an object (an array, a string, a number).
        serde_json::error::Category::Data => {
            ApiError::invalid("the request body must be a JSON object", None)
        }
        _ => ApiError::invalid(format!("the request body is not valid JSON: {e}"), None),
    })?;
    // Bodies are forwarded as their raw text, which serde_json checks for UTF-8 but not for
    // escapes that decode to no character: refuse those the same way as raw invalid UTF-8.
    if let Some(at) = lone_surrogate_escape(bytes) {
        let (line, column) = line_column(bytes, at);
        return Err(ApiError::invalid(
            format!(
                "the request body is not valid JSON: lone surrogate in string escape `{}` \
                 at line {line} column {column}",
                String::from_utf8_lossy(bytes.get(at..at + 6).unwrap_or_default())
            ),
            None,
        ));
    }
    let model = match fields.get("model").map(value_as::<String>) {
        Some(Some(m)) if !m.trim().is_empty() => m,
        Some(Some(_)) => return Err(ApiError::invalid("`model` must not be empty", Some("model"))),
        Some(None) => return Err(ApiError::invalid("`model` must be a string", Some("model"))),
        None => return Err(ApiError::invalid("missing required field `model`", Some("model"))),
    };
    let stream = match fields.get("stream").map(value_as::<Option<bool>>) {
        None => false,
        Some(Some(b)) => b.unwrap_or(false),
        Some(None) => return Err(ApiError::invalid("`stream` must be a boolean", Some("stream"))),
    };
    match endpoint {
        Endpoint::ChatCompletions | Endpoint::Messages => match fields.get("messages") {
            Some(v) if starts(v, b'[') => {
                let (count, not_object) = elements(v.get().as_bytes());
                if count == 0 {
                    return Err(ApiError::invalid(
                        "`messages` must not be empty",
                        Some("messages"),
                    ));
                }
                if let Some(i) = not_object {
                    return Err(ApiError::invalid(
                        format!("`messages[{i}]` must be an object"),
                        Some("messages"),
                    ));
                }
            }
            Some(_) => return Err(ApiError::invalid("`messages` must be an array", Some("messages"))),
            None => {
                return Err(ApiError::invalid(
                    "missing required field `messages`",
                    Some("messages"),
                ));
            }
        },
        Endpoint::Embeddings => {
            if stream {
                return Err(ApiError::invalid("embeddings cannot be streamed", Some("stream")));
            }
            match fields.get("input") {
                Some(v) if starts(v, b'"') || starts(v, b'[') => {}
                Some(_) => {
                    return Err(ApiError::invalid(
                        "`input` must be a string or an array",
                        Some("input"),
                    ));
                }
                None => return Err(ApiError::invalid("missing required field `input`", Some("input"))),
            }
        }
    }
    if endpoint == Endpoint::Messages && fields.get("max_tokens").and_then(value_as::<u64>).is_none() {
        return Err(ApiError::invalid(
            "missing or invalid `max_tokens` (a positive integer)",
            Some("max_tokens"),
        ));
    }
    if endpoint == Endpoint::ChatCompletions
        && let Some(o) = fields.get("stream_options")
        && !starts(o, b'{')
        && o.get() != "null"
    {
        return Err(ApiError::invalid(
            "`stream_options` must be an object",
            Some("stream_options"),
        ));
    }
    Ok(ProxyBody {
        fields,
        model,
        stream,
        len: bytes.len(),
    })
}

/// The byte offset of the first `\uXXXX` escape in well-formed JSON text that is half of a
/// UTF-16 surrogate pair without its other half (a high one not directly followed by a low one,
/// or a low one alone).
///
/// Ordinary bodies pay one `memmem` pass: the escape-by-escape walk runs only when some `\u`
/// is followed by `d8`–`df` (any case).
fn lone_surrogate_escape(json: &[u8]) -> Option<usize> {
    let looks_like_surrogate = |at: usize| {
        matches!(json.get(at + 2), Some(b'd' | b'D'))
            && matches!(json.get(at + 3), Some(b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F'))
    };
    // Built once: a searcher made at each call cost about 200 instructions a request.
    static ESCAPE_U: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\\u"));
    if !ESCAPE_U.find_iter(json).any(looks_like_surrogate) {
        return None;
    }
    // In well-formed JSON a backslash occurs only inside a string, and each one starts an
    // escape: `\uXXXX` (6 bytes) or a two-byte one such as `\\` or `\"`.
    let mut from = 0;
    // A high surrogate escape at `.0` whose low half must be the escape starting at `.1`.
    let mut awaiting_low: Option<(usize, usize)> = None;
    while let Some(found) = json.get(from..).and_then(|rest| memchr::memchr(b'\\', rest)) {
        let at = from + found;
        let unit = (json.get(at + 1) == Some(&b'u'))
            .then(|| json.get(at + 2..at + 6).and_then(hex_code_unit))
            .flatten();
        from = at + if unit.is_some() { 6 } else { 2 };
        match awaiting_low.take() {
            Some((_, next)) if next == at && matches!(unit, Some(0xDC00..=0xDFFF)) => continue,
            Some((high, _)) => return Some(high),
            None => {}
        }
        match unit {
            Some(0xD800..=0xDBFF) => awaiting_low = Some((at, from)),
            Some(0xDC00..=0xDFFF) => return Some(at),
            _ => {}
        }
    }
    awaiting_low.map(|(high, _)| high)
}

/// Four hex digits as a UTF-16 code unit.
fn hex_code_unit(digits: &[u8]) -> Option<u16> {
    if digits.len() != 4 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|d| u16::from_str_radix(d, 16).ok())
}

/// The 1-based line and column (in bytes) of `offset`, for an error message.
fn line_column(text: &[u8], offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = 1 + memchr::memchr_iter(b'\n', before).count();
    let column = offset - memchr::memrchr(b'\n', before).map_or(0, |nl| nl + 1) + 1;
    (line, column)
}

/// Of a JSON array's text, already checked as well-formed JSON by the parse: how many elements it
/// has, and the index of the first that is not an object. A scan for the array's own commas
/// (strings skipped to their closing quote, nesting counted), instead of a second parse of the
/// whole text: `messages` is most of a body.
fn elements(array: &[u8]) -> (usize, Option<usize>) {
    let (mut count, mut not_object) = (0, None);
    let mut depth = 0usize;
    let mut element_next = false;
    let mut i = 0;
    while let Some(&b) = array.get(i) {
        if element_next && !b.is_ascii_whitespace() {
            element_next = false;
            if b != b']' {
                if b != b'{' && not_object.is_none() {
                    not_object = Some(count);
                }
                count += 1;
            }
        }
        match b {
            b'"' => {
                // To the closing quote: the next one not escaped.
                i += 1;
                while let Some(at) = memchr::memchr2(b'"', b'\\', &array[i.min(array.len())..]) {
                    if array[i + at] == b'"' {
                        i += at;
                        break;
                    }
                    i += at + 2;
                }
            }
            b'[' | b'{' => {
                depth += 1;
                element_next = depth == 1;
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b',' if depth == 1 => element_next = true,
            _ => {}
        }
        i += 1;
    }
    (count, not_object)
}

/// A raw value read as `T`, if it is one.
fn value_as<'a, T: serde::Deserialize<'a>>(v: &'a RawValue) -> Option<T> {
    serde_json::from_str(v.get()).ok()
}

/// Whether a raw value's text starts with `c` (`{` an object, `[` an array, `"` a string).
fn starts(v: &RawValue, c: u8) -> bool {
    v.get().as_bytes().first() == Some(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_bodies_name_the_field() {
        let chat = Endpoint::ChatCompletions;
        let cases: &[(Endpoint, &str, Option<&str>, &str)] = &[
            (chat, "", None, "empty"),
            (chat, "{", None, "not valid JSON"),
            (chat, "[1]", None, "JSON object"),
            (chat, "\"x\"", None, "JSON object"),
            (
                chat,
                r#"{"messages":[{"role":"user","content":"x"}]}"#,
                Some("model"),
                "missing required field `model`",
            ),
            (
                chat,
                r#"{"model":5,"messages":[]}"#,
                Some("model"),
                "must be a string",
            ),
            (
                chat,
                r#"{"model":" ","messages":[]}"#,
                Some("model"),
                "must not be empty",
            ),
            (
                chat,
                r#"{"model":"m"}"#,
                Some("messages"),
                "missing required field `messages`",
            ),
            (
                chat,
                r#"{"model":"m","messages":"hi"}"#,
                Some("messages"),
                "must be an array",
            ),
            (
                chat,
                r#"{"model":"m","messages":[]}"#,
                Some("messages"),
                "must not be empty",
            ),
            (
                chat,
                r#"{"model":"m","messages":[1]}"#,
                Some("messages"),
                "messages[0]",
            ),
            (
                chat,
                r#"{"model":"m","messages":[{}],"stream":"yes"}"#,
                Some("stream"),
                "boolean",
            ),
            (
                chat,
                r#"{"model":"m","messages":[{}],"stream_options":3}"#,
                Some("stream_options"),
                "object",
            ),
            (Endpoint::Embeddings, r#"{"model":"m"}"#, Some("input"), "`input`"),
            (
                Endpoint::Embeddings,
                r#"{"model":"m","input":5}"#,
                Some("input"),
                "string or an array",
            ),
            (
                Endpoint::Embeddings,
                r#"{"model":"m","input":"x","stream":true}"#,
                Some("stream"),
                "cannot be streamed",
            ),
            (
                Endpoint::Messages,
                r#"{"model":"m","messages":[{}]}"#,
                Some("max_tokens"),
                "max_tokens",
            ),
        ];
        for (endpoint, body, param, needle) in cases {
            let err = parse(body.as_bytes(), *endpoint).expect_err(body);
            let json = err.body();
            assert_eq!(err.status(), 400, "{body}");
            assert_eq!(json["error"]["code"], "invalid_request_error");
            assert_eq!(json["error"]["param"].as_str(), *param, "{body}");
            assert!(err.to_string().contains(needle), "{body}: {err}");
        }
    }

    /// Every lone surrogate escape is refused like raw invalid UTF-8; pairs and escaped
    /// backslashes that merely look like escapes pass.
    #[test]
    fn lone_surrogate_escapes_are_refused_like_invalid_utf8() {
        let cases: &[(&str, bool)] = &[
            (r#""\ud800""#, true),
            (r#""\udfff""#, true),
            (r#""\uDBFF""#, true),
            (r#""\uDc00""#, true),
            (r#""x\ud800y""#, true),
            (r#""\ud800\u0041""#, true),
            (r#""\ud800\n""#, true),
            (r#""\ud800\ud800\udc00""#, true),
            (r#""\ud83d\ude00\ud83d""#, true),
            (r#""\udc00\ud800""#, true),
            (r#"["\ud800","\udc00"]"#, true),
            (r#""\\\ud800""#, true),
            (r#""\ud83d\ude00""#, false),
            (r#""\uD83D\uDE00""#, false),
            (r#""\ud800\udc00\udbff\udfff""#, false),
            (r#""\\ud800""#, false),
            (r#""\\\\ud800 \\udfff""#, false),
            (r#""\u00e9\ud7ff\ue000\n\"\\""#, false),
            (r#""plain""#, false),
        ];
        let raw_utf8 = parse(
            b"{\"model\":\"m\",\"messages\":[{\"content\":\"\xed\xa0\x80\"}]}",
            Endpoint::ChatCompletions,
        )
        .expect_err("raw invalid UTF-8");
        for (content, refused) in cases {
            let body = format!(r#"{{"model":"m","messages":[{{"content":{content}}}]}}"#);
            let got = parse(body.as_bytes(), Endpoint::ChatCompletions);
            match (got, refused) {
                (Ok(_), false) => {}
                (Err(e), true) => {
                    assert_eq!(
                        (
                            e.status(),
                            e.body()["error"]["code"].clone(),
                            e.body()["error"]["param"].clone()
                        ),
                        (
                            raw_utf8.status(),
                            raw_utf8.body()["error"]["code"].clone(),
                            raw_utf8.body()["error"]["param"].clone()
                        ),
                        "{content}"
                    );
                    let message = e.to_string();
                    assert!(
                        message.starts_with("the request body is not valid JSON: ")
                            && message.contains("surrogate")
                            && message.contains("at line 1 column "),
                        "{content}: {message}"
                    );
                }
                (got, _) => panic!("{content}: expected refused = {refused}, got {got:?}"),
            }
        }
        // A surrogate in a field name, and one on a later line, name their place too.
        let e = parse(b"{\"model\":\"m\",\n\"\\udfff\":1}", Endpoint::ChatCompletions).unwrap_err();
        assert!(
            e.to_string().starts_with("the request body is not valid JSON: "),
            "{e}"
        );
        let e = parse(
            b"{\"model\":\"m\",\n  \"messages\":[{\"content\":\"\\ud800\"}]}",
            Endpoint::ChatCompletions,
        )
        .unwrap_err();
        assert!(e.to_string().ends_with("at line 2 column 27"), "{e}");
    }

    #[test]
    fn good_bodies() {
        let b = parse(
            br#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}"#,
            Endpoint::ChatCompletions,
        )
        .unwrap();
        assert_eq!((b.model.as_str(), b.stream), ("m", true));
        let b = parse(br#"{"model":"e","input":["a","b"]}"#, Endpoint::Embeddings).unwrap();
        assert!(!b.stream);
        assert!(
            parse(
                br#"{"model":"c","max_tokens":5,"messages":[{}]}"#,
                Endpoint::Messages
            )
            .is_ok()
        );
    }

    #[test]
    fn an_arrays_elements_are_counted_from_its_text() {
        let cases: &[(&str, usize, Option<usize>)] = &[
            ("[]", 0, None),
            (" [ \n ] ", 0, None),
            ("[{}]", 1, None),
            ("[ {\"a\":[1,2,{\"b\":\"],[{,\"}]} , {} ]", 2, None),
            ("[{},1]", 2, Some(1)),
            ("[\"{\",{}]", 2, Some(0)),
            ("[{\"c\":\"\\\"],\\\\\"},[{}],{}]", 3, Some(1)),
            ("[{\"e\":\"\\\\\"},\"x\\\\\",null]", 3, Some(1)),
            ("[[],[]]", 2, Some(0)),
        ];
        for (text, count, not_object) in cases {
            assert_eq!(elements(text.as_bytes()), (*count, *not_object), "{text}");
            let parsed: Vec<&RawValue> = serde_json::from_str(text).unwrap();
            assert_eq!(parsed.len(), *count, "{text}");
        }
    }

    mod properties {
        //! The body check reads untrusted bytes: it never panics, refuses with a 400 or accepts,
        //! and accepts every well-formed body whatever its content.

        use super::*;
        use proptest::prelude::*;
        use serde_json::{Value, json};

        /// Any JSON value, nested a few levels.
        fn json_value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
                "\\PC{0,20}".prop_map(Value::String),
            ];
            leaf.prop_recursive(3, 32, 6, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    prop::collection::btree_map("\\PC{0,8}", inner, 0..6)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn endpoint() -> impl Strategy<Value = Endpoint> {
            prop::sample::select(Endpoint::ALL.to_vec())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            #[test]
            fn prop_body_any_bytes_are_refused_or_accepted(
                bytes in prop::collection::vec(any::<u8>(), 0..512),
                endpoint in endpoint(),
            ) {
                if let Err(e) = parse(&bytes, endpoint) {
                    prop_assert_eq!(e.status(), 400);
                }
            }

            #[test]
            fn prop_body_elements_agree_with_a_parse(items in prop::collection::vec(json_value(), 0..6)) {
                let text = serde_json::to_string(&items).unwrap();
                let not_object = items.iter().position(|v| !v.is_object());
                prop_assert_eq!(elements(text.as_bytes()), (items.len(), not_object), "{}", text);
                let pretty = serde_json::to_string_pretty(&items).unwrap();
                prop_assert_eq!(elements(pretty.as_bytes()), (items.len(), not_object), "{}", pretty);
            }

            #[test]
            fn prop_body_any_json_is_refused_or_accepted(value in json_value(), endpoint in endpoint()) {
                let bytes = serde_json::to_vec(&value).unwrap();
                match parse(&bytes, endpoint) {
                    Ok(b) => prop_assert_eq!(Some(b.model.as_str()), value["model"].as_str()),
                    Err(e) => prop_assert_eq!(e.status(), 400),
                }
            }

            #[test]
            fn prop_body_well_formed_bodies_are_accepted(
                model in "\\PC{0,30}[a-z]\\PC{0,30}",
                messages in prop::collection::vec(
                    prop::collection::btree_map("\\PC{0,8}", json_value(), 0..4), 1..4),
                stream in proptest::option::of(proptest::option::of(any::<bool>())),
                options in proptest::option::of(proptest::option::of(
                    prop::collection::btree_map("\\PC{0,8}", json_value(), 0..3))),
                extra in prop::collection::btree_map("x_\\PC{0,8}", json_value(), 0..4),
                max_tokens in 1u64..u64::MAX,
                input in prop_oneof![
                    "\\PC{0,40}".prop_map(Value::String),
                    prop::collection::vec(json_value(), 0..4).prop_map(Value::Array),
                ],
                endpoint in endpoint(),
            ) {
                let mut body: serde_json::Map<String, Value> = extra.into_iter().collect();
                body.insert("model".into(), json!(model));
                match endpoint {
                    Endpoint::Embeddings => {
                        body.insert("input".into(), input);
                    }
                    _ => {
                        body.insert("messages".into(), json!(messages));
                        if let Some(s) = stream {
                            body.insert("stream".into(), json!(s));
                        }
                    }
                }
                if endpoint == Endpoint::Messages {
                    body.insert("max_tokens".into(), json!(max_tokens));
                }
                if endpoint == Endpoint::ChatCompletions && let Some(o) = options {
                    body.insert("stream_options".into(), json!(o));
                }
                let bytes = serde_json::to_vec(&body).unwrap();
                let checked = parse(&bytes, endpoint);
                prop_assert!(checked.is_ok(), "{:?}: {}", checked.err(), String::from_utf8_lossy(&bytes));
                let checked = checked.unwrap();
                prop_assert_eq!(checked.model, model);
                let streamed = endpoint != Endpoint::Embeddings && stream.flatten() == Some(true);
                prop_assert_eq!(checked.stream, streamed);
                prop_assert_eq!(checked.fields.asks_stream(), streamed);
                prop_assert_eq!(checked.len, bytes.len());
            }
        }
    }
}
