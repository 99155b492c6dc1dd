//! Reading the file's TOML into its shape ([`super::spec`]) entry by entry, so that every entry
//! with an unknown field, a missing one or a value of the wrong type is named, each with its
//! line, not only the first; a mistyped table or field name gets the one it most likely meant.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::spec::ResourcesFile;
use super::{Ctx, ResourcesError};

/// The tables of the file, in the order they are checked.
pub(super) const TABLES: [&str; 7] = [
    "workspace",
    "department",
    "member",
    "api_key",
    "upstream",
    "model",
    "policy",
];

/// Where the entries' field lists are documented, for a field too far from any to guess.
const FIELDS_DOC: &str = "docs/resources.md lists the fields of each entry";

/// The file's tables as written, each entry still a TOML table with its place in the file.
#[derive(Deserialize)]
struct RawFile {
    #[serde(default)]
    workspace: Vec<toml::Spanned<toml::Table>>,
    #[serde(default)]
    department: Vec<toml::Spanned<toml::Table>>,
    #[serde(default)]
    member: Vec<toml::Spanned<toml::Table>>,
    #[serde(default)]
    api_key: Vec<toml::Spanned<toml::Table>>,
    #[serde(default)]
    upstream: Vec<toml::Spanned<toml::Table>>,
    #[serde(default)]
    model: Vec<toml::Spanned<toml::Table>>,
    #[serde(default)]
    policy: Vec<toml::Spanned<toml::Table>>,
}

/// Parses `ctx.text`: a syntax error is one error; otherwise every unknown table and every entry
/// that does not fit its shape is reported together.
pub(super) fn parse(ctx: &Ctx<'_>) -> Result<ResourcesFile, ResourcesError> {
    let parse_error = |e: toml::de::Error| ResourcesError::Parse {
        path: ctx.path.to_owned(),
        message: e.to_string(),
    };
    let top: BTreeMap<String, toml::Spanned<toml::Value>> = toml::from_str(ctx.text).map_err(parse_error)?;
    let mut problems = Vec::new();
    for (name, value) in &top {
        if TABLES.contains(&name.as_str()) {
            continue;
        }
        let said = match crate::kernel::suggest::nearest(name, TABLES) {
            Some(near) => format!("unknown field `{name}` (did you mean `{near}`?)"),
            None => format!(
                "unknown field `{name}` (the tables are {})",
                TABLES.map(|t| format!("[[{t}]]")).join(", ")
            ),
        };
        problems.push(ResourcesError::Parse {
            path: ctx.path.to_owned(),
            message: format!("line {}: {said}", ctx.line_of(value.span().start)),
        });
    }
    let raw: RawFile = toml::from_str(ctx.text).map_err(parse_error)?;
    let mut file = ResourcesFile::default();
    entries(
        ctx,
        "workspace",
        raw.workspace,
        &mut file.workspace,
        &mut problems,
    );
    entries(
        ctx,
        "department",
        raw.department,
        &mut file.department,
        &mut problems,
    );
    entries(ctx, "member", raw.member, &mut file.member, &mut problems);
    entries(ctx, "api_key", raw.api_key, &mut file.api_key, &mut problems);
    entries(ctx, "upstream", raw.upstream, &mut file.upstream, &mut problems);
    entries(ctx, "model", raw.model, &mut file.model, &mut problems);
    entries(ctx, "policy", raw.policy, &mut file.policy, &mut problems);
    match ResourcesError::many(problems) {
        None => Ok(file),
        Some(e) => Err(e),
    }
}

/// Each entry of `table` into its spec type, or a problem naming the entry, the field and its
/// line.
fn entries<T: DeserializeOwned>(
    ctx: &Ctx<'_>,
    table: &str,
    raw: Vec<toml::Spanned<toml::Table>>,
    out: &mut Vec<T>,
    problems: &mut Vec<ResourcesError>,
) {
    for (i, entry) in raw.into_iter().enumerate() {
        let span = entry.span();
        let fields = entry.into_inner();
        let label = label(table, &fields);
        match T::deserialize(toml::Value::Table(fields)) {
            Ok(spec) => out.push(spec),
            Err(e) => {
                let message = crate::kernel::suggest::unknown_field(e.to_string().trim(), 12, FIELDS_DOC);
                // serde names the field a wrong value was in as "…\nin `field`".
                let (message, field) = match message.rsplit_once("\nin `") {
                    Some((m, f)) => (m.to_owned(), f.strip_suffix('`').map(str::to_owned)),
                    None => (message.clone(), quoted_field(&message)),
                };
                let line = field
                    .as_deref()
                    .and_then(|f| ctx.field_line(span.clone(), f))
                    .unwrap_or_else(|| ctx.line_of(span.start));
                let message = match field {
                    Some(f) if !message.contains(&format!("`{f}`")) => format!("{f}: {message}"),
                    _ => message,
                };
                problems.push(ctx.entry_at(table, i, &label, line, message));
            }
        }
    }
}

