//! One rule per field that both the admin API and the resources file accept: a name, an email
//! address, a password, a time zone, an upstream's URL, secret, numbers and limits, a model's
//! price. Each returns the value as it is stored, or the message a person reads; the admin API
//! puts that message in its 422 naming the field, the resources file after the entry and its
//! line. A policy's limit is the quota's rule (`quota::policy_limit`), an alert's settings the
//! alerts' (`alerts::settings`). The configuration's `bootstrap_email` uses [`email`] too.

use chrono_tz::Tz;

use crate::credits::{MAX_STORED_CREDITS, MAX_STORED_CREDITS_TEXT, credits_to_micros};

/// A name (of a department, workspace, key, model, credential or quota group): trimmed, 1 to 100
/// characters, no control characters.
pub fn name(field: &str, value: &str) -> Result<String, String> {
    let v = value.trim();
    if v.is_empty() || v.chars().count() > 100 || v.chars().any(char::is_control) {
        return Err(format!(
            "{field} must be 1 to 100 characters without control characters"
        ));
    }
    Ok(v.to_owned())
}

/// A gateway key's name: a [`name`] without `/` (keys are addressed as `email/name`).
pub fn key_name(field: &str, value: &str) -> Result<String, String> {
    let v = name(field, value)?;
    if v.contains('/') {
        return Err(format!("{field} must not contain '/'"));
    }
    Ok(v)
}

/// An email address as members sign in with it: an `@`, at most 254 bytes, no whitespace or
/// control characters (a typo'd space is refused, not trimmed away).
pub fn email(value: &str) -> Result<&str, String> {
    if !value.contains('@') || value.len() > 254 || value.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!("{value:?} is not an email address"));
    }
    Ok(value)
}

/// A password a member may have: 8 to 200 characters.
pub fn password(field: &str, value: &str) -> Result<(), String> {
    if !(8..=200).contains(&value.chars().count()) {
        return Err(format!("{field} must be 8 to 200 characters"));
    }
    Ok(())
}

/// An IANA time zone name.
pub fn timezone(value: &str) -> Result<Tz, String> {
    value
        .parse::<Tz>()
        .map_err(|_| format!("unknown time zone {value:?} (expected an IANA name such as Asia/Shanghai)"))
}

/// An upstream's base URL: `http://` or `https://`, at most 2000 bytes, no whitespace or control
/// characters; stored trimmed and without a trailing `/`.
pub fn base_url(value: &str) -> Result<String, String> {
    let v = value.trim().trim_end_matches('/');
    let ok = (v.starts_with("http://") || v.starts_with("https://"))
        && v.len() <= 2000
        && !v.chars().any(|c| c.is_whitespace() || c.is_control());
    if !ok {
        return Err("base_url must be an http:// or https:// URL".into());
    }
    Ok(v.to_owned())
}

/// An upstream's secret: 1 to 4096 printable characters, not blank.
pub fn upstream_secret(value: &str) -> Result<(), String> {
    if value.trim().is_empty() || value.len() > 4096 || value.chars().any(char::is_control) {
        return Err("api_key must be 1 to 4096 printable characters".into());
    }
    Ok(())
}

/// An upstream's `priority` (`min` 0), `weight` or `max_in_flight` (`min` 1): up to a million.
pub fn upstream_number(field: &str, value: i64, min: i64) -> Result<i64, String> {
    if !(min..=1_000_000).contains(&value) {
        return Err(format!("{field} must be between {min} and 1000000"));
    }
    Ok(value)
}

/// One of an upstream's own rate limits: at least 1, or none.
pub fn upstream_limit(field: &str, value: Option<i64>) -> Result<Option<i64>, String> {
    if value.is_some_and(|v| v < 1) {
        return Err(format!("{field} must be at least 1, or null for none"));
    }
    Ok(value)
}

/// The models a credential serves: (public name, the upstream's name).
pub type ServedModels = Vec<(String, String)>;

/// The model names a credential serves: each a [`name`], none listed twice.
pub fn served_models<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<ServedModels, String> {
    let mut served = ServedModels::new();
    for (public, upstream) in pairs {
        let public = name("models", public)?;
        let upstream = name("models", upstream)?;
        if served.iter().any(|(n, _)| *n == public) {
            return Err(format!("model {public:?} is listed twice"));
        }
        served.push((public, upstream));
    }
    Ok(served)
}

