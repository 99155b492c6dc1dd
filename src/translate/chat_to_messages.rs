//! `POST /v1/chat/completions` served by an Anthropic credential: the OpenAI chat request as an
//! Anthropic Messages request, and the Messages answer as a chat completion.

use serde_json::{Map, Value, json};

use super::{Refused, kind_of};

/// `max_tokens` sent when the chat request names none (Anthropic requires one), the model has
/// no `max_output_tokens` of its own and its upstream name is of no family in
/// [`FAMILY_OUTPUT_LIMITS`]: 4096, which every Claude model accepts as output.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// The output limit of each known Claude family, by a part of the upstream model's name (so that
/// dated ids, Bedrock's `anthropic.…-v1:0` and Vertex's `…@date` match too); the first entry
/// found wins, so a more specific name comes before its prefix. A family not listed gets
/// [`DEFAULT_MAX_TOKENS`]; `docs/translation.md` lists the same table (issue 45 item 9).
pub const FAMILY_OUTPUT_LIMITS: &[(&str, u64)] = &[
    ("claude-opus-4-5", 64_000),
    ("claude-opus-4", 32_000),
    ("claude-sonnet-4", 64_000),
    ("claude-haiku-4", 64_000),
    ("claude-3-7-sonnet", 64_000),
    ("claude-3-5-sonnet", 8_192),
    ("claude-3-5-haiku", 8_192),
];

/// The `max_tokens` sent for a chat request naming no output bound to `upstream_model` whose
/// model has no `max_output_tokens`: its family's own output limit, else [`DEFAULT_MAX_TOKENS`].
/// Never more than the family's limit, which Anthropic would refuse.
pub fn default_max_tokens(upstream_model: &str) -> u64 {
    FAMILY_OUTPUT_LIMITS
        .iter()
        .find(|(family, _)| upstream_model.contains(family))
        .map_or(DEFAULT_MAX_TOKENS, |(_, n)| *n)
}