/// The field a message names first in backquotes (`unknown field `x``, `missing field `x``).
fn quoted_field(message: &str) -> Option<String> {
    let start = message.find('`')? + 1;
    let end = message[start..].find('`')? + start;
    Some(message[start..end].to_owned())
}

/// How an entry is named in messages, from what it holds.
fn label(table: &str, fields: &toml::Table) -> String {
    let text = |k: &str| fields.get(k).and_then(toml::Value::as_str);
    match table {
        "member" => text("email"),
        "api_key" => {
            return format!(
                "{}/{}",
                text("member").unwrap_or("?"),
                text("name").unwrap_or("?")
            );
        }
        "policy" => {
            return format!(
                "{} {}",
                text("subject").unwrap_or("?"),
                text("target").unwrap_or("?")
            );
        }
        _ => text("name"),
    }
    .unwrap_or("?")
    .to_owned()
}

#[cfg(test)]
mod tests {
    use super::super::spec::{
        AlertsSpec, ApiKeySpec, DepartmentSpec, LimitsSpec, MemberSpec, ModelSpec, PolicySpec, PriceSpec,
        UpstreamSpec, WorkspaceSpec,
    };
    use super::*;

    /// The fields of `T`, as serde names them: the list its refusal of an unknown field gives.
    fn fields_of<T: DeserializeOwned>() -> Vec<String> {
        let mut probe = toml::Table::new();
        probe.insert("\u{1}probe".into(), toml::Value::Integer(0));
        let message = T::deserialize(toml::Value::Table(probe))
            .err()
            .expect("an unknown field is refused")
            .to_string();
        let expected = message.split_once("expected").expect("a list of fields").1;
        let mut names: Vec<String> = expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        names.sort_unstable();
        names
    }

    /// The first column of the table under `## \`[[table]]\`` in docs/resources.md.
    fn documented(doc: &str, table: &str) -> Vec<String> {
        let heading = format!("## `[[{table}]]`");
        let start = doc
            .find(&heading)
            .unwrap_or_else(|| panic!("no section {heading}"));
        let mut names: Vec<String> = doc[start..]
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .map(|l| {
                l.split('|')
                    .nth(1)
                    .unwrap_or("")
                    .trim()
                    .trim_matches('`')
                    .to_owned()
            })
            .collect();
        names.sort_unstable();
        names
    }

    /// docs/resources.md lists every table of the file and every field of each entry (nested
    /// ones as `limits.requests_per_minute`), no more and no fewer: a field added to the spec
    /// without its line in the reference fails here.
    #[test]
    fn the_reference_lists_every_field_of_every_entry() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/resources.md"))
            .expect("docs/resources.md");
        let with = |mut top: Vec<String>, nested: &[(&str, Vec<String>)]| {
            for (parent, fields) in nested {
                top.extend(fields.iter().map(|f| format!("{parent}.{f}")));
            }
            top.sort_unstable();
            top
        };
        let cases: [(&str, Vec<String>); 7] = [
            ("workspace", fields_of::<WorkspaceSpec>()),
            ("department", fields_of::<DepartmentSpec>()),
            ("member", fields_of::<MemberSpec>()),
            ("api_key", fields_of::<ApiKeySpec>()),
            (
                "upstream",
                with(
                    fields_of::<UpstreamSpec>(),
                    &[("limits", fields_of::<LimitsSpec>())],
                ),
            ),
            (
                "model",
                with(fields_of::<ModelSpec>(), &[("price", fields_of::<PriceSpec>())]),
            ),
            (
                "policy",
                with(
                    fields_of::<PolicySpec>(),
                    &[("alerts", fields_of::<AlertsSpec>())],
                ),
            ),
        ];
        assert_eq!(
            cases.each_ref().map(|(t, _)| *t),
            TABLES,
            "a table of the file without its case here"
        );
        for (table, fields) in cases {
            assert!(fields.len() >= 2, "{table}: {fields:?}");
            assert_eq!(documented(&doc, table), fields, "docs/resources.md, [[{table}]]");
        }
    }
}
