//! Masking a credential's secret out of what its upstream sends back (DESIGN.md §9: a secret
//! never appears in a response, a log line or a request log, even when an upstream error body
//! echoes it).
//!
//! An upstream may print the key it was given in full, or in one of the truncated forms providers
//! use ("Incorrect API key provided: sk-proj-abc…wxyz", "sk-abc12*****wxyz", "****wxyz"). A
//! [`SecretMask`] is built once per credential when the routes load and replaces, in any bytes:
//!
//! 1. every run of the secret's leading bytes at least [`HEAD`] long (the whole secret
//!    included), together with an ellipsis and a suffix of the secret that follow it;
//! 2. every `prefix ellipsis suffix` form: a prefix of the secret (possibly empty), an ellipsis
//!    (`…`, `\u2026`, three or more `.`, or any run of `*`) and at least the secret's last
//!    [`TAIL`] bytes, when the whole form is at least [`MIN_TRUNCATED`] characters long.
//!
//! Each form is also looked for JSON-escaped (a secret with `"`, `\`, `/` or control characters
//! reads differently inside a JSON string). Each is replaced by `***`, and the text is masked
//! again until nothing matches (a replacement next to what is left can complete a new match).

use std::borrow::Cow;
use std::fmt;

use memchr::memmem::Finder;

/// Rule 1: a run of the secret's first bytes at least this long is the secret.
pub const HEAD: usize = 8;
/// Rule 2: the shortest suffix of the secret a truncated form must end with.
pub const TAIL: usize = 4;
/// Rule 2: the fewest characters (prefix, ellipsis, suffix) a truncated form has.
pub const MIN_TRUNCATED: usize = 8;
/// What a secret is replaced by.
const REPLACEMENT: &[u8] = b"***";
/// The ellipsis character, U+2026, in UTF-8.
const ELLIPSIS: &[u8] = "\u{2026}".as_bytes();
/// The ellipsis as a JSON escape.
const ELLIPSIS_ESCAPED: &[u8] = br"\u2026";

/// The secret of one credential, ready to be masked out of upstream bytes. Its `Debug` shows
/// nothing of the secret.
pub struct SecretMask {
    forms: Vec<Form>,
    /// [`REPLACEMENT`]; nothing for a secret shorter than it that contains a `*` (see `mask`).
    replacement: &'static [u8],
}

/// One spelling of the secret (as is, or JSON-escaped).
struct Form {
    secret: Box<[u8]>,
    /// Rule 1's needle: the first [`HEAD`] bytes (the whole secret when shorter).
    head: Finder<'static>,
    /// Rule 2's needle: the last [`TAIL`] bytes; none for a secret shorter than [`HEAD`].
    tail: Option<Finder<'static>>,
}

impl Form {
    fn new(secret: &[u8]) -> Form {
        let head = Finder::new(&secret[..secret.len().min(HEAD)]).into_owned();
        let tail = (secret.len() >= HEAD).then(|| Finder::new(&secret[secret.len() - TAIL..]).into_owned());
        Form {
            secret: secret.into(),
            head,
            tail,
        }
    }

    /// The spans of `text` this spelling of the secret covers.
    fn spans(&self, text: &[u8], spans: &mut Vec<(usize, usize)>) {
        let secret = &self.secret[..];
        let head = self.head.needle().len();
        // Rule 1: a run of the secret's leading bytes, then perhaps an ellipsis and a suffix.
        for start in self.head.find_iter(text) {
            let run = head + common_prefix(&text[start + head..], &secret[head..]);
            let mut end = start + run;
            if run < secret.len()
                && let Some((after, _)) = ellipsis_at(text, end)
            {
                end = after + self.suffix_at(&text[after..]);
            }
            spans.push((start, end));
        }
        // Rule 2: prefix (perhaps empty), ellipsis, and a suffix ending in the last TAIL bytes.
        let Some(tail) = &self.tail else {
            return;
        };
        for at in tail.find_iter(text) {
            let end = at + TAIL;
            let suffix = TAIL + common_suffix(&text[..at], &secret[..secret.len() - TAIL]);
            let Some((dots, dot_chars)) = ellipsis_before(text, end - suffix) else {
                continue;
            };
            let prefix = longest_prefix_ending_at(secret, &text[..dots]);
            if prefix + dot_chars + suffix >= MIN_TRUNCATED {
                spans.push((dots - prefix, end));
            }
        }
    }

    /// The length of the longest suffix of the secret (at least [`TAIL`] bytes) `text` starts
    /// with; 0 when none.
    fn suffix_at(&self, text: &[u8]) -> usize {
        let secret = &self.secret[..];
        (TAIL..=secret.len().min(text.len()))
            .rev()
            .find(|&n| text[..n] == secret[secret.len() - n..])
            .unwrap_or(0)
    }
}

