"""What a gateway answer says about when to call again: pure functions, no I/O, no clock.

Two kinds of signal are read:

- the quota standing sent with every routed answer: ``x-aigw-quota-<metric>-limit``,
  ``-remaining``, ``-reset`` (Unix seconds) for the tightest policy of each metric (``requests``,
  ``tokens``, ``prompt_tokens``, ``completion_tokens``, ``credits``), and the IETF
  ``RateLimit-Policy`` / ``RateLimit`` fields for the tightest policy overall;
- what a refusal says: ``x-should-retry``, ``Retry-After`` (seconds or an HTTP-date),
  ``retry-after-ms``, and the error body's ``code``, ``reset_at``, ``blocked_until``.
"""

from __future__ import annotations

import email.utils
import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping, Optional

#: Statuses worth another try when nothing says otherwise: the ones the official SDKs retry.
RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})

#: The gateway reports a quota's reset 60 to 120 s after its window really ends (spread per
#: subject, so that a refused crowd does not come back at once), and every window ends on a
#: whole minute. The pacer spreads calls until the real end, found from the reset with this.
GATEWAY_RESET_DELAY_MIN = 60

#: The metrics as the gateway names them to clients: ``tokens`` is the ``total_tokens`` policy's
#: (seed 003's name).
METRICS = ("requests", "tokens", "prompt_tokens", "completion_tokens", "credits")

#: The names a metric's headers may go by, the first preferred: a gateway before seed 003's name
#: sent only ``total_tokens``.
_HEADER_NAMES = {"tokens": ("tokens", "total_tokens")}


def metric_name(name: str) -> str:
    """A metric as the helper names it, whatever name the gateway gave: ``total_tokens`` (a
    policy's name, or an older gateway's) is ``tokens``."""
    return "tokens" if name == "total_tokens" else name

_WINDOW_SECONDS = {"minute": 60, "hour": 3600, "day": 86400, "week": 7 * 86400}
_N_MINUTES = re.compile(r"^(\d+)minutes$")


@dataclass(frozen=True)
class Reading:
    """One quota's standing as an answer reports it."""

    #: ``requests``, ``tokens`` (the ``total_tokens`` policy, under either header name),
    #: ``prompt_tokens``, ``completion_tokens`` or ``credits``.
    metric: str
    limit: float
    remaining: float
    #: Unix seconds of the reported reset (the gateway's ``reset_at``); None: never resets.
    reset: Optional[float]
    #: The window's length in seconds, when known; None for ``total`` or unknown.
    window: Optional[float] = None
    #: ``<subject>-<metric>-<window>``, as in ``RateLimit-Policy``, when known.
    name: Optional[str] = None
    #: Whether ``reset`` is the gateway's (reported a minute or two after the window's real
    #: end); False for a bare ``RateLimit`` field, whose ``t`` is taken as it is.
    delayed: bool = True


@dataclass(frozen=True)
class Verdict:
    """What to do after an answer."""

    #: ``ok`` (pass it on), ``retry`` (after ``wait``, or a backoff when None), ``final``.
    kind: str
    #: Seconds the answer asks to wait (Retry-After / retry-after-ms), if it names a wait.
    wait: Optional[float] = None
    #: Unix seconds when calling again makes sense, if known.
    retry_at: Optional[float] = None
    #: The error ``code`` (the gateway's, or the upstream's passed on), if any.
    code: Optional[str] = None
    #: ``key``: the refusal is about the gateway key (quota, breaker, ban, the gateway itself);
    #: ``model``: about the model's upstream credentials (``upstream_quota_exhausted``, or an
    #: upstream error passed on).
    scope: str = "key"
    #: Later calls in the scope are refused without being sent until ``retry_at`` (when it is
    #: None: for a while, then one call goes to see; never again with ``forever``).
    close: bool = False
    forever: bool = False


def header(headers: Mapping[str, str], name: str) -> Optional[str]:
    """A header's value, case-insensitively, for any mapping (httpx headers or a plain dict)."""
    v = headers.get(name)
    if v is None and not hasattr(headers, "get_list"):
        lname = name.lower()
        for k, val in headers.items():
            if k.lower() == lname:
                return val
    return v


def _number(v: Optional[str]) -> Optional[float]:
    if v is None:
        return None
    try:
        n = float(v.strip())
    except ValueError:
        return None
    return n if math.isfinite(n) else None


def parse_rfc3339(v: Any) -> Optional[float]:
    """Unix seconds of an RFC 3339 time (``2026-12-02T00:01:27+08:00``, ``…Z``), else None."""
    if not isinstance(v, str) or not v:
        return None
    s = v.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    try:
        t = datetime.fromisoformat(s)
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.timestamp()


def parse_wait(headers: Mapping[str, str], now: float) -> Optional[float]:
    """Seconds to wait as the answer names it: ``retry-after-ms`` (the finer one) else
    ``Retry-After`` in seconds or as an HTTP-date, relative to ``now`` (Unix seconds)."""
    ms = _number(header(headers, "retry-after-ms"))
    if ms is not None and ms >= 0:
        return ms / 1000.0
    ra = header(headers, "retry-after")
    if ra is None:
        return None
    secs = _number(ra)
    if secs is not None:
        return max(secs, 0.0)
    try:
        at = email.utils.parsedate_to_datetime(ra)
    except (TypeError, ValueError, IndexError):
        return None
    if at is None:
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return max(at.timestamp() - now, 0.0)


