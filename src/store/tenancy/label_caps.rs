//! Labels per key and their expiry (issue 40 item 3): a new tag value or end user is made under
//! the workspace's caps and under the caps of the API key that brings it (the key is kept on the
//! row); when a request last brought each one is written in batches; upkeep deletes those unseen
//! for a while, and an admin lists and prunes them. A label a policy names, and a tag's `*` row,
//! are never deleted here: the policy's target is their id.

use super::super::{Store, StoreResult};
use super::{LabelCaps, OverCap};

/// Who brings a new label, and the caps it is held to. A cap of 0 means the caller knows it is
/// reached: a new label is refused without counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewLabel {
    /// The API key that brings it.
    pub api_key_id: i64,
    /// The workspace's caps.
    pub workspace: LabelCaps,
    /// The caps on what one key brings (`max_*_per_key`).
    pub per_key: LabelCaps,
}

/// Which cap a new label would pass: the workspace's or its key's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    /// Which kind of cap.
    pub over: OverCap,
    /// The key's own cap (`max_*_per_key`), not the workspace's.
    pub per_key: bool,
}

/// Tag values or end users.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelKind {
    /// Tag values (`tag_values`).
    Tag,
    /// End users (`end_users`).
    EndUser,
}

impl LabelKind {
    /// Its name in the admin API.
    pub fn as_str(self) -> &'static str {
        match self {
            LabelKind::Tag => "tag",
            LabelKind::EndUser => "end_user",
        }
    }

    fn table(self) -> &'static str {
        match self {
            LabelKind::Tag => "tag_values",
            LabelKind::EndUser => "end_users",
        }
    }

    /// The policies' subject that names rows of this table.
    fn subject(self) -> &'static str {
        self.as_str()
    }

    /// What is never deleted: a tag's `*` row and whatever a policy names.
    fn kept(self) -> String {
        let star = match self {
            LabelKind::Tag => "tag_value <> '*' AND ",
            LabelKind::EndUser => "",
        };
        format!(
            "{star}id NOT IN (SELECT target_id FROM policies WHERE subject = '{}')",
            self.subject()
        )
    }
}

/// A label as the admin API lists it.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct LabelRow {
    /// Row id: the subject id of its counters.
    pub id: i64,
    /// The tag's key (tags only).
    pub tag_key: Option<String>,
    /// The tag's value, or the end user's id.
    pub value: String,
    /// The key that brought it first; none when an admin's policy or an older gateway made it.
    pub api_key_id: Option<i64>,
    /// When it was made (Unix ms).
    pub created_at: i64,
    /// When a request last brought it (Unix ms; at most a minute late).
    pub last_seen_at: i64,
}

/// Which labels of a workspace an admin lists or prunes; every field narrows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelFilter {
    /// This one row.
    pub id: Option<i64>,
    /// Brought by this key.
    pub api_key_id: Option<i64>,
    /// Of this tag key (tags only).
    pub tag_key: Option<String>,
    /// This value (a tag's value, or the end user).
    pub value: Option<String>,
    /// Last seen before this instant (Unix ms).
    pub unseen_since: Option<i64>,
}

/// When a row was last seen: its `last_seen_at`, or its `created_at` for a row older than the
/// column (0).
const SEEN: &str = "CASE WHEN last_seen_at > created_at THEN last_seen_at ELSE created_at END";

/// Rows deleted per statement.
const BATCH: i64 = 5_000;

/// A statement's text and its arguments, numbered as written.
struct Sql {
    text: String,
    args: Vec<Arg>,
}

enum Arg {
    Int(i64),
    Text(String),
}

impl Sql {
    fn new(text: impl Into<String>) -> Sql {
        Sql {
            text: text.into(),
            args: Vec::new(),
        }
    }

    /// Appends `before` and the next placeholder.
    fn bind(&mut self, before: &str, arg: Arg) -> &mut Sql {
        self.args.push(arg);
        self.text.push_str(before);
        self.text.push_str(&format!("${}", self.args.len()));
        self
    }