/// The Messages request for a chat request's top-level `fields`, asking for `model`;
/// `default_max_tokens` is sent when the request names no output bound.
pub fn request(fields: &Map<String, Value>, model: &str, default_max_tokens: u64) -> Result<Value, Refused> {
    let mut out = Map::new();
    out.insert("model".into(), json!(model));
    let mut max_tokens: Option<u64> = None;
    let mut parallel: Option<bool> = None;
    let mut tool_choice: Option<Value> = None;
    for (key, v) in fields {
        let k = key.as_str();
        match k {
            "model" | "messages" | "stream_options" => {}
            "max_tokens" | "max_completion_tokens" => {
                if v.is_null() {
                    continue;
                }
                let n = v
                    .as_u64()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| Refused::new(k, format!("`{k}` must be a positive integer")))?;
                // Both given: the smaller bound holds.
                max_tokens = Some(max_tokens.map_or(n, |m| m.min(n)));
            }
            "temperature" => {
                if v.is_null() {
                    continue;
                }
                let t = v
                    .as_f64()
                    .ok_or_else(|| Refused::new(k, "`temperature` must be a number"))?;
                if !(0.0..=1.0).contains(&t) {
                    return Err(Refused::new(
                        k,
                        format!(
                            "`temperature` {t} cannot be sent to an Anthropic model, whose range is 0 to 1"
                        ),
                    ));
                }
                out.insert("temperature".into(), v.clone());
            }
            "top_p" => {
                if !v.is_null() {
                    out.insert("top_p".into(), v.clone());
                }
            }
            "stream" => {
                if !v.is_null() {
                    out.insert("stream".into(), v.clone());
                }
            }
            "stop" => match v {
                Value::Null => {}
                Value::String(s) => {
                    out.insert("stop_sequences".into(), json!([s]));
                }
                Value::Array(a) if a.iter().all(Value::is_string) => {
                    if !a.is_empty() {
                        out.insert("stop_sequences".into(), v.clone());
                    }
                }
                _ => return Err(Refused::new(k, "`stop` must be a string or an array of strings")),
            },
            "tools" => {
                if let Some(tools) = tools(v)? {
                    out.insert("tools".into(), tools);
                }
            }
            "tool_choice" => tool_choice = convert_tool_choice(v)?,
            "parallel_tool_calls" => parallel = v.as_bool(),
            "user" => {
                if let Some(u) = v.as_str() {
                    out.insert("metadata".into(), json!({"user_id": u}));
                } else if !v.is_null() {
                    return Err(Refused::new(k, "`user` must be a string"));
                }
            }
            "response_format" => match v.get("type").and_then(Value::as_str) {
                None if v.is_null() => {}
                Some("text") => {}
                _ => {
                    return Err(Refused::new(
                        k,
                        "`response_format` other than `text` cannot be expressed for an Anthropic model",
                    ));
                }
            },
            "n" => {
                if !(v.is_null() || v.as_u64() == Some(1)) {
                    return Err(Refused::new(
                        k,
                        "an Anthropic model gives one choice: `n` must be 1",
                    ));
                }
            }
            "logprobs" => {
                if !(v.is_null() || v == &Value::Bool(false)) {
                    return Err(Refused::new(k, "an Anthropic model reports no log probabilities"));
                }
            }
            "presence_penalty" | "frequency_penalty" => {
                if !(v.is_null() || v.as_f64() == Some(0.0)) {
                    return Err(Refused::new(k, format!("an Anthropic model has no `{k}`")));
                }
            }
            "store" => {
                if !(v.is_null() || v == &Value::Bool(false)) {
                    return Err(Refused::new(k, "an Anthropic model does not store completions"));
                }
            }
            other => {
                if !v.is_null() {
                    return Err(Refused::new(
                        other,
                        format!("`{other}` cannot be expressed for an Anthropic model"),
                    ));
                }
            }
        }
    }
    let (system, messages) = messages(fields.get("messages").unwrap_or(&Value::Null))?;
    if let Some(system) = system {
        out.insert("system".into(), system);
    }
    out.insert("messages".into(), Value::Array(messages));
    out.insert(
        "max_tokens".into(),
        json!(max_tokens.unwrap_or(default_max_tokens)),
    );
    // OpenAI's `parallel_tool_calls: false` is Anthropic's `disable_parallel_tool_use`, which
    // lives in `tool_choice`.
    if parallel == Some(false) && out.contains_key("tools") {
        let mut choice = tool_choice.unwrap_or_else(|| json!({"type": "auto"}));
        if choice["type"] != "none" {
            choice["disable_parallel_tool_use"] = Value::Bool(true);
        }
        tool_choice = Some(choice);
    }
    if let Some(choice) = tool_choice {
        out.insert("tool_choice".into(), choice);
    }
    Ok(Value::Object(out))
}

/// `tools`: each `{"type":"function","function":{name, description, parameters}}` as Anthropic's
/// `{name, description, input_schema}`.
fn tools(v: &Value) -> Result<Option<Value>, Refused> {
    let Some(list) = v.as_array() else {
        return if v.is_null() {
            Ok(None)
        } else {
            Err(Refused::new("tools", "`tools` must be an array"))
        };
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(Refused::new(
                at,
                "only `function` tools can be sent to an Anthropic model",
            ));
        }
        let f = &t["function"];
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| Refused::new(format!("{at}.function.name"), "a tool needs a name"))?;
        if f.get("strict").and_then(Value::as_bool) == Some(true) {
            return Err(Refused::new(
                format!("{at}.function.strict"),
                "strict tool schemas cannot be expressed for an Anthropic model",
            ));
        }
        let mut tool = Map::new();
        tool.insert("name".into(), json!(name));
        if let Some(d) = f.get("description").filter(|d| !d.is_null()) {
            tool.insert("description".into(), d.clone());
        }
        let schema = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p) => p.clone(),
        };
        tool.insert("input_schema".into(), schema);
        out.push(Value::Object(tool));
    }
    Ok((!out.is_empty()).then_some(Value::Array(out)))
}

