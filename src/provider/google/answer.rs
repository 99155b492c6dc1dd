//! A Gemini `GenerateContentResponse` as an OpenAI chat completion.
//!
//! - the first candidate's text parts → `content` (parts marked `thought` → `reasoning_content`),
//!   its `functionCall` parts → `tool_calls` (ids Gemini names, else `call_N`);
//! - `finishReason`: `STOP` → `stop`, `MAX_TOKENS` → `length`, `SAFETY`, `RECITATION`,
//!   `BLOCKLIST`, `PROHIBITED_CONTENT`, `SPII` (and a blocked prompt) → `content_filter`; any
//!   function call → `tool_calls`;
//! - `usageMetadata` → `usage`: `promptTokenCount` → `prompt_tokens` (of which
//!   `cachedContentTokenCount` → `prompt_tokens_details.cached_tokens`), `candidatesTokenCount`
//!   plus `thoughtsTokenCount` → `completion_tokens` (OpenAI counts reasoning as completion; of
//!   which `reasoning_tokens`), `total_tokens` their sum.

use serde_json::{Map, Value, json};

/// The chat `finish_reason` of a Gemini `finishReason`.
pub fn finish_reason(reason: &str) -> &'static str {
    match reason {
        "MAX_TOKENS" => "length",
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" => {
            "content_filter"
        }
        _ => "stop",
    }
}

/// OpenAI's `usage` of a Gemini `usageMetadata`; `None` when it counts nothing.
pub fn usage(meta: &Value) -> Option<Value> {
    let n = |k: &str| meta.get(k).and_then(Value::as_u64).unwrap_or(0);
    let prompt = n("promptTokenCount") + n("toolUsePromptTokenCount");
    let thoughts = n("thoughtsTokenCount");
    let completion = n("candidatesTokenCount") + thoughts;
    if prompt == 0 && completion == 0 {
        return None;
    }
    Some(json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": n("cachedContentTokenCount")},
        "completion_tokens_details": {"reasoning_tokens": thoughts}
    }))
}

/// What one response's first candidate says: text, reasoning, tool calls (numbered from
/// `first_call`), and its finish reason in chat's words.
pub(super) struct Said {
    pub text: String,
    pub reasoning: String,
    pub calls: Vec<Value>,
    pub finish: Option<&'static str>,
}

