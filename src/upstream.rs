//! Upstream credentials: the credential pool and dispatch on top of it (DESIGN.md §6). Wire
//! formats live in `provider`, the HTTP client in `transport`.

pub mod dispatch;
pub mod fields;
pub mod pool;