/// `tool_choice`: `none`, `auto`, `required` (Anthropic's `any`) or one named function.
fn convert_tool_choice(v: &Value) -> Result<Option<Value>, Refused> {
    Ok(match v {
        Value::Null => None,
        Value::String(s) => match s.as_str() {
            "none" => Some(json!({"type": "none"})),
            "auto" => Some(json!({"type": "auto"})),
            "required" => Some(json!({"type": "any"})),
            other => {
                return Err(Refused::new(
                    "tool_choice",
                    format!("unknown `tool_choice` {other:?}"),
                ));
            }
        },
        Value::Object(_) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(name) if v.get("type").and_then(Value::as_str) == Some("function") => {
                Some(json!({"type": "tool", "name": name}))
            }
            _ => {
                return Err(Refused::new(
                    "tool_choice",
                    "`tool_choice` must name a function: {\"type\":\"function\",\"function\":{\"name\":…}}",
                ));
            }
        },
        other => {
            return Err(Refused::new(
                "tool_choice",
                format!("`tool_choice` cannot be {}", kind_of(other)),
            ));
        }
    })
}

/// The chat messages as Anthropic's `system` and alternating `messages`: system and developer
/// messages join the top-level system prompt, tool results become `tool_result` blocks of a
/// user turn, consecutive turns of one role are merged into one.
fn messages(v: &Value) -> Result<(Option<Value>, Vec<Value>), Refused> {
    let list = v
        .as_array()
        .ok_or_else(|| Refused::new("messages", "`messages` must be an array"))?;
    let mut system: Vec<Value> = Vec::new();
    let mut out: Vec<(String, Vec<Value>)> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| Refused::new(format!("{at}.role"), "each message needs a `role`"))?;
        let (role, blocks) = match role {
            "system" | "developer" => {
                system.extend(text_blocks(&m["content"], &at)?);
                continue;
            }
            "user" => ("user", user_blocks(&m["content"], &at)?),
            "assistant" => ("assistant", assistant_blocks(m, &at)?),
            "tool" => {
                let id = m.get("tool_call_id").and_then(Value::as_str).ok_or_else(|| {
                    Refused::new(
                        format!("{at}.tool_call_id"),
                        "a tool message needs `tool_call_id`",
                    )
                })?;
                let content = match &m["content"] {
                    Value::String(s) => json!(s),
                    c => Value::Array(text_blocks(c, &at)?),
                };
                (
                    "user",
                    vec![json!({"type": "tool_result", "tool_use_id": id, "content": content})],
                )
            }
            other => {
                return Err(Refused::new(
                    format!("{at}.role"),
                    format!("the role {other:?} cannot be expressed for an Anthropic model"),
                ));
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some((last, b)) if last == role => {
                // Anthropic wants tool results first in a user turn.
                if role == "user" && blocks.iter().any(|b| b["type"] == "tool_result") {
                    let at = b
                        .iter()
                        .position(|x| x["type"] != "tool_result")
                        .unwrap_or(b.len());
                    b.splice(at..at, blocks);
                } else {
                    b.extend(blocks);
                }
            }
            _ => out.push((role.to_owned(), blocks)),
        }
    }
    let system = match system.as_slice() {
        [] => None,
        [one] if one.as_object().is_some_and(|o| o.len() == 2) => Some(one["text"].clone()),
        _ => Some(Value::Array(system)),
    };
    let messages = out
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    Ok((system, messages))
}

/// Text-only content (system, developer, tool): a string, or `text` parts.
fn text_blocks(content: &Value, at: &str) -> Result<Vec<Value>, Refused> {
    match content {
        Value::Null => Ok(Vec::new()),
        Value::String(s) if s.is_empty() => Ok(Vec::new()),
        Value::String(s) => Ok(vec![json!({"type": "text", "text": s})]),
        Value::Array(parts) => parts
            .iter()
            .enumerate()
            .filter(|(_, p)| p.get("text").and_then(Value::as_str) != Some(""))
            .map(
                |(j, p)| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => Ok(json!({"type": "text", "text": t})),
                    _ => Err(Refused::new(
                        format!("{at}.content[{j}]"),
                        "only text parts can be sent here to an Anthropic model",
                    )),
                },
            )
            .collect(),
        other => Err(Refused::new(
            format!("{at}.content"),
            format!("`content` cannot be {}", kind_of(other)),
        )),
    }
}

