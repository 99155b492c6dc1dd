//! An OpenAI chat request as a Bedrock Converse request (pure; no I/O).
//!
//! - `messages`: `system` and `developer` → `system` text blocks; `user` → text and image
//!   blocks (a `data:` URL's bytes; Bedrock fetches no URL); `assistant` → text and `toolUse`
//!   blocks (`tool_calls`, their arguments parsed); `tool` → a `user` turn of `toolResult` blocks.
//!   Consecutive turns of one role are joined into one, as Converse wants them alternating.
//! - `tools` → `toolConfig.tools[].toolSpec`, `tool_choice` → `toolConfig.toolChoice`
//!   (`auto`, `required` → `any`, a named function → `tool`).
//! - `max_tokens` / `max_completion_tokens` (the smaller) → `inferenceConfig.maxTokens`,
//!   `temperature`, `top_p` → `topP`, `stop` → `stopSequences`.
//! - `model`, `stream`, `stream_options` and `user` say nothing Converse carries (the model and
//!   the stream are the URL's).
//!
//! A field Converse cannot express is refused by name ([`Refusal`]), never dropped — the same
//! rule as `translate`'s (`docs/translation.md`).

use serde_json::{Map, Value, json};

/// A request field Converse cannot express: the client's 400, naming it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The field, as a path in the client's chat request (`messages[1].content[0]`).
    pub param: String,
    /// Why it cannot be sent.
    pub message: String,
}

fn refuse(param: impl Into<String>, why: impl Into<String>) -> Refusal {
    Refusal {
        param: param.into(),
        message: why.into(),
    }
}

/// The Converse request for a chat request's top-level fields.
pub fn converse(chat: &Map<String, Value>) -> Result<Value, Refusal> {
    let mut inference = Map::new();
    let mut max_tokens: Option<u64> = None;
    let mut tool_choice: Option<Value> = None;
    let mut tool_specs: Option<Vec<Value>> = None;
    for (key, v) in chat {
        let k = key.as_str();
        if v.is_null() {
            continue;
        }
        match k {
            "model" | "messages" | "stream" | "stream_options" | "user" => {}
            "max_tokens" | "max_completion_tokens" => {
                let n = v
                    .as_u64()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| refuse(k, format!("`{k}` must be a positive integer")))?;
                max_tokens = Some(max_tokens.map_or(n, |m| m.min(n)));
            }
            "temperature" | "top_p" => {
                if !v.is_number() {
                    return Err(refuse(k, format!("`{k}` must be a number")));
                }
                let name = if k == "top_p" { "topP" } else { "temperature" };
                inference.insert(name.into(), v.clone());
            }
            "stop" => {
                let list = match v {
                    Value::String(s) => vec![json!(s)],
                    Value::Array(a) if a.iter().all(Value::is_string) => a.clone(),
                    _ => return Err(refuse(k, "`stop` must be a string or an array of strings")),
                };
                if !list.is_empty() {
                    inference.insert("stopSequences".into(), Value::Array(list));
                }
            }
            "tools" => tool_specs = tools(v)?,
            "tool_choice" => tool_choice = choice(v)?,
            "parallel_tool_calls" => {
                if v.as_bool() == Some(false) {
                    return Err(refuse(
                        k,
                        "Bedrock's Converse API cannot turn parallel tool calls off",
                    ));
                }
            }
            "n" => {
                if v.as_u64() != Some(1) {
                    return Err(refuse(k, "a Bedrock model gives one choice: `n` must be 1"));
                }
            }
            "logprobs" | "store" => {
                if v != &Value::Bool(false) {
                    return Err(refuse(
                        k,
                        format!("`{k}` cannot be expressed for a Bedrock model"),
                    ));
                }
            }
            "presence_penalty" | "frequency_penalty" => {
                if v.as_f64() != Some(0.0) {
                    return Err(refuse(k, format!("a Bedrock model has no `{k}`")));
                }
            }
            "response_format" => {
                if v.get("type").and_then(Value::as_str) != Some("text") {
                    return Err(refuse(
                        k,
                        "`response_format` other than `text` cannot be expressed for a Bedrock model",
                    ));
                }
            }
            other => {
                return Err(refuse(
                    other,
                    format!("`{other}` cannot be expressed for a Bedrock model"),
                ));
            }
        }
    }
    if let Some(n) = max_tokens {
        inference.insert("maxTokens".into(), json!(n));
    }
    let (system, messages) = messages(chat.get("messages").unwrap_or(&Value::Null))?;
    let mut out = Map::new();
    out.insert("messages".into(), Value::Array(messages));
    if !system.is_empty() {
        out.insert("system".into(), Value::Array(system));
    }
    if !inference.is_empty() {
        out.insert("inferenceConfig".into(), Value::Object(inference));
    }
    match (tool_specs, tool_choice) {
        (Some(specs), choice) => {
            let mut config = json!({ "tools": specs });
            if let Some(c) = choice {
                config["toolChoice"] = c;
            }
            out.insert("toolConfig".into(), config);
        }
        (None, Some(_)) => return Err(refuse("tool_choice", "`tool_choice` needs `tools`")),
        (None, None) => {}
    }
    Ok(Value::Object(out))
}

