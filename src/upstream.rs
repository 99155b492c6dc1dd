//! Upstream credentials: failure classification, locks, the credential pool and dispatch
//! (DESIGN.md §6). Wire formats live in `provider`, the HTTP client in `transport`.

pub mod admission;
pub mod classify;
pub mod conns;
pub mod corroboration;
pub mod dispatch;
pub mod http;
pub mod locks;
pub mod pool;
pub mod worded_reset;
