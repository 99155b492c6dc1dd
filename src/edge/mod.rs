//! The serving edge: how client connections are accepted and served before any handler runs.
//! [`serving`] runs the accept loop and the serving threads (thread per core), [`client_conn`]
//! serves one connection whichever layout holds it, [`idle_poll`] spins a serving thread briefly
//! before it parks, and [`forwarded`] reads the client's address behind trusted proxies.

pub mod client_conn;
pub mod forwarded;
pub mod idle_poll;
pub mod serving;
