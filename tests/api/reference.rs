//! `docs/reference.md` against what the gateway really answers: after a scripted scenario,
//! `/metrics` carries every family of the reference with its `# HELP` and `# TYPE` and the values
//! the scenario made, and every header any response carried is in the reference's table.

use std::collections::{BTreeMap, BTreeSet};

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, Setup, TestApp, TestDb, spawn_app};

both_backends!(metrics_and_headers_after_a_scenario_are_the_references);

const KEY: &str = "sk-aigw-ReferenceKey0123456789abcdefghij";
const OTHER_KEY: &str = "sk-aigw-ReferenceOther0123456789abcdefgh";

fn resources(mock: &MockUpstream) -> String {
    let url = &mock.base_url();
    ResourcesBuilder::acme(KEY)
        .api_key("ada@acme.test", "other", OTHER_KEY)
        .upstream("acme", "primary", url, "cred-primary", &["gpt-4o-mini"])
        .with("priority", 0)
        .upstream("acme", "backup", url, "cred-backup", &["gpt-4o-mini"])
        .with("priority", 1)
        .model("acme", "gpt-4o-mini")
        .policy("acme", "apikey", "ada@acme.test/ci", ("requests", "day"), 3.0)
        .with("mode", "enforce")
        .policy("acme", "member", "*", ("requests", "day"), 1.0)
        .with("mode", "shadow")
        .into()
}

fn chat() -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]})
}

/// A scrape of `/metrics`, parsed.
struct Scrape {
    text: String,
    /// Family → its `# HELP` text.
    help: BTreeMap<String, String>,
    /// Family → its `# TYPE`.
    kind: BTreeMap<String, String>,
    /// Every sample line: (name with labels, value).
    samples: Vec<(String, f64)>,
}

impl Scrape {
    async fn of(app: &TestApp) -> Scrape {
        let r = app.get("/metrics").await;
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        let mut scrape = Scrape {
            text: text.clone(),
            help: BTreeMap::new(),
            kind: BTreeMap::new(),
            samples: Vec::new(),
        };
        for line in text.lines().filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                let before = scrape.help.insert(name.to_owned(), help.to_owned());
                assert!(before.is_none(), "# HELP {name} twice");
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
                assert!(
                    scrape.help.contains_key(name),
                    "# TYPE {name} without a # HELP before it"
                );
                let before = scrape.kind.insert(name.to_owned(), kind.to_owned());
                assert!(before.is_none(), "# TYPE {name} twice");
            } else {
                assert!(!line.starts_with('#'), "unexpected comment {line:?}");
                let (series, value) = line.rsplit_once(' ').expect("a sample: series value");
                scrape
                    .samples
                    .push((series.to_owned(), value.parse().expect("a number")));
            }
        }
        scrape
    }

    /// The value of the sample written exactly `series`.
    fn value(&self, series: &str) -> Option<f64> {
        self.samples.iter().find(|(s, _)| s == series).map(|(_, v)| *v)
    }
}

/// Every header any of `responses` carried, by name, with the request that got it.
fn collect_headers(seen: &mut BTreeMap<String, String>, what: &str, r: &reqwest::Response) {
    for name in r.headers().keys() {
        seen.entry(name.as_str().to_owned())
            .or_insert_with(|| what.to_owned());
    }
}

/// The first column of the reference's header table, as patterns (`*` stands for any text).
fn documented_headers() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference.md"))
        .expect("docs/reference.md");
    let start = doc
        .find("## Response headers")
        .expect("a Response headers section");
    doc[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .next()
                .unwrap_or("")
                .trim()
                .trim_matches('`')
                .to_owned()
        })
        .collect()
}

fn matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        Some((head, tail)) => {
            name.len() >= head.len() + tail.len() && name.starts_with(head) && name.ends_with(tail)
        }
        None => pattern == name,
    }
}

