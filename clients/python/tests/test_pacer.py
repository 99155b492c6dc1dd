"""The pacer's decisions, on virtual time."""

import json
import threading

import pytest

from aigw_client import Pacer, Settings

from fakes import T0, VirtualTime, error, rfc3339

KEY = "key-1"


def pacer(vt, **settings):
    # random() = 0.5: extras and jitter are half their bound, so the tests can name them.
    return Pacer(Settings(**settings), clock=vt.clock, wall=vt.wall, random=lambda: 0.5)


def quota_row(limit, remaining, reset, window="minute", metric="requests", mode="enforce"):
    return {"subject": "apikey", "metric": metric, "window": window, "mode": mode, "limit": limit,
            "used": limit - remaining, "remaining": remaining, "reset_at": rfc3339(reset)}


def starts(p, n, model=None, allowance=1e9):
    """Plans n calls at the current time; their start times (None for a refusal)."""
    out = []
    for _ in range(n):
        plan = p.plan(KEY, model, allowance)
        out.append(plan.ticket.start if plan.kind == "go" else None)
    return out


def test_what_remains_is_spread_until_the_window_really_ends():
    vt = VirtualTime(T0 + 30)  # half way through the minute 08:00
    p = pacer(vt)
    assert p.plan(KEY, None, 60).kind == "prime"
    # The gateway reports the reset 90 s after the window's end (08:01:00 → 08:02:30).
    p.primed(KEY, [quota_row(10, 10, T0 + 60 + 90)])
    got = starts(p, 12)
    assert got[:10] == pytest.approx([3.0 * i for i in range(10)]), "10 calls over the 30 s left"
    # The 11th waits for the next window (+1 s of clock margin); the next window's 10 are then
    # spread over the 59 s left of it.
    assert got[10:] == pytest.approx([31.0, 36.9])


def test_reset_delay_zero_paces_until_the_reported_reset():
    vt = VirtualTime(T0 + 30)
    p = pacer(vt, reset_delay=0)
    p.primed(KEY, [quota_row(10, 10, T0 + 60 + 90)])
    assert starts(p, 2) == pytest.approx([0.0, 12.0]), "120 s / 10"


def test_shadow_policies_do_not_pace():
    vt = VirtualTime(T0)
    p = pacer(vt)
    p.primed(KEY, [quota_row(1, 1, T0 + 150, mode="shadow")])
    assert starts(p, 3) == [0.0, 0.0, 0.0]


def test_answers_update_the_standing_and_calls_in_flight_are_counted():
    vt = VirtualTime(T0)
    p = pacer(vt)
    p.primed(KEY, [])  # no quota known yet
    a, b = (p.plan(KEY, None, 60).ticket for _ in range(2))
    assert (a.start, b.start) == (0.0, 0.0), "nothing known: not paced"
    h = {"x-aigw-quota-requests-limit": "5", "x-aigw-quota-requests-remaining": "4",
         "x-aigw-quota-requests-reset": str(int(T0 + 60 + 60)),
         "ratelimit-policy": '"apikey-requests-minute";q=5;w=60'}
    p.observe(a, 200, h)
    # 4 left, one of them taken by the call still in flight: 3 over the 60 s left.
    assert starts(p, 1) == [0.0]
    assert starts(p, 1) == pytest.approx([20.0]), "20 s apart"


def test_answers_out_of_order_keep_the_least_remaining():
    vt = VirtualTime(T0)
    p = pacer(vt)
    p.primed(KEY, [quota_row(100, 100, T0 + 150)])
    t1, t2 = (p.plan(KEY, None, 60).ticket for _ in range(2))
    head = {"x-aigw-quota-requests-limit": "100", "x-aigw-quota-requests-reset": str(int(T0 + 150))}
    p.observe(t2, 200, {**head, "x-aigw-quota-requests-remaining": "50"})
    p.observe(t1, 200, {**head, "x-aigw-quota-requests-remaining": "51"})
    assert p._keys[KEY].budgets["apikey-requests-minute"].remaining == 50


