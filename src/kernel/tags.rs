//! Tags and the end user a request carries (issue 25 item 6, DESIGN.md §10): read from
//! `x-aigw-tags: team=search,feature=summaries`, `x-aigw-end-user: ID` and the body's OpenAI
//! `user` field (Anthropic's `metadata.user_id`), stored on the request log, and checked against
//! the key's `allowed_tags`.
//!
//! Rules, in order (each refusal is a 400 `invalid_request_error` naming the header or field):
//! 1. `x-aigw-tags` is a comma-separated list of `key=value`; blanks around items, keys and
//!    values are trimmed, empty items (`a=b,`) are ignored, several `x-aigw-tags` headers read
//!    as one list (HTTP's rule for comma lists).
//! 2. A key is 1 to 64 of `a-z 0-9 _ . -`; a value 1 to 128 printable ASCII characters other
//!    than `,` (it may hold `=`: the first `=` splits key from value), and not `*` alone (the
//!    wildcard of `allowed_tags` and policy targets).
//! 3. At most 10 tags, one value per key.
//! 4. The end user is `x-aigw-end-user` when sent and not blank (the header wins), else the
//!    body's `user` when it is a non-empty string (on Anthropic's `/v1/messages`,
//!    `metadata.user_id` first, then `user`); at most 256 characters, no control characters.

use std::fmt;

/// The request header that carries tags.
pub const TAGS_HEADER: &str = "x-aigw-tags";
/// The request header that names the end user.
pub const END_USER_HEADER: &str = "x-aigw-end-user";
/// The start of both headers' names: a request without a header so named carries neither.
pub const HEADERS_PREFIX: &str = "x-aigw-";
/// Most tags one request carries.
pub const MAX_TAGS: usize = 10;
/// Longest tag key.
pub const MAX_KEY_LEN: usize = 64;
/// Longest tag value.
pub const MAX_VALUE_LEN: usize = 128;
/// Longest end-user id.
pub const MAX_END_USER_LEN: usize = 256;

/// A request's tags: distinct keys, sorted by key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tags(Vec<(String, String)>);

/// Why a header or field was refused, and which one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The header or body field (the error's `param`).
    pub param: &'static str,
    /// What is wrong.
    pub message: String,
}

impl Refused {
    fn tags(message: String) -> Refused {
        Refused {
            param: TAGS_HEADER,
            message,
        }
    }
}

/// Whether `key` is a valid tag key.
pub fn valid_key(key: &str) -> bool {
    (1..=MAX_KEY_LEN).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-'))
}

/// Whether `value` is a valid tag value. `*` alone is not one: in `allowed_tags` and policy
/// targets it stands for every value of the key.
pub fn valid_value(value: &str) -> bool {
    (1..=MAX_VALUE_LEN).contains(&value.len())
        && value != "*"
        && value.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b',')
}

impl Tags {
    /// Reads the values of every `x-aigw-tags` header (rules 1 to 3).
    pub fn parse<'a>(headers: impl IntoIterator<Item = &'a [u8]>) -> Result<Tags, Refused> {
        let mut tags: Vec<(String, String)> = Vec::new();
        for raw in headers {
            let text = std::str::from_utf8(raw)
                .map_err(|_| Refused::tags(format!("`{TAGS_HEADER}` must be ASCII `key=value` pairs")))?;
            for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                let Some((key, value)) = item.split_once('=') else {
                    return Err(Refused::tags(format!(
                        "`{TAGS_HEADER}`: {item:?} is not `key=value` (e.g. `team=search,feature=summaries`)"
                    )));
                };
                let (key, value) = (key.trim(), value.trim());
                if !valid_key(key) {
                    return Err(Refused::tags(format!(
                        "`{TAGS_HEADER}`: tag key {key:?} must be 1 to {MAX_KEY_LEN} of a-z, 0-9, `_`, `.`, `-`"
                    )));
                }
                if !valid_value(value) {
                    return Err(Refused::tags(format!(
                        "`{TAGS_HEADER}`: the value of tag {key:?} must be 1 to {MAX_VALUE_LEN} printable ASCII \
                         characters other than `,`, and not `*` alone"
                    )));
                }
                if tags.iter().any(|(k, _)| k == key) {
                    return Err(Refused::tags(format!(
                        "`{TAGS_HEADER}`: tag {key:?} is given twice; a tag has one value per request"
                    )));
                }
                if tags.len() == MAX_TAGS {
                    return Err(Refused::tags(format!(
                        "`{TAGS_HEADER}`: at most {MAX_TAGS} tags per request"
                    )));
                }
                tags.push((key.to_owned(), value.to_owned()));
            }
        }
        tags.sort_unstable();
        Ok(Tags(tags))
    }

    /// Whether the request carries no tag.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The tags, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The form stored on the request log (`feature=summaries,team=search`); none without tags.
    pub fn stored(&self) -> Option<String> {
        (!self.is_empty()).then(|| self.to_string())
    }

    /// Reads the stored form back (a row that does not parse reads as no tags).
    pub fn from_stored(stored: Option<&str>) -> Tags {
        stored
            .and_then(|s| Tags::parse([s.as_bytes()]).ok())
            .unwrap_or_default()
    }

    /// The first tag outside `allowed` (entries `key=value` or `key=*`); none when every tag is
    /// allowed. No list allows every tag; a request without tags is always allowed.
    pub fn first_not_allowed(&self, allowed: Option<&[String]>) -> Option<String> {
        let allowed = allowed?;
        self.iter()
            .find(|(k, v)| !allowed.iter().any(|a| entry_allows(a, k, v)))
            .map(|(k, v)| format!("{k}={v}"))
    }
}

