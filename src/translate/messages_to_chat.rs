//! `POST /v1/messages` served by an OpenAI-family credential: the Anthropic Messages request as
//! an OpenAI chat request, and the chat completion as a Messages answer.

use serde_json::{Map, Value, json};

use super::{Refused, kind_of};
use crate::provider::Provider;

/// Most stop sequences OpenAI's chat API takes (`stop`).
pub const MAX_STOP_SEQUENCES: usize = 4;

/// Whether the output bound goes as `max_completion_tokens`: always to OpenAI itself, where
/// `max_tokens` is deprecated and refused by the reasoning models (o-series, gpt-5); to an
/// OpenAI-compatible server when the model is one of those by name (a proxy of OpenAI's);
/// never to OpenRouter or Gemini, which read `max_tokens`. Azure's deployments are named by
/// their owner, not after the model, so it gets `max_completion_tokens` always (every model
/// reads it since API version 2024-09-01-preview; its reasoning models refuse `max_tokens`).
pub fn bounds_with_max_completion_tokens(provider: Provider, model: &str) -> bool {
    match provider {
        Provider::OpenAi | Provider::Azure => true,
        Provider::OpenAiCompatible => is_openai_reasoning_model(model),
        _ => false,
    }
}

/// An OpenAI reasoning model by name (`o1`, `o3-mini`, `o4-mini-2025-04-16`, `gpt-5`,
/// `openai/gpt-5-mini`, …).
fn is_openai_reasoning_model(model: &str) -> bool {
    let name = model.rsplit('/').next().unwrap_or(model);
    let mut chars = name.chars();
    let o_series = chars.next() == Some('o') && chars.next().is_some_and(|c| c.is_ascii_digit());
    o_series || name.starts_with("gpt-5")
}

/// The chat request for a Messages request's top-level `fields`, asking for `model` of a
/// credential of `provider`.
pub fn request(fields: &Map<String, Value>, model: &str, provider: Provider) -> Result<Value, Refused> {
    let mut out = Map::new();
    out.insert("model".into(), json!(model));
    let mut messages: Vec<Value> = Vec::new();
    let mut parallel_off = false;
    for (key, v) in fields {
        let k = key.as_str();
        match k {
            "model" | "messages" => {}
            "system" => match v {
                Value::Null => {}
                Value::String(s) => messages.push(json!({"role": "system", "content": s})),
                Value::Array(blocks) => {
                    let text = texts(blocks, "system")?;
                    messages.push(json!({"role": "system", "content": text}));
                }
                other => {
                    return Err(Refused::new(k, format!("`system` cannot be {}", kind_of(other))));
                }
            },
            "max_tokens" => {
                if !v.is_null() {
                    let name = if bounds_with_max_completion_tokens(provider, model) {
                        "max_completion_tokens"
                    } else {
                        "max_tokens"
                    };
                    out.insert(name.into(), v.clone());
                }
            }
            "temperature" | "top_p" => {
                if !v.is_null() {
                    out.insert(k.into(), v.clone());
                }
            }
            "stream" => {
                if v.as_bool() == Some(true) {
                    out.insert("stream".into(), json!(true));
                    // The gateway counts usage from the provider's own report.
                    out.insert("stream_options".into(), json!({"include_usage": true}));
                }
            }
            "stop_sequences" => match v {
                Value::Null => {}
                Value::Array(a) if a.len() > MAX_STOP_SEQUENCES => {
                    return Err(Refused::new(
                        k,
                        format!(
                            "{} stop sequences cannot be sent to this model, which takes at most {MAX_STOP_SEQUENCES}",
                            a.len()
                        ),
                    ));
                }
                Value::Array(a) if a.iter().all(Value::is_string) => {
                    if !a.is_empty() {
                        out.insert("stop".into(), v.clone());
                    }
                }
                _ => return Err(Refused::new(k, "`stop_sequences` must be an array of strings")),
            },
            "metadata" => {
                if let Some(u) = v.get("user_id").and_then(Value::as_str) {
                    out.insert("user".into(), json!(u));
                }
                if v.as_object().is_some_and(|o| o.keys().any(|k| k != "user_id")) {
                    return Err(Refused::new(
                        k,
                        "only `metadata.user_id` can be sent to this model",
                    ));
                }
            }
            "tools" => {
                if let Some(list) = v.as_array() {
                    let mut tools = Vec::with_capacity(list.len());
                    for (i, t) in list.iter().enumerate() {
                        tools.push(tool(t, i)?);
                    }
                    if !tools.is_empty() {
                        out.insert("tools".into(), Value::Array(tools));
                    }
                } else if !v.is_null() {
                    return Err(Refused::new(k, "`tools` must be an array"));
                }
            }
            "tool_choice" => {
                if v.is_null() {
                    continue;
                }
                parallel_off = v.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true);
                let choice = match v.get("type").and_then(Value::as_str) {
                    Some("auto") => json!("auto"),
                    Some("any") => json!("required"),
                    Some("none") => json!("none"),
                    Some("tool") => match v.get("name").and_then(Value::as_str) {
                        Some(name) => json!({"type": "function", "function": {"name": name}}),
                        None => {
                            return Err(Refused::new(
                                "tool_choice.name",
                                "`tool_choice` must name the tool",
                            ));
                        }
                    },
                    _ => return Err(Refused::new(k, "unknown `tool_choice` type")),
                };
                out.insert("tool_choice".into(), choice);
            }
            "top_k" | "thinking" | "service_tier" | "container" | "mcp_servers" | "context_management" => {
                if !v.is_null() {
                    return Err(Refused::new(
                        k,
                        format!("`{k}` cannot be expressed for this model"),
                    ));
                }
            }
            other => {
                if !v.is_null() {
                    return Err(Refused::new(
                        other,
                        format!("`{other}` cannot be expressed for this model"),
                    ));
                }
            }
        }
    }
    if parallel_off && out.contains_key("tools") {
        out.insert("parallel_tool_calls".into(), json!(false));
    }
    let list = fields
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| Refused::new("messages", "`messages` must be an array"))?;
    for (i, m) in list.iter().enumerate() {
        convert_message(m, i, &mut messages)?;
    }
    out.insert("messages".into(), Value::Array(messages));
    Ok(Value::Object(out))
}

