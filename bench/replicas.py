#!/usr/bin/env python3
"""Replicas on one Postgres (issue 24 §4): four gateways on one database under load with 10,
1,000 and 100,000 active subjects, and what the store pays for it.

One database of this run only (`aigw_replicas_bench` on 127.0.0.1:5432, user postgres, dropped at
the end) holds 100,000 keys under one `target = "*"` requests-per-day apikey policy, so every key
that makes a request is a live counter in every gateway that served it. The first gateway applies
the resources file; three more start once it is ready. For each flush interval and each size N:

- warm-up: every gateway sends one request on each of the first N keys (each gateway then holds
  N live counters, as it would behind a load balancer that spreads every subject);
- loaded window: wrk on all four gateways, each request on a random one of the N keys;
- idle window: no requests; the gateways still flush, reading back what changed;
- burst: a fresh key with a tight requests-per-minute limit, hit by all four gateways at once;
  admitted (its stored usage) minus the limit, against docs/quotas.md's bound: the requests in
  flight plus two flush cycles (the interval plus the quota flush's own time, its measured
  ceiling) of the four gateways' summed rate.

Each window reports, from `pg_stat_database` and `pg_stat_user_tables` of this database only
(deltas; `pg_stat_statements` when the server preloads it): transactions and rows written per
second, by table; Postgres CPU (utime+stime from /proc of this database's backends plus the
server's background processes); the gateways' flushes per second and their mean time (from
`aigw_store_flush_duration_seconds`); requests/s and the gateways' CPU. The idle window before any
request is the baseline. Usage:

    python3 bench/replicas.py [--bin target/release/aigw] [--window 10] [--flush-ms 250,1000]
    python3 bench/replicas.py --short --bin target/debug/aigw      # a smoke run of seconds (CI)
    python3 bench/replicas.py --redis                              # each run without, then with Redis

`--redis` (issue 44) starts a `redis-server` of its own on a free port (no persistence, killed at
the end) and runs every flush interval twice: without Redis, then with `AIGW_REDIS_URL` on every
gateway. With Redis the burst's bound is the requests in flight alone (docs/quotas.md).

Needs wrk and psql, and Postgres at 127.0.0.1:5432 (`--postgres`) with trust for user postgres and
room for the four gateways' pools (up to 4 × 18 connections). Traffic goes to 127.0.0.1 only.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (ports, readiness, CPU)
import scale  # noqa: E402  (the keys' secrets and the wrk script that spreads requests over keys)

ROOT = run.ROOT
PG = "postgres://postgres@127.0.0.1:5432"
DB = "aigw_replicas_bench"
MASTER_KEY = "11" * 32
JWT_SECRET = "replicas-jwt-secret-0123456789abcdef0123456789"
MODEL = "model-0"
ROLLUPS = ("usage_rollup", "usage_rollup_daily", "usage_rollup_member", "usage_rollup_member_hourly")
TABLES = ("usage_counters", "breaker_buckets", "request_logs", *ROLLUPS, "api_keys")
# wrk's script for one pass: each connection takes the next key; after the last answer the thread
# stops sending and leaves a file behind, and the caller then interrupts wrk (which prints its summary).
ONE_PASS = scale.LUA.replace("done = function", """
local answered = 0
response = function(status, headers, body)
  answered = answered + 1
  if answered == #keys then
    wrk.thread:stop()
    io.open(os.getenv("PASS_DONE"), "w"):close()
  end
