//! Quota windows: what a window string means, where the window around an instant starts and
//! ends, and the `reset_at` value that refusals and quota headers report (DESIGN.md §4, seed 003
//! "Quota or budget used up").
//!
//! # Window strings
//!
//! A policy's window is one of `minute`, `<N>minutes`, `day`, `week`, `month` or `total`. `N` is written
//! in digits directly before `minutes`, is at least 1 and divides 1440 (the minutes in a day), so
//! the N-minute windows of an ordinary day end exactly at midnight. [`Window`]'s `Display` gives
//! the canonical string, used in the refusal message (`rate limit exceeded on apikey
//! total_tokens/day`), in the error body's `window` field, and as part of the counter key.
//!
//! - `1minutes` is accepted and normalised to [`Window::Minute`]: it is the same window, and
//!   counters are keyed by the window, so two spellings must not become two counters.
//! - Leading zeros (`05minutes`) are accepted and normalised (`5minutes`) for the same reason.
//! - `1440minutes` is kept apart from `day`. The two agree on days of 24 hours or less; on a
//!   25-hour day (DST fall back) `1440minutes` has a 24-hour window followed by a 1-hour one.
//! - Matching is exact and case-sensitive (`Day`, ` day`, `5 minutes` are refused) because the
//!   config contract spells the values in lower case and the string reappears in client-facing
//!   messages.
//!
//! # Alignment and daylight saving time
//!
//! Windows are aligned in the workspace's time zone ([`DEFAULT_TZ`] = Asia/Shanghai unless
//! configured) and every boundary is a real instant:
//!
//! - A **day** runs from the start of a local date to the start of the next local date, so it
//!   lasts 23 or 25 hours on DST change days (and other lengths in some historical zones).
//! - The **start of a local date** is its local 00:00. Where 00:00 does not exist (zones that
//!   jump forward at midnight: America/Santiago, America/Havana, Asia/Beirut on their spring
//!   dates) it is the first instant of that date that exists, e.g. 01:00 -03:00 in Santiago on
//!   2026-09-06. Where 00:00 happens twice (America/Havana on its autumn date) it is the earlier
//!   of the two, so the day that begins then is 25 hours long. Either way it is the first instant
//!   at which the local clock reads that date's midnight or later.
//! - **N-minute windows** (and `minute`, which is N = 1) are N real minutes counted from the
//!   start of the local day; the last window of a day is cut short at the next day's start. On a
//!   normal day this is the wall-clock grid (00:00, 00:05, …); after a DST jump the grid keeps
//!   counting real minutes, so a `45minutes` window can straddle the jump.
//! - A **week** is an ISO week: from the start of its Monday to the start of the next Monday
//!   (167 or 169 hours when a DST change falls inside it).
//! - A **month** runs from the start of its 1st to the start of the next month's 1st.
//! - **`total`** has no bounds and never resets.
//!
//! Every computed window `[start, end)` contains the instant it was asked for, and consecutive
//! windows tile time without gaps or overlaps. The tests check this for every zone chrono-tz
//! knows (days 2025-2028 and months 2020-2030 always; days 1850-2060 in an ignored test).
//!
//! # Reset time
//!
//! [`reset_at`] is 60 to 120 s after the window's real end, spread per subject by a stable hash
//! (FNV-1a, not std's randomly seeded hasher) so a crowd of refused clients does not return in
//! the same second, and so every replica and every restart tells a subject the same time. It is
//! rendered in the zone's offset at that instant, to whole seconds.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Datelike, FixedOffset, NaiveDate, NaiveDateTime, NaiveTime, SecondsFormat};
use chrono::{LocalResult, Offset, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

use super::SubjectKind;

/// The zone windows are aligned in when a workspace configures none (DESIGN.md §4, §8).
pub const DEFAULT_TZ: Tz = chrono_tz::Asia::Shanghai;

/// Minutes in a normal day; `N` in `<N>minutes` must divide it.
const MINUTES_PER_DAY: u32 = 1440;

/// Smallest delay of [`reset_at`] after the window's real end, in seconds (seed 003: 1 to 2
/// minutes later, so a retry after it is not refused early).
pub const RESET_DELAY_MIN_SECS: i64 = 60;

/// Largest delay of [`reset_at`] after the window's real end, in seconds (inclusive).
pub const RESET_DELAY_MAX_SECS: i64 = 120;

/// A quota window kind (DESIGN.md §4). Parse it from and print it as its canonical string.
///
/// Build `Minutes` through [`FromStr`] or [`Window::minutes`], which enforce the rules on `N`.
/// A `Minutes(n)` built by hand with a value they refuse is still handled without panicking:
/// 0 acts as 1, and any other `n` counts `n`-minute windows from local midnight with the last
/// one cut short at the next midnight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Window {
    /// One minute; the same as `1minutes`.
    Minute,
    /// `N` minutes, counted from local midnight; `N` ≥ 2 and divides 1440 when parsed.
    Minutes(u32),
    /// A local calendar day, 00:00 to the next 00:00.
    Day,
    /// An ISO week in local time, Monday 00:00 to the next Monday 00:00.
    Week,
    /// A local calendar month, the 1st 00:00 to the next 1st 00:00.
    Month,
    /// Cumulative: never resets, has no bounds and no reset time.
    Total,
}

impl Window {
    /// The `<N>minutes` window, checked and normalised like the parser does (`1` gives
    /// [`Window::Minute`]). For admin inputs that carry `N` as a number.
    pub fn minutes(n: u32) -> Result<Self, WindowParseError> {
        checked_minutes(n).map_err(|reason| WindowParseError {
            input: format!("{n}minutes"),
            reason,
        })
    }
}

/// Shared by the parser and [`Window::minutes`] so both apply the same rule.
fn checked_minutes(n: u32) -> Result<Window, WindowParseReason> {
    match n {
        0 => Err(WindowParseReason::Zero),
        1 => Ok(Window::Minute),
        n if n > MINUTES_PER_DAY => Err(WindowParseReason::LongerThanDay),
        n if MINUTES_PER_DAY % n != 0 => Err(WindowParseReason::NotDivisor),
        n => Ok(Window::Minutes(n)),
    }
}

impl Window {
    /// The window's name: a fixed word, or `Err(N)` for `<N>minutes` (N ≥ 2), whose name is N
    /// followed by `minutes`.
    pub fn name(&self) -> Result<&'static str, u32> {
        match self {
            // `Minutes(1)` prints as `minute` so a hand-built value still keys the same counter.
            Window::Minute | Window::Minutes(1) => Ok("minute"),
            Window::Minutes(n) => Err(*n),
            Window::Day => Ok("day"),
            Window::Week => Ok("week"),
            Window::Month => Ok("month"),
            Window::Total => Ok("total"),
        }
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Ok(name) => f.write_str(name),
            Err(n) => write!(f, "{n}minutes"),
        }
    }
}

impl FromStr for Window {
    type Err = WindowParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fail = |reason| WindowParseError {
            input: s.to_owned(),
            reason,
        };
        match s {
            "minute" => return Ok(Window::Minute),
            "day" => return Ok(Window::Day),
            "week" => return Ok(Window::Week),
            "month" => return Ok(Window::Month),
            "total" => return Ok(Window::Total),
            _ => {}
        }
        let Some(digits) = s.strip_suffix("minutes") else {
            return Err(fail(WindowParseReason::Unknown));
        };
        if digits.is_empty() {
            return Err(fail(WindowParseReason::MissingN));
        }
        // Digits only: refuses signs, spaces, decimals and `u32::from_str`'s leading `+`.
        if !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(fail(WindowParseReason::NotDigits));
        }
        // All digits, so the only parse failure is overflow: a number far beyond a day.
        let n = digits
            .parse::<u32>()
            .map_err(|_| fail(WindowParseReason::LongerThanDay))?;
        checked_minutes(n).map_err(fail)
    }
}

impl TryFrom<String> for Window {
    type Error = WindowParseError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Window> for String {
    fn from(window: Window) -> Self {
        window.to_string()
    }
}

/// A window string that is not `minute`, `<N>minutes`, `day`, `week`, `month` or `total`. Its message
/// names the bad value and the rule it breaks, e.g.
/// `bad window "7minutes": N must divide 1440 (minutes in a day)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowParseError {
    input: String,
    reason: WindowParseReason,
}