impl fmt::Display for Tags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

/// Whether an `allowed_tags` entry allows tag `key=value`.
fn entry_allows(entry: &str, key: &str, value: &str) -> bool {
    match entry.split_once('=') {
        Some((k, "*")) => k == key,
        Some((k, v)) => k == key && v == value,
        None => false,
    }
}

/// Checks an `allowed_tags` list as an admin writes it: 1 to 100 entries, each `key=value` or
/// `key=*`, no entry twice. Returns the entries trimmed.
pub fn allowed_tags(field: &str, list: &[String]) -> Result<Vec<String>, String> {
    if list.is_empty() || list.len() > 100 {
        return Err(format!(
            "{field} must list 1 to 100 entries (`key=value` or `key=*`); omit it to allow every tag"
        ));
    }
    let mut out: Vec<String> = Vec::with_capacity(list.len());
    for entry in list {
        let e = entry.trim();
        let ok = e
            .split_once('=')
            .is_some_and(|(k, v)| valid_key(k) && (v == "*" || valid_value(v)));
        if !ok {
            return Err(format!(
                "{field}: {e:?} must be `key=value` or `key=*` (key: 1 to {MAX_KEY_LEN} of a-z, 0-9, `_`, `.`, `-`)"
            ));
        }
        if out.iter().any(|o| o == e) {
            return Err(format!("{field}: {e:?} is listed twice"));
        }
        out.push(e.to_owned());
    }
    Ok(out)
}

