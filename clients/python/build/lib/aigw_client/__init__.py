"""Pacing and retries for apps that call aigw through the official OpenAI and Anthropic SDKs.

    import openai, aigw_client

    client = openai.OpenAI(base_url="http://127.0.0.1:4000/v1", api_key=KEY,
                           max_retries=0, http_client=aigw_client.http_client())

Calls on one key are spread so that each quota lasts until its window ends; refusals are waited
out as the gateway says (or with full-jitter backoff) within ``most_wait`` seconds, else passed
on at once as final, with the time to come back (:func:`retry_at`).
"""

from __future__ import annotations

from typing import Any, Optional, Union

from ._httpx import httpx
from ._pacer import Pacer, Settings
from ._signals import Verdict, classify, parse_rfc3339, parse_standing, parse_wait
from ._transport import AsyncPacedTransport, PacedTransport

__all__ = [
    "AsyncPacedTransport",
    "PacedTransport",
    "Pacer",
    "Settings",
    "Verdict",
    "async_http_client",
    "classify",
    "http_client",
    "parse_standing",
    "parse_wait",
    "retry_at",
]


def http_client(*, pacer: Optional[Pacer] = None, **kwargs: Any) -> "httpx.Client":
    """An ``httpx.Client`` whose calls are paced, for ``openai.OpenAI(http_client=...)`` or
    ``anthropic.Anthropic(http_client=...)``. Keyword arguments are :class:`Settings` fields
    (``most_wait``, ``max_attempts``, …); ``pacer`` shares one pacer between clients."""
    settings = Settings(**kwargs) if kwargs else None
    # The timeout is left at httpx's default, so that the SDKs apply their own (600 s).
    return httpx.Client(transport=PacedTransport(pacer=pacer, settings=settings), follow_redirects=True)


def async_http_client(*, pacer: Optional[Pacer] = None, **kwargs: Any) -> "httpx.AsyncClient":
    """The same as :func:`http_client`, for ``AsyncOpenAI`` / ``AsyncAnthropic``."""
    settings = Settings(**kwargs) if kwargs else None
    return httpx.AsyncClient(transport=AsyncPacedTransport(pacer=pacer, settings=settings),
                             follow_redirects=True)


def retry_at(error_or_response: Any) -> Optional[float]:
    """When calling again makes sense, in Unix seconds, for an SDK error (``openai.APIError``,
    ``anthropic.APIError``) or an ``httpx.Response``; None when the answer names no time (a
    request error, a banned key, a ``total`` quota used up).

    Read from, in order: ``x-aigw-client-retry-at`` (set by this package), the error body's
    ``reset_at`` (a used-up quota) or ``blocked_until`` (an open breaker), ``Retry-After`` /
    ``retry-after-ms``."""
    response = getattr(error_or_response, "response", error_or_response)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    mine = headers.get("x-aigw-client-retry-at")
    if mine:
        try:
            return float(mine)
        except ValueError:
            pass
    body: Union[dict, None] = None
    try:
        body = response.json()
    except Exception:
        body = None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        for field in ("reset_at", "blocked_until"):
            at = parse_rfc3339(err.get(field))
            if at is not None:
                return at
    import time

    now = time.time()
    wait = parse_wait(headers, now)
    return now + wait if wait is not None else None
