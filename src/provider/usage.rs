//! Usage an upstream reports, checked before anything counts it: an upstream is not trusted.
//!
//! A usage block is valid when every count in it is a whole number from 0 to the ceiling
//! (`max_usage_tokens`), the counts together stay within the ceiling too, and `total_tokens`,
//! when given, is not below its parts. Anything else — a negative or fractional count, a string,
//! a count past the ceiling, a total smaller than its parts, a block that is not an object, a
//! missing required count — is [`UsageReport::Invalid`]. An invalid or missing block is never
//! counted: the caller counts the gateway's own [`estimate`] instead (the one it makes for a
//! stream cut short), logs the request as estimated, and warns about an invalid one. Every
//! figure that leaves this module is within the ceiling, so nothing downstream can overflow.

use std::borrow::Cow;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::adapter::Endpoint;
use crate::kernel::usage::Usage;

/// What an answer said about its usage.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum UsageReport {
    /// No usage block (or `null`).
    #[default]
    Missing,
    /// A block that passed every check.
    Valid(Usage),
    /// A block that failed a check, and which check.
    Invalid(String),
}

impl UsageReport {
    /// Reads one usage block of an answer to `endpoint`.
    pub fn read(endpoint: Endpoint, usage: &Value, ceiling: u64) -> UsageReport {
        if usage.is_null() {
            return UsageReport::Missing;
        }
        Self::checked(endpoint, Counts::of(usage, ceiling))
    }

    /// [`UsageReport::read`] of a usage block as the upstream sent it: its fields are looked up
    /// without building the block (no key nor nested object copied), only the counts read are
    /// parsed. A block whose field names are escaped is read as a whole, the same.
    pub fn read_raw(endpoint: Endpoint, usage: &RawValue, ceiling: u64) -> UsageReport {
        match serde_json::from_str::<RawFields<'_>>(usage.get()) {
            Ok(fields) => Self::checked(
                endpoint,
                Ok(Counts {
                    fields: Fields::Raw(fields),
                    ceiling,
                }),
            ),
            Err(_) => match serde_json::from_str::<Value>(usage.get()) {
                Ok(value) => Self::read(endpoint, &value, ceiling),
                // A raw value is well-formed JSON: not reached.
                Err(_) => UsageReport::Invalid("usage is not JSON".to_owned()),
            },
        }
    }

    fn checked(endpoint: Endpoint, counts: Result<Counts<'_>, String>) -> UsageReport {
        let read = counts.and_then(|c| match endpoint {
            Endpoint::Messages => read_anthropic(&c),
            Endpoint::ChatCompletions | Endpoint::Embeddings => read_openai(&c, endpoint),
        });
        match read {
            Ok(u) => UsageReport::Valid(u),
            Err(why) => UsageReport::Invalid(why),
        }
    }

    /// The usage, if the report is valid.
    pub fn valid(&self) -> Option<Usage> {
        match self {
            UsageReport::Valid(u) => Some(*u),
            _ => None,
        }
    }

    /// Why the report was refused, if it was.
    pub fn invalid_reason(&self) -> Option<&str> {
        match self {
            UsageReport::Invalid(why) => Some(why),
            _ => None,
        }
    }

    /// Takes in a later usage block of the same answer (a stream may report several): the latest
    /// valid one wins, but one invalid block discredits the answer's usage for good.
    pub fn merge(&mut self, later: UsageReport) {
        match (&*self, later) {
            (UsageReport::Invalid(_), _) | (_, UsageReport::Missing) => {}
            (_, later) => *self = later,
        }
    }

    /// Takes in the usage of an Anthropic `message_delta` event: the output tokens so far, which
    /// replace the completion of the `message_start` usage. Without a `message_start` usage
    /// there is nothing to complete (the answer's usage stays missing).
    pub fn merge_anthropic_delta(&mut self, usage: &Value, ceiling: u64) {
        let UsageReport::Valid(current) = self else {
            return;
        };
        let prompt = current.prompt;
        let output = Counts::of(usage, ceiling).and_then(|c| {
            let output = c.optional("output_tokens")?;
            if let Some(o) = output {
                c.sum("input and output tokens", &[prompt, o])?;
            }
            Ok(output)
        });
        match output {
            Ok(Some(o)) => current.completion = o,
            Ok(None) => {}
            Err(why) => *self = UsageReport::Invalid(why),
        }
    }
}