    fn args(&self) -> sqlx::any::AnyArguments<'_> {
        use sqlx::Arguments;
        let mut out = sqlx::any::AnyArguments::default();
        for a in &self.args {
            // Encoding an i64 or a String into `Any` arguments cannot fail.
            let _ = match a {
                Arg::Int(i) => out.add(*i),
                Arg::Text(t) => out.add(t.clone()),
            };
        }
        out
    }
}

impl Store {
    /// The id of tag `key=value` in `ws`: found, or made for `by.api_key_id` if within the
    /// workspace's caps and the key's. Callers serialise the new labels of one workspace on a
    /// gateway, so that a burst counts each one it adds.
    pub async fn admit_tag_value(
        &self,
        ws: i64,
        key: &str,
        value: &str,
        by: NewLabel,
        now: i64,
    ) -> StoreResult<Result<i64, Refused>> {
        let find = || {
            sqlx::query_scalar::<_, i64>(
                "SELECT id FROM tag_values WHERE workspace_id = $1 AND tag_key = $2 AND tag_value = $3",
            )
            .bind(ws)
            .bind(key)
            .bind(value)
            .fetch_optional(self.pool())
        };
        if let Some(id) = find().await? {
            return Ok(Ok(id));
        }
        let refuse = |over, per_key| Ok(Err(Refused { over, per_key }));
        // The workspace's caps.
        if by.workspace.tag_values == 0 {
            return refuse(OverCap::TagValues, false);
        }
        let values: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM tag_values WHERE workspace_id = $1 AND tag_key = $2 AND tag_value <> '*'",
        )
        .bind(ws)
        .bind(key)
        .fetch_one(self.pool())
        .await?;
        if values >= by.workspace.tag_values {
            return refuse(OverCap::TagValues, false);
        }
        if values == 0 {
            if by.workspace.tag_keys == 0 {
                return refuse(OverCap::TagKeys, false);
            }
            let keys: i64 = sqlx::query_scalar(
                "SELECT COUNT(DISTINCT tag_key) FROM tag_values WHERE workspace_id = $1 AND tag_value <> '*'",
            )
            .bind(ws)
            .fetch_one(self.pool())
            .await?;
            if keys >= by.workspace.tag_keys {
                return refuse(OverCap::TagKeys, false);
            }
        }
        // The key's: values of this tag key it brought, and tag keys among all it brought.
        if by.per_key.tag_values == 0 {
            return refuse(OverCap::TagValues, true);
        }
        let mine: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM tag_values WHERE workspace_id = $1 AND api_key_id = $2 AND tag_key = $3",
        )
        .bind(ws)
        .bind(by.api_key_id)
        .bind(key)
        .fetch_one(self.pool())
        .await?;
        if mine >= by.per_key.tag_values {
            return refuse(OverCap::TagValues, true);
        }
        if mine == 0 {
            if by.per_key.tag_keys == 0 {
                return refuse(OverCap::TagKeys, true);
            }
            let keys: i64 = sqlx::query_scalar(
                "SELECT COUNT(DISTINCT tag_key) FROM tag_values WHERE workspace_id = $1 AND api_key_id = $2",
            )
            .bind(ws)
            .bind(by.api_key_id)
            .fetch_one(self.pool())
            .await?;
            if keys >= by.per_key.tag_keys {
                return refuse(OverCap::TagKeys, true);
            }
        }
        sqlx::query(
            "INSERT INTO tag_values (workspace_id, tag_key, tag_value, created_at, api_key_id, last_seen_at)
             VALUES ($1, $2, $3, $4, $5, $4)
             ON CONFLICT (workspace_id, tag_key, tag_value) DO NOTHING",
        )
        .bind(ws)
        .bind(key)
        .bind(value)
        .bind(now)
        .bind(by.api_key_id)
        .execute(self.pool())
        .await?;
        Ok(Ok(find().await?.unwrap_or_default()))
    }

    /// The id of end user `end_user` in `ws`: found, or made for `by.api_key_id` if within the
    /// workspace's caps and the key's (serialised by the caller, as [`Store::admit_tag_value`]).
    pub async fn admit_end_user(
        &self,
        ws: i64,
        end_user: &str,
        by: NewLabel,
        now: i64,
    ) -> StoreResult<Result<i64, Refused>> {
        let find = || {
            sqlx::query_scalar::<_, i64>("SELECT id FROM end_users WHERE workspace_id = $1 AND end_user = $2")
                .bind(ws)
                .bind(end_user)
                .fetch_optional(self.pool())
        };
        if let Some(id) = find().await? {
            return Ok(Ok(id));
        }
        let refuse = |per_key| {
            Ok(Err(Refused {
                over: OverCap::EndUsers,
                per_key,
            }))
        };
        if by.workspace.end_users == 0 {
            return refuse(false);
        }
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM end_users WHERE workspace_id = $1")
            .bind(ws)
            .fetch_one(self.pool())
            .await?;
        if n >= by.workspace.end_users {
            return refuse(false);
        }
        if by.per_key.end_users == 0 {
            return refuse(true);
        }
        let mine: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM end_users WHERE workspace_id = $1 AND api_key_id = $2")
                .bind(ws)
                .bind(by.api_key_id)
                .fetch_one(self.pool())
                .await?;
        if mine >= by.per_key.end_users {
            return refuse(true);
        }
        sqlx::query(
            "INSERT INTO end_users (workspace_id, end_user, created_at, api_key_id, last_seen_at)
             VALUES ($1, $2, $3, $4, $3)
             ON CONFLICT (workspace_id, end_user) DO NOTHING",
        )
        .bind(ws)
        .bind(end_user)
        .bind(now)
        .bind(by.api_key_id)
        .execute(self.pool())
        .await?;
        Ok(Ok(find().await?.unwrap_or_default()))
    }

    /// Notes when labels of `kind` were last seen: `seen` pairs an id with the instant (Unix ms),
    /// one statement per instant and 500 ids. Returns the ids no longer stored (pruned or
    /// expired meanwhile), for the caller to forget.
    pub async fn touch_labels(&self, kind: LabelKind, seen: &[(i64, i64)]) -> StoreResult<Vec<i64>> {
        let mut by_instant: std::collections::BTreeMap<i64, Vec<i64>> = Default::default();
        for (id, at) in seen {
            by_instant.entry(*at).or_default().push(*id);
        }
        let table = kind.table();
        let mut gone = Vec::new();
        for (at, ids) in by_instant {
            for chunk in ids.chunks(500) {
                let list = placeholders(2, chunk.len());
                let sql = format!(
                    "UPDATE {table} SET last_seen_at = CASE WHEN last_seen_at > $1 THEN last_seen_at ELSE $1 END
                     WHERE id IN ({list})"
                );
                let mut q = sqlx::query(&sql).bind(at);
                for id in chunk {
                    q = q.bind(*id);
                }
                let n = q.execute(self.pool()).await?.rows_affected();
                if n < chunk.len() as u64 {
                    let sql = format!(
                        "SELECT id FROM {table} WHERE id IN ({})",
                        placeholders(1, chunk.len())
                    );
                    let mut q = sqlx::query_scalar::<_, i64>(&sql);
                    for id in chunk {
                        q = q.bind(*id);
                    }
                    let there: std::collections::HashSet<i64> =
                        q.fetch_all(self.pool()).await?.into_iter().collect();
                    gone.extend(chunk.iter().filter(|id| !there.contains(id)));
                }
            }
        }
        Ok(gone)
    }

    /// Deletes the labels of `kind`, in every workspace, last seen before `before` (Unix ms),
    /// batch by batch, but never one a policy names nor a tag's `*` row. Returns their ids.
    pub async fn delete_unseen_labels(&self, kind: LabelKind, before: i64) -> StoreResult<Vec<i64>> {
        // Seen before `before`: both instants are (the index on last_seen_at narrows it).
        let mut sql = Sql::new(format!(
            "SELECT id FROM {} WHERE {} AND ",
            kind.table(),
            kind.kept()
        ));
        sql.bind("last_seen_at < ", Arg::Int(before));
        sql.bind(" AND created_at < ", Arg::Int(before));
        self.delete_batches(kind, sql).await
    }

    /// Deletes the labels of `kind` in workspace `ws` that `filter` selects, never one a policy
    /// names nor a tag's `*` row. Returns their ids.
    pub async fn prune_labels(
        &self,
        ws: i64,
        kind: LabelKind,
        filter: &LabelFilter,
    ) -> StoreResult<Vec<i64>> {
        let sql = selection(
            format!("SELECT id FROM {} WHERE {} AND ", kind.table(), kind.kept()),
            ws,
            kind,
            filter,
        );
        self.delete_batches(kind, sql).await
    }

    /// Deletes the rows whose ids `select` lists, [`BATCH`] at a time.
    async fn delete_batches(&self, kind: LabelKind, mut select: Sql) -> StoreResult<Vec<i64>> {
        select.bind(" LIMIT ", Arg::Int(BATCH));
        let sql = format!(
            "DELETE FROM {} WHERE id IN (SELECT id FROM ({}) AS doomed) RETURNING id",
            kind.table(),
            select.text
        );
        let mut gone = Vec::new();
        loop {
            let ids: Vec<i64> = sqlx::query_scalar_with(&sql, select.args())
                .fetch_all(self.pool())
                .await?;
            let n = ids.len();
            gone.extend(ids);
            if n < BATCH as usize {
                return Ok(gone);
            }
        }
    }

    /// The labels of `kind` in workspace `ws` that `filter` selects, least recently seen first,
    /// at most `limit`, and how many there are in all.
    pub async fn labels_in(
        &self,
        ws: i64,
        kind: LabelKind,
        filter: &LabelFilter,
        limit: i64,
    ) -> StoreResult<(Vec<LabelRow>, i64)> {
        let columns = match kind {
            LabelKind::Tag => "tag_key, tag_value AS value",
            LabelKind::EndUser => "CAST(NULL AS TEXT) AS tag_key, end_user AS value",
        };
        let mut list = selection(
            format!(
                "SELECT id, {columns}, api_key_id, created_at, {SEEN} AS last_seen_at FROM {} WHERE ",
                kind.table()
            ),
            ws,
            kind,
            filter,
        );
        list.text.push_str(&format!(" ORDER BY {SEEN}, id"));
        list.bind(" LIMIT ", Arg::Int(limit));
        let rows = sqlx::query_as_with::<_, LabelRow, _>(&list.text, list.args())
            .fetch_all(self.pool())
            .await?;
        let count = selection(
            format!("SELECT CAST(COUNT(*) AS BIGINT) FROM {} WHERE ", kind.table()),
            ws,
            kind,
            filter,
        );
        let total: i64 = sqlx::query_scalar_with(&count.text, count.args())
            .fetch_one(self.pool())
            .await?;
        Ok((rows, total))
    }
}