end
done = function""")


def say(msg):
    print(msg, file=sys.stderr, flush=True)


def psql(sql, db=DB):
    done = subprocess.run(["psql", f"{PG}/{db}", "-v", "ON_ERROR_STOP=1", "-AtqX", "-c", sql],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"psql failed on {sql[:80]!r}: {done.stderr.strip()}")
    return done.stdout.strip()


def burst_key(i):
    return f"sk-aigw-burst{i:027d}"


def resources(keys, bursts, burst_limit, mock_port):
    """100 keys a member; one `*` requests/day apikey policy (a counter per key); the burst keys
    each under their own requests/minute limit."""
    members = max(1, keys // 100)
    out = ['[[workspace]]\nname = "replicas"\ntimezone = "UTC"\n',
           '[[department]]\nworkspace = "replicas"\nname = "d"\n']
    out += [f'[[member]]\nworkspace = "replicas"\ndepartment = "d"\nemail = "m{m}@replicas.test"\nrole = "member"\n'
            for m in range(members)]
    out += [f'[[api_key]]\nmember = "m{k % members}@replicas.test"\nname = "k{k}"\nkey = "{scale.api_key(k)}"\n'
            for k in range(keys)]
    out += [f'[[api_key]]\nmember = "m0@replicas.test"\nname = "burst{b}"\nkey = "{burst_key(b)}"\n'
            for b in range(bursts)]
    out.append(f'[[model]]\nworkspace = "replicas"\nname = "{MODEL}"\nprice = {{ prompt = 0.15, completion = 0.60 }}\n')
    out.append(f'[[upstream]]\nworkspace = "replicas"\nname = "mock"\nprovider = "openai-compatible"\n'
               f'base_url = "http://127.0.0.1:{mock_port}/v1"\napi_key = "replicas-upstream-key"\n'
               f'models = ["{MODEL}"]\nmax_in_flight = 4096\n')
    out.append('[[policy]]\nworkspace = "replicas"\nsubject = "apikey"\ntarget = "*"\nmetric = "requests"\n'
               'window = "day"\nlimit = 1000000000000\n')
    out += [f'[[policy]]\nworkspace = "replicas"\nsubject = "apikey"\ntarget = "m0@replicas.test/burst{b}"\n'
            f'metric = "requests"\nwindow = "minute"\nlimit = {burst_limit}\n' for b in range(bursts)]
    return "\n".join(out)


def start_redis():
    """A redis-server of this run only: a free port, no persistence."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.path.exists(binary):
        sys.exit("redis-server is not installed (apt-get install redis-server)")
    port = run.free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            import socket
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"redis://127.0.0.1:{port}/"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit("redis-server did not start")


def start_gateways(binary, home, n, flush_ms, res, redis_url=None):
    """The first gateway applies the resources file; the others start once it is ready."""
    gws = []
    for i in range(n):
        port = run.free_port()
        env = {"PATH": os.environ.get("PATH", ""), "AIGW_LISTEN": f"127.0.0.1:{port}",
               "AIGW_DATABASE_URL": f"{PG}/{DB}", "AIGW_LOG": "warn", "AIGW_MASTER_KEY": MASTER_KEY,
               "AIGW_JWT_SECRET": JWT_SECRET, "AIGW_DATA_DIR": home, "AIGW_FLUSH_INTERVAL_MS": str(flush_ms),
               "AIGW_BOOTSTRAP_EMAIL": "owner@replicas.test", "AIGW_BOOTSTRAP_PASSWORD": "replicas-owner-pass"}
        if redis_url:
            env["AIGW_REDIS_URL"] = redis_url
        args = [binary, "serve"] + (["--resources", res] if i == 0 else [])
        # Its log goes to a file: a pipe nobody reads fills up and stops the gateway mid-write.
        with open(os.path.join(home, f"gateway-{i}.log"), "ab") as log:
            gw = subprocess.Popen(args, env=env, cwd=home, stdout=subprocess.DEVNULL, stderr=log)
        wait_ready(f"http://127.0.0.1:{port}/readyz", gw, os.path.join(home, f"gateway-{i}.log"))
        gws.append((gw, port))
    return gws


