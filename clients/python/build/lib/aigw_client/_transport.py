"""httpx transports that pace and retry every call through a :class:`~aigw_client.Pacer`.

They wrap the transport that really sends (httpx's own by default) and are given to the official
SDKs as ``http_client=httpx.Client(transport=...)``. Every error answer they pass on carries
``x-should-retry: false``: it is final, so an SDK whose ``max_retries`` is not 0 does not retry it
again (one retry layer, end to end). An SDK that retries all the same (after a connection error)
is counted: its retries are single attempts.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import time
from typing import Any, Awaitable, Callable, Optional

from ._httpx import httpx
from ._pacer import LocalRefusal, Pacer, Settings, Ticket
from ._signals import Verdict

log = logging.getLogger("aigw_client")

#: Errors raised before anything was sent: safe to try again.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: Connection pool limits of the SDKs' own clients.
_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
#: The largest request body read to find the model it names.
_MODEL_SCAN_LIMIT = 2 * 1024 * 1024


def key_of(request: "httpx.Request") -> str:
    """The gateway key a request presents, as an opaque id (the key itself is not kept)."""
    h = request.headers
    cred = h.get("authorization") or h.get("x-api-key") or ""
    origin = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
    return hashlib.sha256(f"{origin}\0{cred}".encode()).hexdigest()[:24]


def model_of(request: "httpx.Request") -> Optional[str]:
    """The ``model`` a JSON request body names, if any."""
    if request.method != "POST":
        return None
    try:
        content = request.content
    except Exception:  # a streamed upload: not read here
        return None
    if not content or len(content) > _MODEL_SCAN_LIMIT or content[:1] not in (b"{", b" ", b"\n"):
        return None
    try:
        body = json.loads(content)
    except ValueError:
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


def quota_request(request: "httpx.Request") -> "httpx.Request":
    """``GET /v1/quota`` on the same gateway, with the same key."""
    path = request.url.path
    i = path.find("/v1/")
    prefix = path[:i] if i >= 0 else ""
    url = request.url.copy_with(path=f"{prefix}/v1/quota", query=None)
    headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "x-api-key")}
    return httpx.Request("GET", url, headers=headers, extensions=request.extensions)


def sdk_retry(request: "httpx.Request") -> bool:
    """Whether this request is an SDK's own retry (the official SDKs number their attempts)."""
    try:
        return int(request.headers.get("x-stainless-retry-count", "0")) > 0
    except ValueError:
        return False


def _error_json(response: "httpx.Response") -> Any:
    try:
        return json.loads(response.content)
    except ValueError:
        return None


def _local_response(refusal: LocalRefusal, request: "httpx.Request") -> "httpx.Response":
    return httpx.Response(refusal.status, headers=refusal.headers, content=refusal.body, request=request)


def _final(response: "httpx.Response", verdict: Verdict, retry_at: Optional[float]) -> "httpx.Response":
    """Marks an error answer as final for the SDK, with the time to come back if known."""
    response.headers["x-should-retry"] = "false"
    at = retry_at if retry_at is not None else verdict.retry_at
    if at is not None:
        response.headers["x-aigw-client-retry-at"] = str(math.ceil(at))
    return response


class _Base:
    def __init__(self, pacer: Optional[Pacer], settings: Optional[Settings], wall: Callable[[], float]):
        if pacer is not None and settings is not None:
            raise ValueError("give either a pacer or settings, not both")
        self.pacer = pacer or Pacer(settings)
        self._wall = wall
        self._warned = False

    def _sdk_retrying(self, request: "httpx.Request") -> bool:
        if sdk_retry(request):
            if not self._warned:
                self._warned = True
                log.warning("the SDK retries on top of aigw_client: create it with max_retries=0 "
                            "(its retries are counted as single attempts meanwhile)")
            return True
        return False