/// The usage of a complete (not streamed) answer: missing when the body has none (or is not a
/// JSON object). The request path reads it with the answer's check (`adapter::check_answer`),
/// in the same parse; this is the same reading alone, for the tests.
#[cfg(test)]
pub fn of_body(endpoint: Endpoint, body: &[u8], ceiling: u64) -> UsageReport {
    #[derive(serde::Deserialize)]
    struct WithUsage {
        #[serde(default)]
        usage: Option<Value>,
    }
    match serde_json::from_slice::<WithUsage>(body) {
        Ok(WithUsage { usage: Some(u) }) => UsageReport::read(endpoint, &u, ceiling),
        _ => UsageReport::Missing,
    }
}

/// Bytes of text counted as one token by the estimates.
pub const BYTES_PER_TOKEN: u64 = 4;

/// Tokens of `bytes` bytes of text, rounded up.
pub fn tokens_of_bytes(bytes: u64) -> u64 {
    bytes.div_ceil(BYTES_PER_TOKEN)
}

/// The gateway's own count of a call whose usage was not validly reported (or was cut short):
/// the prompt a valid report gave, else one token per [`BYTES_PER_TOKEN`] bytes of the request;
/// the completion delivered (`delivered`: one token per streamed content chunk, or the answer's
/// text by [`answer_tokens`]), or a valid report's if larger. Within the ceiling.
pub fn estimate(request_len: usize, delivered: u64, reported: &UsageReport, ceiling: u64) -> Usage {
    let valid = reported.valid();
    Usage {
        prompt: valid.map_or_else(|| tokens_of_bytes(request_len as u64), |u| u.prompt),
        completion: delivered.max(valid.map_or(0, |u| u.completion)),
    }
    .capped(ceiling)
}

/// Estimated completion tokens of a whole answer, from the bytes of its text: every string of
/// each choice's message but its role (chat), of the content blocks but their types
/// (messages); none for embeddings. A body that is not JSON counts whole.
pub fn answer_tokens(endpoint: Endpoint, body: &[u8]) -> u64 {
    if endpoint == Endpoint::Embeddings {
        return 0;
    }
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return tokens_of_bytes(body.len() as u64);
    };
    let bytes = match endpoint {
        Endpoint::ChatCompletions => v["choices"].as_array().map_or(0, |choices| {
            choices
                .iter()
                .map(|c| text_bytes(&c["message"], "role"))
                .fold(0, u64::saturating_add)
        }),
        Endpoint::Messages => text_bytes(&v["content"], "type"),
        Endpoint::Embeddings => 0,
    };
    tokens_of_bytes(bytes)
}

/// Bytes of every string in `v`, but under the key `skip`. (Recursion is bounded: serde_json
/// refuses JSON nested deeper than 128.)
fn text_bytes(v: &Value, skip: &str) -> u64 {
    match v {
        Value::String(s) => s.len() as u64,
        Value::Array(a) => a.iter().map(|x| text_bytes(x, skip)).fold(0, u64::saturating_add),
        Value::Object(o) => o
            .iter()
            .filter(|(k, _)| *k != skip)
            .map(|(_, x)| text_bytes(x, skip))
            .fold(0, u64::saturating_add),
        _ => 0,
    }
}

/// OpenAI's shape: `prompt_tokens`, `completion_tokens` (not for embeddings), `total_tokens`.
fn read_openai(c: &Counts<'_>, endpoint: Endpoint) -> Result<Usage, String> {
    let prompt = c.required("prompt_tokens")?;
    let completion = match endpoint {
        Endpoint::Embeddings => c.optional("completion_tokens")?.unwrap_or(0),
        _ => c.required("completion_tokens")?,
    };
    let parts = c.sum("prompt_tokens + completion_tokens", &[prompt, completion])?;
    match c.optional("total_tokens")? {
        Some(total) if total < parts => Err(format!(
            "total_tokens {total} is below prompt_tokens + completion_tokens {parts}"
        )),
        // Billed output the parts leave out (some providers and adapters put thinking tokens in
        // the total only) counts as completion.
        Some(total) => Ok(Usage {
            prompt,
            completion: total - prompt,
        }),
        None => Ok(Usage { prompt, completion }),
    }
}

