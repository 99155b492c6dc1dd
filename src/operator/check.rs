//! `aigw check`: the settings (file and `AIGW_*` variables) and a resources file, checked as
//! `aigw serve` would check them, every problem listed, nothing written: no database is created
//! or migrated, no secrets file generated.

use std::path::Path;

use super::{database_name, open_existing};
use crate::config::Settings;
use crate::resources::Prepared;

/// What the check found.
#[derive(Debug, Default)]
pub struct Report {
    /// What stops `aigw serve` from starting, one a line; empty when it would start.
    pub problems: Vec<String>,
    /// What is worth knowing but does not stop the start (an unknown variable, what the
    /// resources file's references were checked against).
    pub notes: Vec<String>,
}

/// Checks the settings from `config` and `env`, and the resources file at `resources`.
pub async fn check(
    config: Option<&Path>,
    resources: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
    variables: impl IntoIterator<Item = String>,
) -> Report {
    let mut report = Report::default();
    for name in crate::config::unknown_variables(variables) {
        let hint = crate::config::nearest_variable(&name)
            .map(|near| format!(" (did you mean {near}?)"))
            .unwrap_or_default();
        report
            .notes
            .push(format!("{name} is not a setting and is ignored{hint}"));
    }
    let settings = match Settings::load(config, env) {
        Ok(s) => Some(s),
        Err(e) => {
            report.problems.extend(e.0.lines().map(str::to_owned));
            None
        }
    };
    if let Some(s) = &settings {
        report.problems.extend(crate::app::check_before_start(s));
    }
    let prepared = match resources {
        Some(path) => match Prepared::read(path, env) {
            Ok(p) => Some(p),
            Err(e) => {
                report.problems.extend(e.to_string().lines().map(str::to_owned));
                None
            }
        },
        None => None,
    };
    let store = match &settings {
        Some(s) => match open_existing(s).await {
            Ok(Some(store)) => match store.migrations_pending().await {
                Ok(0) => Some(store),
                Ok(n) => {
                    report.notes.push(format!(
                        "the database {} lacks {n} migrations of this aigw (applied at its start); \
                         the resources file was checked against an empty database",
                        database_name(s)
                    ));
                    store.close().await;
                    None
                }
                Err(e) => {
                    report.problems.push(format!("cannot read the database: {e}"));
                    None
                }
            },
            Ok(None) => {
                report.notes.push(format!(
                    "the database {} does not exist yet (the first start creates it)",
                    database_name(s)
                ));
                None
            }
            Err(e) => {
                report.problems.push(format!("cannot open the database: {e}"));
                None
            }
        },
        None => None,
    };
    if let Some(prepared) = &prepared {
        let checked = match &store {
            Some(store) => prepared.check(store).await,
            None => match crate::app::empty_database().await {
                Ok(empty) => {
                    let checked = prepared.check(&empty).await;
                    empty.close().await;
                    checked
                }
                Err(e) => Err(e.into()),
            },
        };
        if let Err(e) = checked {
            report.problems.extend(e.to_string().lines().map(str::to_owned));
        }
    }
    if let Some(store) = store {
        store.close().await;
    }
    report
}
