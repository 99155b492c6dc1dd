//! Streams, framed per SSE event and tapped as they pass: the usage the upstream reports, the
//! content delivered, mid-stream errors (the credential's secret masked out of them), and what
//! the gateway itself asked for removed. Nothing is buffered beyond one event, and of an event
//! at most [`MAX_EVENT_BYTES`].
//!
//! A stream ends at its terminator (`data: [DONE]`, Anthropic's `message_stop`): nothing after
//! it is passed on or read. An event the upstream's body ends inside is not passed on (an SSE
//! client drops it too; it is half a JSON line) unless it is the terminator itself. A stream
//! whose body ended after the answer named its stop (a `finish_reason`, a `stop_reason`) but
//! before the terminator is given the terminator; one that ended before is cut short, and
//! [`SseTap::finished`] stays false.

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};

use bytes::BytesMut;
use memchr::memmem::Finder;
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::adapter::{Endpoint, parse_json};
use super::mask::SecretMask;
use super::usage::UsageReport;

/// Most bytes of one event the tap reads (separator included). A longer event is passed on as
/// its bytes come, neither kept back nor read: no usage, error or content is taken from it and
/// nothing is removed from it.
pub const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// Watches a stream event by event: usage, delivered content chunks, mid-stream errors; and
/// removes what the gateway itself asked for (the extra usage chunk and `"usage":null` fields).
/// The secret of the credential is masked out of error events (and their logged message).
#[derive(Debug)]
pub struct SseTap {
    anthropic: bool,
    strip_usage: bool,
    /// The event begun in an earlier chunk, kept back until its end comes (at most `max_event`
    /// bytes; it contains no complete separator).
    pending: BytesMut,
    /// Most tokens a call may report (`max_usage_tokens`).
    ceiling: u64,
    /// [`MAX_EVENT_BYTES`], smaller in tests.
    max_event: usize,
    /// Inside an event longer than `max_event`: its bytes pass on as they come (or are dropped,
    /// with `drop_oversized`).
    oversized: bool,
    /// Events over the bound are dropped rather than passed on: a translated stream, which can
    /// neither translate nor hold them.
    drop_oversized: bool,
    /// The last bytes passed on of an oversized event (a separator may straddle two chunks).
    oversized_tail: [u8; 3],
    /// How many of `oversized_tail` are set.
    oversized_tail_len: usize,
    /// The credential's secret, masked out of error events.
    mask: Option<Arc<SecretMask>>,
    /// Usage reported by the upstream so far, as checked.
    pub usage: UsageReport,
    /// Content chunks forwarded to the client (an estimate of completion tokens).
    pub content_chunks: u64,
    /// A mid-stream error event passed to the client, with its message.
    pub error: Option<String>,
    /// Whether the stream ended properly (`[DONE]` or `message_stop`, perhaps added by
    /// [`SseTap::finish`]).
    pub finished: bool,
    /// Whether the answer named its stop (a finish or stop reason other than `error`).
    stop_named: bool,
    /// An event over the bound was dropped (with `drop_oversized`): nothing after it is read.
    pub dropped_oversized: bool,
    /// The finish reasons the stream named (`finish_reason`, Anthropic's `stop_reason`), for
    /// traces; a few, each short.
    pub finish_reasons: Vec<String>,
}

impl SseTap {
    /// A tap for this endpoint; usage blocks past `ceiling` tokens are invalid.
    pub fn new(endpoint: Endpoint, strip_usage: bool, ceiling: u64) -> Self {
        SseTap {
            anthropic: endpoint == Endpoint::Messages,
            strip_usage,
            pending: BytesMut::new(),
            max_event: MAX_EVENT_BYTES,
            oversized: false,
            drop_oversized: false,
            oversized_tail: [0; 3],
            oversized_tail_len: 0,
            mask: None,
            ceiling,
            usage: UsageReport::default(),
            content_chunks: 0,
            error: None,
            finished: false,
            stop_named: false,
            dropped_oversized: false,
            finish_reasons: Vec::new(),
        }
    }

    /// Drops an event over the bound instead of passing it on, notes it in
    /// [`SseTap::dropped_oversized`], and reads nothing after it (the stream ends there): for a
    /// translated stream, which can neither translate nor hold such an event, so that it costs
    /// nothing, as it costs nothing passed through.
    pub fn dropping_oversized(mut self) -> Self {
        self.drop_oversized = true;
        self
    }

    /// Masks `mask`'s secret out of the error events passed on and the error message kept.
    pub fn masking(mut self, mask: Arc<SecretMask>) -> Self {
        self.mask = Some(mask);
        self
    }

    /// A tap with a smaller event bound, so that tests reach it with small events.
    #[cfg(test)]
    fn with_max_event(mut self, max_event: usize) -> Self {
        self.max_event = max_event;
        self
    }

    /// Most tokens a call may report.
    pub fn ceiling(&self) -> u64 {
        self.ceiling
    }

    /// Bytes kept back, waiting for the end of their event (at most [`MAX_EVENT_BYTES`]).
    pub fn held(&self) -> usize {
        self.pending.len()
    }