def _sf_params(value: str) -> tuple[Optional[str], dict[str, str]]:
    """The first item of an IETF structured field (``"name";q=5;w=60``): its name and params."""
    item = value.split(",")[0]
    parts = [p.strip() for p in item.split(";")]
    name = parts[0].strip('"') if parts and parts[0] else None
    params = {}
    for p in parts[1:]:
        if "=" in p:
            k, v = p.split("=", 1)
            params[k.strip()] = v.strip().strip('"')
    return name, params


def window_seconds(window: Optional[str]) -> Optional[float]:
    """A gateway window name's length in seconds (``minute``, ``5minutes``, ``day``, ``week``);
    None for ``total`` and ``month`` (no fixed length) or an unknown name."""
    if not window:
        return None
    if window in _WINDOW_SECONDS:
        return float(_WINDOW_SECONDS[window])
    m = _N_MINUTES.match(window)
    return float(int(m.group(1)) * 60) if m else None


def parse_standing(headers: Mapping[str, str], now: float) -> list[Reading]:
    """Every quota reading of an answer: one per ``x-aigw-quota-<metric>-*`` metric; else, from
    a server that sends only the IETF fields, the one ``RateLimit`` names."""
    policy_name, policy = None, {}
    rp = header(headers, "ratelimit-policy")
    if rp:
        policy_name, policy = _sf_params(rp)
    out = []
    for metric in METRICS:
        for sent_as in _HEADER_NAMES.get(metric, (metric,)):
            limit = _number(header(headers, f"x-aigw-quota-{sent_as}-limit"))
            remaining = _number(header(headers, f"x-aigw-quota-{sent_as}-remaining"))
            if limit is not None and remaining is not None:
                break
        if limit is None or remaining is None:
            continue
        reset = _number(header(headers, f"x-aigw-quota-{sent_as}-reset"))
        name, window = None, None
        # RateLimit-Policy describes the tightest policy overall: `<subject>-<metric>-<window>`.
        if policy_name and [metric_name(m) for m in policy_name.split("-")[1:2]] == [metric]:
            name = policy_name
            window = _number(policy.get("w"))
            if window is None:
                window = window_seconds(policy_name.split("-", 2)[-1])
        out.append(Reading(metric, limit, remaining, reset, window, name))
    if out:
        return out
    rl = header(headers, "ratelimit")
    if rl:
        name, cur = _sf_params(rl)
        r, t = _number(cur.get("r")), _number(cur.get("t"))
        q = _number(policy.get("q")) if name == policy_name else None
        if r is not None and q is not None:
            window = _number(policy.get("w"))
            out.append(Reading("requests", q, r, now + t if t is not None else None, window, name,
                               delayed=False))
    return out


def error_of(body: Any) -> dict:
    """The ``error`` object of an OpenAI- or Anthropic-shaped error body, else {}."""
    if isinstance(body, list) and body:
        body = body[0]
    if isinstance(body, dict):
        e = body.get("error")
        if isinstance(e, dict):
            return e
    return {}


def classify(status: int, headers: Mapping[str, str], body: Any, now: float) -> Verdict:
    """What an answer means for the caller, by the gateway's contract:

    1. below 400: ok;
    2. ``x-should-retry: false``: final at once; the refusal's own time to come back is
       ``reset_at`` (a used-up quota; none for a ``total`` window), ``blocked_until`` (an open
       breaker), never (a banned key), else the named wait;
    3. a retryable status (or ``x-should-retry: true``) that names a wait: retry after it;
    4. a retryable status naming no wait: retry after a backoff;
    5. anything else (a request error, an invalid key): final, passed on as is.
    """
    if status < 400:
        return Verdict("ok")
    err = error_of(body)
    code = err.get("code") if isinstance(err.get("code"), str) else None
    source = header(headers, "x-aigw-error-source")
    scope = "model" if code == "upstream_quota_exhausted" or source == "upstream" else "key"
    wait = parse_wait(headers, now)
    should_retry = (header(headers, "x-should-retry") or "").strip().lower()
    named_at = now + wait if wait is not None else None
    if code == "api_key_permanently_banned":
        return Verdict("final", code=code, scope="key", close=True, forever=True)
    if code == "quota_exceeded":
        reset = parse_rfc3339(err.get("reset_at"))
        # A `total` window never resets (retry_at None): only an administrator can raise it.
        return Verdict("final", wait=wait, retry_at=reset, code=code, scope="key", close=True)
    if should_retry == "false":
        at = named_at
        if code == "api_key_circuit_open":
            at = parse_rfc3339(err.get("blocked_until")) or named_at
        return Verdict("final", wait=wait, retry_at=at, code=code, scope=scope, close=at is not None)
    if status in RETRYABLE_STATUSES or should_retry == "true":
        return Verdict("retry", wait=wait, retry_at=named_at, code=code, scope=scope)
    return Verdict("final", code=code, scope=scope)
