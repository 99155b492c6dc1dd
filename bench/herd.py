#!/usr/bin/env python3
"""The thundering herd, measured against a real aigw: a crowd of clients that all call at once,
under each client rule, against a tight limit. Prints a markdown table per limit and, with
--svg, draws calls per second over time for each rule.

    cargo build --release --bin aigw
    python3 -m venv target/herd-venv
    target/herd-venv/bin/pip install matplotlib -r tests/clients/requirements.txt
    target/herd-venv/bin/python bench/herd.py --svg bench/herd.svg          # the full run
    target/ci-venv/bin/python bench/herd.py --short --bin target/debug/aigw  # CI smoke run

One gateway (`aigw serve`, a private SQLite database in a temporary folder, a resources file
written here) and its mock upstream (`aigw mock-upstream`), each on a free port of 127.0.0.1.
Every run (limit × rule × crowd size) has its own gateway key and its own upstream credential and
model, so no run inherits another's quota counter, breaker or parked credential.

Two limits, both a quarter of the crowd:

- `quota`: a guardrail quota on the key, `requests` per `minute`. Over it the gateway answers its
  own 429 `quota_exceeded`, without Retry-After (`x-should-retry: false`). The keys' quotas are
  used up first (from second PREP_AT of a minute); the five rules' crowds start together LEAD
  seconds before the minute ends, each on its own key, and meet the window's end, when the next
  window's allowance opens.
- `upstream`: the mock upstream lets a quarter of the crowd through per second (a fixed
  one-second window) and answers the rest 429 with Retry-After / retry-after-ms; the gateway
  parks the credential until then and answers 429 `upstream_quota_exhausted` meanwhile. One rule
  at a time.

Client rules (every client makes one call; the first four give up after MAX_TRIES refused
calls, as in the lesson shared/seeds/002_*): retry at once; a fixed wait; exponential backoff
(0.5 s doubling, at most 2 s); backoff with full jitter (a random wait from 0 up to the backoff).
Each of their clients has its own keep-alive connection from bench/lean_http.py (stdlib asyncio
streams, about ten times cheaper per call than httpx), so that one Python process can send a
crowd of 1,000's storm faster than the limits it meets. `helper`: the whole crowd shares one
official SDK client (openai.AsyncOpenAI, max_retries=0) paced by aigw_client (clients/python)
with max_attempts = MAX_TRIES and most_wait = MOST_WAIT, the way an app with concurrent calls on
one SDK client uses it, over a pool of as many lean connections. Its rule for refusals is the
helper's own. All connections are opened before a crowd starts.

The ceiling: before the runs, the biggest crowd calls back to back, CEILING_ROUNDS calls per
client, on a key and a model without limits, once over the lean connections and once through the
SDK and the helper: what the client side (with the gateway and the mock on the same cores) can
drive at most. The tables also give each run's peak (the most calls sent in one second).

Scheduling (one event loop): the quota runs of each crowd size take their own minute of the
clock; the ceiling and the upstream runs fill the time between, one at a time, each started only
if it should end before the next fixed moment, so nothing else runs while a crowd is measured.
--short (CI): 20 clients, the upstream runs, then the quota runs at once wherever the minute is.

Bounded: loopback only, every client stops after MAX_TRIES calls or MOST_WAIT seconds of waiting,
every call has a 30 s timeout. Needs httpx2 or httpx (and openai, else the helper runs under
httpx's client without the SDK); matplotlib only for --svg.
"""

