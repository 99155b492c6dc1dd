"""The pacing and retry decisions, shared by every call through one client: no I/O, no sleeping.

Per gateway key, the pacer keeps the quota standing the last answers reported and hands out start
times so that what remains of each quota lasts until its window ends: one call every
``time left / calls left``, spread, not burst-then-stop. Pacing is a preference and a quota a
limit: a call that cannot wait for its paced turn (``most_wait``) goes as early as the quota has
room for it, rather than fail. Per key and model it keeps what refusals
said: a named wait holds every call of that scope until it has passed (plus a small random extra
per call), and the rate at which the upstream let calls through before it refused, which spaces
the calls after the wait. A refusal that must not be retried (a used-up quota, a banned key, a
wait past ``most_wait``) closes its scope: later calls are refused at once, without being sent,
with the same answer and the time to come back.

All methods take a lock for a few arithmetic steps only and never wait, so one pacer serves
threads and asyncio tasks alike; the transports do the sleeping.
"""

from __future__ import annotations

import bisect
import math
import random as _random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from ._signals import (
    GATEWAY_RESET_DELAY_MIN,
    Reading,
    Verdict,
    classify,
    metric_name,
    parse_rfc3339,
    parse_standing,
    window_seconds,
)


@dataclass
class Settings:
    """How patient a client is. Every wait of one call (pacing and retries together) stays
    within ``most_wait``; a call that would have to wait longer fails at once, saying when to
    come back. A call whose paced turn is later than that goes as soon as the quota has room
    for it: pacing never turns away a call the gateway would serve."""

    #: Seconds one call may spend waiting in all, pacing and retries together.
    most_wait: float = 60.0
    #: Attempts per call, the first included.
    max_attempts: int = 4
    #: Full-jitter backoff when a refusal names no wait: a random wait from 0 up to
    #: ``min(backoff_cap, backoff_base * 2 ** (attempt - 1))`` seconds.
    backoff_base: float = 0.5
    backoff_cap: float = 8.0
    #: After a named wait, a random extra from 0 up to ``extra_base + extra_share * wait``
    #: seconds, at most ``extra_cap``, so that the callers it held do not all come back at once.
    extra_base: float = 0.25
    extra_share: float = 0.1
    extra_cap: float = 5.0
    #: Seconds after a quota window's end before the next window's allowance is used, for the
    #: difference between this machine's clock and the gateway's.
    clock_margin: float = 1.0
    #: How much later than a window's real end the gateway reports the reset (aigw: 60 to 120 s,
    #: windows ending on whole minutes). 0 paces until the reported reset itself.
    reset_delay: float = GATEWAY_RESET_DELAY_MIN
    #: A scope closed with no known end (a ``total`` quota used up) lets one call through to
    #: look again after this many seconds.
    recheck: float = 60.0
    #: The rate learned from an upstream's refusals grows back by its own size over this many
    #: seconds without a refusal.
    rate_growth: float = 10.0
    #: Calls per second below which refusals do not push the learned rate (unless the upstream
    #: itself let fewer through): a run of refusals cannot space the calls absurdly far apart,
    #: and the waits the refusals name still hold the calls.
    min_rate: float = 1.0
    #: Read ``GET /v1/quota`` before the first call of a key, so that the first calls are paced.
    prime: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.most_wait < 0:
            raise ValueError("most_wait must not be negative")
        if self.min_rate < 0:
            raise ValueError("min_rate must not be negative")


@dataclass
class Budget:
    """One quota of a key as the pacer knows it."""

    metric: str
    limit: float
    remaining: float
    #: The window's real end, on the monotonic clock; None: the window never ends (``total``).
    end: Optional[float]
    window: Optional[float]
    name: Optional[str] = None
    #: Average use of one call, for metrics other than requests (learned from the answers).
    cost: Optional[float] = None

    def units_per_call(self) -> Optional[float]:
        return 1.0 if self.metric == "requests" else self.cost


