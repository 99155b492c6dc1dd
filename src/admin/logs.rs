//! Request logs (DESIGN.md §7) and usage aggregates for the console's charts.
//! A member reads only their own logs and usage; owners and admins the whole workspace.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use chrono::{Offset, TimeZone};
use serde::Deserialize;
use serde_json::{Value, json};

use super::session::Actor;
use super::{AdminResult, Params, PathText, store_error};
use crate::error::ApiError;
use crate::kernel::credits::micros_to_credits;
use crate::request_log::{LogFilter, LogPage, LogRecord};
use crate::state::AppState;
use crate::store::{
    AdminStore, ApiKeyRow, Department, MemberRow, ModelRow, RequestLogStore, Table, UsageGrouping, UsageRow,
};

use crate::kernel::tags;

/// The filter as the actor may use it: always their workspace; a member always their own logs.
fn scoped(actor: &Actor, mut f: LogFilter) -> AdminResult<LogFilter> {
    f.workspace_id = actor.workspace_id();
    if !actor.manages() {
        if f.member_id.is_some_and(|m| m != actor.member.id) {
            return Err(ApiError::Forbidden {
                message: "a member reads only their own logs".into(),
            });
        }
        f.member_id = Some(actor.member.id);
    }
    if let Some(s) = &f.source
        && !matches!(s.as_str(), "gateway" | "upstream")
    {
        return Err(ApiError::field("source", "source must be gateway or upstream"));
    }
    if let Some(t) = &f.tag
        && !t
            .split_once('=')
            .is_some_and(|(k, v)| tags::valid_key(k) && tags::valid_value(v))
    {
        return Err(ApiError::field(
            "tag",
            "tag must be `key=value`, e.g. team=search",
        ));
    }
    // A request id pasted with the header's name or spaces around it still finds the request.
    f.request_id = f
        .request_id
        .map(|id| {
            let id = id.trim();
            id.strip_prefix("x-request-id:").unwrap_or(id).trim().to_owned()
        })
        .filter(|id| !id.is_empty());
    if f.limit.is_some_and(|l| !(1..=500).contains(&l)) {
        return Err(ApiError::field("limit", "limit must be between 1 and 500"));
    }
    Ok(f)
}

/// `GET /admin/v1/logs`: newest first, filtered, one page; `next_cursor` fetches the next.
pub async fn list(State(state): State<AppState>, actor: Actor, Params(f): Params<LogFilter>) -> AdminResult {
    let page = state.store.logs(&scoped(&actor, f)?).await.map_err(store_error)?;
    let data: Vec<Value> = page.items.iter().map(log_json).collect();
    Ok(Json(json!({"data": data, "next_cursor": page.next_cursor})).into_response())
}

/// `GET /admin/v1/logs/{request_id}`.
pub async fn get(State(state): State<AppState>, actor: Actor, PathText(request_id): PathText) -> AdminResult {
    let r = state
        .store
        .log_by_request_id(actor.workspace_id(), &request_id)
        .await
        .map_err(store_error)?
        .filter(|r| actor.manages() || r.member_id == actor.member.id)
        .ok_or(ApiError::NotFound { what: "request log" })?;
    Ok(Json(log_json(&r)).into_response())
}

/// A log as the API shows it: credits in credits (like every other admin answer, not the stored
/// micro-credits), flags as booleans.
fn log_json(r: &LogRecord) -> Value {
    let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
    v["credits"] = json!(micros_to_credits(r.credits));
    v["stream"] = json!(r.stream == 1);
    v["usage_estimated"] = json!(r.usage_estimated == 1);
    v
}

/// 9999-12-31T23:59:59.999Z, the last instant a usage report reaches.
const LAST_INSTANT_MS: i64 = 253_402_300_799_999;

/// Rows at most in one CSV export.
const EXPORT_MAX_ROWS: usize = 100_000;