    /// Feeds bytes from upstream; appends the complete events to forward to `out`. Events are
    /// framed in `chunk` itself; only an incomplete last event is kept back (copied) for the
    /// next chunk, and only while it is within the event bound.
    pub fn feed(&mut self, chunk: &[u8], out: &mut BytesMut) {
        if self.finished || self.dropped_oversized {
            return;
        }
        // What is passed on is at most what came and what was kept back: one allocation for
        // the chunk's events, not one at each doubling of `out`.
        out.reserve(chunk.len() + self.pending.len());
        let mut rest = chunk;
        if self.oversized || !self.pending.is_empty() {
            // An event begun earlier: its end is the first separator, perhaps straddling.
            let before = if self.oversized {
                &self.oversized_tail[..self.oversized_tail_len]
            } else {
                &self.pending[self.pending.len().saturating_sub(3)..]
            };
            match continued_event_end(before, chunk) {
                Some(end) => {
                    self.end_event(&chunk[..end], out);
                    if self.finished || self.dropped_oversized {
                        return;
                    }
                    rest = &chunk[end..];
                }
                None => {
                    self.continue_event(chunk, out);
                    return;
                }
            }
        }
        let at = self.forward_events(rest, out);
        self.continue_event(&rest[at..], out);
    }

    /// Inspects and forwards each complete event of `buf`; returns where the incomplete rest
    /// starts.
    fn forward_events(&mut self, buf: &[u8], out: &mut BytesMut) -> usize {
        let mut at = 0;
        while let Some((end, sep)) = event_end(&buf[at..]) {
            let event = &buf[at..at + end + sep];
            at += end + sep;
            if event.len() > self.max_event {
                self.pass_oversized(event, out);
                if self.dropped_oversized {
                    return buf.len();
                }
            } else {
                self.inspect(event, out);
                if self.finished {
                    // The terminator: nothing after it is read or passed on.
                    return buf.len();
                }
            }
        }
        at
    }

    /// Bytes of an event over the bound: passed on, or dropped and noted.
    fn pass_oversized(&mut self, part: &[u8], out: &mut BytesMut) {
        if self.drop_oversized {
            self.dropped_oversized = true;
        } else {
            out.extend_from_slice(part);
        }
    }

    /// Bytes of an event whose end has not come: kept back while the event is within the bound,
    /// else passed on (with what was kept back) as they come.
    fn continue_event(&mut self, part: &[u8], out: &mut BytesMut) {
        if part.is_empty() {
            return;
        }
        if !self.oversized && self.pending.len() + part.len() <= self.max_event {
            self.pending.extend_from_slice(part);
            return;
        }
        if !self.oversized {
            self.oversized = true;
            self.oversized_tail_len = 0;
            let mut kept = std::mem::take(&mut self.pending);
            self.pass_oversized(&kept, out);
            self.remember_tail(&kept);
            // The buffer serves the next event, without the capacity this one grew it to.
            kept.clear();
            if kept.capacity() <= self.max_event {
                self.pending = kept;
            }
        }
        self.pass_oversized(part, out);
        self.remember_tail(part);
    }

    /// The last bytes of an event begun in an earlier chunk, its separator included.
    fn end_event(&mut self, last: &[u8], out: &mut BytesMut) {
        if self.oversized {
            self.pass_oversized(last, out);
            self.oversized = false;
            return;
        }
        let mut event = std::mem::take(&mut self.pending);
        if event.len() + last.len() > self.max_event {
            self.pass_oversized(&event, out);
            self.pass_oversized(last, out);
            return;
        }
        event.extend_from_slice(last);
        self.inspect(&event, out);
        // The buffer (within the bound) serves the next event.
        event.clear();
        self.pending = event;
    }

    /// Keeps the last bytes passed on of an oversized event.
    fn remember_tail(&mut self, part: &[u8]) {
        let keep = &mut self.oversized_tail;
        let room = keep.len();
        if part.len() >= room {
            keep.copy_from_slice(&part[part.len() - room..]);
            self.oversized_tail_len = room;
        } else {
            let n = self.oversized_tail_len.min(room - part.len());
            keep.copy_within(self.oversized_tail_len - n..self.oversized_tail_len, 0);
            keep[n..n + part.len()].copy_from_slice(part);
            self.oversized_tail_len = n + part.len();
        }
    }

    /// The upstream's body ended: an unterminated last event is read, and passed on only if it
    /// is the terminator (its blank line added); where the answer named its stop and no
    /// terminator came, the terminator is added. Otherwise the stream was cut short:
    /// [`SseTap::finished`] stays false, and an oversized event passed on in part is closed by a
    /// blank line, so that whatever follows is an event of its own.
    pub fn finish(&mut self, out: &mut BytesMut) {
        let rest = std::mem::take(&mut self.pending);
        if self.finished || self.dropped_oversized {
            return;
        }
        if self.oversized {
            self.oversized = false;
            if !self.drop_oversized {
                out.extend_from_slice(b"\n\n");
            }
        } else if self.is_terminator(&rest) {
            self.inspect(&rest, out);
            out.extend_from_slice(if rest.ends_with(b"\n") { b"\n" } else { b"\n\n" });
            return;
        }
        if self.stop_named && self.error.is_none() {
            out.extend_from_slice(if self.anthropic {
                b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
            } else {
                b"data: [DONE]\n\n"
            });
            self.finished = true;
        }
    }

