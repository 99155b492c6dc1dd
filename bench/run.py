#!/usr/bin/env python3
"""The proxy benchmark: the mock upstream called directly vs. through aigw (release build, request
logging on, SQLite), non-streamed and streamed, with wrk on loopback.

Prints, per path and mode: requests/s at 50 connections; p50/p99/p99.9 latency at 1 and at 50
connections; aigw CPU time per request; aigw peak RSS; and how many writes a stream the mock sends
at once leaves aigw in (more than two fails the run: aigw should pass the events on together). At one connection the latencies are timed
by bench/probe.rs, as recorded, and also with wrk's correction for coordinated omission applied to
the same samples ("corrected"); at 50 connections they are wrk's (corrected). Usage:

    cargo build --release --bin aigw --example probe && python3 bench/run.py [--duration 10] [--policies 0|4]
    python3 bench/run.py --compare-policies ROUNDS         # 0 vs 4 policies, in alternation
    python3 bench/run.py --compare-bin OTHER_AIGW [--rounds N] [--streamed]  # another build vs this one
    python3 bench/run.py --instructions [--check-budget | --update-budget] [--bin AIGW]  # instructions per request
    python3 bench/run.py --instructions --redis [--modes "4 policies"]  # the same, quotas shared through Redis
    python3 bench/run.py --instructions --postgres postgres://postgres@127.0.0.1:5432  # the same, stored on Postgres
    python3 bench/run.py --syscalls [--duration 5] [--bin AIGW]  # system calls per request
    python3 bench/run.py --waits [--duration 3] [--wait-ms 0.3]  # who held the CPU while wrk or the mock waited
    python3 bench/run.py --translation [--rounds 3] [--duration 5]  # translated vs native requests
    python3 bench/run.py --light [--rate 100] [--rounds 3] [--duration 10]  # idle_poll_us at a light load

Needs wrk (Debian: apt-get install wrk), valgrind for --instructions (and redis-server with
--redis), strace for --syscalls, perf for --waits. Traffic goes to 127.0.0.1 only.
"""

import argparse
import statistics
import json
import os
import re
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "aigw")
PROBE = os.path.join(ROOT, "target", "release", "examples", "probe")
KEY = "sk-aigw-BenchKey0123456789abcdefghijklmn"
CRED = "bench-upstream-key"
TICK = os.sysconf("SC_CLK_TCK")

RESOURCES = """
[[workspace]]
name = "bench"
[[department]]
workspace = "bench"
name = "eng"
[[member]]
workspace = "bench"
department = "eng"
email = "bench@bench.test"
role = "member"
[[api_key]]
member = "bench@bench.test"
name = "load"
key = "{key}"
[[upstream]]
workspace = "bench"
name = "mock"
provider = "openai-compatible"
base_url = "http://127.0.0.1:{mock}/v1"
api_key = "{cred}"
models = ["gpt-4o-mini"]
max_in_flight = 1024
[[model]]
workspace = "bench"
name = "gpt-4o-mini"
price = {{ prompt = 0.15, completion = 0.60 }}
"""

# An Anthropic credential beside the OpenAI-compatible one (both the same mock), for --translation.
ANTHROPIC = """
[[upstream]]
workspace = "bench"
name = "mock-anthropic"
provider = "anthropic"
base_url = "http://127.0.0.1:{mock}/v1"
api_key = "{cred}"
models = ["claude-bench"]
max_in_flight = 1024
[[model]]
workspace = "bench"
name = "claude-bench"
price = {{ prompt = 3.0, completion = 15.0 }}
"""

POLICIES = """
[[policy]]
workspace = "bench"
subject = "apikey"
target = "bench@bench.test/load"
metric = "total_tokens"
window = "day"
limit = 1000000000000
[[policy]]
workspace = "bench"
subject = "member"
target = "bench@bench.test"
metric = "requests"
window = "minute"
limit = 1000000000000
[[policy]]
workspace = "bench"
subject = "dept"
target = "eng"
metric = "credits"
window = "month"
limit = 1000000000000
[[policy]]
workspace = "bench"
subject = "ws"
target = "bench"
metric = "requests"
window = "5minutes"
limit = 1000000000000
"""


def chat_body(stream):
    """The benchmark's chat completion request, streamed or not."""
    msg = [{"role": "user", "content": "Summarise the benchmark in one short sentence please"}]
    return json.dumps({"model": "gpt-4o-mini", **({"stream": True} if stream else {}), "messages": msg})


def messages_body(stream, model="claude-bench"):
    """The same request in Anthropic's messages format."""
    msg = [{"role": "user", "content": "Summarise the benchmark in one short sentence please"}]
    return json.dumps({"model": model, "max_tokens": 64, **({"stream": True} if stream else {}), "messages": msg})


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, proc, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"process exited early: {proc.stderr.read().decode()}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except Exception:
            time.sleep(0.05)
    sys.exit(f"{url} not ready")


def stream_writes(port):
    """How many HTTP chunks (writes) aigw sends one streamed answer in. The mock writes its whole
    stream at once, so aigw should pass the events on in one chunk (two at most: the body's start
    may go out with the head), not one per event; counted in the chunked encoding, which a raw
    client sees whatever TCP did with the bytes. Returns (events, chunks)."""
    body = chat_body(True).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nauthorization: Bearer {KEY}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head.encode() + body)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, rest = raw.split(b"\r\n\r\n", 1)
    if not head.startswith(b"HTTP/1.1 200") or b"transfer-encoding: chunked" not in head.lower():
        sys.exit(f"the streamed request failed: {head.decode(errors='replace')}")
    chunks = []
    while True:
        size, rest = rest.split(b"\r\n", 1)
        size = int(size, 16)
        if size == 0:
            break
        chunks.append(rest[:size])
        rest = rest[size + 2:]
    events = sum(c.count(b"data: ") for c in chunks)
    if not b"".join(chunks).rstrip().endswith(b"data: [DONE]"):
        sys.exit("the streamed answer did not end with data: [DONE]")
    return events, len(chunks)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def wrk(url, key, body, conns, duration):
    env = dict(os.environ, BENCH_KEY=key, BENCH_BODY=body)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--latency", "-s", os.path.join(ROOT, "bench", "post.lua"), url],
        env=env, capture_output=True, text=True, check=True).stdout
    m = re.search(r"BENCH (.*)", out)
    if not m:
        sys.exit(f"wrk printed no result:\n{out}")
    r = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    return r