/// `GET /admin/v1/logs/export`: the filtered logs as CSV (at most 100,000 rows, newest first),
/// streamed a page at a time: the gateway holds one page of 500 rows, never the whole export.
/// The first page is read before answering, so that a database that fails is an error status;
/// a later failure ends the download short (and is logged).
pub async fn export(
    State(state): State<AppState>,
    actor: Actor,
    Params(f): Params<LogFilter>,
) -> AdminResult {
    let mut f = scoped(&actor, f)?;
    f.limit = Some(500);
    let first = state.store.logs(&f).await.map_err(store_error)?;
    let pages = ExportPages {
        store: state.store.clone(),
        filter: f,
        rows: 0,
        first: Some(first),
        done: false,
    };
    let body = futures::stream::unfold(pages, |mut p| async move {
        if p.done {
            return None;
        }
        let page = match p.first.take() {
            Some(page) => page,
            // The body is polled where the connection is served: the page is read on the
            // store's own runtime (`Store::at_home`).
            None => match p
                .store
                .at_home({
                    let filter = p.filter.clone();
                    |s| async move { s.logs(&filter).await }
                })
                .await
            {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(error = %e, rows = p.rows, "the CSV export stopped short: reading the logs failed");
                    return None;
                }
            },
        };
        let mut out = String::new();
        if p.rows == 0 {
            out.push_str(CSV_HEADER);
            out.push('\n');
        }
        for r in &page.items {
            csv_row(&mut out, r);
        }
        p.rows += page.items.len();
        match page.next_cursor {
            Some(c) if p.rows < EXPORT_MAX_ROWS => p.filter.cursor = Some(c),
            _ => p.done = true,
        }
        Some((Ok::<_, std::io::Error>(bytes::Bytes::from(out)), p))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"aigw-logs.csv\"",
            ),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response())
}

/// Where a streamed export is: the filter with the next page's cursor, the rows written, the
/// first page (read before answering).
struct ExportPages {
    store: crate::store::Store,
    filter: LogFilter,
    rows: usize,
    first: Option<LogPage>,
    done: bool,
}

const CSV_HEADER: &str = "id,request_id,ts,key_id,member_id,department_id,endpoint,model_requested,model_served,\
upstream_id,attempts,status,code,source,explanation,stream,prompt_tokens,completion_tokens,total_tokens,credits,\
usage_estimated,latency_ms,ttfb_ms,upstream_latency_ms,would_refuse,tags,end_user";

fn csv_row(out: &mut String, r: &LogRecord) {
    let opt = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_default();
    let fields = [
        r.id.to_string(),
        csv_text(&r.request_id),
        r.ts.to_string(),
        r.key_id.to_string(),
        r.member_id.to_string(),
        opt(r.department_id),
        csv_text(&r.endpoint),
        csv_text(r.model_requested.as_deref().unwrap_or("")),
        csv_text(r.model_served.as_deref().unwrap_or("")),
        opt(r.upstream_id),
        r.attempts.to_string(),
        r.status.to_string(),
        csv_text(r.code.as_deref().unwrap_or("")),
        csv_text(r.source.as_deref().unwrap_or("")),
        csv_text(&r.explanation),
        r.stream.to_string(),
        r.prompt_tokens.to_string(),
        r.completion_tokens.to_string(),
        r.total_tokens.to_string(),
        micros_to_credits(r.credits).to_string(),
        r.usage_estimated.to_string(),
        r.latency_ms.to_string(),
        opt(r.ttfb_ms),
        opt(r.upstream_latency_ms),
        csv_text(r.would_refuse.as_deref().unwrap_or("")),
        csv_text(r.tags.as_deref().unwrap_or("")),
        csv_text(r.end_user.as_deref().unwrap_or("")),
    ];
    out.push_str(&fields.join(","));
    out.push('\n');
}

/// Leading characters that make a spreadsheet read a cell as a formula (OWASP CSV injection):
/// `=`, `+`, `-`, `@`, and TAB and CR, which some spreadsheets skip before looking for one.
const FORMULA_STARTS: [char; 6] = ['=', '+', '-', '@', '\t', '\r'];

