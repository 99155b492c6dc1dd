"""Virtual time and a simulated gateway, so that pacing is tested without sleeping."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import math
from datetime import datetime, timedelta, timezone

from aigw_client._httpx import httpx

#: A Unix time on a whole minute (2027-01-15T08:00:00Z): windows are easy to reason about.
T0 = 1_800_000_000.0 - (1_800_000_000.0 % 60)


class VirtualTime:
    """A clock that moves only when something sleeps. ``sleep`` serves one thread; ``asleep``
    and ``run`` serve many asyncio tasks, waking them in time order."""

    def __init__(self, start: float = T0):
        self.t = 0.0
        self.start = start
        self.slept: list[float] = []
        self._sleepers: list = []
        self._seq = itertools.count()

    def clock(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.start + self.t

    def sleep(self, d: float) -> None:
        self.slept.append(d)
        self.t += max(d, 0.0)

    async def asleep(self, d: float) -> None:
        self.slept.append(d)
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.t + max(d, 0.0), next(self._seq), fut))
        await fut

    async def run(self, *coros):
        """Runs ``coros`` to the end, moving time to the next wake-up whenever all are blocked."""
        tasks = [asyncio.ensure_future(c) for c in coros]
        while not all(t.done() for t in tasks):
            for _ in range(200):  # let every runnable task reach its next sleep
                await asyncio.sleep(0)
            if self._sleepers:
                wake, _, fut = heapq.heappop(self._sleepers)
                self.t = max(self.t, wake)
                fut.set_result(None)
        return [t.result() for t in tasks]


def rfc3339(unix: float, offset_hours: int = 8) -> str:
    tz = timezone(timedelta(hours=offset_hours))
    return datetime.fromtimestamp(unix, tz).isoformat(timespec="seconds")


class SimGateway:
    """Just enough of aigw for the pacer: one key with a requests-per-minute quota (answers carry
    the quota headers, the reset reported ``delay`` seconds after the window's end), refusals of
    a used-up quota, and scripted answers."""

    def __init__(self, vt: VirtualTime, limit: int, delay: int = 90, window: int = 60):
        self.vt, self.limit, self.delay, self.window = vt, limit, delay, window
        self.used: dict[float, int] = {}
        self.calls: list[tuple[float, int]] = []  # (virtual time, status)
        self.quota_reads = 0
        self.script: list = []  # answers to give first: (status, headers, body)

    def _standing(self):
        now = self.vt.wall()
        start = math.floor(now / self.window) * self.window
        end = start + self.window
        return start, end, end + self.delay

    def headers(self, remaining: int, reset: float, now: float) -> dict:
        return {
            "x-aigw-quota-requests-limit": str(self.limit),
            "x-aigw-quota-requests-remaining": str(max(remaining, 0)),
            "x-aigw-quota-requests-reset": str(int(reset)),
            "ratelimit-policy": f'"apikey-requests-minute";q={self.limit};w={self.window}',
            "ratelimit": f'"apikey-requests-minute";r={max(remaining, 0)};t={math.ceil(reset - now)}',
        }

    def handler(self, request: httpx.Request) -> httpx.Response:
        now = self.vt.wall()
        start, end, reset = self._standing()
        used = self.used.get(start, 0)
        if request.url.path.endswith("/v1/quota"):
            self.quota_reads += 1
            row = {"subject": "apikey", "metric": "requests", "window": "minute", "mode": "enforce",
                   "limit": self.limit, "used": used, "remaining": max(self.limit - used, 0),
                   "reset_at": rfc3339(reset)}
            return httpx.Response(200, json={"object": "list", "data": [row]})
        if self.script:
            status, headers, body = self.script.pop(0)
            self.calls.append((self.vt.t, status))
            return httpx.Response(status, headers=headers, json=body)
        if used >= self.limit:
            self.calls.append((self.vt.t, 429))
            h = self.headers(0, reset, now)
            h["x-should-retry"] = "false"
            h["x-aigw-error-source"] = "gateway"
            body = {"error": {"message": "rate limit exceeded on apikey requests/minute",
                              "type": "rate_limit_error", "code": "quota_exceeded", "subject": "apikey",
                              "metric": "requests", "window": "minute", "limit": self.limit,
                              "used": used, "reset_at": rfc3339(reset)}}
            return httpx.Response(429, headers=h, json=body)
        self.used[start] = used + 1
        self.calls.append((self.vt.t, 200))
        return httpx.Response(200, headers=self.headers(self.limit - used - 1, reset, now),
                              json={"id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                                    "model": "m", "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": "hi"}}],
                                    "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                              "total_tokens": 2}})

    async def ahandler(self, request: httpx.Request) -> httpx.Response:
        return self.handler(request)


def chat_request(key: str = "sk-aigw-test", model: str = "m", base: str = "http://gw.test/v1") -> httpx.Request:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
    return httpx.Request("POST", f"{base}/chat/completions", content=body,
                         headers={"authorization": f"Bearer {key}", "content-type": "application/json"})


def error(code: str, status: int = 429, **fields) -> dict:
    return {"error": {"message": code, "type": "rate_limit_error", "code": code, "param": None, **fields}}