def wait_ready(url, proc, log, timeout=900):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            with open(log, errors="replace") as f:
                sys.exit(f"a gateway exited early:\n{f.read()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.05)
    sys.exit(f"{url} not ready")


def warnings(home):
    """What the gateways logged at warn and error, by message (numbers and statements elided)."""
    out = {}
    for name in sorted(os.listdir(home)):
        if name.startswith("gateway-") and name.endswith(".log"):
            with open(os.path.join(home, name), errors="replace") as f:
                for line in f:
                    m = re.match(r"\S+\s+(WARN|ERROR)\s+(.*)", line)
                    if not m or "no master key" in m[2]:
                        continue
                    msg = re.split(r" (?:db\.statement|summary|key|trip|outage_secs|rows|attempt|aquired_after_secs|"
                                   r"database|error=database error: pool)=", m[2])[0]
                    table = re.search(r'summary="(?:INSERT INTO|UPDATE|DELETE FROM|SELECT .*? FROM) (\w+)', m[2])
                    msg = re.sub(r"\d+(\.\d+)?", "N", msg)[:120] + (f" ({table[1]})" if table else "")
                    if "deadlock detected" in m[2]:
                        msg += " (deadlock detected)"
                    out[f"{m[1]} {msg}"] = out.get(f"{m[1]} {msg}", 0) + 1
    return out


def stop_gateways(gws):
    """Stops the gateways gracefully (each writes what it counted); one still writing after
    120 s is killed and said, rather than losing the run's figures."""
    for gw, _ in gws:
        gw.terminate()
    for gw, port in gws:
        try:
            gw.wait(timeout=120)
        except subprocess.TimeoutExpired:
            say(f"  the gateway on port {port} did not stop within 120 s of SIGTERM: killed")
            gw.kill()
            gw.wait()


def write_lists(home, name, keys, script):
    keys_file, models_file, lua = (os.path.join(home, f"{name}.{s}") for s in ("keys", "models", "lua"))
    with open(keys_file, "w") as f:
        f.write("\n".join(keys) + "\n")
    with open(models_file, "w") as f:
        f.write(MODEL + "\n")
    with open(lua, "w") as f:
        f.write(script)
    return dict(os.environ, SCALE_KEYS=keys_file, SCALE_MODELS=models_file), lua


def wrk_all(gws, env, lua, conns, duration, sequential=False):
    """wrk on every gateway at once; returns the processes (read with `wrk_results`)."""
    env = dict(env, SCALE_SEQUENTIAL=str(int(sequential)))
    return [subprocess.Popen(["wrk", "-t1", f"-c{conns}", f"-d{duration}s", "-s", lua, f"http://127.0.0.1:{port}/"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _, port in gws]


def wrk_results(procs):
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=1200)
        line = next((ln for ln in stdout.splitlines() if ln.startswith("BENCH ")), None)
        if p.returncode != 0 or not line:
            sys.exit(f"wrk failed:\n{stdout}{stderr}")
        r = {k: int(v) for k, v in (kv.split("=") for kv in line[6:].split())}
        r["rps"] = r["requests"] / max(r["duration_us"] / 1e6, 1e-9)
        out.append(r)
    return out


# ---------------------------------------------------------------------------------------------
# What the store and the processes did: snapshots and their differences.


def proc_cpu(pid):
    try:
        return run.cpu_seconds(pid)
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def metrics(port):
    """{(kind, field): value} of aigw_store_flush_duration_seconds (count, sum, and each bucket)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for m in re.finditer(r'^aigw_store_flush_duration_seconds_(bucket|count|sum)\{([^}]*)\} (\S+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m[2]))
        field = ("le", float(labels["le"])) if m[1] == "bucket" and labels["le"] != "+Inf" else m[1]
        if m[1] == "bucket" and labels["le"] == "+Inf":
            continue
        out[(labels["kind"], field)] = float(m[3])
    return out


def snapshot(gws, statements):
    row = psql(f"SELECT xact_commit, tup_inserted, tup_updated, tup_deleted FROM pg_stat_database "
               f"WHERE datname = '{DB}'").split("|")
    tables, fetched = {}, {}
    for line in psql("SELECT relname, n_tup_ins, n_tup_upd, COALESCE(idx_tup_fetch, 0) + seq_tup_read "
                     "FROM pg_stat_user_tables").splitlines():
        name, ins, upd, read = line.split("|")
        tables[name] = int(ins) + int(upd)
        fetched[name] = int(read)
    # This database's backends and the server's own processes (WAL writer, checkpointer, background
    # writer, autovacuum): not the other databases' backends, which are someone else's load.
    pids = [int(p) for p in psql(f"SELECT pid FROM pg_stat_activity WHERE datname = '{DB}' OR "
                                 f"(datname IS NULL AND backend_type <> 'client backend')").split()]
    stmts = None
    if statements:
        stmts = int(psql(f"SELECT COALESCE(SUM(calls), 0) FROM pg_stat_statements WHERE dbid = "
                         f"(SELECT oid FROM pg_database WHERE datname = '{DB}') AND query NOT LIKE '%pg_stat%'"))
    return {"t": time.monotonic(), "xact": int(row[0]), "ins": int(row[1]), "upd": int(row[2]),
            "tables": tables, "fetched": fetched, "pg_cpu": {p: proc_cpu(p) for p in pids}, "stmts": stmts,
            "gw_cpu": [proc_cpu(gw.pid) for gw, _ in gws], "flush": [metrics(port) for _, port in gws]}


def delta(a, b):
    """Per second over the window between snapshots a and b."""
    dt = b["t"] - a["t"]
    pg_cpu = sum(b["pg_cpu"][p] - a["pg_cpu"][p] for p in a["pg_cpu"]
                 if p in b["pg_cpu"] and a["pg_cpu"][p] is not None and b["pg_cpu"][p] is not None)
    flush = {}
    for fa, fb in zip(a["flush"], b["flush"]):
        for (kind, field), v in fb.items():
            d = flush.setdefault(kind, {"count": 0.0, "sum": 0.0, "le": {}})
            diff = v - fa.get((kind, field), 0.0)
            if isinstance(field, tuple):
                d["le"][field[1]] = d["le"].get(field[1], 0.0) + diff
            else:
                d[field] += diff
    for d in flush.values():
        # The measured ceiling of this window's flushes: the lowest bucket that holds them all.
        edges = sorted(le for le, n in d["le"].items() if n >= d["count"])
        d["ceiling"] = edges[0] if edges and d["count"] else (0.0 if not d["count"] else 60.0)
        d["mean"] = d["sum"] / d["count"] if d["count"] else 0.0
        d["per_s"] = d["count"] / dt
    return {"dt": dt, "xact_s": (b["xact"] - a["xact"]) / dt, "rows_s": (b["ins"] + b["upd"] - a["ins"] - a["upd"]) / dt,
            "tables_s": {t: (b["tables"].get(t, 0) - a["tables"].get(t, 0)) / dt for t in TABLES},
            "counters_read_s": (b["fetched"].get("usage_counters", 0) - a["fetched"].get("usage_counters", 0)) / dt,
            "pg_cpu": pg_cpu / dt, "gw_cpu": sum(y - x for x, y in zip(a["gw_cpu"], b["gw_cpu"])) / dt,
            "stmts_s": (b["stmts"] - a["stmts"]) / dt if a["stmts"] is not None else None, "flush": flush}


def window(gws, statements, seconds):
    a = snapshot(gws, statements)
    time.sleep(seconds)
    return delta(a, snapshot(gws, statements))


# ---------------------------------------------------------------------------------------------
# One size: warm-up, loaded window, idle window, burst.


def stored_requests(key):
    return int(psql(f"SELECT COALESCE(SUM(used), 0) FROM usage_counters WHERE subject = 'apikey' AND metric = "
                    f"'requests' AND time_window = 'minute' AND subject_id = (SELECT id FROM api_keys WHERE "
                    f"name = 'burst{key}')"))


def burst(gws, home, b, limit, conns, seconds, flush_ms, statements, rate, slowest, shared=False):
    # The limit is per minute: start early in one, so the burst and its flushes fit in it.
    if time.time() % 60 > 60 - seconds - 5 * flush_ms / 1000 - 3:
        time.sleep(60 - time.time() % 60 + 0.5)
    env, lua = write_lists(home, f"burst{b}", [burst_key(b)], scale.LUA)
    a = snapshot(gws, statements)
    results = wrk_results(wrk_all(gws, env, lua, conns, seconds))
    d = delta(a, snapshot(gws, statements))
    # Every gateway has flushed what it admitted: two quota flushes of each since the burst ended
    # (a flush takes far longer than the interval when the database is the limit).
    ended = [m.get(("quota", "count"), 0.0) for m in (metrics(port) for _, port in gws)]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        time.sleep(flush_ms / 1000)
        now = [m.get(("quota", "count"), 0.0) for m in (metrics(port) for _, port in gws)]
        if all(n >= e + 2 for n, e in zip(now, ended)):
            break
    admitted = stored_requests(b)
    # The rate at which the four gateways admit requests: the loaded window's, at the same
    # connections (the burst's own rate is mostly fast refusals once the limit is passed).
    rates = rate
    # When no quota flush ended within the burst (they take longer), the loaded window's ceiling.
    q = d["flush"].get("quota", {})
    cycle = flush_ms / 1000 + (q["ceiling"] if q.get("count") else slowest)
    in_flight = conns * len(gws)
    # With Redis the gateways learn each other's usage at each request: the requests in flight.
    bound = in_flight if shared else in_flight + 2 * cycle * rates
    return {"limit": limit, "admitted": admitted, "over": admitted - limit, "bound": bound, "rate": rates,
            "burst_rps": sum(r["rps"] for r in results),
            "cycle_ms": cycle * 1000, "in_flight": in_flight,
            "refused": sum(r["non2xx"] for r in results), "errors": sum(r["errors"] for r in results),
            "shared": shared}


def measure_size(gws, home, n, args, flush_ms, b, shared=False):
    keys = [scale.api_key(k) for k in range(n)]
    say(f"  {n:,} subjects: warm-up (each gateway on each key once)")
    env, lua = write_lists(home, f"warm{n}", keys, ONE_PASS)
    began = time.monotonic()
    procs = []
    for i, g in enumerate(gws):
        marker = os.path.join(home, f"warm{n}-{i}.done")
        procs.append((wrk_all([g], dict(env, PASS_DONE=marker), lua, min(args.conns, n), 3600, sequential=True)[0],
                      marker))
    for p, marker in procs:
        while not os.path.exists(marker) and p.poll() is None:
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
    warm = wrk_results([p for p, _ in procs])
    warm_s = time.monotonic() - began
    say(f"  {n:,} subjects: loaded window ({args.window} s)")
    env, lua = write_lists(home, f"load{n}", keys, scale.LUA)
    procs = wrk_all(gws, env, lua, args.conns, args.window + 2)
    time.sleep(1)
    loaded = window(gws, args.statements, args.window)
    results = wrk_results(procs)
    loaded["rps"] = sum(r["requests"] for r in results) / max(r["duration_us"] for r in results) * 1e6
    loaded["errors"] = sum(r["errors"] + r["non2xx"] for r in results)
    time.sleep(2 * flush_ms / 1000 + 0.5)
    say(f"  {n:,} subjects: idle window ({args.window} s)")
    idle = window(gws, args.statements, args.window)
    idle["rps"], idle["errors"] = 0.0, 0
    say(f"  {n:,} subjects: latency at one connection ({args.window} s)")
    lat = latency(gws[0], env, lua, args.window)
    say(f"  {n:,} subjects: burst on a {args.burst_limit}/minute key")
    bst = burst(gws, home, b, args.burst_limit, args.conns, args.burst_seconds, flush_ms, args.statements,
                loaded["rps"], loaded["flush"].get("quota", {}).get("ceiling", 0.0), shared)
    return {"warm_s": warm_s, "warm_requests": sum(r["requests"] for r in warm),
            "warm_errors": sum(r["errors"] for r in warm), "warm_non2xx": sum(r["non2xx"] for r in warm), "loaded": loaded, "idle": idle, "burst": bst,
            "latency": lat}


def latency(gw, env, lua, seconds):
    """p50 and p99 in ms of one connection on one gateway (wrk --latency): with Redis, what its
    round trip before dispatch adds to a request (issue 44)."""
    _, port = gw
    p = subprocess.run(["wrk", "-t1", "-c1", f"-d{max(seconds, 2)}s", "--latency", "-s", lua,
                        f"http://127.0.0.1:{port}/"], env=dict(env, SCALE_SEQUENTIAL="0"),
                       capture_output=True, text=True, timeout=600)
    scale_ms = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}
    out = {}
    for ln in p.stdout.splitlines():
        parts = ln.split()
        if len(parts) == 2 and parts[0] in ("50%", "99%"):
            num = parts[1].rstrip("usm")
            out[parts[0]] = float(num) * scale_ms[parts[1][len(num):]]
    return out.get("50%", float("nan")), out.get("99%", float("nan"))


# ---------------------------------------------------------------------------------------------
# The report.


def fmt_row(label, w):
    t = w["tables_s"]
    f = w["flush"]
    q, lg = f.get("quota", {}), f.get("request_logs", {})
    stmts = f"{w['stmts_s']:,.0f}" if w["stmts_s"] is not None else "n/a"
    return (f"| {label} | {w['rps']:,.0f} | {w['xact_s']:,.0f} | {stmts} | {w['counters_read_s']:,.0f} | {w['rows_s']:,.0f} | "
            f"{t['usage_counters']:,.0f} | {t['breaker_buckets']:,.0f} | {t['request_logs']:,.0f} | "
            f"{sum(t[r] for r in ROLLUPS):,.0f} | {t['api_keys']:,.0f} | "
            f"{w['pg_cpu'] * 100:.0f} % | {w['gw_cpu'] * 100:.0f} % | "
            f"{q.get('per_s', 0):.1f}, {q.get('mean', 0) * 1000:.1f} ms (≤ {q.get('ceiling', 0) * 1000:.0f}) | "
            f"{lg.get('per_s', 0):.1f}, {lg.get('mean', 0) * 1000:.1f} ms | {w['errors']} |")


def report(binary, args, baseline, results):
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    print(f"# four replicas on one Postgres ({rev}, {binary}, {args.window} s windows, wrk -c{args.conns} on each "
          f"gateway, {os.cpu_count()} cores shared by the gateways, Postgres, wrk and the mock)\n")
    print("| window | req/s | transactions/s | statements/s (pg_stat_statements) | usage_counters rows read/s "
          "(index and scans) | rows written/s | usage_counters rows/s "
          "| breaker_buckets rows/s | request_logs rows/s | usage rollups rows/s (all four) | api_keys rows/s (last used) | Postgres CPU | gateways' CPU "
          "| quota flushes/s, mean (ceiling) | log flushes/s, mean | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    baseline["rps"], baseline["errors"] = 0.0, 0
    print(fmt_row("baseline: idle, no live counter", baseline))
    for (mode, flush_ms, n), r in results.items():
        print(fmt_row(f"{n:,} subjects, {flush_ms} ms flush{mode}: loaded", r["loaded"]))
        print(fmt_row(f"{n:,} subjects, {flush_ms} ms flush{mode}: idle after", r["idle"]))
    print("\n| subjects, flush interval | warm-up (4 × subjects requests) | burst: limit/minute | admitted "
          "| overshoot | documented bound (in flight + 2 cycles × 4 gateways' rate) | cycle (interval + quota flush "
          "ceiling) | 4 gateways' rate | within |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (mode, flush_ms, n), r in results.items():
        b = r["burst"]
        bound = (f"{b['bound']:,.0f} = {b['in_flight']} in flight (Redis)" if b["shared"] else
                 f"{b['bound']:,.0f} = {b['in_flight']} + 2 × {b['cycle_ms']:.0f} ms × {b['rate']:,.0f}/s")
        print(f"| {n:,}, {flush_ms} ms{mode} | {r['warm_s']:.1f} s ({r['warm_errors']} socket errors or 2 s time-outs, {r['warm_non2xx']} non-2xx) | {b['limit']:,} | "
              f"{b['admitted']:,} | {b['over']:+,} | {bound} | {b['cycle_ms']:.0f} ms | {b['rate']:,.0f}/s | "
              f"{'yes' if b['over'] <= b['bound'] else 'NO'} |")
    print("\n| subjects, flush interval | one connection: p50 | p99 |")
    print("|---|---|---|")
    for (mode, flush_ms, n), r in results.items():
        p50, p99 = r["latency"]
        print(f"| {n:,}, {flush_ms} ms{mode} | {p50:.2f} ms | {p99:.2f} ms |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "aigw"))
    ap.add_argument("--sizes", default="10,1000,100000", help="active subjects, comma-separated")
    ap.add_argument("--flush-ms", default="250,1000", help="flush intervals, comma-separated (default 250,1000)")
    ap.add_argument("--window", type=int, default=10, help="seconds of each measured window (default 10)")
    ap.add_argument("--conns", type=int, default=16, help="wrk connections on each gateway (default 16)")
    ap.add_argument("--burst-limit", type=int, default=1000, help="the burst key's requests/minute (default 1000)")
    ap.add_argument("--burst-seconds", type=int, default=3)
    ap.add_argument("--gateways", type=int, default=4)
    ap.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432",
                    help="the server, without a database name (default postgres://postgres@127.0.0.1:5432)")
    ap.add_argument("--short", action="store_true", help="tiny sizes and seconds: a smoke run")
    ap.add_argument("--redis", action="store_true",
                    help="run every flush interval without, then with a Redis of this run (issue 44)")
    args = ap.parse_args()
    global PG
    PG = args.postgres.rstrip("/")
    for tool in ("wrk", "psql"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed")
    binary = os.path.abspath(args.bin)
    if not os.path.exists(binary):
        sys.exit(f"{binary} is missing: cargo build --release --bin aigw")
    sizes = [int(s) for s in args.sizes.split(",")]
    intervals = [int(s) for s in args.flush_ms.split(",")]
    if args.short:
        sizes, intervals, args.window, args.conns = [10, 50], [250, 500], 1, 4
        args.burst_limit, args.burst_seconds = 30, 1
    tmp = tempfile.mkdtemp(prefix="aigw-replicas-")
    mock_port = run.free_port()
    mock = subprocess.Popen([binary, "mock-upstream", "--no-record", "--listen", f"127.0.0.1:{mock_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    gws = []
    redis_proc, redis_url = start_redis() if args.redis else (None, None)
    modes = [("", None), (", Redis", redis_url)] if args.redis else [("", None)]
    psql(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)", "postgres")
    psql(f"CREATE DATABASE {DB}", "postgres")
    try:
        try:
            psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            psql("SELECT pg_stat_statements_reset()")
            args.statements = True
        except RuntimeError:
            args.statements = False  # not in shared_preload_libraries: transactions and rows only
        run.wait_ready(f"http://127.0.0.1:{mock_port}/__mock/calls", mock)
        res = os.path.join(tmp, "resources.toml")
        bursts = len(sizes) * len(intervals) * len(modes)
        with open(res, "w") as f:
            f.write(resources(max(sizes), bursts, args.burst_limit, mock_port))
        results, baseline, b, logged = {}, None, 0, {}
        for mode, url in modes:
            for flush_ms in intervals:
                home = os.path.join(tmp, f"flush-{flush_ms}{'-redis' if url else ''}")
                os.makedirs(home)
                say(f"{args.gateways} gateways, flush every {flush_ms} ms{mode}: starting")
                began = time.monotonic()
                gws = start_gateways(binary, home, args.gateways, flush_ms, res, url)
                say(f"  ready in {time.monotonic() - began:.1f} s")
                if baseline is None:
                    time.sleep(1)
                    baseline = window(gws, args.statements, args.window)
                for n in sizes:
                    results[(mode, flush_ms, n)] = measure_size(gws, home, n, args, flush_ms, b, url is not None)
                    b += 1
                stop_gateways(gws)
                gws = []
                logged[f"{flush_ms} ms flush{mode}"] = warnings(home)
    finally:
        stop_gateways(gws)
        mock.terminate()
        mock.wait(timeout=20)
        psql(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)", "postgres")
        shutil.rmtree(tmp, ignore_errors=True)
        if redis_proc:
            redis_proc.kill()
            redis_proc.wait()
    report(os.path.relpath(binary, ROOT) if binary.startswith(ROOT) else binary, args, baseline, results)
    print("\nWhat the four gateways logged at warn and error (count, message):\n")
    for flush_ms, msgs in logged.items():
        for msg, n in sorted(msgs.items(), key=lambda kv: -kv[1]):
            print(f"- {flush_ms}: {n} × {msg}")
        if not msgs:
            print(f"- {flush_ms}: nothing")
    bad = [k for k, r in results.items() if r["burst"]["over"] > r["burst"]["bound"]]
    if bad:
        sys.exit(f"the overshoot passed the documented bound at {bad}")


if __name__ == "__main__":
    main()
