//! Who is calling: a gateway API key and everything above it. The proxy learns it by
//! authenticating the key; quotas, the breaker and the request log read it.

/// Who is calling: the key and everything above it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// Key id.
    pub key_id: i64,
    /// Key name.
    pub key_name: String,
    /// Owning member.
    pub member_id: i64,
    /// Member's department.
    pub department_id: Option<i64>,
    /// Workspace.
    pub workspace_id: i64,
}
