//! What an operator runs on the host beside `aigw serve` (DESIGN.md §11): [`check`] proves the
//! settings and a resources file without starting or writing anything, and [`reset_password`]
//! recovers a lost password against the configured database.

pub mod check;
pub mod reset_password;

use std::path::Path;

use crate::config::Settings;
use crate::store::{Store, StoreError};

/// The configured database if it exists and this build's migrations are all applied; `Ok(None)`
/// when it is a SQLite file that does not exist (opening would create it). Nothing is written.
async fn open_existing(settings: &Settings) -> Result<Option<Store>, StoreError> {
    if settings.is_sqlite() {
        let file = crate::config::sqlite_path(&settings.database_url);
        if !Path::new(file).exists() {
            return Ok(None);
        }
    }
    Store::open_with(&settings.database_url, 2).await.map(Some)
}

/// Where the database is, for messages.
fn database_name(settings: &Settings) -> String {
    if settings.is_sqlite() {
        crate::config::sqlite_path(&settings.database_url).to_owned()
    } else {
        let url = &settings.database_url;
        // The host and database only: the URL may hold a password.
        let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
        let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        format!("postgres://{}", host.split('?').next().unwrap_or(host))
    }
}
