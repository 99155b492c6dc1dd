//! What the start does before serving, beside opening the store: checking the folders it writes
//! to, resolving (or generating) the secrets, and creating the first owner.

use std::path::{Path, PathBuf};

use super::StartError;
use crate::config::{Secret, Settings};
use crate::kernel::crypto::{self, MasterKey};
use crate::store::{MemberStore, NewMember, Store, WorkspaceStore};

/// The folders the start writes into exist: the SQLite file's, and `data_dir` when set. Checked
/// before anything is written, so a missing folder is named as such rather than through the
/// first file that could not be created in it. Folders are not created: a missing one is more
/// often a typo than an intention.
pub(super) fn check_folders(settings: &Settings) -> Result<(), StartError> {
    if settings.is_sqlite() {
        let file = crate::config::sqlite_path(&settings.database_url);
        let folder = Path::new(file).parent().filter(|p| !p.as_os_str().is_empty());
        if let Some(folder) = folder
            && !file.starts_with(":memory:")
            && !folder.is_dir()
        {
            return Err(StartError::Config(format!(
                "the database folder {} does not exist (database_url, AIGW_DATABASE_URL = {:?}): \
                 create it, or choose a path in an existing folder",
                folder.display(),
                settings.database_url
            )));
        }
    }
    let data_dir = &settings.data_dir;
    if !data_dir.as_os_str().is_empty() && !data_dir.is_dir() {
        return Err(StartError::Config(format!(
            "the data folder {} does not exist (data_dir, AIGW_DATA_DIR): create it, or leave \
             the setting out to keep aigw.keys beside the database",
            data_dir.display()
        )));
    }
    Ok(())
}

/// Opens the database, unless it is a SQLite file that does not exist yet (opening would create
/// it): `None` then. Opening a Postgres database writes nothing.
pub(super) async fn open_unless_new_sqlite(settings: &Settings) -> Result<Option<Store>, StartError> {
    if settings.is_sqlite() {
        let file = crate::config::sqlite_path(&settings.database_url);
        if !file.starts_with(":memory:") && !Path::new(file).exists() {
            return Ok(None);
        }
    }
    Ok(Some(
        Store::open_with(&settings.database_url, settings.database_max_connections).await?,
    ))
}

/// On a new database (`store` is `None`, or was never migrated) the resources file is checked
/// whole against an empty database in memory, so that a refused file writes nothing. On a
/// database in use the check runs under the start lock, against what it holds.
pub(super) async fn check_on_new_database(
    store: Option<&Store>,
    prepared: &crate::resources::Prepared,
) -> Result<(), StartError> {
    if let Some(store) = store
        && store.has_schema().await?
    {
        return Ok(());
    }
    let scratch = empty_database().await?;
    let checked = prepared.check(&scratch).await;
    scratch.close().await;
    Ok(checked?)
}

/// A migrated database in memory, holding nothing: what a new database is.
pub async fn empty_database() -> Result<Store, crate::store::StoreError> {
    // Named, so that every connection of the pool opens the same database (`sqlite::memory:`
    // is a new one for each connection the `Any` driver makes).
    let url = format!(
        "sqlite:file:aigw-empty-{}?mode=memory&cache=shared",
        uuid::Uuid::now_v7().simple()
    );
    let store = Store::open(&url).await?;
    store.migrate().await?;
    Ok(store)
}

/// The master key and JWT secret: from settings, else from `aigw.keys` beside the database,
/// else generated into that file (0600) with a warning.
pub(super) fn resolve_secrets(settings: &Settings) -> Result<(Secret, Secret), StartError> {
    if let (Some(m), Some(j)) = (&settings.master_key, &settings.jwt_secret) {
        return Ok((m.clone(), j.clone()));
    }
    let path = settings.secrets_dir().join("aigw.keys");
    let err = |message: String| StartError::SecretsFile {
        path: path.clone(),
        message,
    };
    #[derive(serde::Deserialize, serde::Serialize)]
    struct KeysFile {
        master_key: String,
        jwt_secret: String,
    }
    let read = |path: &Path| -> Result<KeysFile, StartError> {
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        toml::from_str::<KeysFile>(&text).map_err(|e| err(e.to_string()))
    };
    let file = if path.exists() {
        read(&path)?
    } else {
        let file = KeysFile {
            master_key: MasterKey::generate_text(),
            jwt_secret: MasterKey::generate_text(),
        };
        let text = toml::to_string(&file).map_err(|e| err(e.to_string()))?;
        match publish_private(&path, &text) {
            Ok(()) => {
                tracing::warn!(
                    file = %path.display(),
                    "no master key or JWT secret configured: generated them into this file; back it up \
                     (upstream secrets cannot be decrypted without it) or set AIGW_MASTER_KEY and AIGW_JWT_SECRET"
                );
                file
            }
            // Another gateway started at the same instant in this folder published its file
            // first: use that one, so both open the same sealed secrets.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read(&path)?,
            Err(e) => return Err(err(e.to_string())),
        }
    };
    Ok((
        settings
            .master_key
            .clone()
            .unwrap_or(Secret::new(file.master_key)),
        settings
            .jwt_secret
            .clone()
            .unwrap_or(Secret::new(file.jwt_secret)),
    ))
}