/// The end user (rule 4): the header's value when sent and not blank, else the first of the
/// body's `fields` (name and raw JSON text, if present) that is a non-empty string: `user` on
/// chat and embeddings; `metadata.user_id`, then `user`, on Anthropic's messages. A field that is
/// absent, `null` or blank names no one and the next one may; any other non-string is refused.
pub fn end_user(
    header: Option<&[u8]>,
    fields: &[(&'static str, Option<&str>)],
) -> Result<Option<String>, Refused> {
    if let Some(raw) = header {
        let refused = || Refused {
            param: END_USER_HEADER,
            message: format!("`{END_USER_HEADER}` must be 1 to {MAX_END_USER_LEN} printable characters"),
        };
        let text = std::str::from_utf8(raw).map_err(|_| refused())?.trim();
        // A blank header names no one: the body's field still may.
        if !text.is_empty() {
            return checked_end_user(text).ok_or_else(refused).map(Some);
        }
    }
    for (param, raw) in fields {
        let Some(raw) = raw else { continue };
        let refused = |what: &str| Refused {
            param,
            message: format!("`{param}` {what}"),
        };
        match serde_json::from_str::<Option<String>>(raw) {
            Ok(None) => {}
            Ok(Some(u)) if u.trim().is_empty() => {}
            Ok(Some(u)) => {
                return checked_end_user(u.trim()).map(Some).ok_or_else(|| {
                    refused(&format!(
                        "must be at most {MAX_END_USER_LEN} characters, without control characters"
                    ))
                });
            }
            Err(_) => return Err(refused("must be a string")),
        }
    }
    Ok(None)
}

fn checked_end_user(text: &str) -> Option<String> {
    (text.chars().count() <= MAX_END_USER_LEN && !text.chars().any(char::is_control)).then(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_headers_start_with_the_prefix() {
        assert!(TAGS_HEADER.starts_with(HEADERS_PREFIX));
        assert!(END_USER_HEADER.starts_with(HEADERS_PREFIX));
    }

    fn parse(h: &str) -> Result<String, &'static str> {
        Tags::parse([h.as_bytes()])
            .map(|t| t.to_string())
            .map_err(|r| r.param)
    }

    #[test]
    fn tag_headers() {
        let long_key = "k".repeat(65);
        let long_value = format!("a={}", "v".repeat(129));
        let eleven = (0..11).map(|i| format!("k{i}=v")).collect::<Vec<_>>().join(",");
        let ten = (0..10).map(|i| format!("k{i}=v")).collect::<Vec<_>>().join(",");
        let rows: &[(&str, Result<&str, &str>)] = &[
            (
                "team=search,feature=summaries",
                Ok("feature=summaries,team=search"),
            ),
            (
                " team = search , feature=summaries ,",
                Ok("feature=summaries,team=search"),
            ),
            ("", Ok("")),
            (" , ,", Ok("")),
            ("url=a=b", Ok("url=a=b")),
            ("env=prod eu", Ok("env=prod eu")),
            ("team", Err(TAGS_HEADER)),
            ("team=", Err(TAGS_HEADER)),
            ("team=*", Err(TAGS_HEADER)),
            ("team=a*", Ok("team=a*")),
            ("=search", Err(TAGS_HEADER)),
            ("Team=search", Err(TAGS_HEADER)),
            ("te am=search", Err(TAGS_HEADER)),
            ("team=search,team=ads", Err(TAGS_HEADER)),
            ("team=sé", Err(TAGS_HEADER)),
            ("team=a\tb", Err(TAGS_HEADER)),
            (&long_key, Err(TAGS_HEADER)),
            (&long_value, Err(TAGS_HEADER)),
            (&eleven, Err(TAGS_HEADER)),
        ];
        for (header, want) in rows {
            assert_eq!(
                parse(header).as_deref(),
                want.map(str::to_owned).as_deref(),
                "{header:?}"
            );
        }
        assert!(parse(&ten).is_ok());
        let two = Tags::parse(["team=search".as_bytes(), b"feature=x"]).unwrap();
        assert_eq!(two.to_string(), "feature=x,team=search");
        assert!(Tags::parse([b"\xff=1".as_slice()]).is_err());
        assert_eq!(Tags::from_stored(Some("team=search")).to_string(), "team=search");
        assert!(Tags::from_stored(Some("bad")).is_empty());
    }

    #[test]
    fn allowed_tags_lists() {
        let list: Vec<String> = vec!["team=search".into(), "feature=*".into()];
        let tags = |h: &str| Tags::parse([h.as_bytes()]).unwrap();
        assert_eq!(
            tags("team=search,feature=any").first_not_allowed(Some(&list)),
            None
        );
        assert_eq!(
            tags("team=ads").first_not_allowed(Some(&list)),
            Some("team=ads".to_owned())
        );
        assert_eq!(
            tags("env=x").first_not_allowed(Some(&list)),
            Some("env=x".to_owned())
        );
        assert_eq!(tags("").first_not_allowed(Some(&list)), None);
        assert_eq!(tags("env=x").first_not_allowed(None), None);
        assert!(allowed_tags("f", &list).is_ok());
        assert_eq!(allowed_tags("f", &[" team=* ".into()]).unwrap(), vec!["team=*"]);
        for bad in [
            vec![],
            vec!["team".into()],
            vec!["Team=x".into()],
            vec!["a=b".into(), "a=b".into()],
        ] {
            assert!(allowed_tags("f", &bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn end_users() {
        let huge = format!("\"{}\"", "u".repeat(257));
        /// Header, body `metadata.user_id` (messages only), body `user`, and the end user or the
        /// refused param.
        type Row<'a> = (
            Option<&'a str>,
            Option<&'a str>,
            Option<&'a str>,
            Result<Option<&'a str>, &'a str>,
        );
        let rows: &[Row] = &[
            (None, None, None, Ok(None)),
            (Some("alice"), None, None, Ok(Some("alice"))),
            (Some(" alice "), None, Some("\"bob\""), Ok(Some("alice"))),
            (None, None, Some("\"bob\""), Ok(Some("bob"))),
            (Some(""), None, Some("\"bob\""), Ok(Some("bob"))),
            (None, None, Some("null"), Ok(None)),
            (None, None, Some("\"  \""), Ok(None)),
            (None, None, Some("42"), Err("user")),
            (None, None, Some("{\"a\":1}"), Err("user")),
            (None, None, Some(&huge), Err("user")),
            (None, None, Some("\"a\\u0000b\""), Err("user")),
            (Some(&huge), None, None, Err(END_USER_HEADER)),
            // Anthropic's messages: `metadata.user_id`, then `user`; the header still wins.
            (None, Some("\"m-1\""), None, Ok(Some("m-1"))),
            (None, Some("\" m-1 \""), Some("\"bob\""), Ok(Some("m-1"))),
            (Some("alice"), Some("\"m-1\""), None, Ok(Some("alice"))),
            (None, Some("null"), Some("\"bob\""), Ok(Some("bob"))),
            (None, Some("\"\""), Some("\"bob\""), Ok(Some("bob"))),
            (None, Some("7"), Some("\"bob\""), Err("metadata.user_id")),
            (None, Some(&huge), None, Err("metadata.user_id")),
            (None, Some("null"), Some("[]"), Err("user")),
        ];
        for (header, metadata, user, want) in rows {
            let fields = [("metadata.user_id", *metadata), ("user", *user)];
            let got = end_user(header.map(str::as_bytes), &fields);
            let got = got.as_ref().map(|o| o.as_deref()).map_err(|r| r.param);
            assert_eq!(got, *want, "{header:?} {metadata:?} {user:?}");
        }
    }
}
