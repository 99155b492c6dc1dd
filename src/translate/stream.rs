//! Event streams in the client's format: Anthropic's events as OpenAI chunks, and OpenAI's chunks
//! as Anthropic's events. The usage and error tap reads the upstream's own events first (so usage
//! is counted from the provider's own report), frames them (`provider::sse`, the one SSE framer),
//! ends the stream at its terminator and hands the translator whole events only, none over its
//! bound (it drops those: `SseTap::dropping_oversized`). The translator keeps no bytes back and
//! has no bound of its own: it writes the client's events for each event it is handed. Once it has written the client's end (`[DONE]`,
//! `message_stop`, or a final error event) it writes nothing more.

use bytes::BytesMut;
use serde_json::{Value, json};

use super::Translation;
use super::chat_to_messages::{finish_reason, usage as chat_usage};
use super::messages_to_chat::stop_of;
use crate::kernel::usage::Usage;
use crate::provider::adapter::Endpoint;

/// Translates one stream.
#[derive(Debug)]
pub struct StreamTranslator {
    direction: Direction,
}

#[derive(Debug)]
enum Direction {
    ToChat(ToChat),
    ToMessages(ToMessages),
}

impl StreamTranslator {
    /// A translator for `t`. `include_usage`: the chat client asked for the usage chunk
    /// (`stream_options.include_usage`); `model` is named in the events until the upstream names
    /// its own.
    pub fn new(t: Translation, include_usage: bool, model: &str) -> Self {
        let direction = match t {
            Translation::ChatToMessages => Direction::ToChat(ToChat {
                include_usage,
                id: String::new(),
                model: model.to_owned(),
                created: super::now_secs(),
                usage: None,
                estimate: None,
                tools: Vec::new(),
                finish: None,
                done: false,
            }),
            Translation::MessagesToChat => Direction::ToMessages(ToMessages {
                model: model.to_owned(),
                started: false,
                open: None,
                blocks: 0,
                tool_blocks: Vec::new(),
                stop: None,
                stop_sequence: None,
                usage: None,
                estimate: None,
                done: false,
            }),
        };
        StreamTranslator { direction }
    }

    /// The usage the client is told while the upstream's is not valid (absurd: past
    /// `max_usage_tokens`; or not reported): the gateway's estimate, which is what is counted.
    /// `None` once the upstream's report is valid: the client is told the provider's own.
    pub fn fallback_usage(&mut self, usage: Option<Usage>) {
        match &mut self.direction {
            Direction::ToChat(s) => s.estimate = usage,
            Direction::ToMessages(s) => s.estimate = usage,
        }
    }

    /// Whether the client's end (its terminator or a final error event) has been written.
    pub fn ended(&self) -> bool {
        match &self.direction {
            Direction::ToChat(s) => s.done,
            Direction::ToMessages(s) => s.done,
        }
    }

    /// Translates the events of `events` into `out`: whole events, as the tap hands them over
    /// (`SseTap::feed`); bytes after the last separator are not an event and are not read.
    pub fn feed(&mut self, events: &[u8], out: &mut BytesMut) {
        for event in crate::provider::sse::events(events) {
            self.event(event, out);
        }
    }

    fn event(&mut self, event: &[u8], out: &mut BytesMut) {
        let Ok(text) = std::str::from_utf8(event) else {
            return;
        };
        let mut name = "";
        let mut data = String::new();
        for line in text.lines() {
            if let Some(n) = line.strip_prefix("event:") {
                name = n.trim();
            } else if let Some(d) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(d.strip_prefix(' ').unwrap_or(d));
            }
        }
        match &mut self.direction {
            Direction::ToChat(s) => s.event(name, &data, out),
            Direction::ToMessages(s) => s.event(&data, out),
        }
    }
}

/// Anthropic's events → OpenAI chunks.
#[derive(Debug)]
struct ToChat {
    include_usage: bool,
    id: String,
    model: String,
    created: i64,
    /// The usage so far: `message_start`'s, its counts replaced by `message_delta`'s.
    usage: Option<Value>,
    /// The gateway's estimate, told while the upstream's usage is not valid.
    estimate: Option<Usage>,
    /// Anthropic content block index of each tool call, in order (its OpenAI `index`).
    tools: Vec<u64>,
    finish: Option<&'static str>,
    /// The client's end (`[DONE]`) is written: nothing more is.
    done: bool,
}