impl SecretMask {
    /// The mask of `secret`. An empty secret masks nothing.
    pub fn new(secret: &str) -> SecretMask {
        let mut spellings: Vec<Vec<u8>> = Vec::new();
        if !secret.is_empty() {
            spellings.push(secret.as_bytes().to_vec());
            // Inside a JSON string: `"`, `\` and control characters escaped, `/` perhaps too.
            let json = serde_json::to_string(secret).unwrap_or_default();
            let json = json.trim_matches('"');
            spellings.push(json.as_bytes().to_vec());
            spellings.push(json.replace('/', r"\/").into_bytes());
        }
        spellings.sort();
        spellings.dedup();
        SecretMask {
            forms: spellings.iter().map(|s| Form::new(s)).collect(),
            replacement: if secret.len() <= REPLACEMENT.len() && secret.contains('*') {
                b""
            } else {
                REPLACEMENT
            },
        }
    }

    /// `text` with every form of the secret replaced; borrowed when nothing matched.
    pub fn mask<'a>(&self, text: &'a [u8]) -> Cow<'a, [u8]> {
        let mut out = Cow::Borrowed(text);
        let mut spans = Vec::new();
        // Until nothing matches. This ends: a secret longer than the replacement makes every
        // pass shorten the text (every span is longer than the replacement); a shorter one
        // cannot match across a replacement that holds none of its bytes, so each pass leaves
        // fewer matches.
        loop {
            spans.clear();
            for form in &self.forms {
                form.spans(&out, &mut spans);
            }
            if spans.is_empty() {
                return out;
            }
            out = Cow::Owned(self.replace(&out, &mut spans));
        }
    }

    /// [`Self::mask`] of a string. A replacement that split a character (only a secret that is
    /// not ASCII can) leaves U+FFFD in its place.
    pub fn mask_str<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match self.mask(text.as_bytes()) {
            Cow::Borrowed(_) => Cow::Borrowed(text),
            Cow::Owned(bytes) => Cow::Owned(
                String::from_utf8(bytes)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            ),
        }
    }

    /// `text` with each of `spans` (merged where they overlap or touch) replaced.
    fn replace(&self, text: &[u8], spans: &mut [(usize, usize)]) -> Vec<u8> {
        spans.sort_unstable();
        let mut out = Vec::with_capacity(text.len());
        let mut copied = 0;
        let mut open: Option<(usize, usize)> = None;
        for &(start, end) in spans.iter() {
            match open {
                Some((s, e)) if start <= e => open = Some((s, e.max(end))),
                _ => {
                    if let Some((s, e)) = open {
                        out.extend_from_slice(&text[copied..s]);
                        out.extend_from_slice(self.replacement);
                        copied = e;
                    }
                    open = Some((start, end));
                }
            }
        }
        if let Some((s, e)) = open {
            out.extend_from_slice(&text[copied..s]);
            out.extend_from_slice(self.replacement);
            copied = e;
        }
        out.extend_from_slice(&text[copied..]);
        out
    }
}

impl fmt::Debug for SecretMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretMask(..)")
    }
}

/// How many leading bytes `a` and `b` share.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// How many trailing bytes `a` and `b` share.
fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    a.iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

/// The longest prefix of `secret` that `text` ends with (its length; 0 when none).
fn longest_prefix_ending_at(secret: &[u8], text: &[u8]) -> usize {
    (1..=secret.len().min(text.len()))
        .rev()
        .find(|&n| text[text.len() - n..] == secret[..n])
        .unwrap_or(0)
}

/// The ellipsis starting at `at`, if one does: where it ends and how many characters it has.
fn ellipsis_at(text: &[u8], at: usize) -> Option<(usize, usize)> {
    let (mut end, mut chars) = (at, 0);
    loop {
        let rest = &text[end..];
        let unit = if rest.starts_with(ELLIPSIS) {
            ELLIPSIS.len()
        } else if rest.starts_with(ELLIPSIS_ESCAPED) {
            ELLIPSIS_ESCAPED.len()
        } else {
            let run = |c: u8| rest.iter().take_while(|b| **b == c).count();
            match (run(b'*'), run(b'.')) {
                (n, _) if n > 0 => n,
                (_, n) if n >= 3 => n,
                _ => break,
            }
        };
        chars += if rest[0] == b'*' || rest[0] == b'.' {
            unit
        } else {
            1
        };
        end += unit;
    }
    (chars > 0).then_some((end, chars))
}