/// `tools`: each function as a `toolSpec` with its parameters as the JSON input schema.
fn tools(v: &Value) -> Result<Option<Vec<Value>>, Refusal> {
    let list = v
        .as_array()
        .ok_or_else(|| refuse("tools", "`tools` must be an array"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(refuse(at, "only `function` tools can be sent to a Bedrock model"));
        }
        let f = &t["function"];
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| refuse(format!("{at}.function.name"), "a tool needs a name"))?;
        let schema = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p) => p.clone(),
        };
        let mut spec = json!({"name": name, "inputSchema": {"json": schema}});
        if let Some(d) = f.get("description").and_then(Value::as_str) {
            spec["description"] = json!(d);
        }
        out.push(json!({ "toolSpec": spec }));
    }
    Ok((!out.is_empty()).then_some(out))
}

/// `tool_choice`: `auto`, `required` (Converse's `any`) or one named function; `none` has no
/// Converse form (leave the tools out instead).
fn choice(v: &Value) -> Result<Option<Value>, Refusal> {
    match v {
        Value::String(s) => match s.as_str() {
            "auto" => Ok(Some(json!({"auto": {}}))),
            "required" => Ok(Some(json!({"any": {}}))),
            _ => Err(refuse(
                "tool_choice",
                format!(
                    "`tool_choice` {s:?} cannot be expressed for a Bedrock model (send no tools instead of \"none\")"
                ),
            )),
        },
        _ => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(name) => Ok(Some(json!({"tool": {"name": name}}))),
            None => Err(refuse("tool_choice", "`tool_choice` names no function")),
        },
    }
}

/// The system blocks and the Converse messages of a chat request's `messages`.
fn messages(v: &Value) -> Result<(Vec<Value>, Vec<Value>), Refusal> {
    let list = v
        .as_array()
        .ok_or_else(|| refuse("messages", "`messages` must be an array"))?;
    let mut system = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        let (role, blocks) = match role {
            "system" | "developer" => {
                system.extend(text_blocks(&m["content"], &at)?);
                continue;
            }
            "user" => ("user", user_blocks(&m["content"], &at)?),
            "assistant" => ("assistant", assistant_blocks(m, &at)?),
            "tool" => {
                let id = m.get("tool_call_id").and_then(Value::as_str).ok_or_else(|| {
                    refuse(
                        format!("{at}.tool_call_id"),
                        "a tool message needs `tool_call_id`",
                    )
                })?;
                let content = text_blocks(&m["content"], &at)?;
                let content = if content.is_empty() {
                    vec![json!({"text": ""})]
                } else {
                    content
                };
                (
                    "user",
                    vec![json!({"toolResult": {"toolUseId": id, "content": content}})],
                )
            }
            other => {
                return Err(refuse(
                    format!("{at}.role"),
                    format!("role {other:?} cannot be sent to a Bedrock model"),
                ));
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last, content)) if *last == role => content.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let messages = turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    Ok((system, messages))
}