/// Writes `text` to `path` (mode 0600) only if `path` does not exist, atomically: the text goes
/// to a private temporary file that is then hard-linked into place, so a reader never sees a
/// partial file and of two writers exactly one wins (the other gets `AlreadyExists`).
fn publish_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut temp_name = path.as_os_str().to_owned();
    temp_name.push(format!(".{}.tmp", uuid::Uuid::now_v7().simple()));
    let temp = PathBuf::from(temp_name);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let written = opts.open(&temp).and_then(|mut f| {
        f.write_all(text.as_bytes())?;
        f.sync_all()
    });
    let published = written.and_then(|()| std::fs::hard_link(&temp, path));
    let _ = std::fs::remove_file(&temp);
    published
}

/// The first owner's email when `bootstrap_email` is not set.
const DEFAULT_OWNER_EMAIL: &str = "owner@aigw.local";

/// First start with no owner: a workspace and an owner from the bootstrap settings, or with a
/// generated password printed once.
pub(super) async fn bootstrap_owner(store: &Store, settings: &Settings, now: i64) -> Result<(), StartError> {
    if store.count_owners().await? > 0 {
        warn_if_bootstrap_ignored(store, settings).await?;
        return Ok(());
    }
    let workspace = match store.workspaces().await?.into_iter().next() {
        Some(w) => w,
        None => store.create_workspace("default", None, now).await?,
    };
    let email = settings
        .bootstrap_email
        .clone()
        .unwrap_or_else(|| DEFAULT_OWNER_EMAIL.to_owned());
    let (password, generated) = match &settings.bootstrap_password {
        Some(p) => (p.expose().to_owned(), false),
        None => (crypto::generate_password(), true),
    };
    let hash = crypto::hash_password(&password);
    match store.member_by_email(&email).await? {
        Some(existing) => {
            store
                .update_member(existing.id, existing.department_id, "owner")
                .await?;
            store.set_member_password(existing.id, &hash).await?;
        }
        None => {
            let new = NewMember {
                workspace_id: workspace.id,
                department_id: None,
                email: &email,
                role: "owner",
                password_hash: Some(&hash),
            };
            store.create_member(&new, now).await?;
        }
    }
    tracing::info!(email = %email, workspace = %workspace.name, "created the first owner");
    if generated {
        // Printed once, on stdout only; set AIGW_BOOTSTRAP_PASSWORD to choose it instead.
        println!(
            "aigw: first owner {email} in workspace {:?}, password: {password}",
            workspace.name
        );
    }
    Ok(())
}

/// The bootstrap settings only act while there is no owner. Set on a later start for an email
/// that is not an owner (a walkthrough run against an old database, a changed email), they would
/// otherwise be ignored without a word, and the sign-in with them fails.
async fn warn_if_bootstrap_ignored(store: &Store, settings: &Settings) -> Result<(), StartError> {
    if settings.bootstrap_email.is_none() && settings.bootstrap_password.is_none() {
        return Ok(());
    }
    let email = settings.bootstrap_email.as_deref().unwrap_or(DEFAULT_OWNER_EMAIL);
    let is_owner = store
        .member_by_email(email)
        .await?
        .is_some_and(|m| m.role == "owner");
    if !is_owner {
        tracing::warn!(
            email = %email,
            "AIGW_BOOTSTRAP_EMAIL / AIGW_BOOTSTRAP_PASSWORD (bootstrap_email, bootstrap_password) \
             are ignored: the database already has an owner, and the bootstrap settings only \
             create the first one; sign in as the existing owner, or start on a new database"
        );
    }
    Ok(())
}

/// DESIGN.md §11: the policies a resources file created start from the usage already recorded
/// in their current window (`quota::engine::count_recorded`), before any gateway serves them:
/// still under the start lock.
pub(super) async fn count_recorded(
    store: &Store,
    settings: &Settings,
    policies: &[crate::store::PolicyRow],
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), StartError> {
    for row in policies {
        let Some(rule) = crate::quota::engine::PolicyRule::from_row(row) else {
            continue;
        };
        let tz = store
            .workspace(row.workspace_id)
            .await?
            .and_then(|w| w.timezone)
            .and_then(|z| z.parse().ok())
            .unwrap_or(settings.timezone);
        let (counted, _) =
            crate::quota::engine::count_recorded(store, row.workspace_id, &rule, now, tz).await?;
        if counted.subjects > 0 {
            tracing::info!(
                policy = row.id,
                subjects = counted.subjects,
                used = counted.used,
                "a new policy counts the usage already recorded in its window"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gateways started at the same instant in one folder with no secrets configured: exactly one
    /// generates `aigw.keys`, and every one of them uses that file's secrets.
    #[test]
    fn secrets_generated_at_the_same_instant_are_one_file() {
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let mut settings = Settings::load(None, |_| None).unwrap();
            settings.master_key = None;
            settings.jwt_secret = None;
            settings.data_dir = dir.path().to_path_buf();
            let barrier = std::sync::Barrier::new(6);
            let resolved: Vec<(String, String)> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..6)
                    .map(|_| {
                        scope.spawn(|| {
                            barrier.wait();
                            let (m, j) = resolve_secrets(&settings).unwrap();
                            (m.expose().to_owned(), j.expose().to_owned())
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(resolved.iter().all(|r| r == &resolved[0]), "{resolved:?}");
            let names: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, ["aigw.keys"], "no temporary file left behind");
        }
    }
}