/// A user message's content: text and image parts.
fn user_blocks(content: &Value, at: &str) -> Result<Vec<Value>, Refused> {
    let Value::Array(parts) = content else {
        return text_blocks(content, at);
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        let here = format!("{at}.content[{j}]");
        match p.get("type").and_then(Value::as_str) {
            Some("text") => match p.get("text") {
                Some(Value::String(t)) if t.is_empty() => {}
                Some(Value::String(t)) => out.push(json!({"type": "text", "text": t})),
                _ => return Err(Refused::new(here, "a text part needs `text`")),
            },
            Some("image_url") => {
                let url = p
                    .pointer("/image_url/url")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        Refused::new(format!("{here}.image_url.url"), "an image part needs a URL")
                    })?;
                out.push(image(url, &here)?);
            }
            other => {
                return Err(Refused::new(
                    here,
                    format!(
                        "{} parts cannot be sent to an Anthropic model (text and image_url can)",
                        other.unwrap_or("untyped")
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// An image URL as an Anthropic image block: a `data:` URL as base64 source, else a URL source.
fn image(url: &str, at: &str) -> Result<Value, Refused> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (media_type, data) = rest
            .split_once(";base64,")
            .ok_or_else(|| Refused::new(format!("{at}.image_url.url"), "a data URL must be base64"))?;
        return Ok(
            json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}),
        );
    }
    if url.starts_with("https://") || url.starts_with("http://") {
        return Ok(json!({"type": "image", "source": {"type": "url", "url": url}}));
    }
    Err(Refused::new(
        format!("{at}.image_url.url"),
        "an image URL must be http(s) or a base64 data URL",
    ))
}

/// An assistant message: its text, then its tool calls as `tool_use` blocks.
fn assistant_blocks(m: &Value, at: &str) -> Result<Vec<Value>, Refused> {
    let mut out = match &m["content"] {
        Value::Array(parts) => {
            // `refusal` parts are text the assistant said.
            let mut blocks = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                let text = match p.get("type").and_then(Value::as_str) {
                    Some("text") => p.get("text"),
                    Some("refusal") => p.get("refusal"),
                    _ => None,
                };
                match text.and_then(Value::as_str) {
                    Some("") => {}
                    Some(t) => blocks.push(json!({"type": "text", "text": t})),
                    None => {
                        return Err(Refused::new(
                            format!("{at}.content[{j}]"),
                            "only text and refusal parts can be sent for an assistant turn",
                        ));
                    }
                }
            }
            blocks
        }
        other => text_blocks(other, at)?,
    };
    if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
        for (j, c) in calls.iter().enumerate() {
            let here = format!("{at}.tool_calls[{j}]");
            let id = c.get("id").and_then(Value::as_str);
            let name = c.pointer("/function/name").and_then(Value::as_str);
            let (Some(id), Some(name)) = (id, name) else {
                return Err(Refused::new(here, "a tool call needs `id` and `function.name`"));
            };
            let args = c
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or("{}");
            let input: Value = if args.trim().is_empty() {
                json!({})
            } else {
                serde_json::from_str(args).map_err(|_| {
                    Refused::new(
                        format!("{here}.function.arguments"),
                        "tool call arguments must be a JSON object to be sent to an Anthropic model",
                    )
                })?
            };
            out.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
        }
    }
    if m.get("function_call").is_some_and(|f| !f.is_null()) {
        return Err(Refused::new(
            format!("{at}.function_call"),
            "the legacy `function_call` cannot be expressed; use `tool_calls`",
        ));
    }
    Ok(out)
}

