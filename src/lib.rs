//! aigw: an OpenAI-compatible LLM API gateway for companies. See `DESIGN.md` for the contracts;
//! [`app::Gateway`] is the entry point.

pub mod admin;
pub mod alerts;
pub mod app;
pub mod breaker;
pub mod caller;
pub mod client_conn;
pub mod clock;
pub mod config;
pub mod console;
pub mod crypto;
pub mod deadline;
pub mod error;
pub mod forwarded;
pub mod idle_poll;
pub mod in_flight;
pub mod managed;
pub mod mock_upstream;
pub mod oidc;
pub mod otel;
pub mod proxy;
pub mod quota;
pub mod request_log;
pub mod resources;
pub mod serving;
pub mod store;
pub mod tags;
pub mod telemetry;
pub mod translate;
pub mod upstream;
pub mod usage;
pub mod validate;

pub use app::{BuildOptions, Gateway};
pub use clock::Clock;
pub use config::Settings;
