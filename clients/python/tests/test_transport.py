"""The transports against a simulated gateway, on virtual time, alone and under the SDKs."""

import asyncio
import json

import pytest

from aigw_client import AsyncPacedTransport, PacedTransport, Pacer, Settings, retry_at
from aigw_client._httpx import httpx

from fakes import T0, SimGateway, VirtualTime, chat_request, error, rfc3339


def sync_client(vt, gw, **settings):
    pacer = Pacer(Settings(**settings), clock=vt.clock, wall=vt.wall, random=lambda: 0.5)
    transport = PacedTransport(httpx.MockTransport(gw.handler), pacer=pacer, sleep=vt.sleep, wall=vt.wall)
    return httpx.Client(transport=transport), pacer


def async_client(vt, gw, **settings):
    pacer = Pacer(Settings(**settings), clock=vt.clock, wall=vt.wall, random=lambda: 0.5)
    transport = AsyncPacedTransport(httpx.MockTransport(gw.ahandler), pacer=pacer, sleep=vt.asleep,
                                    wall=vt.wall)
    return httpx.AsyncClient(transport=transport), pacer


def send(client, **kw):
    return client.send(chat_request(**kw))


def test_calls_are_spread_over_the_window_and_never_refused():
    vt = VirtualTime(T0 + 30)
    gw = SimGateway(vt, limit=10)
    client, _ = sync_client(vt, gw)
    statuses = [send(client).status_code for _ in range(15)]
    assert statuses == [200] * 15
    assert gw.quota_reads == 1, "the quotas are read once, before the first call"
    times = [t for t, _ in gw.calls]
    # 10 over the 30 s left of the first minute, the next 5 in the next minute, 5.9 s apart.
    assert times[:10] == pytest.approx([3.0 * i for i in range(10)])
    assert times[10:] == pytest.approx([31 + 5.9 * i for i in range(5)])


def test_without_the_helper_the_same_run_is_refused():
    vt = VirtualTime(T0 + 30)
    gw = SimGateway(vt, limit=10)
    with httpx.Client(transport=httpx.MockTransport(gw.handler)) as plain:
        statuses = [plain.send(chat_request()).status_code for _ in range(15)]
    assert statuses.count(429) == 5


def test_a_final_refusal_is_passed_on_at_once_and_closes_the_key():
    vt = VirtualTime(T0)
    gw = SimGateway(vt, limit=10)
    gw.script.append((429, {"x-should-retry": "false", "x-aigw-error-source": "gateway"},
                      error("quota_exceeded", reset_at=rfc3339(T0 + 150))))
    client, _ = sync_client(vt, gw)
    r = send(client)
    assert r.status_code == 429 and len(gw.calls) == 1, "not retried"
    assert r.headers["x-should-retry"] == "false"
    assert retry_at(r) == T0 + 150
    again = send(client)
    assert len(gw.calls) == 1, "the next call is not sent"
    assert again.status_code == 429 and again.headers["x-aigw-error-source"] == "client"
    assert again.json()["error"]["code"] == "quota_exceeded" and retry_at(again) == T0 + 150
    assert vt.slept == [], "no waiting"


def test_a_short_named_wait_is_waited_out_once():
    vt = VirtualTime(T0)
    gw = SimGateway(vt, limit=10**6)
    gw.script.append((429, {"retry-after": "2", "retry-after-ms": "2000"}, error("upstream_quota_exhausted")))
    client, _ = sync_client(vt, gw)
    r = send(client)
    assert r.status_code == 200
    assert [s for _, s in gw.calls] == [429, 200]
    # 2 s plus half of the extra's bound (0.25 + 10 % of 2 s).
    assert gw.calls[1][0] == pytest.approx(2 + 0.5 * 0.45)


def test_no_named_wait_backs_off_with_full_jitter_within_the_attempts():
    vt = VirtualTime(T0)
    gw = SimGateway(vt, limit=10**6)
    for _ in range(4):
        gw.script.append((503, {}, error("upstream_unreachable")))
    client, _ = sync_client(vt, gw, max_attempts=3)
    r = send(client)
    assert r.status_code == 503 and len(gw.calls) == 3
    assert r.headers["x-should-retry"] == "false"
    assert vt.slept == pytest.approx([0.25, 0.5]), "random 0.5 × 0.5 s, then × 1 s"


def test_a_wait_past_most_wait_is_not_sat_out():
    vt = VirtualTime(T0)
    gw = SimGateway(vt, limit=10**6)
    gw.script.append((429, {"retry-after": "120"}, error("api_key_circuit_open")))
    client, _ = sync_client(vt, gw, most_wait=60)
    r = send(client)
    assert r.status_code == 429 and len(gw.calls) == 1 and vt.slept == []
    assert r.headers["x-should-retry"] == "false"
    assert retry_at(r) == pytest.approx(T0 + 120 + 0.5 * 5.0, abs=1), "the wait and its extra"