/// RFC 4180 quoting; a cell starting with one of [`FORMULA_STARTS`] is prefixed with `'` so a
/// spreadsheet shows it as text instead of running it.
fn csv_text(v: &str) -> String {
    let v = if v.starts_with(FORMULA_STARTS) {
        format!("'{v}")
    } else {
        v.to_owned()
    };
    if v.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    #[serde(default)]
    by: Option<String>,
    /// Unix ms, inclusive; default 30 days before `to`.
    #[serde(default)]
    from: Option<i64>,
    /// Unix ms, exclusive; default now.
    #[serde(default)]
    to: Option<i64>,
    /// With `by=tag`: the tag key whose values group the usage.
    #[serde(default)]
    tag_key: Option<String>,
}

/// `GET /admin/v1/usage?by=day|key|member|dept|model&from&to`: requests, tokens and credits per
/// group, from the request logs (a member: their own). Days are the workspace's calendar days
/// (at its current UTC offset).
pub async fn usage(
    State(state): State<AppState>,
    actor: Actor,
    Params(q): Params<UsageQuery>,
) -> AdminResult {
    let by_name = q.by.as_deref().unwrap_or("day");
    let tag_key = match (by_name, q.tag_key.as_deref()) {
        ("tag", Some(k)) if tags::valid_key(k) => Some(k),
        ("tag", _) => {
            return Err(ApiError::field(
                "tag_key",
                "by=tag needs tag_key, a tag key (e.g. team)",
            ));
        }
        (_, Some(_)) => return Err(ApiError::field("tag_key", "tag_key goes with by=tag")),
        _ => None,
    };
    let by: UsageGrouping = match tag_key {
        // Grouped by the tag's values below; the grouping is a placeholder.
        Some(_) => UsageGrouping::Model,
        None => by_name
            .parse()
            .map_err(|m: String| ApiError::field("by", format!("{m}, or tag with tag_key")))?,
    };
    let now = state.clock.now();
    let to = q.to.unwrap_or(now.timestamp_millis() + 1);
    // Saturating: `to` comes from the query, and near i64::MIN the subtraction would overflow.
    let from = q.from.unwrap_or(to.saturating_sub(30 * 86_400_000));
    if from >= to {
        return Err(ApiError::field("from", "from must be before to"));
    }
    // No log is older than 1970 or later than the year 9999: the range is clamped to that, so
    // that the hour and day arithmetic below never meets an absurd instant.
    let (from, to) = (from.clamp(0, LAST_INSTANT_MS), to.clamp(0, LAST_INSTANT_MS));
    if from >= to {
        return Err(ApiError::field("from", "from must be before to"));
    }
    let ws = actor.workspace_id();
    let tz = state.timezone_of(ws);
    let offset_ms = i64::from(
        tz.offset_from_utc_datetime(&now.naive_utc())
            .fix()
            .local_minus_utc(),
    ) * 1000;
    let member = (!actor.manages()).then_some(actor.member.id);
    if let Some(key) = tag_key {
        let rows = state
            .store
            .usage_by_tag(ws, member, from, to, key)
            .await
            .map_err(store_error)?;
        let data: Vec<Value> = rows.iter().map(|r| usage_json(r, &r.group_key)).collect();
        return Ok(
            Json(json!({"by": by_name, "tag_key": key, "from": from, "to": to, "data": data}))
                .into_response(),
        );
    }
    let mut rows = state
        .store
        .usage(ws, member, from, to, by, offset_ms)
        .await
        .map_err(store_error)?;
    let store = &state.store;
    if by == UsageGrouping::Model {
        let models: Vec<ModelRow> = store.rows_in(Table::Models, ws).await.map_err(store_error)?;
        rows = by_real_model(rows, &models);
    }
    // The rows the labels need: looked up by id when they are few (a member's own report by
    // key names two or three keys), the whole table otherwise (a report by key over a
    // workspace of 100,000 keys has as many rows to label).
    let (keys, members, depts) = {
        use rustc_hash::FxHashMap;
        let mut ids: Vec<i64> = rows.iter().filter_map(|r| r.group_key.parse().ok()).collect();
        ids.sort_unstable();
        ids.dedup();
        let keys: Vec<ApiKeyRow> = if by == UsageGrouping::Key {
            labelled(store, Table::ApiKeys, ws, &ids)
                .await
                .map_err(store_error)?
        } else {
            Vec::new()
        };
        let members: Vec<MemberRow> = match by {
            UsageGrouping::Key => {
                let mut owners: Vec<i64> = keys.iter().map(|k| k.member_id).collect();
                owners.sort_unstable();
                owners.dedup();
                labelled(store, Table::Members, ws, &owners)
                    .await
                    .map_err(store_error)?
            }
            UsageGrouping::Member => labelled(store, Table::Members, ws, &ids)
                .await
                .map_err(store_error)?,
            _ => Vec::new(),
        };
        let depts: Vec<Department> = if by == UsageGrouping::Dept {
            labelled(store, Table::Departments, ws, &ids)
                .await
                .map_err(store_error)?
        } else {
            Vec::new()
        };
        (
            keys.into_iter()
                .map(|k| (k.id, (k.member_id, k.name)))
                .collect::<FxHashMap<_, _>>(),
            members
                .into_iter()
                .map(|m| (m.id, m.email))
                .collect::<FxHashMap<_, _>>(),
            depts
                .into_iter()
                .map(|d| (d.id, d.name))
                .collect::<FxHashMap<_, _>>(),
        )
    };
    let email = |id: i64| members.get(&id).cloned();
    let data: Vec<Value> = rows
        .iter()
        .map(|r| {
            let id: Option<i64> = r.group_key.parse().ok();
            let label = match by {
                UsageGrouping::Day => id
                    .and_then(|d| chrono::DateTime::from_timestamp(d * 86_400, 0))
                    .map(|t| t.format("%Y-%m-%d").to_string()),
                UsageGrouping::Key => id
                    .and_then(|id| keys.get(&id))
                    .map(|(member, name)| format!("{}/{name}", email(*member).unwrap_or_default())),
                UsageGrouping::Member => id.and_then(email),
                UsageGrouping::Dept => id
                    .and_then(|id| depts.get(&id))
                    .cloned()
                    .or(Some("(no department)".into())),
                UsageGrouping::Model if r.group_key.is_empty() => Some(OTHER_MODELS.into()),
                UsageGrouping::Model => Some(r.group_key.clone()),
            };
            usage_json(r, &label.unwrap_or_else(|| r.group_key.clone()))
        })
        .collect();
    Ok(Json(json!({"by": by_name, "from": from, "to": to, "data": data})).into_response())
}

