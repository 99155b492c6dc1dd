//! What operators see of the gateway at work: structured logs and Prometheus metrics
//! ([`telemetry`]) and OpenTelemetry traces ([`otel`]). It knows no domain type: the handlers
//! name what they count, this room only keeps the handles.

pub mod otel;
pub mod telemetry;
