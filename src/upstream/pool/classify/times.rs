//! The instants and waits that failures name: `Retry-After`, `x-ratelimit-reset*` values, Go
//! durations, Anthropic's spend-limit dates, and the UTC midnights and month starts that
//! providers' daily and monthly quotas reset at.

use chrono::{DateTime, Datelike, NaiveDate, NaiveTime, TimeDelta, Utc};

/// `now + wait`, saturating at the latest representable instant.
pub(super) fn after(now: DateTime<Utc>, wait: TimeDelta) -> DateTime<Utc> {
    now.checked_add_signed(wait).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A non-negative number of seconds as a [`TimeDelta`]; `None` if negative, not finite, or
/// beyond about 31 years.
pub(super) fn seconds_f64(seconds: f64) -> Option<TimeDelta> {
    if !seconds.is_finite() || !(0.0..=1e9).contains(&seconds) {
        return None;
    }
    Some(TimeDelta::nanoseconds((seconds * 1e9).round() as i64))
}

/// An epoch number: milliseconds from 10^12 up, seconds from 10^9 up.
pub(super) fn epoch_number(n: f64) -> Option<DateTime<Utc>> {
    if !n.is_finite() || n < 0.0 {
        return None;
    }
    let millis = if n >= 1e12 { n } else { n * 1000.0 };
    DateTime::<Utc>::from_timestamp_millis(millis.round() as i64)
}

/// The next 00:00 UTC strictly after `now`.
pub fn next_utc_midnight(now: DateTime<Utc>) -> DateTime<Utc> {
    now.date_naive()
        .succ_opt()
        .map(|day| day.and_time(NaiveTime::MIN).and_utc())
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// 00:00 UTC on the 1st of the month after `now`'s.
pub fn first_of_next_month_utc(now: DateTime<Utc>) -> DateTime<Utc> {
    let (year, month) = if now.month() == 12 {
        (now.year() + 1, 1)
    } else {
        (now.year(), now.month() + 1)
    };
    NaiveDate::from_ymd_opt(year, month, 1)
        .map(|day| day.and_time(NaiveTime::MIN).and_utc())
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Reads a `Retry-After` value: delay seconds (`"30"`, leniently `"1.5"`) or an HTTP-date
/// (`"Sun, 15 Mar 2026 10:25:00 GMT"`). Returns the instant it names, past or not.
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let value = value.trim();
    if is_plain_number(value) {
        return seconds_f64(value.parse().ok()?).map(|wait| after(now, wait));
    }
    httpdate::parse_http_date(value).ok().map(DateTime::<Utc>::from)
}

/// Reads an `x-ratelimit-reset*` (or `anthropic-ratelimit-*-reset`) value. Returns the instant it
/// names, past or not. Accepted forms:
/// - a number: epoch milliseconds from 10^12 up, epoch seconds from 10^9 up, below that a delay in
///   seconds (`"33011.38"`), since no provider means a date in 1970;
/// - an OpenAI/Go duration: `"6m0s"`, `"1s"`, `"20ms"`, `"1h2m3.5s"`;
/// - an RFC 3339 date (`"2026-03-15T10:21:00Z"`, Anthropic) or an HTTP-date.
pub fn parse_reset_value(value: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let value = value.trim();
    if is_plain_number(value) {
        let n: f64 = value.parse().ok()?;
        return if n >= 1e9 {
            epoch_number(n)
        } else {
            seconds_f64(n).map(|wait| after(now, wait))
        };
    }
    if let Some(wait) = parse_go_duration(value) {
        return Some(after(now, wait));
    }
    if let Ok(at) = DateTime::parse_from_rfc3339(value) {
        return Some(at.with_timezone(&Utc));
    }
    httpdate::parse_http_date(value).ok().map(DateTime::<Utc>::from)
}

pub(super) fn is_plain_number(value: &str) -> bool {
    value.bytes().any(|b| b.is_ascii_digit())
        && value.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && value.bytes().filter(|b| *b == b'.').count() <= 1
}

/// Reads a Go-style duration as OpenAI's reset headers and protobuf's JSON Duration write it:
/// `"6m0s"`, `"1s"`, `"20ms"`, `"1h2m3.5s"`, `"37s"`, `"0"`. Units h, m, s, ms, us (µs), ns;
/// no sign, no spaces.
pub fn parse_go_duration(value: &str) -> Option<TimeDelta> {
    let mut rest = value.trim();
    if rest == "0" {
        return Some(TimeDelta::zero());
    }
    if rest.is_empty() {
        return None;
    }
    let mut nanos = 0.0_f64;
    while !rest.is_empty() {
        let number_len = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let number: f64 = rest.get(..number_len)?.parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3.6e12,
            "m" => 6e10,
            "s" => 1e9,
            "ms" => 1e6,
            "us" | "µs" | "μs" => 1e3,
            "ns" => 1.0,
            _ => return None,
        };
        nanos += number * scale;
        rest = &rest[unit_len..];
    }
    seconds_f64(nanos / 1e9)
}

/// Reads the date an Anthropic spend-limit message names ("You will regain access on 2026-04-01
/// at 00:00 UTC."): the first `YYYY-MM-DD` after "regain access on" (or anywhere, if that phrase
/// is missing), with the time from `THH:MM:SSZ` (RFC 3339) or ` at HH:MM`, else 00:00 UTC.
pub fn parse_named_date(text: &str) -> Option<DateTime<Utc>> {
    let lower = text.to_ascii_lowercase();
    let from = lower.find("regain access on").unwrap_or(0);
    let bytes = text.as_bytes();
    let start = (from..bytes.len().saturating_sub(9)).find(|&i| is_iso_date(&bytes[i..i + 10]))?;
    let day = NaiveDate::parse_from_str(&text[start..start + 10], "%Y-%m-%d").ok()?;
    let rest = &text[start + 10..];
    if rest.starts_with(['T', 't']) {
        let token_len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, ':' | '.' | '+' | '-')))
            .unwrap_or(rest.len());
        let token = format!(
            "{}{}",
            &text[start..start + 10],
            rest[..token_len].trim_end_matches('.')
        );
        if let Ok(at) = DateTime::parse_from_rfc3339(&token) {
            return Some(at.with_timezone(&Utc));
        }
    }
    let time = rest
        .strip_prefix(" at ")
        .and_then(|clock| {
            let hh_mm = clock.get(..5)?;
            NaiveTime::parse_from_str(hh_mm, "%H:%M").ok()
        })
        .unwrap_or(NaiveTime::MIN);
    Some(day.and_time(time).and_utc())
}

pub(super) fn is_iso_date(b: &[u8]) -> bool {
    b.len() == 10
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            _ => c.is_ascii_digit(),
        })
}
