//! A `streamGenerateContent?alt=sse` answer (SSE events, each a `GenerateContentResponse`) as an
//! OpenAI chat completion stream, event by event as they come:
//!
//! - the first event → a chunk with the assistant role;
//! - text parts → `content` deltas (thought parts → `reasoning_content`), function calls →
//!   complete `tool_calls` entries (Gemini sends a call whole);
//! - a `finishReason` → the chunk naming the chat `finish_reason`;
//! - the last `usageMetadata` seen (Gemini repeats it, growing) → the usage chunk at the end,
//!   then `[DONE]`;
//! - an `{"error": …}` event → a mid-stream error event in OpenAI's shape, and the end.

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use serde_json::{Value, json};

use super::answer::{openai_error, said, usage};

/// Turns Gemini's stream events into chat completion chunks.
#[derive(Debug)]
pub struct ChunkWriter {
    id: String,
    model: String,
    created: i64,
    started: bool,
    calls: usize,
    usage: Option<Value>,
    /// An error or the end was written: nothing more is.
    pub ended: bool,
}

impl ChunkWriter {
    /// A writer for the answer `id` of `model`, created at `created` (Unix seconds).
    pub fn new(id: String, model: String, created: i64) -> ChunkWriter {
        ChunkWriter {
            id,
            model,
            created,
            started: false,
            calls: 0,
            usage: None,
            ended: false,
        }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>, out: &mut Vec<u8>) {
        let c = json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        event(&c, out);
    }

    /// Appends the chunks of one event's data to `out`.
    pub fn write(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        let Ok(resp) = serde_json::from_slice::<Value>(data) else {
            let e = json!({"error": {"message": "the google stream sent an event that is not JSON",
                "type": "api_error", "code": null}});
            event(&e, out);
            self.ended = true;
            return;
        };
        if resp.get("error").is_some() {
            let status = resp
                .pointer("/error/code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(500);
            event(&openai_error(status, data), out);
            self.ended = true;
            return;
        }
        if !self.started {
            self.started = true;
            self.chunk(json!({"role": "assistant", "content": ""}), None, out);
        }
        let s = said(&resp, self.calls);
        if !s.reasoning.is_empty() {
            self.chunk(json!({"reasoning_content": s.reasoning}), None, out);
        }
        if !s.text.is_empty() {
            self.chunk(json!({"content": s.text}), None, out);
        }
        if !s.calls.is_empty() {
            self.calls += s.calls.len();
            self.chunk(json!({"tool_calls": s.calls}), None, out);
        }
        let finish = if s.finish.is_some() && self.calls > 0 {
            Some("tool_calls")
        } else {
            s.finish
        };
        if let Some(f) = finish {
            self.chunk(json!({}), Some(f), out);
        }
        if let Some(u) = resp.get("usageMetadata").and_then(usage) {
            self.usage = Some(u);
        }
    }

    /// The end of the upstream stream: the usage chunk, then `[DONE]`.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        if let Some(u) = self.usage.take() {
            let c = json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [], "usage": u});
            event(&c, out);
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        self.ended = true;
    }
}

fn event(v: &Value, out: &mut Vec<u8>) {
    out.extend_from_slice(b"data: ");
    // Writing JSON into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, v);
    out.extend_from_slice(b"\n\n");
}

/// Takes every complete SSE event out of `buf` (events end at a blank line, `\n\n` or
/// `\r\n\r\n`) and writes each one's `data:` through `writer`.
fn drain(buf: &mut BytesMut, writer: &mut ChunkWriter, out: &mut Vec<u8>) {
    loop {
        let end = buf
            .windows(2)
            .position(|w| w == b"\n\n")
            .map(|i| (i, 2))
            .into_iter()
            .chain(buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4)))
            .min_by_key(|(i, _)| *i);
        let Some((at, len)) = end else { return };
        let ev = buf.split_to(at + len);
        let mut data = Vec::new();
        for line in ev[..].split(|b| *b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(d) = line.strip_prefix(b"data:") {
                data.extend_from_slice(d.strip_prefix(b" ").unwrap_or(d));
            }
        }
        if !data.is_empty() {
            writer.write(&data, out);
        }
    }
}

/// The chat SSE body of Gemini's SSE `body`, written as it comes; an upstream read error is
/// passed on as such, so the stream breaks as the upstream's did.
pub fn sse_body(body: Body, writer: ChunkWriter) -> Body {
    struct State {
        upstream: futures::stream::BoxStream<'static, Result<Bytes, axum::Error>>,
        buf: BytesMut,
        writer: ChunkWriter,
    }
    let state = State {
        upstream: body.into_data_stream().boxed(),
        buf: BytesMut::new(),
        writer,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        loop {
            if st.writer.ended {
                return None;
            }
            let mut out = Vec::new();
            match st.upstream.next().await {
                Some(Ok(c)) => {
                    st.buf.extend_from_slice(&c);
                    drain(&mut st.buf, &mut st.writer, &mut out);
                }
                Some(Err(e)) => return Some((Err(e), st)),
                None => {
                    st.buf.extend_from_slice(b"\n\n");
                    drain(&mut st.buf, &mut st.writer, &mut out);
                    st.writer.finish(&mut out);
                }
            }
            if !out.is_empty() {
                return Some((Ok(Bytes::from(out)), st));
            }
        }
    });
    Body::from_stream(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn translate(upstream: &str, split: usize) -> String {
        let pieces: Vec<Result<Bytes, std::io::Error>> = upstream
            .as_bytes()
            .chunks(split)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let body = Body::from_stream(futures::stream::iter(pieces));
        let out = sse_body(body, ChunkWriter::new("id".into(), "m".into(), 1));
        let bytes = http_body_util::BodyExt::collect(out).await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn gemini_events_become_chunks_whatever_the_split() {
        let upstream = concat!(
            "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hel\"}],\"role\": \"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 4,\"candidatesTokenCount\": 1,\"totalTokenCount\": 5}}\r\n\r\n",
            "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"lo\"}],\"role\": \"model\"},\"finishReason\": \"STOP\",\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 4,\"candidatesTokenCount\": 2,\"totalTokenCount\": 6}}\r\n\r\n"
        );
        for split in [1, 7, 1000] {
            let out = translate(upstream, split).await;
            let events: Vec<Value> = out
                .split("\n\n")
                .filter_map(|e| e.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .map(|d| serde_json::from_str(d).unwrap())
                .collect();
            assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant", "{split}");
            assert_eq!(events[1]["choices"][0]["delta"]["content"], "Hel");
            assert_eq!(events[2]["choices"][0]["delta"]["content"], "lo");
            assert_eq!(events[3]["choices"][0]["finish_reason"], "stop");
            assert_eq!(events[4]["usage"]["total_tokens"], 6);
            assert_eq!(events.len(), 5);
            assert!(out.ends_with("data: [DONE]\n\n"));
        }
    }

    #[tokio::test]
    async fn an_error_event_ends_the_stream_in_openai_shape() {
        let upstream = "data: {\"error\": {\"code\": 503, \"message\": \"The model is overloaded.\", \"status\": \"UNAVAILABLE\"}}\n\n";
        let out = translate(upstream, 5).await;
        assert!(out.contains("\"code\":\"UNAVAILABLE\""), "{out}");
        assert!(!out.contains("[DONE]"));
    }
}
