//! The classifier's rules through HTTP: what a failure parks and for how long, read back from the
//! `retry_after` of the `upstream_quota_exhausted` refusal that follows, or from which credential
//! serves next.

use aigw::mock_upstream::{MockUpstream, Script};
use chrono::Duration;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, Setup, TestApp, TestDb, chat, spawn_app, spawn_on_mock};
use crate::proxy::KEY;
use crate::upstream::pool_of;

/// One workspace and key, then the given `[[upstream]]` entries.
fn resources(upstreams: ResourcesBuilder) -> String {
    ResourcesBuilder::acme(KEY).and(upstreams).into()
}

/// Two OpenAI-compatible credentials: `one` (first choice) serves `m1` and `m3`, `two` serves
/// `m1` only.
fn pair(mock: &MockUpstream) -> String {
    let url = &mock.base_url();
    resources(
        ResourcesBuilder::new()
            .upstream("acme", "one", url, "cred-one", &["m1", "m3"])
            .with("priority", 0)
            .upstream("acme", "two", url, "cred-two", &["m1"])
            .with("priority", 1),
    )
}

async fn start(db: &TestDb) -> (TestApp, MockUpstream) {
    spawn_on_mock(db, pair).await
}

/// Sends a chat request for `model` and returns its status and body.
async fn send(app: &TestApp, model: &str) -> (u16, Value) {
    let r = app.post_json("/v1/chat/completions", KEY, &chat(model)).await;
    let status = r.status().as_u16();
    let body = r.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// The `retry_after` of the refusal a request for `model` gets now that everything is parked;
/// asserts that it is that refusal and that nothing was sent upstream.
async fn parked_for(app: &TestApp, mock: &MockUpstream, model: &str) -> u64 {
    let calls = mock.call_count();
    let (status, body) = send(app, model).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted", "{body}");
    assert_eq!(mock.call_count(), calls, "nothing was sent upstream");
    body["error"]["retry_after"]
        .as_u64()
        .unwrap_or_else(|| panic!("no retry_after in {body}"))
}

both_backends!(
    a_window_reset_on_a_503_holds_until_that_reset,
    every_anthropic_window_reset_counts,
    provider_side_and_far_away_limits_take_the_short_backoff,
    account_wide_wording_takes_the_credential_out_on_any_status,
    kiro_monthly_limit_holds_the_credential_thirty_days_then_longer,
    openrouter_free_daily_is_an_openrouter_429_and_covers_openrouter_free,
);

/// kRouter rule 3 works for any status: a 503 naming its window's reset (1m40s) parks until then,
/// not for the 5xx row's 30 s.
async fn a_window_reset_on_a_503_holds_until_that_reset(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(
        Script::any()
            .header("x-ratelimit-limit-requests", "10000")
            .header("x-ratelimit-remaining-requests", "0")
            .header("x-ratelimit-reset-requests", "1m40s")
            .error(
                503,
                json!({"error": {"message": "The server had an error while processing your request. Sorry about that!",
                    "type": "server_error", "param": null, "code": null}}),
            ),
    );
    let (status, _) = send(&app, "m1").await;
    assert_eq!(status, 503, "the last credential's error, as is");
    assert_eq!(mock.call_count(), 2);
    assert_eq!(parked_for(&app, &mock, "m1").await, 100);
    app.clock.advance(Duration::seconds(31));
    assert_eq!(parked_for(&app, &mock, "m1").await, 69, "still parked after 30 s");
    app.stop().await;
}

/// kRouter rule 3 reads every `anthropic-ratelimit-*-reset`, not only requests and tokens: a 429
/// naming only its input-tokens window 45 s ahead is parked 45 s, not the 90 s guess.
async fn every_anthropic_window_reset_counts(db: TestDb) {
    let (app, mock) = start(&db).await;
    let reset = (app.clock.now() + Duration::seconds(45))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    mock.script(
        Script::any()
            .header("anthropic-ratelimit-input-tokens-limit", "40000")
            .header("anthropic-ratelimit-input-tokens-remaining", "0")
            .header("anthropic-ratelimit-input-tokens-reset", &reset)
            .error(
                429,
                json!({"type": "error", "error": {"type": "rate_limit_error",
                    "message": "This request would exceed the rate limit for your organization (a1b2c3) of 40,000 input tokens per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits."}}),
            ),
    );
    let (status, _) = send(&app, "m1").await;
    assert_eq!(status, 429);
    assert_eq!(mock.call_count(), 2);
    assert_eq!(parked_for(&app, &mock, "m1").await, 45);
    app.stop().await;
}

/// kRouter rule 4 takes only the seed's three phrases, and its "hours or days away" veto lets the
/// table's backoff apply: neither OpenRouter's provider-side "temporarily rate-limited upstream"
/// (90 s before) nor "resets in 2 days" (6 h before) parks more than the backoff.
async fn provider_side_and_far_away_limits_take_the_short_backoff(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script::any().times(2).error(
        429,
        json!({"error": {"message": "Provider returned error", "code": 429,
            "metadata": {"raw": "qwen/qwen3-coder:free is temporarily rate-limited upstream. Please retry shortly.",
                "provider_name": "ModelRun"}}}),
    ));
    let (status, _) = send(&app, "m1").await;
    assert_eq!(status, 429);
    assert_eq!(mock.call_count(), 2);
    assert_eq!(parked_for(&app, &mock, "m1").await, 2, "the first backoff step");

    app.clock.advance(Duration::seconds(3));
    mock.script(Script::any().times(2).error(
        429,
        json!({"error": {"message": "Weekly rate limit reached, resets in 2 days", "type": "rate_limit_error"}}),
    ));
    let (status, _) = send(&app, "m1").await;
    assert_eq!(status, 429);
    assert_eq!(mock.call_count(), 4, "both credentials were tried again");
    assert_eq!(
        parked_for(&app, &mock, "m1").await,
        4,
        "the second backoff step, not a 6 h park from the prose"
    );
    app.stop().await;
}