/// Anthropic's shape: `input_tokens`, `output_tokens`, and the cache writes and reads, which
/// count as prompt.
fn read_anthropic(c: &Counts<'_>) -> Result<Usage, String> {
    let input = c.required("input_tokens")?;
    let written = c.optional("cache_creation_input_tokens")?.unwrap_or(0);
    let read = c.optional("cache_read_input_tokens")?.unwrap_or(0);
    let output = c.required("output_tokens")?;
    c.sum("input, cache and output tokens", &[input, written, read, output])?;
    Ok(Usage {
        // Within the ceiling: the sum above is.
        prompt: input + written + read,
        completion: output,
    })
}

/// The token counts of one usage object, each read within the ceiling.
struct Counts<'a> {
    fields: Fields<'a>,
    ceiling: u64,
}

/// The count a JSON number written as plain digits says (`None` for anything else, or above
/// `u64::MAX`: the general reading decides those).
fn plain_count(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A usage object's fields: parsed, or as sent.
enum Fields<'a> {
    Parsed(&'a Map<String, Value>),
    Raw(RawFields<'a>),
}

impl Fields<'_> {
    fn get(&self, field: &str) -> Option<Cow<'_, Value>> {
        match self {
            Fields::Parsed(fields) => fields.get(field).map(Cow::Borrowed),
            // A raw value is well-formed JSON: it parses.
            Fields::Raw(fields) => fields
                .get(field)
                .map(|raw| Cow::Owned(serde_json::from_str(raw.get()).unwrap_or(Value::Null))),
        }
    }
}

/// An object's fields as sent, in order: a usage block has a handful, which a list holds for
/// less than a map (no node built per field). A field given twice is its last value, as when
/// the object is parsed whole.
struct RawFields<'a>(Vec<(&'a str, &'a RawValue)>);

impl<'a> RawFields<'a> {
    fn get(&self, field: &str) -> Option<&'a RawValue> {
        self.0
            .iter()
            .rev()
            .find(|(name, _)| *name == field)
            .map(|(_, v)| *v)
    }
}

impl<'de> serde::Deserialize<'de> for RawFields<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Pairs;
        impl<'de> serde::de::Visitor<'de> for Pairs {
            type Value = RawFields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut fields = Vec::with_capacity(8);
                while let Some(pair) = map.next_entry()? {
                    fields.push(pair);
                }
                Ok(RawFields(fields))
            }
        }
        d.deserialize_map(Pairs)
    }
}