def probe(url, key, body, duration, rate=None):
    """One connection, timed per request by bench/probe.rs: the recorded p50/p99/p99.9, `over500`
    (requests slower than 500 µs), and `cp99` (wrk's correction for coordinated omission applied to
    the same samples, as wrk reports its own percentiles). With `rate`, one request every 1/rate s
    instead of back to back."""
    addr, path = url.removeprefix("http://").split("/", 1)
    paced = [str(rate)] if rate else []
    done = subprocess.run([PROBE, addr, "/" + path, key, str(duration), *paced], input=body,
                          capture_output=True, text=True)
    m = re.search(r"PROBE (.*)", done.stdout)
    if done.returncode != 0 or not m:
        sys.exit(f"the probe failed against {url}:\n{done.stdout}{done.stderr}")
    r = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    r["non2xx"] = 0  # counted in errors
    return r


def start_redis(tmp):
    """A redis-server of this run only: a free port on 127.0.0.1, no persistence, its files in
    `tmp`. Returns (process, port)."""
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit("redis-server did not start")


def start_gateway(tmp, mock_port, policies, binary=None, name=None, env=None, wrap=(), extra=""):
    """An `aigw serve` (of `binary`, default BIN) with its own SQLite file and `policies` (0 or 4)
    quota policies, in `tmp/name`; `env` adds settings, `wrap` runs it under a tool (valgrind)."""
    binary = binary or BIN
    port = free_port()
    home = os.path.join(tmp, name or f"gw-{policies}")
    os.makedirs(home)
    res = os.path.join(home, "resources.toml")
    with open(res, "w") as f:
        f.write(RESOURCES.format(key=KEY, mock=mock_port, cred=CRED))
        if policies:
            f.write(POLICIES)
        f.write(extra.format(mock=mock_port, cred=CRED))
    env = {"PATH": os.environ.get("PATH", ""), "AIGW_LISTEN": f"127.0.0.1:{port}",
           "AIGW_DATABASE_URL": f"sqlite://{home}/aigw.db", "AIGW_LOG": "warn",
           "AIGW_BOOTSTRAP_PASSWORD": "bench-owner-pass", **(env or {})}
    gw = subprocess.Popen([*wrap, binary, "serve", "--resources", res], env=env, cwd=home,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return gw, port


def alternate(gws, labels, duration, rounds, stream=False):
    """The same load (non-streamed, or streamed) on each gateway in turn, `rounds` times, so that
    the shared machine's drift hits all alike. Per label: the rounds as (req/s @50, p99 @1, CPU
    µs/request @50, p50 @1, corrected p99 @1, requests over 500 µs @1), and their medians."""
    body = chat_body(stream)
    runs = {n: [] for n in labels}
    for gw, port in gws:
        wrk(f"http://127.0.0.1:{port}/v1/chat/completions", KEY, body, 50, 2)
    for _ in range(rounds):
        for n, (gw, port) in zip(labels, gws):
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            one = probe(url, KEY, body, duration)
            before = cpu_seconds(gw.pid)
            fifty = wrk(url, KEY, body, 50, duration)
            cpu_us = (cpu_seconds(gw.pid) - before) / max(fifty["requests"], 1) * 1e6
            runs[n].append((fifty["rps"], one["p99"], cpu_us, one["p50"], one["cp99"], one["over500"]))
    med = {n: [statistics.median(r[i] for r in runs[n]) for i in range(6)] for n in runs}
    return runs, med


def compare_policies(gws, duration, rounds):
    """Issue 4's check: 4 policies against none, measured in alternation; medians over the rounds."""
    runs, med = alternate(gws, (0, 4), duration, rounds)
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# 0 vs 4 quota policies ({rev}, non-streamed, {rounds} alternating rounds of {duration} s, medians)\n")
    print("| policies | req/s @50 | p99 @1 | aigw CPU/request | rounds (req/s) |")
    print("|---|---|---|---|---|")
    for n in (0, 4):
        rps, p99, cpu, _, _, _ = med[n]
        each = ", ".join(f"{r[0]:,.0f}" for r in runs[n])
        print(f"| {n} | {rps:,.0f} | {p99:.0f} µs | {cpu:.1f} µs | {each} |")
    print(f"\n- throughput with 4 policies: {(med[4][0] / med[0][0] - 1) * 100:+.1f} % "
          f"(target: no more than 10 % lower)")
    print(f"- p99 at 1 connection: {med[4][1] - med[0][1]:+.0f} µs (target: no more than 100 µs added)")


class OtlpSink:
    """A collector that accepts every OTLP/HTTP export (200, empty body) and counts its bytes: the
    far end of the traces' cost, kept out of the gateway's CPU."""

    def __init__(self):
        import http.server
        import threading
        sink = self
        self.exports, self.bytes = 0, 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("content-length") or 0)
                self.rfile.read(n)
                sink.exports += 1
                sink.bytes += n
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def compare_tracing(tmp, mock_port, duration, rounds, stream=False, ratio=1.0):
    """What OpenTelemetry traces cost: one gateway with tracing off, one exporting the share
    `ratio` of traces to a local sink, in alternation; medians, and what the sink received."""
    sink = OtlpSink()
    labels = ("off", "on")
    gws = [start_gateway(tmp, mock_port, 0, name="otel-off"),
           start_gateway(tmp, mock_port, 0, name="otel-on", env={"AIGW_OTEL_ENDPOINT": sink.url,
                                                                   "AIGW_OTEL_SAMPLE_RATIO": str(ratio)})]
    try:
        for gw, port in gws:
            wait_ready(f"http://127.0.0.1:{port}/readyz", gw)
        runs, med = alternate(gws, labels, duration, rounds, stream)
        time.sleep(2)  # the last batch
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{gws[1][1]}/metrics", timeout=10).read().decode()
    finally:
        for gw, _ in gws:
            gw.terminate()
            gw.wait(timeout=20)
        sink.close()
    count = lambda name: sum(float(l.split()[-1]) for l in metrics.splitlines() if l.startswith(name))
    mode = "streamed" if stream else "non-streamed"
    print(f"# traces off vs on ({mode}, sample ratio {ratio}, {rounds} alternating rounds of {duration} s, medians)\n")
    print("| tracing | req/s @50 | aigw CPU/request | p50 @1 | p99 @1 | rounds (req/s) |")
    print("|---|---|---|---|---|---|")
    for n in labels:
        rps, p99, cpu, p50, _, _ = med[n]
        each = ", ".join(f"{r[0]:,.0f}" for r in runs[n])
        print(f"| {n} | {rps:,.0f} | {cpu:.1f} µs | {p50:.0f} µs | {p99:.0f} µs | {each} |")
    print(f"\n- spans exported {count('aigw_trace_spans_exported_total'):,.0f}, dropped "
          f"{count('aigw_trace_spans_dropped_total'):,.0f}; the sink got {sink.exports:,} exports, "
          f"{sink.bytes / 1e6:,.1f} MB")


