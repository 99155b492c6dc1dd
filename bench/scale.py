#!/usr/bin/env python3
"""Many keys, policies and credentials: one gateway on a store seeded through the resources file
with a large tenancy, against the same run with a small one (issue 24 §2).

For each size it reports: the first start (the resources file applied to an empty SQLite store)
and a restart (the same file, nothing to change), RSS at rest, requests/s and aigw CPU per request
at 50 connections, first with every key in turn (each looked up for the first time) and then
with every request on a random key and a random model (that CPU also split by kind of thread:
the request path, the store's SQLite threads, the background flushes), RSS after that load,
the time a key deleted through the admin API on one gateway takes to be refused by a second
gateway on the same store that holds it in its cache, and the p95 of the admin list endpoints (`/admin/v1/keys`, `members`, `policies`,
`upstreams`, as the console calls them), and the time the flushes to the store took during the
random-key load, by kind, per request, and the bytes written to files per request. Each window
lasts until the request logs it queued are written (a writer that falls behind writes them after
the load): CPU and flush time per request include that, and the logs queued at the window's end,
how long they took and the logs written per second over the window are printed. The random-key
load runs in windows (`--windows`, 3 by default), the two sizes' windows in alternation, and the
medians are reported: CPU per request on this shared host moves by tens of percent from one
minute to the next, and alternation lets both sizes meet it alike. Usage:

    cargo build --release --bin aigw && python3 bench/scale.py [--keys 100000] [--duration 10]
    python3 bench/scale.py --short --bin target/debug/aigw     # a smoke run of seconds (CI)
    python3 bench/scale.py --perf /tmp/prof                    # also a CPU profile of each load

Needs wrk (Debian: apt-get install wrk). Traffic goes to 127.0.0.1 only.
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the proxy benchmark's helpers: ports, readiness, CPU and RSS)

ROOT = run.ROOT
OWNER, OWNER_PASS = "owner@scale.test", "scale-owner-pass"
LUA = """
local keys, models = {}, {}
for line in io.lines(os.getenv("SCALE_KEYS")) do keys[#keys + 1] = line end
for line in io.lines(os.getenv("SCALE_MODELS")) do models[#models + 1] = line end
math.randomseed(os.time())
local sequential, n = os.getenv("SCALE_SEQUENTIAL") == "1", 0
request = function()
  local body = '{"model":"' .. models[math.random(#models)] ..
    '","messages":[{"role":"user","content":"Summarise the benchmark in one short sentence please"}]}'
  local key = keys[math.random(#keys)]
  if sequential then n = n + 1; key = keys[(n - 1) % #keys + 1] end
  return wrk.format("POST", "/v1/chat/completions",
    {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. key}, body)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH requests=%d duration_us=%d errors=%d non2xx=%d p50=%d p99=%d p999=%d\\n",
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
"""


def api_key(i):
    return f"sk-aigw-{i:032d}"


def resources(size, mock_port):
    """The resources file of one tenancy size: keys spread over members, members over departments,
    one requests-per-day policy per member up to `policies`, credentials spread over models (ten
    credentials a model)."""
    keys, members, depts, policies, creds = size
    models = max(1, creds // 10)
    out = ['[[workspace]]\nname = "scale"\n']
    out += [f'[[department]]\nworkspace = "scale"\nname = "d{d}"\n' for d in range(depts)]
    out += [f'[[member]]\nworkspace = "scale"\ndepartment = "d{m % depts}"\nemail = "m{m}@scale.test"\n'
            f'role = "member"\n' for m in range(members)]
    out += [f'[[api_key]]\nmember = "m{k % members}@scale.test"\nname = "k{k}"\nkey = "{api_key(k)}"\n'
            for k in range(keys)]
    out += [f'[[model]]\nworkspace = "scale"\nname = "model-{m}"\nprice = {{ prompt = 0.15, completion = 0.60 }}\n'
            for m in range(models)]
    out += [f'[[upstream]]\nworkspace = "scale"\nname = "cred-{c}"\nprovider = "openai-compatible"\n'
            f'base_url = "http://127.0.0.1:{mock_port}/v1"\napi_key = "scale-upstream-key-{c}"\n'
            f'models = ["model-{c % models}"]\nmax_in_flight = 1024\n' for c in range(creds)]
    out += [f'[[policy]]\nworkspace = "scale"\nsubject = "member"\ntarget = "m{p % members}@scale.test"\n'
            f'metric = "requests"\nwindow = "day"\nlimit = 1000000000000\n' for p in range(policies)]
    return "\n".join(out), [f"model-{m}" for m in range(models)]


def start(binary, home, db, resources_file=None):
    port = run.free_port()
    env = {"PATH": os.environ.get("PATH", ""), "AIGW_LISTEN": f"127.0.0.1:{port}",
           "AIGW_DATABASE_URL": f"sqlite://{db}", "AIGW_LOG": "warn",
           "AIGW_BOOTSTRAP_EMAIL": OWNER, "AIGW_BOOTSTRAP_PASSWORD": OWNER_PASS}
    # The allocator's options pass through, for experiments (e.g. MIMALLOC_ALLOW_THP=0).
    env.update({k: v for k, v in os.environ.items() if k.startswith("MIMALLOC_")})
    args = [binary, "serve"] + (["--resources", resources_file] if resources_file else [])
    began = time.monotonic()
    # The log goes to a file: a pipe nobody reads would stall the gateway once full.
    log = open(os.path.join(home, f"gateway-{port}.log"), "w")
    gw = subprocess.Popen(args, env=env, cwd=home, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 600
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                break
        except OSError:
            if gw.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the gateway did not get ready; its log: {log.name}")
            time.sleep(0.05)
    return gw, port, time.monotonic() - began


def stop(gw):
    gw.terminate()
    try:
        gw.wait(timeout=60)
    except subprocess.TimeoutExpired:
        print(f"warning: gateway {gw.pid} still running 60 s after SIGTERM; killed", file=sys.stderr)
        gw.kill()
        gw.wait()


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def rss_split_mib(pid):
    """RSS by kind of page: anonymous (the heaps: Rust's allocator and SQLite's page caches) and
    file-backed (the binary, libraries and SQLite's memory-mapped database)."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Rss", "Anonymous"):
                out[name] = int(rest.split()[0]) / 1024
    return out.get("Anonymous", 0.0), out.get("Rss", 0.0) - out.get("Anonymous", 0.0)


FLUSHES = ("quota", "breakers", "own_limits", "request_logs")


def metric(port, prefix, label=""):
    """The first sample of the gateway's `/metrics` whose line starts with `prefix` and holds
    `label` (0 when there is none)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith(prefix) and label in line), 0.0)


def flush_seconds(port):
    """Seconds spent so far in each kind of flush to the store, and how many flushes
    (`aigw_store_flush_duration_seconds`): where the store's time goes, by what it writes."""
    return {(kind, suffix): metric(port, f"aigw_store_flush_duration_seconds_{suffix}", f'kind="{kind}"')
            for kind in FLUSHES for suffix in ("sum", "count")}


def log_queue(port):
    """Request logs queued in the gateway and not yet written (`aigw_log_queue_depth`)."""
    return metric(port, "aigw_log_queue_depth")


def written_bytes(pid):
    """Bytes the gateway has handed to write(2) so far (`wchar` of /proc/PID/io): with SQLite
    nearly all of it is the store's: write-ahead-log frames (a whole 4 KiB page each time a
    transaction changes it) and checkpoints copying them into the database file. Unlike CPU
    time it hardly moves with the host's other load."""
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def thread_cpu(pid):
    """CPU seconds of the gateway by kind of thread: the serving threads (`aigw-serve-N`, the
    request path), the store (`sqlx-sqlite-worker-N`: every SQL statement runs there with SQLite)
    and the main runtime (`tokio-rt-worker`: the flushes and the log writer, off the request
    path)."""
    kinds = {"aigw-serve": "serving", "sqlx-sqlite-wor": "store", "tokio-rt-worker": "background"}
    out = dict.fromkeys(kinds.values(), 0.0)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        kind = next((k for prefix, k in kinds.items() if name.startswith(prefix)), "other")
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / run.TICK
    return out


def call(method, url, token=None, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("content-type", "application/json")
    if token:
        req.add_header("authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.read()


def load(port, key_list, models, conns, duration, home, sequential=False):
    keys_file, models_file, lua = (os.path.join(home, n) for n in ("keys.txt", "models.txt", "scale.lua"))
    with open(keys_file, "w") as f:
        f.write("\n".join(key_list) + "\n")
    with open(models_file, "w") as f:
        f.write("\n".join(models) + "\n")
    with open(lua, "w") as f:
        f.write(LUA)
    env = dict(os.environ, SCALE_KEYS=keys_file, SCALE_MODELS=models_file, SCALE_SEQUENTIAL=str(int(sequential)))
    out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{duration}s", "-s", lua, f"http://127.0.0.1:{port}/"],
                         env=env, capture_output=True, text=True, check=True).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("BENCH ")), None)
    if not line:
        sys.exit(f"wrk printed no result:\n{out}")
    r = {k: int(v) for k, v in (kv.split("=") for kv in line[6:].split())}
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    return r


def propagation(port_a, port_b, token):
    """A key created through gateway A and used on gateway B (which then holds it in its cache),
    then deleted through A: seconds until B refuses it. A new key needs no propagation (a key a
    gateway has not seen is read from the store); a change to what a gateway holds does."""
    _, body = call("POST", f"http://127.0.0.1:{port_a}/admin/v1/keys", token, {"name": f"new-{time.time_ns()}"})
    created = json.loads(body)
    chat = {"model": "model-0", "messages": [{"role": "user", "content": "hi"}]}
    call("POST", f"http://127.0.0.1:{port_b}/v1/chat/completions", created["key"], chat)
    call("DELETE", f"http://127.0.0.1:{port_a}/admin/v1/keys/{created['id']}", token)
    deleted = time.monotonic()
    while time.monotonic() - deleted < 30:
        try:
            call("POST", f"http://127.0.0.1:{port_b}/v1/chat/completions", created["key"], chat)
        except urllib.error.HTTPError as e:
            if e.code == 401:
                return time.monotonic() - deleted
        time.sleep(0.01)
    return float("inf")


def admin_p95(port, token, rounds):
    out = {}
    for path in ("keys", "members", "policies", "upstreams"):
        times, size = [], 0
        for _ in range(rounds):
            began = time.monotonic()
            _, body = call("GET", f"http://127.0.0.1:{port}/admin/v1/{path}", token)
            times.append((time.monotonic() - began) * 1000)
            size = len(body)
        times.sort()
        out[path] = (times[max(0, int(len(times) * 0.95 + 0.5) - 1)], size)
    return out


def prepare(binary, size, mock_port, tmp):
    """Seeds a store with `size` through the resources file, then starts a gateway on it: its
    first start, restart, RSS at rest, and the pass over every key in turn (each looked up for
    the first time)."""
    name = "x".join(str(n) for n in size)
    home = os.path.join(tmp, name)
    os.makedirs(home)
    text, models = resources(size, mock_port)
    res = os.path.join(home, "resources.toml")
    with open(res, "w") as f:
        f.write(text)
    db = os.path.join(home, "aigw.db")
    gw, port, first = start(binary, home, db, res)
    stop(gw)
    gw, port, again = start(binary, home, db, res)
    g = {"name": name, "home": home, "db": db, "gw": gw, "port": port, "models": models,
         "keys": [api_key(k) for k in range(size[0])], "windows": [],
         "r": {"first_start_s": first, "restart_s": again, "rss_rest_mib": rss_mib(gw.pid)}}
    before = run.cpu_seconds(gw.pid)
    w = load(port, g["keys"], models, 50, max(1, round(size[0] / 2500)), home, sequential=True)
    g["r"]["first_rps"] = w["rps"]
    g["r"]["first_cpu_us"] = (run.cpu_seconds(gw.pid) - before) / max(w["requests"], 1) * 1e6
    g["r"]["first_covered"] = min(1.0, w["requests"] / size[0])
    return g


def random_window(g, duration, perf_dir=None):
    """One window of requests on random keys and models: requests/s, CPU per request (all, and
    by kind of thread), flush time per request by kind, bytes written per request."""
    gw, port = g["gw"], g["port"]
    before, by_thread, flushes = run.cpu_seconds(gw.pid), thread_cpu(gw.pid), flush_seconds(port)
    wrote = written_bytes(gw.pid)
    perf = perf_dir and subprocess.Popen(
        ["perf", "record", "-F", "499", "-g", "-p", str(gw.pid), "-o",
         os.path.join(perf_dir, f"perf-{g['name']}.data")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    w = load(port, g["keys"], g["models"], 50, duration, g["home"])
    # The window's requests cost what writing their logs costs too: a writer that fell behind
    # writes the rest after the load, and that CPU is counted here, not in the next window.
    queued, waited = log_queue(port), time.monotonic()
    while log_queue(port) > 0 and time.monotonic() - waited < 120:
        time.sleep(0.1)
    drain_s = time.monotonic() - waited if queued else 0.0
    if perf:
        perf.send_signal(2)
        perf.wait(timeout=60)
    n = max(w["requests"], 1)
    after = flush_seconds(port)
    return {"rps": w["rps"], "errors": w["errors"] + w["non2xx"], "queued": queued, "drain_s": drain_s,
            "logs_per_s": n / (duration + drain_s),
            "cpu_us": (run.cpu_seconds(gw.pid) - before) / n * 1e6,
            "written_kib": (written_bytes(gw.pid) - wrote) / n / 1024,
            "cpu_us_by_thread": {k: (v - by_thread.get(k, 0.0)) / n * 1e6 for k, v in thread_cpu(gw.pid).items()},
            "flushes": {k: ((after[(k, "sum")] - flushes[(k, "sum")]) / n * 1e6,
                            after[(k, "count")] - flushes[(k, "count")]) for k in FLUSHES}}


def finish(binary, g, rounds):
    """The medians of the random-key windows, RSS after them, a deletion's propagation to a
    second gateway, the admin lists' p95; stops the gateway."""
    r, ws, gw, port = g["r"], g["windows"], g["gw"], g["port"]
    med = statistics.median
    r["rps"] = med(w["rps"] for w in ws)
    r["errors"] = sum(w["errors"] for w in ws)
    r["cpu_us"] = med(w["cpu_us"] for w in ws)
    r["cpu_us_rounds"] = [w["cpu_us"] for w in ws]
    r["queued"] = med(w["queued"] for w in ws)
    r["window_drain_s"] = med(w["drain_s"] for w in ws)
    r["logs_per_s"] = med(w["logs_per_s"] for w in ws)
    r["written_kib"] = med(w["written_kib"] for w in ws)
    r["cpu_us_by_thread"] = {k: med(w["cpu_us_by_thread"].get(k, 0.0) for w in ws) for k in ws[0]["cpu_us_by_thread"]}
    r["flushes"] = {k: (med(w["flushes"][k][0] for w in ws), med(w["flushes"][k][1] for w in ws)) for k in FLUSHES}
    b = None
    try:
        r["rss_load_mib"] = rss_mib(gw.pid)
        r["rss_load_split"] = rss_split_mib(gw.pid)
        _, body = call("POST", f"http://127.0.0.1:{port}/admin/v1/auth/login", None,
                       {"email": OWNER, "password": OWNER_PASS})
        token = json.loads(body)["token"]
        b, port_b, _ = start(binary, g["home"], g["db"])
        r["propagation_s"] = max(propagation(port, port_b, token) for _ in range(3))
        r["admin"] = admin_p95(port, token, rounds)
    finally:
        stop(gw)
        if b:
            stop(b)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "aigw"))
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--members", type=int, default=10_000)
    ap.add_argument("--departments", type=int, default=100)
    ap.add_argument("--policies", type=int, default=10_000)
    ap.add_argument("--credentials", type=int, default=1_000)
    ap.add_argument("--duration", type=int, default=10, help="seconds of each random-key window (default 10)")
    ap.add_argument("--rounds", type=int, default=20, help="calls per admin list endpoint (default 20)")
    ap.add_argument("--windows", type=int, default=3, help="random-key windows per size, the sizes in "
                    "alternation; medians are reported (default 3)")
    ap.add_argument("--perf", metavar="DIR", help="record `perf record -g` of each size's random-key load "
                    "into DIR/perf-<size>.data")
    ap.add_argument("--short", action="store_true", help="tiny sizes and seconds: a smoke run")
    args = ap.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed (Debian: apt-get install wrk)")
    binary = os.path.abspath(args.bin)
    if not os.path.exists(binary):
        sys.exit(f"{binary} is missing: cargo build --release --bin aigw")
    small = (10, 10, 10, 10, 10)
    large = (args.keys, args.members, args.departments, args.policies, args.credentials)
    if args.short:
        large, args.duration, args.rounds, args.windows = (200, 50, 5, 50, 20), 1, 3, 2
    random.seed(1)
    load_at_start = open("/proc/loadavg").read().split()[0]
    tmp = tempfile.mkdtemp(prefix="aigw-scale-")
    mock_port = run.free_port()
    mock = subprocess.Popen([binary, "mock-upstream", "--no-record", "--listen", f"127.0.0.1:{mock_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        run.wait_ready(f"http://127.0.0.1:{mock_port}/__mock/calls", mock)
        gateways = {}
        try:
            for s in (small, large):
                gateways[s] = prepare(binary, s, mock_port, tmp)
            # The sizes' windows alternate, so that both meet the host's other load alike.
            for i in range(args.windows):
                for s, g in gateways.items():
                    g["windows"].append(random_window(g, args.duration, i == 0 and args.perf
                                                      and os.path.abspath(args.perf)))
            results = {s: finish(binary, g, args.rounds) for s, g in gateways.items()}
        finally:
            for g in gateways.values():
                if g["gw"].poll() is None:
                    stop(g["gw"])
    finally:
        mock.terminate()
        mock.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    print(f"# many keys, policies and credentials ({rev}, {os.path.basename(binary)}, SQLite, "
          f"{args.windows} alternating windows of {args.duration} s of load at 50 connections, "
          f"{os.cpu_count()} cores)\n")
    print("| keys / members / departments / policies / credentials | first start | restart | RSS at rest "
          "| keys first seen: req/s @50, CPU/request (keys covered) | then: req/s @50 | aigw CPU/request "
          "| RSS after load | key deletion to a 2nd gateway | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s, r in results.items():
        print(f"| {' / '.join(f'{n:,}' for n in s)} | {r['first_start_s']:.1f} s | {r['restart_s']:.1f} s | "
              f"{r['rss_rest_mib']:.0f} MiB | {r['first_rps']:,.0f}, {r['first_cpu_us']:.0f} µs "
              f"({r['first_covered']:.0%}) | {r['rps']:,.0f} | {r['cpu_us']:.1f} µs | {r['rss_load_mib']:.0f} MiB | "
              f"{r['propagation_s'] * 1000:.0f} ms | {r['errors']} |")
    print("\n| keys / members / … | " + " | ".join(f"GET /admin/v1/{p} p95 (bytes)" for p in
                                                   ("keys", "members", "policies", "upstreams")) + " |")
    print("|---|---|---|---|---|")
    for s, r in results.items():
        print(f"| {s[0]:,} / {s[1]:,} / … | " + " | ".join(f"{t:.0f} ms ({n:,})" for t, n in r["admin"].values())
              + " |")
    print("\n| keys / members / … | aigw CPU/request: serving threads | store (SQLite) threads "
          "| background runtime (flushes, log writer) | other | written to files/request |")
    print("|---|---|---|---|---|---|")
    for s, r in results.items():
        t = r["cpu_us_by_thread"]
        print(f"| {s[0]:,} / {s[1]:,} / … | " + " | ".join(f"{t.get(k, 0.0):.1f} µs" for k in
                                                        ("serving", "store", "background", "other"))
              + f" | {r['written_kib']:.1f} KiB |")
    print("\n| keys / members / … | " + " | ".join(f"{k} flushes: time/request (flushes)" for k in FLUSHES) + " |")
    print("|---|---|---|---|---|")
    for s, r in results.items():
        print(f"| {s[0]:,} / {s[1]:,} / … | " + " | ".join(f"{t:.1f} µs ({n:.0f})" for t, n in r["flushes"].values())
              + " |")
    print("\n| keys / members / … | RSS after load: anonymous (heaps) | file-backed "
          "| request logs still queued at a window's end | written after it, in | logs written/s |")
    print("|---|---|---|---|---|---|")
    for s, r in results.items():
        anon, file = r["rss_load_split"]
        print(f"| {s[0]:,} / {s[1]:,} / … | {anon:.0f} MiB | {file:.0f} MiB | {r['queued']:,.0f} "
              f"| {r['window_drain_s']:.1f} s | {r['logs_per_s']:,.0f} |")
    print(f"\nload average (1 min, {os.cpu_count()} cores): {load_at_start} at the start, "
          f"{open('/proc/loadavg').read().split()[0]} at the end")
    small_cpu, large_cpu = results[small]["cpu_us"], results[large]["cpu_us"]
    pairs = zip(results[small]["cpu_us_rounds"], results[large]["cpu_us_rounds"])
    print(f"\n- CPU per request with the large tenancy: {(large_cpu / small_cpu - 1) * 100:+.0f} % "
          f"(medians of {args.windows} alternating windows; each window pair: "
          + ", ".join(f"{(lg / sm - 1) * 100:+.0f} %" for sm, lg in pairs) + "; target: within 10 %)")


if __name__ == "__main__":
    main()
