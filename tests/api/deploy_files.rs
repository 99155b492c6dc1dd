//! The files of `deploy/` against what the gateway really is: the alert rules and the Grafana
//! dashboard name only metrics `/metrics` exports (`aigw::observability::telemetry::FAMILIES`, which
//! `reference.rs` holds against a running gateway's scrape) with their labels, the dashboard
//! shows every family, and every `AIGW_*` variable the image, the compose file and the systemd
//! unit set is one aigw reads.

use std::collections::BTreeSet;

use aigw::observability::telemetry::{FAMILIES, Family, Kind};

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every `aigw_…` series name in `text` with the family it belongs to (a histogram's
/// `_bucket`, `_sum` and `_count` belong to the histogram).
fn series_in(text: &str) -> Vec<(String, Option<&'static Family>)> {
    let mut found = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("aigw_") {
        let start = i + at;
        let before_ok = start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end = start
            + text[start..]
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(text.len() - start);
        if before_ok {
            let name = &text[start..end];
            let family = FAMILIES.iter().find(|f| {
                f.name == name
                    || (f.kind == Kind::Histogram
                        && ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|s| name.strip_suffix(s) == Some(f.name)))
            });
            found.push((name.to_owned(), family));
        }
        i = end.max(start + 5);
    }
    found
}

/// The label names matched right after `name{` in `text` (`name{code="x",source!=""}`).
fn matched_labels<'t>(text: &'t str, name: &str) -> Vec<&'t str> {
    let mut labels = Vec::new();
    for (at, _) in text.match_indices(&format!("{name}{{")) {
        let inner = &text[at + name.len() + 1..];
        let inner = &inner[..inner.find('}').unwrap_or(0)];
        for matcher in inner.split(',') {
            let label = matcher.split(['=', '!', '~']).next().unwrap_or("").trim();
            if !label.is_empty() {
                labels.push(label);
            }
        }
    }
    labels
}

#[test]
fn alert_rules_and_dashboard_name_only_exported_metrics() {
    let rules = read("deploy/prometheus/aigw-alerts.yml");
    let dashboard = read("deploy/grafana/aigw-dashboard.json");
    let mut shown = BTreeSet::new();
    for (file, text) in [("alert rules", &rules), ("dashboard", &dashboard)] {
        let series = series_in(text);
        assert!(series.len() > 5, "{file}: {series:?}");
        for (name, family) in series {
            let family = family.unwrap_or_else(|| panic!("{file}: {name} is not a metric aigw exports"));
            for label in matched_labels(text, &name) {
                assert!(
                    family.labels.contains(&label) || ["instance", "job"].contains(&label),
                    "{file}: {name} has no label {label} (it has {:?})",
                    family.labels
                );
            }
            if file == "dashboard" {
                shown.insert(family.name);
            }
        }
    }
    let all: BTreeSet<&str> = FAMILIES.iter().map(|f| f.name).collect();
    let missing: Vec<_> = all.difference(&shown).collect();
    assert!(missing.is_empty(), "the dashboard shows no panel of {missing:?}");
    // What an operator must know has a rule.
    for must in [
        "aigw_store_available",
        "aigw_store_flush_failures_total",
        "aigw_store_flush_duration_seconds_bucket",
        "aigw_log_queue_depth",
        "upstream_quota_exhausted",
        "aigw_breaker_trips_total",
    ] {
        assert!(rules.contains(must), "no alert rule on {must}");
    }
}

#[test]
fn deployment_files_set_only_variables_aigw_reads() {
    let mut checked = 0;
    for path in [
        "deploy/Dockerfile",
        "deploy/compose.yaml",
        "deploy/compose.env.example",
        "deploy/aigw.service",
    ] {
        let text = read(path);
        for (at, _) in text.match_indices("AIGW_") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if name.len() > "AIGW_".len() {
                assert!(
                    aigw::config::is_known_variable(&name),
                    "{path}: {name} is not a variable aigw reads"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 10, "{checked}");
}