/// OpenAI's `finish_reason` for Anthropic's `stop_reason`.
pub fn finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("max_tokens" | "model_context_window_exceeded") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        // end_turn, stop_sequence, pause_turn, and anything newer.
        _ => "stop",
    }
}

/// OpenAI's usage block for Anthropic's: cache writes and reads are prompt tokens, and the reads
/// are what OpenAI calls cached.
pub fn usage(u: &Value) -> Option<Value> {
    let n = |k: &str| u.get(k).and_then(Value::as_u64);
    let input = n("input_tokens")?;
    let output = n("output_tokens")?;
    let written = n("cache_creation_input_tokens").unwrap_or(0);
    let read = n("cache_read_input_tokens").unwrap_or(0);
    let prompt = input.saturating_add(written).saturating_add(read);
    Some(json!({
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt.saturating_add(output),
        "prompt_tokens_details": {"cached_tokens": read, "cache_creation_tokens": written},
    }))
}

/// The chat completion for an Anthropic message; `created` is now, in Unix seconds.
pub fn answer(v: &Value, created: i64) -> Result<Value, String> {
    let content = v["content"].as_array().map(Vec::as_slice).unwrap_or_default();
    let mut text = String::new();
    let mut thinking = String::new();
    let mut calls = Vec::new();
    for block in content {
        match block["type"].as_str() {
            Some("text") => text.push_str(block["text"].as_str().unwrap_or_default()),
            Some("thinking") => thinking.push_str(block["thinking"].as_str().unwrap_or_default()),
            Some("tool_use") => {
                let args = serde_json::to_string(&block["input"]).map_err(|e| e.to_string())?;
                calls.push(json!({
                    "id": block["id"], "type": "function",
                    "function": {"name": block["name"], "arguments": args},
                }));
            }
            _ => {}
        }
    }
    let mut message = json!({"role": "assistant", "content": null, "refusal": null});
    if !text.is_empty() || calls.is_empty() {
        message["content"] = json!(text);
    }
    if !thinking.is_empty() {
        message["reasoning_content"] = json!(thinking);
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    let mut out = json!({
        "id": v["id"],
        "object": "chat.completion",
        "created": created,
        "model": v["model"],
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish_reason(v["stop_reason"].as_str()),
        }],
    });
    // An invalid or missing usage block stays missing: the gateway then counts its estimate.
    if let Some(u) = usage(&v["usage"]) {
        out["usage"] = u;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each family's own output limit, whatever the name's date, prefix or suffix; unknown
    /// families and the Claude 3 models get 4096.
    #[test]
    fn a_model_without_a_limit_gets_its_familys() {
        for (model, limit) in [
            ("claude-opus-4-5-20251101", 64_000),
            ("claude-opus-4-1-20250805", 32_000),
            ("claude-opus-4-20250514", 32_000),
            ("claude-sonnet-4-5", 64_000),
            ("claude-sonnet-4-20250514", 64_000),
            ("us.anthropic.claude-sonnet-4-20250514-v1:0", 64_000),
            ("claude-haiku-4-5", 64_000),
            ("claude-3-7-sonnet-latest", 64_000),
            ("anthropic.claude-3-5-sonnet-20240620-v1:0", 8_192),
            ("claude-3-5-sonnet-v2@20241022", 8_192),
            ("claude-3-5-haiku-20241022", 8_192),
            ("claude-3-opus-20240229", 4_096),
            ("claude-3-haiku-20240307", 4_096),
            ("my-finetune", 4_096),
        ] {
            assert_eq!(default_max_tokens(model), limit, "{model}");
        }
    }

    fn req(body: Value) -> Result<Value, Refused> {
        request(
            body.as_object().unwrap(),
            "claude-3-5-sonnet-20241022",
            DEFAULT_MAX_TOKENS,
        )
    }

    /// Requests from OpenAI's documented shapes, and the Messages request each becomes.
    #[test]
    fn requests_map_to_messages() {
        let rows: Vec<(&str, Value, Value)> = vec![
            (
                "plain user turn, the default max_tokens",
                json!({"model": "claude", "messages": [{"role": "user", "content": "Hello"}]}),
                json!({"model": "claude-3-5-sonnet-20241022", "max_tokens": 4096,
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]}),
            ),
            (
                "system and developer join the system prompt; sampling; stop as a list",
                json!({"model": "claude", "max_completion_tokens": 300, "temperature": 0.2, "top_p": 0.9,
                    "stop": "END", "stream": true, "stream_options": {"include_usage": true}, "user": "u-7",
                    "messages": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "developer", "content": [{"type": "text", "text": "No emoji."}]},
                        {"role": "user", "content": "Hi"}]}),
                json!({"model": "claude-3-5-sonnet-20241022", "max_tokens": 300, "temperature": 0.2,
                    "top_p": 0.9, "stop_sequences": ["END"], "stream": true, "metadata": {"user_id": "u-7"},
                    "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "No emoji."}],
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}),
            ),
            (
                "one system message is a plain string",
                json!({"model": "claude", "max_tokens": 10, "messages": [
                    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}),
                json!({"model": "claude-3-5-sonnet-20241022", "max_tokens": 10, "system": "Be brief.",
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}),
            ),
            (
                "images: a data URL and an https URL",
                json!({"model": "claude", "max_tokens": 10, "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg", "detail": "high"}}]}]}),
                json!({"model": "claude-3-5-sonnet-20241022", "max_tokens": 10, "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}}]}]}),
            ),
            (
                "tools, tool_choice required, a tool call and its results",
                json!({"model": "claude", "max_tokens": 50, "tool_choice": "required", "parallel_tool_calls": false,
                    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
                    "messages": [
                        {"role": "user", "content": "Weather in Paris and Rome?"},
                        {"role": "assistant", "content": null, "tool_calls": [
                            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]},
                        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
                        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "21C"}]},
                        {"role": "user", "content": "Thanks"}]}),
                json!({"model": "claude-3-5-sonnet-20241022", "max_tokens": 50,
                    "tools": [{"name": "get_weather", "description": "Weather",
                        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
                    "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
                    "messages": [
                        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
                        {"role": "assistant", "content": [
                            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
                            {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {"city": "Rome"}}]},
                        {"role": "user", "content": [
                            {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
                            {"type": "tool_result", "tool_use_id": "call_2", "content": [{"type": "text", "text": "21C"}]},
                            {"type": "text", "text": "Thanks"}]}]}),
            ),
            (
                "tool_choice naming a function; neutral defaults accepted",
                json!({"model": "claude", "max_tokens": 5, "n": 1, "logprobs": false, "presence_penalty": 0,
                    "response_format": {"type": "text"},
                    "tools": [{"type": "function", "function": {"name": "f"}}],
                    "tool_choice": {"type": "function", "function": {"name": "f"}},
                    "messages": [{"role": "user", "content": "x"}]}),
                json!({"model": "claude-3-5-sonnet-20241022", "max_tokens": 5,
                    "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {}}}],
                    "tool_choice": {"type": "tool", "name": "f"},
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}),
            ),
        ];
        for (name, chat, want) in rows {
            assert_eq!(req(chat).unwrap(), want, "{name}");
        }
    }

    /// What an Anthropic model cannot be asked is refused, naming the field.
    #[test]
    fn inexpressible_fields_are_refused_by_name() {
        let user = json!([{"role": "user", "content": "x"}]);
        let rows: Vec<(Value, &str)> = vec![
            (json!({"n": 2}), "n"),
            (json!({"logprobs": true}), "logprobs"),
            (
                json!({"response_format": {"type": "json_object"}}),
                "response_format",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
                "response_format",
            ),
            (json!({"temperature": 1.5}), "temperature"),
            (json!({"frequency_penalty": 0.5}), "frequency_penalty"),
            (json!({"seed": 7}), "seed"),
            (json!({"logit_bias": {"50256": -100}}), "logit_bias"),
            (json!({"audio": {"voice": "alloy"}}), "audio"),
            (json!({"functions": [{"name": "f"}]}), "functions"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "strict": true}}]}),
                "tools[0].function.strict",
            ),
            (
                json!({"tools": [{"type": "custom", "custom": {"name": "f"}}]}),
                "tools[0]",
            ),
            (json!({"tool_choice": "sometimes"}), "tool_choice"),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]}]}),
                "messages[0].content[0].image_url.url",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"},
                    {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}),
                "messages[1].tool_calls[0].function.arguments",
            ),
            (
                json!({"messages": [{"role": "function", "name": "f", "content": "x"}]}),
                "messages[0].role",
            ),
        ];
        for (extra, param) in rows {
            let mut body = json!({"model": "claude", "messages": user});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            let err = req(body.clone()).expect_err(&body.to_string());
            assert_eq!(err.param, param, "{body}: {}", err.message);
        }
    }

    /// Every documented `stop_reason`, and one the gateway does not know yet.
    #[test]
    fn every_stop_reason_has_a_finish_reason() {
        let rows = [
            (Some("end_turn"), "stop"),
            (Some("stop_sequence"), "stop"),
            (Some("max_tokens"), "length"),
            (Some("tool_use"), "tool_calls"),
            (Some("pause_turn"), "stop"),
            (Some("refusal"), "content_filter"),
            (Some("model_context_window_exceeded"), "length"),
            (Some("something_new"), "stop"),
            (None, "stop"),
        ];
        for (stop, finish) in rows {
            assert_eq!(finish_reason(stop), finish, "{stop:?}");
        }
    }

    #[test]
    fn answers_map_to_chat_completions() {
        let rows: Vec<(&str, Value, Value)> = vec![
            (
                "text, with cache reads and writes",
                json!({"id": "msg_01", "type": "message", "role": "assistant", "model": "claude-3-5-sonnet-20241022",
                    "content": [{"type": "text", "text": "Hi there"}], "stop_reason": "end_turn", "stop_sequence": null,
                    "usage": {"input_tokens": 10, "output_tokens": 3, "cache_creation_input_tokens": 100,
                        "cache_read_input_tokens": 50}}),
                json!({"id": "msg_01", "object": "chat.completion", "created": 1700000000,
                    "model": "claude-3-5-sonnet-20241022",
                    "choices": [{"index": 0, "logprobs": null, "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "Hi there", "refusal": null}}],
                    "usage": {"prompt_tokens": 160, "completion_tokens": 3, "total_tokens": 163,
                        "prompt_tokens_details": {"cached_tokens": 50, "cache_creation_tokens": 100}}}),
            ),
            (
                "tool use",
                json!({"id": "msg_02", "type": "message", "role": "assistant", "model": "claude",
                    "content": [{"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
                    "stop_reason": "tool_use", "usage": {"input_tokens": 5, "output_tokens": 7}}),
                json!({"id": "msg_02", "object": "chat.completion", "created": 1700000000, "model": "claude",
                    "choices": [{"index": 0, "logprobs": null, "finish_reason": "tool_calls",
                        "message": {"role": "assistant", "content": "Checking.", "refusal": null, "tool_calls": [
                            {"id": "toolu_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
                        "prompt_tokens_details": {"cached_tokens": 0, "cache_creation_tokens": 0}}}),
            ),
            (
                "only a tool call: content null; no usage stays none",
                json!({"id": "msg_03", "type": "message", "model": "claude",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}], "stop_reason": "tool_use"}),
                json!({"id": "msg_03", "object": "chat.completion", "created": 1700000000, "model": "claude",
                    "choices": [{"index": 0, "logprobs": null, "finish_reason": "tool_calls",
                        "message": {"role": "assistant", "content": null, "refusal": null, "tool_calls": [
                            {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}]}),
            ),
        ];
        for (name, message, want) in rows {
            assert_eq!(answer(&message, 1_700_000_000).unwrap(), want, "{name}");
        }
    }
}
