//! What a budget alert's settings may be, the same from the admin API and the resources file:
//! its thresholds and its webhook (types that hold only what their rule allows) and its signing
//! secret. A refusal is the message a person reads (after the field's name).

/// A budget alert's thresholds: 1 to 10 whole percents of the limit, each 1 to 1000 (an alert on
/// overshoot is allowed), ascending without duplicates. The default, none, is only what a
/// refused list leaves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Thresholds(Vec<u16>);

impl Thresholds {
    /// The percents, ascending.
    pub fn percents(&self) -> &[u16] {
        &self.0
    }

    /// As the store keeps them: a JSON list (`[80,100]`).
    pub fn stored(&self) -> String {
        serde_json::to_string(&self.0).unwrap_or_else(|_| "[]".into())
    }

    /// The thresholds `list` of field `field` names.
    pub fn parse(field: &str, list: &[i64]) -> Result<Thresholds, String> {
        thresholds(field, list).map(Thresholds)
    }
}

fn thresholds(field: &str, list: &[i64]) -> Result<Vec<u16>, String> {
    let max = super::MAX_PERCENT;
    if list.is_empty() || list.len() > super::MAX_THRESHOLDS {
        return Err(format!(
            "{field} must list 1 to {} thresholds (percents of the limit)",
            super::MAX_THRESHOLDS
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for v in list {
        match u16::try_from(*v) {
            Ok(p) if (1..=max).contains(&p) => out.push(p),
            _ => {
                return Err(format!(
                    "{field}: each threshold is a percent from 1 to {max} (got {v})"
                ));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// A budget alert's webhook: an `http://` or `https://` URL with a host, at most 2000 bytes, no
/// whitespace or control characters, no user or password in it (a signing secret does that job);
/// trimmed. The default, empty, is only what a refused one leaves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Webhook(String);

impl Webhook {
    /// The URL.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The URL, as stored.
    pub fn into_string(self) -> String {
        self.0
    }

    /// The webhook `value` of field `field` names.
    pub fn parse(field: &str, value: &str) -> Result<Webhook, String> {
        webhook(field, value).map(Webhook)
    }
}

fn webhook(field: &str, value: &str) -> Result<String, String> {
    let v = value.trim();
    let bad = || format!("{field} must be an http:// or https:// URL, e.g. \"https://hooks.example/aigw\"");
    if v.len() > 2000 || v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad());
    }
    let url = reqwest::Url::parse(v).map_err(|_| bad())?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(bad());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "{field} must not carry a user or password; set a signing secret instead"
        ));
    }
    Ok(v.to_owned())
}

/// A budget alert's signing secret: 16 to 512 printable characters.
pub fn secret(field: &str, value: &str) -> Result<(), String> {
    let n = value.chars().count();
    if !(16..=512).contains(&n) || value.chars().any(char::is_control) {
        return Err(format!("{field} must be 16 to 512 printable characters"));
    }
    Ok(())
}
