//! Who is calling: gateway API keys on the request path (`keys`) and admin sessions
//! (`session`). The axum extractors that read them live with their handlers.

pub mod keys;
pub mod oidc;
pub mod session;
