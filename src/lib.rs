//! aigw: an OpenAI-compatible LLM API gateway for companies. See `DESIGN.md` for the contracts;
//! [`app::Gateway`] is the entry point.

pub mod admin;
pub mod alerts;
pub mod app;
pub mod auth;
pub mod breaker;
pub mod config;
pub mod console;
pub mod deadline;
pub mod edge;
pub mod error;
pub mod kernel;
pub mod mock_upstream;
pub mod observability;
pub mod operator;
pub mod provider;
pub mod proxy;
pub mod quota;
pub mod request_log;
pub mod resources;
pub mod state;
pub mod store;
pub mod translate;
pub mod transport;
pub mod upstream;
pub mod validate;

pub use app::{BuildOptions, Gateway};
pub use config::Settings;
pub use kernel::clock::Clock;
