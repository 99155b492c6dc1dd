//! The rollups' sums of the logs a gateway stored and has not yet written to the rollups
//! ([`RollupSums`]), and their upsert: the write side of the usage rollups (the tables and how
//! reports read them: `usage_rollup.rs`).

use std::collections::BTreeMap;

use super::usage_rollup::{DAILY, HOURLY, MEMBER, MEMBER_HOURLY, day_of, hour_of};
use super::{LogRecord, STATEMENT_ROWS, SqlBuilder, Store, StoreResult, statements};

/// A rollup row's key: workspace, hour or day, dimension (`model`, `dept`, `tag:` and a tag key
/// by hour; `key`, `member` by day), group (for a tag: its value).
type RollupKey = (i64, i64, String, String);

/// A rollup row's sums: requests, prompt, completion and total tokens, credits.
type Sums = [i64; 5];

/// What places a log in the rollups' rows: every log with the same lands in the same rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct RowsOf<'a> {
    workspace_id: i64,
    member_id: i64,
    key_id: i64,
    department_id: Option<i64>,
    /// Whether the model served, and it, or else the model asked for (the usage by model tells
    /// the two apart, `served:` and `asked:`; see [`UsageGrouping::Model`]).
    model: (bool, &'a str),
    hour: i64,
    day: i64,
    /// The stored tags (`k=v,…`).
    tags: Option<&'a str>,
}

impl<'a> RowsOf<'a> {
    fn of(r: &'a LogRecord) -> RowsOf<'a> {
        RowsOf {
            workspace_id: r.workspace_id,
            member_id: r.member_id,
            key_id: r.key_id,
            department_id: r.department_id,
            model: match &r.model_served {
                Some(m) => (true, m),
                None => (false, r.model_requested.as_deref().unwrap_or("")),
            },
            hour: hour_of(r.ts),
            day: day_of(r.ts),
            tags: r.tags.as_deref(),
        }
    }
}

/// A member's rollup row's key: workspace, member, day, key, department group (its id, `''`
/// without one), model group (`served:` or `asked:` and the model, [`RowsOf`]).
type MemberKey = (i64, i64, i64, i64, String, String);

/// A value of a rollup row's key, bound as its column's type.
enum Col {
    Int(i64),
    Text(String),
}

/// The rollups' sums of logs stored and not yet written to the rollups: a row per key of each
/// rollup, however many logs it sums. The log writer adds each batch it stores and writes the
/// sums once per `rollup_interval_ms` ([`RollupSums::write`]); a write that fails leaves them
/// here, and later batches add to them, so the next write carries both.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RollupSums {
    hourly: BTreeMap<RollupKey, Sums>,
    daily: BTreeMap<RollupKey, Sums>,
    members: BTreeMap<MemberKey, Sums>,
    member_hours: BTreeMap<(i64, i64, i64), Sums>,
}

/// Adds `values` to `s`, saturating as the upserts do.
fn add_to(s: &mut Sums, values: Sums) {
    for (acc, v) in s.iter_mut().zip(values) {
        *acc = acc.saturating_add(v);
    }
}

/// Adds every row of `from` to `into`.
fn merge_rows<K: Ord>(into: &mut BTreeMap<K, Sums>, from: BTreeMap<K, Sums>) {
    for (k, v) in from {
        add_to(into.entry(k).or_default(), v);
    }
}

impl RollupSums {
    /// The sums of `records`.
    pub fn of(records: &[LogRecord]) -> RollupSums {
        let mut sums = RollupSums::default();
        sums.add(records);
        sums
    }

    /// Adds `records` (stored logs) to the sums. Records that land in the same rows are summed
    /// first, keyed by what they borrow: a batch of a few keys' requests builds each row's key
    /// (its strings) once per group instead of once per record.
    pub fn add(&mut self, records: &[LogRecord]) {
        let mut groups: rustc_hash::FxHashMap<RowsOf<'_>, Sums> = rustc_hash::FxHashMap::default();
        for r in records {
            let values = [1, r.prompt_tokens, r.completion_tokens, r.total_tokens, r.credits];
            add_to(groups.entry(RowsOf::of(r)).or_default(), values);
        }
        for (rows, values) in groups {
            self.add_rows(&rows, values);
        }
    }

