//! Who is calling: a gateway API key and everything above it. The proxy learns it by
//! authenticating the key; quotas, the breaker and the request log read it. The key's and its
//! member's guardrails beside quotas ride along (model allow-lists, concurrency caps), so the
//! request path checks them without a database read.

/// Who is calling: the key and everything above it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// Key id. Not the key's name: nothing on the request path reads it, and a caller is cached
    /// for every key in use (auth/keys.rs), so each field costs once per key.
    pub key_id: i64,
    /// Owning member.
    pub member_id: i64,
    /// Member's department.
    pub department_id: Option<i64>,
    /// Workspace.
    pub workspace_id: i64,
    /// The public models the key and its member may call.
    pub models: ModelAccess,
    /// The key's and the member's caps on requests in flight.
    pub in_flight: InFlightCaps,
    /// The tags the key may send (`key=value` or `key=*`); none: every tag.
    pub allowed_tags: Option<Vec<String>>,
}

/// The key's and the member's model allow-lists: a model must be allowed by both (a list that
/// is absent allows every model).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelAccess {
    /// The key's list.
    pub key: Option<Vec<String>>,
    /// The member's list.
    pub member: Option<Vec<String>>,
}

/// Whose allow-list refused a model (or whose cap a request is over).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Guarded {
    /// The API key's own.
    Key,
    /// The key's member's.
    Member,
}

impl Guarded {
    /// `apikey` or `member`, as quota subjects are named.
    pub fn as_str(self) -> &'static str {
        match self {
            Guarded::Key => "apikey",
            Guarded::Member => "member",
        }
    }

    /// How a message names it.
    pub fn described(self) -> &'static str {
        match self {
            Guarded::Key => "this API key",
            Guarded::Member => "this API key's member",
        }
    }
}

impl ModelAccess {
    /// Whether `model` may be called; else whose list refuses it (the key's first).
    pub fn check(&self, model: &str) -> Result<(), Guarded> {
        let allows = |list: &Option<Vec<String>>| {
            list.as_ref()
                .is_none_or(|l| l.iter().any(|p| pattern_matches(p, model)))
        };
        if !allows(&self.key) {
            return Err(Guarded::Key);
        }
        if !allows(&self.member) {
            return Err(Guarded::Member);
        }
        Ok(())
    }

    /// Whether `model` may be called.
    pub fn allows(&self, model: &str) -> bool {
        self.check(model).is_ok()
    }
}

/// A model allow-list as stored (a JSON array of strings; none: every model).
pub fn decode_model_list(stored: Option<&str>) -> Result<Option<Vec<String>>, String> {
    stored
        .map(|text| serde_json::from_str(text).map_err(|e| format!("bad stored model allow-list: {e}")))
        .transpose()
}

/// A model allow-list as stored.
pub fn encode_model_list(list: Option<&[String]>) -> Option<String> {
    list.map(|l| serde_json::Value::from(l.to_vec()).to_string())
}

/// A concurrency cap as stored (none, or a positive count).
pub fn decode_cap(stored: Option<i64>) -> Option<u32> {
    stored.map(|n| u32::try_from(n.max(1)).unwrap_or(u32::MAX))
}

/// Whether an allow-list entry matches a public model: an exact name, or a prefix followed by a
/// single trailing `*` (`gpt-4o*` matches `gpt-4o` and `gpt-4o-mini`; `*` matches every model).
/// Case-sensitive, as model names are.
pub fn pattern_matches(pattern: &str, model: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => model.starts_with(prefix),
        None => pattern == model,
    }
}

/// The key's and the member's caps on requests in flight on this gateway (none: no cap).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlightCaps {
    /// The key's cap.
    pub key: Option<u32>,
    /// The member's cap, over all their keys.
    pub member: Option<u32>,
}

impl InFlightCaps {
    /// Whether either cap is set (else nothing is counted).
    pub fn any(&self) -> bool {
        self.key.is_some() || self.member.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        let rows: &[(&str, &str, bool)] = &[
            ("gpt-4o-mini", "gpt-4o-mini", true),
            ("gpt-4o-mini", "gpt-4o", false),
            ("gpt-4o*", "gpt-4o", true),
            ("gpt-4o*", "gpt-4o-mini", true),
            ("gpt-4o*", "gpt-4", false),
            ("claude-*", "claude-sonnet", true),
            ("claude-*", "Claude-sonnet", false),
            ("*", "anything", true),
            ("gpt-4o-mini", "gpt-4o-mini-2", false),
        ];
        for (pattern, model, want) in rows {
            assert_eq!(pattern_matches(pattern, model), *want, "{pattern} vs {model}");
        }
    }

    #[test]
    fn both_lists_apply() {
        let list = |l: &[&str]| Some(l.iter().map(|s| (*s).to_owned()).collect());
        let access = ModelAccess {
            key: list(&["gpt-*", "claude-sonnet"]),
            member: list(&["gpt-4o-mini", "claude-*"]),
        };
        assert_eq!(access.check("gpt-4o-mini"), Ok(()));
        assert_eq!(access.check("claude-sonnet"), Ok(()));
        assert_eq!(access.check("gpt-4o"), Err(Guarded::Member));
        assert_eq!(access.check("claude-opus"), Err(Guarded::Key));
        assert!(ModelAccess::default().allows("anything"));
    }
}