def compare_binaries(gws, labels, duration, rounds, stream=False):
    """Two builds of aigw (say, before and after a change), measured in alternation; medians."""
    runs, med = alternate(gws, labels, duration, rounds, stream)
    mode = "streamed" if stream else "non-streamed"
    print(f"# two builds ({mode}, no quota policies, {rounds} alternating rounds of {duration} s, medians)\n")
    print("| build | req/s @50 | aigw CPU/request | p50 @1 | p99 @1 | p99 @1 corrected | >500 µs @1 "
          "| rounds (req/s; CPU µs; >500 µs) |")
    print("|---|---|---|---|---|---|---|---|")
    for n in labels:
        rps, p99, cpu, p50, cp99, slow = med[n]
        each = ", ".join(f"{r[0]:,.0f}; {r[2]:.0f}; {r[5]}" for r in runs[n])
        print(f"| {n} | {rps:,.0f} | {cpu:.1f} µs | {p50:.0f} µs | {p99:.0f} µs | {cp99:.0f} µs | {slow:.0f} | {each} |")


def light_load(tmp, mock_port, rate, duration, rounds, polls=(0, 50, 200, 1000)):
    """What idle polling costs when traffic is light: one gateway per `idle_poll_us` in `polls`,
    each sent `rate` requests/s on one connection (non-streamed, the mock answering at once: the
    case where polling runs most), in alternation; medians of the gateway's CPU per request, its
    share of a core, and the latency."""
    gws = [start_gateway(tmp, mock_port, 0, name=f"poll-{us}", env={"AIGW_IDLE_POLL_US": str(us)})
           for us in polls]
    try:
        for gw, port in gws:
            wait_ready(f"http://127.0.0.1:{port}/readyz", gw)
        body = chat_body(False)
        for gw, port in gws:
            wrk(f"http://127.0.0.1:{port}/v1/chat/completions", KEY, body, 10, 1)
        runs = {us: [] for us in polls}
        for _ in range(rounds):
            for us, (gw, port) in zip(polls, gws):
                before = cpu_seconds(gw.pid)
                one = probe(f"http://127.0.0.1:{port}/v1/chat/completions", KEY, body, duration, rate)
                cpu = cpu_seconds(gw.pid) - before
                runs[us].append((cpu / max(one["requests"], 1) * 1e6, cpu / duration * 100, one["p50"], one["p99"]))
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
        print(f"# idle polling at {rate:g} requests/s ({rev}, non-streamed, one connection, {rounds} alternating "
              f"rounds of {duration} s, medians)\n")
        print("| idle_poll_us | aigw CPU/request | aigw CPU (% of a core) | p50 | p99 | rounds (CPU µs/request) |")
        print("|---|---|---|---|---|---|")
        for us in polls:
            med = [statistics.median(r[i] for r in runs[us]) for i in range(4)]
            each = ", ".join(f"{r[0]:.0f}" for r in runs[us])
            print(f"| {us} | {med[0]:.0f} µs | {med[1]:.2f} % | {med[2]:.0f} µs | {med[3]:.0f} µs | {each} |")
    finally:
        for gw, _ in gws:
            gw.terminate()
            gw.wait(timeout=20)


def compare_translation(gw, port, duration, rounds):
    """What translation costs: on one gateway, each request shape served natively and translated,
    in alternation, non-streamed and streamed; medians over the rounds."""
    base = f"http://127.0.0.1:{port}"
    paths = [
        ("chat → OpenAI credential (native)", "/v1/chat/completions", chat_body),
        ("messages → Anthropic credential (native)", "/v1/messages", messages_body),
        ("chat → Anthropic credential (translated)", "/v1/chat/completions",
         lambda stream: chat_body(stream).replace('"gpt-4o-mini"', '"claude-bench"')),
        ("messages → OpenAI credential (translated)", "/v1/messages",
         lambda stream: messages_body(stream, "gpt-4o-mini")),
    ]
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# translation vs native ({rev}, {rounds} alternating rounds of {duration} s, medians, "
          f"the same gateway and mock)\n")
    print("| mode | request → served by | req/s @50 | aigw CPU/request | p50 @1 | errors |")
    print("|---|---|---|---|---|---|")
    cpu_of = {}
    for stream in (False, True):
        mode = "streamed" if stream else "non-streamed"
        runs = {label: [] for label, _, _ in paths}
        for label, path, body in paths:
            wrk(base + path, KEY, body(stream), 50, 2)
        for _ in range(rounds):
            for label, path, body in paths:
                one = probe(base + path, KEY, body(stream), duration)
                before = cpu_seconds(gw.pid)
                fifty = wrk(base + path, KEY, body(stream), 50, duration)
                cpu_us = (cpu_seconds(gw.pid) - before) / max(fifty["requests"], 1) * 1e6
                errs = one["errors"] + fifty["errors"] + fifty["non2xx"]
                runs[label].append((fifty["rps"], cpu_us, one["p50"], errs))
        for label, _, _ in paths:
            rps, cpu, p50 = (statistics.median(r[i] for r in runs[label]) for i in range(3))
            errs = sum(r[3] for r in runs[label])
            cpu_of[(mode, label)] = cpu
            print(f"| {mode} | {label} | {rps:,.0f} | {cpu:.1f} µs | {p50:.0f} µs | {errs} |")
    print()
    for mode in ("non-streamed", "streamed"):
        to_anthropic = cpu_of[(mode, paths[2][0])] - cpu_of[(mode, paths[1][0])]
        to_openai = cpu_of[(mode, paths[3][0])] - cpu_of[(mode, paths[0][0])]
        print(f"- {mode}: translating chat → Anthropic costs {to_anthropic:+.1f} µs of aigw CPU per request "
              f"against the native messages request to the same credential; messages → OpenAI "
              f"{to_openai:+.1f} µs against the native chat request")


