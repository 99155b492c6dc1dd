//! A streamed response passed through as it arrives (what arrived together leaves in one write,
//! nothing waits for more). The stream owns the request's
//! [`Completion`]: it finishes it when the upstream ends, and — through `Drop` — when the client
//! goes away mid-stream, with the tokens delivered so far.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::BodyDataStream;
use bytes::{Bytes, BytesMut};
use futures::Stream;

use super::completion::{Completion, Outcome, Source};
use crate::upstream::adapter::{SseTap, Usage};

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
}

/// Most bytes sent in one write.
const WRITE_MAX: usize = 64 * 1024;

impl ProxyStream {
    /// Wraps an upstream byte stream.
    pub fn new(
        upstream: crate::upstream::http::Response,
        tap: SseTap,
        completion: Completion,
        request_len: usize,
    ) -> Self {
        let started = completion.started();
        ProxyStream {
            upstream: upstream.into_body().into_data_stream(),
            tap,
            completion: Some(completion),
            started,
            ttfb: None,
            request_len,
            ended: false,
            held: BytesMut::new(),
        }
    }

    /// Sends what is held.
    fn release(&mut self) -> Result<Bytes, std::io::Error> {
        self.ttfb.get_or_insert_with(|| self.started.elapsed());
        Ok(self.held.split().freeze())
    }

    fn finish(&mut self, upstream_broke: bool, client_gone: bool) {
        let Some(completion) = self.completion.take() else {
            return;
        };
        if !client_gone && !self.held.is_empty() {
            // The upstream ended with the first bytes still held: they leave now.
            self.ttfb.get_or_insert_with(|| self.started.elapsed());
        }
        let complete = self.tap.finished && !client_gone;
        let (usage, estimated) = match (self.tap.usage, complete) {
            (Some(u), true) => (u, false),
            // Cut short: count what was delivered (one token per content chunk) and the prompt
            // the upstream reported, else a 4-bytes-per-token estimate of the request.
            (reported, _) => (
                Usage {
                    prompt: reported.map_or((self.request_len as u64).div_ceil(4), |u| u.prompt),
                    completion: self.tap.content_chunks.max(reported.map_or(0, |u| u.completion)),
                },
                true,
            ),
        };
        let mut outcome = Outcome::ok(200, Some(usage), self.ttfb);
        outcome.estimated = estimated;
        let summary = completion.attempts_summary();
        if let Some(message) = self.tap.error.take() {
            metrics::counter!("aigw_stream_errors_total").increment(1);
            outcome.code = Some("upstream_stream_error".to_owned());
            outcome.source = Some(Source::Upstream);
            outcome.explanation = format!("Upstream: mid-stream error: {message} [{summary}]");
        } else if client_gone {
            outcome.code = Some("client_disconnected".to_owned());
            outcome.explanation = format!("client disconnected mid-stream; usage estimated [{summary}]");
        } else if upstream_broke || !self.tap.finished {
            metrics::counter!("aigw_stream_errors_total").increment(1);
            outcome.code = Some("upstream_stream_broken".to_owned());
            outcome.source = Some(Source::Upstream);
            outcome.explanation = format!("Upstream: stream ended before completion [{summary}]");
        }
        completion.finish(outcome);
    }
}

impl Stream for ProxyStream {
    type Item = Result<Bytes, std::io::Error>;

    /// What the upstream body has ready goes out in one write: the body is read until it has
    /// nothing ready, and the whole events read then leave together. Nothing waits for the
    /// network: one write (and one wake-up of the client) per batch instead of one per event.
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready((!this.held.is_empty()).then(|| this.release()));
            }
            match Pin::new(&mut this.upstream).poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    this.tap.feed(&chunk, &mut this.held);
                    if this.held.len() >= WRITE_MAX {
                        return Poll::Ready(Some(this.release()));
                    }
                }
                // The upstream ended: broken (an error) or complete.
                Poll::Ready(end) => {
                    let broke = end.is_some();
                    if let Some(Err(e)) = end {
                        tracing::warn!(error = %e, "upstream stream broke");
                    }
                    this.ended = true;
                    this.tap.finish(&mut this.held);
                    this.finish(broke, false);
                }
                Poll::Pending if this.held.is_empty() => return Poll::Pending,
                Poll::Pending => return Poll::Ready(Some(this.release())),
            }
        }
    }
}

impl Drop for ProxyStream {
    fn drop(&mut self) {
        // Still holding the completion: the client went away before the end.
        self.finish(false, true);
    }
}