pub(super) fn said(resp: &Value, first_call: usize) -> Said {
    let cand = resp.pointer("/candidates/0");
    let mut s = Said {
        text: String::new(),
        reasoning: String::new(),
        calls: Vec::new(),
        finish: None,
    };
    for p in cand
        .and_then(|c| c.pointer("/content/parts"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(t) = p.get("text").and_then(Value::as_str) {
            if p.get("thought").and_then(Value::as_bool) == Some(true) {
                s.reasoning.push_str(t);
            } else {
                s.text.push_str(t);
            }
        } else if let Some(fc) = p.get("functionCall") {
            let n = first_call + s.calls.len();
            let id = fc
                .get("id")
                .and_then(Value::as_str)
                .map_or_else(|| format!("call_{n}"), str::to_owned);
            let args = fc.get("args").cloned().unwrap_or_else(|| json!({}));
            s.calls.push(json!({"index": n, "id": id, "type": "function",
                "function": {"name": fc.get("name"), "arguments": args.to_string()}}));
        }
    }
    let reason = cand.and_then(|c| c.get("finishReason")).and_then(Value::as_str);
    s.finish = match reason {
        Some(_) if !s.calls.is_empty() => Some("tool_calls"),
        Some(r) => Some(finish_reason(r)),
        // A prompt blocked before any candidate.
        None if resp.pointer("/promptFeedback/blockReason").is_some() => Some("content_filter"),
        None => None,
    };
    s
}

/// The chat completion of the `generateContent` answer `body`, as `model`.
pub fn chat_completion(body: &[u8], model: &str, id: &str, created: i64) -> Result<Value, String> {
    let resp: Value =
        serde_json::from_slice(body).map_err(|_| "not a Gemini answer (not JSON)".to_owned())?;
    if !resp.is_object() || (resp.get("candidates").is_none() && resp.get("promptFeedback").is_none()) {
        return Err("a JSON object without `candidates`".to_owned());
    }
    let s = said(&resp, 0);
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    message.insert(
        "content".into(),
        if s.text.is_empty() && !s.calls.is_empty() {
            Value::Null
        } else {
            json!(s.text)
        },
    );
    if !s.reasoning.is_empty() {
        message.insert("reasoning_content".into(), json!(s.reasoning));
    }
    if !s.calls.is_empty() {
        let calls: Vec<Value> = s
            .calls
            .into_iter()
            .map(|mut c| {
                if let Some(o) = c.as_object_mut() {
                    o.remove("index");
                }
                c
            })
            .collect();
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    let mut out = json!({
        "id": resp.get("responseId").and_then(Value::as_str).map_or_else(|| id.to_owned(), |r| format!("chatcmpl-{r}")),
        "object": "chat.completion",
        "created": created,
        "model": resp.get("modelVersion").and_then(Value::as_str).unwrap_or(model),
        "choices": [{"index": 0, "message": message, "finish_reason": s.finish.unwrap_or("stop")}],
    });
    if let Some(u) = resp.get("usageMetadata").and_then(usage) {
        out["usage"] = u;
    }
    Ok(out)
}

/// A Gemini error body (`{"error": {"code", "message", "status"}}`) in OpenAI's shape, Google's
/// `status` kept as the `code`, its `details` kept beside.
pub fn openai_error(status: u16, body: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let e = v.get("error").unwrap_or(&Value::Null);
    let message = e
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("the google upstream failed");
    let kind = match status {
        400 | 404 | 413 => "invalid_request_error",
        401 | 403 => "authentication_error",
        429 => "rate_limit_error",
        _ => "api_error",
    };
    let mut out = json!({"error": {"message": message, "type": kind,
        "code": e.get("status").cloned().unwrap_or(Value::Null)}});
    if let Some(d) = e.get("details") {
        out["error"]["details"] = d.clone();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reasons_map() {
        for (g, c) in [
            ("STOP", "stop"),
            ("MAX_TOKENS", "length"),
            ("SAFETY", "content_filter"),
            ("RECITATION", "content_filter"),
            ("BLOCKLIST", "content_filter"),
            ("PROHIBITED_CONTENT", "content_filter"),
            ("SPII", "content_filter"),
            ("OTHER", "stop"),
        ] {
            assert_eq!(finish_reason(g), c, "{g}");
        }
    }

    #[test]
    fn an_answer_becomes_a_chat_completion() {
        let body = json!({
            "candidates": [{"content": {"role": "model", "parts": [
                {"text": "thinking", "thought": true},
                {"text": "Hello"},
                {"functionCall": {"name": "look", "args": {"q": 1}}}
            ]}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5,
                "thoughtsTokenCount": 3, "cachedContentTokenCount": 4, "totalTokenCount": 18},
            "modelVersion": "gemini-2.5-flash",
            "responseId": "abc"
        });
        let c = chat_completion(body.to_string().as_bytes(), "m", "id", 7).unwrap();
        assert_eq!(c["id"], "chatcmpl-abc");
        assert_eq!(c["model"], "gemini-2.5-flash");
        assert_eq!(c["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(c["choices"][0]["message"]["content"], "Hello");
        assert_eq!(c["choices"][0]["message"]["reasoning_content"], "thinking");
        assert_eq!(
            c["choices"][0]["message"]["tool_calls"],
            json!([{"id": "call_0", "type": "function", "function": {"name": "look", "arguments": "{\"q\":1}"}}])
        );
        assert_eq!(
            c["usage"],
            json!({"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18,
                "prompt_tokens_details": {"cached_tokens": 4},
                "completion_tokens_details": {"reasoning_tokens": 3}})
        );
        let blocked = json!({"promptFeedback": {"blockReason": "SAFETY"},
            "usageMetadata": {"promptTokenCount": 3, "totalTokenCount": 3}});
        let c = chat_completion(blocked.to_string().as_bytes(), "m", "id", 7).unwrap();
        assert_eq!(c["choices"][0]["finish_reason"], "content_filter");
        assert!(chat_completion(b"{\"x\":1}", "m", "id", 7).is_err());
        assert!(chat_completion(b"<html>", "m", "id", 7).is_err());
    }
}