impl<'a> Counts<'a> {
    fn of(usage: &'a Value, ceiling: u64) -> Result<Counts<'a>, String> {
        match usage {
            Value::Object(fields) => Ok(Counts {
                fields: Fields::Parsed(fields),
                ceiling,
            }),
            other => Err(format!("usage is {}, not an object", describe(other))),
        }
    }

    /// A count that may be left out (or `null`).
    fn optional(&self, field: &str) -> Result<Option<u64>, String> {
        // As sent, a count is nearly always plain digits: read without building a `Value`.
        let plain = match &self.fields {
            Fields::Raw(fields) => fields.get(field).and_then(|raw| plain_count(raw.get())),
            Fields::Parsed(_) => None,
        };
        let n = match plain {
            Some(n) => n,
            None => match self.fields.get(field).as_deref() {
                None | Some(Value::Null) => return Ok(None),
                Some(v) => v
                    .as_u64()
                    .ok_or_else(|| format!("{field} is {}, not a whole number of tokens", describe(v)))?,
            },
        };
        if n <= self.ceiling {
            Ok(Some(n))
        } else {
            Err(format!("{field} is {n}, above the ceiling of {}", self.ceiling))
        }
    }

    /// A count the shape always has.
    fn required(&self, field: &str) -> Result<u64, String> {
        self.optional(field)?.ok_or_else(|| format!("{field} is missing"))
    }

    /// The sum of `counts`, if within the ceiling.
    fn sum(&self, what: &str, counts: &[u64]) -> Result<u64, String> {
        let sum = counts
            .iter()
            .try_fold(0u64, |acc, n| acc.checked_add(*n))
            .filter(|s| *s <= self.ceiling);
        sum.ok_or_else(|| format!("{what} together are above the ceiling of {}", self.ceiling))
    }
}

/// A JSON value in a warning: numbers as they are, anything else by its kind (an upstream's
/// string may be of any length).
fn describe(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::String(_) => "a string".to_owned(),
        Value::Bool(_) => "a boolean".to_owned(),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
        Value::Null => "null".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CEILING: u64 = 100_000_000;

    fn usage(prompt: u64, completion: u64) -> UsageReport {
        UsageReport::Valid(Usage { prompt, completion })
    }

    #[test]
    fn openai_blocks() {
        let chat = Endpoint::ChatCompletions;
        // (usage block, endpoint, what it reads as; None: invalid)
        let cases: &[(Value, Endpoint, Option<UsageReport>)] = &[
            (
                json!({"prompt_tokens": 3, "completion_tokens": 4}),
                chat,
                Some(usage(3, 4)),
            ),
            (
                json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}),
                chat,
                Some(usage(3, 4)),
            ),
            (
                json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 10}),
                chat,
                Some(usage(3, 7)),
            ),
            (
                json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": null}),
                chat,
                Some(usage(0, 0)),
            ),
            (
                json!({"prompt_tokens": CEILING, "completion_tokens": 0}),
                chat,
                Some(usage(CEILING, 0)),
            ),
            (Value::Null, chat, Some(UsageReport::Missing)),
            (
                json!({"prompt_tokens": 5, "total_tokens": 5}),
                Endpoint::Embeddings,
                Some(usage(5, 0)),
            ),
            (json!({"prompt_tokens": 5}), chat, None),
            (json!({}), chat, None),
            (json!({"prompt_tokens": -1, "completion_tokens": 1}), chat, None),
            (json!({"prompt_tokens": 1.5, "completion_tokens": 1}), chat, None),
            (json!({"prompt_tokens": 2.0, "completion_tokens": 1}), chat, None),
            (
                json!({"prompt_tokens": 1e300, "completion_tokens": 1}),
                chat,
                None,
            ),
            (json!({"prompt_tokens": "3", "completion_tokens": 1}), chat, None),
            (json!({"prompt_tokens": true, "completion_tokens": 1}), chat, None),
            (json!({"prompt_tokens": [3], "completion_tokens": 1}), chat, None),
            (
                json!({"prompt_tokens": i64::MAX, "completion_tokens": i64::MAX}),
                chat,
                None,
            ),
            (
                json!({"prompt_tokens": u64::MAX, "completion_tokens": u64::MAX}),
                chat,
                None,
            ),
            (
                json!({"prompt_tokens": CEILING + 1, "completion_tokens": 0}),
                chat,
                None,
            ),
            (
                json!({"prompt_tokens": CEILING, "completion_tokens": 1}),
                chat,
                None,
            ),
            (
                json!({"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": CEILING + 1}),
                chat,
                None,
            ),
            (
                json!({"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 9}),
                chat,
                None,
            ),
            (
                json!({"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": -1}),
                chat,
                None,
            ),
            (json!("lots"), chat, None),
            (json!(12), chat, None),
        ];
        for (block, endpoint, want) in cases {
            let got = UsageReport::read(*endpoint, block, CEILING);
            match want {
                Some(w) => assert_eq!(&got, w, "{block}"),
                None => assert!(got.invalid_reason().is_some(), "{block} read as {got:?}"),
            }
            assert_eq!(read_as_sent(*endpoint, block), got, "{block} as sent");
        }
    }

    #[test]
    fn anthropic_blocks() {
        let m = Endpoint::Messages;
        let cases: &[(Value, Option<UsageReport>)] = &[
            (json!({"input_tokens": 3, "output_tokens": 4}), Some(usage(3, 4))),
            (
                json!({"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": 2,
                       "cache_creation_input_tokens": 1}),
                Some(usage(6, 4)),
            ),
            (
                json!({"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": null}),
                Some(usage(3, 4)),
            ),
            (json!({"input_tokens": 3}), None),
            (json!({"input_tokens": -3, "output_tokens": 4}), None),
            (
                json!({"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": 1e20}),
                None,
            ),
            (
                json!({"input_tokens": CEILING, "output_tokens": 0, "cache_read_input_tokens": 1}),
                None,
            ),
        ];
        for (block, want) in cases {
            let got = UsageReport::read(m, block, CEILING);
            match want {
                Some(w) => assert_eq!(&got, w, "{block}"),
                None => assert!(got.invalid_reason().is_some(), "{block} read as {got:?}"),
            }
            assert_eq!(read_as_sent(m, block), got, "{block} as sent");
        }
    }

    /// [`UsageReport::read_raw`] of `block` as an upstream would send it.
    fn read_as_sent(endpoint: Endpoint, block: &Value) -> UsageReport {
        let raw = serde_json::value::to_raw_value(block).unwrap();
        UsageReport::read_raw(endpoint, &raw, CEILING)
    }

    #[test]
    fn blocks_as_sent_read_as_parsed() {
        let chat = Endpoint::ChatCompletions;
        // (the block's text, what it reads as)
        let cases: &[(&str, UsageReport)] = &[
            (r#"{"prompt_tokens":3,"completion_tokens":4}"#, usage(3, 4)),
            // Escaped names are read the same, through the parsed block.
            (r#"{"prompt\u005ftokens":3,"completion_tokens":4}"#, usage(3, 4)),
            // The last of a repeated field counts, as when parsed.
            (
                r#"{"prompt_tokens":9,"prompt_tokens":3,"completion_tokens":4}"#,
                usage(3, 4),
            ),
            (
                r#"{"prompt_tokens":3,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":1}}"#,
                usage(3, 4),
            ),
            ("null", UsageReport::Missing),
            (
                "[1]",
                UsageReport::Invalid("usage is an array, not an object".to_owned()),
            ),
            (
                r#"{"prompt_tokens":"3","completion_tokens":4}"#,
                UsageReport::Invalid("prompt_tokens is a string, not a whole number of tokens".to_owned()),
            ),
            // Counts that are not plain digits take the general reading, and say the same.
            (r#"{"prompt_tokens":3e0,"completion_tokens":4}"#, {
                UsageReport::Invalid("prompt_tokens is 3.0, not a whole number of tokens".to_owned())
            }),
            (
                r#"{"prompt_tokens":-3,"completion_tokens":4}"#,
                UsageReport::Invalid("prompt_tokens is -3, not a whole number of tokens".to_owned()),
            ),
            (
                r#"{"prompt_tokens":18446744073709551616,"completion_tokens":4}"#,
                UsageReport::Invalid(
                    "prompt_tokens is 1.8446744073709552e+19, not a whole number of tokens".to_owned(),
                ),
            ),
            (
                r#"{"prompt_tokens":18446744073709551615,"completion_tokens":4}"#,
                UsageReport::Invalid(format!(
                    "prompt_tokens is 18446744073709551615, above the ceiling of {CEILING}"
                )),
            ),
            (
                r#"{"prompt_tokens":0,"completion_tokens":null}"#,
                UsageReport::Invalid("completion_tokens is missing".to_owned()),
            ),
        ];
        for (text, want) in cases {
            let raw = RawValue::from_string((*text).to_owned()).unwrap();
            assert_eq!(&UsageReport::read_raw(chat, &raw, CEILING), want, "{text}");
            let parsed: Value = serde_json::from_str(text).unwrap();
            assert_eq!(&UsageReport::read(chat, &parsed, CEILING), want, "{text} parsed");
        }
    }

    #[test]
    fn invalid_reasons_name_the_field_and_not_its_text() {
        let long = "x".repeat(10_000);
        let r = UsageReport::read(
            Endpoint::ChatCompletions,
            &json!({"prompt_tokens": long, "completion_tokens": 1}),
            CEILING,
        );
        assert_eq!(
            r.invalid_reason(),
            Some("prompt_tokens is a string, not a whole number of tokens")
        );
        let r = UsageReport::read(
            Endpoint::ChatCompletions,
            &json!({"prompt_tokens": i64::MAX, "completion_tokens": 1}),
            CEILING,
        );
        assert_eq!(
            r.invalid_reason(),
            Some("prompt_tokens is 9223372036854775807, above the ceiling of 100000000")
        );
    }

    #[test]
    fn later_blocks_merge_and_invalid_ones_stick() {
        let mut r = UsageReport::Missing;
        r.merge(UsageReport::Missing);
        assert_eq!(r, UsageReport::Missing);
        r.merge(usage(1, 2));
        r.merge(UsageReport::Missing);
        assert_eq!(r, usage(1, 2));
        r.merge(usage(3, 4));
        assert_eq!(r, usage(3, 4));
        r.merge(UsageReport::Invalid("bad".into()));
        r.merge(usage(5, 6));
        assert_eq!(r, UsageReport::Invalid("bad".into()));

        // Anthropic's message_delta completes a message_start usage.
        let mut r = usage(10, 1);
        r.merge_anthropic_delta(&json!({"output_tokens": 9}), CEILING);
        assert_eq!(r, usage(10, 9));
        r.merge_anthropic_delta(&json!({"input_tokens": 10}), CEILING);
        assert_eq!(r, usage(10, 9));
        r.merge_anthropic_delta(&json!({"output_tokens": CEILING}), CEILING);
        assert!(r.invalid_reason().is_some(), "{r:?}");
        let mut r = UsageReport::Missing;
        r.merge_anthropic_delta(&json!({"output_tokens": 9}), CEILING);
        assert_eq!(r, UsageReport::Missing, "nothing to complete");
        let mut r = usage(10, 1);
        r.merge_anthropic_delta(&json!({"output_tokens": -9}), CEILING);
        assert!(r.invalid_reason().is_some());
    }

    #[test]
    fn body_usage() {
        let chat = Endpoint::ChatCompletions;
        assert_eq!(
            of_body(
                chat,
                br#"{"usage":{"prompt_tokens":3,"completion_tokens":4}}"#,
                CEILING
            ),
            usage(3, 4)
        );
        assert_eq!(
            of_body(
                Endpoint::Messages,
                br#"{"usage":{"input_tokens":3,"output_tokens":4}}"#,
                CEILING
            ),
            usage(3, 4)
        );
        assert_eq!(of_body(chat, br#"{"id":"x"}"#, CEILING), UsageReport::Missing);
        assert_eq!(of_body(chat, br#"{"usage":null}"#, CEILING), UsageReport::Missing);
        assert_eq!(
            of_body(Endpoint::Embeddings, b"not json", CEILING),
            UsageReport::Missing
        );
        assert!(
            of_body(
                chat,
                br#"{"usage":{"prompt_tokens":-3,"completion_tokens":4}}"#,
                CEILING
            )
            .invalid_reason()
            .is_some()
        );
    }

    #[test]
    fn estimates() {
        // (request bytes, delivered tokens, report, ceiling, estimate)
        let cases: &[(usize, u64, UsageReport, u64, Usage)] = &[
            (
                100,
                5,
                UsageReport::Missing,
                CEILING,
                Usage {
                    prompt: 25,
                    completion: 5,
                },
            ),
            (
                101,
                0,
                UsageReport::Invalid("x".into()),
                CEILING,
                Usage {
                    prompt: 26,
                    completion: 0,
                },
            ),
            // A stream cut short after a valid report: its prompt, the larger completion.
            (
                100,
                5,
                usage(7, 9),
                CEILING,
                Usage {
                    prompt: 7,
                    completion: 9,
                },
            ),
            (
                100,
                12,
                usage(7, 9),
                CEILING,
                Usage {
                    prompt: 7,
                    completion: 12,
                },
            ),
            // Never past the ceiling, the prompt kept first.
            (
                usize::MAX,
                u64::MAX,
                UsageReport::Missing,
                CEILING,
                Usage {
                    prompt: CEILING,
                    completion: 0,
                },
            ),
            (
                40,
                u64::MAX,
                UsageReport::Missing,
                30,
                Usage {
                    prompt: 10,
                    completion: 20,
                },
            ),
        ];
        for (len, delivered, report, ceiling, want) in cases {
            assert_eq!(
                estimate(*len, *delivered, report, *ceiling),
                *want,
                "{len} {delivered} {report:?}"
            );
        }
    }

    #[test]
    fn answer_text_is_estimated_from_its_bytes() {
        let chat = json!({"choices": [
            {"message": {"role": "assistant", "content": "Hello from the mock upstream "}},
            {"message": {"role": "assistant", "content": null,
                         "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}}]});
        // 29 + 1 + 2 bytes.
        assert_eq!(
            answer_tokens(Endpoint::ChatCompletions, chat.to_string().as_bytes()),
            8
        );
        let messages = json!({"content": [{"type": "text", "text": "Hello from the mock upstream "}]});
        assert_eq!(
            answer_tokens(Endpoint::Messages, messages.to_string().as_bytes()),
            8
        );
        assert_eq!(answer_tokens(Endpoint::Embeddings, b"{\"data\":[]}"), 0);
        assert_eq!(answer_tokens(Endpoint::ChatCompletions, b"plain text!"), 3);
        assert_eq!(answer_tokens(Endpoint::ChatCompletions, b"{}"), 0);
    }

    #[test]
    fn usage_total_and_cap_saturate() {
        let huge = Usage {
            prompt: u64::MAX,
            completion: u64::MAX,
        };
        assert_eq!(huge.total(), u64::MAX);
        assert_eq!(
            huge.capped(10),
            Usage {
                prompt: 10,
                completion: 0
            }
        );
    }

    /// Property tests: `PROPTEST_CASES=100000 cargo test --release --lib prop_` runs them long.
    mod properties {
        use super::*;
        use crate::provider::sse::SseTap;
        use bytes::BytesMut;
        use proptest::prelude::*;

        /// Few cases by default, so that `cargo test` stays fast; `PROPTEST_CASES` asks for more.
        fn config() -> ProptestConfig {
            let asked = std::env::var("PROPTEST_CASES").is_ok();
            let default = ProptestConfig::default();
            ProptestConfig {
                cases: if asked { default.cases } else { 64 },
                ..default
            }
        }

        /// Numbers an upstream might send, the absurd ones well represented.
        fn number() -> impl Strategy<Value = Value> {
            prop_oneof![
                (0u64..1_000).prop_map(Value::from),
                (0u64..200_000_000).prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
                Just(json!(i64::MAX)),
                Just(json!(u64::MAX)),
                Just(json!(1e300)),
                Just(json!(-1)),
                Just(json!(2.0)),
            ]
        }

        fn field_name() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("prompt_tokens".to_owned()),
                Just("completion_tokens".to_owned()),
                Just("total_tokens".to_owned()),
                Just("input_tokens".to_owned()),
                Just("output_tokens".to_owned()),
                Just("cache_read_input_tokens".to_owned()),
                Just("cache_creation_input_tokens".to_owned()),
                "[a-z_]{1,12}",
            ]
        }

        /// Any JSON, biased towards usage-like objects.
        fn json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                number(),
                ".{0,16}".prop_map(Value::from),
            ];
            leaf.prop_recursive(4, 48, 8, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    prop::collection::vec((field_name(), inner), 0..8)
                        .prop_map(|fields| Value::Object(fields.into_iter().collect())),
                ]
            })
        }

        fn endpoint() -> impl Strategy<Value = Endpoint> {
            prop::sample::select(Endpoint::ALL.to_vec())
        }

        fn ceiling() -> impl Strategy<Value = u64> {
            prop_oneof![Just(CEILING), 1u64..=1_000_000_000_000]
        }

        fn within(report: &UsageReport, ceiling: u64) -> bool {
            report
                .valid()
                .is_none_or(|u| u.prompt <= ceiling && u.completion <= ceiling && u.total() <= ceiling)
        }

        /// Splits `bytes` at `cuts` (positions taken modulo its length).
        fn pieces(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
            let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
            at.push(0);
            at.push(bytes.len());
            at.sort_unstable();
            at.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect()
        }

        fn tap_all(endpoint: Endpoint, ceiling: u64, parts: &[Vec<u8>]) -> SseTap {
            let mut tap = SseTap::new(endpoint, true, ceiling);
            let mut out = BytesMut::new();
            for p in parts {
                tap.feed(p, &mut out);
            }
            tap.finish(&mut out);
            tap
        }

        proptest! {
            #![proptest_config(config())]

            #[test]
            fn prop_any_usage_block_reads_within_the_ceiling(
                usage in json(), endpoint in endpoint(), ceiling in ceiling()
            ) {
                let report = UsageReport::read(endpoint, &usage, ceiling);
                prop_assert!(within(&report, ceiling), "{usage} read as {report:?}");
                if let Some(why) = report.invalid_reason() {
                    prop_assert!(why.len() < 200, "a reason is short: {why}");
                }
            }

            #[test]
            fn prop_any_body_reads_within_the_ceiling(
                body in prop_oneof![
                    prop::collection::vec(any::<u8>(), 0..256),
                    json().prop_map(|v| json!({"usage": v}).to_string().into_bytes()),
                    json().prop_map(|v| v.to_string().into_bytes()),
                ],
                endpoint in endpoint(),
                ceiling in ceiling(),
                request_len in any::<usize>(),
            ) {
                let report = of_body(endpoint, &body, ceiling);
                prop_assert!(within(&report, ceiling), "{report:?}");
                let answer = answer_tokens(endpoint, &body);
                let estimate = estimate(request_len, answer, &report, ceiling);
                prop_assert!(estimate.total() <= ceiling, "{estimate:?}");
            }

            #[test]
            fn prop_openai_counts_are_checked_exactly(
                prompt in proptest::option::of(number()),
                completion in proptest::option::of(number()),
                total in proptest::option::of(number()),
                ceiling in ceiling(),
            ) {
                let mut fields = Map::new();
                for (name, v) in [("prompt_tokens", &prompt), ("completion_tokens", &completion), ("total_tokens", &total)] {
                    if let Some(v) = v {
                        fields.insert(name.to_owned(), v.clone());
                    }
                }
                // The rules, written out once more: absent or null is absent; a count is a whole
                // number within the ceiling; the parts too; a total is not below them.
                let count = |v: &Option<Value>| match v.as_ref().filter(|v| !v.is_null()) {
                    None => Ok(None),
                    Some(v) => v.as_u64().filter(|n| *n <= ceiling).map(Some).ok_or(()),
                };
                let expected = (|| {
                    let p = count(&prompt)?.ok_or(())?;
                    let c = count(&completion)?.ok_or(())?;
                    let parts = p.checked_add(c).filter(|s| *s <= ceiling).ok_or(())?;
                    match count(&total)? {
                        Some(t) if t < parts => Err(()),
                        Some(t) => Ok(Usage { prompt: p, completion: t - p }),
                        None => Ok(Usage { prompt: p, completion: c }),
                    }
                })();
                let got = UsageReport::read(Endpoint::ChatCompletions, &Value::Object(fields), ceiling);
                match expected {
                    Ok(u) => prop_assert_eq!(got, UsageReport::Valid(u)),
                    Err(()) => prop_assert!(got.invalid_reason().is_some(), "{got:?}"),
                }
            }

            #[test]
            fn prop_streamed_usage_reads_within_the_ceiling(
                usage in json(),
                words in 0usize..4,
                cuts in prop::collection::vec(any::<usize>(), 0..8),
                ceiling in ceiling(),
            ) {
                let mut stream = String::new();
                for _ in 0..words {
                    stream += "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n";
                }
                stream += &format!("data: {}\n\n", json!({"choices": [], "usage": usage}));
                stream += "data: [DONE]\n\n";
                let tap = tap_all(Endpoint::ChatCompletions, ceiling, &pieces(stream.as_bytes(), &cuts));
                prop_assert!(within(&tap.usage, ceiling), "{:?}", tap.usage);
                // However the stream is cut, the tap reads the block as a body would (a float
                // may come back a digit off after the round trip through text: the reasons are
                // not compared).
                let direct = UsageReport::read(Endpoint::ChatCompletions, &usage, ceiling);
                if usage.is_object() {
                    prop_assert_eq!(tap.usage.valid(), direct.valid());
                    prop_assert_eq!(tap.usage.invalid_reason().is_some(), direct.invalid_reason().is_some());
                }
                let estimate = estimate(usize::MAX, tap.content_chunks, &tap.usage, ceiling);
                prop_assert!(estimate.total() <= ceiling);

                let mut anthropic = format!(
                    "event: message_start\ndata: {}\n\n",
                    json!({"type": "message_start", "message": {"usage": usage}})
                );
                anthropic += &format!(
                    "event: message_delta\ndata: {}\n\n",
                    json!({"type": "message_delta", "usage": usage})
                );
                let tap = tap_all(Endpoint::Messages, ceiling, &pieces(anthropic.as_bytes(), &cuts));
                prop_assert!(within(&tap.usage, ceiling), "{:?}", tap.usage);
            }

            #[test]
            fn prop_any_stream_bytes_are_tapped_without_panic(
                bytes in prop::collection::vec(any::<u8>(), 0..512),
                cuts in prop::collection::vec(any::<usize>(), 0..8),
                endpoint in endpoint(),
                ceiling in ceiling(),
            ) {
                let tap = tap_all(endpoint, ceiling, &pieces(&bytes, &cuts));
                prop_assert!(within(&tap.usage, ceiling), "{:?}", tap.usage);
            }

            #[test]
            fn prop_estimates_stay_within_the_ceiling(
                request_len in any::<usize>(),
                delivered in any::<u64>(),
                prompt in any::<u64>(),
                completion in any::<u64>(),
                valid in any::<bool>(),
                ceiling in ceiling(),
            ) {
                let report = if valid {
                    UsageReport::Valid(Usage { prompt, completion })
                } else {
                    UsageReport::Missing
                };
                let e = estimate(request_len, delivered, &report, ceiling);
                prop_assert!(e.prompt <= ceiling && e.total() <= ceiling, "{e:?}");
            }
        }
    }
}