/// Text content (a string or text parts) as `{text}` blocks; blank text is left out (Converse
/// refuses a blank text block).
fn text_blocks(content: &Value, at: &str) -> Result<Vec<Value>, Refusal> {
    match content {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => Ok(if s.trim().is_empty() {
            Vec::new()
        } else {
            vec![json!({"text": s})]
        }),
        Value::Array(parts) => {
            let mut out = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                out.extend(text_part(p, &format!("{at}.content[{j}]"))?);
            }
            Ok(out)
        }
        _ => Err(refuse(
            format!("{at}.content"),
            "`content` must be a string or an array",
        )),
    }
}

/// One text part as a `{text}` block (none when blank); any other part is refused at `at`.
fn text_part(p: &Value, at: &str) -> Result<Option<Value>, Refusal> {
    if p.get("type").and_then(Value::as_str) != Some("text") {
        return Err(refuse(at, "only text parts can be sent here to a Bedrock model"));
    }
    let t = p.get("text").and_then(Value::as_str).unwrap_or_default();
    Ok((!t.trim().is_empty()).then(|| json!({"text": t})))
}

/// A user turn's content: text and images.
fn user_blocks(content: &Value, at: &str) -> Result<Vec<Value>, Refusal> {
    let Value::Array(parts) = content else {
        return text_blocks(content, at);
    };
    let mut out = Vec::new();
    for (j, p) in parts.iter().enumerate() {
        let here = format!("{at}.content[{j}]");
        match p.get("type").and_then(Value::as_str) {
            Some("image_url") => {
                let url = p
                    .pointer("/image_url/url")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                out.push(image(url, &here)?);
            }
            _ => out.extend(text_part(p, &here)?),
        }
    }
    Ok(out)
}

/// A `data:image/…;base64,…` URL as a Converse image block (its bytes stay base64, the JSON
/// form of a blob).
fn image(url: &str, at: &str) -> Result<Value, Refusal> {
    let refused = || {
        refuse(
            at,
            "Bedrock takes images as bytes: send a data:image/png, jpeg, gif or webp URL in base64",
        )
    };
    let rest = url.strip_prefix("data:").ok_or_else(refused)?;
    let (meta, data) = rest.split_once(',').ok_or_else(refused)?;
    let mime = meta.strip_suffix(";base64").ok_or_else(refused)?;
    let format = match mime.to_ascii_lowercase().as_str() {
        "image/png" => "png",
        "image/jpeg" | "image/jpg" => "jpeg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        _ => return Err(refused()),
    };
    if data.is_empty() {
        return Err(refused());
    }
    Ok(json!({"image": {"format": format, "source": {"bytes": data}}}))
}

