//! The known name nearest to a mistyped one: settings keys and variables, the resources file's
//! tables and fields. A slip of a letter or two gets "did you mean …?" instead of the whole list.

/// The candidate nearest to `word` when it is near enough to be the intended one: at most one
/// edit per three characters of the longer name, and at least one (case is ignored). Ties go to
/// the first candidate.
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let word = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .filter_map(|c| {
            let d = distance(&word, &c.to_ascii_lowercase());
            let allowed = (word.len().max(c.len()) / 3).max(1);
            (d <= allowed).then_some((d, c))
        })
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
/// neighbouring characters each count one (`listn` → `listen` 1, `attemtps` → `attempts` 1).
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

/// Rewrites serde's "unknown field `x`, expected one of `a`, `b`, …" (or "expected `a` or `b`")
/// in `message`: with a near candidate to "unknown field `x` (did you mean `a`?)"; without one,
/// a list of more than `max_listed` names gives way to `elsewhere` (where they are listed).
/// Any other message is returned as it is.
pub fn unknown_field(message: &str, max_listed: usize, elsewhere: &str) -> String {
    let Some(start) = message.find("unknown field `") else {
        return message.to_owned();
    };
    let rest = &message[start + "unknown field `".len()..];
    let Some(end) = rest.find('`') else {
        return message.to_owned();
    };
    let word = &rest[..end];
    let after = &rest[end + 1..];
    let Some(list) = after
        .strip_prefix(", expected one of ")
        .or_else(|| after.strip_prefix(", expected "))
    else {
        return message.to_owned();
    };
    let list_end = list.find('\n').unwrap_or(list.len());
    let (list, tail) = list.split_at(list_end);
    let names: Vec<&str> = list
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|n| !n.is_empty())
        .collect();
    let head = &message[..start];
    let said = match nearest(word, names.iter().copied()) {
        Some(near) => format!("unknown field `{word}` (did you mean `{near}`?)"),
        None if names.len() > max_listed => format!("unknown field `{word}` ({elsewhere})"),
        None => format!("unknown field `{word}`, expected {list}"),
    };
    format!("{head}{said}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_names() {
        let settings = ["listen", "database_url", "max_attempts", "locale", "timezone"];
        let cases: &[(&str, Option<&str>)] = &[
            ("listn", Some("listen")),
            ("lisetn", Some("listen")),
            ("max_attemtps", Some("max_attempts")),
            ("MAX_ATTEMPTS", Some("max_attempts")),
            ("databse_url", Some("database_url")),
            ("timezon", Some("timezone")),
            ("colour", None),
            ("port", None),
            ("x", None),
        ];
        for (word, want) in cases {
            assert_eq!(nearest(word, settings), *want, "{word}");
        }
    }

    #[test]
    fn serde_messages_rewritten() {
        let cases: &[(&str, &str)] = &[
            (
                "TOML parse error at line 2\nunknown field `emial`, expected one of `workspace`, `email`, `role`\n",
                "TOML parse error at line 2\nunknown field `emial` (did you mean `email`?)\n",
            ),
            (
                "unknown field `colour`, expected `name` or `timezone`",
                "unknown field `colour`, expected `name` or `timezone`",
            ),
            (
                "unknown field `zzz`, expected one of `a1`, `b2`, `c3`, `d4`",
                "unknown field `zzz` (see the list)",
            ),
            ("invalid type: integer", "invalid type: integer"),
        ];
        for (message, want) in cases {
            assert_eq!(unknown_field(message, 3, "see the list"), *want);
        }
    }
}
