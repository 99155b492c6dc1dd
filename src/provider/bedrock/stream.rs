//! A ConverseStream answer — AWS event-stream frames, decoded by `aws-smithy-eventstream` — as
//! an OpenAI chat completion stream (`text/event-stream` of `chat.completion.chunk`s), event by
//! event as the frames come: nothing is held beyond one frame.
//!
//! - `messageStart` → a chunk with the assistant role;
//! - `contentBlockDelta` text → a `content` delta; reasoning text → a `reasoning_content` delta;
//! - `contentBlockStart` of a `toolUse` → a new `tool_calls` entry (id, name), its
//!   `contentBlockDelta` input pieces → that entry's `arguments`;
//! - `messageStop` → the chunk naming the `finish_reason`;
//! - `metadata` → the usage chunk (no choices; cache tokens counted as prompt), then `[DONE]`;
//! - an exception frame (`throttlingException`, `modelStreamErrorException`, …) → a mid-stream
//!   error event (`{"error": …}`, OpenAI's words, the AWS type kept) and the end; so does a frame
//!   that does not decode.

use std::collections::HashMap;

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::{HeaderValue, Message};
use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use serde_json::{Value, json};

use super::answer::{finish_reason, usage};

/// The content type of an AWS event stream.
pub const EVENT_STREAM: &str = "application/vnd.amazon.eventstream";

/// Turns decoded ConverseStream messages into chat completion chunks.
#[derive(Debug)]
pub struct ChunkWriter {
    id: String,
    model: String,
    created: i64,
    /// `contentBlockIndex` of each tool use → its index among the answer's tool calls.
    tools: HashMap<u64, usize>,
    /// An exception or the usage chunk ended the stream: nothing more is written.
    pub ended: bool,
}

impl ChunkWriter {
    /// A writer for the answer `id` of `model`, created at `created` (Unix seconds).
    pub fn new(id: String, model: String, created: i64) -> ChunkWriter {
        ChunkWriter {
            id,
            model,
            created,
            tools: HashMap::new(),
            ended: false,
        }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>, out: &mut Vec<u8>) {
        let c = json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        event(&c, out);
    }

    /// Appends the SSE events of one decoded message to `out`.
    pub fn write(&mut self, message: &Message, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        let header = |name: &str| {
            message
                .headers()
                .iter()
                .find(|h| h.name().as_str() == name)
                .and_then(|h| match h.value() {
                    HeaderValue::String(s) => Some(s.as_str().to_owned()),
                    _ => None,
                })
        };
        let payload: Value = serde_json::from_slice(message.payload()).unwrap_or(Value::Null);
        match header(":message-type").as_deref() {
            Some("event") => {}
            Some("exception") => {
                let kind = header(":exception-type").unwrap_or_default();
                let words = payload
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("the Bedrock stream failed")
                    .to_owned();
                return self.error(&kind, &words, out);
            }
            _ => {
                let kind = header(":error-code").unwrap_or_else(|| "InternalServerException".into());
                let words = header(":error-message").unwrap_or_else(|| "the Bedrock stream failed".into());
                return self.error(&kind, &words, out);
            }
        }
        let index = payload
            .get("contentBlockIndex")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        match header(":event-type").as_deref() {
            Some("messageStart") => self.chunk(json!({"role": "assistant", "content": ""}), None, out),
            Some("contentBlockStart") => {
                if let Some(tool) = payload.pointer("/start/toolUse") {
                    let n = self.tools.len();
                    self.tools.insert(index, n);
                    let call = json!({"index": n, "id": tool.get("toolUseId"), "type": "function",
                        "function": {"name": tool.get("name"), "arguments": ""}});
                    self.chunk(json!({"tool_calls": [call]}), None, out);
                }
            }
            Some("contentBlockDelta") => {
                let delta = &payload["delta"];
                if let Some(t) = delta.get("text").and_then(Value::as_str) {
                    self.chunk(json!({"content": t}), None, out);
                } else if let Some(t) = delta.pointer("/reasoningContent/text").and_then(Value::as_str) {
                    self.chunk(json!({"reasoning_content": t}), None, out);
                } else if let Some(input) = delta.pointer("/toolUse/input").and_then(Value::as_str) {
                    let n = self.tools.get(&index).copied().unwrap_or(0);
                    let call = json!({"index": n, "function": {"arguments": input}});
                    self.chunk(json!({"tool_calls": [call]}), None, out);
                }
            }
            Some("messageStop") => {
                let stop = payload
                    .get("stopReason")
                    .and_then(Value::as_str)
                    .unwrap_or("end_turn");
                self.chunk(json!({}), Some(finish_reason(stop)), out);
            }
            Some("metadata") => {
                if let Some(u) = payload.get("usage").and_then(usage) {
                    let c = json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                        "model": self.model, "choices": [], "usage": u});
                    event(&c, out);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                self.ended = true;
            }
            // contentBlockStop, and events AWS adds later, say nothing a chat client reads.
            _ => {}
        }
    }

    /// A mid-stream error event in OpenAI's error shape, the AWS type kept; the stream ends.
    pub fn error(&mut self, aws_kind: &str, words: &str, out: &mut Vec<u8>) {
        // Exception frames name the type in lower camel case (`throttlingException`).
        let mut kind = aws_kind.to_owned();
        if let Some(first) = kind.get_mut(..1) {
            first.make_ascii_uppercase();
        }
        let header = (!kind.is_empty()).then_some(kind.as_str());
        let body = json!({"message": words}).to_string();
        let status = match kind.as_str() {
            "ThrottlingException" => 429,
            "ValidationException" => 400,
            "ServiceUnavailableException" => 503,
            _ => 500,
        };
        let e = super::answer::openai_error(status, header, body.as_bytes());
        event(&e, out);
        self.ended = true;
    }
}

