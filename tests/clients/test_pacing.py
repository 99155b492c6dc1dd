"""The Python pacing helper (clients/python, `aigw_client`) under the official SDKs, against a
running aigw and the mock upstream.

The pacing test runs until the current minute's quota window has ended and a little into the
next one: from a few seconds up to a minute, depending on when it starts.
"""

import asyncio
import concurrent.futures
import time
from datetime import datetime

import anthropic
import openai
import pytest

import aigw_client
from aigw_client import PacedTransport, Settings
from aigw_client._httpx import httpx

from gateway import running

KEYS = {name: f"sk-aigw-Pacing{name.capitalize()}0123456789abcdefghijk" for name in
        ("paced", "plain", "spent", "waits")}
LIMIT = 20  # requests per minute on the keys `paced` and `plain`

RESOURCES = """
[[workspace]]
name = "acme"
[[member]]
workspace = "acme"
email = "app@acme.test"
role = "member"
""" + "".join(f"""
[[api_key]]
member = "app@acme.test"
name = "{name}"
key = "{key}"
""" for name, key in KEYS.items()) + "".join(f"""
[[policy]]
workspace = "acme"
subject = "apikey"
target = "app@acme.test/{name}"
metric = "requests"
window = "minute"
limit = {LIMIT}
""" for name in ("paced", "plain")) + """
[[policy]]
workspace = "acme"
subject = "apikey"
target = "app@acme.test/spent"
metric = "requests"
window = "day"
limit = 1

[[upstream]]
workspace = "acme"
name = "mock-openai"
provider = "openai-compatible"
base_url = "http://127.0.0.1:{mock}/v1"
api_key = "cred-openai"
models = ["gpt-4o-mini", "flaky"]
[[upstream]]
workspace = "acme"
name = "mock-anthropic"
provider = "anthropic"
base_url = "http://127.0.0.1:{mock}/v1"
api_key = "cred-anthropic"
models = ["claude-sonnet"]
"""

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gateway():
    with running(RESOURCES) as g:
        yield g


class Counting(httpx.BaseTransport):
    """The transport that really sends, counting what goes out and what comes back."""

    def __init__(self):
        self.inner = httpx.HTTPTransport()
        self.sent = []  # (path, status)

    def handle_request(self, request):
        r = self.inner.handle_request(request)
        self.sent.append((request.url.path, r.status_code))
        return r


def paced_openai(gateway, key, **settings):
    counting = Counting()
    transport = PacedTransport(counting, settings=Settings(**settings))
    client = openai.OpenAI(base_url=gateway.gw + "/v1", api_key=KEYS[key], max_retries=0,
                           http_client=httpx.Client(transport=transport))
    return client, counting


def calls_to(counting, path="/v1/chat/completions"):
    return [status for p, status in counting.sent if p == path]


def not_at_a_minute_end():
    """Waits out the last seconds of a minute, so that a burst falls in one window."""
    s = datetime.now().second
    if s >= 57:
        time.sleep(61 - s)


def test_pacing_keeps_a_key_under_its_quota(gateway):
    calls = LIMIT + 2  # more than one window allows
    not_at_a_minute_end()
    # Without the helper, the same run on a key with the same quota is refused.
    plain = openai.OpenAI(base_url=gateway.gw + "/v1", api_key=KEYS["plain"], max_retries=0)

    def unpaced(_):
        try:
            plain.chat.completions.create(model="gpt-4o-mini", messages=HI)
            return "ok"
        except openai.RateLimitError as e:
            return e.code

    outcomes = [unpaced(i) for i in range(calls)]
    assert outcomes.count("quota_exceeded") == 2, outcomes

    # With it: every call is served, none is refused, through a window's end.
    client, counting = paced_openai(gateway, "paced", most_wait=120)
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda _: client.chat.completions.create(model="gpt-4o-mini", messages=HI),
                             range(calls)))
    assert len(done) == calls
    assert calls_to(counting) == [200] * calls, "nothing refused, nothing retried"
    assert calls_to(counting, "/v1/quota") == [200], "the quota read once"
    assert time.monotonic() - started < 75


def test_a_quota_refusal_is_raised_at_once_without_a_retry(gateway):
    openai.OpenAI(base_url=gateway.gw + "/v1", api_key=KEYS["spent"], max_retries=0) \
        .chat.completions.create(model="gpt-4o-mini", messages=HI)  # uses up the day's 1 request
    # Not reading the quotas first, the helper learns it from the gateway's refusal.
    client, counting = paced_openai(gateway, "spent", prime=False)
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model="gpt-4o-mini", messages=HI)
    assert time.monotonic() - started < 2, "not waited"
    assert e.value.code == "quota_exceeded" and calls_to(counting) == [429]
    assert e.value.response.headers["x-aigw-error-source"] == "gateway"
    reset_at = aigw_client.retry_at(e.value)
    assert reset_at == datetime.fromisoformat(e.value.body["reset_at"]).timestamp()
    # The next call is answered the same, without being sent.
    with pytest.raises(openai.RateLimitError) as again:
        client.chat.completions.create(model="gpt-4o-mini", messages=HI)
    assert calls_to(counting) == [429]
    assert again.value.response.headers["x-aigw-error-source"] == "client"
    assert aigw_client.retry_at(again.value) == reset_at


def test_a_short_upstream_wait_is_waited_out_once(gateway):
    gateway.script(model="flaky", times=1, status=429, headers={"retry-after": "1"},
                   body={"error": {"message": "Rate limit reached for requests", "type": "requests",
                                   "code": "rate_limit_exceeded"}})
    client, counting = paced_openai(gateway, "waits")
    started = time.monotonic()
    r = client.chat.completions.create(model="flaky", messages=HI)
    took = time.monotonic() - started
    assert r.choices[0].message.content.startswith("Hello")
    assert calls_to(counting) == [429, 200], "one wait, one retry"
    assert 1.0 <= took < 5, took
    flaky = [c for c in gateway.mock_calls()["calls"] if c["model"] == "flaky"]
    assert [c["status"] for c in flaky] == [429, 200]


def test_async_and_anthropic_clients(gateway):
    async def main():
        client = openai.AsyncOpenAI(base_url=gateway.gw + "/v1", api_key=KEYS["waits"], max_retries=0,
                                    http_client=aigw_client.async_http_client())
        rs = await asyncio.gather(*(client.chat.completions.create(model="gpt-4o-mini", messages=HI)
                                    for _ in range(5)))
        return [r.choices[0].message.content for r in rs]

    assert all(t.startswith("Hello") for t in asyncio.run(main()))
    an = anthropic.Anthropic(base_url=gateway.gw, api_key=KEYS["waits"], max_retries=0,
                             http_client=aigw_client.http_client())
    m = an.messages.create(model="claude-sonnet", max_tokens=16, messages=HI)
    assert m.content[0].text.startswith("Hello")