/// An assistant turn: its text, then its tool calls as `toolUse` blocks.
fn assistant_blocks(m: &Value, at: &str) -> Result<Vec<Value>, Refusal> {
    let mut out = text_blocks(&m["content"], at)?;
    if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
        for (j, c) in calls.iter().enumerate() {
            let here = format!("{at}.tool_calls[{j}]");
            let id = c.get("id").and_then(Value::as_str).unwrap_or_default();
            let name = c
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| refuse(format!("{here}.function.name"), "a tool call needs a name"))?;
            let args = c
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or("{}");
            let input: Value = if args.trim().is_empty() {
                json!({})
            } else {
                serde_json::from_str(args).map_err(|_| {
                    refuse(
                        format!("{here}.function.arguments"),
                        "tool call arguments must be JSON",
                    )
                })?
            };
            out.push(json!({"toolUse": {"toolUseId": id, "name": name, "input": input}}));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn convert(v: Value) -> Result<Value, Refusal> {
        converse(v.as_object().unwrap())
    }

    #[test]
    fn a_chat_request_becomes_a_converse_request() {
        let chat = json!({
            "model": "claude", "stream": true, "stream_options": {"include_usage": true},
            "max_tokens": 300, "max_completion_tokens": 200, "temperature": 0.3, "top_p": 0.9,
            "stop": ["END"], "user": "u-1",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
                {"role": "user", "content": [
                    {"type": "text", "text": "What is in this picture, and the weather?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                {"role": "user", "content": "Thanks"}
            ],
            "tools": [{"type": "function", "function": {"name": "weather", "description": "Weather now",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
            "tool_choice": "required"
        });
        let want = json!({
            "system": [{"text": "Be brief."}, {"text": "Use tools."}],
            "messages": [
                {"role": "user", "content": [
                    {"text": "What is in this picture, and the weather?"},
                    {"image": {"format": "png", "source": {"bytes": "iVBORw0KGgo="}}}
                ]},
                {"role": "assistant", "content": [
                    {"toolUse": {"toolUseId": "call_1", "name": "weather", "input": {"city": "Paris"}}}
                ]},
                {"role": "user", "content": [
                    {"toolResult": {"toolUseId": "call_1", "content": [{"text": "sunny"}]}},
                    {"text": "Thanks"}
                ]}
            ],
            "inferenceConfig": {"maxTokens": 200, "temperature": 0.3, "topP": 0.9, "stopSequences": ["END"]},
            "toolConfig": {
                "tools": [{"toolSpec": {"name": "weather", "description": "Weather now",
                    "inputSchema": {"json": {"type": "object", "properties": {"city": {"type": "string"}}}}}}],
                "toolChoice": {"any": {}}
            }
        });
        assert_eq!(convert(chat).unwrap(), want);
    }

    #[test]
    fn the_simplest_request_carries_no_config() {
        let got =
            convert(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": "x"}))
                .unwrap();
        assert_eq!(
            got,
            json!({"messages": [{"role": "user", "content": [{"text": "hi"}]}],
                   "inferenceConfig": {"stopSequences": ["x"]}})
        );
        let named = convert(
            json!({"messages": [], "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}}),
        )
        .unwrap();
        assert_eq!(named["toolConfig"]["toolChoice"], json!({"tool": {"name": "f"}}));
        assert_eq!(
            named["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"]["json"],
            json!({"type": "object", "properties": {}})
        );
    }

    #[test]
    fn what_converse_cannot_express_is_refused_by_name() {
        let user = json!([{"role": "user", "content": "hi"}]);
        let rows: &[(Value, &str)] = &[
            (json!({"messages": user, "n": 2}), "n"),
            (json!({"messages": user, "logprobs": true}), "logprobs"),
            (
                json!({"messages": user, "presence_penalty": 0.5}),
                "presence_penalty",
            ),
            (
                json!({"messages": user, "response_format": {"type": "json_object"}}),
                "response_format",
            ),
            (json!({"messages": user, "seed": 7}), "seed"),
            (json!({"messages": user, "max_tokens": 0}), "max_tokens"),
            (
                json!({"messages": user, "parallel_tool_calls": false}),
                "parallel_tool_calls",
            ),
            (json!({"messages": user, "tool_choice": "none"}), "tool_choice"),
            (json!({"messages": user, "tool_choice": "auto"}), "tool_choice"),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{oops"}}]}]}),
                "messages[0].tool_calls[0].function.arguments",
            ),
            (
                json!({"messages": [{"role": "function", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": [{"role": "tool", "content": "x"}]}),
                "messages[0].tool_call_id",
            ),
            (json!({"messages": "hi"}), "messages"),
        ];
        for (chat, param) in rows {
            let got = convert(chat.clone());
            assert_eq!(got.as_ref().map_err(|r| r.param.as_str()), Err(*param), "{chat}");
        }
        // Defaults and nulls are not refusals.
        let fine = json!({"messages": user, "n": 1, "logprobs": false, "presence_penalty": 0.0,
            "response_format": {"type": "text"}, "seed": null, "parallel_tool_calls": true});
        assert!(convert(fine).is_ok());
    }
}