@dataclass
class Closure:
    """A scope refused without sending, and the answer given meanwhile."""

    until: Optional[float]  # monotonic; None: no known end
    since: float
    forever: bool
    retry_at: Optional[float]  # Unix seconds
    status: int
    headers: list
    body: bytes


@dataclass
class ModelState:
    """What refusals said about one model's upstreams, for one key."""

    hold: float = 0.0
    hold_wait: float = 0.0
    tat: float = 0.0
    #: The current cycle (since the last refusal): its start, and the calls sent in it that
    #: were served.
    cycle_start: Optional[float] = None
    served: int = 0
    last_refusal: float = -math.inf
    #: When calls could go again after the last refusal's wait.
    resume: float = -math.inf
    #: The cycle a refusal ended: (its start, when calls could go in it, its end, the wait the
    #: refusal named), the calls sent in it that were served (answers still coming in after the
    #: refusal count), and the rate learned before it.
    prev: Optional[tuple] = None
    prev_served: int = 0
    before: Optional[float] = None
    closed: Optional[Closure] = None

    def base_rate(self, floor: float = 0.0) -> Optional[float]:
        """The rate the upstream let through over the last cycle a refusal ended: the calls it
        served over the time calls could go and the wait it asked for; never less than half the
        rate learned before (one cut at most halves it), nor than ``floor`` when the rate
        learned before was at least that."""
        if self.prev is None:
            return None
        _, going, end, wait = self.prev
        rate = self.prev_served / max(end - going + wait, 1e-3)
        if self.before:
            rate = max(rate, self.before / 2.0, min(self.before, floor))
        return rate or None


@dataclass
class KeyState:
    budgets: dict = field(default_factory=dict)
    #: Quota slots of the calls planned and not yet answered, in order.
    slots: list = field(default_factory=list)
    tat: float = 0.0
    hold: float = 0.0
    hold_wait: float = 0.0
    closed: Optional[Closure] = None
    #: ``None`` (never read), ``"reading"``, ``"done"``; and when it was last asked for.
    primed: Optional[str] = None
    prime_asked: float = -math.inf
    models: dict = field(default_factory=dict)


@dataclass
class Ticket:
    """One planned attempt."""

    key: str
    model: Optional[str]
    quota_slot: float
    start: float
    sent_at: Optional[float] = None
    done: bool = False
    #: When the pacer gave it its turn (monotonic).
    planned_at: Optional[float] = None


@dataclass(frozen=True)
class Plan:
    """The pacer's answer to "may this attempt start?".

    ``go``: sleep ``wait`` seconds, then send (and report with ``ticket``); ``prime``: read the
    key's quotas first (``GET /v1/quota``) and report them, then plan again; ``poll``: another
    call is reading them, plan again after ``wait``; ``refuse``: do not send; answer with
    ``refusal``."""

    kind: str
    wait: float = 0.0
    ticket: Optional[Ticket] = None
    refusal: Optional["LocalRefusal"] = None


@dataclass(frozen=True)
class LocalRefusal:
    """An answer given without sending: the one that closed the scope, or a wait too long."""

    status: int
    headers: list
    body: bytes
    #: Unix seconds when calling again makes sense; None: not known (or never).
    retry_at: Optional[float]


#: How often calls waiting for another call's quota read look again.
POLL = 0.05


