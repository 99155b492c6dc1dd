"""Reading the gateway's answers: waits, quota standing, and what each refusal means."""

import pytest

from aigw_client import classify, parse_standing, parse_wait
from aigw_client._signals import window_seconds

from fakes import T0, error, rfc3339

NOW = T0


@pytest.mark.parametrize(
    "headers, wait",
    [
        ({"retry-after": "3"}, 3.0),
        ({"Retry-After": "1.5"}, 1.5),
        ({"retry-after": "3", "retry-after-ms": "2500"}, 2.5),  # the finer one wins
        ({"retry-after": "Fri, 15 Jan 2027 08:00:30 GMT"}, 30.0),  # an HTTP-date; NOW is 08:00:00
        ({"retry-after": "Fri, 15 Jan 2027 07:00:00 GMT"}, 0.0),  # a date past: no wait
        ({"retry-after": "soon"}, None),
        ({"retry-after-ms": "nan"}, None),
        ({}, None),
    ],
)
def test_named_waits(headers, wait):
    assert parse_wait(headers, NOW) == wait


def test_window_lengths():
    assert [window_seconds(w) for w in ("minute", "5minutes", "day", "week", "month", "total", None)] == [
        60, 300, 86400, 604800, None, None, None]


def test_quota_headers_per_metric_with_the_tightest_policy_named():
    h = {
        "x-aigw-quota-requests-limit": "5", "x-aigw-quota-requests-remaining": "4",
        "x-aigw-quota-requests-reset": "1800000087",
        "x-aigw-quota-credits-limit": "2.5", "x-aigw-quota-credits-remaining": "1.25",
        "ratelimit-policy": '"apikey-requests-minute";q=5;w=60',
        "ratelimit": '"apikey-requests-minute";r=4;t=87',
    }
    requests, credits = parse_standing(h, NOW)
    assert (requests.metric, requests.limit, requests.remaining, requests.reset) == ("requests", 5, 4, 1800000087)
    assert (requests.window, requests.name, requests.delayed) == (60, "apikey-requests-minute", True)
    assert (credits.metric, credits.limit, credits.remaining, credits.reset) == ("credits", 2.5, 1.25, None)
    assert credits.window is None and credits.name is None


@pytest.mark.parametrize(
    "name, policy",
    [
        ("tokens", "apikey-tokens-day"),  # seed 003's name, what the gateway sends
        ("total_tokens", "apikey-total_tokens-day"),  # the long name, from a gateway before it
    ],
)
def test_the_token_quota_is_read_as_tokens_under_either_name(name, policy):
    h = {
        f"x-aigw-quota-{name}-limit": "30000", f"x-aigw-quota-{name}-remaining": "5660",
        f"x-aigw-quota-{name}-reset": "1800000087",
        "ratelimit-policy": f'"{policy}";q=30000;w=86400', "ratelimit": f'"{policy}";r=5660;t=87',
    }
    (r,) = parse_standing(h, NOW)
    assert (r.metric, r.limit, r.remaining, r.reset) == ("tokens", 30000, 5660, 1800000087)
    assert (r.window, r.name) == (86400, policy)


def test_both_token_names_make_one_reading():
    h = {f"x-aigw-quota-{n}-{k}": v for n in ("tokens", "total_tokens")
         for k, v in (("limit", "10"), ("remaining", "1"), ("reset", "1800000087"))}
    assert [r.metric for r in parse_standing(h, NOW)] == ["tokens"]


def test_a_bare_ratelimit_field_is_read_as_it_is():
    h = {"ratelimit-policy": '"burst";q=100;w=10', "ratelimit": '"burst";r=7;t=4'}
    (r,) = parse_standing(h, NOW)
    assert (r.limit, r.remaining, r.reset, r.window, r.delayed) == (100, 7, NOW + 4, 10, False)


RESET = NOW + 150
BLOCKED = NOW + 600

# Each refusal the gateway sends (codes from src/error.rs), and an upstream's passed on.
CASES = [
    ("success", 200, {}, None, ("ok", None, None, "key", False)),
    ("quota used up", 429, {"x-should-retry": "false", "x-aigw-error-source": "gateway"},
     error("quota_exceeded", reset_at=rfc3339(RESET)), ("final", None, RESET, "key", True)),
    ("total quota used up", 429, {"x-should-retry": "false"},
     error("quota_exceeded", reset_at=None), ("final", None, None, "key", True)),
    ("breaker open, short", 429, {"retry-after": "30", "retry-after-ms": "30000"},
     error("api_key_circuit_open", retry_after=30), ("retry", 30.0, NOW + 30, "key", False)),
    ("breaker open, long", 429, {"retry-after": "600", "x-should-retry": "false"},
     error("api_key_circuit_open", retry_after=600, blocked_until=rfc3339(BLOCKED, 0)),
     ("final", 600.0, BLOCKED, "key", True)),
    ("banned key", 403, {"x-should-retry": "false"}, error("api_key_permanently_banned", 403),
     ("final", None, None, "key", True)),
    ("every upstream parked, short", 429, {"retry-after": "1", "retry-after-ms": "1000"},
     error("upstream_quota_exhausted", retry_after=1), ("retry", 1.0, NOW + 1, "model", False)),
    ("every upstream parked, long", 429, {"retry-after": "120", "x-should-retry": "false"},
     error("upstream_quota_exhausted", retry_after=120), ("final", 120.0, NOW + 120, "model", True)),
    ("upstream 429 passed on", 429, {"retry-after": "2", "x-aigw-error-source": "upstream"},
     error("rate_limit_exceeded"), ("retry", 2.0, NOW + 2, "model", False)),
    ("upstream 429 without a wait", 429, {"x-aigw-error-source": "upstream"},
     error("rate_limit_exceeded"), ("retry", None, None, "model", False)),
    ("store unavailable", 503, {"retry-after": "2"}, error("store_unavailable", 503),
     ("retry", 2.0, NOW + 2, "key", False)),
    ("too many connections", 503, {"retry-after": "1"}, error("too_many_connections", 503),
     ("retry", 1.0, NOW + 1, "key", False)),
    ("upstream deadline", 504, {}, error("timeout", 504), ("retry", None, None, "key", False)),
    ("bad request", 400, {}, error("invalid_request_error", 400), ("final", None, None, "key", False)),
    ("invalid key", 401, {}, error("invalid_api_key", 401), ("final", None, None, "key", False)),
    ("unknown model", 404, {}, error("model_not_found", 404), ("final", None, None, "key", False)),
    ("a 400 the server wants retried", 400, {"x-should-retry": "true"}, None,
     ("retry", None, None, "key", False)),
]


@pytest.mark.parametrize("name, status, headers, body, want", CASES, ids=[c[0] for c in CASES])
def test_what_each_answer_means(name, status, headers, body, want):
    v = classify(status, headers, body, NOW)
    assert (v.kind, v.wait, v.retry_at, v.scope, v.close) == want


def test_a_banned_key_stays_closed_for_good():
    v = classify(403, {"x-should-retry": "false"}, error("api_key_permanently_banned"), NOW)
    assert v.forever and v.close