impl WindowParseError {
    /// The string that was refused, as given.
    pub fn input(&self) -> &str {
        &self.input
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WindowParseReason {
    Unknown,
    MissingN,
    NotDigits,
    Zero,
    NotDivisor,
    LongerThanDay,
}

impl fmt::Display for WindowParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.reason {
            WindowParseReason::Unknown => "expected minute, <N>minutes, day, week, month or total",
            WindowParseReason::MissingN => "missing N before \"minutes\" (e.g. 5minutes)",
            WindowParseReason::NotDigits => {
                "N must be a whole number written in digits directly before \"minutes\", \
                 without sign or space (e.g. 5minutes)"
            }
            WindowParseReason::Zero => "N must be at least 1",
            WindowParseReason::NotDivisor => "N must divide 1440 (minutes in a day)",
            WindowParseReason::LongerThanDay => {
                "N must divide 1440 (minutes in a day), so it is at most 1440; \
                 use day, week or month for longer windows"
            }
        };
        // `{:?}` quotes the value and escapes control characters, so odd input stays readable.
        write!(f, "bad window {:?}: {why}", self.input)
    }
}

impl std::error::Error for WindowParseError {}

/// The instants a window covers: `[start, end)`. Both are whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowBounds {
    /// The first instant in the window.
    pub start: DateTime<Utc>,
    /// The first instant after the window: the window's real end, when its usage resets.
    pub end: DateTime<Utc>,
}

impl WindowBounds {
    /// Whether `at` falls in `[start, end)`.
    pub fn contains(&self, at: DateTime<Utc>) -> bool {
        self.start <= at && at < self.end
    }
}

/// The window of kind `window` that contains `at`, aligned in `tz`; `None` for
/// [`Window::Total`], which has no bounds. See the module doc for DST and midnight rules.
///
/// The result contains `at` for every instant a clock can produce. Only within a day of the
/// ends of chrono's range (years ±262 000) is `end` clamped to chrono's last instant.
///
/// Each thread keeps the last few windows it computed ([`RECENT`]): the windows of a kind and
/// zone partition time, so a window found there that contains `at` is the one that would be
/// computed, and a request's policies (and the next requests') mostly share a few of them.
pub fn bounds(window: Window, at: DateTime<Utc>, tz: Tz) -> Option<WindowBounds> {
    if window == Window::Total {
        return None;
    }
    RECENT.with_borrow_mut(|recent| {
        if let Some((_, _, b)) = recent.find(|(w, z, b)| *w == window && *z == tz && b.contains(at)) {
            return Some(*b);
        }
        let b = computed_bounds(window, at, tz)?;
        if b.contains(at) {
            recent.keep((window, tz, b));
        }
        Some(b)
    })
}

/// The last few values a thread computed, found again by what they were computed from and
/// replaced in turn: [`bounds`]' windows and [`subject_reset_at`]'s resets.
struct Remembered<T: Copy> {
    /// The slot the next value replaces.
    next: usize,
    slots: [Option<T>; 8],
}

impl<T: Copy> Remembered<T> {
    const fn new() -> Self {
        Remembered {
            next: 0,
            slots: [None; 8],
        }
    }

    /// The remembered value `is` accepts, if any.
    fn find(&self, is: impl Fn(&T) -> bool) -> Option<&T> {
        self.slots.iter().flatten().find(|t| is(t))
    }

    /// Remembers `value` in place of the oldest.
    fn keep(&mut self, value: T) {
        self.slots[self.next] = Some(value);
        self.next = (self.next + 1) % self.slots.len();
    }
}

thread_local! {
    /// The windows [`bounds`] computed last on this thread, by kind and zone.
    static RECENT: std::cell::RefCell<Remembered<(Window, Tz, WindowBounds)>> =
        const { std::cell::RefCell::new(Remembered::new()) };
}

/// [`bounds`] computed.
fn computed_bounds(window: Window, at: DateTime<Utc>, tz: Tz) -> Option<WindowBounds> {
    match window {
        Window::Total => None,
        Window::Day => Some(calendar_bounds(at, tz, Period::Day)),
        Window::Week => Some(calendar_bounds(at, tz, Period::Week)),
        Window::Month => Some(calendar_bounds(at, tz, Period::Month)),
        Window::Minute => Some(minutes_bounds(at, tz, 1)),
        Window::Minutes(n) => Some(minutes_bounds(at, tz, n)),
    }
}

/// The counter key part for the window containing `at`: Unix seconds of its start, or 0 for
/// [`Window::Total`]. Counters are keyed by (subject, metric, window, this).
pub fn window_start_key(window: Window, at: DateTime<Utc>, tz: Tz) -> i64 {
    bounds(window, at, tz).map_or(0, |b| b.start.timestamp())
}

/// When a subject refused in a window ending at `bounds_end` may come back: 60 to 120 s after
/// the end (seed 003), the same for a given `subject_key` in every process and version (FNV-1a),
/// spread across subjects, in `tz`'s offset at that instant, whole seconds. A fractional
/// `bounds_end` (not produced by [`bounds`]) is rounded up first, so the time is never early.
///
/// The `x-aigw-quota-<metric>-reset` header is this value's `.timestamp()`; the error body's
/// `reset_at` is [`format_reset_at`] of it.
pub fn reset_at(bounds_end: DateTime<Utc>, subject_key: &str, tz: Tz) -> DateTime<FixedOffset> {
    // 61 possible delays, 60 to 120 inclusive; the remainder is below 61, so the cast is lossless.
    let spread_range = RESET_DELAY_MAX_SECS.abs_diff(RESET_DELAY_MIN_SECS) + 1;
    let spread = (fnv1a_64(subject_key.as_bytes()) % spread_range) as i64;
    let end_secs = bounds_end.timestamp() + i64::from(bounds_end.timestamp_subsec_nanos() > 0);
    let reset = DateTime::from_timestamp(end_secs.saturating_add(RESET_DELAY_MIN_SECS + spread), 0)
        // Out of range only within two minutes of chrono's last instant (year 262 143), which
        // no clock produces; the window end itself is then the best representable answer.
        .unwrap_or(bounds_end);
    reset.with_timezone(&tz).fixed_offset()
}

/// [`reset_at`] of the subject `id` of kind `subject` (its key `<subject>:<id>`), remembered on
/// this thread: a subject's reset is the same on every request of its window.
pub fn subject_reset_at(
    bounds_end: DateTime<Utc>,
    subject: SubjectKind,
    id: i64,
    tz: Tz,
) -> DateTime<FixedOffset> {
    RESETS.with_borrow_mut(|recent| {
        let known = recent.find(|(e, s, i, z, _)| *e == bounds_end && *s == subject && *i == id && *z == tz);
        if let Some((.., r)) = known {
            return *r;
        }
        // "<subject>:<id>" written on the stack without `fmt`.
        let (kind, mut digits) = (subject.as_str(), itoa::Buffer::new());
        let digits = digits.format(id);
        let mut key = [0u8; 48];
        let len = kind.len() + 1 + digits.len();
        key[..kind.len()].copy_from_slice(kind.as_bytes());
        key[kind.len()] = b':';
        key[kind.len() + 1..len].copy_from_slice(digits.as_bytes());
        let r = reset_at(
            bounds_end,
            std::str::from_utf8(&key[..len]).unwrap_or_default(),
            tz,
        );
        recent.keep((bounds_end, subject, id, tz, r));
        r
    })
}

/// A subject's reset: its window's end, kind, id and zone, and the reset.
type Reset = (DateTime<Utc>, SubjectKind, i64, Tz, DateTime<FixedOffset>);

thread_local! {
    /// The resets [`subject_reset_at`] computed last on this thread.
    static RESETS: std::cell::RefCell<Remembered<Reset>> =
        const { std::cell::RefCell::new(Remembered::new()) };
}

/// [`reset_at`] for the window of kind `window` containing `at`; `None` for
/// [`Window::Total`] (the refusal body's `reset_at` is `null` and the `-reset` header absent).
pub fn reset_at_for(
    window: Window,
    at: DateTime<Utc>,
    subject_key: &str,
    tz: Tz,
) -> Option<DateTime<FixedOffset>> {
    bounds(window, at, tz).map(|b| reset_at(b.end, subject_key, tz))
}

/// The refusal body's `reset_at` string: RFC 3339, whole seconds, numeric offset
/// (`2026-12-02T00:01:27+08:00`; a UTC zone gives `+00:00`, not `Z`, like every other zone).
pub fn format_reset_at(reset_at: &DateTime<FixedOffset>) -> String {
    reset_at.to_rfc3339_opts(SecondsFormat::Secs, false)
}

/// Whole seconds from `now` until `reset_at`, rounded up and never negative: the delta form
/// the IETF `RateLimit` field's `t` parameter wants.
pub fn seconds_until_reset(reset_at: &DateTime<FixedOffset>, now: DateTime<Utc>) -> u64 {
    let delta = reset_at.with_timezone(&Utc) - now;
    let whole = delta.num_seconds();
    // `num_seconds` truncates toward zero; a positive fraction left over means one more second.
    let rounded_up = if delta > TimeDelta::seconds(whole) {
        whole.saturating_add(1)
    } else {
        whole
    };
    u64::try_from(rounded_up).unwrap_or(0)
}