/// How far a price or a policy limit may go. The admin API keeps them in a range people mean;
/// the resources file is the operator's own and may go as far as can be stored. Nothing is
/// ever stored saturated: what does not fit is refused, naming the bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Range {
    /// A price below a billion credits per million tokens; a count limit below 9e15; a credits
    /// limit up to what is stored.
    Console,
    /// Up to what is stored: a count limit up to `i64::MAX`, credits up to
    /// [`MAX_STORED_CREDITS`].
    Operator,
}

/// A model's price in credits per million tokens, prompt and completion: finite, non-negative,
/// below a billion from the admin API, at most [`MAX_STORED_CREDITS`] from the resources file;
/// stored in micro-credits.
pub fn price(prompt: f64, completion: f64, range: Range) -> Result<(i64, i64), String> {
    let (ok, bound): (fn(f64) -> bool, &str) = match range {
        Range::Console => (|v| (0.0..1.0e9).contains(&v), "below 1,000,000,000"),
        Range::Operator => (
            |v| (0.0..=MAX_STORED_CREDITS).contains(&v),
            MAX_STORED_CREDITS_TEXT,
        ),
    };
    if !(ok(prompt) && ok(completion)) {
        return Err(format!(
            "price must be from 0 to {bound} credits per million tokens"
        ));
    }
    Ok((credits_to_micros(prompt), credits_to_micros(completion)))
}

/// Most a model's `max_output_tokens` may be.
pub const MAX_OUTPUT_TOKENS: i64 = 10_000_000;

/// A model's own output limit: a whole number from 1 to [`MAX_OUTPUT_TOKENS`].
pub fn max_output_tokens(n: i64) -> Result<i64, String> {
    if (1..=MAX_OUTPUT_TOKENS).contains(&n) {
        Ok(n)
    } else {
        Err(format!(
            "max_output_tokens must be a whole number from 1 to {MAX_OUTPUT_TOKENS}, not {n}"
        ))
    }
}

/// A model's fallbacks name other models, never itself.
pub fn fallbacks(model: &str, fallbacks: &[String]) -> Result<(), String> {
    if fallbacks.iter().any(|f| f == model) {
        return Err("a model cannot fall back to itself".into());
    }
    Ok(())
}

/// The most entries a model allow-list may have.
pub const MAX_ALLOWED_MODELS: usize = 100;

/// A model allow-list (of a key or a member): 1 to 100 entries, each a model [`name`] or a
/// prefix followed by one trailing `*` (`gpt-4o*`, `claude-*`; `*` alone allows every model),
/// none listed twice. An empty list is refused: it would allow nothing (`null` allows every
/// model).
pub fn allowed_models(field: &str, list: &[String]) -> Result<Vec<String>, String> {
    if list.is_empty() {
        return Err(format!(
            "{field} must list at least one model or pattern; null (or leaving it out) allows every model"
        ));
    }
    if list.len() > MAX_ALLOWED_MODELS {
        return Err(format!(
            "{field} may list at most {MAX_ALLOWED_MODELS} models or patterns"
        ));
    }
    let mut out: Vec<String> = Vec::with_capacity(list.len());
    for entry in list {
        let v = name(field, entry)?;
        if v.trim_end_matches('*').contains('*') || v.ends_with("**") {
            return Err(format!(
                "{field}: {v:?} is not a model name or a pattern: a * may only end it (e.g. \"gpt-4o*\")"
            ));
        }
        if out.contains(&v) {
            return Err(format!("{field}: {v:?} is listed twice"));
        }
        out.push(v);
    }
    Ok(out)
}

/// A key's or member's cap on requests in flight: 1 to a million, or none.
pub fn max_in_flight(field: &str, value: Option<i64>) -> Result<Option<i64>, String> {
    if value.is_some_and(|v| !(1..=1_000_000).contains(&v)) {
        return Err(format!(
            "{field} must be between 1 and 1000000, or null for no cap"
        ));
    }
    Ok(value)
}