/// The text of `text` blocks, joined.
fn texts(blocks: &[Value], at: &str) -> Result<String, Refused> {
    let mut s = String::new();
    for (j, b) in blocks.iter().enumerate() {
        match (
            b.get("type").and_then(Value::as_str),
            b.get("text").and_then(Value::as_str),
        ) {
            (Some("text"), Some(t)) => {
                if !s.is_empty() && !t.is_empty() {
                    s.push('\n');
                }
                s.push_str(t);
            }
            _ => {
                return Err(Refused::new(
                    format!("{at}[{j}]"),
                    "only text blocks can be sent here",
                ));
            }
        }
    }
    Ok(s)
}

/// An Anthropic tool as an OpenAI function tool; server tools have no counterpart.
fn tool(t: &Value, i: usize) -> Result<Value, Refused> {
    let at = format!("tools[{i}]");
    if t.get("type")
        .and_then(Value::as_str)
        .is_some_and(|k| k != "custom")
    {
        return Err(Refused::new(
            at,
            "Anthropic server tools cannot be sent to this model",
        ));
    }
    let name = t
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| Refused::new(format!("{at}.name"), "a tool needs a name"))?;
    let mut f = Map::new();
    f.insert("name".into(), json!(name));
    if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
        f.insert("description".into(), d.clone());
    }
    f.insert(
        "parameters".into(),
        t.get("input_schema")
            .cloned()
            .unwrap_or(json!({"type": "object"})),
    );
    Ok(json!({"type": "function", "function": f}))
}

