#!/usr/bin/env python3
"""The thundering herd, measured against a real aigw: a crowd of clients that all call at once,
under each client rule, against a tight limit. Prints a markdown table per limit and, with
--svg, draws calls per second over time for each rule.

    cargo build --release --bin aigw
    python3 -m venv target/herd-venv && target/herd-venv/bin/pip install httpx2 matplotlib
    target/herd-venv/bin/python bench/herd.py --svg docs/herd.svg          # the full run
    target/ci-venv/bin/python bench/herd.py --short --bin target/debug/aigw  # CI smoke run

One gateway (`aigw serve`, a private SQLite database in a temporary folder, a resources file
written here) and its mock upstream (`aigw mock-upstream`), each on a free port of 127.0.0.1.
Every run (limit × rule × crowd size) has its own gateway key and its own upstream credential and
model, so no run inherits another's quota counter, breaker or parked credential. For each crowd
size, the five `upstream` runs go one after the other, then the five `quota` runs at once.

Two limits:

- `quota`: a guardrail quota on the key, `requests` per `minute`, a quarter of the crowd. Over
  it the gateway answers its own 429 `quota_exceeded`, without Retry-After
  (`x-should-retry: false`). The keys' quotas are used up first; the crowds start LEAD seconds
  before the minute ends (every rule's at the same instant, each on its own key) and meet the
  window's end, when the next window's allowance opens.
- `upstream`: the mock upstream lets a quarter of the crowd through per second (a fixed
  one-second window) and answers the rest 429 with Retry-After / retry-after-ms; the gateway
  parks the credential until then and answers 429 `upstream_quota_exhausted` meanwhile.

Client rules (every client makes one call; the first four give up after MAX_TRIES refused
calls, as in the lesson shared/seeds/002_*): retry at once; a fixed wait; exponential backoff
(0.5 s doubling, at most 2 s); backoff with full jitter (a random wait from 0 up to the backoff).
`helper`: the whole crowd shares one client paced by aigw_client (clients/python) with
max_attempts = MAX_TRIES and most_wait = MOST_WAIT: the way an app with concurrent calls on one
SDK client uses it. Its rule for refusals is the helper's own.

Bounded: loopback only, every client stops after MAX_TRIES calls or MOST_WAIT seconds of waiting,
every call has a 30 s timeout. Needs httpx2 (or httpx); matplotlib only for --svg.
"""