@pytest.mark.parametrize("row_metric", ["tokens", "total_tokens"])
def test_a_token_quota_is_one_budget_from_the_list_and_the_headers(row_metric):
    # `GET /v1/quota` names it `tokens` (a gateway before seed 003's name: `total_tokens`); the
    # answers' headers report it under `tokens` while RateLimit-Policy names another policy.
    vt = VirtualTime(T0)
    p = pacer(vt)
    p.primed(KEY, [quota_row(30000, 30000, T0 + 86400, window="day", metric=row_metric)])
    (b,) = p._keys[KEY].budgets.values()
    assert b.metric == "tokens"
    t = p.plan(KEY, None, 60).ticket
    p.observe(t, 200, {"x-aigw-quota-tokens-limit": "30000", "x-aigw-quota-tokens-remaining": "29000",
                       "x-aigw-quota-tokens-reset": str(int(T0 + 86400)),
                       "ratelimit-policy": '"ws-requests-day";q=100000;w=86400'})
    (b,) = p._keys[KEY].budgets.values()
    assert b.remaining == 29000


def test_a_wait_past_most_wait_is_refused_at_once_with_the_time_to_come_back():
    vt = VirtualTime(T0 + 30)
    p = pacer(vt)
    p.primed(KEY, [quota_row(10, 0, T0 + 150)])
    plan = p.plan(KEY, None, allowance=10)
    assert plan.kind == "refuse"
    r = plan.refusal
    assert r.status == 429 and r.retry_at == pytest.approx(T0 + 61)
    body = json.loads(r.body)["error"]
    assert body["code"] == "wait_too_long" and body["retry_after"] == 31
    headers = dict(r.headers)
    assert headers["x-aigw-error-source"] == "client" and headers["x-should-retry"] == "false"
    assert headers["x-aigw-client-retry-at"] == str(int(T0 + 61))
    # Nothing was reserved: with patience, the call gets the slot after the window.
    assert starts(p, 1, allowance=60) == [31.0]


def test_a_call_that_cannot_wait_for_its_paced_turn_goes_while_the_quota_has_room():
    # 1000 a day, 08:00 local: the pace is one call every 86 s, more than the 60 s a call waits.
    vt = VirtualTime(T0)
    p = pacer(vt)
    p.primed(KEY, [quota_row(1000, 1000, T0 + 86400 + 90, window="day")])
    assert starts(p, 3, allowance=60) == [0.0, 0.0, 0.0], "not refused: 1000 remain"
    # A call that can wait keeps to the pace, after the calls already planned.
    assert starts(p, 1, allowance=1e9) == pytest.approx([86400 / 1000])


def test_calls_that_cannot_wait_use_what_the_window_has_left_and_no_more():
    vt = VirtualTime(T0 + 30)
    p = pacer(vt)
    p.primed(KEY, [quota_row(10, 10, T0 + 60 + 90)])
    got = starts(p, 14, allowance=10)
    # Paced: 0, 3, 6, 9; then the 6 the window still has go at once; the rest would wait for
    # the next window (31 s): told when to come back.
    assert got[:4] == pytest.approx([0.0, 3.0, 6.0, 9.0])
    assert got[4:10] == [0.0] * 6
    assert got[10:] == [None] * 4


def test_a_used_up_total_quota_is_refused_without_sending():
    vt = VirtualTime(T0)
    p = pacer(vt)
    row = quota_row(1000, 0, T0, window="total")
    row["reset_at"] = None
    p.primed(KEY, [row])
    plan = p.plan(KEY, None, 60)
    assert plan.kind == "refuse" and plan.refusal.retry_at is None
    assert json.loads(plan.refusal.body)["error"]["code"] == "quota_exceeded"