/// kRouter rule 5: suspension wording takes the whole credential out (banned) whatever the
/// status; a 500 saying so no longer parks one model for 30 s.
async fn account_wide_wording_takes_the_credential_out_on_any_status(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script::any().credential("cred-one").times(1).error(
        500,
        json!({"error": {"message": "Your account has been suspended. Contact support to restore access.",
            "type": "server_error", "code": "account_suspended"}}),
    ));
    let (status, _) = send(&app, "m1").await;
    assert_eq!(status, 200, "two took over");
    assert_eq!(mock.call_count(), 2);
    // Long after a 30 s lock would have ended, `one` is still out, for every model.
    app.clock.advance(Duration::minutes(10));
    let (status, _) = send(&app, "m1").await;
    assert_eq!(status, 200);
    assert_eq!(
        mock.calls().last().unwrap().credential.as_deref(),
        Some("cred-two"),
        "the first choice stays out"
    );
    let calls = mock.call_count();
    let (status, body) = send(&app, "m3").await;
    assert_ne!(status, 200, "m3 has no other credential: {body}");
    assert_eq!(
        mock.call_count(),
        calls,
        "the whole credential is out: m3 is not sent to it"
    );
    app.stop().await;
}

/// kRouter rule 5: Kiro's monthly wording ("reached the limit", any provider, any status) holds
/// the whole credential 30 days, and 60 days when it comes again before a success.
async fn kiro_monthly_limit_holds_the_credential_thirty_days_then_longer(db: TestDb) {
    let (app, mock) = start(&db).await;
    let kiro = json!({"message": "You have reached the limit.", "reason": "MONTHLY_REQUEST_COUNT"});
    mock.script(
        Script::any()
            .credential("cred-one")
            .times(1)
            .error(400, kiro.clone()),
    );
    let (status, _) = send(&app, "m1").await;
    assert_eq!(status, 200, "not a request error: the next credential served");
    assert_eq!(mock.call_count(), 2);
    let day = 86_400;
    assert_eq!(
        parked_for(&app, &mock, "m3").await,
        30 * day,
        "every model of the credential"
    );

    // The hold ends; the first call after it meets the same limit before any success.
    app.clock.advance(Duration::days(30) + Duration::seconds(1));
    mock.script(
        Script::any()
            .credential("cred-one")
            .times(1)
            .error(400, kiro.clone()),
    );
    let (status, body) = send(&app, "m3").await;
    assert_eq!(status, 400);
    assert_eq!(body, kiro, "the only credential's error, as is");
    assert_eq!(parked_for(&app, &mock, "m3").await, 60 * day);
    app.stop().await;
}

