//! A streamed response passed through as it arrives (what arrived together leaves in one write,
//! nothing waits for more). The stream owns the request's
//! [`Completion`]: it finishes it when the message ends (its terminator), when the upstream ends,
//! when the upstream misses a deadline — its first byte, or the next chunk within the idle gap —
//! and, through `Drop`, when the client goes away mid-stream, with the tokens delivered so far.
//!
//! Every stream ends for the client with its terminator or a final error event in the client's
//! format: the message's end ends the client's stream (nothing after it is sent or counted; what
//! the upstream still sends is drained off the request path, so its connection is reused); a
//! stream the upstream cut short, a deadline passed, or an event too large to translate ends with
//! a final error event (or, before any byte went out, the request is answered with the error).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::BodyDataStream;
use bytes::{Bytes, BytesMut};
use futures::Stream;
use tokio::time::Sleep;

use super::completion::{Completion, Outcome, Source};
use crate::deadline::{Deadline, Missed};
use crate::error::ApiError;
use crate::provider::adapter::{Endpoint, UsageReport};
use crate::provider::sse::SseTap;
use crate::provider::usage;
use crate::translate::stream::StreamTranslator;

/// The body of a streamed response.
pub struct ProxyStream {
    upstream: BodyDataStream,
    tap: SseTap,
    completion: Option<Completion>,
    started: Instant,
    ttfb: Option<Duration>,
    /// Bytes of the request, for a prompt estimate when the upstream never said.
    request_len: usize,
    ended: bool,
    /// Events read and not yet sent.
    held: BytesMut,
    /// The upstream's first byte is due by this deadline, and each later chunk within its idle
    /// gap of the one before.
    deadline: Deadline,
    /// When the upstream last sent a chunk; none before its first.
    last_chunk: Option<tokio::time::Instant>,
    /// Fires no later than the deadline now due: the first byte's, then the idle gap's after the
    /// last chunk. Moved only when it fires early (chunks came since), not on every chunk.
    timer: Pin<Box<Sleep>>,
    /// An error that ended the stream before a byte went to the client (a deadline passed: 504;
    /// the upstream's stream ended empty: 502): the request is answered with it instead of a
    /// stream.
    unsent_error: Option<ApiError>,
    /// Most tokens a call may report (`max_usage_tokens`), for the estimate a translated stream
    /// tells its client in place of an absurd usage.
    ceiling: u64,
    /// Rewrites the upstream's events (as the tap passed them) in the client's format, when the
    /// credential speaks the other one.
    translator: Option<StreamTranslator>,
    /// The tap's output on its way to the translator.
    tapped: BytesMut,
}

/// Most bytes sent in one write.
const WRITE_MAX: usize = 64 * 1024;

/// What the upstream may still send after the message's end before its connection is dropped
/// rather than drained for reuse: so many bytes, within so long.
const DRAIN_MAX_BYTES: usize = 64 * 1024;
const DRAIN_MAX_TIME: Duration = Duration::from_secs(2);

impl ProxyStream {
    /// Wraps an upstream byte stream whose first byte is due by `deadline`, and each later chunk
    /// within its idle gap of the one before.
    pub fn new(
        upstream: crate::transport::http::Response,
        tap: SseTap,
        completion: Completion,
        request_len: usize,
        deadline: Deadline,
    ) -> Self {
        let started = completion.started();
        let ceiling = tap.ceiling();
        ProxyStream {
            upstream: upstream.into_body().into_data_stream(),
            tap,
            completion: Some(completion),
            started,
            ttfb: None,
            request_len,
            ended: false,
            held: BytesMut::new(),
            deadline,
            last_chunk: None,
            timer: Box::pin(tokio::time::sleep_until(deadline.at())),
            unsent_error: None,
            ceiling,
            translator: None,
            tapped: BytesMut::new(),
        }
    }

    /// Passes the events through `translator` after the tap (which drops an event over its
    /// bound: `SseTap::dropping_oversized`; the stream then ends with an error).
    pub fn translate(&mut self, translator: StreamTranslator) {
        self.translator = Some(translator);
    }

    /// Feeds an upstream chunk to the tap (and the translator); the client's bytes go to `held`.
    fn take_in(&mut self, chunk: &[u8]) {
        match &mut self.translator {
            None => self.tap.feed(chunk, &mut self.held),
            Some(t) => {
                self.tap.feed(chunk, &mut self.tapped);
                // Until the upstream's usage is valid, the client is told the estimate that is
                // counted (`finish`).
                let fallback = match &self.tap.usage {
                    UsageReport::Valid(_) => None,
                    reported => Some(usage::estimate(
                        self.request_len,
                        self.tap.content_chunks,
                        reported,
                        self.ceiling,
                    )),
                };
                t.fallback_usage(fallback);
                t.feed(&self.tapped.split(), &mut self.held);
            }
        }
    }