def test_a_quota_refusal_closes_the_key_until_its_reset():
    vt = VirtualTime(T0 + 10)
    p = pacer(vt)
    p.primed(KEY, [])
    t = p.plan(KEY, "m", 60).ticket
    body = error("quota_exceeded", reset_at=rfc3339(T0 + 150))
    raw = json.dumps(body).encode()
    headers = [("x-should-retry", "false"), ("x-aigw-error-source", "gateway"), ("content-type", "application/json")]
    v = p.observe(t, 429, dict(headers), body, headers, raw)
    assert (v.kind, v.retry_at) == ("final", T0 + 150)
    for model in ("m", "other"):
        plan = p.plan(KEY, model, 60)
        assert plan.kind == "refuse", "every model of the key"
        assert plan.refusal.body == raw and plan.refusal.retry_at == T0 + 150
        h = dict(plan.refusal.headers)
        assert h["x-aigw-error-source"] == "client" and h["retry-after"] == "140"
    vt.sleep(140)
    assert p.plan(KEY, "m", 60).kind == "go", "open again at the reset"


def test_a_banned_key_stays_closed():
    vt = VirtualTime(T0)
    p = pacer(vt)
    p.primed(KEY, [])
    t = p.plan(KEY, None, 60).ticket
    p.observe(t, 403, {"x-should-retry": "false"}, error("api_key_permanently_banned"))
    vt.sleep(86400 * 30)
    plan = p.plan(KEY, None, 60)
    assert plan.kind == "refuse" and plan.refusal.retry_at is None


def test_a_refusal_for_one_model_holds_that_model_only():
    vt = VirtualTime(T0)
    p = pacer(vt)
    p.primed(KEY, [])
    t = p.plan(KEY, "m", 60).ticket
    p.sent(t)
    p.observe(t, 429, {"retry-after": "2"}, error("upstream_quota_exhausted"))
    # Held 2 s, plus a random extra of up to 0.25 + 10 % of the wait (random() = 0.5 here).
    assert starts(p, 1, model="m") == pytest.approx([2.0 + 0.5 * 0.45])
    assert starts(p, 1, model="other") == [0.0]


def test_the_rate_an_upstream_let_through_spaces_the_calls_after_its_wait():
    vt = VirtualTime(T0)
    p = pacer(vt, extra_base=0, extra_share=0)
    p.primed(KEY, [])
    tickets = [p.plan(KEY, "m", 60).ticket for _ in range(25)]
    for t in tickets:
        p.sent(t)
    vt.sleep(0.5)
    for t in tickets[:20]:
        p.observe(t, 200, {})
    # The 21st is refused: 20 went through in the 0.5 s since the first call, then 1 s of wait.
    p.observe(tickets[20], 429, {"retry-after": "1"}, error("upstream_quota_exhausted"))
    # The other 4 had been sent before that refusal: they say nothing new about the rate.
    for t in tickets[21:]:
        p.observe(t, 429, {"retry-after": "1"}, error("upstream_quota_exhausted"))
    rate = 20 / 1.5
    got = starts(p, 3, model="m")
    assert got == pytest.approx([1.5, 1.5 + 1 / rate, 1.5 + 2 / rate], rel=1e-3)


def test_retry_delays_are_the_named_wait_plus_a_little_else_full_jitter():
    vt = VirtualTime(T0)
    p = pacer(vt)
    from aigw_client import Verdict

    assert p.retry_delay(Verdict("retry", wait=30.0), 1) == pytest.approx(30 + 0.5 * (0.25 + 3.0))
    assert p.retry_delay(Verdict("retry", wait=600.0), 1) == pytest.approx(600 + 0.5 * 5.0), "extra capped"
    # Full jitter: random × min(cap 8, 0.5 × 2^(attempt-1)).
    assert [p.retry_delay(Verdict("retry"), a) for a in (1, 2, 3, 6)] == pytest.approx([0.25, 0.5, 1.0, 4.0])


