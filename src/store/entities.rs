//! The rows of DESIGN.md §3 as the rest of the gateway sees them.

use serde::{Deserialize, Serialize};

/// A tenant: everything else belongs to one.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow, Serialize)]
pub struct Workspace {
    /// Row id.
    pub id: i64,
    /// Unique name.
    pub name: String,
    /// IANA zone overriding the gateway's for quota windows.
    pub timezone: Option<String>,
    /// Unix ms.
    pub created_at: i64,
}

/// A department inside a workspace.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow, Serialize)]
pub struct Department {
    /// Row id.
    pub id: i64,
    /// Owning workspace.
    pub workspace_id: i64,
    /// Name, unique in the workspace.
    pub name: String,
    /// Unix ms.
    pub created_at: i64,
}

/// What a member may do (DESIGN.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The Account Owner: everything in the workspace, member/dept/ws guardrails.
    Owner,
    /// Members, upstreams, models, all logs.
    Admin,
    /// Own keys, own logs, own quota, budgets on keys it created.
    Member,
}

impl Role {
    /// The stored and wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Admin => "admin",
            Role::Member => "member",
        }
    }

    /// Whether this role may do everything `other` may (owner ⊇ admin ⊇ member).
    pub fn covers(self, other: Role) -> bool {
        self.rank() >= other.rank()
    }

    /// The lower of two roles.
    pub fn lower(self, other: Role) -> Role {
        if self.rank() <= other.rank() { self } else { other }
    }

    fn rank(self) -> u8 {
        match self {
            Role::Member => 0,
            Role::Admin => 1,
            Role::Owner => 2,
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "owner" => Ok(Role::Owner),
            "admin" => Ok(Role::Admin),
            "member" => Ok(Role::Member),
            other => Err(format!(
                "unknown role {other:?} (expected owner, admin or member)"
            )),
        }
    }
}

/// A person in a workspace.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct MemberRow {
    /// Row id.
    pub id: i64,
    /// Owning workspace.
    pub workspace_id: i64,
    /// Department, if any.
    pub department_id: Option<i64>,
    /// Unique sign-in email.
    pub email: String,
    /// `owner`, `admin` or `member`.
    pub role: String,
    /// argon2 PHC string; none until a password is set.
    pub password_hash: Option<String>,
    /// 1 active, 0 deactivated.
    pub active: i64,
    /// Unix ms.
    pub created_at: i64,
    /// Bumped by sign-out and password change: tokens issued under an older epoch are refused.
    pub session_epoch: i64,
    /// JSON list of the public models (names or trailing-`*` patterns) the member's keys may
    /// call; none: every model.
    pub allowed_models: Option<String>,
    /// Most requests the member's keys together may have in flight on one gateway; none: no cap.
    pub max_in_flight: Option<i64>,
    /// The limits an owner or admin set on the member's keys, carried to every key the member
    /// creates: the model allow-list (JSON; none: not limited)…
    pub key_allowed_models: Option<String>,
    /// …the cap of each key…
    pub key_max_in_flight: Option<i64>,
    /// …and the tag allow-list (JSON).
    pub key_allowed_tags: Option<String>,
}

impl MemberRow {
    /// The member's role (a stored role outside the CHECK constraint reads as `member`).
    pub fn role(&self) -> Role {
        self.role.parse().unwrap_or(Role::Member)
    }
}

/// A gateway API key, as stored: hash and display prefix only.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct ApiKeyRow {
    /// Row id.
    pub id: i64,
    /// Owning workspace.
    pub workspace_id: i64,
    /// The member the key belongs to.
    pub member_id: i64,
    /// The member who created it (budgets on it are theirs to set).
    pub created_by: Option<i64>,
    /// Name, unique per member.
    pub name: String,
    /// SHA-256 of the key, hex.
    pub key_hash: String,
    /// `sk-aigw-` plus four characters, for display.
    pub prefix: String,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms of the last authenticated request.
    pub last_used_at: Option<i64>,
    /// JSON list of the public models (names or trailing-`*` patterns) the key may call; none:
    /// every model.
    pub allowed_models: Option<String>,
    /// Most requests the key may have in flight on one gateway; none: no cap.
    pub max_in_flight: Option<i64>,
    /// Unix ms from which the key answers `api_key_expired`; none: never.
    pub expires_at: Option<i64>,
    /// JSON list of the tags (`key=value` or `key=*`) the key may send; none: every tag.
    pub allowed_tags: Option<String>,
    /// SHA-256 (hex) of the secret the last rotation replaced, while it may still be in grace.
    pub previous_key_hash: Option<String>,
    /// Unix ms at which the replaced secret stops working.
    pub previous_expires_at: Option<i64>,
}

