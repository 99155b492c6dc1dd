//! A Converse answer as an OpenAI chat completion, and Bedrock's words in OpenAI's: the stop
//! reason, the usage (cache tokens included) and the error body (pure; no I/O).

use serde_json::{Map, Value, json};

/// OpenAI's `finish_reason` for a Converse `stopReason`.
pub fn finish_reason(stop_reason: &str) -> &'static str {
    match stop_reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "guardrail_intervened" | "content_filtered" => "content_filter",
        // end_turn, stop_sequence, and any reason AWS adds later.
        _ => "stop",
    }
}

/// OpenAI's usage block for a Converse `usage`: Bedrock's `inputTokens` leaves the cache out,
/// OpenAI's `prompt_tokens` holds it, so the cache reads and writes are added to the prompt
/// (and the reads told as `prompt_tokens_details.cached_tokens`). A count that is not a whole
/// number is passed on as it came, for the usage check to refuse. `None` without a usage.
pub fn usage(u: &Value) -> Option<Value> {
    let u = u.as_object()?;
    let get = |k: &str| u.get(k).cloned().unwrap_or(Value::Null);
    let input = get("inputTokens");
    let output = get("outputTokens");
    let read = u.get("cacheReadInputTokens").and_then(Value::as_u64).unwrap_or(0);
    let write = u
        .get("cacheWriteInputTokens")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let prompt = match input.as_u64() {
        Some(i) => json!(i.saturating_add(read).saturating_add(write)),
        None => input,
    };
    let mut out = json!({"prompt_tokens": prompt, "completion_tokens": output});
    if let (Some(p), Some(c)) = (out["prompt_tokens"].as_u64(), out["completion_tokens"].as_u64()) {
        out["total_tokens"] = json!(p.saturating_add(c));
    }
    if read > 0 || write > 0 {
        out["prompt_tokens_details"] = json!({"cached_tokens": read});
    }
    Some(out)
}

/// The chat completion of a Converse answer, for `model` (the upstream model id); `Err` says why
/// the answer is not one.
pub fn chat_completion(body: &[u8], model: &str, id: &str, created: i64) -> Result<Value, String> {
    let v: Value = serde_json::from_slice(body).map_err(|_| "not a Converse answer (not JSON)".to_owned())?;
    let content = v
        .pointer("/output/message/content")
        .and_then(Value::as_array)
        .ok_or_else(|| "a JSON object without `output.message.content`".to_owned())?;
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for block in content {
        if let Some(t) = block.get("text").and_then(Value::as_str) {
            text.push_str(t);
        } else if let Some(t) = block
            .pointer("/reasoningContent/reasoningText/text")
            .and_then(Value::as_str)
        {
            reasoning.push_str(t);
        } else if let Some(tool) = block.get("toolUse") {
            calls.push(json!({
                "id": tool.get("toolUseId").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {
                    "name": tool.get("name").cloned().unwrap_or(Value::Null),
                    "arguments": tool.get("input").unwrap_or(&json!({})).to_string(),
                }
            }));
        }
    }
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    message.insert(
        "content".into(),
        if text.is_empty() && !calls.is_empty() {
            Value::Null
        } else {
            json!(text)
        },
    );
    if !reasoning.is_empty() {
        message.insert("reasoning_content".into(), json!(reasoning));
    }
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    let stop = v.get("stopReason").and_then(Value::as_str).unwrap_or("end_turn");
    let mut out = json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(stop), "logprobs": null}],
    });
    if let Some(u) = v.get("usage").and_then(usage) {
        out["usage"] = u;
    }
    Ok(out)
}

/// OpenAI's error `type` and `code` for an AWS error type.
fn openai_words(aws_type: Option<&str>, status: u16) -> (&'static str, Option<&'static str>) {
    match aws_type {
        Some("ThrottlingException") => ("rate_limit_error", Some("rate_limit_exceeded")),
        Some("ServiceQuotaExceededException") => ("insufficient_quota", Some("insufficient_quota")),
        Some(
            "AccessDeniedException"
            | "UnrecognizedClientException"
            | "InvalidSignatureException"
            | "ExpiredTokenException"
            | "IncompleteSignatureException"
            | "MissingAuthenticationTokenException",
        ) => ("authentication_error", Some("invalid_api_key")),
        Some("ResourceNotFoundException") => ("invalid_request_error", Some("model_not_found")),
        Some("ValidationException") => ("invalid_request_error", None),
        _ => match status {
            429 => ("rate_limit_error", None),
            400..=499 => ("invalid_request_error", None),
            _ => ("api_error", None),
        },
    }
}