def test_one_reads_the_quotas_while_the_others_wait_a_moment():
    vt = VirtualTime(T0)
    p = pacer(vt)
    assert p.plan(KEY, None, 60).kind == "prime"
    other = p.plan(KEY, None, 60)
    assert (other.kind, other.wait) == ("poll", 0.05)
    assert p.plan(KEY, None, 0.01).kind == "go", "one that cannot wait goes unpaced"
    p.primed(KEY, None)  # the read failed: calls go unpaced until answers say more
    assert p.plan(KEY, None, 60).kind == "go"


def test_threads_share_one_schedule():
    vt = VirtualTime(T0)
    p = pacer(vt)
    p.primed(KEY, [quota_row(800, 800, T0 + 150)])
    got, lock = [], threading.Lock()

    def worker():
        mine = [p.plan(KEY, "m", 1e9).ticket.start for _ in range(100)]
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == pytest.approx([60 / 800 * i for i in range(800)]), "no slot given twice"


def test_a_crowd_is_spread_over_as_many_windows_as_it_needs():
    vt = VirtualTime(T0)
    p = pacer(vt)
    p.primed(KEY, [quota_row(2, 2, T0 + 60 + 75)])
    got = starts(p, 9)
    per_window = [sum(1 for t in got if w * 60 <= t < (w + 1) * 60) for w in range(5)]
    assert per_window == [2, 2, 2, 2, 1], got
    assert got[2] == pytest.approx(61.0), "a window's first call waits for the clock margin"


def test_a_bare_ratelimit_field_paces_until_its_own_reset():
    vt = VirtualTime(T0)
    p = pacer(vt)
    p.primed(KEY, [])
    t = p.plan(KEY, None, 60).ticket
    p.observe(t, 200, {"ratelimit-policy": '"burst";q=10;w=10', "ratelimit": '"burst";r=5;t=10'})
    assert starts(p, 2) == pytest.approx([0.0, 2.0]), "5 over 10 s"


def test_answers_of_a_burst_that_come_after_its_first_refusal_count_toward_the_rate():
    vt = VirtualTime(T0)
    p = pacer(vt, extra_base=0, extra_share=0)
    p.primed(KEY, [])
    tickets = [p.plan(KEY, "m", 60).ticket for _ in range(30)]
    for t in tickets:
        p.sent(t)
    vt.sleep(0.05)
    refused = {"retry-after": "1"}
    # The refusals of the burst come back first, its 20 successes just after.
    for t in tickets[20:]:
        p.observe(t, 429, refused, error("upstream_quota_exhausted"))
    for t in tickets[:20]:
        p.observe(t, 200, {})
    rate = 20 / 1.05
    assert starts(p, 2, model="m") == pytest.approx([1.05, 1.05 + 1 / rate], rel=1e-3)


def test_the_extra_after_a_hold_is_each_calls_own():
    vt = VirtualTime(T0)
    p = pacer(vt)
    p.primed(KEY, [])
    t = p.plan(KEY, "m", 60).ticket
    p.sent(t)
    p.observe(t, 429, {"retry-after": "2"}, error("upstream_quota_exhausted"))
    extra = 0.5 * 0.45
    assert starts(p, 3, model="m") == pytest.approx([2 + extra] * 3), "not chained one after the other"


def test_a_refusal_at_most_halves_the_rate_and_the_wait_itself_is_not_counted_twice():
    vt = VirtualTime(T0)
    p = pacer(vt, extra_base=0, extra_share=0, rate_growth=1e9)
    p.primed(KEY, [])
    refused = {"retry-after": "1"}

    def cycle(served, then_refused_after):
        tickets = [p.plan(KEY, "m", 1e9).ticket for _ in range(served + 1)]
        for t in tickets:
            vt.t = max(vt.t, t.start)
            p.sent(t)
        vt.sleep(then_refused_after)
        for t in tickets[:served]:
            p.observe(t, 200, {})
        p.observe(tickets[served], 429, refused, error("upstream_quota_exhausted"))

    cycle(40, 0.0)  # 40 in 0 s, then 1 s of wait: 40/s
    assert p._keys[KEY].models["m"].base_rate() == pytest.approx(40.0)
    cycle(2, 0.0)  # a short unlucky cycle would say 2/s: the rate only halves
    assert p._keys[KEY].models["m"].base_rate() == pytest.approx(20.0)


