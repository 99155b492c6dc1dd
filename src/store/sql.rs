//! Statements built for either backend: batches cut into statements of a few fixed sizes, and
//! SQL with each backend's placeholders.

use super::{Backend, Store};

/// Rows per statement for wide rows (logs, rollups), largest first. A batch is written as
/// statements of exactly these sizes, so the database prepares each once and then finds it in
/// its statement cache: a batch of any size, cut at a fixed size, would leave a statement of its
/// own size (hundreds of KiB of prepared program each, kept up to a hundred per connection).
/// The largest stays small, so building its arguments never holds a runtime worker long.
pub(crate) const STATEMENT_ROWS: &[usize] = &[100, 20, 5, 1];

/// Rows (or keys) per statement for narrow rows (counters, breaker buckets), largest first.
pub(crate) const NARROW_STATEMENT_ROWS: &[usize] = &[500, 100, 20, 5, 1];

/// `rows` cut into statements of `sizes` (largest first, ending in 1), in order.
pub(crate) fn statements<'a, T>(mut rows: &'a [T], sizes: &'static [usize]) -> impl Iterator<Item = &'a [T]> {
    std::iter::from_fn(move || {
        let n = sizes.iter().copied().find(|&n| n <= rows.len())?;
        let (chunk, rest) = rows.split_at(n);
        rows = rest;
        Some(chunk)
    })
}

/// Builds SQL for dynamic filters and batches with each backend's placeholders: `$n` for
/// Postgres, `?` for SQLite (sqlx's `QueryBuilder` writes `?` for the `Any` driver, which Postgres
/// rejects; and SQLite looks named parameters up linearly, so a 500-row batch of `$n` costs
/// quadratic time).
pub(super) struct SqlBuilder<'q> {
    sql: String,
    args: sqlx::any::AnyArguments<'q>,
    count: usize,
    numbered: bool,
}

impl<'q> SqlBuilder<'q> {
    /// Starts with `sql`, for `store`'s backend.
    pub fn new(store: &Store, sql: &str) -> Self {
        SqlBuilder {
            sql: sql.to_owned(),
            args: sqlx::any::AnyArguments::default(),
            count: 0,
            numbered: store.backend == Backend::Postgres,
        }
    }

    /// Starts with `sql` for a statement of `rows` rows of `per_row` values each, its text and
    /// arguments sized once (a 100-row log statement otherwise grows both a dozen times).
    pub fn for_rows(store: &Store, sql: &str, rows: usize, per_row: usize) -> Self {
        use sqlx::Arguments;
        let values = rows.saturating_mul(per_row);
        let mut b = SqlBuilder::new(store, sql);
        // `, $1234` at most per value, `(`, `), ` per row.
        b.sql.reserve(values * 8 + rows * 4);
        b.args.reserve(values, 0);
        b
    }

    /// Appends SQL text.
    pub fn push(&mut self, sql: &str) -> &mut Self {
        self.sql.push_str(sql);
        self
    }

    /// Appends a placeholder bound to `value`.
    pub fn bind<T>(&mut self, value: T) -> &mut Self
    where
        T: 'q + sqlx::Encode<'q, sqlx::Any> + sqlx::Type<sqlx::Any>,
    {
        use sqlx::Arguments;
        self.count += 1;
        if self.numbered {
            self.sql.push('$');
            self.sql.push_str(itoa::Buffer::new().format(self.count));
        } else {
            self.sql.push('?');
        }
        // Encoding into AnyArguments only fails for types the Any driver lacks, which the type
        // bound already excludes.
        let _ = self.args.add(value);
        self
    }

    /// The SQL and its arguments, for `sqlx::query_with` / `query_as_with`.
    pub fn finish(self) -> (String, sqlx::any::AnyArguments<'q>) {
        (self.sql, self.args)
    }
}