/// An upstream credential (channel), with its secret still sealed.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct UpstreamRow {
    /// Row id.
    pub id: i64,
    /// Owning workspace.
    pub workspace_id: i64,
    /// Name, unique in the workspace.
    pub name: String,
    /// `openai`, `anthropic`, `openrouter`, `gemini` or `openai-compatible`.
    pub provider: String,
    /// Base URL of the provider's API (e.g. `https://api.openai.com/v1`).
    pub base_url: String,
    /// The secret sealed under the master key (`crypto::MasterKey::seal`).
    pub secret_sealed: String,
    /// JSON list of `{name, upstream}`.
    pub models: String,
    /// Lower is tried first.
    pub priority: i64,
    /// Share of traffic within a priority.
    pub weight: i64,
    /// Requests in flight at most.
    pub max_in_flight: i64,
    /// Own limit, if any.
    pub requests_per_minute: Option<i64>,
    /// Own limit, if any.
    pub tokens_per_minute: Option<i64>,
    /// Own limit, if any.
    pub requests_per_day: Option<i64>,
    /// Credentials sharing one account quota (groot ADR 0008).
    pub quota_group: Option<String>,
    /// 1 enabled, 0 disabled.
    pub enabled: i64,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub updated_at: i64,
}

/// A model a credential serves: the public name and the provider's name for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedModel {
    /// Public model name clients ask for.
    pub name: String,
    /// Upstream model name sent to the provider.
    pub upstream: String,
}

impl UpstreamRow {
    /// The models this credential serves (a damaged list reads as none).
    pub fn served_models(&self) -> Vec<ServedModel> {
        serde_json::from_str(&self.models).unwrap_or_default()
    }
}

/// A public model: price and fallback chain.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct ModelRow {
    /// Row id.
    pub id: i64,
    /// Owning workspace.
    pub workspace_id: i64,
    /// Public name.
    pub name: String,
    /// JSON list of other public model names, tried in order.
    pub fallbacks: String,
    /// Micro-credits per million prompt tokens.
    pub price_prompt: i64,
    /// Micro-credits per million completion tokens.
    pub price_completion: i64,
    /// Unix ms.
    pub created_at: i64,
    /// The model's own output limit: the `max_tokens` sent to an Anthropic credential for a chat
    /// request that names none; none: the documented default.
    pub max_output_tokens: Option<i64>,
}

impl ModelRow {
    /// The fallback chain (a damaged list reads as none).
    pub fn fallback_names(&self) -> Vec<String> {
        serde_json::from_str(&self.fallbacks).unwrap_or_default()
    }
}

/// A guardrail quota policy: subject × metric × window × limit.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct PolicyRow {
    /// Row id.
    pub id: i64,
    /// Owning workspace.
    pub workspace_id: i64,
    /// `apikey`, `member`, `dept` or `ws`.
    pub subject: String,
    /// The one subject's id, or 0 for "each".
    pub target_id: i64,
    /// For "each" inside one department: its id; else 0.
    pub scope_department_id: i64,
    /// `requests`, `total_tokens`, `prompt_tokens`, `completion_tokens` or `credits`.
    pub metric: String,
    /// `minute`, `<N>minutes`, `day`, `week`, `month` or `total`.
    pub time_window: String,
    /// The limit (micro-credits for `credits`).
    pub limit_value: i64,
    /// `enforce` or `shadow`.
    pub mode: String,
    /// Member who last set it.
    pub created_by: Option<i64>,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub updated_at: i64,
}

/// One change made through the admin API.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct AuditRow {
    /// Row id (ascending in time).
    pub id: i64,
    /// Workspace the change happened in.
    pub workspace_id: i64,
    /// Unix ms.
    pub at: i64,
    /// Member who made it.
    pub actor_id: Option<i64>,
    /// Their email at the time.
    pub actor_email: Option<String>,
    /// `create`, `update`, `delete`, `test`, …
    pub action: String,
    /// `policy`, `upstream`, `api_key`, `member`, `department`, `model`, `workspace`.
    pub target_kind: String,
    /// The changed row's id.
    pub target_id: Option<i64>,
    /// JSON of the row before (secrets never included).
    pub before_json: Option<String>,
    /// JSON of the row after (secrets never included).
    pub after_json: Option<String>,
    /// The address the change came from (none for changes recorded before it was kept).
    pub client_ip: Option<String>,
    /// The service token the change was made with (its name and display prefix), if any.
    pub actor_token: Option<String>,
}