/// kRouter rule 2 is an OpenRouter credential's 429, and `openrouter/free` shares the free
/// allowance: it rests with the `:free` models. The same words from another provider park only
/// the model that failed.
async fn openrouter_free_daily_is_an_openrouter_429_and_covers_openrouter_free(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let upstreams = ResourcesBuilder::new()
        .provider_upstream(
            "acme",
            ("router", "openrouter"),
            &url,
            "cred-router",
            &["a:free", "openrouter/free", "paid"],
        )
        .upstream("acme", "relay", &url, "cred-relay", &["c:free", "d:free"]);
    let app = spawn_app(&db, Setup::resources(resources(upstreams))).await;
    let daily = json!({"error": {"message": "Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free model requests per day", "code": 429}});
    mock.script(
        Script::any()
            .credential("cred-router")
            .times(1)
            .error(429, daily.clone()),
    );
    let (status, body) = send(&app, "a:free").await;
    assert_eq!((status, body), (429, daily.clone()));
    // Until the next 00:00 UTC (the clock starts at 02:00).
    assert_eq!(parked_for(&app, &mock, "openrouter/free").await, 22 * 3600);
    let (status, _) = send(&app, "paid").await;
    assert_eq!(status, 200, "paid models on the key keep working");

    mock.script(
        Script::any()
            .credential("cred-relay")
            .times(1)
            .error(429, daily.clone()),
    );
    let (status, _) = send(&app, "c:free").await;
    assert_eq!(status, 429);
    let calls = mock.call_count();
    let (status, _) = send(&app, "d:free").await;
    assert_eq!(status, 200, "not OpenRouter's daily cap: d:free is not parked");
    assert_eq!(mock.call_count(), calls + 1);
    assert_eq!(
        parked_for(&app, &mock, "c:free").await,
        90,
        "c:free alone, for the rate-limit wording's 90 s"
    );
    app.stop().await;
}

/// An account-level 429 (groot: `error_type: rate_limit_exceeded`) naming no reset: the
/// rate-limit wording's 90 s, on the whole shared quota.
fn account_429() -> Value {
    json!({"error": {"message": "Rate limit exceeded", "code": 429, "error_type": "rate_limit_exceeded"}})
}

both_backends!(a_group_rest_closes_every_model_the_shared_quota_covers);

/// groot ADR 0008 (seed 001: "one key closes every free route for everyone"): an account-level
/// 429 on a quota group closes every model the group's shared quota covers, on every credential
/// of the group, for the request that met it and for every request after it until the rest
/// ends. A free model's failure closes every free model; paid models are off the free quota and
/// keep serving, in that request's fallback chain too. A paid model's failure closes the group.
async fn a_group_rest_closes_every_model_the_shared_quota_covers(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let models = r#"["a:free", "b:free", "p1", "p2"]"#;
    let group = "quota_group = \"acct\"";
    let text = pool_of(&[
        ("one", &url, "cred-one", models, group),
        ("two", &url, "cred-two", models, group),
    ]) + &String::from(
        ResourcesBuilder::new()
            .model("acme", "a:free")
            .with("fallbacks", vec!["p1"]),
    );
    let app = spawn_app(&db, Setup::resources(text)).await;
    mock.script(
        Script::any()
            .credential("cred-one")
            .model("a:free")
            .times(1)
            .error(429, account_429()),
    );
    // The request that meets it stops walking the free models of the group and moves on to
    // the paid fallback, on the same key.
    let (status, body) = send(&app, "a:free").await;
    assert_eq!(status, 200, "{body}");
    let called: Vec<_> = mock
        .calls()
        .into_iter()
        .map(|c| (c.credential.unwrap_or_default(), c.model.unwrap_or_default()))
        .collect();
    assert_eq!(
        called,
        [
            ("cred-one".to_owned(), "a:free".to_owned()),
            ("cred-one".to_owned(), "p1".to_owned())
        ],
        "`two` is on the closed quota for a:free; p1 is off it"
    );
    // Every later request for any free model on any credential of the group: nothing is sent.
    assert_eq!(parked_for(&app, &mock, "b:free").await, 90);
    let (status, _) = send(&app, "p2").await;
    assert_eq!(status, 200, "paid models keep serving");
    app.clock.advance(Duration::seconds(91));
    let (status, _) = send(&app, "b:free").await;
    assert_eq!(status, 200, "the rest has ended");

    // A paid model's account-level 429 closes every model of the group.
    mock.script(
        Script::any()
            .credential("cred-one")
            .model("p1")
            .times(1)
            .error(429, account_429()),
    );
    let calls = mock.call_count();
    let (status, body) = send(&app, "p1").await;
    assert_eq!((status, body), (429, account_429()), "nothing off the group");
    assert_eq!(mock.call_count(), calls + 1, "`two` was not tried");
    assert_eq!(parked_for(&app, &mock, "p2").await, 90);
    assert_eq!(parked_for(&app, &mock, "a:free").await, 90);
    app.stop().await;
}

