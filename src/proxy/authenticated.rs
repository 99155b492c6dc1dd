//! The caller of a `/v1` route, as an axum extractor over
//! [`KeyResolver`](crate::auth::keys::KeyResolver).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;

use crate::error::ApiError;
use crate::kernel::caller::Caller;
use crate::state::AppState;

/// The caller of a `/v1` route, authenticated by the API key the request presents (the proxy's
/// counterpart of the admin side's `Actor`). Refused as
/// [`KeyResolver::authenticate`](crate::auth::keys::KeyResolver::authenticate) refuses.
pub struct Authenticated(pub Arc<Caller>);

impl FromRequestParts<AppState> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        // Every connection carries its peer; a route without it is a wiring bug.
        let ConnectInfo(peer) = ConnectInfo::<SocketAddr>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::Internal)?;
        state
            .keys
            .authenticate(
                &state.store,
                &parts.headers,
                state.client_ip(peer, &parts.headers),
                state.clock.now_ms(),
            )
            .await
            .map(Authenticated)
    }
}