/// The rows of `table` with `ids` when they are at most a few hundred, else all of the
/// workspace's (one query rather than one per few hundred ids).
async fn labelled<T>(
    store: &crate::store::Store,
    table: Table,
    ws: i64,
    ids: &[i64],
) -> crate::store::StoreResult<Vec<T>>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::any::AnyRow> + Send + Unpin,
{
    if ids.len() > 500 {
        store.rows_in(table, ws).await
    } else {
        store.rows_with_ids(table, ws, ids).await
    }
}

/// One group of a usage report.
fn usage_json(r: &UsageRow, label: &str) -> Value {
    json!({
        "group": r.group_key,
        "label": label,
        "requests": r.requests,
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "total_tokens": r.total_tokens,
        "credits": micros_to_credits(r.credits),
    })
}

/// The label of the usage no model of the workspace accounts for.
const OTHER_MODELS: &str = "Unknown or no model";

/// Usage by model as a reader means it: one row per model that served requests or that the
/// workspace has (a request for it that nothing served counts there too), and one last row,
/// group `""`, for requests that named no model or one the workspace does not have.
fn by_real_model(rows: Vec<UsageRow>, models: &[ModelRow]) -> Vec<UsageRow> {
    let mut named: Vec<UsageRow> = Vec::new();
    let mut other: Option<UsageRow> = None;
    let served: Vec<&str> = rows
        .iter()
        .filter_map(|r| r.group_key.strip_prefix("served:"))
        .collect();
    let real = |m: &str| served.contains(&m) || models.iter().any(|x| x.name == m);
    for r in &rows {
        let (served, name) = match r.group_key.split_once(':') {
            Some(("served", m)) => (true, m),
            Some((_, m)) => (false, m),
            None => (false, r.group_key.as_str()),
        };
        let group = if served || (!name.is_empty() && real(name)) {
            name
        } else {
            ""
        };
        let slot = if group.is_empty() {
            other.get_or_insert_with(|| UsageRow::empty(""))
        } else if let Some(i) = named.iter().position(|n| n.group_key == group) {
            &mut named[i]
        } else {
            named.push(UsageRow::empty(group));
            named.last_mut().expect("just pushed")
        };
        slot.add(r);
    }
    named.sort_by(|a, b| a.group_key.cmp(&b.group_key));
    named.extend(other);
    named
}

