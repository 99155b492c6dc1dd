//! The generic rules of fields that both the admin API and the resources file accept: a name,
//! an email address, a password, a time zone, an instant.
//! Each returns the value as it is stored, or the message a person reads; the admin API puts
//! that message in its 422 naming the field, the resources file after the entry and its line.
//! The configuration's `bootstrap_email` uses [`email`] too. A rule of one domain lives with it:
//! a policy's limit in `quota`, an alert's settings in `alerts::settings`, an upstream
//! credential's and a model's fields in `upstream::fields`, a key's or member's model allow-list and
//! in-flight cap in `auth::keys`.

use chrono_tz::Tz;

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

/// How far a price or a policy limit may go. The admin API keeps them in a range people mean;
/// the resources file is the operator's own and may go as far as can be stored. Nothing is
/// ever stored saturated: what does not fit is refused, naming the bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Range {
    /// A price below a billion credits per million tokens; a count limit below 9e15; a credits
    /// limit up to what is stored.
    Console,
    /// Up to what is stored: a count limit up to `i64::MAX`, credits up to
    /// [`crate::kernel::credits::MAX_STORED_CREDITS`].
    Operator,
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
pub(crate) mod tests {
    use super::*;

    #[test]
    fn instants() {
        assert_eq!(expires_at("expires_at", "1970-01-01T08:00:01+08:00"), Ok(1000));
        assert!(expires_at("expires_at", "2027-01-01").is_err(), "no offset");
        assert!(
            expires_at("expires_at", "tomorrow")
                .unwrap_err()
                .contains("RFC 3339")
        );
    }

    /// A case's expected answer: the value, or part of the message.
    pub(crate) type Want<T> = Result<T, &'static str>;

    /// Runs each case of a table: `Ok(stored)` or `Err(part of the message)`.
    pub(crate) fn table<T: PartialEq + std::fmt::Debug>(
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
}
