//! An OpenAI chat request as a Gemini `generateContent` request.
//!
//! - `messages`: `system`/`developer` text → `systemInstruction`; `user` → role `user`;
//!   `assistant` → role `model` (its `tool_calls` → `functionCall` parts); `tool` → a `user`
//!   turn of `functionResponse` parts named after the call they answer. Consecutive turns of one
//!   role are joined (Gemini wants a call's answers in one turn).
//! - images: a `data:` URL → `inlineData`; any other URL is refused (Gemini fetches none).
//! - `tools` → one `functionDeclarations` tool (schemas as `parametersJsonSchema`),
//!   `tool_choice` → `toolConfig.functionCallingConfig`.
//! - `stop` → `stopSequences`, `max_tokens`/`max_completion_tokens` → `maxOutputTokens`,
//!   `temperature`, `top_p` → `topP`, `seed`, penalties, `response_format` → the JSON response
//!   fields.
//!
//! What Gemini cannot take is refused by name (`n` above 1, an image by URL), never dropped.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

/// Why a request cannot be sent: the field and the words.
#[derive(Debug, PartialEq)]
pub struct Refusal {
    /// The field, as a path in the client's request.
    pub param: String,
    /// Why.
    pub message: String,
}

fn refuse(param: impl Into<String>, message: impl Into<String>) -> Refusal {
    Refusal {
        param: param.into(),
        message: message.into(),
    }
}

/// The `generateContent` body of the chat request `chat`.
pub fn generate_content(chat: &Map<String, Value>) -> Result<Value, Refusal> {
    let messages = chat
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| refuse("messages", "messages must be an array"))?;
    let mut system: Vec<Value> = Vec::new();
    let mut contents: Vec<Value> = Vec::new();
    // tool_call id → function name, for the tool messages that answer them.
    let mut call_names: HashMap<String, String> = HashMap::new();
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let (role, parts) = match role {
            "system" | "developer" => {
                system.extend(parts_of(m.get("content"), &at)?);
                continue;
            }
            "user" => ("user", parts_of(m.get("content"), &at)?),
            "assistant" => {
                let mut parts = parts_of(m.get("content"), &at)?;
                for (j, call) in m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    let name = call
                        .pointer("/function/name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| {
                            refuse(
                                format!("{at}.tool_calls[{j}].function.name"),
                                "a tool call needs a name",
                            )
                        })?;
                    let args = match call.pointer("/function/arguments") {
                        Some(Value::String(s)) if s.trim().is_empty() => json!({}),
                        Some(Value::String(s)) => serde_json::from_str(s).map_err(|_| {
                            refuse(
                                format!("{at}.tool_calls[{j}].function.arguments"),
                                "the arguments must be JSON",
                            )
                        })?,
                        Some(v @ Value::Object(_)) => v.clone(),
                        _ => json!({}),
                    };
                    if let Some(id) = call.get("id").and_then(Value::as_str) {
                        call_names.insert(id.to_owned(), name.to_owned());
                    }
                    parts.push(json!({"functionCall": {"name": name, "args": args}}));
                }
                ("model", parts)
            }
            "tool" => {
                let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
                let name = call_names
                    .get(id)
                    .cloned()
                    .or_else(|| m.get("name").and_then(Value::as_str).map(str::to_owned))
                    .ok_or_else(|| {
                        refuse(
                            format!("{at}.tool_call_id"),
                            "a tool message must answer an earlier tool call",
                        )
                    })?;
                let text = text_of(m.get("content"));
                let response = match serde_json::from_str::<Value>(&text) {
                    Ok(v @ Value::Object(_)) => v,
                    _ => json!({"content": text}),
                };
                (
                    "user",
                    vec![json!({"functionResponse": {"name": name, "response": response}})],
                )
            }
            other => return Err(refuse(format!("{at}.role"), format!("unknown role {other:?}"))),
        };
        if parts.is_empty() {
            continue;
        }
        match contents.last_mut() {
            Some(last) if last["role"] == role => {
                if let Some(p) = last["parts"].as_array_mut() {
                    p.extend(parts);
                }
            }
            _ => contents.push(json!({"role": role, "parts": parts})),
        }
    }
    let mut body = Map::new();
    body.insert("contents".into(), Value::Array(contents));
    if !system.is_empty() {
        body.insert("systemInstruction".into(), json!({"parts": system}));
    }
    if let Some(tools) = chat.get("tools").and_then(Value::as_array) {
        let decls: Vec<Value> = tools
            .iter()
            .filter_map(|t| t.get("function"))
            .map(|f| {
                let mut d = Map::new();
                d.insert("name".into(), f.get("name").cloned().unwrap_or(Value::Null));
                if let Some(desc) = f.get("description") {
                    d.insert("description".into(), desc.clone());
                }
                if let Some(p) = f.get("parameters") {
                    d.insert("parametersJsonSchema".into(), p.clone());
                }
                Value::Object(d)
            })
            .collect();
        if !decls.is_empty() {
            body.insert("tools".into(), json!([{"functionDeclarations": decls}]));
        }
    }
    if let Some(choice) = chat.get("tool_choice") {
        let config = match choice {
            Value::String(s) if s == "none" => json!({"mode": "NONE"}),
            Value::String(s) if s == "required" => json!({"mode": "ANY"}),
            Value::Object(_) => match choice.pointer("/function/name") {
                Some(name) => json!({"mode": "ANY", "allowedFunctionNames": [name]}),
                None => json!({"mode": "AUTO"}),
            },
            _ => json!({"mode": "AUTO"}),
        };
        body.insert("toolConfig".into(), json!({"functionCallingConfig": config}));
    }
    let config = generation_config(chat)?;
    if !config.is_empty() {
        body.insert("generationConfig".into(), Value::Object(config));
    }
    Ok(Value::Object(body))
}