#[cfg(test)]
mod tests {
    use super::{by_real_model, csv_text};
    use crate::store::{ModelRow, UsageRow};

    /// Each case: the groups the store answered (with their request counts) and what the
    /// reader gets; the workspace has the models "current" and "idle".
    #[test]
    fn usage_by_model_keeps_real_models_and_gathers_the_rest() {
        let model = |name: &str| ModelRow {
            id: 1,
            workspace_id: 1,
            name: name.into(),
            fallbacks: "[]".into(),
            price_prompt: 0,
            price_completion: 0,
            created_at: 0,
            max_output_tokens: None,
        };
        let models = [model("current"), model("idle")];
        type Groups<'a> = &'a [(&'a str, i64)];
        let cases: [(Groups, Groups); 5] = [
            (&[("served:current", 2)], &[("current", 2)]),
            // Asked for a model of the workspace that nothing served: still that model.
            (&[("asked:current", 1), ("served:current", 2)], &[("current", 3)]),
            (&[("asked:idle", 1)], &[("idle", 1)]),
            // A deleted model that served requests keeps its row, unserved ones included.
            (&[("asked:deleted", 1), ("served:deleted", 4)], &[("deleted", 5)]),
            // No model, or one that never existed: one row, last.
            (
                &[("asked:", 1), ("asked:no-such-model", 2), ("served:current", 1)],
                &[("current", 1), ("", 3)],
            ),
        ];
        for (groups, expected) in cases {
            let rows = groups
                .iter()
                .map(|(g, n)| UsageRow {
                    requests: *n,
                    ..UsageRow::empty(g)
                })
                .collect();
            let got: Vec<(String, i64)> = by_real_model(rows, &models)
                .into_iter()
                .map(|r| (r.group_key, r.requests))
                .collect();
            let want: Vec<(String, i64)> = expected.iter().map(|(g, n)| ((*g).to_owned(), *n)).collect();
            assert_eq!(got, want, "{groups:?}");
        }
    }

    /// OWASP CSV injection: a cell a spreadsheet would read as a formula (or that starts with a
    /// character some spreadsheets strip before reading one) is prefixed with `'`; RFC 4180
    /// quoting is kept.
    #[test]
    fn text_cells_are_neutralised_and_quoted() {
        let cases = [
            ("plain", "plain"),
            ("", ""),
            ("gpt-4o-mini", "gpt-4o-mini"),
            ("=1+2", "'=1+2"),
            ("+1", "'+1"),
            ("-1", "'-1"),
            ("@SUM(A1)", "'@SUM(A1)"),
            ("\t=1+2", "'\t=1+2"),
            ("\tx", "'\tx"),
            ("\r=1+2", "\"'\r=1+2\""),
            ("\rx", "\"'\rx\""),
            (
                "=HYPERLINK(\"http://x\",\"y\")",
                "\"'=HYPERLINK(\"\"http://x\"\",\"\"y\"\")\"",
            ),
            ("a,b", "\"a,b\""),
            ("say \"hi\"", "\"say \"\"hi\"\"\""),
            ("line\nbreak", "\"line\nbreak\""),
            ("a=b", "a=b"),
        ];
        for (cell, written) in cases {
            assert_eq!(csv_text(cell), written, "{cell:?}");
        }
    }
}