    /// Whether `event` is the stream's terminator: `data: [DONE]`, Anthropic's `message_stop`.
    fn is_terminator(&self, event: &[u8]) -> bool {
        if self.anthropic {
            event
                .split(|b| *b == b'\n')
                .filter_map(|l| l.strip_prefix(b"event:"))
                .any(|name| name.trim_ascii() == b"message_stop")
        } else {
            data_of(event).trim_ascii() == b"[DONE]"
        }
    }

    fn inspect(&mut self, event: &[u8], out: &mut BytesMut) {
        if self.anthropic {
            let error = std::str::from_utf8(event).is_ok_and(|text| self.inspect_anthropic(text));
            out.extend_from_slice(&self.masked(error, event));
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
        let found = self.scan(data);
        let error = found.finish_error || data.starts_with(b"{\"error\"");
        if error {
            self.set_error(data);
        }
        // The event's first `"usage":null` is the scan's, in the data (a part of the event),
        // when the lines before the data hold none and the event is passed on unmasked.
        let usage_null_at = found.usage_null_at.filter(|_| !error).and_then(|i| {
            let data_at = (data.as_ptr() as usize).wrapping_sub(event.as_ptr() as usize);
            let before = event.get(..data_at)?;
            NEEDLES.usage_null.find(before).is_none().then_some(data_at + i)
        });
        // An error event may echo the key: it is passed on masked.
        let masked = self.masked(error, event);
        let event: &[u8] = &masked;
        if found.content {
            self.content_chunks += 1;
        }
        let (usage_object, usage_null) = (found.usage_object, found.usage_null);
        let mut usage_chunk = false;
        if usage_object && let Ok(chunk) = parse_json::<UsageChunk>(data) {
            if let Some(u) = &chunk.usage {
                let read = UsageReport::read_raw(Endpoint::ChatCompletions, u, self.ceiling);
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
            if usage_null && without_usage_null(event, usage_null_at, out) {
                return;
            }
        }
        out.extend_from_slice(event);
    }

    /// Reads an OpenAI-format event's data for the fields the tap needs: three searches (each
    /// field begins with a quote, and a quote inside a JSON string is escaped, so a field name
    /// echoed in content, `\"usage\":`, is not taken for the field). Notes the finish reasons
    /// on the way; `"finish_reason":"error"` is an error in the middle of the stream.
    fn scan(&mut self, data: &[u8]) -> Found {
        let mut found = Found::default();
        each_match(&NEEDLES.content, data, |i| {
            found.content |= data.get(i + CONTENT.len()).is_some_and(|&c| c != b'"');
        });
        each_match(&NEEDLES.finish_reason, data, |i| {
            let value = &data[i + FINISH_REASON.len()..];
            if let Some(end) = memchr::memchr(b'"', value) {
                let reason = &value[..end];
                found.finish_error |= reason == b"error";
                self.finish_reason(std::str::from_utf8(reason).unwrap_or_default());
            }
        });
        each_match(&NEEDLES.usage, data, |i| {
            let after = data[i + USAGE.len()..].trim_ascii_start();
            found.usage_object |= after.starts_with(b"{");
            found.usage_null |= after.starts_with(b"null");
            if found.usage_null_at.is_none() && data[i..].starts_with(USAGE_NULL) {
                found.usage_null_at = Some(i);
            }
        });
        found
    }

    /// Notes a finish reason (at most [`MAX_FINISH_REASONS`], each at most 64 bytes).
    fn finish_reason(&mut self, reason: &str) {
        self.stop_named |= !reason.is_empty() && reason != "error";
        if !reason.is_empty()
            && reason.len() <= 64
            && self.finish_reasons.len() < MAX_FINISH_REASONS
            && !self.finish_reasons.iter().any(|r| r == reason)
        {
            self.finish_reasons.push(reason.to_owned());
        }
    }

    /// Keeps an error event's message, masked.
    fn set_error(&mut self, data: &[u8]) {
        let message = error_message(std::str::from_utf8(data).unwrap_or_default());
        self.error = Some(match &self.mask {
            Some(mask) => mask.mask_str(&message).into_owned(),
            None => message,
        });
    }

    /// `event` with the secret masked out when it is an error event.
    fn masked<'a>(&self, error: bool, event: &'a [u8]) -> Cow<'a, [u8]> {
        match &self.mask {
            Some(mask) if error => mask.mask(event),
            _ => Cow::Borrowed(event),
        }
    }

    /// Reads an Anthropic event; true when it is an error event.
    fn inspect_anthropic(&mut self, text: &str) -> bool {
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
                if let Ok(v) = serde_json::from_slice::<Value>(data_of(text.as_bytes())) {
                    if let Some(u) = v.get("usage") {
                        self.usage.merge_anthropic_delta(u, self.ceiling);
                    }
                    if let Some(r) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                        self.finish_reason(r);
                    }
                }
            }
            "content_block_delta" => self.content_chunks += 1,
            "message_stop" => self.finished = true,
            "error" => {
                self.set_error(data_of(text.as_bytes()));
                return true;
            }
            _ => {}
        }
        false
    }
}

/// The complete events of `buf`, each without its separator, in order; bytes after the last
/// separator are not an event. The one SSE framer: the tap frames the upstream's bytes with it,
/// and the translator the whole events the tap hands over.
pub fn events(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let (end, sep) = event_end(&buf[at..])?;
        let event = &buf[at..at + end];
        at += end + sep;
        Some(event)
    })
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

