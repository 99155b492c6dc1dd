//! The behaviour suite: one binary, a module per feature; every behaviour test runs on SQLite
//! and on Postgres through `both_backends!`.

mod helpers;

mod admin;
mod admin_api;
mod alert_destinations;
mod answer_headers;
mod architecture;
mod azure;
mod binary;
mod breaker;
mod breaker_ladder;
mod budget_alerts;
mod concurrency_cap;
mod counter_readback;
mod deadlines;
mod deploy_files;
mod deployment;
mod foundation;
mod host_commands;
mod key_lifecycle;
mod log_queue;
mod mock_upstream;
mod model_allow_list;
mod openapi;
mod owner_limits;
mod proxy;
mod quota;
mod reference;
mod resources;
mod serving;
mod sso;
mod startup;
mod store_contention;
mod store_outage;
mod tags_end_users;
mod traces;
mod translate;
mod translate_fidelity;
mod translate_streams;
mod untrusted_upstream;
mod upstream;
mod upstream_dispatch;
mod upstream_rules;
mod upstream_tls;
mod usage;