BUDGET = os.path.join(ROOT, "bench", "budget.toml")

# The modes of the instruction count and of the budget: (mode, gateway, path, body). Gateway "0"
# has no quota policy and an Anthropic credential beside the OpenAI-compatible one (the default
# settings otherwise); gateway "4" has the four policies of POLICIES on every request.
COUNTED = (
    ("non-streamed", "0", "/v1/chat/completions", chat_body(False)),
    ("streamed", "0", "/v1/chat/completions", chat_body(True)),
    ("translated", "0", "/v1/chat/completions", chat_body(False).replace('"gpt-4o-mini"', '"claude-bench"')),
    ("4 policies", "4", "/v1/chat/completions", chat_body(False)),
)


def send_exactly(port, path, body, n, conns=4):
    """Exactly `n` requests (keep-alive, over `conns` connections opened once), each answer read to
    its end; returns how many failed. A fixed count, not a fixed time, so that two counted runs
    hold the same requests whatever the machine's speed."""
    import http.client
    import threading
    failed = [0]
    share = [n // conns + (1 if i < n % conns else 0) for i in range(conns)]
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}

    def run(count):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for _ in range(count):
            c.request("POST", path, body=body, headers=headers)
            r = c.getresponse()
            r.read()
            if r.status != 200:
                failed[0] += 1
        c.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in share if k]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failed[0]


def callgrind_dump(pid, home):
    """Dumps (and so zeroes) the running callgrind's counters; returns the dump's total."""
    before = set(os.listdir(home))
    subprocess.run(["callgrind_control", "-d", str(pid)], capture_output=True, check=True)
    new = sorted(set(os.listdir(home)) - before, key=lambda n: int(n.rsplit(".", 1)[-1]) if n[-1].isdigit() else 0)
    if not new:
        sys.exit(f"callgrind_control -d {pid} left no dump in {home}")
    path = os.path.join(home, new[-1])
    with open(path) as f:
        m = re.search(r"^totals: (\d+)", f.read(), re.M)
    return (int(m.group(1)) if m else 0), path


# Under callgrind: seconds for the log writer to write what was served before a dump, and
# seconds of idling whose count, scaled to the counted run's length, is taken off it.
SETTLE, IDLE = 2.0, 4.0


def instructions(tmp, mock_port, requests, warm, keep=None, only=None, redis_url=None, postgres=None):
    """aigw's user-space instructions per request, counted by callgrind: unlike time, the count
    hardly moves with what else the machine runs, so it compares two builds on a noisy host and
    holds a budget in CI. Per mode, in a gateway under valgrind that has served `warm` requests
    of that mode (connections, caches and lazy statics warm) and flushed their logs: the counters
    are zeroed and the gateway idles for IDLE seconds (B: what its timers and flushers cost with
    no request); then exactly `requests` requests are sent (4 connections), their logs flushed,
    and the count dumped (A). (A - B scaled to A's length) / requests is the figure: start-up,
    warm-up and the idle work drop out. With `keep`, each mode's counted profile (A) is copied
    there (`non-streamed.out`, ...) for callgrind_annotate. With `redis_url`, the gateways share
    their quota counters through that Redis. With `postgres` (a server's URL), each gateway
    stores in a database of its own created there, and dropped after. Returns {mode: instructions}."""
    if not shutil.which("valgrind"):
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    modes = [m for m in COUNTED if not only or m[0] in only]
    result = {}
    for policies in ("0", "4"):
        mine = [m for m in modes if m[1] == policies]
        if not mine:
            continue
        home = os.path.join(tmp, f"cg-{policies}")
        out = os.path.join(home, "callgrind.out")
        # Idle polling off: the instructions of a thread waiting for work are not the request's,
        # and under valgrind it would spin for most of the run.
        env = {"AIGW_IDLE_POLL_US": "0"}
        if redis_url:
            env["AIGW_REDIS_URL"] = redis_url
        if postgres:
            db = f"aigw_bench_{os.getpid()}_{policies}"
            subprocess.run(["psql", "-q", "-d", f"{postgres}/postgres", "-c", f"CREATE DATABASE {db}"], check=True)
            env["AIGW_DATABASE_URL"] = f"{postgres}/{db}"
        gw, port = start_gateway(tmp, mock_port, int(policies), name=f"cg-{policies}", env=env, extra=ANTHROPIC,
                                 wrap=("valgrind", "--tool=callgrind", "--instr-atstart=no",
                                       f"--callgrind-out-file={out}"))
        try:
            wait_ready(f"http://127.0.0.1:{port}/readyz", gw, timeout=180)
            subprocess.run(["callgrind_control", "-i", "on", str(gw.pid)], capture_output=True, check=True)
            for mode, _, path, body in mine:
                if send_exactly(port, path, body, warm):
                    sys.exit(f"{mode}: the warm-up requests failed")
                time.sleep(SETTLE)  # the warm-up's logs are written (the writer flushes every 250 ms)
                callgrind_dump(gw.pid, home)
                time.sleep(IDLE)
                idle, _ = callgrind_dump(gw.pid, home)
                t0 = time.monotonic()
                failed = send_exactly(port, path, body, requests)
                time.sleep(SETTLE)  # the counted requests' logs are written
                counted, profile = callgrind_dump(gw.pid, home)
                idle_as_long = idle * (time.monotonic() - t0) / IDLE
                if failed:
                    sys.exit(f"{mode}: {failed} of {requests} requests failed")
                if keep:
                    os.makedirs(keep, exist_ok=True)
                    shutil.copy(profile, os.path.join(keep, f"{mode.replace(' ', '-')}.out"))
                result[mode] = (counted - idle_as_long) / requests
                print(f"  {mode}: {result[mode]:,.0f} instructions/request "
                      f"({counted:,} with {requests} requests, {idle_as_long:,.0f} idle as long)", file=sys.stderr)
        finally:
            gw.terminate()
            gw.wait(timeout=60)
            if postgres:
                subprocess.run(["psql", "-q", "-d", f"{postgres}/postgres", "-c", f"DROP DATABASE {db}"], check=True)
    return result