/// Where an event begun in an earlier chunk ends in `chunk` (just past its separator), given the
/// last bytes (up to 3) already seen of it, which hold no complete separator.
fn continued_event_end(before: &[u8], chunk: &[u8]) -> Option<usize> {
    // A separator (at most 4 bytes) that starts in `before` ends within chunk's first 3 bytes.
    let mut joint = [0u8; 6];
    let head = &chunk[..chunk.len().min(3)];
    joint[..before.len()].copy_from_slice(before);
    joint[before.len()..before.len() + head.len()].copy_from_slice(head);
    if let Some((at, sep)) = event_end(&joint[..before.len() + head.len()])
        && at + sep > before.len()
    {
        return Some(at + sep - before.len());
    }
    event_end(chunk).map(|(at, sep)| at + sep)
}

/// What [`SseTap::scan`] finds in an OpenAI-format event.
#[derive(Default)]
struct Found {
    /// A choice ended with `"finish_reason":"error"`: an error in the middle of the stream.
    finish_error: bool,
    /// A `"content":"…"` that is not empty.
    content: bool,
    /// `"usage":` followed by an object (the usage chunk, perhaps) or by `null`.
    usage_object: bool,
    usage_null: bool,
    /// Where the data's first `"usage":null`, as written without spaces, begins.
    usage_null_at: Option<usize>,
}

/// The fields an OpenAI-format event is searched for, each searcher built once.
struct Needles {
    content: Finder<'static>,
    finish_reason: Finder<'static>,
    usage: Finder<'static>,
    usage_null: Finder<'static>,
}

static NEEDLES: LazyLock<Needles> = LazyLock::new(|| Needles {
    content: Finder::new(CONTENT),
    finish_reason: Finder::new(FINISH_REASON),
    usage: Finder::new(USAGE),
    usage_null: Finder::new(USAGE_NULL),
});