/// An AWS error answer (`{"message": …}` with its type in `x-amzn-errortype` or `__type`) in
/// OpenAI's error shape, the AWS type kept as `aws_error_type`: the shape the gateway passes to
/// a chat client (and `translate` renders for a messages client). A body that is not AWS's JSON
/// is kept as the message.
pub fn openai_error(status: u16, errortype_header: Option<&str>, body: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let aws_type = super::error_type(errortype_header, &v);
    let message = v
        .get("message")
        .or_else(|| v.get("Message"))
        .and_then(Value::as_str)
        .map_or_else(
            || {
                let s = String::from_utf8_lossy(body);
                let s = s.trim();
                if s.is_empty() {
                    format!("upstream error (status {status})")
                } else {
                    s.chars().take(2000).collect()
                }
            },
            str::to_owned,
        );
    let (kind, code) = openai_words(aws_type, status);
    json!({"error": {"message": message, "type": kind, "param": null, "code": code,
        "aws_error_type": aws_type}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_map_to_finish_reasons() {
        let rows = [
            ("end_turn", "stop"),
            ("stop_sequence", "stop"),
            ("max_tokens", "length"),
            ("tool_use", "tool_calls"),
            ("guardrail_intervened", "content_filter"),
            ("content_filtered", "content_filter"),
            ("model_context_window_exceeded", "length"),
            ("something_new", "stop"),
        ];
        for (aws, openai) in rows {
            assert_eq!(finish_reason(aws), openai, "{aws}");
        }
    }

    #[test]
    fn usage_counts_the_cache_as_prompt() {
        let rows = [
            (
                json!({"inputTokens": 10, "outputTokens": 5, "totalTokens": 15}),
                json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}),
            ),
            (
                json!({"inputTokens": 10, "outputTokens": 5, "totalTokens": 45,
                       "cacheReadInputTokens": 20, "cacheWriteInputTokens": 10}),
                json!({"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45,
                       "prompt_tokens_details": {"cached_tokens": 20}}),
            ),
            // Passed on as it came, for the usage check to refuse.
            (
                json!({"inputTokens": -1, "outputTokens": 5}),
                json!({"prompt_tokens": -1, "completion_tokens": 5}),
            ),
        ];
        for (aws, openai) in rows {
            assert_eq!(usage(&aws), Some(openai), "{aws}");
        }
        assert_eq!(usage(&Value::Null), None);
    }

    #[test]
    fn a_converse_answer_becomes_a_chat_completion() {
        let body = json!({
            "output": {"message": {"role": "assistant", "content": [
                {"reasoningContent": {"reasoningText": {"text": "Think.", "signature": "sig"}}},
                {"text": "Let me look."},
                {"toolUse": {"toolUseId": "tooluse_1", "name": "weather", "input": {"city": "Paris"}}}
            ]}},
            "stopReason": "tool_use",
            "usage": {"inputTokens": 12, "outputTokens": 7, "totalTokens": 19},
            "metrics": {"latencyMs": 321}
        });
        let got = chat_completion(
            body.to_string().as_bytes(),
            "anthropic.claude-v2",
            "chatcmpl-1",
            1700,
        )
        .unwrap();
        assert_eq!(
            got,
            json!({
                "id": "chatcmpl-1", "object": "chat.completion", "created": 1700, "model": "anthropic.claude-v2",
                "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": null, "message": {
                    "role": "assistant", "content": "Let me look.", "reasoning_content": "Think.",
                    "tool_calls": [{"id": "tooluse_1", "type": "function",
                        "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]
                }}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}
            })
        );
        let only_tool = json!({"output": {"message": {"content": [{"toolUse": {"toolUseId": "t", "name": "f", "input": {}}}]}},
            "stopReason": "tool_use"});
        let got = chat_completion(only_tool.to_string().as_bytes(), "m", "c", 0).unwrap();
        assert_eq!(got["choices"][0]["message"]["content"], Value::Null);
        assert!(got.get("usage").is_none());
        for bad in ["", "<html>", r#"{"message":"x"}"#] {
            assert!(chat_completion(bad.as_bytes(), "m", "c", 0).is_err(), "{bad}");
        }
    }

    #[test]
    fn aws_errors_are_told_in_openai_words() {
        let rows: &[(u16, Option<&str>, &str, Value)] = &[
            (
                429,
                Some("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"),
                r#"{"message":"Too many requests, please wait before trying again."}"#,
                json!({"error": {"message": "Too many requests, please wait before trying again.",
                    "type": "rate_limit_error", "param": null, "code": "rate_limit_exceeded",
                    "aws_error_type": "ThrottlingException"}}),
            ),
            (
                403,
                None,
                r#"{"__type":"com.amazon.coral.service#UnrecognizedClientException","message":"The security token included in the request is invalid."}"#,
                json!({"error": {"message": "The security token included in the request is invalid.",
                    "type": "authentication_error", "param": null, "code": "invalid_api_key",
                    "aws_error_type": "UnrecognizedClientException"}}),
            ),
            (
                400,
                Some("ValidationException"),
                r#"{"message":"The provided model identifier is invalid."}"#,
                json!({"error": {"message": "The provided model identifier is invalid.",
                    "type": "invalid_request_error", "param": null, "code": null,
                    "aws_error_type": "ValidationException"}}),
            ),
            (
                502,
                None,
                "Bad Gateway",
                json!({"error": {"message": "Bad Gateway", "type": "api_error", "param": null,
                    "code": null, "aws_error_type": null}}),
            ),
        ];
        for (status, header, body, want) in rows {
            assert_eq!(&openai_error(*status, *header, body.as_bytes()), want, "{body}");
        }
    }
}