class PacedTransport(_Base, httpx.BaseTransport):
    """A synchronous transport for ``httpx.Client`` (the SDKs' ``OpenAI`` / ``Anthropic``)."""

    def __init__(
        self,
        transport: Optional["httpx.BaseTransport"] = None,
        *,
        pacer: Optional[Pacer] = None,
        settings: Optional[Settings] = None,
        sleep: Callable[[float], None] = time.sleep,
        wall: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(pacer, settings, wall)
        self._inner = transport or httpx.HTTPTransport(limits=_LIMITS)
        self._sleep = sleep

    def handle_request(self, request: "httpx.Request") -> "httpx.Response":
        request.read()
        pacer, s = self.pacer, self.pacer.settings
        key, model = key_of(request), model_of(request)
        single = self._sdk_retrying(request)
        waited, attempt = 0.0, 0
        while True:
            plan = pacer.plan(key, model, s.most_wait - waited)
            if plan.kind == "prime":
                pacer.primed(key, self._read_quota(request))
                continue
            if plan.kind == "poll":
                self._sleep(plan.wait)
                waited += plan.wait
                continue
            if plan.kind == "refuse":
                return _local_response(plan.refusal, request)
            ticket = plan.ticket
            try:
                if plan.wait > 0:
                    self._sleep(plan.wait)
                    waited += plan.wait
                pacer.sent(ticket)
                attempt += 1
                response = self._inner.handle_request(request)
            except _NOT_SENT:
                pacer.cancel(ticket)
                delay = pacer.retry_delay(Verdict("retry"), attempt)
                if single or attempt >= s.max_attempts or waited + delay > s.most_wait:
                    raise
                self._sleep(delay)
                waited += delay
                continue
            except BaseException:
                pacer.cancel(ticket)
                raise
            verdict = self._observe(ticket, response)
            if verdict.kind == "ok":
                return response
            if verdict.kind == "retry":
                delay = pacer.retry_delay(verdict, attempt)
                if not single and attempt < s.max_attempts and waited + delay <= s.most_wait:
                    response.close()
                    self._sleep(delay)
                    waited += delay
                    continue
                return _final(response, verdict, self._wall() + delay)
            return _final(response, verdict, None)

    def _observe(self, ticket: Ticket, response: "httpx.Response") -> Verdict:
        body = None
        if response.status_code >= 400:
            try:
                response.read()
            except BaseException:
                self.pacer.cancel(ticket)
                raise
            body = _error_json(response)
        return self.pacer.observe(ticket, response.status_code, response.headers, body,
                                  list(response.headers.items()), response.content if body is not None else b"")

    def _read_quota(self, request: "httpx.Request") -> Optional[list]:
        try:
            r = self._inner.handle_request(quota_request(request))
            try:
                r.read()
            finally:
                r.close()
        except httpx.HTTPError:
            return None
        return _quota_rows(r)

    def close(self) -> None:
        self._inner.close()


class AsyncPacedTransport(_Base, httpx.AsyncBaseTransport):
    """An asynchronous transport for ``httpx.AsyncClient`` (``AsyncOpenAI`` / ``AsyncAnthropic``)."""

    def __init__(
        self,
        transport: Optional["httpx.AsyncBaseTransport"] = None,
        *,
        pacer: Optional[Pacer] = None,
        settings: Optional[Settings] = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        wall: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(pacer, settings, wall)
        self._inner = transport or httpx.AsyncHTTPTransport(limits=_LIMITS)
        self._sleep = sleep

    async def handle_async_request(self, request: "httpx.Request") -> "httpx.Response":
        await request.aread()
        pacer, s = self.pacer, self.pacer.settings
        key, model = key_of(request), model_of(request)
        single = self._sdk_retrying(request)
        waited, attempt = 0.0, 0
        while True:
            plan = pacer.plan(key, model, s.most_wait - waited)
            if plan.kind == "prime":
                pacer.primed(key, await self._read_quota(request))
                continue
            if plan.kind == "poll":
                await self._sleep(plan.wait)
                waited += plan.wait
                continue
            if plan.kind == "refuse":
                return _local_response(plan.refusal, request)
            ticket = plan.ticket
            try:
                if plan.wait > 0:
                    await self._sleep(plan.wait)
                    waited += plan.wait
                pacer.sent(ticket)
                attempt += 1
                response = await self._inner.handle_async_request(request)
            except _NOT_SENT:
                pacer.cancel(ticket)
                delay = pacer.retry_delay(Verdict("retry"), attempt)
                if single or attempt >= s.max_attempts or waited + delay > s.most_wait:
                    raise
                await self._sleep(delay)
                waited += delay
                continue
            except BaseException:  # cancelled while waiting or sending
                pacer.cancel(ticket)
                raise
            verdict = await self._observe(ticket, response)
            if verdict.kind == "ok":
                return response
            if verdict.kind == "retry":
                delay = pacer.retry_delay(verdict, attempt)
                if not single and attempt < s.max_attempts and waited + delay <= s.most_wait:
                    await response.aclose()
                    await self._sleep(delay)
                    waited += delay
                    continue
                return _final(response, verdict, self._wall() + delay)
            return _final(response, verdict, None)

    async def _observe(self, ticket: Ticket, response: "httpx.Response") -> Verdict:
        body = None
        if response.status_code >= 400:
            try:
                await response.aread()
            except BaseException:
                self.pacer.cancel(ticket)
                raise
            body = _error_json(response)
        return self.pacer.observe(ticket, response.status_code, response.headers, body,
                                  list(response.headers.items()), response.content if body is not None else b"")

    async def _read_quota(self, request: "httpx.Request") -> Optional[list]:
        try:
            r = await self._inner.handle_async_request(quota_request(request))
            try:
                await r.aread()
            finally:
                await r.aclose()
        except httpx.HTTPError:
            return None
        return _quota_rows(r)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _quota_rows(r: "httpx.Response") -> Optional[list]:
    if r.status_code != 200:
        return None
    try:
        data = json.loads(r.content).get("data")
    except (ValueError, AttributeError):
        return None
    return data if isinstance(data, list) else None
