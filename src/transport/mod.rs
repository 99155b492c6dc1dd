//! Transport to the upstreams: the HTTP client and its connection pools. Knows bytes and hosts,
//! not providers or credentials.

pub mod conns;
pub mod http;