/// One Messages turn as chat messages: a user turn's tool results become `tool` messages (first,
/// as they answer the turn before), an assistant turn's `tool_use` blocks its `tool_calls`.
fn convert_message(m: &Value, i: usize, out: &mut Vec<Value>) -> Result<(), Refused> {
    let at = format!("messages[{i}]");
    let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
    if role != "user" && role != "assistant" {
        return Err(Refused::new(
            format!("{at}.role"),
            "`role` must be user or assistant",
        ));
    }
    let blocks = match &m["content"] {
        Value::String(s) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Value::Array(b) => b,
        other => {
            return Err(Refused::new(
                format!("{at}.content"),
                format!("`content` cannot be {}", kind_of(other)),
            ));
        }
    };
    let mut parts: Vec<Value> = Vec::new();
    let mut calls: Vec<Value> = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let here = format!("{at}.content[{j}]");
        match b.get("type").and_then(Value::as_str) {
            Some("text") => {
                let t = b.get("text").and_then(Value::as_str).unwrap_or_default();
                parts.push(json!({"type": "text", "text": t}));
            }
            Some("image") if role == "user" => {
                let src = &b["source"];
                let url = match src.get("type").and_then(Value::as_str) {
                    Some("base64") => format!(
                        "data:{};base64,{}",
                        src["media_type"].as_str().unwrap_or("image/png"),
                        src["data"].as_str().unwrap_or_default()
                    ),
                    Some("url") => src["url"].as_str().unwrap_or_default().to_owned(),
                    _ => {
                        return Err(Refused::new(
                            format!("{here}.source"),
                            "an image source must be base64 or url",
                        ));
                    }
                };
                parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            Some("tool_result") if role == "user" => {
                let id = b.get("tool_use_id").and_then(Value::as_str).unwrap_or_default();
                let content = match &b["content"] {
                    Value::Null => String::new(),
                    Value::String(s) => s.clone(),
                    Value::Array(inner) => texts(inner, &format!("{here}.content"))?,
                    other => {
                        return Err(Refused::new(
                            format!("{here}.content"),
                            format!("a tool result cannot be {}", kind_of(other)),
                        ));
                    }
                };
                if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                    out.push(
                        json!({"role": "tool", "tool_call_id": id, "content": format!("Error: {content}")}),
                    );
                } else {
                    out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
                }
            }
            Some("tool_use") if role == "assistant" => {
                let args = serde_json::to_string(&b["input"]).unwrap_or_else(|_| "{}".to_owned());
                calls.push(json!({"id": b["id"], "type": "function",
                    "function": {"name": b["name"], "arguments": args}}));
            }
            // A thinking block of an earlier turn is the model's own; no chat model reads it back.
            Some("thinking" | "redacted_thinking") if role == "assistant" => {}
            other => {
                return Err(Refused::new(
                    here,
                    format!(
                        "{} blocks cannot be sent to this model",
                        other.unwrap_or("untyped")
                    ),
                ));
            }
        }
    }
    if role == "assistant" {
        let text: String = parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("");
        let mut msg = json!({"role": "assistant", "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) }});
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        out.push(msg);
    } else if !parts.is_empty() {
        let only_text = parts.iter().all(|p| p["type"] == "text");
        let content = if only_text && parts.len() == 1 {
            parts[0]["text"].clone()
        } else {
            Value::Array(parts)
        };
        out.push(json!({"role": "user", "content": content}));
    }
    Ok(())
}

/// Anthropic's `stop_reason` for OpenAI's `finish_reason`.
pub fn stop_reason(finish_reason: &str) -> &'static str {
    match finish_reason {
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        "content_filter" => "refusal",
        // stop, and anything newer.
        _ => "end_turn",
    }
}

/// Anthropic's `stop_reason` and `stop_sequence` for a chat choice. OpenAI's `stop` says only
/// that the model stopped (naturally or at a stop sequence): it is `end_turn` unless the
/// provider names the sequence that matched — vLLM's `stop_reason` (a string), SGLang's
/// `matched_stop` — or says a sequence matched (OpenRouter's `native_finish_reason`).
pub fn stop_of(choice: &Value) -> (&'static str, Option<String>) {
    let finish = choice["finish_reason"].as_str().unwrap_or("stop");
    if finish != "stop" {
        return (stop_reason(finish), None);
    }
    let named = ["stop_reason", "matched_stop"]
        .iter()
        .find_map(|k| choice[*k].as_str().filter(|s| !s.is_empty()));
    match named {
        Some(seq) => ("stop_sequence", Some(seq.to_owned())),
        None if choice["native_finish_reason"] == "stop_sequence" => ("stop_sequence", None),
        None => ("end_turn", None),
    }
}