    /// The upstream's body ended: what the tap (and the translator) make of its last bytes goes
    /// to `held` (the terminator an answer that named its stop lacked, perhaps).
    fn take_in_end(&mut self) {
        match &mut self.translator {
            None => self.tap.finish(&mut self.held),
            Some(t) => {
                self.tap.finish(&mut self.tapped);
                t.feed(&self.tapped.split(), &mut self.held);
            }
        }
    }

    /// Whether the client has had its final error event: the upstream's own mid-stream error,
    /// passed on or translated.
    fn error_sent(&self) -> bool {
        self.tap.error.is_some()
    }

    /// The completion and the error of a stream that ended before any byte went to the client
    /// (the stream then yielded nothing): the request is answered as a gateway refusal.
    pub fn failed_before_the_head(&mut self) -> Option<(Completion, ApiError)> {
        let error = self.unsent_error.take()?;
        self.completion.take().map(|c| (c, error))
    }

    /// Ends the stream with `error` as its final event in the client's format; if no byte went
    /// to the client yet, the request is left to be answered with it instead.
    fn end_with(&mut self, error: ApiError) -> Option<ApiError> {
        self.ended = true;
        if self.ttfb.is_none() && self.held.is_empty() {
            self.unsent_error = Some(error);
            return None;
        }
        let anthropic = self
            .completion
            .as_ref()
            .is_some_and(|c| c.endpoint() == Endpoint::Messages);
        self.held
            .extend_from_slice(error.stream_event(anthropic).as_bytes());
        Some(error)
    }

    /// The message ended (its terminator came): the request is complete; the client's stream
    /// ends with what is held. What the upstream still sends is read without waiting, up to a
    /// bound, and the rest drained off the request path so that its connection is reused.
    fn message_ended(&mut self, cx: &mut Context<'_>) {
        self.ended = true;
        self.finish(false, false, None);
        let mut drained = 0;
        loop {
            if http_body::Body::is_end_stream(&self.upstream) {
                return;
            }
            match Pin::new(&mut self.upstream).poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) if drained + chunk.len() <= DRAIN_MAX_BYTES => {
                    drained += chunk.len();
                }
                Poll::Ready(_) => return,
                Poll::Pending => break,
            }
        }
        let mut rest = std::mem::replace(&mut self.upstream, axum::body::Body::empty().into_data_stream());
        tokio::spawn(async move {
            let drain = async {
                while let Some(Ok(chunk)) = futures::StreamExt::next(&mut rest).await {
                    drained += chunk.len();
                    if drained > DRAIN_MAX_BYTES {
                        return;
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_MAX_TIME, drain).await;
        });
    }

    /// The upstream's body ended (`broke`: with an error). An answer that never reached its end
    /// was cut short: the client gets a final error event, unless it had the upstream's own.
    fn upstream_ended(&mut self, broke: bool) {
        self.ended = true;
        self.take_in_end();
        if !self.tap.finished && !self.error_sent() {
            let error = ApiError::UpstreamInvalidResponse {
                reason: "its stream ended before the answer did".to_owned(),
            };
            if self.end_with(error).is_none() {
                return;
            }
        }
        self.finish(broke, false, None);
    }

    /// The tap dropped an event over its bound, which a translated stream cannot translate
    /// nor hold: the stream ends with a final error event rather than go on with a hole.
    fn untranslatable(&mut self) {
        let error = ApiError::UpstreamInvalidResponse {
            reason: format!(
                "one of its events is over {} bytes, which the gateway does not translate",
                crate::provider::sse::MAX_EVENT_BYTES
            ),
        };
        tracing::warn!("{error}");
        if let Some(error) = self.end_with(error) {
            self.finish(false, false, Some(&error));
        }
    }

    /// Notes a chunk from the upstream: the idle gap starts again.
    fn chunk_came(&mut self) {
        let now = tokio::time::Instant::now();
        if self.last_chunk.replace(now).is_none() {
            // The first byte: from now on the idle gap is due, sooner than the first byte was.
            self.timer.as_mut().reset(now + self.deadline.idle_gap());
        }
    }

    /// Whether the deadline now due has passed; registers the wake-up otherwise.
    fn deadline_passed(&mut self, cx: &mut Context<'_>) -> Option<Missed> {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return None;
            }
            let Some(last) = self.last_chunk else {
                return Some(self.deadline.missed());
            };
            let due = last + self.deadline.idle_gap();
            if tokio::time::Instant::now() >= due {
                return Some(self.deadline.idle_missed());
            }
            // Chunks came since the timer was set: it waits for the gap after the last one.
            self.timer.as_mut().reset(due);
        }
    }

    /// A deadline passed: the credential is parked as for a 5xx; if bytes went to the client
    /// already, a final error event in the endpoint's format ends the stream and the request is
    /// logged with what was delivered; if not, the request is left to be answered with a 504.
    fn time_out(&mut self, missed: Missed) {
        self.ended = true;
        if self.tap.finished {
            // The answer was whole (`[DONE]`, `message_stop`); only the connection lingered.
            self.finish(false, false, None);
            return;
        }
        let Some(completion) = self.completion.as_mut() else {
            return;
        };
        completion.serving_timed_out(&missed);
        // What the upstream sent of an unfinished event stays back: the error event follows the
        // last whole one.
        if let Some(error) = self.end_with(ApiError::Timeout(missed)) {
            self.finish(false, false, Some(&error));
        }
    }

    /// Sends what is held.
    fn release(&mut self) -> Result<Bytes, std::io::Error> {
        self.ttfb.get_or_insert_with(|| self.started.elapsed());
        Ok(self.held.split().freeze())
    }

    /// Finishes the completion, once: `gateway_error` is the error the gateway ended the stream
    /// with (a deadline passed, an event it cannot translate).
    fn finish(&mut self, upstream_broke: bool, client_gone: bool, gateway_error: Option<&ApiError>) {
        let Some(completion) = self.completion.take() else {
            return;
        };
        if !client_gone && !self.held.is_empty() {
            // The upstream ended with the first bytes still held: they leave now.
            self.ttfb.get_or_insert_with(|| self.started.elapsed());
        }
        let complete = self.tap.finished && !client_gone;
        let mut outcome = match (&self.tap.usage, complete) {
            (UsageReport::Valid(u), true) => Outcome::ok(200, Some(*u), self.ttfb),
            // Cut short, or reported invalidly or not at all: count what was delivered (one token
            // per content chunk) and the prompt a valid report gave, else a 4-bytes-per-token
            // estimate of the request.
            (reported, _) => {
                let estimate = usage::estimate(
                    self.request_len,
                    self.tap.content_chunks,
                    reported,
                    self.tap.ceiling(),
                );
                Outcome::estimated(200, estimate, reported.invalid_reason(), self.ttfb)
            }
        };
        outcome.finish_reasons = std::mem::take(&mut self.tap.finish_reasons);
        let summary = completion.attempts_summary();
        if let Some(e) = gateway_error {
            metrics::counter!("aigw_stream_errors_total").increment(1);
            outcome.code = Some(e.code().to_owned());
            outcome.source = Some(Source::Gateway);
            outcome.explanation = format!("Gateway: {e}; usage estimated [{summary}]");
        } else if let Some(message) = self.tap.error.take() {
            metrics::counter!("aigw_stream_errors_total").increment(1);
            outcome.code = Some("upstream_stream_error".to_owned());
            outcome.source = Some(Source::Upstream);
            outcome.explanation = format!("Upstream: mid-stream error: {message} [{summary}]");
        } else if client_gone && completion.cut_by_stop() {
            outcome.code = Some("gateway_stopped".to_owned());
            outcome.source = Some(Source::Gateway);
            outcome.explanation = format!(
                "Gateway: stopped before the stream ended (shutdown_grace_secs over); usage estimated [{summary}]"
            );
        } else if client_gone {
            outcome.code = Some("client_disconnected".to_owned());
            outcome.explanation = format!("client disconnected mid-stream; usage estimated [{summary}]");
        } else if !self.tap.finished {
            metrics::counter!("aigw_stream_errors_total").increment(1);
            outcome.code = Some("upstream_stream_broken".to_owned());
            outcome.source = Some(Source::Upstream);
            let how = if upstream_broke { "broke" } else { "ended" };
            outcome.explanation = format!(
                "Upstream: stream {how} before completion; a final error event was sent; usage estimated [{summary}]"
            );
        }
        completion.finish(outcome);
    }
}