fn event(v: &Value, out: &mut Vec<u8>) {
    out.extend_from_slice(b"data: ");
    // Writing JSON into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, v);
    out.extend_from_slice(b"\n\n");
}

/// The SSE body of an event-stream `body`: each upstream chunk's complete frames written as
/// chunks as they come (a frame cut across chunks waits for its end); an upstream read error is
/// passed on as such, so the stream breaks as the upstream's did.
pub fn sse_body(body: Body, writer: ChunkWriter) -> Body {
    struct State {
        upstream: futures::stream::BoxStream<'static, Result<Bytes, axum::Error>>,
        buf: BytesMut,
        decoder: MessageFrameDecoder,
        writer: ChunkWriter,
    }
    let state = State {
        upstream: body.into_data_stream().boxed(),
        buf: BytesMut::new(),
        decoder: MessageFrameDecoder::new(),
        writer,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        loop {
            if st.writer.ended {
                return None;
            }
            let chunk = match st.upstream.next().await? {
                Ok(c) => c,
                Err(e) => return Some((Err(e), st)),
            };
            st.buf.extend_from_slice(&chunk);
            let mut out = Vec::new();
            loop {
                match st.decoder.decode_frame(&mut st.buf) {
                    Ok(DecodedFrame::Complete(m)) => st.writer.write(&m, &mut out),
                    Ok(DecodedFrame::Incomplete) => break,
                    Err(e) => {
                        let words = format!("the Bedrock event stream did not decode: {e}");
                        st.writer.error("InternalServerException", &words, &mut out);
                        break;
                    }
                }
                if st.writer.ended {
                    break;
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
    use aws_smithy_eventstream::frame::write_message_to;
    use aws_smithy_types::event_stream::Header;

    fn frame(kind: &str, name: &str, payload: Value) -> Vec<u8> {
        let type_header = if kind == "event" {
            ":event-type"
        } else {
            ":exception-type"
        };
        let m = Message::new(payload.to_string().into_bytes())
            .add_header(Header::new(
                ":message-type",
                HeaderValue::String(kind.to_owned().into()),
            ))
            .add_header(Header::new(
                type_header,
                HeaderValue::String(name.to_owned().into()),
            ))
            .add_header(Header::new(
                ":content-type",
                HeaderValue::String("application/json".into()),
            ));
        let mut out = Vec::new();
        write_message_to(&m, &mut out).unwrap();
        out
    }

    /// The SSE text of `frames`, sent to the translator `split` bytes at a time.
    async fn translate(frames: &[Vec<u8>], split: usize) -> String {
        let all: Vec<u8> = frames.concat();
        let pieces: Vec<Result<Bytes, std::io::Error>> =
            all.chunks(split).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        let body = Body::from_stream(futures::stream::iter(pieces));
        let out = sse_body(body, ChunkWriter::new("chatcmpl-b".into(), "m".into(), 7));
        let bytes = http_body_util::BodyExt::collect(out).await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    fn data(sse: &str) -> Vec<Value> {
        sse.split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap_or(json!(d)))
            .collect()
    }

    fn answer_frames() -> Vec<Vec<u8>> {
        vec![
            frame("event", "messageStart", json!({"role": "assistant", "p": "abcd"})),
            frame(
                "event",
                "contentBlockDelta",
                json!({"contentBlockIndex": 0, "delta": {"text": "Hel"}, "p": "ab"}),
            ),
            frame(
                "event",
                "contentBlockDelta",
                json!({"contentBlockIndex": 0, "delta": {"text": "lo"}}),
            ),
            frame("event", "contentBlockStop", json!({"contentBlockIndex": 0})),
            frame(
                "event",
                "contentBlockStart",
                json!({"contentBlockIndex": 1,
                "start": {"toolUse": {"toolUseId": "tooluse_1", "name": "weather"}}}),
            ),
            frame(
                "event",
                "contentBlockDelta",
                json!({"contentBlockIndex": 1, "delta": {"toolUse": {"input": "{\"city\":"}}}),
            ),
            frame(
                "event",
                "contentBlockDelta",
                json!({"contentBlockIndex": 1, "delta": {"toolUse": {"input": "\"Paris\"}"}}}),
            ),
            frame("event", "contentBlockStop", json!({"contentBlockIndex": 1})),
            frame("event", "messageStop", json!({"stopReason": "tool_use"})),
            frame(
                "event",
                "metadata",
                json!({"usage": {"inputTokens": 9, "outputTokens": 4, "totalTokens": 13,
                "cacheReadInputTokens": 2}, "metrics": {"latencyMs": 80}}),
            ),
        ]
    }

    #[tokio::test]
    async fn frames_become_chat_chunks_however_the_bytes_are_cut() {
        let whole = translate(&answer_frames(), usize::MAX).await;
        for split in [1, 7, 64] {
            assert_eq!(translate(&answer_frames(), split).await, whole, "split {split}");
        }
        let events = data(&whole);
        assert_eq!(
            events[0]["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        assert_eq!(events[0]["object"], "chat.completion.chunk");
        assert_eq!(events[0]["id"], "chatcmpl-b");
        let text: String = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Hello");
        assert_eq!(
            events[3]["choices"][0]["delta"]["tool_calls"][0],
            json!({"index": 0, "id": "tooluse_1", "type": "function", "function": {"name": "weather", "arguments": ""}})
        );
        let args: String = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
            .collect();
        assert_eq!(args, "{\"city\":\"Paris\"}");
        assert_eq!(events[6]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(events[7]["choices"], json!([]));
        assert_eq!(
            events[7]["usage"],
            json!({"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15,
                "prompt_tokens_details": {"cached_tokens": 2}})
        );
        assert_eq!(events[8], json!("[DONE]"));
        assert_eq!(events.len(), 9);
    }

    #[tokio::test]
    async fn an_exception_frame_is_a_mid_stream_error_and_the_end() {
        let mut frames = answer_frames()[..2].to_vec();
        frames.push(frame(
            "exception",
            "throttlingException",
            json!({"message": "Too many tokens, please wait before trying again."}),
        ));
        frames.push(frame(
            "event",
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"text": "never"}}),
        ));
        let events = data(&translate(&frames, 5).await);
        assert_eq!(events.len(), 3);
        assert_eq!(
            events[2],
            json!({"error": {"message": "Too many tokens, please wait before trying again.",
                "type": "rate_limit_error", "param": null, "code": "rate_limit_exceeded",
                "aws_error_type": "ThrottlingException"}})
        );
        // Bytes that are no frame end the stream with an error event, not a panic.
        let mut garbage = answer_frames()[..1].to_vec();
        garbage.push(vec![
            0, 0, 0, 20, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
        ]);
        let events = data(&translate(&garbage, 3).await);
        assert_eq!(events.len(), 2);
        assert!(
            events[1]["error"]["message"]
                .as_str()
                .unwrap()
                .contains("did not decode"),
            "{events:?}"
        );
    }
}