/// Anthropic's usage block for OpenAI's: the cached prompt tokens are cache reads, the rest input.
pub fn usage(u: &Value) -> Option<Value> {
    let prompt = u.get("prompt_tokens").and_then(Value::as_u64)?;
    let completion = u.get("completion_tokens").and_then(Value::as_u64)?;
    let cached = u
        .pointer("/prompt_tokens_details/cached_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .min(prompt);
    // Billed output the parts leave out (reasoning tokens some providers count in the total
    // only) is output.
    let output = u
        .get("total_tokens")
        .and_then(Value::as_u64)
        .filter(|t| prompt.checked_add(completion).is_some_and(|sum| *t >= sum))
        .map_or(completion, |t| t - prompt);
    Some(json!({
        "input_tokens": prompt - cached,
        "output_tokens": output,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }))
}

/// The Messages answer for a chat completion (its first choice).
pub fn answer(v: &Value) -> Result<Value, String> {
    let choice = v
        .pointer("/choices/0")
        .ok_or_else(|| "a chat completion without a choice".to_owned())?;
    let m = &choice["message"];
    let mut content = Vec::new();
    if let Some(t) = m["content"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": t}));
    }
    if let Some(r) = m["refusal"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": r}));
    }
    for c in m["tool_calls"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let args = c
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .unwrap_or("{}");
        let input: Value = serde_json::from_str(args).unwrap_or_else(|_| json!({"arguments": args}));
        content.push(
            json!({"type": "tool_use", "id": c["id"], "name": c.pointer("/function/name"), "input": input}),
        );
    }
    let (stop, stop_sequence) = stop_of(choice);
    let mut out = json!({
        "id": v["id"],
        "type": "message",
        "role": "assistant",
        "model": v["model"],
        "content": content,
        "stop_reason": stop,
        "stop_sequence": stop_sequence,
    });
    if let Some(u) = usage(&v["usage"]) {
        out["usage"] = u;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(body: Value) -> Result<Value, Refused> {
        request(
            body.as_object().unwrap(),
            "gpt-4o-2024-08-06",
            Provider::OpenAiCompatible,
        )
    }

    /// OpenAI's reasoning models refuse `max_tokens`: OpenAI itself, and a proxy of its
    /// reasoning models, get `max_completion_tokens`; OpenRouter and Gemini read `max_tokens`.
    #[test]
    fn the_output_bound_is_named_for_the_provider_and_model() {
        let rows = [
            (Provider::OpenAi, "gpt-4o", "max_completion_tokens"),
            (Provider::OpenAi, "o3-mini", "max_completion_tokens"),
            (Provider::OpenAi, "gpt-5", "max_completion_tokens"),
            (Provider::OpenAiCompatible, "o1", "max_completion_tokens"),
            (
                Provider::OpenAiCompatible,
                "o4-mini-2025-04-16",
                "max_completion_tokens",
            ),
            (
                Provider::OpenAiCompatible,
                "openai/gpt-5-mini",
                "max_completion_tokens",
            ),
            (Provider::OpenAiCompatible, "llama-3.1-70b", "max_tokens"),
            (Provider::OpenAiCompatible, "olmo-2", "max_tokens"),
            (Provider::OpenRouter, "openai/o3", "max_tokens"),
            (Provider::Gemini, "gemini-2.5-pro", "max_tokens"),
        ];
        for (provider, model, field) in rows {
            let body =
                json!({"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}]});
            let out = request(body.as_object().unwrap(), model, provider).unwrap();
            assert_eq!(out[field], 100, "{provider:?} {model}: {out}");
            let other = if field == "max_tokens" {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            assert!(out.get(other).is_none(), "{provider:?} {model}: {out}");
        }
    }

    #[test]
    fn requests_map_to_chat() {
        let rows: Vec<(&str, Value, Value)> = vec![
            (
                "plain, streamed: usage is asked for",
                json!({"model": "gpt", "max_tokens": 64, "stream": true, "system": "Be brief.",
                    "messages": [{"role": "user", "content": "Hello"}]}),
                json!({"model": "gpt-4o-2024-08-06", "max_tokens": 64, "stream": true,
                    "stream_options": {"include_usage": true},
                    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]}),
            ),
            (
                "images, tools, tool use and results",
                json!({"model": "gpt", "max_tokens": 64, "temperature": 0.5, "stop_sequences": ["X"],
                    "metadata": {"user_id": "u1"},
                    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
                    "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
                    "messages": [
                        {"role": "user", "content": [{"type": "text", "text": "Look"},
                            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAA"}}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "Calling"},
                            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"},
                            {"type": "text", "text": "Go on"}]}]}),
                json!({"model": "gpt-4o-2024-08-06", "max_tokens": 64, "temperature": 0.5, "stop": ["X"],
                    "user": "u1", "parallel_tool_calls": false, "tool_choice": "required",
                    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                        "parameters": {"type": "object"}}}],
                    "messages": [
                        {"role": "user", "content": [{"type": "text", "text": "Look"},
                            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAA"}}]},
                        {"role": "assistant", "content": "Calling", "tool_calls": [{"id": "toolu_1", "type": "function",
                            "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
                        {"role": "tool", "tool_call_id": "toolu_1", "content": "42"},
                        {"role": "user", "content": "Go on"}]}),
            ),
        ];
        for (name, messages, want) in rows {
            assert_eq!(req(messages).unwrap(), want, "{name}");
        }
    }

    #[test]
    fn inexpressible_fields_are_refused_by_name() {
        let rows: Vec<(Value, &str)> = vec![
            (json!({"top_k": 5}), "top_k"),
            (
                json!({"thinking": {"type": "enabled", "budget_tokens": 1024}}),
                "thinking",
            ),
            (
                json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools[0]",
            ),
            (json!({"metadata": {"user_id": "u", "other": 1}}), "metadata"),
            (
                json!({"stop_sequences": ["a", "b", "c", "d", "e"]}),
                "stop_sequences",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}),
                "messages[0].content[0]",
            ),
        ];
        for (extra, param) in rows {
            let mut body =
                json!({"model": "gpt", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            assert_eq!(req(body.clone()).expect_err(&body.to_string()).param, param);
        }
    }

    #[test]
    fn every_finish_reason_has_a_stop_reason() {
        for (finish, stop) in [
            ("stop", "end_turn"),
            ("length", "max_tokens"),
            ("tool_calls", "tool_use"),
            ("function_call", "tool_use"),
            ("content_filter", "refusal"),
            ("something_new", "end_turn"),
        ] {
            assert_eq!(stop_reason(finish), stop, "{finish}");
        }
    }

    /// A stop sequence ended the answer: named where the provider names it.
    #[test]
    fn a_stop_sequence_is_named_where_the_provider_names_it() {
        let rows = [
            (json!({"finish_reason": "stop"}), "end_turn", Value::Null),
            (
                json!({"finish_reason": "stop", "stop_reason": "END"}),
                "stop_sequence",
                json!("END"),
            ),
            // vLLM: a token id (EOS) is no stop sequence.
            (
                json!({"finish_reason": "stop", "stop_reason": 2}),
                "end_turn",
                Value::Null,
            ),
            (
                json!({"finish_reason": "stop", "matched_stop": "###"}),
                "stop_sequence",
                json!("###"),
            ),
            (
                json!({"finish_reason": "stop", "native_finish_reason": "stop_sequence"}),
                "stop_sequence",
                Value::Null,
            ),
            (
                json!({"finish_reason": "length", "stop_reason": "END"}),
                "max_tokens",
                Value::Null,
            ),
        ];
        for (choice, stop, sequence) in rows {
            let mut choice = choice;
            choice["message"] = json!({"role": "assistant", "content": "Hi"});
            let v = answer(&json!({"id": "c", "model": "m", "choices": [choice.clone()]})).unwrap();
            assert_eq!(
                (&v["stop_reason"], &v["stop_sequence"]),
                (&json!(stop), &sequence),
                "{choice}"
            );
        }
    }

    #[test]
    fn answers_map_to_messages() {
        let chat = json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
                "content": "Sure", "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "f", "arguments": "{\"a\":1}"}}]}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25,
                "prompt_tokens_details": {"cached_tokens": 8}}});
        assert_eq!(
            answer(&chat).unwrap(),
            json!({"id": "chatcmpl-1", "type": "message", "role": "assistant", "model": "gpt-4o",
                "content": [{"type": "text", "text": "Sure"},
                    {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}}],
                "stop_reason": "tool_use", "stop_sequence": null,
                "usage": {"input_tokens": 12, "output_tokens": 5, "cache_read_input_tokens": 8,
                    "cache_creation_input_tokens": 0}})
        );
        assert!(answer(&json!({"choices": []})).is_err());
        // An absurd usage is mapped without overflow (the gateway replaces it by its estimate).
        let absurd = json!({"prompt_tokens": u64::MAX, "completion_tokens": 5, "total_tokens": 4});
        assert_eq!(usage(&absurd).unwrap()["output_tokens"], 5);
    }
}