fn generation_config(chat: &Map<String, Value>) -> Result<Map<String, Value>, Refusal> {
    let mut g = Map::new();
    if let Some(n) = chat.get("n").and_then(Value::as_u64) {
        if n > 1 {
            return Err(refuse("n", "a google upstream answers one choice; n must be 1"));
        }
    }
    match chat.get("stop") {
        Some(Value::String(s)) => {
            g.insert("stopSequences".into(), json!([s]));
        }
        Some(Value::Array(a)) if !a.is_empty() => {
            g.insert("stopSequences".into(), Value::Array(a.clone()));
        }
        _ => {}
    }
    let max = ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| chat.get(*k).filter(|v| !v.is_null()));
    if let Some(max) = max {
        g.insert("maxOutputTokens".into(), max.clone());
    }
    for (from, to) in [
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("seed", "seed"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ] {
        if let Some(v) = chat.get(from).filter(|v| !v.is_null()) {
            g.insert(to.into(), v.clone());
        }
    }
    match chat
        .get("response_format")
        .and_then(|f| f.get("type"))
        .and_then(Value::as_str)
    {
        Some("json_object") => {
            g.insert("responseMimeType".into(), json!("application/json"));
        }
        Some("json_schema") => {
            g.insert("responseMimeType".into(), json!("application/json"));
            if let Some(s) = chat
                .get("response_format")
                .and_then(|f| f.pointer("/json_schema/schema"))
            {
                g.insert("responseJsonSchema".into(), s.clone());
            }
        }
        _ => {}
    }
    Ok(g)
}

/// The text of a message's content, its text parts joined.
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// A message's content as Gemini parts.
fn parts_of(content: Option<&Value>, at: &str) -> Result<Vec<Value>, Refusal> {
    match content {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) if s.is_empty() => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![json!({"text": s})]),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let here = format!("{at}.content[{k}]");
                match p.get("type").and_then(Value::as_str) {
                    Some("text") => Ok(json!({"text": p.get("text").cloned().unwrap_or(json!(""))})),
                    Some("image_url") => {
                        let url = p
                            .pointer("/image_url/url")
                            .and_then(Value::as_str)
                            .or_else(|| p.get("image_url").and_then(Value::as_str))
                            .unwrap_or("");
                        inline_data(url).ok_or_else(|| {
                            refuse(
                                here,
                                "a google upstream takes images as data: URLs (base64) only, not by URL",
                            )
                        })
                    }
                    other => Err(refuse(
                        here,
                        format!("content part type {other:?} cannot be sent to a google upstream"),
                    )),
                }
            })
            .collect(),
        Some(_) => Err(refuse(
            format!("{at}.content"),
            "content must be a string or an array of parts",
        )),
    }
}

/// A `data:MIME;base64,DATA` URL as an `inlineData` part.
fn inline_data(url: &str) -> Option<Value> {
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    let mime = meta.strip_suffix(";base64")?;
    Some(json!({"inlineData": {"mimeType": mime, "data": data}}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn a_chat_request_becomes_generate_content() {
        let body = generate_content(&chat(json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "look", "arguments": "{\"q\":1}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "find", "arguments": ""}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"ok\":true}"},
                {"role": "tool", "tool_call_id": "call_2", "content": "plain"}
            ],
            "tools": [{"type": "function", "function": {"name": "look", "description": "d",
                "parameters": {"type": "object"}}}],
            "tool_choice": "required",
            "stop": "END",
            "max_tokens": 50,
            "temperature": 0.2,
            "top_p": 0.9
        })))
        .unwrap();
        assert_eq!(
            body,
            json!({
                "contents": [
                    {"role": "user", "parts": [{"text": "what is this?"},
                        {"inlineData": {"mimeType": "image/png", "data": "iVBOR"}}]},
                    {"role": "model", "parts": [
                        {"functionCall": {"name": "look", "args": {"q": 1}}},
                        {"functionCall": {"name": "find", "args": {}}}]},
                    {"role": "user", "parts": [
                        {"functionResponse": {"name": "look", "response": {"ok": true}}},
                        {"functionResponse": {"name": "find", "response": {"content": "plain"}}}]}
                ],
                "systemInstruction": {"parts": [{"text": "be brief"}]},
                "tools": [{"functionDeclarations": [{"name": "look", "description": "d",
                    "parametersJsonSchema": {"type": "object"}}]}],
                "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
                "generationConfig": {"stopSequences": ["END"], "maxOutputTokens": 50,
                    "temperature": 0.2, "topP": 0.9}
            })
        );
    }

    #[test]
    fn what_gemini_cannot_take_is_refused_by_name() {
        let cases = [
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url",
                    "image_url": {"url": "https://x.test/a.png"}}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"messages": [{"role": "user", "content": "hi"}], "n": 2}),
                "n",
            ),
            (
                json!({"messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]}),
                "messages[0].tool_call_id",
            ),
            (json!({"messages": "hi"}), "messages"),
        ];
        for (req, param) in cases {
            let err = generate_content(&chat(req)).unwrap_err();
            assert_eq!(err.param, param, "{}", err.message);
        }
        let ok = generate_content(&chat(json!({"messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 7, "stop": ["a", "b"]})))
        .unwrap();
        assert_eq!(
            ok["generationConfig"],
            json!({"stopSequences": ["a", "b"], "maxOutputTokens": 7})
        );
    }
}