def test_an_sdk_retry_is_a_single_attempt():
    vt = VirtualTime(T0)
    gw = SimGateway(vt, limit=10**6)
    for _ in range(3):
        gw.script.append((503, {}, error("upstream_unreachable")))
    client, _ = sync_client(vt, gw)
    req = chat_request()
    req.headers["x-stainless-retry-count"] = "1"
    assert client.send(req).status_code == 503 and len(gw.calls) == 1


def test_a_connection_error_is_tried_again():
    vt = VirtualTime(T0)
    gw = SimGateway(vt, limit=10**6)
    failures = [httpx.ConnectError("refused")]

    def handler(request):
        if failures and not request.url.path.endswith("/quota"):
            raise failures.pop()
        return gw.handler(request)

    pacer = Pacer(Settings(), clock=vt.clock, wall=vt.wall, random=lambda: 0.5)
    client = httpx.Client(transport=PacedTransport(httpx.MockTransport(handler), pacer=pacer, sleep=vt.sleep))
    assert client.send(chat_request()).status_code == 200
    assert pacer._keys and not any(ks.slots for ks in pacer._keys.values()), "no reservation left behind"


def test_the_openai_sdk_raises_its_own_error_with_the_time_to_come_back():
    openai = pytest.importorskip("openai")
    vt = VirtualTime(T0)
    gw = SimGateway(vt, limit=2)
    # Two calls a minute: the second waits 30 s, the third would wait until the next minute.
    client, _ = sync_client(vt, gw, most_wait=30)
    oa = openai.OpenAI(base_url="http://gw.test/v1", api_key="sk-aigw-test", http_client=client)
    for _ in range(2):
        oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.RateLimitError) as e:
        oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "wait_too_long"
    assert retry_at(e.value) == pytest.approx(T0 + 61, abs=1)
    assert len(gw.calls) == 2, "the third call was never sent, and the SDK did not retry"


def test_the_anthropic_sdk_works_through_the_same_transport():
    anthropic = pytest.importorskip("anthropic")
    vt = VirtualTime(T0)
    gw = SimGateway(vt, limit=10**6)
    gw.script.append((429, {"x-should-retry": "false"}, error("quota_exceeded", reset_at=rfc3339(T0 + 100))))
    client, _ = sync_client(vt, gw)
    an = anthropic.Anthropic(base_url="http://gw.test", api_key="sk-aigw-test", http_client=client)
    with pytest.raises(anthropic.RateLimitError) as e:
        an.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert retry_at(e.value) == T0 + 100 and len(gw.calls) == 1


def test_asyncio_tasks_share_one_schedule():
    vt = VirtualTime(T0 + 30)
    gw = SimGateway(vt, limit=10)

    async def main():
        client, _ = async_client(vt, gw, most_wait=120)
        async with client:
            rs = await vt.run(*(client.send(chat_request()) for _ in range(25)))
        return [r.status_code for r in rs]

    assert asyncio.run(main()) == [200] * 25
    assert [s for _, s in gw.calls].count(429) == 0
    times = sorted(t for t, _ in gw.calls)
    assert times[:10] == pytest.approx([3.0 * i for i in range(10)])
    assert times[10] == pytest.approx(31.0) and times[20] == pytest.approx(91.0)


def test_asyncio_tasks_that_cannot_wait_are_told_when_to_come_back():
    vt = VirtualTime(T0 + 30)
    gw = SimGateway(vt, limit=10)

    async def main():
        client, _ = async_client(vt, gw, most_wait=15)
        async with client:
            return await vt.run(*(client.send(chat_request()) for _ in range(25)))

    rs = asyncio.run(main())
    served = [r for r in rs if r.status_code == 200]
    told = [r for r in rs if r.status_code == 429]
    assert len(served) == 10, "the window's 10: paced within 15 s (0, 3, …, 15), the rest at once"
    assert sorted(t for t, _ in gw.calls) == pytest.approx([0.0] * 4 + [3.0 * i for i in range(6)])
    assert all(r.json()["error"]["code"] == "wait_too_long" for r in told)
    assert [s for _, s in gw.calls].count(429) == 0, "nothing refused by the gateway"


def test_a_cancelled_task_gives_its_slot_back():
    vt = VirtualTime(T0 + 30)
    gw = SimGateway(vt, limit=10)

    async def main():
        client, pacer = async_client(vt, gw, most_wait=120)
        async with client:
            await vt.run(client.send(chat_request()))  # primes the key
            waiting = asyncio.ensure_future(client.send(chat_request()))
            for _ in range(50):
                await asyncio.sleep(0)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            return pacer

    pacer = asyncio.run(main())
    (ks,) = pacer._keys.values()
    assert ks.slots == [], "no reservation left behind"
