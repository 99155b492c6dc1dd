//! The signed-in member an admin request acts as, checked from its token (the tokens themselves
//! are `crate::auth::session`'s).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{MemberRow, Role};

/// The signed-in member a request acts as: put into the request by the admin guard after the
/// token, the member (active, same session epoch) and the route's role were checked.
#[derive(Clone, Debug)]
pub struct Actor {
    /// The member, as stored now (not as at sign-in). With a service token, the member who
    /// created it.
    pub member: MemberRow,
    /// The address the request came from (behind a trusted proxy, the one it forwarded).
    pub client_ip: std::net::IpAddr,
    /// What the request may do: the member's current role, or with a service token the lower of
    /// the token's role and its creator's current role.
    role: Role,
    /// The service token the request came with, if any.
    pub token: Option<TokenUse>,
}

/// The service token a request came with.
#[derive(Clone, Debug)]
pub struct TokenUse {
    /// Its id.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// Its display prefix.
    pub prefix: String,
}

impl Actor {
    /// A member acting in person (a console or API session, a single sign-on).
    pub fn signed_in(member: MemberRow, client_ip: std::net::IpAddr) -> Actor {
        Actor {
            role: member.role(),
            member,
            client_ip,
            token: None,
        }
    }

    /// What the request may do.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The member's workspace.
    pub fn workspace_id(&self) -> i64 {
        self.member.workspace_id
    }

    /// Whether the request may manage the workspace (owner or admin).
    pub fn manages(&self) -> bool {
        matches!(self.role(), Role::Owner | Role::Admin)
    }

    /// The service token as the audit log names it: `name (aigw_st_AbCd…)`.
    pub fn token_label(&self) -> Option<String> {
        self.token.as_ref().map(|t| format!("{} ({}…)", t.name, t.prefix))
    }

    /// Checks `Authorization: Bearer <jwt or service token>` and loads the member it names;
    /// `client_ip` is where the request came from.
    pub async fn authenticate(
        state: &AppState,
        headers: &axum::http::HeaderMap,
        client_ip: std::net::IpAddr,
    ) -> Result<Actor, ApiError> {
        use crate::store::MemberStore;
        let token = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or(ApiError::InvalidToken)?;
        if token.starts_with(crate::kernel::crypto::SERVICE_TOKEN_PREFIX) {
            return Actor::with_service_token(state, token, client_ip).await;
        }
        let claims = state
            .sessions
            .verify(token, state.clock.now())
            .ok_or(ApiError::InvalidToken)?;
        let member_id: i64 = claims.sub.parse().map_err(|_| ApiError::InvalidToken)?;
        let member = state
            .store
            .member(member_id)
            .await
            .map_err(|_| ApiError::Internal)?
            .filter(|m| m.active == 1 && m.session_epoch == claims.sep && m.workspace_id == claims.ws)
            .ok_or(ApiError::InvalidToken)?;
        Ok(Actor::signed_in(member, client_ip))
    }

    /// A service token (DESIGN.md §11): found by its hash on every request, so a revocation
    /// holds on every gateway from the next request; refused when revoked, expired, or when its
    /// creator is no longer an active member of its workspace. It may do what both its own role
    /// and its creator's current role allow: demoting the creator demotes their tokens.
    async fn with_service_token(
        state: &AppState,
        token: &str,
        client_ip: std::net::IpAddr,
    ) -> Result<Actor, ApiError> {
        use crate::store::{MemberStore, TokenStore};
        if !crate::kernel::crypto::is_service_token_shape(token) {
            return Err(ApiError::InvalidToken);
        }
        let now = state.clock.now_ms();
        let row = state
            .store
            .service_token_by_hash(&crate::kernel::crypto::hash_api_key(token))
            .await
            .map_err(ApiError::from)?
            .filter(|t| t.revoked_at.is_none() && t.expires_at.is_none_or(|e| now < e))
            .ok_or(ApiError::InvalidToken)?;
        let member = state
            .store
            .member(row.created_by)
            .await
            .map_err(ApiError::from)?
            .filter(|m| m.active == 1 && m.workspace_id == row.workspace_id)
            .ok_or(ApiError::InvalidToken)?;
        if row
            .last_used_at
            .is_none_or(|t| now >= t.saturating_add(crate::store::TOKEN_LAST_USED_STEP_MS))
            && let Err(e) = state.store.touch_service_token(row.id, now).await
        {
            tracing::warn!(error = %e, token = row.id, "could not note a service token's use");
        }
        Ok(Actor {
            role: row.role().lower(member.role()),
            member,
            client_ip,
            token: Some(TokenUse {
                id: row.id,
                name: row.name,
                prefix: row.prefix,
            }),
        })
    }
}

impl FromRequestParts<AppState> for Actor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &AppState) -> Result<Self, Self::Rejection> {
        // Only routes behind the admin guard take an Actor; one without it is a wiring bug.
        parts
            .extensions
            .get::<Actor>()
            .cloned()
            .ok_or(ApiError::InvalidToken)
    }
}