def counted_instructions(tmp, mock_port, args):
    """--instructions: the count of each mode, printed; with --check-budget, against
    bench/budget.toml (returns the failures); with --update-budget, written there."""
    only = set(args.modes.split(",")) if args.modes else None
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    shared = (" with Redis" if args.redis else "") + (" on Postgres" if args.postgres else "")
    print(f"# aigw instructions per request{shared} ({BIN if args.bin else rev}; callgrind, {args.requests} "
          f"requests per mode after {args.warm}, less the same time idle)\n")
    if (args.redis or args.postgres) and (args.check_budget or args.update_budget):
        sys.exit("--redis and --postgres count other settings than the budget's: "
                 "not with --check-budget or --update-budget")
    redis = None
    if args.redis:
        if not shutil.which("redis-server"):
            sys.exit("redis-server is not installed (Debian: apt-get install redis-server)")
        redis, redis_port = start_redis(tmp)
    try:
        url = f"redis://127.0.0.1:{redis_port}/0" if redis else None
        postgres = args.postgres.rstrip("/") if args.postgres else None
        counts = instructions(tmp, mock_port, args.requests, args.warm, args.keep_profiles, only, url, postgres)
    finally:
        if redis:
            redis.kill()
            redis.wait()
    budget = read_budget() if os.path.exists(BUDGET) else {}
    failures = []
    if args.check_budget:
        failures = check_budget(counts, budget)
    else:
        print("| mode | instructions/request |")
        print("|---|---|")
        for mode, n in counts.items():
            print(f"| {mode} | {n:,.0f} |")
    if args.update_budget:
        kept = dict(budget.get("modes", {}))
        write_budget({**{m: v["instructions"] for m, v in kept.items()}, **counts}, budget)
        print(f"\n{BUDGET} rewritten")
        failures = []
    return failures


def read_budget():
    import tomllib
    with open(BUDGET, "rb") as f:
        return tomllib.load(f)


def write_budget(counts, old):
    """bench/budget.toml with `counts` as the new budget, keeping each mode's tolerance."""
    default = old.get("tolerance", 0.03)
    lines = [
        "# Instructions per request of each mode, counted under callgrind by",
        "# `python3 bench/run.py --instructions --check-budget` (see docs/performance.md, \"The budget\").",
        "# CI fails when a mode counts more than its budget times (1 + tolerance). Rewrite it with",
        "# `--update-budget` only from a release build of the commit that changes the count.",
        f"tolerance = {default}",
        "",
    ]
    for mode, _, _, _ in COUNTED:
        if mode not in counts:
            continue
        prev = old.get("modes", {}).get(mode, {})
        lines.append(f'[modes."{mode}"]')
        lines.append(f"instructions = {round(counts[mode])}")
        if "tolerance" in prev:
            lines.append(f"tolerance = {prev['tolerance']}")
        lines.append("")
    with open(BUDGET, "w") as f:
        f.write("\n".join(lines))


def check_budget(counts, budget):
    """Each mode against its budget: over by more than its tolerance fails; under by more than
    three times it fails too (the budget is stale: lower it with --update-budget, so that the win
    is held). Returns the failures."""
    default = budget.get("tolerance", 0.03)
    failures = []
    print("| mode | instructions/request | budget | difference | tolerance | |")
    print("|---|---|---|---|---|---|")
    for mode, _, _, _ in COUNTED:
        if mode not in counts:
            continue
        spec = budget.get("modes", {}).get(mode)
        if not spec:
            failures.append(f"{mode}: no budget in {BUDGET}")
            continue
        tol = spec.get("tolerance", default)
        diff = counts[mode] / spec["instructions"] - 1
        verdict = "ok"
        if diff > tol:
            verdict = "OVER"
            failures.append(f"{mode}: {counts[mode]:,.0f} instructions/request, {diff * 100:+.1f} % against "
                            f"the budget of {spec['instructions']:,} (tolerance {tol * 100:.0f} %)")
        elif diff < -3 * tol:
            verdict = "stale"
            failures.append(f"{mode}: {counts[mode]:,.0f} instructions/request, {diff * 100:+.1f} % under the "
                            f"budget of {spec['instructions']:,}: lower it (--update-budget) so the win is held")
        print(f"| {mode} | {counts[mode]:,.0f} | {spec['instructions']:,} | {diff * 100:+.1f} % | "
              f"{tol * 100:.0f} % | {verdict} |")
    return failures