/// A key's `expires_at`: an RFC 3339 instant with its offset (`2027-01-01T00:00:00+08:00`), as
/// stored (Unix ms).
pub fn expires_at(field: &str, value: &str) -> Result<i64, String> {
    chrono::DateTime::parse_from_rfc3339(value.trim())
        .map(|t| t.timestamp_millis())
        .map_err(|_| {
            format!(
                "{field} must be an RFC 3339 time with its offset, e.g. \"2027-01-01T00:00:00+08:00\" \
                 (got {value:?})"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_allow_lists() {
        let list = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let cases: &[(&[&str], Want<&[&str]>)] = &[
            (&["gpt-4o-mini", "claude-*"], Ok(&["gpt-4o-mini", "claude-*"])),
            (&[" gpt-4o* "], Ok(&["gpt-4o*"])),
            (&["*"], Ok(&["*"])),
            (&[], Err("at least one")),
            (&["gpt-*-mini"], Err("a * may only end it")),
            (&["gpt**"], Err("a * may only end it")),
            (&["a", "a"], Err("listed twice")),
            (&[""], Err("1 to 100 characters")),
        ];
        for (input, want) in cases {
            match (allowed_models("allowed_models", &list(input)), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, list(w), "{input:?}"),
                (Err(got), Err(w)) => assert!(got.contains(w), "{input:?}: {got}"),
                (got, w) => panic!("{input:?}: got {got:?}, want {w:?}"),
            }
        }
        assert!(allowed_models("m", &vec!["x".to_owned(); 101]).is_err());
        assert_eq!(max_in_flight("max_in_flight", Some(1)), Ok(Some(1)));
        assert_eq!(max_in_flight("max_in_flight", None), Ok(None));
        assert_eq!(expires_at("expires_at", "1970-01-01T08:00:01+08:00"), Ok(1000));
        assert!(expires_at("expires_at", "2027-01-01").is_err(), "no offset");
        assert!(
            expires_at("expires_at", "tomorrow")
                .unwrap_err()
                .contains("RFC 3339")
        );
        assert!(max_in_flight("max_in_flight", Some(0)).is_err());
    }

    /// A case's expected answer: the value, or part of the message.
    type Want<T> = Result<T, &'static str>;

    /// Runs each case of a table: `Ok(stored)` or `Err(part of the message)`.
    fn table<T: PartialEq + std::fmt::Debug>(
        rule: impl Fn(&str) -> Result<T, String>,
        cases: &[(&str, Result<T, &str>)],
    ) {
        for (input, want) in cases {
            match (rule(input), want) {
                (Ok(got), Ok(w)) => assert_eq!(&got, w, "{input:?}"),
                (Err(got), Err(w)) => assert!(got.contains(w), "{input:?}: {got}"),
                (got, w) => panic!("{input:?}: got {got:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn names() {
        let long = "n".repeat(101);
        table(
            |v| name("name", v),
            &[
                ("research", Ok("research".to_owned())),
                ("  research ", Ok("research".to_owned())),
                ("数据组", Ok("数据组".to_owned())),
                (&"n".repeat(100), Ok("n".repeat(100))),
                (&long, Err("name must be 1 to 100 characters")),
                ("", Err("name must be 1 to 100")),
                ("   ", Err("name must be 1 to 100")),
                ("a\u{7}b", Err("without control characters")),
            ],
        );
    }

    #[test]
    fn key_names() {
        table(
            |v| key_name("name", v),
            &[
                ("ci", Ok("ci".to_owned())),
                (" ci ", Ok("ci".to_owned())),
                ("ci/prod", Err("name must not contain '/'")),
                ("", Err("1 to 100 characters")),
            ],
        );
    }

    #[test]
    fn emails() {
        let long = format!("{}@acme.test", "a".repeat(250));
        table(
            |v| email(v).map(str::to_owned),
            &[
                ("ada@acme.test", Ok("ada@acme.test".to_owned())),
                ("ada", Err("\"ada\" is not an email address")),
                (" ada@acme.test", Err("is not an email address")),
                ("ada @acme.test", Err("is not an email address")),
                ("ada@acme.test\n", Err("is not an email address")),
                (&long, Err("is not an email address")),
            ],
        );
    }

    #[test]
    fn passwords() {
        table(
            |v| password("password", v),
            &[
                ("12345678", Ok(())),
                ("密码密码密码密码", Ok(())),
                (&"p".repeat(200), Ok(())),
                ("1234567", Err("password must be 8 to 200 characters")),
                (&"p".repeat(201), Err("password must be 8 to 200 characters")),
                ("", Err("8 to 200")),
            ],
        );
    }

    #[test]
    fn timezones() {
        table(
            |v| timezone(v).map(|t| t.name().to_owned()),
            &[
                ("Asia/Shanghai", Ok("Asia/Shanghai".to_owned())),
                ("UTC", Ok("UTC".to_owned())),
                ("Mars/Olympus", Err("unknown time zone \"Mars/Olympus\"")),
                ("", Err("unknown time zone")),
            ],
        );
    }

    #[test]
    fn base_urls() {
        table(
            base_url,
            &[
                (
                    "https://api.openai.com/v1",
                    Ok("https://api.openai.com/v1".to_owned()),
                ),
                (
                    "http://127.0.0.1:9000/v1/",
                    Ok("http://127.0.0.1:9000/v1".to_owned()),
                ),
                (" https://h/v1 ", Ok("https://h/v1".to_owned())),
                ("ftp://h", Err("base_url must be an http:// or https:// URL")),
                ("api.openai.com", Err("http:// or https://")),
                ("https://h/a b", Err("http:// or https://")),
                (
                    &format!("https://{}", "h".repeat(2000)),
                    Err("http:// or https://"),
                ),
            ],
        );
    }

    #[test]
    fn upstream_secrets() {
        table(
            upstream_secret,
            &[
                ("sk-live", Ok(())),
                (&"k".repeat(4096), Ok(())),
                ("", Err("api_key must be 1 to 4096 printable characters")),
                ("  ", Err("1 to 4096")),
                (&"k".repeat(4097), Err("1 to 4096")),
                ("sk\n", Err("1 to 4096")),
            ],
        );
    }

    #[test]
    fn upstream_numbers_and_limits() {
        let cases: &[(&str, i64, i64, Result<i64, &str>)] = &[
            ("priority", 0, 0, Ok(0)),
            ("priority", -1, 0, Err("priority must be between 0 and 1000000")),
            ("weight", 0, 1, Err("weight must be between 1 and 1000000")),
            ("weight", 1_000_000, 1, Ok(1_000_000)),
            (
                "max_in_flight",
                1_000_001,
                1,
                Err("max_in_flight must be between 1 and 1000000"),
            ),
        ];
        for (field, value, min, want) in cases {
            table(|_| upstream_number(field, *value, *min), &[("", *want)]);
        }
        let cases: &[(Option<i64>, Want<Option<i64>>)] = &[
            (None, Ok(None)),
            (Some(1), Ok(Some(1))),
            (Some(0), Err("limits.requests_per_minute must be at least 1")),
            (Some(-5), Err("must be at least 1")),
        ];
        for (value, want) in cases {
            table(
                |_| upstream_limit("limits.requests_per_minute", *value),
                &[("", *want)],
            );
        }
    }

    #[test]
    fn served_model_lists() {
        let ok = |v: &[(&str, &str)]| served_models(v.iter().copied());
        assert_eq!(
            ok(&[("gpt", " gpt-4o "), ("m", "m")]),
            Ok(vec![("gpt".into(), "gpt-4o".into()), ("m".into(), "m".into())])
        );
        for (list, want) in [
            (&[("gpt", "a"), ("gpt", "b")][..], "model \"gpt\" is listed twice"),
            (&[("", "a")][..], "models must be 1 to 100 characters"),
            (&[("a", "")][..], "models must be 1 to 100 characters"),
        ] {
            let err = ok(list).unwrap_err();
            assert!(err.contains(want), "{list:?}: {err}");
        }
    }

    #[test]
    fn max_output_tokens_are_whole_and_bounded() {
        for (n, ok) in [
            (1, true),
            (64_000, true),
            (MAX_OUTPUT_TOKENS, true),
            (0, false),
            (-5, false),
            (MAX_OUTPUT_TOKENS + 1, false),
        ] {
            assert_eq!(max_output_tokens(n).is_ok(), ok, "{n}");
        }
    }

    #[test]
    fn prices() {
        type Micros = (i64, i64);
        let cases: &[(f64, f64, Want<Micros>)] = &[
            (0.0, 0.0, Ok((0, 0))),
            (2.5, 10.0, Ok((2_500_000, 10_000_000))),
            (999_999_999.0, 0.0, Ok((999_999_999_000_000, 0))),
            (
                -1.0,
                0.0,
                Err("price must be from 0 to below 1,000,000,000 credits per million tokens"),
            ),
            (0.0, f64::NAN, Err("below 1,000,000,000")),
            (1.0e9, 0.0, Err("below 1,000,000,000")),
        ];
        for (prompt, completion, want) in cases {
            table(|_| price(*prompt, *completion, Range::Console), &[("", *want)]);
        }
        let operator: &[(f64, Want<Micros>)] = &[
            (9_223_372_036_854.0, Ok((9_223_372_036_854_000_000, 0))),
            (
                1.0e13,
                Err("price must be from 0 to 9,223,372,036,854 credits per million tokens"),
            ),
            (-1.0, Err("9,223,372,036,854")),
            (f64::INFINITY, Err("9,223,372,036,854")),
        ];
        for (prompt, want) in operator {
            table(|_| price(*prompt, 0.0, Range::Operator), &[("", *want)]);
        }
    }

    #[test]
    fn fallback_lists() {
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(fallbacks("m", &names(&["a", "b"])), Ok(()));
        assert_eq!(
            fallbacks("m", &names(&["a", "m"])),
            Err("a model cannot fall back to itself".to_owned())
        );
    }
}
