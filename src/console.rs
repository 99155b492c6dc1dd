//! The web console (DESIGN.md §7): the files of `admin-ui/`, served at `/console/` as they are
//! (no build step). Release builds embed them in the binary; debug builds read them from the
//! repository, so an edited file shows on reload.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use crate::error::ApiError;
use crate::state::AppState;

#[derive(rust_embed::RustEmbed)]
#[folder = "admin-ui/"]
struct Files;

/// The console's routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        // Temporary: the root may serve something else one day; browsers cache a 308 for good.
        .route("/", get(|| async { Redirect::temporary("/console/") }))
        .route("/console", get(|| async { Redirect::permanent("/console/") }))
        .route("/console/", get(|| async { file("index.html") }))
        .route(
            "/console/{*path}",
            get(|Path(path): Path<String>| async move { file(&path) }),
        )
}

/// Only the console's own origin: no script, style, image or connection to any other host.
const CSP: &str = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; \
                   script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

fn file(path: &str) -> Response {
    let Some(f) = Files::get(path) else {
        return ApiError::NotFound { what: "console file" }.into_response();
    };
    let mime = match path.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("json") => "application/json",
        _ => "application/octet-stream",
    };
    let mut resp = f.data.into_owned().into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    resp
}