import argparse
import asyncio
import hashlib
import json
import math
import os
import random
import resource
import sys
import time
import urllib.request
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The helper from this checkout (HERD_HELPER_SRC: another copy's `src`, to compare versions).
sys.path.insert(0, os.environ.get("HERD_HELPER_SRC") or os.path.join(ROOT, "clients", "python", "src"))
sys.path.insert(0, os.path.join(ROOT, "tests", "clients"))

import gateway as gw_mod  # noqa: E402  (tests/clients/gateway.py: starts aigw and the mock)
from aigw_client import AsyncPacedTransport, Settings  # noqa: E402
from aigw_client._httpx import httpx  # noqa: E402

RULES = ("once", "fixed", "backoff", "jitter", "helper")
RULE_NAMES = {"once": "retry at once", "fixed": "fixed wait", "backoff": "exponential backoff",
              "jitter": "backoff + full jitter", "helper": "pacing helper (aigw_client)"}
LIMITS = ("quota", "upstream")
MAX_TRIES = 6
FIXED = 0.5
BASE, CAP = 0.5, 2.0
#: The helper's patience: about what backoff spends waiting in all (0.5 + 1 + 2 + 2 + 2).
MOST_WAIT = 8.0
#: The quota runs: their keys' quotas are used up from second PREP_AT of a minute on, and the
#: crowds start LEAD seconds before the minute (the quota's window) ends.
PREP_AT, LEAD = 30.0, 4.0
BIN_S = 0.25  # width of a bar in the picture
MODEL_PREFIX = "herd"
HI = {"messages": [{"role": "user", "content": "hi"}]}


def key_for(name):
    return "sk-aigw-" + hashlib.sha256(name.encode()).hexdigest()[:32]


def run_id(limit, rule, n):
    return f"{limit}-{rule}-{n}"


def quota_limit(n):
    return max(1, n // 4)


def upstream_rate(n):
    return max(1, n // 4)


def resources(crowds):
    out = ['[[workspace]]\nname = "herd"\n',
           '[[member]]\nworkspace = "herd"\nemail = "app@herd.test"\nrole = "member"\n']
    for limit in LIMITS:
        for rule in RULES:
            for n in crowds:
                rid = run_id(limit, rule, n)
                out.append(f'[[api_key]]\nmember = "app@herd.test"\nname = "{rid}"\n'
                           f'key = "{key_for(rid)}"\n')
                if limit == "quota":
                    out.append(f'[[policy]]\nworkspace = "herd"\nsubject = "apikey"\n'
                               f'target = "app@herd.test/{rid}"\nmetric = "requests"\n'
                               f'window = "minute"\nlimit = {quota_limit(n)}\n')
                out.append(f'[[upstream]]\nworkspace = "herd"\nname = "up-{rid}"\n'
                           f'provider = "openai-compatible"\nbase_url = "http://127.0.0.1:{{mock}}/v1"\n'
                           f'api_key = "cred-{rid}"\nmodels = ["{MODEL_PREFIX}-{rid}"]\n'
                           f'max_in_flight = 5000\n')
    return "\n".join(out)


@dataclass
class Run:
    limit: str
    rule: str
    n: int
    start: float = 0.0
    #: (seconds since start, status or 0 for a transport error, code) of every call sent.
    calls: list = field(default_factory=list)
    quota_reads: int = 0
    served_at: list = field(default_factory=list)
    done_at: list = field(default_factory=list)
    gave_up: int = 0
    upstream_calls: int = 0
    window_left: float = 0.0
    skipped: bool = False

    def refused(self):
        return sum(1 for _, s, _ in self.calls if s != 200)

    def codes(self):
        out = {}
        for _, s, c in self.calls:
            if s != 200:
                out[c] = out.get(c, 0) + 1
        return out


def error_code(response):
    try:
        err = json.loads(response.content).get("error")
        return (err.get("code") or err.get("type") or str(response.status_code)) if err else str(
            response.status_code)
    except Exception:
        return str(response.status_code)


def naive_wait(rule, refusals, rng):
    """Seconds to wait after this many refused calls so far (1 after the first)."""
    if rule == "once":
        return 0.0
    if rule == "fixed":
        return FIXED
    longest = min(CAP, BASE * 2 ** (refusals - 1))
    return longest if rule == "backoff" else rng.random() * longest


async def naive_client(run, client, url, headers, body, rng):
    refusals = 0
    while True:
        try:
            r = await client.post(url, headers=headers, json=body)
            status, code = r.status_code, (None if r.status_code == 200 else error_code(r))
        except httpx.HTTPError as e:
            status, code = 0, type(e).__name__
        t = time.monotonic() - run.start
        run.calls.append((t, status, code))
        if status == 200:
            run.served_at.append(t)
            run.done_at.append(t)
            return
        refusals += 1
        if refusals >= MAX_TRIES:
            run.gave_up += 1
            run.done_at.append(t)
            return
        await asyncio.sleep(naive_wait(run.rule, refusals, rng))


class Recording(httpx.AsyncBaseTransport):
    """The transport under the helper: records every call it really sends."""

    def __init__(self, run, limits):
        self.run = run
        self.inner = httpx.AsyncHTTPTransport(limits=limits)

    async def handle_async_request(self, request):
        try:
            r = await self.inner.handle_async_request(request)
        except httpx.HTTPError as e:
            if request.url.path.endswith("/chat/completions"):
                self.run.calls.append((time.monotonic() - self.run.start, 0, type(e).__name__))
            raise
        if request.url.path.endswith("/chat/completions"):
            code = None
            if r.status_code != 200:
                await r.aread()
                code = error_code(r)
            self.run.calls.append((time.monotonic() - self.run.start, r.status_code, code))
        elif request.url.path.endswith("/quota"):
            self.run.quota_reads += 1
        return r

    async def aclose(self):
        await self.inner.aclose()


async def helper_client(run, client, url, headers, body):
    try:
        r = await client.post(url, headers=headers, json=body)
        ok = r.status_code == 200
    except httpx.HTTPError:
        ok = False
    t = time.monotonic() - run.start
    run.done_at.append(t)
    if ok:
        run.served_at.append(t)
    else:
        run.gave_up += 1


def mock_calls(mock):
    with urllib.request.urlopen(mock + "/__mock/calls") as r:
        return json.loads(r.read())["by_credential"]


def target(g, run):
    rid = run_id(run.limit, run.rule, run.n)
    return (g.gw + "/v1/chat/completions", {"Authorization": f"Bearer {key_for(rid)}"},
            dict(HI, model=f"{MODEL_PREFIX}-{rid}"))


async def crowd(g, run, seed):
    """Runs the crowd of `run`: every client calls at run.start (monotonic), which is now."""
    url, headers, body = target(g, run)
    limits = httpx.Limits(max_connections=run.n + 50, max_keepalive_connections=run.n + 50)
    timeout = httpx.Timeout(30.0)
    rng = random.Random(f"{seed}-{run_id(run.limit, run.rule, run.n)}")
    if run.rule == "helper":
        transport = AsyncPacedTransport(Recording(run, limits), settings=Settings(
            most_wait=MOST_WAIT, max_attempts=MAX_TRIES))
        client = httpx.AsyncClient(transport=transport, timeout=timeout)
        clients = [helper_client(run, client, url, headers, body) for _ in range(run.n)]
    else:
        client = httpx.AsyncClient(limits=limits, timeout=timeout)
        clients = [naive_client(run, client, url, headers, body, rng) for _ in range(run.n)]
    await asyncio.gather(*clients)
    await client.aclose()


async def upstream_run(g, run, seed):
    # The mock's windows are whole seconds: start just after one begins.
    await asyncio.sleep(1.02 - (time.time() % 1.0))
    run.start = time.monotonic()
    await crowd(g, run, seed)
    run.upstream_calls = mock_calls(g.mock).get(f"cred-{run_id(run.limit, run.rule, run.n)}", 0)


async def spend(g, run):
    """Uses up the quota of the run's key: one burst of `limit` calls (each is admitted while the
    count, made after completion, is under the limit), then single calls until an answer says
    none remain."""
    url, headers, body = target(g, run)
    limit = quota_limit(run.n)
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=limit + 5), timeout=30.0) as c:
        await asyncio.gather(*(c.post(url, headers=headers, json=body) for _ in range(limit)))
        for _ in range(limit + 10):
            r = await c.post(url, headers=headers, json=body)
            if r.status_code == 429 or r.headers.get("x-aigw-quota-requests-remaining") == "0":
                return
    raise RuntimeError(f"could not use up the quota of {run_id(run.limit, run.rule, run.n)}")


async def quota_phase(g, runs, seed, short):
    """Every rule's crowd at once, each on its own key whose quota for the minute is used up,
    LEAD seconds before the minute (the quota's window) ends: what the crowds meet is the reset.
    (--short: at once, wherever the minute is, so the window may not end within the run.)"""
    def second():
        return time.time() % 60

    if not short:
        # The quotas are used up from second PREP_AT on, in the minute the crowds start in.
        await asyncio.sleep((PREP_AT - second()) % 60)
    elif second() > 50:
        await asyncio.sleep(61 - second())
    await asyncio.gather(*(spend(g, r) for r in runs))
    if not short:
        if second() > 60 - LEAD or second() < PREP_AT:
            print(f"quota runs of {runs[0].n} clients skipped: using up their quotas took longer "
                  "than the window had left", file=sys.stderr, flush=True)
            for r in runs:
                r.skipped = True
            return
        await asyncio.sleep(60 - LEAD - second())
    before = mock_calls(g.mock)
    start = time.monotonic()
    for r in runs:
        r.start = start
        r.window_left = 60 - second()
    await asyncio.gather(*(crowd(g, r, seed) for r in runs))
    after = mock_calls(g.mock)
    for r in runs:
        cred = f"cred-{run_id(r.limit, r.rule, r.n)}"
        r.upstream_calls = after.get(cred, 0) - before.get(cred, 0)


def fmt_s(xs):
    return f"{max(xs):.1f}" if xs else "–"


def table(runs, limit):
    rows = ["| rule | clients | calls sent | refused | gave up | last served (s) | all done (s) "
            "| upstream calls | refusals by code |",
            "|---|--:|--:|--:|--:|--:|--:|--:|---|"]
    for r in runs:
        if r.limit != limit:
            continue
        if r.skipped:
            rows.append(f"| {RULE_NAMES[r.rule]} | {r.n} | not run: the machine was too slow |||||||")
            continue
        codes = ", ".join(f"{c} {k}" for c, k in sorted(r.codes().items(), key=lambda x: -x[1]))
        rows.append(f"| {RULE_NAMES[r.rule]} | {r.n} | {len(r.calls)} | {r.refused()} | {r.gave_up} "
                    f"| {fmt_s(r.served_at)} | {fmt_s(r.done_at)} | {r.upstream_calls} | {codes or '–'} |")
    return "\n".join(rows)


def draw(runs, n, path, short):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "font.size": 8, "svg.hashsalt": "aigw-herd"})
    picked = {(r.limit, r.rule): r for r in runs if r.n == n}
    horizon = max((max(r.done_at) for r in picked.values() if r.done_at), default=1.0)
    bins = int(math.ceil(horizon / BIN_S)) + 1
    fig, axes = plt.subplots(len(RULES), len(LIMITS), figsize=(9, 8.5), sharex=True, squeeze=False)
    for j, limit in enumerate(LIMITS):
        peak = 1
        per = {}
        for rule in RULES:
            r = picked.get((limit, rule))
            ok, bad = [0] * bins, [0] * bins
            for t, s, _ in (r.calls if r else []):
                i = min(int(t / BIN_S), bins - 1)
                (ok if s == 200 else bad)[i] += 1
            per[rule] = ([x / BIN_S for x in ok], [x / BIN_S for x in bad], r)
            peak = max(peak, max(a + b for a, b in zip(per[rule][0], per[rule][1])))
        for i, rule in enumerate(RULES):
            ok, bad, r = per[rule]
            ax = axes[i][j]
            edges = [k * BIN_S for k in range(bins + 1)]
            # Two filled outlines per panel (not one rectangle per bar): a small SVG.
            ax.stairs([a + b for a, b in zip(ok, bad)], edges, fill=True, color="#e03131",
                      label="refused", linewidth=0)
            ax.stairs(ok, edges, fill=True, color="#2b8a3e", label="served", linewidth=0)
            ax.set_ylim(0, peak * 1.05)
            ax.set_xlim(0, bins * BIN_S)
            if limit == "quota" and not short:
                ax.axvline(LEAD, color="#495057", linewidth=0.8, linestyle=":")
                if i == 0:
                    ax.text(LEAD, peak * 1.0, " the window ends", fontsize=7, color="#495057",
                            va="top")
            summary = (f"{RULE_NAMES[rule]}: {len(r.calls)} sent, {r.refused()} refused, "
                       f"{r.gave_up} gave up" if r else RULE_NAMES[rule])
            ax.set_title(summary, fontsize=8, loc="left")
            if j == 0:
                ax.set_ylabel("calls/s")
            ax.spines[["top", "right"]].set_visible(False)
        axes[0][j].text(1.0, 1.35, {"quota": "guardrail quota on the key",
                                    "upstream": "rate-limited upstream"}[limit],
                        transform=axes[0][j].transAxes, ha="right", fontsize=9, weight="bold")
    axes[-1][0].set_xlabel("seconds since the crowd started")
    axes[-1][1].set_xlabel("seconds since the crowd started")
    axes[0][1].legend(loc="upper right", fontsize=7, frameon=False)
    fig.suptitle(f"{n} clients call at once: calls per second sent to aigw, by client rule",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def report(run, began):
    print(f"[{time.monotonic() - began:6.1f} s] {run.limit:8} {run.rule:7} n={run.n:<5} "
          f"sent={len(run.calls):<6} refused={run.refused():<6} gave_up={run.gave_up:<5} "
          f"last_served={fmt_s(run.served_at):>5} s upstream={run.upstream_calls}", flush=True)


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "aigw"))
    p.add_argument("--short", action="store_true", help="20 clients only: a smoke run of seconds")
    p.add_argument("--crowds", default=None, help="comma-separated crowd sizes (default 20,100,1000)")
    p.add_argument("--svg", default=None, help="draw calls per second for each rule into this SVG")
    p.add_argument("--svg-crowd", type=int, default=100, help="the crowd size the picture shows")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default=None, help="also write every run's figures to this file")
    args = p.parse_args()
    crowds = [20] if args.short else [int(x) for x in (args.crowds or "20,100,1000").split(",")]
    gw_mod.BIN = os.path.abspath(args.bin)
    raise_fd_limit()
    began = time.monotonic()
    runs = []
    with gw_mod.running(resources(crowds), env={"AIGW_LOG": "error"}, record_calls=False) as g:
        for n in crowds:
            for rule in RULES:
                run = Run("upstream", rule, n)
                g.script(model=f"{MODEL_PREFIX}-{run_id('upstream', rule, n)}",
                         rate_limit={"requests": upstream_rate(n), "window_ms": 1000})
                asyncio.run(upstream_run(g, run, args.seed))
                runs.append(run)
                report(run, began)
            phase = [Run("quota", rule, n) for rule in RULES]
            asyncio.run(quota_phase(g, phase, args.seed, args.short))
            runs.extend(phase)
            for run in phase:
                report(run, began)
    total = time.monotonic() - began
    print()
    print(f"Guardrail quota: `requests` per minute on the key = a quarter of the crowd, used up "
          f"when the crowds start {LEAD:g} s before the minute ends "
          f"({', '.join(f'{n}: {quota_limit(n)}' for n in crowds)}).\n")
    print(table(runs, "quota"))
    print()
    print(f"Rate-limited upstream: the mock serves a quarter of the crowd per second "
          f"({', '.join(f'{n}: {upstream_rate(n)}/s' for n in crowds)}).\n")
    print(table(runs, "upstream"))
    print(f"\nwhole run: {total:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"limit": r.limit, "rule": r.rule, "n": r.n, "sent": len(r.calls),
                        "refused": r.refused(), "gave_up": r.gave_up, "codes": r.codes(),
                        "last_served": max(r.served_at) if r.served_at else None,
                        "all_done": max(r.done_at) if r.done_at else None,
                        "upstream_calls": r.upstream_calls, "quota_reads": r.quota_reads,
                        "window_left": r.window_left} for r in runs], f, indent=1)
    if args.svg:
        draw(runs, args.svg_crowd if args.svg_crowd in crowds else crowds[-1], args.svg, args.short)
        print(f"picture: {args.svg}")
    # Checks: every client was accounted for and each run reached the gateway; the helper sent
    # nothing the quota refused (it knows the quota before the first call).
    problems = [f"{run_id(r.limit, r.rule, r.n)} lost clients" for r in runs
                if not r.skipped and (len(r.done_at) != r.n or not (r.calls or r.rule == "helper"))]
    problems += [f"{run_id(r.limit, r.rule, r.n)}: the helper sent {r.refused()} refused calls"
                 for r in runs if r.rule == "helper" and r.limit == "quota" and r.refused()]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