def learn_rate(p, vt, served=20, after=0.05, wait="1"):
    """A first burst: ``served`` calls go through in ``after`` s, the next is refused with a
    wait of ``wait`` s: the pacer learns ``served / (after + wait)``."""
    tickets = [p.plan(KEY, "m", 1e9).ticket for _ in range(served + 1)]
    for t in tickets:
        p.sent(t)
    vt.sleep(after)
    for t in tickets[:served]:
        p.observe(t, 200, {})
    p.observe(tickets[served], 429, {"retry-after": wait}, error("upstream_quota_exhausted"))


def test_refusals_of_one_burst_cut_the_rate_once_not_once_each():
    # The calls already paced when the upstream refuses go out one by one into the same parked
    # credential, each refused with the few milliseconds left: one burst, so one cut.
    vt = VirtualTime(T0)
    p = pacer(vt, extra_base=0, extra_share=0, rate_growth=1e9)
    p.primed(KEY, [])
    learn_rate(p, vt)  # 20 / 1.05 s
    rate = 20 / 1.05
    queued = [p.plan(KEY, "m", 1e9).ticket for _ in range(30)]
    for i, t in enumerate(queued):
        vt.t = max(vt.t, t.start)
        p.sent(t)
        vt.sleep(0.002)  # its answer comes back before the next call goes
        p.observe(t, 429, {"retry-after-ms": "3"}, error("upstream_quota_exhausted"))
    ms = p._keys[KEY].models["m"]
    assert ms.base_rate() >= rate / 2 * 0.999, "cut once, at most by half"
    # A wait the server named still bounds the next call.
    assert ms.hold == pytest.approx(vt.t + 0.003)
    # The calls queued behind them are spaced at that rate, not minutes apart.
    got = starts(p, 10, model="m", allowance=8)
    assert None not in got, "no call refused locally with wait_too_long"
    assert got[0] >= ms.hold
    assert got[-1] - vt.t < 10 / (rate / 2) + 0.01


def test_a_run_of_cuts_stops_at_the_floor():
    # Each refusal from a call sent after the previous cut, in a cycle where nothing was served:
    # each may halve the rate, but never below min_rate (the named waits still hold the calls).
    vt = VirtualTime(T0)
    p = pacer(vt, extra_base=0, extra_share=0, rate_growth=1e9, min_rate=1.0)
    p.primed(KEY, [])
    learn_rate(p, vt)
    for _ in range(30):
        t = p.plan(KEY, "m", 1e9).ticket
        vt.t = max(vt.t, t.start)
        p.sent(t)
        vt.sleep(0.002)
        p.observe(t, 429, {"retry-after-ms": "3"}, error("upstream_quota_exhausted"))
    assert p._keys[KEY].models["m"].base_rate(1.0) == pytest.approx(1.0)
    got = starts(p, 5, model="m", allowance=8)
    assert got[1] - got[0] == pytest.approx(1.0, rel=1e-3)


def test_the_floor_does_not_raise_a_rate_the_upstream_measured_lower():
    vt = VirtualTime(T0)
    p = pacer(vt, extra_base=0, extra_share=0, rate_growth=1e9, min_rate=1.0)
    p.primed(KEY, [])
    learn_rate(p, vt, served=1, after=0.0, wait="20")  # a slow provider: 1 call per 20 s
    assert p._keys[KEY].models["m"].base_rate(1.0) == pytest.approx(1 / 20)