const CONTENT: &[u8] = b"\"content\":\"";
const USAGE: &[u8] = b"\"usage\":";
const FINISH_REASON: &[u8] = b"\"finish_reason\":\"";
/// Most finish reasons a stream's trace keeps (one per choice, usually one).
const MAX_FINISH_REASONS: usize = 8;
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
/// neighbour) to `out`; false, having appended nothing, when it has none. `first`: where the
/// first begins, when the caller knows (else it is searched for).
fn without_usage_null(event: &[u8], first: Option<usize>, out: &mut BytesMut) -> bool {
    let Some(first) = first.or_else(|| NEEDLES.usage_null.find(event)) else {
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

/// Calls `f` with where each match of `finder` in `haystack` begins, matches not overlapping.
/// `Finder::find_iter` would copy the searcher into its iterator at each call (a `memcpy` each
/// search, three an event).
fn each_match(finder: &Finder<'_>, haystack: &[u8], mut f: impl FnMut(usize)) {
    let step = finder.needle().len().max(1);
    let mut from = 0;
    while let Some(i) = haystack.get(from..).and_then(|rest| finder.find(rest)) {
        f(from + i);
        from += i + step;
    }
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
    use crate::kernel::usage::Usage;

    const CEILING: u64 = 100_000_000;

    /// The one pass over an event finds each field the tap reads by its quote, and nothing
    /// echoed inside a string (where every quote is escaped).
    #[test]
    fn one_pass_finds_each_field_once() {
        // data, then: content, finish error, usage object, usage null, finish reasons
        type Case<'a> = (&'a str, (bool, bool, bool, bool), &'a [&'a str]);
        let cases: &[Case] = &[
            (
                r#"{"choices":[{"delta":{"content":"Hi"},"finish_reason":null}]}"#,
                (true, false, false, false),
                &[],
            ),
            (
                r#"{"choices":[{"delta":{"content":""},"finish_reason":"stop"}]}"#,
                (false, false, false, false),
                &["stop"],
            ),
            (
                r#"{"choices":[{"delta":{},"finish_reason":"error"}]}"#,
                (false, true, false, false),
                &["error"],
            ),
            (
                r#"{"choices":[{"delta":{},"finish_reason":"errors"}]}"#,
                (false, false, false, false),
                &["errors"],
            ),
            (
                r#"{"choices":[],"usage":{"prompt_tokens":1}}"#,
                (false, false, true, false),
                &[],
            ),
            (
                r#"{"choices":[{"delta":{"content":"x"}}],"usage": null}"#,
                (true, false, false, true),
                &[],
            ),
            (
                r#"{"choices":[{"delta":{"content":"say \"usage\":{ and \"finish_reason\":\"error\""}}]}"#,
                (true, false, false, false),
                &[],
            ),
            (
                r#"{"choices":[{"finish_reason":"stop"},{"finish_reason":"length"}]}"#,
                (false, false, false, false),
                &["stop", "length"],
            ),
            // Colons inside strings, names that only end like a field, a space before the colon,
            // a field cut off at the end of the data.
            (
                r#"{"id":"a:b","xcontent":"y","x_usage":{},"c":"\"usage\":{","finish_reason" :"stop"}"#,
                (false, false, false, false),
                &[],
            ),
            (r#"{"delta":{"content":"#, (false, false, false, false), &[]),
            (
                r#"{"delta":{"content":"a:b"},"usage":"#,
                (true, false, false, false),
                &[],
            ),
            (r#"{"finish_reason":"stop"#, (false, false, false, false), &[]),
        ];
        for (data, (content, error, object, null), reasons) in cases {
            let mut tap = SseTap::new(Endpoint::ChatCompletions, false, CEILING);
            let f = tap.scan(data.as_bytes());
            assert_eq!(
                (f.content, f.finish_error, f.usage_object, f.usage_null),
                (*content, *error, *object, *null),
                "{data}"
            );
            assert_eq!(tap.finish_reasons, *reasons, "{data}");
        }
    }

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
    fn finish_reasons_are_noted_once_each_and_bounded() {
        let long = "x".repeat(65);
        let events = [
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":null}]}\n\n".to_owned(),
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"},{\"index\":1,\"finish_reason\":\"stop\"}]}\n\n".to_owned(),
            "data: {\"choices\":[{\"index\":2,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n".to_owned(),
            format!("data: {{\"choices\":[{{\"finish_reason\":\"{long}\"}}]}}\n\n"),
            "data: [DONE]\n\n".to_owned(),
        ];
        let parts: Vec<&str> = events.iter().map(String::as_str).collect();
        let mut tap = SseTap::new(Endpoint::ChatCompletions, false, CEILING);
        feed_all(&mut tap, &parts);
        assert_eq!(tap.finish_reasons, ["length", "stop"]);

        let anthropic = [
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        ];
        let mut tap = SseTap::new(Endpoint::Messages, false, CEILING);
        feed_all(&mut tap, &anthropic);
        assert_eq!(tap.finish_reasons, ["end_turn"]);
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
            let changed = without_usage_null(event.as_bytes(), None, &mut out);
            assert_eq!(
                changed.then(|| std::str::from_utf8(&out).unwrap()),
                *want,
                "{event}"
            );
            assert_eq!(changed, !out.is_empty());
        }
    }

    /// The tap removes an event's `"usage":null` fields from where its scan found the first, and
    /// gives what a search of the whole event gives, whatever comes before the data.
    #[test]
    fn the_tap_strips_usage_null_as_the_search_does() {
        let events = [
            "data: {\"a\":1,\"usage\":null}\n\n",
            "id: 7\ndata: {\"usage\":null,\"a\":1,\"usage\":null}\n\n",
            "id: {\"usage\":null}\ndata: {\"a\":1,\"usage\":null}\n\n",
            "data: {\"a\":\"\\\"usage\\\":null\",\"usage\": null,\"x\":{\"usage\":null}}\n\n",
            "data:{\"x\":{\"usage\":null},\"usage\":null}\r\n\r\n",
        ];
        for event in events {
            let mut want = BytesMut::new();
            if !without_usage_null(event.as_bytes(), None, &mut want) {
                want.extend_from_slice(event.as_bytes());
            }
            let got = feed_all(
                &mut SseTap::new(Endpoint::ChatCompletions, true, CEILING),
                &[event],
            );
            assert_eq!(got.as_bytes(), &want[..], "{event}");
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
    }

    /// The body ended inside an event: half a JSON line is not passed on (nor read); the
    /// terminator without its blank line is, with the blank line; an answer that named its
    /// stop gets the terminator it lacked; one cut before is not finished.
    #[test]
    fn the_end_of_the_body_ends_the_stream() {
        let stop = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
        let a_stop = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\n";
        let rows: &[(Endpoint, &str, &str, bool)] = &[
            (
                Endpoint::ChatCompletions,
                "data: {\"a\":1}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b",
                "data: {\"a\":1}\n\n",
                false,
            ),
            (
                Endpoint::ChatCompletions,
                "data: {\"a\":1}\n\ndata: [DONE]",
                "data: {\"a\":1}\n\ndata: [DONE]\n\n",
                true,
            ),
            (
                Endpoint::ChatCompletions,
                "data: [DONE]\n",
                "data: [DONE]\n\n",
                true,
            ),
            (
                Endpoint::ChatCompletions,
                stop,
                &format!("{stop}data: [DONE]\n\n"),
                true,
            ),
            (
                Endpoint::ChatCompletions,
                "data: {\"choices\":[{\"finish_reason\":\"error\"}],\"error\":{\"message\":\"x\"}}\n\n",
                "data: {\"choices\":[{\"finish_reason\":\"error\"}],\"error\":{\"message\":\"x\"}}\n\n",
                false,
            ),
            (
                Endpoint::Messages,
                "event: ping\ndata: {}\n\nevent: content_block_delta\ndata: {\"de",
                "event: ping\ndata: {}\n\n",
                false,
            ),
            (
                Endpoint::Messages,
                "event: message_stop\ndata: {}",
                "event: message_stop\ndata: {}\n\n",
                true,
            ),
            (
                Endpoint::Messages,
                a_stop,
                &format!("{a_stop}event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"),
                true,
            ),
        ];
        for (endpoint, input, want, finished) in rows {
            let mut tap = SseTap::new(*endpoint, false, CEILING);
            assert_eq!(feed_all(&mut tap, &[input]), *want, "{input}");
            assert_eq!(tap.finished, *finished, "{input}");
            assert_eq!(tap.content_chunks, 0, "{input}: a cut event is not read");
        }
    }

    /// Nothing after the terminator is passed on or read, however the bytes are cut.
    #[test]
    fn nothing_after_the_terminator_counts() {
        let first = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n\
                     event: content_block_delta\ndata: {\"delta\":{\"text\":\"a\"}}\n\n\
                     event: message_delta\ndata: {\"usage\":{\"output_tokens\":2}}\n\n\
                     event: message_stop\ndata: {}\n\n";
        let second = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5000,\"output_tokens\":1}}}\n\n\
                      event: content_block_delta\ndata: {\"delta\":{\"text\":\"b\"}}\n\n\
                      event: message_stop\ndata: {}\n\n";
        let input = format!("{first}{second}");
        for size in [1, 2, 5, 64, input.len()] {
            let parts: Vec<&str> = input
                .as_bytes()
                .chunks(size)
                .map(|c| std::str::from_utf8(c).unwrap())
                .collect();
            let mut tap = SseTap::new(Endpoint::Messages, false, CEILING);
            assert_eq!(feed_all(&mut tap, &parts), first, "chunks of {size}");
            assert_eq!(
                tap.usage,
                UsageReport::Valid(Usage {
                    prompt: 3,
                    completion: 2
                })
            );
            assert_eq!(tap.content_chunks, 1);
        }
        let mut tap = SseTap::new(Endpoint::ChatCompletions, false, CEILING);
        let out = feed_all(
            &mut tap,
            &[
                "data: [DONE]\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":5000,\"completion_tokens\":1}}\n\n",
            ],
        );
        assert_eq!(out, "data: [DONE]\n\n");
        assert_eq!(tap.usage, UsageReport::Missing);
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
    fn a_giant_line_passes_through_without_being_held() {
        let mut tap = SseTap::new(Endpoint::ChatCompletions, true, CEILING);
        let giant = 64 * 1024 * 1024;
        let mut input = Vec::with_capacity(giant + 512);
        input.extend_from_slice(b"data: {\"choices\":[{\"delta\":{\"content\":\"");
        input.resize(giant, b'a');
        input.extend_from_slice(b"\"}}],\"usage\":null}\n\n");
        let after = b"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":null}\n\n\
                      data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n\
                      data: [DONE]\n\n";
        input.extend_from_slice(after);
        let mut out = BytesMut::new();
        let mut passed = Vec::new();
        let mut most_held = 0;
        for chunk in input.chunks(16 * 1024 + 3) {
            tap.feed(chunk, &mut out);
            most_held = most_held.max(tap.held());
            assert!(tap.pending.capacity() <= 2 * MAX_EVENT_BYTES);
            passed.extend_from_slice(&out.split());
        }
        tap.finish(&mut out);
        passed.extend_from_slice(&out);
        assert!(most_held <= MAX_EVENT_BYTES, "held {most_held} bytes");
        // The giant event went through untouched (its `"usage":null` too: it is not read);
        // the events after it are read and stripped as usual.
        let want_after = b"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n";
        assert_eq!(passed.len(), giant + 20 + want_after.len());
        assert!(passed[..giant + 20] == input[..giant + 20]);
        assert_eq!(&passed[giant + 20..], want_after);
        assert_eq!(
            tap.usage,
            UsageReport::Valid(Usage {
                prompt: 3,
                completion: 2
            })
        );
        assert_eq!((tap.content_chunks, tap.finished), (1, true));
    }

    /// A translated stream's tap drops an event over the bound as it comes: it holds no more
    /// than the bound (nothing of a 64 MiB line), passes nothing of it on, and says so.
    #[test]
    fn a_giant_line_costs_nothing_when_dropped() {
        let mut tap = SseTap::new(Endpoint::Messages, false, CEILING).dropping_oversized();
        let giant = 64 * 1024 * 1024;
        let mut input = b"event: content_block_delta\ndata: {\"delta\":{\"text\":\"".to_vec();
        input.resize(giant, b'a');
        input.extend_from_slice(b"\"}}\n\nevent: message_stop\ndata: {}\n\n");
        let mut out = BytesMut::new();
        let mut most = 0;
        for chunk in input.chunks(16 * 1024 + 3) {
            tap.feed(chunk, &mut out);
            most = most
                .max(tap.held())
                .max(tap.pending.capacity())
                .max(out.capacity());
        }
        tap.finish(&mut out);
        assert!(most <= MAX_EVENT_BYTES + 32 * 1024, "held up to {most} bytes");
        assert!(tap.dropped_oversized);
        assert!(out.is_empty(), "nothing after it is read either");
        assert!(!tap.finished);
    }

    #[test]
    fn an_event_over_the_bound_is_not_read_however_it_arrives() {
        let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":9},\"pad\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}\n\n";
        let stream = format!("{usage}data: [DONE]\n\n");
        for max in [usage.len() - 1, usage.len()] {
            for size in [1, 2, 3, 7, 50, stream.len()] {
                let mut tap = SseTap::new(Endpoint::ChatCompletions, true, CEILING).with_max_event(max);
                let parts: Vec<&str> = stream
                    .as_bytes()
                    .chunks(size)
                    .map(|c| std::str::from_utf8(c).unwrap())
                    .collect();
                let out = feed_all(&mut tap, &parts);
                if max < usage.len() {
                    assert_eq!(out, stream, "over the bound: passed on, max {max} chunks {size}");
                    assert_eq!(tap.usage, UsageReport::Missing);
                } else {
                    assert_eq!(out, "data: [DONE]\n\n", "within: stripped, chunks {size}");
                    assert!(matches!(tap.usage, UsageReport::Valid(_)));
                }
                assert!(tap.finished);
            }
        }
    }

    #[test]
    fn error_events_are_masked() {
        let secret = "sk-proj-abcDEF0123456789ghiJKLwxyz";
        let mask = Arc::new(SecretMask::new(secret));
        let openai = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"ok {secret}\"}}}}]}}\n\n\
             data: {{\"error\":{{\"message\":\"Incorrect API key provided: sk-proj-abc…wxyz\"}},\"choices\":[{{\"finish_reason\":\"error\"}}]}}\n\n"
        );
        let mut tap = SseTap::new(Endpoint::ChatCompletions, false, CEILING).masking(mask.clone());
        let out = feed_all(&mut tap, &[&openai]);
        assert_eq!(tap.error.as_deref(), Some("Incorrect API key provided: ***"));
        assert!(out.contains("provided: ***\""), "{out}");
        assert!(!out.contains("abc…wxyz"), "{out}");
        // Only error events are rewritten.
        assert!(out.contains(&format!("ok {secret}")));

        let anthropic = format!(
            "event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"authentication_error\",\"message\":\"bad key {secret}\"}}}}\n\n"
        );
        let mut tap = SseTap::new(Endpoint::Messages, false, CEILING).masking(mask);
        let out = feed_all(&mut tap, &[&anthropic]);
        assert_eq!(tap.error.as_deref(), Some("bad key ***"));
        assert!(!out.contains(secret), "{out}");
        assert_eq!(out, anthropic.replace(secret, "***"));
    }

    #[test]
    fn a_separator_split_across_chunks_ends_the_event() {
        let stream = "data: {\"a\":1}\r\n\r\ndata: {\"b\":2}\n\ndata: [DONE]\n\n";
        for max in [4, 10, 1000] {
            for cut in 0..stream.len() {
                for cut2 in cut..stream.len() {
                    let parts = [&stream[..cut], &stream[cut..cut2], &stream[cut2..]];
                    let mut tap = SseTap::new(Endpoint::ChatCompletions, true, CEILING).with_max_event(max);
                    assert_eq!(feed_all(&mut tap, &parts), stream, "max {max} cuts {cut} {cut2}");
                    assert_eq!(tap.finished, max >= 14, "max {max} cuts {cut} {cut2}");
                }
            }
        }
    }

    mod properties {
        //! The tap reads untrusted bytes: it never panics, how the bytes are cut into chunks never
        //! changes what it passes on, and it removes only what it is meant to.

        use super::*;
        use proptest::prelude::*;

        /// One event of a generated OpenAI stream: its bytes (separator excluded) and what the
        /// tap passes on of it when it strips the usage it asked for.
        #[derive(Clone, Debug)]
        struct Event {
            input: String,
            stripped: String,
            usage: Option<Usage>,
            content: bool,
            done: bool,
        }

        fn text() -> impl Strategy<Value = String> {
            // No quotes or backslashes: the generated JSON stays well-formed.
            "[a-zA-Z0-9 ,.:{}\\[\\]é中]{0,24}"
        }

        fn event() -> impl Strategy<Value = Event> {
            let content = (text(), 0..3usize, 0..200usize).prop_map(|(t, usage_null, pad)| {
                let t = if pad > 150 {
                    format!("{t}{}", "p".repeat(pad * 4))
                } else {
                    t
                };
                let body = format!("\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}}}}]");
                let (input, stripped) = match usage_null {
                    0 => (format!("data: {{{body}}}"), format!("data: {{{body}}}")),
                    1 => (
                        format!("data: {{{body},\"usage\":null}}"),
                        format!("data: {{{body}}}"),
                    ),
                    _ => (
                        format!("data: {{\"usage\":null,{body}}}"),
                        format!("data: {{{body}}}"),
                    ),
                };
                Event {
                    input,
                    stripped,
                    usage: None,
                    content: !t.is_empty(),
                    done: false,
                }
            });
            let usage = (0..1_000_000u64, 0..1_000_000u64, 0..200usize).prop_map(|(p, c, pad)| Event {
                input: format!(
                    "data: {{\"id\":\"x\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{p},\"completion_tokens\":{c}}},\"pad\":\"{}\"}}",
                    "q".repeat(pad)
                ),
                stripped: String::new(),
                usage: Some(Usage {
                    prompt: p,
                    completion: c,
                }),
                content: false,
                done: false,
            });
            let plain = prop_oneof![
                Just(("data: [DONE]".to_owned(), true)),
                Just((": keep-alive".to_owned(), false)),
                Just(("data: {\"error\":{\"message\":\"boom\"}}".to_owned(), false)),
                "[a-zA-Z0-9 :]{0,30}".prop_map(|g| (g, false)),
            ]
            .prop_map(|(line, done)| Event {
                stripped: line.clone(),
                input: line,
                usage: None,
                content: false,
                done,
            });
            prop_oneof![4 => content, 1 => usage, 2 => plain]
        }

        /// A stream: events with their separators, perhaps an unterminated last one.
        fn stream() -> impl Strategy<Value = (Vec<(Event, &'static str)>, usize)> {
            (
                prop::collection::vec(
                    (event(), prop::sample::select(vec!["\n\n", "\r\n\r\n", ""])),
                    0..12,
                ),
                64..2048usize,
            )
                .prop_map(|(mut events, max)| {
                    // Only the last event may lack a separator.
                    let n = events.len();
                    for (i, (_, sep)) in events.iter_mut().enumerate() {
                        if sep.is_empty() && i + 1 < n {
                            *sep = "\n\n";
                        }
                    }
                    (events, max)
                })
        }

        /// Cuts `bytes` at the given points (taken modulo its length).
        fn split(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
            let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
            at.sort_unstable();
            let mut parts = Vec::new();
            let mut from = 0;
            for c in at {
                parts.push(bytes[from..c].to_vec());
                from = c;
            }
            parts.push(bytes[from..].to_vec());
            parts
        }

        fn run(tap: &mut SseTap, parts: &[Vec<u8>]) -> Vec<u8> {
            let mut out = BytesMut::new();
            for p in parts {
                tap.feed(p, &mut out);
                assert!(tap.held() <= tap.max_event);
            }
            tap.finish(&mut out);
            out.to_vec()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            #[test]
            fn prop_sse_tap_removes_only_what_it_asked_for(
                (events, max) in stream(),
                cuts in prop::collection::vec(any::<usize>(), 0..16),
                strip in any::<bool>(),
            ) {
                let mut input = String::new();
                let mut want = String::new();
                let (mut usage, mut content, mut done) = (None, 0, false);
                let mut over = false;
                for (e, sep) in &events {
                    let whole = format!("{}{sep}", e.input);
                    input.push_str(&whole);
                    if over {
                        // After the terminator: neither passed on nor read.
                        continue;
                    }
                    if sep.is_empty() {
                        // The body ends inside this event: an oversized one went out as it
                        // came, closed by a blank line; the terminator goes out with its
                        // blank line; anything else is dropped unread.
                        if whole.len() > max {
                            want.push_str(&whole);
                            want.push_str("\n\n");
                        } else if e.done {
                            want.push_str(&whole);
                            want.push_str("\n\n");
                            done = true;
                        }
                        continue;
                    }
                    // An event over the bound passes through unread.
                    if whole.len() > max {
                        want.push_str(&whole);
                        continue;
                    }
                    if strip && e.usage.is_some() {
                        // The usage chunk goes, separator and all.
                    } else if strip {
                        want.push_str(&e.stripped);
                        want.push_str(sep);
                    } else {
                        want.push_str(&whole);
                    }
                    usage = e.usage.or(usage);
                    content += u64::from(e.content);
                    done |= e.done;
                    over = e.done;
                }
                let mut tap = SseTap::new(Endpoint::ChatCompletions, strip, CEILING).with_max_event(max);
                let out = run(&mut tap, &split(input.as_bytes(), &cuts));
                prop_assert_eq!(String::from_utf8(out).unwrap(), want);
                prop_assert_eq!(tap.usage, usage.map_or(UsageReport::Missing, UsageReport::Valid));
                prop_assert_eq!(tap.content_chunks, content);
                prop_assert_eq!(tap.finished, done);
            }

            #[test]
            fn prop_sse_tap_any_bytes_any_chunks(
                bytes in prop::collection::vec(
                    prop_oneof![
                        8 => any::<u8>(),
                        2 => Just(b'\n'),
                        1 => Just(b'\r'),
                    ],
                    0..1024,
                ),
                cuts in prop::collection::vec(any::<usize>(), 0..16),
                max in 1..256usize,
                anthropic in any::<bool>(),
                strip in any::<bool>(),
            ) {
                let endpoint = if anthropic { Endpoint::Messages } else { Endpoint::ChatCompletions };
                let whole = run(&mut SseTap::new(endpoint, strip, CEILING).with_max_event(max), std::slice::from_ref(&bytes));
                let cut = run(&mut SseTap::new(endpoint, strip, CEILING).with_max_event(max), &split(&bytes, &cuts));
                prop_assert_eq!(&cut, &whole, "chunking changed the output");
                // At most a blank line is added (ending an event the body ended inside).
                let body = whole
                    .strip_suffix(b"\n\n".as_slice())
                    .or_else(|| whole.strip_suffix(b"\n".as_slice()))
                    .unwrap_or(&whole);
                if strip && !anthropic {
                    // Only removals: the output is the input with some bytes left out.
                    let mut rest = bytes.iter();
                    prop_assert!(body.iter().all(|b| rest.any(|i| i == b)));
                } else {
                    // The input up to where the stream ended (its terminator, or its last
                    // whole event).
                    prop_assert!(bytes.starts_with(body) || bytes.starts_with(&whole));
                }
            }

            #[test]
            fn prop_sse_tap_giant_lines(
                line in 0..20_000usize,
                max in 1..4096usize,
                chunk in 1..5000usize,
            ) {
                let mut input = b"data: {\"choices\":[{\"delta\":{\"content\":\"".to_vec();
                input.resize(input.len() + line, b'z');
                input.extend_from_slice(b"\"}}],\"usage\":null}\n\ndata: [DONE]\n\n");
                let mut tap = SseTap::new(Endpoint::ChatCompletions, false, CEILING).with_max_event(max);
                let parts: Vec<Vec<u8>> = input.chunks(chunk).map(<[u8]>::to_vec).collect();
                let out = run(&mut tap, &parts);
                prop_assert_eq!(out, input);
                prop_assert_eq!(tap.finished, max >= 14);
            }
        }
    }
}
