//! The database settings: the forms `database_url` takes and the pool's default size.

/// Connections in a gateway's Postgres pool unless `database_max_connections` says otherwise.
pub const DEFAULT_POSTGRES_CONNECTIONS: u32 = 16;

/// Whether `v` is a `database_url` the gateway can open.
pub(super) fn database_url_form(v: &str) -> Result<(), String> {
    let ok = v.starts_with("sqlite:") || v.starts_with("postgres://") || v.starts_with("postgresql://");
    if ok {
        Ok(())
    } else {
        Err("expected sqlite://PATH or postgres://…".into())
    }
}

/// The file path of a `sqlite:` URL (without query string).
pub fn sqlite_path(url: &str) -> &str {
    let rest = url.trim_start_matches("sqlite://").trim_start_matches("sqlite:");
    rest.split('?').next().unwrap_or(rest)
}