both_backends!(a_group_rest_lasts_as_long_as_the_provider_named);

/// Seed 000's durations, not groot's 300 s (DESIGN.md §6), and never shorter than the wait the
/// provider named: OpenRouter's free daily cap whose `X-RateLimit-Reset` has passed would be
/// tried again after a minute, but its `Retry-After: 3600` is waited out, by every free model on
/// every credential of the group.
async fn a_group_rest_lasts_as_long_as_the_provider_named(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let router = |upstreams: ResourcesBuilder, name: &str| {
        upstreams
            .provider_upstream(
                "acme",
                (name, "openrouter"),
                &url,
                &format!("cred-{name}"),
                &["a:free", "b:free"],
            )
            .with("quota_group", "acct")
    };
    let text = resources(router(router(ResourcesBuilder::new(), "one"), "two"));
    let app = spawn_app(&db, Setup::resources(text)).await;
    let daily = json!({"error": {"message": "Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free model requests per day",
        "code": 429, "metadata": {"headers": {"X-RateLimit-Limit": "50", "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "1767225600000"}, "provider_name": null}}});
    mock.script(
        Script::any()
            .times(1)
            .header("retry-after", "3600")
            .error(429, daily.clone()),
    );
    let (status, body) = send(&app, "a:free").await;
    assert_eq!((status, body), (429, daily), "the group's quota is closed");
    assert_eq!(mock.call_count(), 1, "the other credential was not tried");
    assert_eq!(parked_for(&app, &mock, "b:free").await, 3600, "not a minute");
    app.clock.advance(Duration::seconds(301));
    assert_eq!(
        parked_for(&app, &mock, "a:free").await,
        3299,
        "not groot's 300 s either"
    );
    app.stop().await;
}

both_backends!(a_kiro_hold_counts_its_own_repeats_not_the_backoff_level);

/// kRouter rule 5: Kiro's monthly hold is 30 days, "longer only if it happens again before a
/// success", counted apart from the backoff level: it does not raise the level the next
/// overload backs off from, a run of overloads does not lengthen it, and a success starts it
/// over.
async fn a_kiro_hold_counts_its_own_repeats_not_the_backoff_level(db: TestDb) {
    let (app, mock) = start(&db).await;
    let day = 86_400;
    let kiro = json!({"message": "You have reached the limit.", "reason": "MONTHLY_REQUEST_COUNT"});
    let overloaded = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    // `m3` is served by `one` alone: each request below is one call to it.
    let fail_once = |status: u16, body: &Value| {
        mock.script(
            Script::any()
                .credential("cred-one")
                .times(1)
                .error(status, body.clone()),
        );
    };
    fail_once(400, &kiro);
    assert_eq!(send(&app, "m3").await.0, 400);
    assert_eq!(parked_for(&app, &mock, "m3").await, 30 * day);
    app.clock.advance(Duration::days(30) + Duration::seconds(1));
    fail_once(529, &overloaded);
    assert_eq!(send(&app, "m3").await.0, 529);
    assert_eq!(
        parked_for(&app, &mock, "m3").await,
        2,
        "the first backoff step: the Kiro hold raised no level"
    );
    // Seven more overloads in a row: the backoff level is 8.
    for _ in 0..7 {
        app.clock.advance(Duration::seconds(301));
        fail_once(529, &overloaded);
        assert_eq!(send(&app, "m3").await.0, 529);
    }
    assert_eq!(parked_for(&app, &mock, "m3").await, 256);
    app.clock.advance(Duration::seconds(301));
    fail_once(400, &kiro);
    assert_eq!(send(&app, "m3").await.0, 400);
    assert_eq!(
        parked_for(&app, &mock, "m3").await,
        60 * day,
        "the second hold before a success, whatever the backoff level"
    );
    // A success starts the count over.
    app.clock.advance(Duration::days(60) + Duration::seconds(1));
    assert_eq!(send(&app, "m3").await.0, 200);
    fail_once(400, &kiro);
    assert_eq!(send(&app, "m3").await.0, 400);
    assert_eq!(parked_for(&app, &mock, "m3").await, 30 * day);
    app.stop().await;
}