def syscalls(tmp, mock_port, duration):
    """aigw's system calls per request, counted by `strace -f -c` (all threads, so the log
    writer's share too) during a run at one connection, non-streamed and streamed: how many reads
    and writes a request costs, which the instruction count does not show. Idle polling is off
    here: its polls (`epoll_wait`, `sched_yield`) replace sleeping, not work of the request."""
    if not shutil.which("strace"):
        sys.exit("strace is not installed (Debian: apt-get install strace)")
    shown = ("writev", "recvfrom", "sendto", "epoll_wait", "futex", "pwrite64")
    print(f"# aigw system calls per request (strace -f -c, 1 connection, {duration} s per mode)\n")
    print("| mode | requests | " + " | ".join(shown) + " | all |")
    print("|---|---|" + "---|" * (len(shown) + 1))
    for mode, stream in (("non-streamed", False), ("streamed", True)):
        home = os.path.join(tmp, f"st-{mode}")
        gw, port = start_gateway(tmp, mock_port, 0, name=f"st-{mode}", env={"AIGW_IDLE_POLL_US": "0"})
        try:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            wait_ready(f"http://127.0.0.1:{port}/readyz", gw)
            body = chat_body(stream)
            wrk(url, KEY, body, 1, 2)
            time.sleep(1)  # the warm-up's logs are written before counting starts
            out = os.path.join(home, "strace.txt")
            tracer = subprocess.Popen(["strace", "-f", "-c", "-o", out, "-p", str(gw.pid)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)  # attached to every thread
            r = wrk(url, KEY, body, 1, duration)
            time.sleep(1)  # the counted requests' logs are written
            tracer.send_signal(signal.SIGINT)
            tracer.wait(timeout=30)
        finally:
            gw.terminate()
            gw.wait(timeout=20)
        calls = {}
        with open(out) as f:
            for line in f:
                cols = line.split()
                if len(cols) >= 5 and cols[0][0].isdigit() and cols[-1] != "total":
                    calls[cols[-1]] = int(cols[3])
        if r["errors"] or r["non2xx"] or not r["requests"]:
            sys.exit(f"{mode}: {r['errors']} errors, {r['non2xx']} non-2xx of {r['requests']} requests")
        per = lambda n: f"{n / r['requests']:.2f}"
        print(f"| {mode} | {r['requests']:,} | " + " | ".join(per(calls.get(c, 0)) for c in shown)
              + f" | {per(sum(calls.values()))} |")


def waits(tmp, mock, mock_port, duration, threshold_ms=0.3):
    """Where the 1-connection tail comes from: `perf sched record` on all CPUs during a non-streamed
    run at one connection through aigw, then, for every wake-up of wrk or of the mock that waited
    longer than `threshold_ms` for a CPU, which threads ran on that CPU meanwhile (summed by
    process and thread name). The figures are under perf, which itself takes CPU (it is listed)."""
    if not shutil.which("perf"):
        sys.exit("perf is not installed (Debian: apt-get install linux-perf)")
    body = chat_body(False)
    gw, port = start_gateway(tmp, mock_port, 0, name="waits")
    data = os.path.join(tmp, "perf.data")
    try:
        wait_ready(f"http://127.0.0.1:{port}/readyz", gw)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        wrk(url, KEY, body, 50, 2)
        perf = subprocess.Popen(["perf", "sched", "record", "-a", "-o", data, "--", "sleep", str(duration + 1)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        r = wrk(url, KEY, body, 1, duration)
        perf.wait(timeout=duration + 60)
    finally:
        gw.terminate()
        gw.wait(timeout=20)
    events = timehist(data)
    owner = {str(gw.pid): "aigw", str(mock.pid): "mock"}
    runs, waited = {}, []  # per CPU: (start, end, who); wake-ups of wrk and the mock that waited
    for end, cpu, task, delay, ran in (e[1:] for e in events if e[0] == "switch"):
        name, _, ids = task.partition("[")
        pid = ids.rstrip("]").split("/")[-1]
        who = f"{owner[pid]}: {name}" if pid in owner else name
        runs.setdefault(cpu, []).append((end - ran, end, who))
        if (who.startswith("mock") or name == "wrk") and delay * 1e3 > threshold_ms:
            waited.append((cpu, end - ran - delay, end - ran))
    blame, longest = {}, {}
    for cpu, start, until in waited:
        for a, b, who in runs[cpu]:
            overlap = min(b, until) - max(a, start)
            if overlap > 0:
                blame[who] = blame.get(who, 0) + overlap
                longest[who] = max(longest.get(who, 0), b - a)
    total = sum(b - a for _, a, b in waited)
    print(f"# who held the CPU while wrk or the mock waited > {threshold_ms} ms "
          f"(perf sched, 1 connection through aigw, non-streamed, {duration} s)\n")
    print(f"- requests: {r['requests']:,}; p50 {r['p50']} µs, p99 {r['p99']} µs (wrk's, corrected for coordinated omission; under perf)")
    print(f"- such waits: {len(waited):,}, {total * 1e3:.1f} ms in all\n")
    print("| thread (process) | ms on that CPU during the waits | its longest such run, ms |")
    print("|---|---|---|")
    for who, t in sorted(blame.items(), key=lambda kv: -kv[1])[:12]:
        print(f"| {who} | {t * 1e3:.1f} | {longest[who] * 1e3:.2f} |")
    hops(events, str(mock.pid))


def timehist(data):
    """`perf sched timehist -w` of the record `data`, read once, in its order: switches, as
    ("switch", end, cpu, task, how long it waited for the CPU, how long it ran), in seconds; and
    wake-ups, as ("wake", time, task woken)."""
    hist = subprocess.run(["perf", "sched", "timehist", "-w", "-i", data], capture_output=True, text=True,
                          errors="replace").stdout
    events = []
    for line in hist.splitlines():
        cols = line.split()
        if len(cols) < 4 or not cols[0][0].isdigit():
            continue
        if "awakened:" in cols:
            events.append(("wake", float(cols[0]), " ".join(cols[cols.index("awakened:") + 1:])))
            continue
        try:
            end, delay, ran = float(cols[0]), float(cols[-2]) / 1e3, float(cols[-1]) / 1e3
        except ValueError:
            continue
        events.append(("switch", end, cols[1], " ".join(cols[2:-3]), delay, ran))
    return events


HOPS = ("aigw in", "mock waits", "mock runs", "aigw out", "wrk waits")


def hops(timeline, mock_pid):
    """The request's hops, from the scheduler's switches and wake-ups: wrk sleeps after sending ->
    (aigw in) the mock is woken -> (mock waits) it runs -> (mock runs) it sleeps after answering ->
    (aigw out) wrk is woken -> (wrk waits) wrk runs. Only cycles in which wrk slept can be
    followed (aigw's serving thread polls, so its own part shows only as the time between)."""
    events = []
    for e in timeline:
        if e[0] == "wake":
            events.append((e[1], "wake", e[2]))
        else:
            end, task, ran = e[1], e[3], e[5]
            events += [(end - ran, "in", task), (end, "out", task)]
    events.sort(key=lambda e: e[0])
    cycles, cur = [], None
    for t, kind, task in events:
        if task.startswith("wrk["):
            if kind == "out":
                cur = {"start": t}
            elif cur and kind == "wake" and "mock out" in cur:
                cur["wrk woken"] = t
            elif cur and kind == "in" and "wrk woken" in cur:
                cur["wrk in"] = t
                cycles.append(cur)
                cur = None
        elif cur and task.endswith(f"/{mock_pid}]"):
            if kind == "wake" and "mock woken" not in cur:
                cur["mock woken"] = t
            elif kind == "in" and "mock woken" in cur and "mock in" not in cur:
                cur["mock in"] = t
            elif kind == "out" and "mock in" in cur:
                cur["mock out"] = t
    marks = ("start", "mock woken", "mock in", "mock out", "wrk woken", "wrk in")
    rows = [[c[b] - c[a] for a, b in zip(marks, marks[1:])] for c in cycles]
    if not rows:
        return
    slow = [r for r in rows if sum(r) > 500e-6]
    pct = lambda v, q: sorted(v)[min(int(len(v) * q), len(v) - 1)] * 1e6
    print(f"\n# the request's hops ({len(rows):,} cycles in which wrk slept; "
          f"{len(slow)} took over 500 µs)\n")
    print("| hop | p50 µs | p99 µs | p99.9 µs | longest hop of the slow cycles |")
    print("|---|---|---|---|---|")
    for i, hop in enumerate(HOPS):
        col = [r[i] for r in rows]
        longest = sum(1 for r in slow if max(range(len(HOPS)), key=lambda j: r[j]) == i)
        print(f"| {hop} | {pct(col, .5):.0f} | {pct(col, .99):.0f} | {pct(col, .999):.0f} | {longest} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=10, help="seconds per run (default 10)")
    ap.add_argument("--policies", type=int, choices=[0, 4], default=0,
                    help="quota policies on every request: 0, or 4 (key, member, dept, ws)")
    ap.add_argument("--compare-policies", type=int, metavar="ROUNDS", default=0,
                    help="instead: two gateways, one with 0 and one with 4 policies, measured in alternation "
                         "for ROUNDS rounds (non-streamed); prints the medians and the difference")
    ap.add_argument("--compare-bin", metavar="OTHER_AIGW", default=None,
                    help="instead: this build against OTHER_AIGW (another aigw binary, e.g. of an earlier commit), "
                         "measured in alternation for --rounds rounds (non-streamed, or --streamed); prints the "
                         "medians")
    ap.add_argument("--streamed", action="store_true", help="with --compare-bin or --compare-tracing: streamed requests")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of --compare-bin (default 5)")
    ap.add_argument("--instructions", action="store_true",
                    help="instead: aigw's instructions per request under callgrind (valgrind), non-streamed, "
                         "streamed, translated and with 4 policies; --requests counted per mode")
    ap.add_argument("--requests", type=int, default=2000,
                    help="with --instructions: requests counted per mode (default 2000)")
    ap.add_argument("--warm", type=int, default=1000,
                    help="with --instructions: requests served per mode before counting (default 1000)")
    ap.add_argument("--modes", default=None,
                    help="with --instructions: only these modes, comma-separated (default all)")
    ap.add_argument("--postgres", metavar="SERVER_URL", default=None,
                    help="with --instructions: each gateway stores in a database of its own created on this Postgres "
                         "server (e.g. postgres://postgres@127.0.0.1:5432), dropped after")
    ap.add_argument("--redis", action="store_true",
                    help="with --instructions: the gateways share their quota counters through a redis-server of this run")
    ap.add_argument("--check-budget", action="store_true",
                    help=f"with --instructions: fail when a mode is over its budget in bench/budget.toml by "
                         f"more than its tolerance (or under by more than three times it: a stale budget)")
    ap.add_argument("--update-budget", action="store_true",
                    help="with --instructions: rewrite bench/budget.toml with the counts")
    ap.add_argument("--syscalls", action="store_true",
                    help="instead: aigw's system calls per request under strace at 1 connection, non-streamed "
                         "and streamed; --duration seconds counted per mode")
    ap.add_argument("--waits", action="store_true",
                    help="instead: under perf sched at 1 connection, which threads held the CPU while wrk or "
                         "the mock waited for one; --duration seconds (3 is enough)")
    ap.add_argument("--wait-ms", type=float, default=0.3,
                    help="with --waits: count the waits longer than this (default 0.3 ms)")
    ap.add_argument("--keep-profiles", metavar="DIR", default=None,
                    help="with --instructions: copy each mode's callgrind profile into DIR")
    ap.add_argument("--translation", action="store_true",
                    help="translated requests (chat ⇄ messages) against native ones, in alternation")
    ap.add_argument("--light", action="store_true",
                    help="instead: idle_poll_us 0, 50, 200 and 1000 at a light load (--rate requests/s on one "
                         "connection), in alternation for --rounds rounds: CPU per request and latency")
    ap.add_argument("--rate", type=float, default=100, help="with --light: requests per second (default 100)")
    ap.add_argument("--compare-tracing", type=int, metavar="ROUNDS", default=0,
                    help="tracing off vs on (OTLP to a local sink), alternating ROUNDS rounds "
                         "(with --streamed: streamed requests)")
    ap.add_argument("--sample-ratio", type=float, default=1.0,
                    help="with --compare-tracing: otel_sample_ratio of the traced gateway (default 1)")
    ap.add_argument("--bin", default=None, help="the aigw binary to measure (default target/release/aigw)")
    args = ap.parse_args()
    global BIN
    BIN = os.path.abspath(args.bin) if args.bin else BIN
    if not shutil.which("wrk") and not args.instructions:
        sys.exit("wrk is not installed (Debian: apt-get install wrk)")
    # The probe times one connection in the full run and in the comparisons.
    timed_by_probe = not (args.instructions or args.syscalls or args.waits)
    for needed in (BIN, PROBE) if timed_by_probe else (BIN,):
        if not os.path.exists(needed):
            sys.exit(f"{needed} is missing: run cargo build --release --bin aigw --example probe first")

    tmp = tempfile.mkdtemp(prefix="aigw-bench-")
    mock_port = free_port()
    mock = subprocess.Popen([BIN, "mock-upstream", "--no-record", "--listen", f"127.0.0.1:{mock_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if args.instructions or args.syscalls or args.waits:
        try:
            wait_ready(f"http://127.0.0.1:{mock_port}/__mock/calls", mock)
            if args.waits:
                waits(tmp, mock, mock_port, args.duration, args.wait_ms)
            elif args.syscalls:
                syscalls(tmp, mock_port, args.duration)
            else:
                failures = counted_instructions(tmp, mock_port, args)
        finally:
            mock.terminate()
            mock.wait(timeout=20)
            shutil.rmtree(tmp, ignore_errors=True)
        if args.instructions and failures:
            sys.exit("the instruction budget is not held:\n  " + "\n  ".join(failures))
        return
    if args.light:
        try:
            wait_ready(f"http://127.0.0.1:{mock_port}/__mock/calls", mock)
            light_load(tmp, mock_port, args.rate, args.duration, args.rounds)
        finally:
            mock.terminate()
            mock.wait(timeout=20)
            shutil.rmtree(tmp, ignore_errors=True)
        return
    if args.compare_tracing:
        try:
            wait_ready(f"http://127.0.0.1:{mock_port}/__mock/calls", mock)
            compare_tracing(tmp, mock_port, args.duration, args.compare_tracing, args.streamed, args.sample_ratio)
        finally:
            mock.terminate()
            mock.wait(timeout=20)
            shutil.rmtree(tmp, ignore_errors=True)
        return
    if args.translation:
        gw, port = start_gateway(tmp, mock_port, 0, extra=ANTHROPIC)
        try:
            wait_ready(f"http://127.0.0.1:{mock_port}/__mock/calls", mock)
            wait_ready(f"http://127.0.0.1:{port}/readyz", gw)
            compare_translation(gw, port, args.duration, args.rounds)
        finally:
            for p in (gw, mock):
                p.terminate()
                p.wait(timeout=20)
            shutil.rmtree(tmp, ignore_errors=True)
        return
    if args.compare_policies or args.compare_bin:
        if args.compare_bin:
            labels = (args.compare_bin, "this build")
            gws = [start_gateway(tmp, mock_port, 0, binary, name) for binary, name in
                   ((os.path.abspath(args.compare_bin), "other"), (BIN, "this"))]
        else:
            gws = [start_gateway(tmp, mock_port, n) for n in (0, 4)]
        try:
            wait_ready(f"http://127.0.0.1:{mock_port}/__mock/calls", mock)
            for gw, port in gws:
                wait_ready(f"http://127.0.0.1:{port}/readyz", gw)
            if args.compare_bin:
                compare_binaries(gws, labels, args.duration, args.rounds, args.streamed)
            else:
                compare_policies(gws, args.duration, args.compare_policies)
        finally:
            for p in [g for g, _ in gws] + [mock]:
                p.terminate()
                p.wait(timeout=20)
            shutil.rmtree(tmp, ignore_errors=True)
        return
    gw, gw_port = start_gateway(tmp, mock_port, args.policies)
    try:
        wait_ready(f"http://127.0.0.1:{mock_port}/__mock/calls", mock)
        wait_ready(f"http://127.0.0.1:{gw_port}/readyz", gw)
        direct = f"http://127.0.0.1:{mock_port}/v1/chat/completions"
        through = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        bodies = {"non-streamed": chat_body(False), "streamed": chat_body(True)}
        # Warm up both paths (connections, caches, page faults).
        for mode, body in bodies.items():
            wrk(through, KEY, body, 50, 2)
            wrk(direct, CRED, body, 50, 2)
        results = {}
        for mode, body in bodies.items():
            for path, url, key in (("direct", direct, CRED), ("aigw", through, KEY)):
                one = probe(url, key, body, args.duration)
                before = cpu_seconds(gw.pid)
                fifty = wrk(url, key, body, 50, args.duration)
                cpu = cpu_seconds(gw.pid) - before
                results[(mode, path)] = (one, fifty, cpu)
        rss = peak_rss_mib(gw.pid)
        events, writes = stream_writes(gw_port)
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        if args.bin:
            rev = BIN  # another build than this checkout's
        print(f"# aigw proxy benchmark ({rev}, {args.duration} s per run, {args.policies} quota policies, "
              f"request logs on, SQLite, {os.cpu_count()} cores)\n")
        print("| mode | path | req/s @50 | p50 @1 | p99 @1 | p99.9 @1 | p99 @1 corrected | >500 µs @1 "
              "| p50 @50 | p99 @50 | p99.9 @50 | errors |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for (mode, path), (one, fifty, _) in results.items():
            errs = one["errors"] + one["non2xx"] + fifty["errors"] + fifty["non2xx"]
            print(f"| {mode} | {path} | {fifty['rps']:,.0f} | {one['p50']} µs | {one['p99']} µs | {one['p999']} µs | "
                  f"{one['cp99']} µs | {one['over500']} of {one['requests']:,} | "
                  f"{fifty['p50']} µs | {fifty['p99']} µs | {fifty['p999']} µs | {errs} |")
        print()
        for mode in bodies:
            d1, d50, _ = results[(mode, "direct")]
            a1, a50, cpu = results[(mode, "aigw")]
            print(f"- {mode}: added latency @1 p50 {a1['p50'] - d1['p50']} µs, p99 {a1['p99'] - d1['p99']} µs "
                  f"(corrected: {a1['cp99'] - d1['cp99']} µs); "
                  f"aigw CPU {cpu / max(a50['requests'], 1) * 1e6:.1f} µs/request at 50 connections; "
                  f"throughput {a50['rps'] / d50['rps'] * 100:.0f} % of direct")
        print(f"- aigw peak RSS: {rss:.1f} MiB")
        print(f"- a stream the mock writes at once ({events} events) leaves aigw in {writes} write(s)")
        if writes > 2:
            sys.exit(f"aigw wrote a stream of {events} events in {writes} writes, not in one: the per-event "
                     "writes cost a system call each")
    finally:
        for p in (gw, mock):
            p.terminate()
            p.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