    /// Adds `values` to each row of `of`.
    fn add_rows(&mut self, of: &RowsOf<'_>, values: Sums) {
        let dept = of.department_id.map(|d| d.to_string()).unwrap_or_default();
        let model = match of.model {
            (true, m) => format!("served:{m}"),
            (false, m) => format!("asked:{m}"),
        };
        let member = (
            of.workspace_id,
            of.member_id,
            of.day,
            of.key_id,
            dept.clone(),
            model.clone(),
        );
        add_to(self.members.entry(member).or_default(), values);
        add_to(
            self.member_hours
                .entry((of.workspace_id, of.member_id, of.hour))
                .or_default(),
            values,
        );
        // Tag values are bounded by the workspace's caps (max_tag_keys × max_tag_values).
        let tags = crate::kernel::tags::Tags::from_stored(of.tags);
        let tag_rows = tags
            .iter()
            .map(|(k, v)| (false, of.hour, format!("tag:{k}"), v.to_owned()));
        let rows = [
            (false, of.hour, "model".to_owned(), model),
            (false, of.hour, "dept".to_owned(), dept),
            (true, of.day, "key".to_owned(), of.key_id.to_string()),
            (true, of.day, "member".to_owned(), of.member_id.to_string()),
        ];
        for (by_day, start, dimension, group) in rows.into_iter().chain(tag_rows) {
            let sums = if by_day { &mut self.daily } else { &mut self.hourly };
            add_to(
                sums.entry((of.workspace_id, start, dimension, group))
                    .or_default(),
                values,
            );
        }
    }

    /// Adds `other`'s rows to these.
    pub fn merge(&mut self, other: RollupSums) {
        merge_rows(&mut self.hourly, other.hourly);
        merge_rows(&mut self.daily, other.daily);
        merge_rows(&mut self.members, other.members);
        merge_rows(&mut self.member_hours, other.member_hours);
    }

    /// The rows an upsert of these sums writes.
    pub fn rows(&self) -> usize {
        self.hourly.len() + self.daily.len() + self.members.len() + self.member_hours.len()
    }

    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    /// Upserts the rows in `tx`, in key order: the members' own (by day, then by hour) first,
    /// then the daily ones and last the hourly ones (which every gateway's writes share), so
    /// that two gateways' writes lock rows in the same order.
    pub(super) async fn write(
        &self,
        store: &Store,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    ) -> StoreResult<()> {
        let member_columns = "workspace_id, member_id, day_start, key_id, dept_group, model_group";
        upsert(
            store,
            tx,
            MEMBER.table,
            member_columns,
            &self.members,
            |(ws, m, day, key, dept, model)| {
                vec![
                    Col::Int(*ws),
                    Col::Int(*m),
                    Col::Int(*day),
                    Col::Int(*key),
                    Col::Text(dept.clone()),
                    Col::Text(model.clone()),
                ]
            },
        )
        .await?;
        upsert(
            store,
            tx,
            MEMBER_HOURLY.table,
            "workspace_id, member_id, hour_start",
            &self.member_hours,
            |(ws, m, hour)| vec![Col::Int(*ws), Col::Int(*m), Col::Int(*hour)],
        )
        .await?;
        for (rollup, sums) in [(DAILY, &self.daily), (HOURLY, &self.hourly)] {
            let columns = format!("workspace_id, {}, dimension, group_key", rollup.time);
            upsert(
                store,
                tx,
                rollup.table,
                &columns,
                sums,
                |(ws, start, dimension, group)| {
                    vec![
                        Col::Int(*ws),
                        Col::Int(*start),
                        Col::Text(dimension.clone()),
                        Col::Text(group.clone()),
                    ]
                },
            )
            .await?;
        }
        Ok(())
    }
}

/// Upserts `sums` into `table`, whose key is `columns` (`key` gives a row's values of them), in
/// key order.
async fn upsert<K: Ord>(
    store: &Store,
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    table: &str,
    columns: &str,
    sums: &BTreeMap<K, Sums>,
    key: impl Fn(&K) -> Vec<Col>,
) -> StoreResult<()> {
    let rows: Vec<(&K, &Sums)> = sums.iter().collect();
    for chunk in statements(&rows, STATEMENT_ROWS) {
        let mut b = SqlBuilder::new(
            store,
            &format!(
                "INSERT INTO {table} ({columns}, requests, \
                 prompt_tokens, completion_tokens, total_tokens, credits) VALUES "
            ),
        );
        for (i, (k, sums)) in chunk.iter().enumerate() {
            b.push(if i == 0 { "(" } else { ", (" });
            for (j, col) in key(k).into_iter().enumerate() {
                if j > 0 {
                    b.push(", ");
                }
                match col {
                    Col::Int(v) => b.bind(v),
                    Col::Text(v) => b.bind(v),
                };
            }
            for v in *sums {
                b.push(", ").bind(*v);
            }
            b.push(")");
        }
        // Saturating addition on both backends, as for the quota counters.
        let add = |c: &str| {
            format!(
                "{c} = CASE WHEN excluded.{c} <= 0 THEN {table}.{c} + excluded.{c} \
                 WHEN {table}.{c} > 9223372036854775807 - excluded.{c} THEN 9223372036854775807 \
                 ELSE {table}.{c} + excluded.{c} END"
            )
        };
        let set: Vec<String> = [
            "requests",
            "prompt_tokens",
            "completion_tokens",
            "total_tokens",
            "credits",
        ]
        .into_iter()
        .map(add)
        .collect();
        b.push(&format!(
            " ON CONFLICT ({columns}) DO UPDATE SET {}",
            set.join(", ")
        ));
        let (sql, args) = b.finish();
        sqlx::query_with(&sql, args).execute(&mut **tx).await?;
    }
    Ok(())
}