/// The ellipsis ending at `end`, if one does: where it starts and how many characters it has.
fn ellipsis_before(text: &[u8], end: usize) -> Option<(usize, usize)> {
    let (mut start, mut chars) = (end, 0);
    loop {
        let rest = &text[..start];
        let unit = if rest.ends_with(ELLIPSIS) {
            ELLIPSIS.len()
        } else if rest.ends_with(ELLIPSIS_ESCAPED) {
            ELLIPSIS_ESCAPED.len()
        } else {
            let run = |c: u8| rest.iter().rev().take_while(|b| **b == c).count();
            match (run(b'*'), run(b'.')) {
                (n, _) if n > 0 => n,
                (_, n) if n >= 3 => n,
                _ => break,
            }
        };
        chars += if matches!(rest[rest.len() - 1], b'*' | b'.') {
            unit
        } else {
            1
        };
        start -= unit;
    }
    (chars > 0).then_some((start, chars))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const OPENAI_KEY: &str = "sk-proj-abcDEF0123456789ghiJKLmnoPQRstuVWXyz9876543210wxyz";
    const CLASSIC_KEY: &str = "sk-abc12DEF0123456789ghiJKLmnoPQRstuVWXwxyz";
    const ANTHROPIC_KEY: &str =
        "sk-ant-api03-Zq8x_Yb7-Wc6vUd5Te4Sf3Rg2Qh1PiOjNkMlLmKnJoIpHqGrFsEtDuCvBwAxAA-1a2b3AA";
    const OPENROUTER_KEY: &str = "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";
    const GEMINI_KEY: &str = "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY";

    fn masked(secret: &str, text: &str) -> String {
        SecretMask::new(secret).mask_str(text).into_owned()
    }

    #[test]
    fn provider_bodies_lose_the_key() {
        let cases: &[(&str, &str, &str, &str)] = &[
            (
                "OpenAI 401, prefix…last four",
                OPENAI_KEY,
                r#"{"error":{"message":"Incorrect API key provided: sk-proj-abc…wxyz. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
                r#"{"error":{"message":"Incorrect API key provided: ***. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
            ),
            (
                "OpenAI 401, stars",
                OPENAI_KEY,
                r#"{"error":{"message":"Incorrect API key provided: sk-proj-********************************************wxyz. You can find your API key at https://platform.openai.com/account/api-keys.","code":"invalid_api_key"}}"#,
                r#"{"error":{"message":"Incorrect API key provided: ***. You can find your API key at https://platform.openai.com/account/api-keys.","code":"invalid_api_key"}}"#,
            ),
            (
                "OpenAI 401, older keys: eight characters, stars, last four",
                CLASSIC_KEY,
                "Incorrect API key provided: sk-abc12***************************wxyz.",
                "Incorrect API key provided: ***.",
            ),
            (
                "the whole key echoed",
                OPENAI_KEY,
                &format!(r#"{{"error":{{"message":"Incorrect API key provided: {OPENAI_KEY}."}}}}"#),
                r#"{"error":{"message":"Incorrect API key provided: ***."}}"#,
            ),
            (
                "JSON-escaped ellipsis",
                OPENAI_KEY,
                r#"{"error":{"message":"Incorrect API key provided: sk-proj-abc\u2026wxyz."}}"#,
                r#"{"error":{"message":"Incorrect API key provided: ***."}}"#,
            ),
            (
                "a short prefix, three dots, the last four",
                OPENAI_KEY,
                "invalid key sk-...wxyz",
                "invalid key ***",
            ),
            (
                "a short prefix, an ellipsis, the last four",
                OPENAI_KEY,
                "invalid key sk-…wxyz!",
                "invalid key ***!",
            ),
            (
                "no prefix, stars, the last four (DeepSeek-like)",
                CLASSIC_KEY,
                r#"{"error":{"message":"Authentication Fails, Your api key: ****wxyz is invalid","type":"authentication_error"}}"#,
                r#"{"error":{"message":"Authentication Fails, Your api key: *** is invalid","type":"authentication_error"}}"#,
            ),
            (
                "a run of the key's first bytes, cut off",
                ANTHROPIC_KEY,
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key: sk-ant-api03-Zq8x_Yb7-Wc"}}"#,
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key: ***"}}"#,
            ),
            (
                "Anthropic's own 401 names no key",
                ANTHROPIC_KEY,
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"},"request_id":"req_011CUaS4b1XkQ"}"#,
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"},"request_id":"req_011CUaS4b1XkQ"}"#,
            ),
            (
                "OpenRouter's own 401 names no key",
                OPENROUTER_KEY,
                r#"{"error":{"message":"No auth credentials found","code":401}}"#,
                r#"{"error":{"message":"No auth credentials found","code":401}}"#,
            ),
            (
                "OpenRouter passing on a provider's body that echoes the key",
                OPENROUTER_KEY,
                &format!(
                    r#"{{"error":{{"message":"Provider returned error","code":401,"metadata":{{"raw":"{{\"error\":{{\"message\":\"Incorrect API key provided: {}...e1f0\"}}}}","provider_name":"OpenAI"}}}}}}"#,
                    &OPENROUTER_KEY[..12]
                ),
                r#"{"error":{"message":"Provider returned error","code":401,"metadata":{"raw":"{\"error\":{\"message\":\"Incorrect API key provided: ***\"}}","provider_name":"OpenAI"}}}"#,
            ),
            (
                "Gemini echoing its key in a URL",
                GEMINI_KEY,
                &format!(
                    r#"{{"error":{{"code":400,"message":"API key not valid: https://x.test/?key={GEMINI_KEY}&alt=sse"}}}}"#
                ),
                r#"{"error":{"code":400,"message":"API key not valid: https://x.test/?key=***&alt=sse"}}"#,
            ),
            (
                "a key echoed twice, both forms",
                CLASSIC_KEY,
                &format!("{CLASSIC_KEY} / sk-abc12...wxyz"),
                "*** / ***",
            ),
            (
                "other text that merely ends like the key stays",
                OPENAI_KEY,
                "a note… wxyz and ...wxyz",
                "a note… wxyz and ...wxyz",
            ),
        ];
        for (name, secret, body, want) in cases {
            assert_eq!(masked(secret, body), *want, "{name}");
        }
    }

    #[test]
    fn json_escaped_secrets_are_masked() {
        let secret = "abc/def\"ghi\\jkl0123";
        let json =
            serde_json::to_string(&serde_json::json!({"message": format!("bad key {secret}")})).unwrap();
        assert!(!json.contains(secret), "the JSON spelling differs");
        assert_eq!(masked(secret, &json), r#"{"message":"bad key ***"}"#);
        let solidus = json.replace('/', r"\/");
        assert_eq!(masked(secret, &solidus), r#"{"message":"bad key ***"}"#);
    }

    #[test]
    fn a_key_in_a_header_value() {
        let mask = SecretMask::new(OPENAI_KEY);
        let value = format!("Bearer {OPENAI_KEY}; scope=x");
        assert_eq!(mask.mask(value.as_bytes()).as_ref(), b"Bearer ***; scope=x");
        assert!(matches!(mask.mask(b"application/json"), Cow::Borrowed(_)));
    }

    #[test]
    fn short_and_empty_secrets() {
        // Shorter than HEAD: only the whole secret.
        assert_eq!(
            masked("k-12345", "key k-12345, not k-1234"),
            "key ***, not k-1234"
        );
        assert_eq!(masked("", "anything"), "anything");
        assert_eq!(format!("{:?}", SecretMask::new(OPENAI_KEY)), "SecretMask(..)");
    }

    /// Secrets as providers issue them: a scheme, then base62 with `-` and `_`.
    fn secret() -> impl Strategy<Value = String> {
        (
            prop::sample::select(vec!["sk-", "sk-proj-", "sk-ant-api03-", "sk-or-v1-", "AIza", ""]),
            "[A-Za-z0-9_-]{8,64}",
        )
            .prop_map(|(scheme, body)| format!("{scheme}{body}"))
    }

    /// Text around a secret: printable ASCII, ellipses, multi-byte characters.
    fn filler() -> impl Strategy<Value = String> {
        "[ -~…é中]{0,40}"
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn prop_mask_never_leaves_the_secret(
            secret in secret(),
            parts in prop::collection::vec((filler(), 0..6usize, 0..12usize), 0..6),
            tail in filler(),
        ) {
            // Each part: filler, then the secret in one of the forms providers print.
            let mut text = String::new();
            for (fill, form, cut) in &parts {
                text.push_str(fill);
                let n = secret.len();
                let head = &secret[..(HEAD + cut).min(n)];
                let last4 = &secret[n - TAIL..];
                match form {
                    0 => text.push_str(&secret),
                    1 => text.push_str(&format!("{head}…{last4}")),
                    2 => text.push_str(&format!("{head}***{last4}")),
                    3 => text.push_str(&format!("{}...{last4}", &secret[..3.min(n)])),
                    4 => text.push_str(&serde_json::to_string(&secret).unwrap()),
                    _ => text.push_str(head),
                }
            }
            text.push_str(&tail);
            let out = SecretMask::new(&secret).mask_str(&text).into_owned();
            prop_assert!(!out.contains(&secret), "{out:?}");
            prop_assert!(!out.contains(&secret[..HEAD.min(secret.len())]), "{out:?}");
            // Masked twice is masked once.
            prop_assert_eq!(SecretMask::new(&secret).mask_str(&out).into_owned(), out.clone());
        }

        #[test]
        fn prop_mask_never_panics_on_any_bytes(
            secret in "\\PC{0,24}",
            text in prop::collection::vec(any::<u8>(), 0..512),
        ) {
            let mask = SecretMask::new(&secret);
            let out = mask.mask(&text);
            if !secret.is_empty() {
                prop_assert!(memchr::memmem::find(&out, secret.as_bytes()).is_none());
            }
        }
    }
}
