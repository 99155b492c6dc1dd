//! OpenAI embeddings as Gemini's `batchEmbedContents`: each input string one request
//! (`dimensions` → `outputDimensionality`), each answer's `values` one embedding, in order.
//! Gemini reports no token counts for embeddings: the answer carries no `usage`, so the gateway
//! estimates it (and flags the estimate in the request log) as for any upstream that reports none.

use serde_json::{Map, Value, json};

use super::request::Refusal;

/// The `batchEmbedContents` body of the embeddings request `req` for `model`.
pub fn batch_request(req: &Map<String, Value>, model: &str) -> Result<Value, Refusal> {
    let refuse = |message: &str| Refusal {
        param: "input".to_owned(),
        message: message.to_owned(),
    };
    let inputs: Vec<&str> = match req.get("input") {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(a)) => a
            .iter()
            .map(Value::as_str)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                refuse("a google upstream embeds text: input must be a string or an array of strings")
            })?,
        _ => return Err(refuse("input must be a string or an array of strings")),
    };
    let model = format!("models/{}", model.strip_prefix("models/").unwrap_or(model));
    let requests: Vec<Value> = inputs
        .iter()
        .map(|t| {
            let mut r = json!({"model": model, "content": {"parts": [{"text": t}]}});
            if let Some(d) = req.get("dimensions").filter(|d| !d.is_null()) {
                r["outputDimensionality"] = d.clone();
            }
            r
        })
        .collect();
    Ok(json!({"requests": requests}))
}

/// The OpenAI embeddings answer of a `batchEmbedContents` answer `body`.
pub fn embeddings(body: &[u8], model: &str) -> Result<Value, String> {
    let v: Value = serde_json::from_slice(body).map_err(|_| "not a Gemini answer (not JSON)".to_owned())?;
    let list = v
        .get("embeddings")
        .and_then(Value::as_array)
        .ok_or_else(|| "a JSON object without `embeddings`".to_owned())?;
    let data: Vec<Value> = list
        .iter()
        .enumerate()
        .map(|(i, e)| json!({"object": "embedding", "index": i, "embedding": e.get("values").cloned().unwrap_or(json!([]))}))
        .collect();
    Ok(json!({"object": "list", "data": data, "model": model}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeddings_go_as_one_batch_and_come_back_in_order() {
        let req = json!({"model": "e", "input": ["a", "b"], "dimensions": 8});
        let body = batch_request(req.as_object().unwrap(), "gemini-embedding-001").unwrap();
        assert_eq!(
            body,
            json!({"requests": [
                {"model": "models/gemini-embedding-001", "content": {"parts": [{"text": "a"}]}, "outputDimensionality": 8},
                {"model": "models/gemini-embedding-001", "content": {"parts": [{"text": "b"}]}, "outputDimensionality": 8}
            ]})
        );
        let tokens = json!({"input": [[1, 2]]});
        assert_eq!(
            batch_request(tokens.as_object().unwrap(), "m").unwrap_err().param,
            "input"
        );
        let answer = json!({"embeddings": [{"values": [0.1]}, {"values": [0.2]}]});
        let out = embeddings(answer.to_string().as_bytes(), "m").unwrap();
        assert_eq!(
            out["data"][1],
            json!({"object": "embedding", "index": 1, "embedding": [0.2]})
        );
        assert!(embeddings(b"{}", "m").is_err());
    }
}