/// Reads a configured zone name (`AIGW_TIMEZONE`, a workspace's `timezone`). Surrounding
/// whitespace is ignored, since no zone name contains any. Matching is case-sensitive like the
/// IANA database; a name that differs only in case gets the right spelling suggested.
pub fn parse_tz(name: &str) -> Result<Tz, String> {
    let trimmed = name.trim();
    if let Ok(tz) = trimmed.parse::<Tz>() {
        return Ok(tz);
    }
    if trimmed.is_empty() {
        return Err(format!(
            "bad time zone {name:?}: empty; expected an IANA zone name such as Asia/Shanghai"
        ));
    }
    let suggestion = chrono_tz::TZ_VARIANTS
        .iter()
        .find(|tz| tz.name().eq_ignore_ascii_case(trimmed))
        .map(|tz| format!(" (did you mean {}?)", tz.name()))
        .unwrap_or_default();
    Err(format!(
        "bad time zone {name:?}: not an IANA zone name{suggestion}; \
         expected e.g. Asia/Shanghai, Europe/Berlin or UTC"
    ))
}

/// FNV-1a, 64 bit. Chosen for being fixed by its definition: the spread of [`reset_at`] must
/// not change between processes, replicas or releases, which rules out std's `RandomState`.
fn fnv1a_64(bytes: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET_BASIS, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(PRIME))
}

/// The calendar periods whose bounds are local date starts.
#[derive(Clone, Copy)]
enum Period {
    Day,
    Week,
    Month,
}

impl Period {
    /// The first local date of the period containing `date`.
    fn first_date(self, date: NaiveDate) -> NaiveDate {
        match self {
            Period::Day => date,
            // ISO weeks start on Monday; only at the first dates of chrono's range is there no
            // Monday before, and `date` is a safe fallback there.
            Period::Week => date
                .checked_sub_days(chrono::Days::new(u64::from(
                    date.weekday().num_days_from_monday(),
                )))
                .unwrap_or(date),
            // Day 1 exists in every month, so `with_day(1)` cannot fail; `date` is a safe
            // fallback all the same.
            Period::Month => date.with_day(1).unwrap_or(date),
        }
    }

    /// The first local date of the next period; `None` only past chrono's last date.
    fn next_first_date(self, first: NaiveDate) -> Option<NaiveDate> {
        match self {
            Period::Day => first.succ_opt(),
            Period::Week => first.checked_add_days(chrono::Days::new(7)),
            Period::Month if first.month() == 12 => NaiveDate::from_ymd_opt(first.year() + 1, 1, 1),
            Period::Month => NaiveDate::from_ymd_opt(first.year(), first.month() + 1, 1),
        }
    }
}

/// Bounds of the day, week or month containing `at`, from one local date start to the next.
fn calendar_bounds(at: DateTime<Utc>, tz: Tz, period: Period) -> WindowBounds {
    let mut first = period.first_date(local_date(at, tz));
    let mut start = local_date_start(tz, first);
    // `at` is never before `start`: the clock cannot show `at`'s date before first reaching
    // that date's midnight (or the end of the gap over it). `at` can be at or after `end` only
    // when the clock fell back across midnight: the repeated hours carry the old date but come
    // after the next date began (its earliest midnight counts). The largest such fall back in
    // tzdb is one day (Alaska, 1867), which one step forward covers; four leave a margin.
    for _ in 0..4 {
        let next = period.next_first_date(first);
        let end = next.map_or(DateTime::<Utc>::MAX_UTC, |d| local_date_start(tz, d));
        match next {
            Some(next) if at >= end => {
                first = next;
                start = end;
            }
            _ => return WindowBounds { start, end },
        }
    }
    // Not reached with tzdb data (see above); a one-second window still contains `at`, so the
    // caller's invariant holds and counters stay distinct.
    let start = whole_second(at);
    WindowBounds {
        start,
        end: start
            .checked_add_signed(TimeDelta::seconds(1))
            .unwrap_or(DateTime::<Utc>::MAX_UTC),
    }
}

/// The local date of `at` in `tz`. chrono's `date_naive()` panics when the offset pushes the
/// local time past its range; here that case (the first or last day of chrono's range, year
/// ±262 143) falls back to the UTC date, one day off at most.
fn local_date(at: DateTime<Utc>, tz: Tz) -> NaiveDate {
    let offset = tz.offset_from_utc_datetime(&at.naive_utc()).fix();
    at.naive_utc()
        .checked_add_offset(offset)
        .unwrap_or(at.naive_utc())
        .date()
}

/// Bounds of the `n`-minute window containing `at`: `n` real minutes counted from the start of
/// the local day, the last one cut short at the next day's start.
fn minutes_bounds(at: DateTime<Utc>, tz: Tz, n: u32) -> WindowBounds {
    let day = calendar_bounds(at, tz, Period::Day);
    let len = i64::from(n.max(1)) * 60;
    let day_start = day.start.timestamp();
    let elapsed = (at.timestamp() - day_start).max(0);
    let start_secs = day_start + elapsed / len * len;
    let end_secs = start_secs.saturating_add(len).min(day.end.timestamp());
    // Both lie in `[day.start, day.end]`, which are valid instants, so the fallbacks (the day's
    // own bounds) are never taken.
    WindowBounds {
        start: DateTime::from_timestamp(start_secs, 0).unwrap_or(day.start),
        end: DateTime::from_timestamp(end_secs, 0).unwrap_or(day.end),
    }
}

/// The first instant at which `tz`'s clock reads `date` 00:00 or later: local midnight; the
/// earlier one when midnight happens twice; the first instant after the gap when it is skipped.
fn local_date_start(tz: Tz, date: NaiveDate) -> DateTime<Utc> {
    let midnight = date.and_time(NaiveTime::MIN);
    match first_existing(tz, midnight) {
        Some(start) => start,
        // No zone skips two days, so this only answers for dates at the ends of chrono's range
        // (year ±262 143), where reading the local time as UTC is at most a day off.
        None => Utc.from_utc_datetime(&midnight),
    }
}

/// Longest local span searched for the end of a gap: the largest gaps in tzdb are one day
/// (Pacific/Apia skipped 2011-12-30, Kwajalein 1969-10-01), so two days is ample.
const MAX_GAP_MINUTES: i64 = 2 * 24 * 60;

/// The earliest instant whose local reading is `local` or, if `local` falls in a gap, the first
/// reading after it.
fn first_existing(tz: Tz, local: NaiveDateTime) -> Option<DateTime<Utc>> {
    if let Some(found) = earliest_at(tz, local) {
        return Some(found);
    }
    // In a gap: find the first existing local minute, then the first existing second before it
    // (tzdb gaps can end off the minute, e.g. when leaving local mean time).
    for minute in 1..=MAX_GAP_MINUTES {
        let candidate = local.checked_add_signed(TimeDelta::minutes(minute))?;
        if earliest_at(tz, candidate).is_some() {
            for back in (1..60).rev() {
                let Some(earlier) = candidate.checked_sub_signed(TimeDelta::seconds(back)) else {
                    continue;
                };
                if earlier > local {
                    if let Some(found) = earliest_at(tz, earlier) {
                        return Some(found);
                    }
                }
            }
            return earliest_at(tz, candidate);
        }
    }
    None
}

/// The earliest instant whose local reading is exactly `local`, if any.
fn earliest_at(tz: Tz, local: NaiveDateTime) -> Option<DateTime<Utc>> {
    match tz.from_local_datetime(&local) {
        LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
        LocalResult::Ambiguous(a, b) => Some(a.with_timezone(&Utc).min(b.with_timezone(&Utc))),
        LocalResult::None => None,
    }
}