import argparse
import asyncio
import hashlib
import json
import math
import multiprocessing
import os
import random
import resource
import sys
import time
import types
import urllib.request
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The helper from this checkout (HERD_HELPER_SRC: another copy's `src`, to compare versions).
sys.path.insert(0, os.environ.get("HERD_HELPER_SRC") or os.path.join(ROOT, "clients", "python", "src"))
sys.path.insert(0, os.path.join(ROOT, "tests", "clients"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gateway as gw_mod  # noqa: E402  (tests/clients/gateway.py: starts aigw and the mock)
from aigw_client import AsyncPacedTransport, Settings  # noqa: E402
from aigw_client._httpx import httpx  # noqa: E402

import lean_http as lean  # noqa: E402  (bench/lean_http.py: the naive clients' connections)

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
#: The quota crowds' connections are opened this long before they start.
WARM_S = 3.0
#: Calls per client of the ceiling measure.
CEILING_ROUNDS = 3
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
    # The ceiling: keys and a model without limits.
    ceiling_models = [f"{MODEL_PREFIX}-ceiling"] + [f"{MODEL_PREFIX}-{run_id('ceiling', 'helper', n)}"
                                                    for n in crowds]
    for name in ["ceiling"] + [run_id("ceiling", "helper", n) for n in crowds]:
        out.append(f'[[api_key]]\nmember = "app@herd.test"\nname = "{name}"\nkey = "{key_for(name)}"\n')
    out.append(f'[[upstream]]\nworkspace = "herd"\nname = "up-ceiling"\n'
               f'provider = "openai-compatible"\nbase_url = "http://127.0.0.1:{{mock}}/v1"\n'
               f'api_key = "cred-ceiling"\nmodels = {json.dumps(ceiling_models)}\n'
               f'max_in_flight = 5000\n')
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

    def peak(self, width=1.0):
        """The most calls sent in `width` seconds (a sliding window over the send times)."""
        ts = sorted(t for t, _, _ in self.calls)
        best, j = 0, 0
        for i, t in enumerate(ts):
            while ts[j] < t - width:
                j += 1
            best = max(best, i - j + 1)
        return best / width


def naive_wait(rule, refusals, rng):
    """Seconds to wait after this many refused calls so far (1 after the first)."""
    if rule == "once":
        return 0.0
    if rule == "fixed":
        return FIXED
    longest = min(CAP, BASE * 2 ** (refusals - 1))
    return longest if rule == "backoff" else rng.random() * longest


async def naive_client(run, conn, request, rng):
    """One client of a naive rule: its own keep-alive connection (lean_http, already open)."""
    refusals = 0
    while True:
        try:
            a = await conn.send(request)
            status, code = a.status, (None if a.status == 200 else a.error_code())
        except lean.HTTPError as e:
            status, code = 0, str(e)
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


#: Headers httpx adds that the lean connection sets itself or must not ask for (no compression).
_NOT_FORWARDED = {"host", "content-length", "connection", "transfer-encoding", "accept-encoding"}


class LeanTransport(httpx.AsyncBaseTransport):
    """An httpx transport over a lean_http.Pool: the helper's calls go over the same cheap
    connections as the naive clients', so the rules differ only by their rule (and the helper by
    the cost of the SDK and the helper themselves)."""

    def __init__(self, pool):
        self.pool = pool

    async def handle_async_request(self, request):
        body = await request.aread()
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in _NOT_FORWARDED]
        raw = lean.prepare(request.method, self.pool.host, self.pool.port,
                           request.url.raw_path.decode("ascii"), headers, body)
        try:
            a = await self.pool.send(raw)
        except lean.HTTPError as e:
            raise (httpx.ConnectError if e.connecting else httpx.ReadError)(str(e), request=request) from e
        return httpx.Response(a.status, content=a.body, request=request,
                              headers=[(k, v) for k, v in a.headers if k.lower() != "transfer-encoding"])

    async def aclose(self):
        self.pool.close()


class Recording(httpx.AsyncBaseTransport):
    """The transport under the helper: records every call it really sends."""

    def __init__(self, run, inner):
        self.run = run
        self.inner = inner

    async def handle_async_request(self, request):
        try:
            r = await self.inner.handle_async_request(request)
        except httpx.HTTPError as e:
            if request.url.path.endswith("/chat/completions"):
                self.run.calls.append((time.monotonic() - self.run.start, 0, type(e).__name__))
            raise
        if request.url.path.endswith("/chat/completions"):
            code = None if r.status_code == 200 else lean.Answer(r.status_code, [], {}, r.content).error_code()
            self.run.calls.append((time.monotonic() - self.run.start, r.status_code, code))
        elif request.url.path.endswith("/quota"):
            self.run.quota_reads += 1
        return r

    async def aclose(self):
        await self.inner.aclose()


def helper_sdk(g, run, pool):
    """The official SDK's client (openai.AsyncOpenAI, max_retries=0) paced by aigw_client, over
    the lean pool; without the openai package, httpx's client with the same transport."""
    try:
        import openai  # the official SDK the helper plugs into (tests/clients/requirements.txt)
    except ImportError:  # pragma: no cover
        openai = None
    transport = AsyncPacedTransport(Recording(run, LeanTransport(pool)), settings=Settings(
        most_wait=MOST_WAIT, max_attempts=MAX_TRIES))
    http = httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(30.0))
    _, key, model = target(g, run)
    if openai is None:
        url = g.gw + "/v1/chat/completions"

        async def call():
            r = await http.post(url, headers={"Authorization": f"Bearer {key}"}, json=dict(HI, model=model))
            return r.status_code == 200
    else:
        sdk = openai.AsyncOpenAI(base_url=g.gw + "/v1", api_key=key, max_retries=0, http_client=http)

        async def call():
            await sdk.chat.completions.create(model=model, **HI)
            return True
    return call, http


async def helper_client(run, call):
    try:
        ok = await call()
    except Exception:  # the SDK's refusal (openai.APIStatusError) or a connection error
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
    """(host and port of the gateway, key, model) of a run."""
    rid = run_id(run.limit, run.rule, run.n)
    return g.hostport, key_for(rid), f"{MODEL_PREFIX}-{rid}"


def chat_request(g, key, model):
    (host, port) = g.hostport
    return lean.prepare("POST", host, port, "/v1/chat/completions",
                        {"Authorization": f"Bearer {key}"}, dict(HI, model=model))


async def prepare_crowd(g, run, seed):
    """Opens the crowd's connections (one per client, or a pool of as many for the helper's
    shared client): returns the coroutine function that runs it from run.start, which must be
    set first."""
    (host, port), key, model = target(g, run)
    rng = random.Random(f"{seed}-{run_id(run.limit, run.rule, run.n)}")
    if run.rule == "helper":
        pool = lean.Pool(host, port)
        await pool.warm(run.n)
        call, http = helper_sdk(g, run, pool)

        async def go():
            await asyncio.gather(*(helper_client(run, call) for _ in range(run.n)))
            await http.aclose()
        return go
    conns = [lean.Conn(host, port) for _ in range(run.n)]
    for i in range(0, run.n, 250):
        await asyncio.gather(*(c.connect() for c in conns[i:i + 250]))
    request = chat_request(g, key, model)

    async def go():
        await asyncio.gather(*(naive_client(run, c, request, rng) for c in conns))
        for c in conns:
            c.close()
    return go


async def upstream_run(g, run, seed):
    go = await prepare_crowd(g, run, seed)
    # The mock's windows are whole seconds: start just after one begins.
    await asyncio.sleep(1.02 - (time.time() % 1.0))
    run.start = time.monotonic()
    await go()
    run.upstream_calls = mock_calls(g.mock).get(f"cred-{run_id(run.limit, run.rule, run.n)}", 0)


async def spend(g, run):
    """Uses up the quota of the run's key: one burst of `limit` calls (each is admitted while the
    count, made after completion, is under the limit), then single calls until an answer says
    none remain."""
    (host, port), key, model = target(g, run)
    request = chat_request(g, key, model)
    limit = quota_limit(run.n)
    pool = lean.Pool(host, port)
    try:
        await pool.warm(min(limit, 250))
        await asyncio.gather(*(pool.send(request) for _ in range(limit)))
        for _ in range(limit + 10):
            a = await pool.send(request)
            if a.status == 429 or a.header("x-aigw-quota-requests-remaining") == "0":
                return
    finally:
        pool.close()
    raise RuntimeError(f"could not use up the quota of {run_id(run.limit, run.rule, run.n)}")


def quota_worker(pipe, gw, rule, n, seed):
    """One rule's quota crowd in a process of its own (a crowd of 1,000 per rule, five at once,
    is more than one Python process can send on time): on "warm" opens the crowd's connections
    and answers "ready"; on ("go", at) runs the crowd from `at` (wall clock) and sends its
    figures back."""
    raise_fd_limit()
    g = types.SimpleNamespace(gw=gw, hostport=("127.0.0.1", int(gw.rsplit(":", 1)[1])))
    run = Run("quota", rule, n)

    async def main():
        await asyncio.to_thread(pipe.recv)  # "warm"
        go = await prepare_crowd(g, run, seed)
        pipe.send("ready")
        _, at = await asyncio.to_thread(pipe.recv)
        await asyncio.sleep(max(0.0, at - time.time()))
        run.start = time.monotonic()
        run.window_left = 60 - time.time() % 60
        await go()
    try:
        asyncio.run(main())
    except EOFError:  # the parent gave the runs up
        return
    pipe.send({k: getattr(run, k) for k in ("calls", "served_at", "done_at", "gave_up", "quota_reads",
                                            "window_left")})
    pipe.close()


async def quota_phase(g, runs, seed, crowd_at, fill):
    """Every rule's crowd at once, each on its own key whose quota for the minute is used up, at
    `crowd_at` (wall clock; None: at once), each crowd in a process of its own.
    `fill(deadline)` runs other work meanwhile."""
    ctx = multiprocessing.get_context("spawn")
    workers = []
    for r in runs:
        mine, theirs = ctx.Pipe()
        p = ctx.Process(target=quota_worker, args=(theirs, g.gw, r.rule, r.n, seed), daemon=True)
        p.start()
        workers.append((p, mine))
    try:
        await asyncio.gather(*(spend(g, r) for r in runs))
        if crowd_at is not None:
            await fill(crowd_at - WARM_S)
            if time.time() > crowd_at - 0.5:
                print(f"quota runs of {runs[0].n} clients skipped: using up their quotas took "
                      "longer than the window had left", file=sys.stderr, flush=True)
                for r in runs:
                    r.skipped = True
                return
        for _, pipe in workers:
            pipe.send("warm")
        for _, pipe in workers:
            await asyncio.to_thread(pipe.recv)
        if crowd_at is None:
            crowd_at = time.time() + 0.3
        elif time.time() > crowd_at - 0.1:
            print(f"quota runs of {runs[0].n} clients start {time.time() - crowd_at + 0.1:.1f} s "
                  "late", file=sys.stderr, flush=True)
            crowd_at = time.time() + 0.1
        before = mock_calls(g.mock)
        for _, pipe in workers:
            pipe.send(("go", crowd_at))
        for r, (p, pipe) in zip(runs, workers):
            for k, v in (await asyncio.to_thread(pipe.recv)).items():
                setattr(r, k, v)
        after = mock_calls(g.mock)
        for r in runs:
            cred = f"cred-{run_id(r.limit, r.rule, r.n)}"
            r.upstream_calls = after.get(cred, 0) - before.get(cred, 0)
    finally:
        for p, pipe in workers:
            pipe.close()
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()


@dataclass
class Ceiling:
    """What the client side drove with no limit at all: `n` clients, `rounds` calls each."""
    kind: str
    n: int
    calls: int = 0
    seconds: float = 0.0

    def rate(self):
        return self.calls / self.seconds if self.seconds else 0.0


async def ceiling(g, n, rounds):
    """The crowd's ceiling: n clients calling back to back on a key and model without limits,
    once with the naive rules' lean connections, once through the SDK and the helper."""
    host, port = g.hostport
    out = []
    conns = [lean.Conn(host, port) for _ in range(n)]
    for i in range(0, n, 250):
        await asyncio.gather(*(c.connect() for c in conns[i:i + 250]))
    request = chat_request(g, key_for("ceiling"), f"{MODEL_PREFIX}-ceiling")
    ok = [0]

    async def lean_client(c):
        for _ in range(rounds):
            try:
                served = (await c.send(request)).status == 200
                ok[0] += served
            except lean.HTTPError:
                pass
    t0 = time.monotonic()
    await asyncio.gather(*(lean_client(c) for c in conns))
    out.append(Ceiling("lean", n, ok[0], time.monotonic() - t0))
    for c in conns:
        c.close()
    run = Run("ceiling", "helper", n)
    pool = lean.Pool(host, port)
    await pool.warm(n)
    call, http = helper_sdk(g, run, pool)
    # The helper's key is the ceiling run's own ("ceiling-helper-N"): no quota, no limit.

    async def sdk_client():
        for _ in range(rounds):
            try:
                served = await call()
                ok[0] += served
            except Exception:
                pass
    ok[0] = 0
    t0 = time.monotonic()
    await asyncio.gather(*(sdk_client() for _ in range(n)))
    out.append(Ceiling("sdk", n, ok[0], time.monotonic() - t0))
    await http.aclose()
    return out


def fmt_s(xs):
    return f"{max(xs):.1f}" if xs else "–"


def table(runs, limit):
    rows = ["| rule | clients | calls sent | peak calls/s | refused | gave up | last served (s) "
            "| all done (s) | upstream calls | refusals by code |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for r in runs:
        if r.limit != limit:
            continue
        if r.skipped:
            rows.append(f"| {RULE_NAMES[r.rule]} | {r.n} | not run: the machine was too slow ||||||||")
            continue
        codes = ", ".join(f"{c} {k}" for c, k in sorted(r.codes().items(), key=lambda x: -x[1]))
        rows.append(f"| {RULE_NAMES[r.rule]} | {r.n} | {len(r.calls)} | {r.peak():.0f} | {r.refused()} "
                    f"| {r.gave_up} "
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
            if limit == "upstream":
                ax.axhline(upstream_rate(n), color="#1c7ed6", linewidth=0.8, linestyle="--",
                           label="the upstream's rate")
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
    if path.endswith(".png"):
        fig.savefig(path, format="png", dpi=90)
    else:
        fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def report(run, began):
    print(f"[{time.monotonic() - began:6.1f} s] {run.limit:8} {run.rule:7} n={run.n:<5} "
          f"sent={len(run.calls):<6} refused={run.refused():<6} gave_up={run.gave_up:<5} "
          f"last_served={fmt_s(run.served_at):>5} s upstream={run.upstream_calls} "
          f"peak={run.peak():.0f}/s", flush=True)


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def schedule(g, crowds, args, began):
    """Runs everything in one event loop. Short: the upstream runs, then the quota runs at once.
    Full: the quota runs of each crowd size take a minute of the clock each (their quotas are used
    up at second PREP_AT, the crowds start at 60 - LEAD); the ceiling and the upstream runs, one at
    a time, fill the time between, each started only if it should end before the next fixed
    moment, so nothing else runs while a crowd is measured."""
    runs, ceilings = [], []
    pending = [("upstream", n, rule) for n in crowds for rule in RULES]
    if not args.short:
        pending.insert(0, ("ceiling", max(crowds), None))
    took = {}  # the longest a kind of task took so far: the estimate for the next one

    def estimate(task):
        kind, n, _ = task
        return took.get((kind, n), 12.0 if n >= 500 else 7.0)

    async def do(task):
        kind, n, rule = task
        t0 = time.time()
        if kind == "ceiling":
            ceilings.extend(await ceiling(g, n, CEILING_ROUNDS))
            for c in ceilings:
                print(f"[{time.monotonic() - began:6.1f} s] ceiling  {c.kind:7} n={c.n:<5} "
                      f"{c.calls} calls in {c.seconds:.1f} s: {c.rate():.0f}/s", flush=True)
        else:
            run = Run("upstream", rule, n)
            g.script(model=f"{MODEL_PREFIX}-{run_id('upstream', rule, n)}",
                     rate_limit={"requests": upstream_rate(n), "window_ms": 1000})
            await upstream_run(g, run, args.seed)
            runs.append(run)
            report(run, began)
        took[(kind, n)] = max(took.get((kind, n), 0.0), time.time() - t0 + 0.5)

    async def fill(deadline):
        """Runs pending tasks, in order, that should end before `deadline` (wall clock)."""
        while True:
            fits = [t for t in pending if time.time() + estimate(t) < deadline]
            if not fits:
                return
            pending.remove(fits[0])
            await do(fits[0])

    if args.short:
        await fill(math.inf)
        if time.time() % 60 > 50:  # not across the window's end: the helper's check needs that
            await asyncio.sleep(61 - time.time() % 60)
    for n in crowds:
        phase = [Run("quota", rule, n) for rule in RULES]
        crowd_at = None
        if not args.short:
            now = time.time()
            spend_at = now - now % 60 + PREP_AT
            if spend_at < now + 0.5:
                spend_at += 60
            await fill(spend_at)
            await asyncio.sleep(max(0.0, spend_at - time.time()))
            crowd_at = spend_at - PREP_AT + 60 - LEAD
        await quota_phase(g, phase, args.seed, crowd_at, fill)
        runs.extend(phase)
        for run in phase:
            report(run, began)
    await fill(math.inf)
    order = {(lim, rule, n): i for i, (lim, n, rule) in enumerate(
        (lim, n, rule) for lim in LIMITS for n in crowds for rule in RULES)}
    runs.sort(key=lambda r: order[(r.limit, r.rule, r.n)])
    return runs, ceilings


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "aigw"))
    p.add_argument("--short", action="store_true", help="20 clients only: a smoke run of seconds")
    p.add_argument("--crowds", default=None, help="comma-separated crowd sizes (default 20,100,1000)")
    p.add_argument("--svg", default=None, help="draw calls per second for each rule into this SVG")
    p.add_argument("--svg-crowd", type=int, default=1000, help="the crowd size the picture shows")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default=None, help="also write every run's figures to this file")
    args = p.parse_args()
    crowds = [20] if args.short else [int(x) for x in (args.crowds or "20,100,1000").split(",")]
    gw_mod.BIN = os.path.abspath(args.bin)
    raise_fd_limit()
    load_before = os.getloadavg()
    began = time.monotonic()
    with gw_mod.running(resources(crowds), env={"AIGW_LOG": "error"}, record_calls=False) as g:
        g.hostport = ("127.0.0.1", int(g.gw.rsplit(":", 1)[1]))
        runs, ceilings = asyncio.run(schedule(g, crowds, args, began))
    total = time.monotonic() - began
    print()
    if ceilings:
        how = {"lean": "over lean connections (the naive rules)",
               "sdk": "through the SDK and the helper"}
        print("Ceiling (no limit; the gateway and the mock on the same cores): " + "; ".join(
            f"{c.n} clients {how[c.kind]} {c.rate():.0f} calls/s" for c in ceilings) + ".\n")
    print(f"Guardrail quota: `requests` per minute on the key = a quarter of the crowd, used up "
          f"when the crowds start {LEAD:g} s before the minute ends "
          f"({', '.join(f'{n}: {quota_limit(n)}' for n in crowds)}).\n")
    print(table(runs, "quota"))
    print()
    print(f"Rate-limited upstream: the mock serves a quarter of the crowd per second "
          f"({', '.join(f'{n}: {upstream_rate(n)}/s' for n in crowds)}).\n")
    print(table(runs, "upstream"))
    load = os.getloadavg()
    print(f"\nwhole run: {total:.0f} s; load average (1 min) {load_before[0]:.1f} before, "
          f"{load[0]:.1f} after, {load[2]:.1f} over 15 min; {os.cpu_count()} cores")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seconds": round(total, 1), "load_before": load_before, "load_after": load,
                       "ceilings": [{"kind": c.kind, "n": c.n, "calls": c.calls,
                                     "seconds": round(c.seconds, 2), "per_s": round(c.rate())}
                                    for c in ceilings],
                       "runs": [{"limit": r.limit, "rule": r.rule, "n": r.n, "sent": len(r.calls),
                                 "refused": r.refused(), "gave_up": r.gave_up, "codes": r.codes(),
                                 "last_served": max(r.served_at) if r.served_at else None,
                                 "all_done": max(r.done_at) if r.done_at else None,
                                 "peak_per_s": r.peak(), "upstream_calls": r.upstream_calls,
                                 "quota_reads": r.quota_reads, "window_left": r.window_left,
                                 "skipped": r.skipped,
                                 "calls": [[round(t, 3), st, c] for t, st, c in r.calls],
                                 "served_at": [round(t, 3) for t in r.served_at],
                                 "done_at": [round(t, 3) for t in r.done_at]} for r in runs]}, f)
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