impl ToChat {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        })
    }

    fn emit(out: &mut BytesMut, v: &Value) {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(v.to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
    }

    /// The usage the client is told: the provider's, or the estimate that replaced it.
    fn client_usage(&self) -> Option<Value> {
        match self.estimate {
            Some(u) => Some(super::usage_block(Endpoint::ChatCompletions, u)),
            None => self.usage.as_ref().and_then(chat_usage),
        }
    }

    fn event(&mut self, name: &str, data: &str, out: &mut BytesMut) {
        if self.done {
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let kind = if name.is_empty() {
            v["type"].as_str().unwrap_or_default()
        } else {
            name
        };
        match kind {
            "message_start" => {
                let m = &v["message"];
                if let Some(id) = m["id"].as_str() {
                    self.id = id.to_owned();
                }
                if let Some(model) = m["model"].as_str() {
                    self.model = model.to_owned();
                }
                self.usage = Some(m["usage"].clone());
                Self::emit(
                    out,
                    &self.chunk(json!({"role": "assistant", "content": ""}), None),
                );
            }
            "content_block_start" => {
                let block = &v["content_block"];
                if block["type"] == "tool_use" {
                    let index = self.tools.len();
                    self.tools.push(v["index"].as_u64().unwrap_or_default());
                    let call = json!({"index": index, "id": block["id"], "type": "function",
                        "function": {"name": block["name"], "arguments": ""}});
                    Self::emit(out, &self.chunk(json!({"tool_calls": [call]}), None));
                } else if block["type"] == "text"
                    && let Some(t) = block["text"].as_str().filter(|t| !t.is_empty())
                {
                    Self::emit(out, &self.chunk(json!({"content": t}), None));
                }
            }
            "content_block_delta" => {
                let d = &v["delta"];
                match d["type"].as_str() {
                    Some("text_delta") => {
                        Self::emit(out, &self.chunk(json!({"content": d["text"]}), None));
                    }
                    Some("input_json_delta") => {
                        let at = v["index"].as_u64().unwrap_or_default();
                        if let Some(index) = self.tools.iter().position(|b| *b == at) {
                            let call = json!({"index": index, "function": {"arguments": d["partial_json"]}});
                            Self::emit(out, &self.chunk(json!({"tool_calls": [call]}), None));
                        }
                    }
                    Some("thinking_delta") => {
                        Self::emit(
                            out,
                            &self.chunk(json!({"reasoning_content": d["thinking"]}), None),
                        );
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                self.finish = Some(finish_reason(
                    v.pointer("/delta/stop_reason").and_then(Value::as_str),
                ));
                if let (Some(u), Some(out_tokens)) = (
                    self.usage.as_mut(),
                    v.pointer("/usage/output_tokens").filter(|o| o.is_u64()),
                ) && u.is_object()
                {
                    u["output_tokens"] = out_tokens.clone();
                    // Newer streams restate input and cache counts at the end.
                    for k in [
                        "input_tokens",
                        "cache_creation_input_tokens",
                        "cache_read_input_tokens",
                    ] {
                        if let Some(n) = v["usage"].get(k).filter(|n| n.is_u64()) {
                            u[k] = n.clone();
                        }
                    }
                }
                Self::emit(out, &self.chunk(json!({}), self.finish));
            }
            "message_stop" => {
                if self.include_usage
                    && let Some(u) = self.client_usage()
                {
                    let mut c = self.chunk(json!({}), None);
                    c["choices"] = json!([]);
                    c["usage"] = u;
                    Self::emit(out, &c);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                self.done = true;
            }
            "error" => {
                // The seed 004 mid-stream shape: the error and `finish_reason: "error"`, in
                // OpenAI's words.
                let (kind, code) =
                    super::openai_error_of(v.pointer("/error/type").and_then(Value::as_str), 500);
                let mut c = self.chunk(json!({}), Some("error"));
                c["error"] = json!({"message": v.pointer("/error/message").cloned().unwrap_or(json!("mid-stream error")),
                    "type": kind, "code": code});
                Self::emit(out, &c);
                out.extend_from_slice(b"data: [DONE]\n\n");
                self.done = true;
            }
            // ping, content_block_stop, and events the gateway does not know yet.
            _ => {}
        }
    }
}

/// OpenAI chunks → Anthropic's events.
#[derive(Debug)]
struct ToMessages {
    model: String,
    started: bool,
    /// The block open now: its index, and the tool call index it is for (none: text).
    open: Option<(u64, Option<u64>)>,
    /// Blocks started so far.
    blocks: u64,
    /// (OpenAI tool call index, Anthropic block index) of each tool call.
    tool_blocks: Vec<(u64, u64)>,
    stop: Option<&'static str>,
    /// The stop sequence that ended the answer, where the provider named it.
    stop_sequence: Option<String>,
    usage: Option<Value>,
    /// The gateway's estimate, told while the upstream's usage is not valid.
    estimate: Option<Usage>,
    /// The client's end (`message_stop`, or an `error` event) is written: nothing more is.
    done: bool,
}

impl ToMessages {
    fn emit(out: &mut BytesMut, name: &str, v: &Value) {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        out.extend_from_slice(v.to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
    }

    /// Anthropic's usage block for what is known: the estimate that replaced an absurd usage,
    /// or the provider's (OpenAI's) usage block.
    fn client_usage(&self, reported: Option<&Value>) -> Option<Value> {
        match self.estimate {
            Some(u) => Some(super::usage_block(Endpoint::Messages, u)),
            None => reported.and_then(super::messages_to_chat::usage),
        }
    }

    fn start(&mut self, chunk: &Value, out: &mut BytesMut) {
        if self.started {
            return;
        }
        self.started = true;
        if let Some(m) = chunk["model"].as_str() {
            self.model = m.to_owned();
        }
        // The prompt's size where the upstream reports it this early (some providers send usage
        // on every chunk), else the estimate; the final count comes with `message_delta`.
        let usage = self
            .client_usage(chunk.get("usage").filter(|u| u.is_object()))
            .unwrap_or_else(|| json!({"input_tokens": 0, "output_tokens": 0}));
        let message = json!({"id": chunk["id"], "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage});
        Self::emit(
            out,
            "message_start",
            &json!({"type": "message_start", "message": message}),
        );
    }

    fn close_block(&mut self, out: &mut BytesMut) {
        if let Some((index, _)) = self.open.take() {
            Self::emit(
                out,
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            );
        }
    }

    fn open_block(&mut self, tool: Option<u64>, block: Value, out: &mut BytesMut) -> u64 {
        self.close_block(out);
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some((index, tool));
        Self::emit(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
        index
    }

    fn end(&mut self, out: &mut BytesMut) {
        // An answer with no chunk before its end is an empty message.
        self.start(&json!({}), out);
        self.close_block(out);
        let mut delta = json!({"type": "message_delta",
            "delta": {"stop_reason": self.stop.unwrap_or("end_turn"), "stop_sequence": self.stop_sequence}});
        if let Some(u) = self.client_usage(self.usage.as_ref()) {
            delta["usage"] = u;
        }
        Self::emit(out, "message_delta", &delta);
        Self::emit(out, "message_stop", &json!({"type": "message_stop"}));
        self.done = true;
    }

    /// Text of the answer (`content`, or a `refusal`, which the answer says as text too).
    fn text(&mut self, t: &str, out: &mut BytesMut) {
        if !matches!(self.open, Some((_, None))) {
            self.open_block(None, json!({"type": "text", "text": ""}), out);
        }
        let index = self.open.map_or(0, |(i, _)| i);
        Self::emit(
            out,
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": t}}),
        );
    }

    fn event(&mut self, data: &str, out: &mut BytesMut) {
        if self.done {
            return;
        }
        if data.trim() == "[DONE]" {
            self.end(out);
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
            let message = e["message"].as_str().unwrap_or("mid-stream error");
            Self::emit(
                out,
                "error",
                &json!({"type": "error", "error": {"type": super::anthropic_error_of(e), "message": message}}),
            );
            self.done = true;
            return;
        }
        self.start(&v, out);
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(u.clone());
        }
        let Some(choice) = v["choices"].get(0) else {
            return;
        };
        let d = &choice["delta"];
        for key in ["content", "refusal"] {
            if let Some(t) = d[key].as_str().filter(|t| !t.is_empty()) {
                self.text(t, out);
            }
        }
        for call in d["tool_calls"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let tool = call["index"].as_u64().unwrap_or_default();
            let known = self.tool_blocks.iter().find(|(t, _)| *t == tool).map(|(_, b)| *b);
            let block = match known {
                Some(b) => b,
                None => {
                    let b = self.open_block(
                        Some(tool),
                        json!({"type": "tool_use", "id": call["id"], "name": call.pointer("/function/name"),
                            "input": {}}),
                        out,
                    );
                    self.tool_blocks.push((tool, b));
                    b
                }
            };
            if let Some(args) = call
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .filter(|a| !a.is_empty())
            {
                Self::emit(
                    out,
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": block,
                        "delta": {"type": "input_json_delta", "partial_json": args}}),
                );
            }
        }
        if choice["finish_reason"].is_string() {
            let (stop, sequence) = stop_of(choice);
            self.stop = Some(stop);
            self.stop_sequence = sequence;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::sse::SseTap;

    /// `input` in two chunks cut at `cut`, framed by the tap as on the request path, then
    /// translated.
    fn run(t: Translation, include_usage: bool, input: &str, cut: usize) -> String {
        let mut tap = SseTap::new(t.upstream_endpoint(), false, u64::MAX).dropping_oversized();
        let mut tr = StreamTranslator::new(t, include_usage, "m");
        let (mut tapped, mut out) = (BytesMut::new(), BytesMut::new());
        let cut = cut.min(input.len());
        for chunk in [&input.as_bytes()[..cut], &input.as_bytes()[cut..]] {
            tap.feed(chunk, &mut tapped);
            tr.feed(&tapped.split(), &mut out);
        }
        tap.finish(&mut tapped);
        tr.feed(&tapped.split(), &mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    /// Whole events handed straight to the translator.
    fn translate(t: Translation, include_usage: bool, events: &str) -> String {
        let mut tr = StreamTranslator::new(t, include_usage, "m");
        let mut out = BytesMut::new();
        tr.feed(events.as_bytes(), &mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    fn data_lines(s: &str) -> Vec<Value> {
        s.split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .map(|d| {
                if d == "[DONE]" {
                    json!("[DONE]")
                } else {
                    serde_json::from_str(d).unwrap()
                }
            })
            .collect()
    }

    fn ev(name: &str, data: Value) -> String {
        format!("event: {name}\ndata: {data}\n\n")
    }

    /// Anthropic's documented stream of a text answer and a tool call, as chunks.
    fn anthropic_stream() -> String {
        [
            ev(
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                "role": "assistant", "model": "claude-x", "content": [], "stop_reason": null,
                "usage": {"input_tokens": 25, "output_tokens": 1, "cache_read_input_tokens": 5}}}),
            ),
            ev(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
            ),
            ev("ping", json!({"type": "ping"})),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "Let me check"}}),
            ),
            ev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
            ev(
                "content_block_start",
                json!({"type": "content_block_start", "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}}),
            ),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": "{\"city\": "}}),
            ),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": "\"Paris\"}"}}),
            ),
            ev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 1}),
            ),
            ev(
                "message_delta",
                json!({"type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 15}}),
            ),
            ev("message_stop", json!({"type": "message_stop"})),
        ]
        .concat()
    }

    #[test]
    fn anthropic_events_become_chunks_however_cut() {
        let input = anthropic_stream();
        for cut in [0, 1, 7, 100, 333, input.len()] {
            for include_usage in [false, true] {
                let out = run(Translation::ChatToMessages, include_usage, &input, cut);
                let chunks = data_lines(&out);
                let deltas: Vec<&Value> = chunks
                    .iter()
                    .filter_map(|c| c.pointer("/choices/0/delta"))
                    .collect();
                assert_eq!(deltas[0], &json!({"role": "assistant", "content": ""}));
                assert_eq!(deltas[1], &json!({"content": "Let me check"}));
                assert_eq!(
                    deltas[2],
                    &json!({"tool_calls": [{"index": 0, "id": "toolu_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": ""}}]})
                );
                assert_eq!(
                    deltas[3],
                    &json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]})
                );
                assert_eq!(chunks[5]["choices"][0]["finish_reason"], "tool_calls");
                assert!(
                    chunks
                        .iter()
                        .all(|c| c == "[DONE]" || c["id"] == "msg_1" && c["model"] == "claude-x")
                );
                let usage: Vec<&Value> = chunks.iter().filter_map(|c| c.get("usage")).collect();
                if include_usage {
                    assert_eq!(
                        usage,
                        [
                            &json!({"prompt_tokens": 30, "completion_tokens": 15, "total_tokens": 45,
                            "prompt_tokens_details": {"cached_tokens": 5, "cache_creation_tokens": 0}})
                        ]
                    );
                    assert_eq!(chunks[6]["choices"], json!([]));
                } else {
                    assert!(usage.is_empty(), "{out}");
                }
                assert_eq!(chunks.last().unwrap(), "[DONE]");
            }
        }
    }

    #[test]
    fn an_anthropic_error_event_ends_the_chunks_with_finish_reason_error() {
        let input = [
            ev(
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_2", "model": "c",
                "usage": {"input_tokens": 3, "output_tokens": 1}}}),
            ),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "Hel"}}),
            ),
            ev(
                "error",
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ),
        ]
        .concat();
        let chunks = data_lines(&run(Translation::ChatToMessages, true, &input, 50));
        let last = &chunks[chunks.len() - 2];
        assert_eq!(last["choices"][0]["finish_reason"], "error");
        assert_eq!(last["error"]["message"], "Overloaded");
        assert_eq!(
            last["error"]["type"], "api_error",
            "OpenAI's words, not Anthropic's"
        );
        assert_eq!(chunks.last().unwrap(), "[DONE]");
    }

    /// OpenAI's documented chunks of a text answer, then of tool calls, as Anthropic's events.
    #[test]
    fn chunks_become_anthropic_events() {
        let chunk = |delta: Value, finish: Value| {
            format!(
                "data: {}\n\n",
                json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            )
        };
        let input = [
            chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(json!({"content": "Hi"}), Value::Null),
            chunk(json!({"content": " there"}), Value::Null),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": "f", "arguments": ""}}]}),
                Value::Null,
            ),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":1}"}}]}), Value::Null),
            chunk(json!({}), json!("tool_calls")),
            format!(
                "data: {}\n\n",
                json!({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4,
                    "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 2}}})
            ),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        for cut in [0, 5, 200, input.len()] {
            let out = run(Translation::MessagesToChat, false, &input, cut);
            let names: Vec<&str> = out
                .split("\n\n")
                .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("event: ")))
                .collect();
            assert_eq!(
                names,
                [
                    "message_start",
                    "content_block_start",
                    "content_block_delta",
                    "content_block_delta",
                    "content_block_stop",
                    "content_block_start",
                    "content_block_delta",
                    "content_block_stop",
                    "message_delta",
                    "message_stop"
                ]
            );
            let events = data_lines(&out);
            assert_eq!(events[0]["message"]["model"], "gpt-x");
            assert_eq!(
                events[3]["delta"],
                json!({"type": "text_delta", "text": " there"})
            );
            assert_eq!(
                events[5]["content_block"],
                json!({"type": "tool_use", "id": "call_1", "name": "f", "input": {}})
            );
            assert_eq!(
                events[6],
                json!({"type": "content_block_delta", "index": 1,
                    "delta": {"type": "input_json_delta", "partial_json": "{\"a\":1}"}})
            );
            assert_eq!(events[8]["delta"]["stop_reason"], "tool_use");
            assert_eq!(
                events[8]["usage"],
                json!({"input_tokens": 7, "output_tokens": 4, "cache_read_input_tokens": 2,
                    "cache_creation_input_tokens": 0})
            );
        }
    }

    /// A stop sequence the provider names (vLLM's `stop_reason`) ends the message with
    /// `stop_reason: "stop_sequence"` and names it.
    #[test]
    fn a_named_stop_sequence_reaches_the_message_delta() {
        let input = "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n\
                     data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\",\"stop_reason\":\"END\"}]}\n\n\
                     data: [DONE]\n\n";
        let out = run(Translation::MessagesToChat, false, input, 40);
        let delta = data_lines(&out)
            .into_iter()
            .find(|e| e["type"] == "message_delta")
            .unwrap();
        assert_eq!(
            delta["delta"],
            json!({"stop_reason": "stop_sequence", "stop_sequence": "END"})
        );
    }

    /// An event split across chunks is framed by the tap and translated whole; bytes after the
    /// last separator handed to the translator are not an event, and nothing is kept of them.
    #[test]
    fn an_event_split_across_chunks_is_translated_whole() {
        let event = "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ab\"}}]}\n\n";
        let out = run(Translation::MessagesToChat, false, event, 60);
        assert!(out.contains("\"text\":\"ab\""), "{out}");
        let unfinished = &event[..60];
        assert_eq!(translate(Translation::MessagesToChat, false, unfinished), "");
    }

    /// The client's end is the end: a second message after it (a new start, more usage, another
    /// end) writes nothing.
    #[test]
    fn nothing_follows_the_clients_end() {
        let twice = format!("{}{}", anthropic_stream(), anthropic_stream());
        let out = translate(Translation::ChatToMessages, true, &twice);
        assert_eq!(out.matches("[DONE]").count(), 1, "{out}");
        assert_eq!(out.matches("\"role\":\"assistant\"").count(), 1, "{out}");
        assert_eq!(out.matches("\"usage\"").count(), 1, "{out}");

        let chunks = "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n";
        let out = translate(Translation::MessagesToChat, false, &format!("{chunks}{chunks}"));
        assert_eq!(out.matches("event: message_start").count(), 1, "{out}");
        assert_eq!(out.matches("event: message_stop").count(), 1, "{out}");
        let error = "data: {\"error\":{\"message\":\"boom\"}}\n\n";
        let out = translate(Translation::MessagesToChat, false, &format!("{error}{chunks}"));
        assert!(
            out.starts_with("event: error\n") && !out.contains("message_start"),
            "{out}"
        );
    }

    /// A streamed refusal is text the answer says, as in the answer that is not streamed.
    #[test]
    fn a_streamed_refusal_is_text() {
        let input = "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"refusal\":\"\"}}]}\n\n\
                     data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"refusal\":\"I can't help\"}}]}\n\n\
                     data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"content_filter\"}]}\n\n\
                     data: [DONE]\n\n";
        let events = data_lines(&run(Translation::MessagesToChat, false, input, 60));
        assert_eq!(events[1]["content_block"], json!({"type": "text", "text": ""}));
        assert_eq!(
            events[2]["delta"],
            json!({"type": "text_delta", "text": "I can't help"})
        );
        assert_eq!(events[4]["delta"]["stop_reason"], "refusal");
    }

    /// Usage the upstream reports early reaches `message_start`; an estimate that replaced an
    /// absurd usage is what the client is told, in either direction.
    #[test]
    fn the_usage_the_client_reads() {
        let early = "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":42,\"completion_tokens\":1,\"total_tokens\":43}}\n\ndata: [DONE]\n\n";
        let events = data_lines(&run(Translation::MessagesToChat, false, early, 0));
        assert_eq!(events[0]["message"]["usage"]["input_tokens"], 42);
        assert_eq!(
            events.iter().find(|e| e["type"] == "message_delta").unwrap()["usage"]["input_tokens"],
            42
        );

        let mut tr = StreamTranslator::new(Translation::MessagesToChat, false, "m");
        tr.fallback_usage(Some(Usage {
            prompt: 7,
            completion: 3,
        }));
        let mut out = BytesMut::new();
        tr.feed(early.as_bytes(), &mut out);
        let events = data_lines(std::str::from_utf8(&out).unwrap());
        assert_eq!(events[0]["message"]["usage"]["input_tokens"], 7);
        let delta = events.iter().find(|e| e["type"] == "message_delta").unwrap();
        assert_eq!(
            (&delta["usage"]["input_tokens"], &delta["usage"]["output_tokens"]),
            (&json!(7), &json!(3))
        );

        let mut tr = StreamTranslator::new(Translation::ChatToMessages, true, "m");
        tr.fallback_usage(Some(Usage {
            prompt: 7,
            completion: 3,
        }));
        let mut out = BytesMut::new();
        tr.feed(anthropic_stream().as_bytes(), &mut out);
        let usage: Vec<Value> = data_lines(std::str::from_utf8(&out).unwrap())
            .into_iter()
            .filter_map(|c| c.get("usage").cloned())
            .collect();
        assert_eq!(
            usage,
            [json!({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})]
        );
    }

    #[test]
    fn an_openai_error_chunk_becomes_an_error_event() {
        let input = "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n\
                     data: {\"error\":{\"code\":502,\"message\":\"provider error\"},\"choices\":[{\"finish_reason\":\"error\"}]}\n\n\
                     data: [DONE]\n\n";
        let out = run(Translation::MessagesToChat, false, input, 30);
        let last = out.trim_end().rsplit("\n\n").next().unwrap();
        assert!(last.starts_with("event: error\n"), "{out}");
        assert_eq!(
            data_lines(last)[0],
            json!({"type": "error", "error": {"type": "api_error", "message": "provider error"}})
        );
        assert!(!out.contains("message_stop"), "{out}");
    }
}