impl Stream for ProxyStream {
    type Item = Result<Bytes, std::io::Error>;

    /// Everything the upstream has already sent goes out in one write: the upstream body is read
    /// until it has nothing ready (it drives its own connection, so that is when the socket has
    /// nothing more), and what was read then leaves together. Nothing waits for the network: one
    /// write (and one wake-up of the client) per batch instead of one per event.
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready((!this.held.is_empty()).then(|| this.release()));
            }
            match Pin::new(&mut this.upstream).poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    this.chunk_came();
                    this.take_in(&chunk);
                    if this.tap.dropped_oversized {
                        this.untranslatable();
                    } else if this.tap.finished {
                        this.message_ended(cx);
                    } else if this.held.len() >= WRITE_MAX {
                        return Poll::Ready(Some(this.release()));
                    }
                }
                // The upstream's body ended: broken (an error) or not.
                Poll::Ready(end) => {
                    let broke = end.is_some();
                    if let Some(Err(e)) = end {
                        tracing::warn!(error = %e, "upstream stream broke");
                    }
                    this.upstream_ended(broke);
                }
                Poll::Pending if this.held.is_empty() => match this.deadline_passed(cx) {
                    Some(missed) => this.time_out(missed),
                    None => return Poll::Pending,
                },
                Poll::Pending => return Poll::Ready(Some(this.release())),
            }
        }
    }
}

impl Drop for ProxyStream {
    fn drop(&mut self) {
        // Still holding the completion: the client went away before the end.
        self.finish(false, true, None);
    }
}
