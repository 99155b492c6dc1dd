//! What the classifier reads out of a failure, once: the body lowercased, its `error` object,
//! and the headers (OpenRouter's relayed ones included).

use serde_json::Value;

use super::UpstreamFailure;

/// What the classifier reads out of a failure, once.
pub(super) struct Evidence {
    /// The body, ASCII-lowercased (byte offsets equal the body's).
    pub(super) text: String,
    /// The body's `error` object (the first element's, when the body is an array).
    pub(super) error: Option<Value>,
    /// A top-level `error_type` (groot's field name), if any.
    pub(super) top_level_error_type: Option<Value>,
    /// Response headers and OpenRouter's `error.metadata.headers`, names lowercased; the body's
    /// come first.
    pub(super) headers: Vec<(String, String)>,
}

impl Evidence {
    pub(super) fn read(f: &UpstreamFailure<'_>) -> Self {
        let json = serde_json::from_str::<Value>(f.body)
            .ok()
            .map(|value| match value {
                Value::Array(mut items) if !items.is_empty() => items.swap_remove(0),
                other => other,
            });
        let mut error = None;
        let mut top_level_error_type = None;
        if let Some(Value::Object(mut top)) = json {
            top_level_error_type = top.remove("error_type");
            error = top.remove("error").filter(Value::is_object);
        }
        let mut headers = Vec::new();
        if let Some(Value::Object(body_headers)) = error
            .as_ref()
            .and_then(|e| e.get("metadata"))
            .and_then(|m| m.get("headers"))
        {
            for (name, value) in body_headers {
                let value = match value {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    _ => continue,
                };
                headers.push((name.to_ascii_lowercase(), value));
            }
        }
        for (name, value) in f.headers {
            if let Ok(value) = value.to_str() {
                headers.push((name.as_str().to_owned(), value.to_owned()));
            }
        }
        Self {
            text: f.body.to_ascii_lowercase(),
            error,
            top_level_error_type,
            headers,
        }
    }

    /// The first value of a header (name in lowercase).
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the body contains `needle` (given in lowercase), case-insensitively.
    pub(super) fn says(&self, needle: &str) -> bool {
        self.text.contains(needle)
    }

    pub(super) fn says_any(&self, needles: &[&str]) -> bool {
        needles.iter().any(|needle| self.says(needle))
    }

    pub(super) fn error_str(&self, key: &str) -> Option<&str> {
        self.error.as_ref()?.get(key)?.as_str()
    }

    /// The error's message in its original case.
    pub(super) fn message(&self) -> Option<&str> {
        self.error_str("message")
    }
}

pub(super) fn is_4xx(status: u16) -> bool {
    (400..500).contains(&status)
}

pub(super) fn json_number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}