/// `head` followed by the conditions of `filter` on workspace `ws` (a tag's `*` row is never
/// listed: it is a policy's target, not a label a request brought).
fn selection(head: String, ws: i64, kind: LabelKind, filter: &LabelFilter) -> Sql {
    let mut sql = Sql::new(head);
    sql.bind("workspace_id = ", Arg::Int(ws));
    if kind == LabelKind::Tag {
        sql.text.push_str(" AND tag_value <> '*'");
    }
    if let Some(id) = filter.id {
        sql.bind(" AND id = ", Arg::Int(id));
    }
    if let Some(k) = filter.api_key_id {
        sql.bind(" AND api_key_id = ", Arg::Int(k));
    }
    if let (Some(k), LabelKind::Tag) = (&filter.tag_key, kind) {
        sql.bind(" AND tag_key = ", Arg::Text(k.clone()));
    }
    if let Some(v) = &filter.value {
        let column = match kind {
            LabelKind::Tag => " AND tag_value = ",
            LabelKind::EndUser => " AND end_user = ",
        };
        sql.bind(column, Arg::Text(v.clone()));
    }
    if let Some(t) = filter.unseen_since {
        sql.bind(" AND last_seen_at < ", Arg::Int(t));
        sql.bind(" AND created_at < ", Arg::Int(t));
    }
    sql
}

/// `IN (…)` of `n` placeholders from `$first`.
fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}