/// `at` without its fraction of a second (floor).
fn whole_second(at: DateTime<Utc>) -> DateTime<Utc> {
    // `at.timestamp()` is in range because `at` is; the fallback is `at` itself.
    DateTime::from_timestamp(at.timestamp(), 0).unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono_tz::{America, Asia, Europe, Pacific};

    #[test]
    fn a_subjects_remembered_reset_is_its_keys() {
        let end = Utc.with_ymd_and_hms(2026, 12, 7, 0, 0, 0).unwrap();
        let kinds = [
            SubjectKind::Apikey,
            SubjectKind::EndUser,
            SubjectKind::Tag,
            SubjectKind::Ws,
        ];
        // Twice round more subjects than are remembered: computed, then found or recomputed.
        for _ in 0..2 {
            for (n, kind) in kinds.into_iter().enumerate() {
                for id in [0, 7, 42, i64::MAX, i64::MIN] {
                    for tz in [chrono_tz::UTC, Asia::Shanghai] {
                        let end = end + TimeDelta::minutes(n as i64);
                        let want = reset_at(end, &format!("{}:{id}", kind.as_str()), tz);
                        assert_eq!(subject_reset_at(end, kind, id, tz), want, "{kind:?} {id} {tz}");
                        assert_eq!(
                            subject_reset_at(end, kind, id, tz),
                            want,
                            "{kind:?} {id} {tz}, again"
                        );
                    }
                }
            }
        }
    }

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .unwrap_or_else(|e| panic!("test instant {s:?}: {e}"))
            .with_timezone(&Utc)
    }

    fn window(s: &str) -> Window {
        s.parse().unwrap_or_else(|e| panic!("test window {s:?}: {e}"))
    }

    const SH: Tz = Asia::Shanghai;
    const NY: Tz = America::New_York;
    const BER: Tz = Europe::Berlin;
    const SCL: Tz = America::Santiago;
    const HAV: Tz = America::Havana;
    const BEY: Tz = Asia::Beirut;

    /// One row: window, zone, instant, expected `[start, end)` (`None` for `total`). Instants
    /// are written in the zone's local offset so the row reads like a wall clock.
    struct BoundsCase {
        name: &'static str,
        window: &'static str,
        tz: Tz,
        at: &'static str,
        expect: Option<(&'static str, &'static str)>,
    }

    const fn case(
        name: &'static str,
        window: &'static str,
        tz: Tz,
        at: &'static str,
        start: &'static str,
        end: &'static str,
    ) -> BoundsCase {
        BoundsCase {
            name,
            window,
            tz,
            at,
            expect: Some((start, end)),
        }
    }

    #[rustfmt::skip]
    const BOUNDS_CASES: &[BoundsCase] = &[
        // Beijing, the last second of a day.
        case("bj 23:59:59 minute", "minute", SH, "2026-12-01T23:59:59+08:00", "2026-12-01T23:59:00+08:00", "2026-12-02T00:00:00+08:00"),
        case("bj 23:59:59 5minutes", "5minutes", SH, "2026-12-01T23:59:59+08:00", "2026-12-01T23:55:00+08:00", "2026-12-02T00:00:00+08:00"),
        case("bj 23:59:59 15minutes", "15minutes", SH, "2026-12-01T23:59:59+08:00", "2026-12-01T23:45:00+08:00", "2026-12-02T00:00:00+08:00"),
        case("bj 23:59:59 1440minutes", "1440minutes", SH, "2026-12-01T23:59:59+08:00", "2026-12-01T00:00:00+08:00", "2026-12-02T00:00:00+08:00"),
        case("bj 23:59:59 day", "day", SH, "2026-12-01T23:59:59+08:00", "2026-12-01T00:00:00+08:00", "2026-12-02T00:00:00+08:00"),
        case("bj 23:59:59 month", "month", SH, "2026-12-01T23:59:59+08:00", "2026-12-01T00:00:00+08:00", "2027-01-01T00:00:00+08:00"),
        BoundsCase { name: "bj 23:59:59 total", window: "total", tz: SH, at: "2026-12-01T23:59:59+08:00", expect: None },
        // Beijing 00:00 is 16:00 UTC the previous day: the UTC date must not leak in.
        case("bj 00:00 minute", "minute", SH, "2026-12-02T00:00:00+08:00", "2026-12-02T00:00:00+08:00", "2026-12-02T00:01:00+08:00"),
        case("bj 00:00 5minutes", "5minutes", SH, "2026-12-02T00:00:00+08:00", "2026-12-02T00:00:00+08:00", "2026-12-02T00:05:00+08:00"),
        case("bj 00:00 15minutes", "15minutes", SH, "2026-12-02T00:00:00+08:00", "2026-12-02T00:00:00+08:00", "2026-12-02T00:15:00+08:00"),
        case("bj 00:00 day", "day", SH, "2026-12-02T00:00:00+08:00", "2026-12-02T00:00:00+08:00", "2026-12-03T00:00:00+08:00"),
        case("bj 00:00 month", "month", SH, "2026-12-02T00:00:00+08:00", "2026-12-01T00:00:00+08:00", "2027-01-01T00:00:00+08:00"),
        BoundsCase { name: "bj 00:00 total", window: "total", tz: SH, at: "2026-12-02T00:00:00+08:00", expect: None },
        case("bj 00:00 written in utc", "day", SH, "2026-12-01T16:00:00Z", "2026-12-01T16:00:00Z", "2026-12-02T16:00:00Z"),
        case("bj 23:59:59 written in utc", "day", SH, "2026-12-01T15:59:59Z", "2026-11-30T16:00:00Z", "2026-12-01T16:00:00Z"),
        case("bj first month second, utc", "month", SH, "2026-11-30T16:00:00Z", "2026-11-30T16:00:00Z", "2026-12-31T16:00:00Z"),
        // Beijing, mid-day grids.
        case("bj mid-day 5minutes", "5minutes", SH, "2026-06-15T13:37:42+08:00", "2026-06-15T13:35:00+08:00", "2026-06-15T13:40:00+08:00"),
        case("bj mid-day 15minutes", "15minutes", SH, "2026-06-15T13:37:42+08:00", "2026-06-15T13:30:00+08:00", "2026-06-15T13:45:00+08:00"),
        case("bj mid-day 15minutes on edge", "15minutes", SH, "2026-06-15T13:45:00+08:00", "2026-06-15T13:45:00+08:00", "2026-06-15T14:00:00+08:00"),
        case("bj mid-day 1440minutes", "1440minutes", SH, "2026-06-15T13:37:42+08:00", "2026-06-15T00:00:00+08:00", "2026-06-16T00:00:00+08:00"),
        case("bj mid-day 90minutes", "90minutes", SH, "2026-06-15T13:37:42+08:00", "2026-06-15T13:30:00+08:00", "2026-06-15T15:00:00+08:00"),
        case("bj mid-day minute, fraction", "minute", SH, "2026-06-15T13:37:42.999+08:00", "2026-06-15T13:37:00+08:00", "2026-06-15T13:38:00+08:00"),
        // Month ends.
        case("jan 31 day", "day", SH, "2027-01-31T12:00:00+08:00", "2027-01-31T00:00:00+08:00", "2027-02-01T00:00:00+08:00"),
        case("jan 31 month", "month", SH, "2027-01-31T23:59:59+08:00", "2027-01-01T00:00:00+08:00", "2027-02-01T00:00:00+08:00"),
        case("apr 30 day", "day", SH, "2026-04-30T23:59:59+08:00", "2026-04-30T00:00:00+08:00", "2026-05-01T00:00:00+08:00"),
        case("apr 30 month", "month", SH, "2026-04-30T23:59:59+08:00", "2026-04-01T00:00:00+08:00", "2026-05-01T00:00:00+08:00"),
        case("may 1 month", "month", SH, "2026-05-01T00:00:00+08:00", "2026-05-01T00:00:00+08:00", "2026-06-01T00:00:00+08:00"),
        // Year rollover.
        case("dec 31 minute", "minute", SH, "2026-12-31T23:59:59+08:00", "2026-12-31T23:59:00+08:00", "2027-01-01T00:00:00+08:00"),
        case("dec 31 5minutes", "5minutes", SH, "2026-12-31T23:59:59+08:00", "2026-12-31T23:55:00+08:00", "2027-01-01T00:00:00+08:00"),
        case("dec 31 day", "day", SH, "2026-12-31T23:59:59+08:00", "2026-12-31T00:00:00+08:00", "2027-01-01T00:00:00+08:00"),
        case("dec 31 month", "month", SH, "2026-12-31T23:59:59+08:00", "2026-12-01T00:00:00+08:00", "2027-01-01T00:00:00+08:00"),
        case("jan 1 day", "day", SH, "2027-01-01T00:00:00+08:00", "2027-01-01T00:00:00+08:00", "2027-01-02T00:00:00+08:00"),
        case("jan 1 month", "month", SH, "2027-01-01T00:00:00+08:00", "2027-01-01T00:00:00+08:00", "2027-02-01T00:00:00+08:00"),
        // Leap year 2028 and common year 2027.
        case("feb 28 2028 day ends on leap day", "day", SH, "2028-02-28T23:59:59+08:00", "2028-02-28T00:00:00+08:00", "2028-02-29T00:00:00+08:00"),
        case("leap day day", "day", SH, "2028-02-29T12:00:00+08:00", "2028-02-29T00:00:00+08:00", "2028-03-01T00:00:00+08:00"),
        case("leap day last second", "day", SH, "2028-02-29T23:59:59+08:00", "2028-02-29T00:00:00+08:00", "2028-03-01T00:00:00+08:00"),
        case("feb 2028 month", "month", SH, "2028-02-29T23:59:59+08:00", "2028-02-01T00:00:00+08:00", "2028-03-01T00:00:00+08:00"),
        case("mar 1 2028 month", "month", SH, "2028-03-01T00:00:00+08:00", "2028-03-01T00:00:00+08:00", "2028-04-01T00:00:00+08:00"),
        case("feb 28 2027 day", "day", SH, "2027-02-28T23:59:59+08:00", "2027-02-28T00:00:00+08:00", "2027-03-01T00:00:00+08:00"),
        case("feb 2027 month", "month", SH, "2027-02-14T08:00:00+08:00", "2027-02-01T00:00:00+08:00", "2027-03-01T00:00:00+08:00"),
        // New York spring forward, 2026-03-08 02:00 EST -> 03:00 EDT: a 23-hour day.
        case("ny spring day", "day", NY, "2026-03-08T12:00:00-04:00", "2026-03-08T00:00:00-05:00", "2026-03-09T00:00:00-04:00"),
        case("ny spring 60minutes before jump", "60minutes", NY, "2026-03-08T01:59:59-05:00", "2026-03-08T01:00:00-05:00", "2026-03-08T03:00:00-04:00"),
        case("ny spring 60minutes after jump", "60minutes", NY, "2026-03-08T03:30:00-04:00", "2026-03-08T03:00:00-04:00", "2026-03-08T04:00:00-04:00"),
        case("ny spring 45minutes straddles jump", "45minutes", NY, "2026-03-08T03:10:00-04:00", "2026-03-08T01:30:00-05:00", "2026-03-08T03:15:00-04:00"),
        case("ny spring minute after jump", "minute", NY, "2026-03-08T03:00:00-04:00", "2026-03-08T03:00:00-04:00", "2026-03-08T03:01:00-04:00"),
        case("ny spring 720minutes cut short", "720minutes", NY, "2026-03-08T20:00:00-04:00", "2026-03-08T13:00:00-04:00", "2026-03-09T00:00:00-04:00"),
        case("ny spring 1440minutes = day", "1440minutes", NY, "2026-03-08T20:00:00-04:00", "2026-03-08T00:00:00-05:00", "2026-03-09T00:00:00-04:00"),
        case("ny march month", "month", NY, "2026-03-31T23:59:59-04:00", "2026-03-01T00:00:00-05:00", "2026-04-01T00:00:00-04:00"),
        // New York fall back, 2026-11-01 02:00 EDT -> 01:00 EST: a 25-hour day.
        case("ny fall day", "day", NY, "2026-11-01T12:00:00-05:00", "2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00"),
        case("ny fall 60minutes first 01:30", "60minutes", NY, "2026-11-01T01:30:00-04:00", "2026-11-01T01:00:00-04:00", "2026-11-01T01:00:00-05:00"),
        case("ny fall 60minutes second 01:30", "60minutes", NY, "2026-11-01T01:30:00-05:00", "2026-11-01T01:00:00-05:00", "2026-11-01T02:00:00-05:00"),
        case("ny fall 1440minutes tail hour", "1440minutes", NY, "2026-11-01T23:30:00-05:00", "2026-11-01T23:00:00-05:00", "2026-11-02T00:00:00-05:00"),
        case("ny fall 720minutes tail hour", "720minutes", NY, "2026-11-01T23:00:00-05:00", "2026-11-01T23:00:00-05:00", "2026-11-02T00:00:00-05:00"),
        case("ny fall 720minutes middle", "720minutes", NY, "2026-11-01T22:59:59-05:00", "2026-11-01T11:00:00-05:00", "2026-11-01T23:00:00-05:00"),
        // Berlin, 2026-03-29 02:00 CET -> 03:00 CEST and 2026-10-25 03:00 CEST -> 02:00 CET.
        case("berlin spring day", "day", BER, "2026-03-29T10:00:00+02:00", "2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00"),
        case("berlin fall day", "day", BER, "2026-10-25T10:00:00+01:00", "2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00"),
        case("berlin fall 60minutes second 02:30", "60minutes", BER, "2026-10-25T02:30:00+01:00", "2026-10-25T02:00:00+01:00", "2026-10-25T03:00:00+01:00"),
        case("berlin fall 30minutes first 02:45", "30minutes", BER, "2026-10-25T02:45:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-25T02:00:00+01:00"),
        case("berlin october month", "month", BER, "2026-10-31T23:59:59+01:00", "2026-10-01T00:00:00+02:00", "2026-11-01T00:00:00+01:00"),
        // Santiago jumps at midnight, 2026-09-06 00:00 -04 -> 01:00 -03: the day starts at 01:00.
        case("santiago last second before gap", "day", SCL, "2026-09-05T23:59:59-04:00", "2026-09-05T00:00:00-04:00", "2026-09-06T01:00:00-03:00"),
        case("santiago gap day", "day", SCL, "2026-09-06T12:00:00-03:00", "2026-09-06T01:00:00-03:00", "2026-09-07T00:00:00-03:00"),
        case("santiago gap day first second", "day", SCL, "2026-09-06T01:00:00-03:00", "2026-09-06T01:00:00-03:00", "2026-09-07T00:00:00-03:00"),
        case("santiago gap 5minutes from 01:00", "5minutes", SCL, "2026-09-06T01:02:03-03:00", "2026-09-06T01:00:00-03:00", "2026-09-06T01:05:00-03:00"),
        case("santiago gap 60minutes", "60minutes", SCL, "2026-09-06T12:30:00-03:00", "2026-09-06T12:00:00-03:00", "2026-09-06T13:00:00-03:00"),
        case("santiago gap 1440minutes", "1440minutes", SCL, "2026-09-06T12:30:00-03:00", "2026-09-06T01:00:00-03:00", "2026-09-07T00:00:00-03:00"),
        case("santiago september month", "month", SCL, "2026-09-06T12:00:00-03:00", "2026-09-01T00:00:00-04:00", "2026-10-01T00:00:00-03:00"),
        // Santiago falls back at 2026-04-05 00:00 -03 -> 04-04 23:00 -04: 04-04 lasts 25 hours.
        case("santiago fall day", "day", SCL, "2026-04-04T23:30:00-04:00", "2026-04-04T00:00:00-03:00", "2026-04-05T00:00:00-04:00"),
        // Havana: midnight skipped in March, midnight twice in November (earliest counts).
        case("havana gap day", "day", HAV, "2026-03-08T12:00:00-04:00", "2026-03-08T01:00:00-04:00", "2026-03-09T00:00:00-04:00"),
        case("havana ambiguous midnight day", "day", HAV, "2026-11-01T00:30:00-05:00", "2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00"),
        case("havana day before ambiguous midnight", "day", HAV, "2026-10-31T23:59:59-04:00", "2026-10-31T00:00:00-04:00", "2026-11-01T00:00:00-04:00"),
        case("havana ambiguous 60minutes", "60minutes", HAV, "2026-11-01T00:30:00-05:00", "2026-11-01T00:00:00-05:00", "2026-11-01T01:00:00-05:00"),
        // Beirut: midnight skipped on 2026-03-29.
        case("beirut gap day", "day", BEY, "2026-03-29T08:00:00+03:00", "2026-03-29T01:00:00+03:00", "2026-03-30T00:00:00+03:00"),
        // Samoa skipped 2011-12-30 entirely: the 29th ends when the 31st begins.
        case("apia skipped date", "day", Pacific::Apia, "2011-12-29T23:59:59-10:00", "2011-12-29T00:00:00-10:00", "2011-12-31T00:00:00+14:00"),
        case("apia after skipped date", "day", Pacific::Apia, "2011-12-31T00:00:00+14:00", "2011-12-31T00:00:00+14:00", "2012-01-01T00:00:00+14:00"),
        case("apia december month", "month", Pacific::Apia, "2011-12-31T12:00:00+14:00", "2011-12-01T00:00:00-10:00", "2012-01-01T00:00:00+14:00"),
        // Alaska's 1867 change of calendar turned the clock back a whole day at 15:30 on the
        // 19th (+14:00:24 -> -09:59:36, offsets RFC 3339 cannot write, hence UTC): the second
        // 18th lies after the 19th began, so it belongs to the day of the 19th.
        case("anchorage repeated date", "day", America::Anchorage, "1867-10-19T05:59:36Z", "1867-10-18T09:59:36Z", "1867-10-20T09:59:36Z"),
        // Abidjan left local mean time (-00:16:08) at midnight 1912-01-01: the gap ends off the
        // minute, at 00:16:08 GMT, and the day starts on that second.
        case("abidjan off-minute gap", "day", chrono_tz::Africa::Abidjan, "1912-01-01T12:00:00Z", "1912-01-01T00:16:08Z", "1912-01-02T00:00:00Z"),
        // ISO weeks: Monday 00:00 to Monday 00:00 in the zone.
        case("bj wednesday week", "week", SH, "2026-12-02T13:00:00+08:00", "2026-11-30T00:00:00+08:00", "2026-12-07T00:00:00+08:00"),
        case("bj monday 00:00 week", "week", SH, "2026-11-30T00:00:00+08:00", "2026-11-30T00:00:00+08:00", "2026-12-07T00:00:00+08:00"),
        case("bj sunday last second week", "week", SH, "2026-12-06T23:59:59+08:00", "2026-11-30T00:00:00+08:00", "2026-12-07T00:00:00+08:00"),
        case("bj sunday last second in utc", "week", SH, "2026-12-06T15:59:59Z", "2026-11-29T16:00:00Z", "2026-12-06T16:00:00Z"),
        case("week across the new year", "week", SH, "2027-01-01T12:00:00+08:00", "2026-12-28T00:00:00+08:00", "2027-01-04T00:00:00+08:00"),
        case("ny spring week is 167 h", "week", NY, "2026-03-08T12:00:00-04:00", "2026-03-02T00:00:00-05:00", "2026-03-09T00:00:00-04:00"),
        case("ny fall week is 169 h", "week", NY, "2026-11-01T12:00:00-05:00", "2026-10-26T00:00:00-04:00", "2026-11-02T00:00:00-05:00"),
        case("santiago week after the sunday gap", "week", SCL, "2026-09-07T00:00:00-03:00", "2026-09-07T00:00:00-03:00", "2026-09-14T00:00:00-03:00"),
        case("apia week without a friday", "week", Pacific::Apia, "2011-12-31T12:00:00+14:00", "2011-12-26T00:00:00-10:00", "2012-01-02T00:00:00+14:00"),
        // Total never has bounds, in any zone.
        BoundsCase { name: "total ny", window: "total", tz: NY, at: "2026-03-08T03:00:00-04:00", expect: None },
    ];

    /// Instants in any order, across DST changes and years, in zones with and without DST and
    /// at half-hour offsets: the windows remembered are the windows computed.
    #[test]
    fn remembered_windows_are_the_computed_ones() {
        let zones = [
            DEFAULT_TZ,
            chrono_tz::America::New_York,
            chrono_tz::Europe::London,
            chrono_tz::Asia::Kolkata,
            chrono_tz::Australia::Lord_Howe,
        ];
        let windows = [
            Window::Minute,
            Window::Minutes(5),
            Window::Minutes(90),
            Window::Day,
            Window::Week,
            Window::Month,
        ];
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let start = utc("2024-01-01T00:00:00Z").timestamp_millis();
        for i in 0..20_000_i64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Mostly near the previous instants (hits), sometimes anywhere in three years.
            let spread = if i % 7 == 0 {
                3 * 366 * 86_400_000
            } else {
                3 * 86_400_000
            };
            let at_ms = start + (seed % spread) as i64;
            let at = DateTime::from_timestamp_millis(at_ms).unwrap();
            let w = windows[(seed >> 40) as usize % windows.len()];
            let tz = zones[(seed >> 50) as usize % zones.len()];
            assert_eq!(bounds(w, at, tz), computed_bounds(w, at, tz), "{w} {tz} {at}");
        }
    }

    #[test]
    fn bounds_table() {
        for c in BOUNDS_CASES {
            let at = utc(c.at);
            let w = window(c.window);
            let got = bounds(w, at, c.tz);
            let want = c.expect.map(|(s, e)| WindowBounds {
                start: utc(s),
                end: utc(e),
            });
            assert_eq!(got, want, "{}: {} at {}", c.name, c.window, c.at);
            assert_eq!(
                window_start_key(w, at, c.tz),
                want.map_or(0, |b| b.start.timestamp()),
                "{}: start key",
                c.name
            );
            if let Some(b) = got {
                assert!(b.contains(at), "{}: window must contain its instant", c.name);
            }
        }
    }

    /// Every divisor of 1440 except 1 (which parses to `minute`).
    fn minute_divisors() -> impl Iterator<Item = u32> {
        (2..=MINUTES_PER_DAY).filter(|n| MINUTES_PER_DAY % n == 0)
    }

    /// The local clock has reached `start`'s date at `start` and had not a second before: the
    /// rule for the start of a day, whether midnight exists once, twice or not at all.
    fn assert_first_instant_of_its_date(start: DateTime<Utc>, tz: Tz, what: &str) {
        let local = start.with_timezone(&tz).naive_local();
        let midnight = local.date().and_time(NaiveTime::MIN);
        let before = (start - TimeDelta::seconds(1)).with_timezone(&tz).naive_local();
        assert!(
            local >= midnight && before < midnight,
            "{what}: {start} ({local} local) is not where {} begins in {tz}",
            local.date()
        );
    }

    #[test]
    fn days_tile_and_start_at_local_midnight_in_every_zone() {
        let stop = utc("2029-01-01T00:00:00Z");
        for &tz in chrono_tz::TZ_VARIANTS.iter() {
            let mut at = utc("2025-01-01T00:00:00Z");
            let first = bounds(Window::Day, at, tz);
            let Some(mut day) = first else {
                panic!("{tz}: day has bounds")
            };
            assert!(day.contains(at), "{tz}: first day contains its instant");
            while at < stop {
                assert!(day.start < day.end, "{tz}: empty day at {}", day.start);
                assert_first_instant_of_its_date(day.start, tz, "day start");
                // The last second of the day still belongs to it.
                let last = day.end - TimeDelta::seconds(1);
                assert_eq!(bounds(Window::Day, last, tz), Some(day), "{tz}: last second");
                at = day.end;
                let Some(next) = bounds(Window::Day, at, tz) else {
                    panic!("{tz}: day has bounds")
                };
                assert_eq!(next.start, day.end, "{tz}: days must tile at {at}");
                day = next;
            }
        }
    }

    #[test]
    fn months_tile_and_start_on_the_first_in_every_zone() {
        let stop = utc("2031-01-01T00:00:00Z");
        for &tz in chrono_tz::TZ_VARIANTS.iter() {
            let mut at = utc("2020-01-15T00:00:00Z");
            while at < stop {
                let Some(month) = bounds(Window::Month, at, tz) else {
                    panic!("{tz}: month has bounds")
                };
                assert!(month.contains(at), "{tz}: month contains {at}");
                assert_first_instant_of_its_date(month.start, tz, "month start");
                assert_eq!(month.start.with_timezone(&tz).day(), 1, "{tz}: starts on the 1st");
                let hours = (month.end - month.start).num_hours();
                // 28 to 31 days, give or take an offset change (Antarctica/Casey moves by 3 h).
                assert!((27 * 24..=32 * 24).contains(&hours), "{tz}: {hours} h month");
                let next = bounds(Window::Month, month.end, tz).map(|b| b.start);
                assert_eq!(next, Some(month.end), "{tz}: months must tile");
                at = month.end;
            }
        }
    }

    #[test]
    fn weeks_tile_and_start_on_monday_in_every_zone() {
        let stop = utc("2028-01-01T00:00:00Z");
        for &tz in chrono_tz::TZ_VARIANTS.iter() {
            let mut at = utc("2025-01-01T00:00:00Z");
            while at < stop {
                let Some(week) = bounds(Window::Week, at, tz) else {
                    panic!("{tz}: week has bounds")
                };
                assert!(week.contains(at), "{tz}: week contains {at}");
                assert_first_instant_of_its_date(week.start, tz, "week start");
                assert_eq!(
                    week.start.with_timezone(&tz).weekday(),
                    chrono::Weekday::Mon,
                    "{tz}: starts on Monday"
                );
                let hours = (week.end - week.start).num_hours();
                assert!((6 * 24..=8 * 24).contains(&hours), "{tz}: {hours} h week");
                let next = bounds(Window::Week, week.end, tz).map(|b| b.start);
                assert_eq!(next, Some(week.end), "{tz}: weeks must tile");
                at = week.end;
            }
        }
    }

    #[test]
    fn minute_windows_tile_dst_days_for_every_n() {
        // (zone, an instant on a day whose length is not 24 h or whose midnight is odd)
        let days = [
            (NY, "2026-03-08T12:00:00-04:00"),
            (NY, "2026-11-01T12:00:00-05:00"),
            (BER, "2026-03-29T12:00:00+02:00"),
            (BER, "2026-10-25T12:00:00+01:00"),
            (SCL, "2026-09-06T12:00:00-03:00"),
            (SCL, "2026-04-04T12:00:00-03:00"),
            (HAV, "2026-03-08T12:00:00-04:00"),
            (HAV, "2026-11-01T12:00:00-05:00"),
            (BEY, "2026-03-29T12:00:00+03:00"),
            (Asia::Shanghai, "2026-12-01T12:00:00+08:00"),
            (chrono_tz::Australia::Lord_Howe, "2026-04-05T12:00:00+10:30"),
        ];
        for (tz, at) in days {
            let Some(day) = bounds(Window::Day, utc(at), tz) else {
                panic!("day has bounds")
            };
            for n in std::iter::once(1).chain(minute_divisors()) {
                let w = if n == 1 {
                    Window::Minute
                } else {
                    Window::Minutes(n)
                };
                let len = TimeDelta::minutes(i64::from(n));
                let mut cursor = day.start;
                while cursor < day.end {
                    let Some(b) = bounds(w, cursor, tz) else {
                        panic!("{w} has bounds")
                    };
                    assert_eq!(b.start, cursor, "{tz} {w}: windows tile from day start");
                    let full = b.end - b.start == len;
                    assert!(
                        full || b.end == day.end,
                        "{tz} {w}: only the last window of the day is short ({b:?})"
                    );
                    let last = b.end - TimeDelta::seconds(1);
                    assert_eq!(bounds(w, last, tz), Some(b), "{tz} {w}: last second");
                    cursor = b.end;
                }
                assert_eq!(cursor, day.end, "{tz} {w}: last window ends at the next day");
            }
        }
    }

    #[test]
    fn on_a_24_hour_day_1440minutes_is_the_day_and_minute_is_1minutes() {
        let at = utc("2026-06-15T13:37:42+08:00");
        assert_eq!(bounds(Window::Minutes(1440), at, SH), bounds(Window::Day, at, SH));
        assert_eq!(bounds(Window::Minutes(1), at, SH), bounds(Window::Minute, at, SH));
    }

    #[test]
    fn hand_built_minutes_outside_the_rules_do_not_panic() {
        let at = utc("2026-11-01T12:34:56-05:00");
        for n in [0, 7, 1441, 2880, u32::MAX] {
            let Some(b) = bounds(Window::Minutes(n), at, NY) else {
                panic!("Minutes({n}) has bounds")
            };
            assert!(b.contains(at), "Minutes({n}): {b:?}");
        }
        let zero = bounds(Window::Minutes(0), at, NY);
        assert_eq!(zero, bounds(Window::Minute, at, NY), "0 acts as 1");
        let huge = bounds(Window::Minutes(u32::MAX), at, NY);
        assert_eq!(huge, bounds(Window::Day, at, NY), "longer than a day is the day");
    }

    #[test]
    fn extreme_instants_do_not_panic() {
        let kinds = [
            Window::Minute,
            Window::Minutes(5),
            Window::Day,
            Window::Week,
            Window::Month,
            Window::Total,
        ];
        let instants = [
            DateTime::<Utc>::MIN_UTC,
            DateTime::<Utc>::MAX_UTC,
            utc("1900-01-01T00:00:00Z"),
        ];
        for tz in [SH, NY, Pacific::Kiritimati, Pacific::Niue, chrono_tz::UTC] {
            for w in kinds {
                for at in instants {
                    if let Some(b) = bounds(w, at, tz) {
                        assert!(b.start <= b.end, "{tz} {w} {at}: {b:?}");
                        let _ = reset_at(b.end, "apikey:1", tz);
                    }
                }
            }
        }
    }

    /// One row: a window string and what parsing it gives, `Ok(window)` or `Err(message)`.
    #[rustfmt::skip]
    const PARSE_CASES: &[(&str, Result<Window, &str>)] = &[
        ("minute", Ok(Window::Minute)),
        ("day", Ok(Window::Day)),
        ("week", Ok(Window::Week)),
        ("month", Ok(Window::Month)),
        ("total", Ok(Window::Total)),
        ("1minutes", Ok(Window::Minute)),
        ("2minutes", Ok(Window::Minutes(2))),
        ("5minutes", Ok(Window::Minutes(5))),
        ("15minutes", Ok(Window::Minutes(15))),
        ("45minutes", Ok(Window::Minutes(45))),
        ("05minutes", Ok(Window::Minutes(5))),
        ("720minutes", Ok(Window::Minutes(720))),
        ("1440minutes", Ok(Window::Minutes(1440))),
        ("7minutes", Err(r#"bad window "7minutes": N must divide 1440 (minutes in a day)"#)),
        ("50minutes", Err(r#"bad window "50minutes": N must divide 1440 (minutes in a day)"#)),
        ("0minutes", Err(r#"bad window "0minutes": N must be at least 1"#)),
        ("000minutes", Err(r#"bad window "000minutes": N must be at least 1"#)),
        ("2880minutes", Err(r#"bad window "2880minutes": N must divide 1440 (minutes in a day), so it is at most 1440; use day, week or month for longer windows"#)),
        ("99999999999minutes", Err(r#"bad window "99999999999minutes": N must divide 1440 (minutes in a day), so it is at most 1440; use day, week or month for longer windows"#)),
        ("-5minutes", Err(r#"bad window "-5minutes": N must be a whole number written in digits directly before "minutes", without sign or space (e.g. 5minutes)"#)),
        ("+5minutes", Err(r#"bad window "+5minutes": N must be a whole number written in digits directly before "minutes", without sign or space (e.g. 5minutes)"#)),
        ("5 minutes", Err(r#"bad window "5 minutes": N must be a whole number written in digits directly before "minutes", without sign or space (e.g. 5minutes)"#)),
        ("1.5minutes", Err(r#"bad window "1.5minutes": N must be a whole number written in digits directly before "minutes", without sign or space (e.g. 5minutes)"#)),
        ("minutes", Err(r#"bad window "minutes": missing N before "minutes" (e.g. 5minutes)"#)),
        ("5minute", Err(r#"bad window "5minute": expected minute, <N>minutes, day, week, month or total"#)),
        ("5Minutes", Err(r#"bad window "5Minutes": expected minute, <N>minutes, day, week, month or total"#)),
        ("Day", Err(r#"bad window "Day": expected minute, <N>minutes, day, week, month or total"#)),
        (" day", Err(r#"bad window " day": expected minute, <N>minutes, day, week, month or total"#)),
        ("Week", Err(r#"bad window "Week": expected minute, <N>minutes, day, week, month or total"#)),
        ("weekly", Err(r#"bad window "weekly": expected minute, <N>minutes, day, week, month or total"#)),
        ("", Err(r#"bad window "": expected minute, <N>minutes, day, week, month or total"#)),
        ("day\n", Err(r#"bad window "day\n": expected minute, <N>minutes, day, week, month or total"#)),
    ];

    #[test]
    fn parse_table() {
        for &(input, want) in PARSE_CASES {
            let got = input.parse::<Window>().map_err(|e| e.to_string());
            assert_eq!(got, want.map_err(str::to_owned), "parsing {input:?}");
            if let Err(e) = input.parse::<Window>() {
                assert_eq!(e.input(), input);
            }
        }
    }

    #[test]
    fn display_is_canonical_and_round_trips() {
        #[rustfmt::skip]
        let cases = [
            (Window::Minute, "minute"),
            (Window::Minutes(1), "minute"),
            (Window::Minutes(5), "5minutes"),
            (Window::Minutes(1440), "1440minutes"),
            (Window::Day, "day"),
            (Window::Week, "week"),
            (Window::Month, "month"),
            (Window::Total, "total"),
        ];
        for (w, text) in cases {
            assert_eq!(w.to_string(), text);
            let back: Window = window(text);
            assert_eq!(back.to_string(), text, "{text} round-trips");
        }
        for w in minute_divisors().map(Window::Minutes) {
            assert_eq!(window(&w.to_string()), w, "{w} round-trips");
        }
    }

    #[test]
    fn refusal_message_uses_the_canonical_window() {
        let msg = format!("rate limit exceeded on apikey total_tokens/{}", Window::Day);
        assert_eq!(msg, "rate limit exceeded on apikey total_tokens/day");
        let msg = format!("rate limit exceeded on ws requests/{}", window("05minutes"));
        assert_eq!(msg, "rate limit exceeded on ws requests/5minutes");
    }

    #[test]
    fn checked_minutes_constructor() {
        assert_eq!(Window::minutes(1), Ok(Window::Minute));
        assert_eq!(Window::minutes(30), Ok(Window::Minutes(30)));
        let err = Window::minutes(7).map_err(|e| e.to_string());
        assert_eq!(
            err,
            Err(r#"bad window "7minutes": N must divide 1440 (minutes in a day)"#.to_owned())
        );
        assert!(Window::minutes(0).is_err());
        assert!(Window::minutes(2880).is_err());
    }

    #[test]
    fn serde_uses_the_canonical_string() -> Result<(), serde_json::Error> {
        assert_eq!(serde_json::to_string(&Window::Minutes(5))?, r#""5minutes""#);
        assert_eq!(serde_json::to_string(&Window::Total)?, r#""total""#);
        assert_eq!(serde_json::from_str::<Window>(r#""day""#)?, Window::Day);
        assert_eq!(serde_json::from_str::<Window>(r#""1minutes""#)?, Window::Minute);
        assert_eq!(
            serde_json::from_str::<Window>(r#""15minutes""#)?,
            Window::Minutes(15)
        );
        let err = serde_json::from_str::<Window>(r#""7minutes""#).map(|_| ());
        let msg = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains(r#"bad window "7minutes": N must divide 1440"#),
            "serde error names the value and the rule: {msg}"
        );
        assert!(
            serde_json::from_str::<Window>("5").is_err(),
            "a bare number is not a window"
        );
        Ok(())
    }

    #[test]
    fn fnv1a_matches_the_published_vectors() {
        // From the FNV reference test suite; a change here moves every subject's reset time.
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn reset_at_is_pinned_for_a_subject() {
        // Pinned so that a change of hash, delay or rendering is a visible decision: clients and
        // replicas rely on the same subject getting the same time.
        let end = utc("2026-12-02T00:00:00+08:00");
        let got = format_reset_at(&reset_at(end, "apikey:42", SH));
        assert_eq!(got, "2026-12-02T00:01:08+08:00");
    }

    #[test]
    fn reset_at_is_one_to_two_minutes_late_stable_and_spread() {
        let end = utc("2026-12-02T00:00:00+08:00");
        let mut seen = std::collections::BTreeMap::<i64, u32>::new();
        for i in 0..1000 {
            let subject = format!("apikey:{i}");
            let r = reset_at(end, &subject, SH);
            let delay = (r.with_timezone(&Utc) - end).num_seconds();
            assert!(
                (RESET_DELAY_MIN_SECS..=RESET_DELAY_MAX_SECS).contains(&delay),
                "{subject}: delay {delay}s"
            );
            assert_eq!(r.timestamp_subsec_nanos(), 0, "{subject}: whole seconds");
            assert_eq!(reset_at(end, &subject, SH), r, "{subject}: stable");
            *seen.entry(delay).or_default() += 1;
        }
        // 61 possible delays, 1000 subjects: all but a few must occur, none may dominate.
        assert!(seen.len() >= 55, "only {} distinct delays: {seen:?}", seen.len());
        let (lo, hi) = (seen.keys().next(), seen.keys().next_back());
        assert!(lo <= Some(&62) && hi >= Some(&118), "range {lo:?}..{hi:?}");
        let busiest = seen.values().copied().max().unwrap_or(0);
        assert!(busiest <= 40, "one delay got {busiest} of 1000 subjects");
    }

    /// Rows: window end, zone, and the offset `reset_at` must be written in.
    #[test]
    fn reset_at_uses_the_zone_offset_at_the_reset_instant() {
        #[rustfmt::skip]
        let cases = [
            ("2026-12-02T00:00:00+08:00", SH, "+08:00"),
            ("2026-01-15T00:00:00-05:00", NY, "-05:00"),
            ("2026-07-15T00:00:00-04:00", NY, "-04:00"),
            // Window ends at 01:59 EST; reset lands after the jump, so it reads EDT.
            ("2026-03-08T01:59:00-05:00", NY, "-04:00"),
            ("2026-10-25T02:59:00+02:00", BER, "+01:00"),
            ("2026-12-02T00:00:00Z", chrono_tz::UTC, "+00:00"),
        ];
        for (end, tz, offset) in cases {
            let r = reset_at(utc(end), "member:7", tz);
            let text = format_reset_at(&r);
            assert!(text.ends_with(offset), "{end} in {tz}: {text}");
            assert_eq!(text.len(), "2026-12-02T00:01:27+08:00".len(), "{text}");
            assert_eq!(
                DateTime::parse_from_rfc3339(&text).map(|t| t.timestamp()),
                Ok(r.timestamp()),
                "{text} parses back to the same instant"
            );
        }
    }

    #[test]
    fn reset_at_rounds_a_fractional_end_up() {
        let end = utc("2026-12-02T00:00:00.250+08:00");
        let r = reset_at(end, "dept:3", SH).with_timezone(&Utc);
        let whole = reset_at(utc("2026-12-02T00:00:01+08:00"), "dept:3", SH);
        assert_eq!(r, whole.with_timezone(&Utc));
        assert!(r - end >= TimeDelta::seconds(RESET_DELAY_MIN_SECS));
    }

    #[test]
    fn reset_at_for_windows() {
        let at = utc("2026-12-01T13:00:00+08:00");
        assert_eq!(reset_at_for(Window::Total, at, "ws:1", SH), None);
        let day_end = utc("2026-12-02T00:00:00+08:00");
        assert_eq!(
            reset_at_for(Window::Day, at, "ws:1", SH),
            Some(reset_at(day_end, "ws:1", SH))
        );
    }

    #[test]
    fn seconds_until_reset_rounds_up_and_floors_at_zero() {
        let reset = reset_at(utc("2026-12-02T00:00:00+08:00"), "apikey:42", SH);
        let at = reset.with_timezone(&Utc);
        #[rustfmt::skip]
        let cases = [
            (at - TimeDelta::seconds(90), 90),
            (at - TimeDelta::milliseconds(1500), 2),
            (at - TimeDelta::milliseconds(1), 1),
            (at, 0),
            (at + TimeDelta::seconds(5), 0),
        ];
        for (now, want) in cases {
            assert_eq!(seconds_until_reset(&reset, now), want, "now = {now}");
        }
    }

    #[test]
    fn parse_tz_table() {
        #[rustfmt::skip]
        let cases: [(&str, Result<Tz, &str>); 8] = [
            ("Asia/Shanghai", Ok(Asia::Shanghai)),
            ("America/New_York", Ok(NY)),
            ("UTC", Ok(chrono_tz::UTC)),
            (" Europe/Berlin\n", Ok(BER)),
            ("asia/shanghai", Err(r#"bad time zone "asia/shanghai": not an IANA zone name (did you mean Asia/Shanghai?); expected e.g. Asia/Shanghai, Europe/Berlin or UTC"#)),
            ("Asia/Beijing", Err(r#"bad time zone "Asia/Beijing": not an IANA zone name; expected e.g. Asia/Shanghai, Europe/Berlin or UTC"#)),
            ("+08:00", Err(r#"bad time zone "+08:00": not an IANA zone name; expected e.g. Asia/Shanghai, Europe/Berlin or UTC"#)),
            ("", Err(r#"bad time zone "": empty; expected an IANA zone name such as Asia/Shanghai"#)),
        ];
        for (input, want) in cases {
            assert_eq!(parse_tz(input), want.map_err(str::to_owned), "{input:?}");
        }
        assert_eq!(parse_tz(DEFAULT_TZ.name()), Ok(DEFAULT_TZ));
    }

    #[test]
    #[ignore = "slow: 1850-2060 in every zone; run with `cargo test --release -- --ignored`"]
    fn days_tile_in_every_zone_since_1850() {
        let stop = utc("2060-01-01T00:00:00Z");
        for &tz in chrono_tz::TZ_VARIANTS.iter() {
            let first = bounds(Window::Day, utc("1850-01-01T00:00:00Z"), tz);
            let mut at = first.map_or(stop, |day| day.start);
            while at < stop {
                let Some(day) = bounds(Window::Day, at, tz) else {
                    panic!("{tz}: day has bounds")
                };
                assert_eq!(day.start, at, "{tz}: days must tile");
                assert!(day.start < day.end, "{tz}: empty day at {at}");
                assert_first_instant_of_its_date(day.start, tz, "day start");
                let middle = day.start + (day.end - day.start) / 2;
                let last = day.end - TimeDelta::seconds(1);
                assert_eq!(bounds(Window::Day, middle, tz), Some(day), "{tz}: middle");
                assert_eq!(bounds(Window::Day, last, tz), Some(day), "{tz}: last second");
                at = day.end;
            }
        }
    }
}