class Pacer:
    """Pacing and retry decisions for every key used through one client (or shared by several).

    ``clock`` is monotonic seconds, ``wall`` Unix seconds, ``random`` a function returning a
    float in [0, 1): injected by tests."""

    def __init__(
        self,
        settings: Optional[Settings] = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        random: Callable[[], float] = _random.random,
    ) -> None:
        self.settings = settings or Settings()
        self._clock = clock
        self._wall = wall
        self._random = random
        self._lock = threading.Lock()
        self._keys: dict[str, KeyState] = {}

    # -- time ---------------------------------------------------------------------------------

    def _mono_of(self, unix: float) -> float:
        return self._clock() + (unix - self._wall())

    def _real_end(self, reset: float) -> float:
        """A window's real end (Unix seconds) from the reset the gateway reports."""
        delay = self.settings.reset_delay
        if delay <= 0:
            return reset
        # The latest whole minute at least `delay` before the reported reset.
        return math.floor((reset - delay) / 60.0) * 60.0

    # -- planning -----------------------------------------------------------------------------

    def plan(self, key: str, model: Optional[str], allowance: float) -> Plan:
        """When the next attempt of a call on ``key`` for ``model`` may start, if it may wait at
        most ``allowance`` seconds more."""
        s = self.settings
        with self._lock:
            now = self._clock()
            ks = self._keys.setdefault(key, KeyState())
            ms = ks.models.setdefault(model, ModelState()) if model is not None else None
            for closed in (ks.closed, ms.closed if ms else None):
                refusal = self._still_closed(closed, now)
                if refusal is not None:
                    return Plan("refuse", refusal=refusal)
            if s.prime and ks.primed != "done":
                # One call reads the key's quotas; the others look again shortly (or go
                # unpaced when they cannot wait even that long).
                if ks.primed is None or now - ks.prime_asked > 5.0:
                    ks.primed, ks.prime_asked = "reading", now
                    return Plan("prime")
                if allowance >= POLL:
                    return Plan("poll", wait=POLL)

            # The quota schedule of the key.
            quota_slot, interval, stale, used_up = self._quota_slot(ks, now, max(now, ks.tat))
            if used_up is not None:
                return Plan("refuse", refusal=used_up)
            if stale and s.prime:
                # A window passed whose length is unknown: read the quotas again first.
                ks.primed, ks.prime_asked = "reading", now
                return Plan("prime")
            scheduled, hold_wait = self._held(ks, ms, quota_slot, now)
            paced = True
            if scheduled - now > allowance and quota_slot > now:
                # Pacing is a preference, a quota is a limit: a call that cannot wait for its
                # paced turn goes as early as the quota has room for it rather than fail (the
                # calls already planned keep their slots; the pace goes on after them).
                early = self._quota_slot(ks, now, now)[0]
                if early < quota_slot:
                    quota_slot, paced = early, False
                    scheduled, hold_wait = self._held(ks, ms, quota_slot, now, in_turn=False)
            # The random extra after a hold is this call's own: it does not delay the others.
            start = scheduled + (self._extra(hold_wait) if hold_wait > 0 else 0.0)
            wait = start - now
            if wait > allowance:
                return Plan("refuse", refusal=self._too_long(wait, now))
            if paced:
                ks.tat = quota_slot + interval
            bisect.insort(ks.slots, quota_slot)
            if ms is not None:
                rate = self._rate(ms, now)
                after = scheduled + (1.0 / rate if rate else 0.0)
                ms.tat = after if paced else max(ms.tat, after)
                if ms.cycle_start is None:
                    ms.cycle_start = now
            ticket = Ticket(key, model, quota_slot, start, planned_at=now)
            return Plan("go", wait=max(wait, 0.0), ticket=ticket)

    def _held(self, ks: KeyState, ms: Optional[ModelState], quota_slot: float, now: float,
              in_turn: bool = True):
        """When a call whose quota slot is ``quota_slot`` may start given the holds named by
        refusals and the rate the upstream let through, and the wait of the hold it is under.
        A call out of its paced turn follows the calls planned before it only where an
        upstream's rate spaces them."""
        start = max(quota_slot, ks.hold)
        hold_wait = ks.hold_wait if now < ks.hold else 0.0
        if ms is not None:
            if now < ms.hold:
                hold_wait = max(hold_wait, ms.hold_wait)
            start = max(start, ms.hold)
            if in_turn or self._rate(ms, now):
                start = max(start, ms.tat)
        return start, hold_wait

    def _still_closed(self, c: Optional[Closure], now: float) -> Optional[LocalRefusal]:
        if c is None:
            return None
        if c.forever or (c.until is not None and now < c.until) or (
            c.until is None and now - c.since < self.settings.recheck
        ):
            headers = [(k, v) for k, v in c.headers if k.lower() not in ("retry-after", "retry-after-ms")]
            if c.until is not None:
                left = max(c.until - now, 0.0)
                headers += [("retry-after", str(math.ceil(left))), ("retry-after-ms", str(math.ceil(left * 1000)))]
            return LocalRefusal(c.status, _local(headers, c.retry_at), c.body, c.retry_at)
        return None

    def _quota_slot(self, ks: KeyState, now: float, slot: float):
        """The earliest quota slot at or after ``slot``, the spacing to the next one, whether a
        budget went stale, and a refusal when a never-ending quota is used up."""
        margin = self.settings.clock_margin
        stale = False
        # Each move passes a window's end; the windows ahead are full only of planned calls.
        for _ in range(100_000):
            moved = False
            for bid, b in list(ks.budgets.items()):
                end, remaining, start = self._window_at(b, slot)
                if end is None and b.end is not None:
                    if now >= b.end + margin:
                        # Past a window whose length is unknown: forget it until told again.
                        del ks.budgets[bid]
                        stale = True
                    # (At a later slot, its next window is not known yet: no constraint.)
                    continue
                if end is None:
                    if remaining <= 0:
                        return slot, 0.0, stale, self._used_up(b)
                    continue
                left = self._calls_left(ks, b, remaining, start, end)
                # Used up (or about to be), or in the margin after its end: the next window.
                if left is not None and left < 1 or remaining <= 0 or slot >= end:
                    slot, moved = end + margin, True
            if not moved:
                break
        interval = 0.0
        for b in ks.budgets.values():
            end, remaining, start = self._window_at(b, slot)
            if end is None:
                continue
            left = self._calls_left(ks, b, remaining, start, end)
            if left is not None and left >= 1:
                interval = max(interval, (end - slot) / left)
        return slot, interval, stale, None

    def _window_at(self, b: Budget, t: float):
        """A budget's window (end, remaining, start) as it will stand at ``t``: the window after
        the one last reported when that one has ended and its length is known."""
        if b.end is None:
            return None, b.remaining, None
        margin = self.settings.clock_margin
        if t < b.end + margin:
            return b.end, b.remaining, (b.end - b.window if b.window else -math.inf)
        if not b.window:
            return None, b.remaining, None
        k = math.floor((t - b.end - margin) / b.window) + 1
        end = b.end + k * b.window
        return end, b.limit, end - b.window

    @staticmethod
    def _calls_left(ks: KeyState, b: Budget, remaining: float, start: float, end: float) -> Optional[float]:
        per_call = b.units_per_call()
        if per_call is None or per_call <= 0:
            return None
        planned = bisect.bisect_left(ks.slots, end) - bisect.bisect_left(ks.slots, start)
        return remaining / per_call - planned

    def _rate(self, ms: ModelState, now: float) -> Optional[float]:
        base = ms.base_rate(self.settings.min_rate)
        if base is None:
            return None
        return base * (1.0 + max(now - ms.last_refusal, 0.0) / self.settings.rate_growth)

    def _extra(self, wait: float) -> float:
        s = self.settings
        return self._random() * min(s.extra_cap, s.extra_base + s.extra_share * wait)

    def _too_long(self, wait: float, now: float) -> LocalRefusal:
        retry_at = self._wall() + wait
        secs = math.ceil(wait)
        body = _error_body(
            f"aigw_client: the next call on this key may start in {secs} s, later than most_wait "
            f"({self.settings.most_wait:g} s); it was not sent",
            "wait_too_long",
            retry_after=secs,
        )
        headers = [("retry-after", str(secs)), ("retry-after-ms", str(math.ceil(wait * 1000)))]
        return LocalRefusal(429, _local(headers, retry_at), body, retry_at)

    def _used_up(self, b: Budget) -> LocalRefusal:
        limit = int(b.limit) if float(b.limit).is_integer() else b.limit
        body = _error_body(
            f"aigw_client: the {b.name or b.metric} quota ({limit}) is used up and never resets; "
            "it was not sent",
            "quota_exceeded",
        )
        return LocalRefusal(429, _local([], None), body, None)

    # -- after an attempt ---------------------------------------------------------------------

    def sent(self, ticket: Ticket) -> None:
        """The attempt went out now."""
        with self._lock:
            ticket.sent_at = self._clock()

    def cancel(self, ticket: Ticket) -> None:
        """The attempt was not sent, or its answer will not be reported."""
        with self._lock:
            self._release(ticket)

    def _release(self, ticket: Ticket) -> Optional[KeyState]:
        if ticket.done:
            return None
        ticket.done = True
        ks = self._keys.get(ticket.key)
        if ks is None:
            return None
        i = bisect.bisect_left(ks.slots, ticket.quota_slot)
        if i < len(ks.slots) and ks.slots[i] == ticket.quota_slot:
            del ks.slots[i]
        return ks

    def observe(
        self,
        ticket: Ticket,
        status: int,
        headers: Mapping[str, str],
        body: Any = None,
        raw_headers: Optional[list] = None,
        raw_body: bytes = b"",
    ) -> Verdict:
        """Learns from an answer and says what to do with it. ``body`` is the parsed JSON of an
        error answer (None for a success); ``raw_headers`` and ``raw_body`` are kept to answer
        later calls of a scope this answer closes."""
        with self._lock:
            now, unix = self._clock(), self._wall()
            ks = self._release(ticket) or self._keys.setdefault(ticket.key, KeyState())
            self._learn_standing(ks, parse_standing(headers, unix), now)
            verdict = classify(status, headers, body, unix)
            ms = ks.models.setdefault(ticket.model, ModelState()) if ticket.model is not None else None
            if verdict.kind == "ok":
                if ms is not None:
                    # Credited to the cycle the call was sent in.
                    sent = ticket.sent_at if ticket.sent_at is not None else now
                    if ms.cycle_start is None or sent >= ms.cycle_start:
                        ms.served += 1
                    elif ms.prev is not None and sent >= ms.prev[0]:  # the cycle's start
                        ms.prev_served += 1
            elif verdict.kind == "retry" and verdict.wait is not None:
                self._hold(ks, ms, verdict, ticket, now)
            elif verdict.kind == "final" and verdict.close:
                until = self._mono_of(verdict.retry_at) if verdict.retry_at is not None else None
                closure = Closure(until, now, verdict.forever, verdict.retry_at, status,
                                  list(raw_headers or []), raw_body)
                if verdict.scope == "model" and ms is not None:
                    ms.closed = closure
                else:
                    ks.closed = closure
            return verdict

    def _hold(self, ks: KeyState, ms: Optional[ModelState], v: Verdict, ticket: Ticket, now: float) -> None:
        wait = v.wait or 0.0
        if v.scope == "model" and ms is not None:
            if now + wait > ms.hold:
                ms.hold, ms.hold_wait = now + wait, wait
            # One cut per burst, as TCP cuts its window once per window of losses: only an
            # attempt given its turn after the last cut tells something new about the rate. The
            # calls paced before it (sent, or still waiting for their turn and sent into the
            # same parked credential, each refused with the few milliseconds left) do not cut
            # again; their named waits still hold the calls.
            planned = ticket.planned_at
            if planned is None:
                planned = ticket.sent_at if ticket.sent_at is not None else now
            if planned >= ms.last_refusal:
                ms.before = ms.base_rate(self.settings.min_rate)
                start = ms.cycle_start if ms.cycle_start is not None else now
                ms.prev, ms.prev_served = (start, max(start, ms.resume), now, wait), ms.served
                ms.cycle_start, ms.served, ms.last_refusal = now, 0, now
                ms.resume = now + wait
                ms.tat = max(ms.tat, ms.hold)
        elif now + wait > ks.hold:
            ks.hold, ks.hold_wait = now + wait, wait

    def retry_delay(self, verdict: Verdict, attempt: int) -> float:
        """How long the call itself waits before its next attempt, after attempt number
        ``attempt`` (1 for the first) got ``verdict``: the named wait plus a small random extra,
        else full jitter."""
        s = self.settings
        if verdict.wait is not None:
            return verdict.wait + self._extra(verdict.wait)
        return self._random() * min(s.backoff_cap, s.backoff_base * 2 ** (attempt - 1))

    # -- quota standing -----------------------------------------------------------------------

    def primed(self, key: str, rows: Optional[list]) -> None:
        """The key's quotas as ``GET /v1/quota`` lists them (None: could not be read)."""
        with self._lock:
            now, unix = self._clock(), self._wall()
            ks = self._keys.setdefault(key, KeyState())
            ks.primed = "done"
            readings = []
            for r in rows or []:
                if not isinstance(r, dict) or r.get("mode", "enforce") != "enforce":
                    continue
                try:
                    limit, remaining = float(r["limit"]), float(r["remaining"])
                except (KeyError, TypeError, ValueError):
                    continue
                window = r.get("window")
                reset = parse_rfc3339(r.get("reset_at"))
                name = f"{r.get('subject')}-{r.get('metric')}-{window}"
                # `tokens`, whichever name the gateway lists (`total_tokens` before seed 003's).
                readings.append(Reading(metric_name(str(r.get("metric"))), limit, remaining, reset,
                                        window_seconds(window), name))
            self._learn_standing(ks, readings, now, replace=True)

    def _learn_standing(self, ks: KeyState, readings: list, now: float, replace: bool = False) -> None:
        for r in readings:
            end = None
            if r.reset is not None:
                end = self._mono_of(self._real_end(r.reset) if r.delayed else r.reset)
            bid, b = self._match(ks, r)
            if b is None:
                ks.budgets[bid] = Budget(r.metric, r.limit, r.remaining, end, r.window, r.name)
                continue
            if r.window is not None:
                b.window = r.window
            if r.name is not None and b.name is None:
                b.name = r.name
            same_window = end is not None and b.end is not None and abs(end - b.end) < 1.0
            if same_window and not replace:
                if b.metric != "requests" and r.remaining < b.remaining:
                    sample = b.remaining - r.remaining
                    b.cost = sample if b.cost is None else 0.7 * b.cost + 0.3 * sample
                # Answers may arrive out of order: within a window, the least remaining holds.
                b.remaining = min(b.remaining, r.remaining)
                b.limit = r.limit
            elif end is None or b.end is None or end >= b.end or replace:
                b.remaining, b.limit, b.end = r.remaining, r.limit, end

    @staticmethod
    def _match(ks: KeyState, r: Reading):
        if r.name is not None and r.name in ks.budgets:
            return r.name, ks.budgets[r.name]
        for bid, b in ks.budgets.items():
            if b.metric == r.metric and b.limit == r.limit and (r.name is None or b.name is None):
                return bid, b
        # The tightest policy of a metric can change: the reading then describes another one.
        return (r.name or f"{r.metric}:{r.limit:g}"), None


def _error_body(message: str, code: str, retry_after: Optional[int] = None) -> bytes:
    import json

    err: dict = {"message": message, "type": "rate_limit_error", "code": code, "param": None}
    if retry_after is not None:
        err["retry_after"] = retry_after
    return json.dumps({"error": err}).encode()


def _local(headers: list, retry_at: Optional[float]) -> list:
    """Headers of an answer given without sending: ``x-aigw-error-source: client``, never to be
    retried by the SDK, and the time to come back."""
    drop = ("x-aigw-error-source", "x-should-retry", "x-aigw-client-retry-at", "content-length",
            "content-encoding", "transfer-encoding")
    out = [(k, v) for k, v in headers if k.lower() not in drop]
    out += [("x-aigw-error-source", "client"), ("x-should-retry", "false")]
    if not any(k.lower() == "content-type" for k, _ in out):
        out.append(("content-type", "application/json"))
    if retry_at is not None:
        out.append(("x-aigw-client-retry-at", str(math.ceil(retry_at))))
    return out