async fn metrics_and_headers_after_a_scenario_are_the_references(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let primary = app.credential_id("primary").await;
    let mut headers = BTreeMap::new();

    // 1. A slow request holds a slot on `primary` while the gateway is scraped.
    mock.script(Script {
        delay_ms: Some(2_000),
        ..Script::any().credential("cred-primary").times(1)
    });
    let slow = {
        let (client, url) = (app.client.clone(), format!("{}/v1/chat/completions", app.address));
        tokio::spawn(async move {
            client
                .post(url)
                .bearer_auth(KEY)
                .json(&chat())
                .send()
                .await
                .unwrap()
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while app.state.admission.in_flight(primary) != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow request never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let during = Scrape::of(&app).await;
    let in_flight = format!("aigw_upstream_in_flight{{credential_id=\"{primary}\",credential=\"primary\"}}");
    assert_eq!(during.value(&in_flight), Some(1.0), "{}", during.text);
    let r = slow.await.unwrap();
    assert_eq!(r.status(), 200);
    collect_headers(&mut headers, "a routed success", &r);
    let after = Scrape::of(&app).await;
    assert_eq!(after.value(&in_flight), Some(0.0), "the slot is back");

    // 2. A 429 naming a reset parks the model on `primary`; the request fails over to `backup`.
    mock.script(
        Script::any()
            .credential("cred-primary")
            .times(1)
            .error(
                429,
                json!({"error": {"message": "slow down", "type": "rate_limit_error"}}),
            )
            .header("retry-after", "120"),
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat()).await;
    assert_eq!(r.status(), 200);
    let parked = Scrape::of(&app).await;
    assert_eq!(
        parked.value("aigw_upstream_parked{scope=\"model\",rule=\"provider_named_reset\"}"),
        Some(1.0),
        "{}",
        parked.text
    );

    // 3. The third request uses up the key's quota of 3; the fourth is refused.
    let r = app.post_json("/v1/chat/completions", KEY, &chat()).await;
    assert_eq!(r.status(), 200);
    let before = Scrape::of(&app).await;
    let refusals = "aigw_quota_refusals_total{subject=\"apikey\",mode=\"enforce\"}";
    let shadow = "aigw_quota_refusals_total{subject=\"member\",mode=\"shadow\"}";
    let r = app.post_json("/v1/chat/completions", KEY, &chat()).await;
    assert_eq!(r.status(), 429);
    collect_headers(&mut headers, "quota_exceeded", &r);
    let refused = Scrape::of(&app).await;
    // Counters are process-wide, shared by the tests running at the same time: at least one more.
    assert!(
        refused.value(refusals).unwrap() > before.value(refusals).unwrap(),
        "{}",
        refused.text
    );
    assert!(refused.value(shadow).unwrap() > before.value(shadow).unwrap());

    // 4. The other key: every credential fails, the upstream's error goes back as is; then every
    //    credential is parked and the gateway answers itself.
    mock.script(
        Script::any()
            .error(
                503,
                json!({"error": {"message": "overloaded", "type": "server_error"}}),
            )
            .header("x-ratelimit-remaining-requests", "0")
            .header("x-ratelimit-reset-requests", "90s"),
    );
    let r = app.post_json("/v1/chat/completions", OTHER_KEY, &chat()).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["x-aigw-error-source"], "upstream");
    collect_headers(&mut headers, "a passed-on upstream error", &r);
    let r = app.post_json("/v1/chat/completions", OTHER_KEY, &chat()).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-aigw-error-source"], "gateway");
    collect_headers(&mut headers, "upstream_quota_exhausted", &r);

    // 5. Refusals before any routing, the console, the health endpoints.
    let r = app
        .post_json("/v1/chat/completions", "sk-aigw-unknown", &chat())
        .await;
    assert_eq!(r.status(), 401);
    collect_headers(&mut headers, "invalid_api_key", &r);
    let r = app.get("/v1/chat/completions").await;
    assert_eq!(r.status(), 405);
    collect_headers(&mut headers, "method_not_allowed", &r);
    for path in ["/healthz", "/readyz", "/metrics", "/console/", "/nowhere"] {
        let r = app.get(path).await;
        collect_headers(&mut headers, path, &r);
    }

    // Every family of the reference, each with its help and type, and nothing else.
    let last = Scrape::of(&app).await;
    let families: BTreeSet<&str> = last.kind.keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = aigw::observability::telemetry::FAMILIES
        .iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(families, expected, "{}", last.text);
    for f in aigw::observability::telemetry::FAMILIES {
        assert_eq!(last.kind[f.name], f.kind.as_str(), "{}", f.name);
        assert_eq!(last.help[f.name], f.help, "{}", f.name);
    }
    for (series, _) in &last.samples {
        let name = series.split('{').next().unwrap();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| last.kind.get(*f).is_some_and(|k| k == "histogram"))
            })
            .unwrap_or(name);
        assert!(
            last.kind.contains_key(family),
            "{series} belongs to no declared family"
        );
    }
    assert_eq!(
        last.value("aigw_upstream_parked{scope=\"model\",rule=\"provider_named_reset\"}"),
        Some(2.0),
        "backup parked by the 503's reset header too: {}",
        last.text
    );
    assert!(
        last.samples
            .iter()
            .any(|(s, _)| s.starts_with("aigw_store_flush_duration_seconds_count{kind=\"quota\"}")),
        "the quota flush is timed: {}",
        last.text
    );
    assert_eq!(
        last.value(&format!(
            "aigw_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        )),
        Some(1.0)
    );

    // Every header any response carried is in the reference (HTTP's own framing aside).
    let documented = documented_headers();
    for (name, from) in &headers {
        if ["content-length", "date", "transfer-encoding", "connection"].contains(&name.as_str()) {
            continue;
        }
        assert!(
            documented.iter().any(|p| matches(p, name)),
            "{name} (on {from}) is missing from docs/reference.md's header table"
        );
    }
    for needle in [
        "x-request-id",
        "x-aigw-quota-requests-limit",
        "ratelimit",
        "retry-after",
        "x-should-retry",
        "allow",
    ] {
        assert!(
            headers.contains_key(needle),
            "the scenario saw {needle}: {headers:?}"
        );
    }
    app.stop().await;
}
