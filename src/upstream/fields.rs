//! What the fields of an upstream credential and of a model may hold, the same from the admin
//! API and the resources file: a credential's URL, secret, numbers, limits and served models; a
//! model's price, output limit and fallbacks. Each returns the value as it is stored, or the
//! message a person reads.

use crate::kernel::credits::{MAX_STORED_CREDITS, MAX_STORED_CREDITS_TEXT, credits_to_micros};
use crate::validate::{self, Range};

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

/// The model names a credential serves: each a [`validate::name`], none listed twice.
pub fn served_models<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<ServedModels, String> {
    let mut served = ServedModels::new();
    for (public, upstream) in pairs {
        let public = validate::name("models", public)?;
        let upstream = validate::name("models", upstream)?;
        if served.iter().any(|(n, _)| *n == public) {
            return Err(format!("model {public:?} is listed twice"));
        }
        served.push((public, upstream));
    }
    Ok(served)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::tests::{Want, table};

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
