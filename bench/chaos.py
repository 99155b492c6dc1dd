#!/usr/bin/env python3
"""The chaos run: real gateways, the built-in mock upstream and a private Postgres cluster, put
through the faults an operator meets in production, with what clients saw compared against what
the database stored. Prints one markdown table and exits non-zero when a row breaks its bound.

    cargo build --release --bin aigw && python3 bench/chaos.py            # the full run
    cargo build --bin aigw && python3 bench/chaos.py --short --bin target/debug/aigw   # CI

Faults (one function each below): kill -9 mid-load then restart; SIGTERM mid-load with open
streams; Postgres restarted mid-load; Postgres down under load; Postgres down under load with a
small request-log queue; two replicas against one quota;
three replicas started at the same instant on a fresh database; a workspace time zone other than
the gateway's with a quota filled to one below its limit; a burst of failures of one key on two
replicas; Postgres down while a known key brings new end users and tags; two replicas sharing
one quota through Redis, and Redis killed, killed and restarted empty, flushed (`FLUSHALL`) and
slowed (a relay that delays its answers past `redis_timeout_ms`) under their load.

Postgres: a cluster of its own (`initdb` into a temporary folder, a free port on 127.0.0.1, run as
the `postgres` user when this script runs as root), one database per fault, removed at the end,
also after a failure or Ctrl-C. Redis likewise: a `redis-server` of each Redis fault (a free port,
no persistence) behind a relay of this script. It never touches a server the machine already
runs. Traffic goes to 127.0.0.1 only; every load is bounded in time and in count. Python 3.11
standard library only.
"""

import argparse
import hashlib
import http.client
import json
import math
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLUSH_MS = 250  # the gateway's default flush_interval_ms: every bound below is in its units
# A gateway sleeps one interval *after* each flush, whose own transactions (quota counters,
# upstream own limits, breaker windows; the request-log batch likewise) take time: a "flush
# interval" in the bounds is the interval plus this allowance for them on a loaded machine.
FLUSH_SLACK_MS = 100
CYCLE = (FLUSH_MS + FLUSH_SLACK_MS) / 1000  # seconds
FAST, SLOW_STREAM, SLOW_CALL = "gpt-4o-mini", "slow-stream", "slow-call"
CRED = "chaos-upstream-key"
HOT_KEY = "sk-aigw-ChaosHotKey0123456789abcdefghijk"
MASTER_KEY = "00" * 32
JWT_SECRET = "chaos-jwt-secret-0123456789abcdef0123456789"
# Keys that no gateway has used before the database goes away: each probe takes the next one.
COLD_KEYS = [f"sk-aigw-ChaosColdKey{i:02d}abcdefghijklmnopqr" for i in range(60)]
assert all(len(k) == len("sk-aigw-") + 32 for k in [HOT_KEY, *COLD_KEYS])


def say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def key_hash(key):
    return hashlib.sha256(key.encode()).hexdigest()


def wait_until(what, check, timeout, every=0.1):
    """Polls `check` until it returns a true value (returned) or `timeout` seconds pass (raises)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise Failure(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


class Failure(Exception):
    """A fault could not be run to the end (a process did not start, a wait timed out)."""


# ---------------------------------------------------------------------------------------------
# Processes: everything started is tracked and stopped at the end, whatever happens.


class Processes:
    def __init__(self):
        self.procs = []

    def spawn(self, args, env, log_path):
        log = open(log_path, "ab")
        p = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        log.close()
        self.procs.append(p)
        return p

    def stop_all(self, keep=()):
        """Kills every process started but those in `keep` (the mock upstream between faults)."""
        ending = [p for p in self.procs if p not in keep]
        for p in ending:
            if p.poll() is None:
                p.kill()
        for p in ending:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                say(f"warning: process {p.pid} did not exit after SIGKILL")
        self.procs = [p for p in self.procs if p in keep]


# ---------------------------------------------------------------------------------------------
# The private Postgres cluster.


def pg_bin(name):
    versions = os.listdir("/usr/lib/postgresql") if os.path.isdir("/usr/lib/postgresql") else []
    dirs = [f"/usr/lib/postgresql/{v}/bin" for v in sorted(versions, key=lambda v: int(v) if v.isdigit() else 0,
                                                             reverse=True)]
    for d in ["/usr/local/bin", *dirs]:
        path = os.path.join(d, name)
        if os.access(path, os.X_OK):
            return path
    found = shutil.which(name)
    if not found:
        raise Failure(f"{name} not found (install PostgreSQL's server binaries)")
    return found


class Cluster:
    """A Postgres cluster of this run only: its own folder, port and socket directory."""

    def __init__(self, base):
        self.dir = os.path.join(base, "pg")
        self.port = free_port()
        self.as_postgres = os.geteuid() == 0  # initdb and postgres refuse to run as root
        os.makedirs(self.dir, mode=0o700)
        if self.as_postgres:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise Failure("running as root, and there is no postgres user to run initdb as") from None
            os.chmod(base, 0o711)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.log = os.path.join(self.dir, "server.log")

    def _run(self, args, timeout=60):
        if self.as_postgres:
            args = ["runuser", "-u", "postgres", "--", *args]
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise Failure(f"{' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def init(self):
        data = os.path.join(self.dir, "data")
        self._run([pg_bin("initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"],
                  timeout=120)
        with open(os.path.join(data, "postgresql.conf"), "a") as f:
            # The faults are the gateway's, not the disk's: no fsync keeps the run fast on a
            # shared machine; a fast shutdown still checkpoints everything.
            f.write(f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                    f"unix_socket_directories = '{self.dir}'\nfsync = off\nmax_connections = 200\n")
        self.start()

    def pg_ctl(self, *args):
        self._run([pg_bin("pg_ctl"), "-D", os.path.join(self.dir, "data"), "-l", self.log, "-w", "-t", "60", *args],
                  timeout=90)

    def start(self):
        self.pg_ctl("start")

    def stop(self, mode="fast"):
        self.pg_ctl("stop", "-m", mode)

    def restart(self):
        self.pg_ctl("restart", "-m", "fast")

    def destroy(self):
        if os.path.exists(os.path.join(self.dir, "data", "postmaster.pid")):
            try:
                self.stop("immediate")
            except Exception as e:  # noqa: BLE001 - cleanup goes on
                say(f"warning: could not stop the private Postgres: {e}")

    def url(self, db):
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def psql(self, db, sql):
        done = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", db,
                               "-v", "ON_ERROR_STOP=1", "-AtqX", "-c", sql],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise Failure(f"psql failed on {sql!r}: {done.stderr.strip()}")
        return done.stdout.strip()

    def create_db(self, name):
        self.psql("postgres", f"CREATE DATABASE {name}")
        return name

    def stored_usage(self, db, key):
        """The stored `requests` and `total_tokens` counters of `key`, every window summed."""
        rows = self.psql(db, "SELECT metric, SUM(used) FROM usage_counters WHERE subject = 'apikey' AND "
                             f"subject_id = (SELECT id FROM api_keys WHERE key_hash = '{key_hash(key)}') "
                             "GROUP BY metric")
        got = dict(line.split("|") for line in rows.splitlines() if line)
        return int(got.get("requests", 0)), int(got.get("total_tokens", 0))

    def trips(self, db, key):
        """The key's breaker trips as recorded: [(trip, at ms, blocked_until ms or None, banned)]."""
        rows = self.psql(db, "SELECT trip, at, COALESCE(blocked_until, -1), banned FROM breaker_trips WHERE "
                             f"key_id = (SELECT id FROM api_keys WHERE key_hash = '{key_hash(key)}') ORDER BY trip")
        trips = [tuple(int(v) for v in line.split("|")) for line in rows.splitlines() if line]
        return [(t, at, None if until < 0 else until, bool(banned)) for t, at, until, banned in trips]

    def logged(self, db, key):
        """Request-log rows of `key` that say the request was served in full."""
        return int(self.psql(db, "SELECT COUNT(*) FROM request_logs WHERE status = 200 AND code IS NULL AND "
                                 f"key_id = (SELECT id FROM api_keys WHERE key_hash = '{key_hash(key)}')"))


# ---------------------------------------------------------------------------------------------
# The mock upstream and the gateways.


class Mock:
    def __init__(self, run):
        self.port = free_port()
        self.proc = run.procs.spawn([run.bin, "mock-upstream", "--listen", f"127.0.0.1:{self.port}", "--no-record"],
                                    {"PATH": os.environ.get("PATH", "")}, os.path.join(run.base, "mock.log"))
        wait_until("the mock upstream", lambda: self._post("/__mock/reset", None) == 204, 30)

    def _post(self, path, body):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            c.request("POST", path, body=json.dumps(body) if body is not None else b"",
                      headers={"content-type": "application/json"})
            status = c.getresponse().status
            c.close()
            return status
        except OSError:
            return None

    def reset(self):
        """Forgets every script, then scripts the slow models (their names are the scripts' key)."""
        assert self._post("/__mock/reset", None) == 204
        # A stream of ten words, 100 ms apart: about a second open.
        assert self._post("/__mock/script", {"model": SLOW_STREAM, "chunk_delay_ms": 100, "words": 10}) == 201

    def script(self, s):
        assert self._post("/__mock/script", s) == 201


def resources(mock_port, *, timezone=None, requests_per_day=10**12, generated_key=False):
    """The resources file every gateway of a fault reads: one workspace, the hot key with two
    policies on it (so the database holds its usage), the cold keys, the mock as upstream."""
    tz = f'timezone = "{timezone}"\n' if timezone else ""
    keys = "".join(f'[[api_key]]\nmember = "load@chaos.test"\nname = "cold-{i}"\nkey = "{k}"\n'
                   for i, k in enumerate(COLD_KEYS))
    gen = '[[api_key]]\nmember = "load@chaos.test"\nname = "generated"\n' if generated_key else ""
    models = "".join(f'[[model]]\nworkspace = "chaos"\nname = "{m}"\nprice = {{ prompt = 0.15, completion = 0.60 }}\n'
                     for m in (FAST, SLOW_STREAM, SLOW_CALL))
    return f"""
[[workspace]]
name = "chaos"
{tz}
[[department]]
workspace = "chaos"
name = "ops"

[[member]]
workspace = "chaos"
department = "ops"
email = "load@chaos.test"
role = "member"

[[member]]
workspace = "chaos"
email = "admin@chaos.test"
role = "admin"
password = "chaos-admin-password"

[[api_key]]
member = "load@chaos.test"
name = "hot"
key = "{HOT_KEY}"
{keys}{gen}
[[upstream]]
workspace = "chaos"
name = "mock"
provider = "openai-compatible"
base_url = "http://127.0.0.1:{mock_port}/v1"
api_key = "{CRED}"
models = ["{FAST}", "{SLOW_STREAM}", "{SLOW_CALL}"]
max_in_flight = 1024

{models}
[[policy]]
workspace = "chaos"
subject = "apikey"
target = "load@chaos.test/hot"
metric = "requests"
window = "day"
limit = {requests_per_day}

[[policy]]
workspace = "chaos"
subject = "apikey"
target = "load@chaos.test/hot"
metric = "total_tokens"
window = "day"
limit = 1000000000000
"""


class Gateway:
    """One `aigw serve` on a free port, configured by AIGW_* settings and a resources file."""

    def __init__(self, run, name, db, res_path, env=None, unset=(), wait=True):
        self.run, self.name = run, name
        self.port = free_port()
        self.home = os.path.join(run.base, name)
        os.makedirs(self.home, exist_ok=True)
        self.log = os.path.join(self.home, "gateway.log")
        self.env = {
            "PATH": os.environ.get("PATH", ""),
            "AIGW_LISTEN": f"127.0.0.1:{self.port}",
            "AIGW_DATABASE_URL": run.pg.url(db),
            "AIGW_DATA_DIR": self.home,
            "AIGW_MASTER_KEY": MASTER_KEY,
            "AIGW_JWT_SECRET": JWT_SECRET,
            "AIGW_BOOTSTRAP_EMAIL": "owner@chaos.test",
            "AIGW_BOOTSTRAP_PASSWORD": "chaos-owner-password",
            "AIGW_FLUSH_INTERVAL_MS": str(FLUSH_MS),
            # Several gateways share two cores with the load: no busy polling before sleeping.
            "AIGW_IDLE_POLL_US": "0",
            "AIGW_LOG": "info",
            **(env or {}),
        }
        for k in unset:
            self.env.pop(k, None)
        self.args = [run.bin, "serve", "--resources", res_path]
        self.proc = None
        self.start(wait)

    def start(self, wait=True):
        self.proc = self.run.procs.spawn(self.args, self.env, self.log)
        if wait:
            self.wait_ready()

    def status(self, path, timeout=2):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            c.request("GET", path)
            s = c.getresponse().status
            c.close()
            return s
        except OSError:
            return None

    def wait_ready(self, timeout=90):
        def ready():
            if self.proc.poll() is not None:
                last = self.tail(1).strip() or "(no output)"
                raise Failure(f"{self.name} exited with {self.proc.returncode}: {last}")
            return self.status("/readyz") == 200
        wait_until(f"{self.name} to be ready", ready, timeout)

    def terminate(self, timeout=60):
        """SIGTERM, then waits for the exit; the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Failure(f"{self.name} did not stop within {timeout} s of SIGTERM") from None

    def kill9(self):
        self.proc.kill()
        self.proc.wait(timeout=10)

    def flush_ceilings(self):
        """{kind: seconds}: from `aigw_store_flush_duration_seconds`, the upper edge of the lowest
        bucket that holds every flush of that kind so far (a measured ceiling on the longest)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        total, buckets = {}, {}
        for m in re.finditer(r'^aigw_store_flush_duration_seconds_(bucket|count)\{([^}]*)\} (\S+)$', text, re.M):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m[2]))
            if m[1] == "count":
                total[labels["kind"]] = float(m[3])
            elif labels["le"] != "+Inf":
                buckets.setdefault(labels["kind"], []).append((float(labels["le"]), float(m[3])))
        ceilings = {}
        for kind, n in total.items():
            edges = sorted(b for b in buckets.get(kind, []) if b[1] >= n)
            ceilings[kind] = edges[0][0] if edges else 60.0
        return ceilings

    def tail(self, n=15):
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def output(self):
        with open(self.log, errors="replace") as f:
            return f.read()


# ---------------------------------------------------------------------------------------------
# Load: threads with keep-alive connections, each request's outcome kept.


@dataclass
class Outcome:
    status: int | None  # HTTP status; None when the connection failed
    code: str | None = None  # the error's `code`
    delivered: bool = False  # the whole answer arrived (a stream: up to `data: [DONE]`)
    tokens: int = 0  # total_tokens the answer reported
    stream: bool = False
    head: bool = False  # a 200 head arrived
    started: float = 0.0
    ended: float = 0.0
    gateway: int = 0


def call(conn, key, model=FAST, stream=False):
    """One chat completion on `conn`; never raises."""
    o = Outcome(status=None, stream=stream, started=time.monotonic())
    body = {"model": model, "messages": [{"role": "user", "content": "chaos run, please answer"}]}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
        resp = conn.getresponse()
        o.status = resp.status
        if resp.status != 200:
            data = resp.read()
            try:
                o.code = json.loads(data)["error"]["code"]
            except (ValueError, KeyError, TypeError):
                o.code = None
        elif not stream:
            o.head = True
            o.tokens = json.loads(resp.read())["usage"]["total_tokens"]
            o.delivered = True
        else:
            o.head = True
            while line := resp.readline():
                if line.startswith(b"data: [DONE]"):
                    o.delivered = True
                    break
                if line.startswith(b"data: {"):
                    usage = json.loads(line[6:]).get("usage")
                    if usage:
                        o.tokens = usage["total_tokens"]
            if o.delivered:
                resp.read()  # the chunked body's end, so the connection can be reused
    except (OSError, http.client.HTTPException, ValueError, KeyError):
        o.delivered = False
        conn.close()
    o.ended = time.monotonic()
    return o


class Load:
    """`threads` loops of requests to one gateway until stopped, `limit` requests are sent or
    `seconds` pass. After a failed connection a loop pauses `backoff` seconds; with `pace`, each
    loop starts a request at most every `pace` seconds."""

    def __init__(self, port, key=HOT_KEY, *, threads, model=FAST, stream=False, limit=None, seconds=120,
                 backoff=0.05, gateway=0, pace=None):
        self.port, self.key, self.model, self.stream, self.pace = port, key, model, stream, pace
        self.threads_n, self.limit, self.seconds, self.backoff, self.gateway = threads, limit, seconds, backoff, gateway
        self.stopping = threading.Event()
        self.outcomes = []
        self.lock = threading.Lock()
        self.sent = 0
        self.threads = []

    def start(self):
        self.deadline = time.monotonic() + self.seconds
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(self.threads_n)]
        for t in self.threads:
            t.start()
        return self

    def _claim(self):
        with self.lock:
            if self.limit is not None and self.sent >= self.limit:
                return False
            self.sent += 1
            return True

    def _loop(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        while not self.stopping.is_set() and time.monotonic() < self.deadline and self._claim():
            o = call(conn, self.key, self.model, self.stream)
            o.gateway = self.gateway
            self.outcomes.append(o)
            if o.status is None:
                self.stopping.wait(self.backoff)
            elif self.pace:
                self.stopping.wait(max(0.0, self.pace - (o.ended - o.started)))
        conn.close()

    def stop(self):
        self.stopping.set()
        return self.join()

    def join(self, timeout=60):
        end = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.1, end - time.monotonic()))
        if any(t.is_alive() for t in self.threads):
            raise Failure("load threads did not finish in time")
        return self

    def wait_sent(self, n, timeout):
        wait_until(f"{n} requests sent", lambda: len(self.outcomes) >= n, timeout, every=0.02)


class Burst:
    """`n` requests on `n` connections opened beforehand, all sent the moment `go` is set."""

    def __init__(self, port, n, go, key=HOT_KEY, model=FAST):
        self.key, self.model = key, model
        self.outcomes = []
        self.conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=15) for _ in range(n)]
        for c in self.conns:
            c.connect()
        self.threads = [threading.Thread(target=self._one, args=(c, go), daemon=True) for c in self.conns]
        for t in self.threads:
            t.start()

    def _one(self, conn, go):
        if go.wait(120):
            self.outcomes.append(call(conn, self.key, self.model))
        conn.close()

    def join(self, timeout):
        end = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.1, end - time.monotonic()))
        if any(t.is_alive() for t in self.threads):
            raise Failure("burst threads did not finish in time")
        return self.outcomes


def summary(outcomes):
    delivered = [o for o in outcomes if o.delivered]
    return len(outcomes), len(outcomes) - len(delivered), len(delivered), sum(o.tokens for o in delivered)


def rate_before(outcomes, t, window=1.0):
    """Delivered requests per second in the `window` seconds before `t`, or since the first
    request started when that is later (a short load that reaches its limit within the window
    would otherwise read as slower than it was)."""
    first = min((o.started for o in outcomes), default=t)
    span = max(min(window, t - first), 0.05)
    return sum(1 for o in outcomes if o.delivered and t - span <= o.ended <= t) / span


def rate(outcomes):
    """Delivered requests per second over the span they were sent in."""
    done = [o for o in outcomes if o.delivered]
    if len(done) < 2:
        return 0.0
    span = max(o.ended for o in done) - min(o.started for o in done)
    return len(done) / max(span, 1e-3)


# ---------------------------------------------------------------------------------------------
# The table.


@dataclass
class Row:
    fault: str
    requests: int = 0
    failed: int = 0
    delivered: str = ""
    stored: str = ""
    logs: str = ""
    bound: str = ""
    holds: bool = False
    notes: list = field(default_factory=list)

    def check(self, ok, why):
        """Adds one condition of the bound; the row holds only if every one does."""
        if not ok:
            self.notes.append(why)
        return ok


def usage_text(req, tok):
    return f"{req} req / {tok} tok"


# ---------------------------------------------------------------------------------------------
# The faults.


def fault_kill9(run):
    """kill -9 mid-load, then restart on the same database: what the dead process had not
    flushed is lost (at most one flush interval of usage, two of request logs); requests it had
    counted but not yet answered are counted; the restarted gateway continues from the stored
    totals."""
    row = Row("kill -9 mid-load, then restart")
    db = run.pg.create_db("chaos_kill9")
    res = run.write_resources("kill9", resources(run.mock.port))
    gw = Gateway(run, "kill9", db, res)
    threads = 6
    load = Load(gw.port, threads=threads).start()
    time.sleep(run.t(3, 10))
    # How long this machine's flushes take now is part of the loss window: the usage delivered
    # from one quota snapshot until the next commits (interval + one cycle's flushes + the next
    # quota flush), the logs from one batch until the next is written (two intervals + two writes).
    ceil = gw.flush_ceilings()
    killed_at = time.monotonic()
    gw.kill9()
    load.stop()
    before = load.outcomes
    stored_req, stored_tok = run.pg.stored_usage(db, HOT_KEY)
    logs_at_kill = run.pg.logged(db, HOT_KEY)
    n1, f1, d1, t1 = summary(before)
    say(f"  killed after {n1} requests ({d1} delivered); stored {stored_req}, logged {logs_at_kill}")

    gw.start()
    after = Load(gw.port, threads=threads, limit=run.n(300, 2000)).start().join(120).outcomes
    code = gw.terminate()
    n2, f2, d2, t2 = summary(after)
    final_req, final_tok = run.pg.stored_usage(db, HOT_KEY)
    final_logs = run.pg.logged(db, HOT_KEY)

    # What was delivered in the last second before the kill sets the pace of the loss.
    r = rate_before(before, killed_at)
    usage_window = FLUSH_MS / 1000 + 2 * ceil.get("quota", 0) + ceil.get("own_limits", 0) + ceil.get("breakers", 0)
    log_window = 2 * FLUSH_MS / 1000 + 2 * ceil.get("request_logs", 0)
    usage_bound = math.ceil(r * max(usage_window, CYCLE))
    log_bound = math.ceil(r * max(log_window, 2 * CYCLE))
    lost_req, lost_logs = d1 - stored_req, d1 - logs_at_kill
    row.requests, row.failed = n1 + n2, f1 + f2
    row.delivered = usage_text(d1 + d2, t1 + t2)
    row.stored = usage_text(final_req, final_tok)
    row.logs = str(final_logs)
    row.bound = (f"at the kill, missing: usage {lost_req} ≤ {usage_bound} (1 flush cycle, "
                 f"{max(usage_window, CYCLE) * 1000:.0f} ms at {r:.0f}/s), logs {lost_logs} ≤ {log_bound} "
                 f"(2 cycles, {max(log_window, 2 * CYCLE) * 1000:.0f} ms); counted but not delivered ≤ {threads} in flight; "
                 "after the restart nothing missing")
    row.check(-threads <= lost_req <= usage_bound,
              f"usage missing at the kill {lost_req} outside [-{threads}, {usage_bound}]")
    row.check(-threads <= lost_logs <= log_bound,
              f"logs missing at the kill {lost_logs} outside [-{threads}, {log_bound}]")
    row.check(f1 <= threads, f"{f1} requests failed at the kill, more than the {threads} in flight")
    row.check(f2 == 0, f"{f2} requests failed after the restart")
    row.check(final_req - stored_req == d2, f"after the restart stored grew by {final_req - stored_req}, delivered {d2}")
    row.check(final_tok - stored_tok == t2, f"after the restart stored tokens grew by {final_tok - stored_tok}, delivered {t2}")
    row.check(final_logs - logs_at_kill == d2, f"after the restart logs grew by {final_logs - logs_at_kill}, delivered {d2}")
    row.check(code == 0, f"the restarted gateway exited with {code} on SIGTERM")
    return row


def fault_sigterm(run):
    """SIGTERM while plain requests and streams are running: the gateway stops listening (new
    requests are refused at once), finishes what runs, flushes, exits; nothing delivered is
    missing."""
    row = Row("SIGTERM mid-load, streams open")
    db = run.pg.create_db("chaos_sigterm")
    res = run.write_resources("sigterm", resources(run.mock.port))
    gw = Gateway(run, "sigterm", db, res)
    plain = Load(gw.port, threads=4, backoff=0.1).start()
    streams = Load(gw.port, threads=4, model=SLOW_STREAM, stream=True, backoff=0.1).start()
    time.sleep(run.t(2.5, 6))
    signalled = time.monotonic()
    code_box = {}
    stopper = threading.Thread(target=lambda: code_box.setdefault("code", gw.terminate()), daemon=True)
    stopper.start()
    time.sleep(0.5)  # clients keep sending for a while: the gateway must refuse them, not count them
    plain.stop()
    streams.stop()
    stopper.join(90)
    if "code" not in code_box:
        raise Failure("the gateway did not exit after SIGTERM")
    code = code_box["code"]
    outcomes = plain.outcomes + streams.outcomes
    n, failed, d, tok = summary(outcomes)
    open_at_signal = [o for o in streams.outcomes if o.started < signalled < o.ended]
    cut = [o for o in outcomes if o.head and not o.delivered]
    stored_req, stored_tok = run.pg.stored_usage(db, HOT_KEY)
    logs = run.pg.logged(db, HOT_KEY)
    row.requests, row.failed = n, failed
    row.delivered, row.stored, row.logs = usage_text(d, tok), usage_text(stored_req, stored_tok), str(logs)
    # Requests sent after the signal are refused, at once: none waits for the drain.
    late = [o for o in outcomes if o.started > signalled + 0.05 and not o.delivered]
    slowest_refusal = max((o.ended - o.started for o in late), default=0.0)
    row.bound = (f"stored = delivered, logs = delivered; {len(open_at_signal)} streams open at SIGTERM, "
                 f"{len(cut)} cut; failed = sent after SIGTERM, refused in ≤ {slowest_refusal:.2f} s; exit 0")
    row.check(stored_req == d and stored_tok == tok, "stored usage differs from delivered")
    row.check(logs == d, "logs differ from delivered")
    row.check(not cut, f"{len(cut)} answers cut after a 200 head")
    row.check(len(open_at_signal) > 0, "no stream was open at SIGTERM (the fault was not exercised)")
    row.check(slowest_refusal <= 0.5, f"a request sent after SIGTERM waited {slowest_refusal:.2f} s to fail")
    row.check(code == 0, f"exit status {code}")
    return row


def fault_pg_restart(run):
    """Postgres restarted (pg_ctl restart -m fast) under load: no request fails; the flushes
    and log writes that failed are retried; nothing is missing."""
    row = Row("Postgres restarted mid-load")
    db = run.pg.create_db("chaos_pgrestart")
    res = run.write_resources("pgrestart", resources(run.mock.port))
    gw = Gateway(run, "pgrestart", db, res)
    load = Load(gw.port, threads=6).start()
    time.sleep(run.t(2, 5))
    t0 = time.monotonic()
    run.pg.restart()
    say(f"  Postgres restarted in {time.monotonic() - t0:.1f} s")
    time.sleep(run.t(3, 10))
    load.stop()
    n, failed, d, tok = summary(load.outcomes)
    caught_up = settle(run, db, d, tok)
    stored_req, stored_tok = run.pg.stored_usage(db, HOT_KEY)
    logs = run.pg.logged(db, HOT_KEY)
    code = gw.terminate()
    row.requests, row.failed = n, failed
    row.delivered, row.stored, row.logs = usage_text(d, tok), usage_text(stored_req, stored_tok), str(logs)
    row.bound = "0 failed; stored = delivered, logs = delivered (while running)"
    row.check(failed == 0, f"{failed} failed: {codes(load.outcomes)}")
    row.check(caught_up, "stored usage or logs did not catch up with delivered within 20 s")
    row.check(code == 0, f"exit status {code}")
    return row


def settle(run, db, delivered, tokens, timeout=20):
    """Waits until the running gateway has stored what was delivered; whether it did."""
    try:
        wait_until("stored usage and logs to catch up",
                   lambda: run.pg.stored_usage(db, HOT_KEY) == (delivered, tokens)
                   and run.pg.logged(db, HOT_KEY) == delivered, timeout, every=0.25)
        return True
    except Failure:
        return False


def codes(outcomes):
    seen = {}
    for o in outcomes:
        if not o.delivered:
            k = f"{o.status or 'conn'}{'/' + o.code if o.code else ''}"
            seen[k] = seen.get(k, 0) + 1
    return ", ".join(f"{k} ×{v}" for k, v in sorted(seen.items())) or "none"


def fault_pg_down(run):
    """Postgres stopped under load for a while: keys seen before keep being served; what needs
    the store answers 503 store_unavailable fast; /readyz says not ready, /healthz stays up;
    after recovery nothing counted during the outage is missing."""
    outage = run.t(10, 30)
    row = Row(f"Postgres down {outage} s under load")
    db = run.pg.create_db("chaos_pgdown")
    res = run.write_resources("pgdown", resources(run.mock.port))
    gw = Gateway(run, "pgdown", db, res)
    load = Load(gw.port, threads=4, seconds=outage + 120).start()
    time.sleep(run.t(2, 4))
    run.pg.stop()
    down_at = time.monotonic()
    say(f"  Postgres stopped; probing for {outage} s")
    probes = {"readyz": [], "healthz": [], "cold": []}

    def cold_probes():
        # A key never seen before, every 2 s (each on a new connection): it needs the store.
        for key in COLD_KEYS:
            if time.monotonic() - down_at > outage - 1:
                break
            o = call(http.client.HTTPConnection("127.0.0.1", gw.port, timeout=15), key)
            probes["cold"].append((o.status, o.code, o.ended - o.started))
            time.sleep(max(0.0, 2 - (o.ended - o.started)))

    prober = threading.Thread(target=cold_probes, daemon=True)
    prober.start()
    while time.monotonic() - down_at < outage:
        probes["healthz"].append(gw.status("/healthz"))
        if time.monotonic() - down_at > 2:  # the gateway notices the outage at its next use of the store
            probes["readyz"].append(gw.status("/readyz", timeout=3))
        time.sleep(0.5)
    prober.join(20)
    during = [o for o in load.outcomes if o.started >= down_at]
    run.pg.start()
    up_at = time.monotonic()
    say("  Postgres started again")
    try:
        wait_until("/readyz 200 after recovery", lambda: gw.status("/readyz") == 200, 30)
        ready_after = time.monotonic() - up_at
    except Failure:
        ready_after = None
    time.sleep(1)
    load.stop()
    n, failed, d, tok = summary(load.outcomes)
    caught_up = settle(run, db, d, tok, timeout=30)
    stored_req, stored_tok = run.pg.stored_usage(db, HOT_KEY)
    logs = run.pg.logged(db, HOT_KEY)
    code = gw.terminate()
    cold_ok = [p for p in probes["cold"] if p[0] == 503 and p[1] == "store_unavailable" and p[2] <= 1.0]
    slowest = max((p[2] for p in probes["cold"]), default=0)
    row.requests, row.failed = n + len(probes["cold"]), failed + len(probes["cold"])
    row.delivered, row.stored, row.logs = usage_text(d, tok), usage_text(stored_req, stored_tok), str(logs)
    row.bound = (f"seen key: 0 failed ({len(during)} during the outage); unseen keys: 503 store_unavailable "
                 f"≤ 1 s ({len(cold_ok)}/{len(probes['cold'])}, slowest {slowest:.2f} s); readyz 503 during, "
                 f"200 after ({'%.1f s' % ready_after if ready_after is not None else 'never'}); healthz 200; "
                 "after recovery stored = delivered, logs = delivered")
    row.check(failed == 0, f"{failed} requests with the seen key failed: {codes(load.outcomes)}")
    row.check(len(during) > 0, "no request with the seen key ran during the outage")
    row.check(len(cold_ok) == len(probes["cold"]),
              "unseen keys answered " + ", ".join(f"{s}/{c} in {t:.2f} s" for s, c, t in probes["cold"][:4]))
    row.check(probes["readyz"] and all(s == 503 for s in probes["readyz"]), f"readyz during: {probes['readyz']}")
    row.check(ready_after is not None, "readyz not 200 within 30 s of recovery")
    row.check(all(s == 200 for s in probes["healthz"]), f"healthz during: {probes['healthz']}")
    row.check(caught_up, "stored usage or logs did not catch up with delivered within 30 s of recovery")
    row.check(code == 0, f"exit status {code}")
    return row


def metric_value(gw, name):
    """The value of the unlabelled series `name` on the gateway's /metrics, or None."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=5)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
    except OSError:
        return None
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m[1]) if m else None


def rss_bytes(pid):
    """The resident memory of process `pid`, from /proc."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


def fault_log_queue(run):
    """Postgres down under load with a small request-log queue (max_log_queue_bytes): the logs
    waiting for the database never take more than the bound, the gateway's memory grows by no
    more than the bound plus a margin, the logs past it are dropped and counted, and after
    recovery the stored usage equals what was delivered (quota counters are never dropped)."""
    outage = run.t(10, 30)
    max_bytes = 512 * 1024
    slack = 32 * 1024 * 1024  # the rest of an outage's memory: counters, buffers, the allocator
    row = Row(f"Postgres down {outage} s, log queue bound {max_bytes // 1024} KiB")
    db = run.pg.create_db("chaos_logqueue")
    res = run.write_resources("logqueue", resources(run.mock.port))
    gw = Gateway(run, "logqueue", db, res, env={"AIGW_MAX_LOG_QUEUE_BYTES": str(max_bytes)})
    load = Load(gw.port, threads=4, seconds=outage + 120).start()
    time.sleep(run.t(2, 4))
    baseline = rss_bytes(gw.proc.pid)
    run.pg.stop()
    down_at = time.monotonic()
    say(f"  Postgres stopped; sampling memory for {outage} s")
    queued, rss = [], []
    while time.monotonic() - down_at < outage:
        queued.append(metric_value(gw, "aigw_log_queue_bytes") or 0)
        rss.append(rss_bytes(gw.proc.pid))
        time.sleep(0.25)
    during = [o for o in load.outcomes if o.started >= down_at and o.delivered]
    run.pg.start()
    say("  Postgres started again")
    wait_until("/readyz 200 after recovery", lambda: gw.status("/readyz") == 200, 30)
    time.sleep(1)
    load.stop()
    n, failed, d, tok = summary(load.outcomes)
    dropped = int(metric_value(gw, "aigw_request_logs_dropped_total") or 0)
    try:
        wait_until("stored usage and logs to catch up",
                   lambda: run.pg.stored_usage(db, HOT_KEY) == (d, tok)
                   and run.pg.logged(db, HOT_KEY) + dropped == d, 30, every=0.25)
        caught_up = True
    except Failure:
        caught_up = False
    stored_req, stored_tok = run.pg.stored_usage(db, HOT_KEY)
    logs = run.pg.logged(db, HOT_KEY)
    code = gw.terminate()
    peak_q, growth = max(queued, default=0), max(rss, default=baseline) - baseline
    mib = 1024 * 1024
    row.requests, row.failed = n, failed
    row.delivered, row.stored, row.logs = usage_text(d, tok), usage_text(stored_req, stored_tok), str(logs)
    row.bound = (f"queued ≤ {max_bytes} B (peak {peak_q:.0f} B); RSS +{growth / mib:.1f} MiB ≤ bound + "
                 f"{slack // mib} MiB ({len(during)} served during the outage); dropped {dropped} counted = "
                 f"delivered {d} − logged {logs}; stored usage = delivered")
    row.check(failed == 0, f"{failed} requests failed: {codes(load.outcomes)}")
    row.check(len(during) > 0, "no request ran during the outage")
    row.check(peak_q <= max_bytes, f"the log queue held {peak_q:.0f} B, over {max_bytes}")
    row.check(growth <= max_bytes + slack, f"RSS grew by {growth / mib:.1f} MiB")
    row.check(dropped > 0, "no log was dropped: the outage did not fill the queue")
    row.check(caught_up, f"after recovery: stored {stored_req} req (delivered {d}), {logs} logs + {dropped} "
                         f"dropped (delivered {d})")
    row.check(code == 0, f"exit status {code}")
    return row


def fault_two_replicas(run):
    """Two gateways on one database, both loaded, against one requests/day policy: the admitted
    requests pass the limit by at most the requests in flight plus two flush cycles of each
    gateway's traffic (docs/quotas.md); stored usage equals what was admitted."""
    limit = run.n(400, 2000)
    row = Row("two replicas, one quota")
    db = run.pg.create_db("chaos_replicas")
    res = run.write_resources("replicas", resources(run.mock.port, requests_per_day=limit))
    gws = [Gateway(run, f"replica-{i}", db, res) for i in (1, 2)]
    per = 4
    loads = [Load(g.port, threads=per, limit=limit * 2, gateway=i).start() for i, g in enumerate(gws)]
    for ld in loads:
        ld.join(180)
    # A gateway learns the other's usage at its next flush after the other's flush: two cycles,
    # each the interval plus the flushes themselves (quota, own limits, breakers), as measured.
    cycle = max(FLUSH_MS / 1000 + sum(c.get(k, 0) for k in ("quota", "own_limits", "breakers"))
                for c in (g.flush_ceilings() for g in gws))
    cycle = max(cycle, CYCLE)
    outcomes = loads[0].outcomes + loads[1].outcomes
    codes_ = [gw.terminate() for gw in gws]
    admitted = [o for o in outcomes if o.delivered]
    refused = [o for o in outcomes if o.status == 429]
    failed = len(outcomes) - len(admitted) - len(refused)
    stored_req, stored_tok = run.pg.stored_usage(db, HOT_KEY)
    logs = run.pg.logged(db, HOT_KEY)
    # Each gateway's pace in the second before the limit was reached.
    crossed = sorted(o.ended for o in admitted)[min(limit, len(admitted)) - 1] if admitted else 0
    # Each gateway admits, unseen by the other, up to two cycles of its own traffic: the
    # overshoot is the sum over the gateways.
    together = sum(rate_before(ld.outcomes, crossed) for ld in loads)
    in_flight = per * 2
    bound = limit + in_flight + math.ceil(together * 2 * cycle)
    row.requests, row.failed = len(outcomes), failed
    row.delivered = usage_text(len(admitted), sum(o.tokens for o in admitted))
    row.stored, row.logs = usage_text(stored_req, stored_tok), str(logs)
    row.bound = (f"admitted {len(admitted)} ≤ {bound} = limit {limit} + {in_flight} in flight + 2 flush cycles "
                 f"({cycle * 1000:.0f} ms each) of both gateways' {together:.0f}/s; {len(refused)} refused 429; stored = admitted")
    row.check(len(admitted) <= bound, f"admitted {len(admitted)} over the bound {bound}")
    row.check(len(admitted) >= limit, f"admitted {len(admitted)} below the limit {limit}")
    row.check(failed == 0, f"{failed} failed: {codes(outcomes)}")
    row.check(stored_req == len(admitted), "stored requests differ from admitted")
    row.check(logs == len(admitted), "logs differ from admitted")
    row.check(codes_ == [0, 0], f"exit statuses {codes_}")
    return row


def fault_simultaneous_start(run):
    """Three gateways started at the same instant on one fresh database with the same resources
    file: all come up ready and every entity exists once."""
    row = Row("three replicas started at once, fresh database")
    db = run.pg.create_db("chaos_start")
    res = run.write_resources("start", resources(run.mock.port, generated_key=True))
    # No bootstrap password: the owner's is generated, and must be printed by one gateway only.
    # Popen returns once each process runs: the three starts are a few milliseconds apart.
    gws = [Gateway(run, f"start-{i}", db, res, unset=["AIGW_BOOTSTRAP_PASSWORD"], wait=False) for i in (1, 2, 3)]
    ready = 0
    for g in gws:
        try:
            g.wait_ready(120)
            ready += 1
        except Failure as e:
            row.notes.append(str(e).splitlines()[0])
    outcomes = []
    for i, g in enumerate(gws):
        if g.proc.poll() is None:
            conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=15)
            outcomes += [call(conn, HOT_KEY) for _ in range(5)]
            conn.close()
    n, failed, d, tok = summary(outcomes)
    codes_ = [g.terminate() for g in gws if g.proc.poll() is None]
    counts = {
        "workspaces": run.pg.psql(db, "SELECT COUNT(*) FROM workspaces WHERE name = 'chaos'"),
        "departments": run.pg.psql(db, "SELECT COUNT(*) FROM departments"),
        "members": run.pg.psql(db, "SELECT COUNT(*) FROM members"),
        "owners": run.pg.psql(db, "SELECT COUNT(*) FROM members WHERE role = 'owner'"),
        "keys": run.pg.psql(db, "SELECT COUNT(*) FROM api_keys"),
        "upstreams": run.pg.psql(db, "SELECT COUNT(*) FROM upstreams"),
        "models": run.pg.psql(db, "SELECT COUNT(*) FROM models"),
        "policies": run.pg.psql(db, "SELECT COUNT(*) FROM policies"),
    }
    want = {"workspaces": 1, "departments": 1, "members": 3, "owners": 1, "keys": 2 + len(COLD_KEYS),
            "upstreams": 1, "models": 3, "policies": 2}
    outputs = [g.output() for g in gws]
    printed_pw = sum("first owner" in o and "password:" in o for o in outputs)
    printed_key = sum("generated API key" in o for o in outputs)
    stored_req, stored_tok = run.pg.stored_usage(db, HOT_KEY)
    logs = run.pg.logged(db, HOT_KEY)
    row.requests, row.failed = n, failed
    row.delivered, row.stored, row.logs = usage_text(d, tok), usage_text(stored_req, stored_tok), str(logs)
    row.bound = (f"{ready}/3 ready; every entity once ({', '.join(f'{k} {v}' for k, v in counts.items())}); "
                 f"generated password printed {printed_pw}×, generated key {printed_key}×")
    row.check(ready == 3, f"{ready} of 3 gateways ready")
    for k, v in want.items():
        row.check(int(counts[k]) == v, f"{counts[k]} {k}, want {v}")
    row.check(printed_pw == 1, f"the generated owner password was printed {printed_pw} times")
    row.check(printed_key == 1, f"the generated key was printed {printed_key} times")
    row.check(failed == 0 and n == 15, f"{d} of 15 requests delivered: {codes(outcomes)}")
    row.check(stored_req == d and logs == d, "stored usage or logs differ from delivered")
    row.check(all(c == 0 for c in codes_), f"exit statuses {codes_}")
    return row


def fault_timezones(run):
    """A workspace in UTC on a gateway in Asia/Shanghai, 300 requests/day filled to 299, one slow
    request in flight across several flushes, and 60 concurrent requests the moment it completes:
    the slow one is the 300th, the 60 are refused (at most the requests in flight at the crossing
    may pass the limit)."""
    limit = 300
    row = Row("workspace UTC, gateway Asia/Shanghai, quota filled to 299")
    db = run.pg.create_db("chaos_tz")
    res = run.write_resources("tz", resources(run.mock.port, timezone="UTC", requests_per_day=limit))
    gw = Gateway(run, "tz", db, res, env={"AIGW_TIMEZONE": "Asia/Shanghai"})
    fill = Load(gw.port, threads=4, limit=limit - 1).start().join(120).outcomes
    slow_ms = 2000
    run.mock.script({"model": SLOW_CALL, "delay_ms": slow_ms, "times": 1})
    go = threading.Event()
    burst = Burst(gw.port, 60, go)
    # The slow request is admitted at 299 and stays in flight across several flushes; the 60 are
    # sent the moment it has been answered (before the next flush), on connections already open.
    slow_o = call(http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30), HOT_KEY, SLOW_CALL)
    go.set()
    burst = burst.join(60)
    code = gw.terminate()
    outcomes = fill + [slow_o] + burst
    admitted = [o for o in outcomes if o.delivered]
    refused = [o for o in burst if o.status == 429]
    failed = len(outcomes) - len(admitted) - len(refused)
    stored_req, stored_tok = run.pg.stored_usage(db, HOT_KEY)
    logs = run.pg.logged(db, HOT_KEY)
    in_flight = 1  # the slow request, admitted at 299 and completing as the 300th
    row.requests, row.failed = len(outcomes), failed
    row.delivered = usage_text(len(admitted), sum(o.tokens for o in admitted))
    row.stored, row.logs = usage_text(stored_req, stored_tok), str(logs)
    row.bound = (f"stored used {stored_req} ≤ {limit} + {in_flight} in flight; of 60 concurrent as the "
                 f"slow one ({slow_ms} ms) completed {60 - len(refused)} admitted, {len(refused)} refused 429")
    row.check(stored_req <= limit + in_flight, f"stored used {stored_req} over {limit + in_flight}")
    row.check(slow_o.delivered, f"the slow request was not delivered ({slow_o.status}/{slow_o.code})")
    row.check(sum(o.delivered for o in fill) == limit - 1, "the fill was not all delivered")
    row.check(failed == 0, f"{failed} failed: {codes(outcomes)}")
    row.check(stored_req == len(admitted) and logs == len(admitted), "stored usage or logs differ from admitted")
    row.check(code == 0, f"exit status {code}")
    return row


def fault_breaker_burst(run):
    """A burst of failures of one key (an upstream 500 after a delay), sent at once through two
    replicas, twice: each burst trips the key once, however many of its requests were in flight
    at the trip, and the second trip starts after the first one's block (DESIGN.md §11: outcomes
    of requests admitted before a trip, or that end while the key is blocked, never start the
    next trip). The key is not banned by a burst."""
    n, delay_ms = 520, run.t(1000, 3000)
    row = Row(f"burst of {n} failures of one key, twice, on two replicas")
    db = run.pg.create_db("chaos_breaker")
    res = run.write_resources("breaker", resources(run.mock.port))
    gws = [Gateway(run, f"breaker-{i}", db, res) for i in (1, 2)]
    run.mock.script({"model": SLOW_CALL, "status": 500, "delay_ms": delay_ms})
    outcomes, seen = [], []

    def burst():
        go = threading.Event()
        bursts = [Burst(g.port, n // 2, go, model=SLOW_CALL) for g in gws]
        go.set()
        for b in bursts:
            outcomes.extend(b.join(60))
        # Trips are persisted off the request path; a trip wrongly started by the burst's own
        # late outcomes would be recorded within a flush or two of the last one.
        wait_until("the burst's trip to be recorded", lambda: len(run.pg.trips(db, HOT_KEY)) > len(seen), 20)
        time.sleep(4 * CYCLE)
        seen[:] = run.pg.trips(db, HOT_KEY)

    burst()
    first = seen[:]
    wait = (first[-1][2] or math.inf) / 1000 - time.time()
    # The next burst once the block has ended (the gateways' clock is the wall clock); not after
    # a first burst that tripped the key more than once (its block is longer than the run).
    if len(first) == 1 and wait <= 60:
        time.sleep(max(0.0, wait) + 1.0)
        burst()
    codes_ = [g.terminate() for g in gws]
    trips = seen
    spacing = [(b[1] - a[1]) / 1000 for a, b in zip(trips, trips[1:])]
    after_block = all(b[1] >= (a[2] or math.inf) for a, b in zip(trips, trips[1:]))
    failed = sum(1 for o in outcomes if not o.delivered)
    row.requests, row.failed = len(outcomes), failed
    row.delivered = usage_text(len(outcomes) - failed, sum(o.tokens for o in outcomes))
    stored_req, stored_tok = run.pg.stored_usage(db, HOT_KEY)
    row.stored, row.logs = usage_text(stored_req, stored_tok), str(run.pg.logged(db, HOT_KEY))
    row.bound = (f"trips seen {len(trips)} ({len(first)} after the first burst), want 2; spacing "
                 f"{', '.join(f'{s:.1f} s' for s in spacing) or 'none'} ≥ the 30 s block; banned: "
                 f"{any(t[3] for t in trips)}; every request failed ({codes(outcomes)})")
    row.check(len(first) == 1, f"the first burst recorded {len(first)} trips: {first}")
    row.check([t[0] for t in trips] == [1, 2], f"trips recorded {[t[0] for t in trips]}, want [1, 2]")
    row.check(after_block, f"a trip started before the block of the one before ended: {trips}")
    row.check(not any(t[3] for t in trips), "a burst banned the key")
    row.check(failed == len(outcomes) and len(outcomes) % n == 0, f"{failed} of {len(outcomes)} failed")
    row.check(stored_req == 0, f"failed requests counted in usage: {stored_req}")
    row.check(codes_ == [0, 0], f"exit statuses {codes_}")
    return row


LABEL_POLICIES = "".join(f"""
[[policy]]
workspace = "chaos"
subject = "{subject}"
target = "{target}"
metric = "requests"
window = "day"
limit = 1000000000
""" for subject, target in (("end_user", "*"), ("tag", "team=*")))


def labelled_call(conn, key, user, tags):
    """[`call`] naming end user `user` (the body's `user`) with tags `tags` (`x-aigw-tags`)."""
    o = Outcome(status=None, started=time.monotonic())
    body = {"model": FAST, "user": user, "messages": [{"role": "user", "content": "chaos run, please answer"}]}
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"authorization": f"Bearer {key}", "content-type": "application/json",
                              "x-aigw-tags": tags})
        resp = conn.getresponse()
        o.status = resp.status
        data = json.loads(resp.read())
        if resp.status == 200:
            o.head, o.delivered, o.tokens = True, True, data["usage"]["total_tokens"]
        else:
            o.code = data.get("error", {}).get("code")
    except (OSError, http.client.HTTPException, ValueError, KeyError, AttributeError):
        conn.close()
    o.ended = time.monotonic()
    return o


def fault_pg_new_labels(run):
    """Postgres down while a known key brings end users and tags never seen (issue 40 item 2):
    each is served from memory under a provisional id, its `end_user = *` and `team=*` counters
    counted there; after recovery the labels are stored and their counters moved to the stored
    ids: no request fails, no label and no count is lost or counted twice."""
    users, tags = run.n(200, 500), run.n(20, 50)
    row = Row(f"Postgres down, {users} new end users and {tags} new tags")
    db = run.pg.create_db("chaos_newlabels")
    res = run.write_resources("newlabels", resources(run.mock.port) + LABEL_POLICIES)
    gw = Gateway(run, "newlabels", db, res)
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=15)
    warm = [labelled_call(conn, HOT_KEY, "known-user", "team=known") for _ in range(3)]
    conn.close()
    run.pg.stop()
    say(f"  Postgres stopped; {users} requests, each a new end user, over {tags} new tags")
    outcomes, lock, nxt = [], threading.Lock(), iter(range(users))

    def sender():
        c = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=15)
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                break
            o = labelled_call(c, HOT_KEY, f"outage-user-{i}", f"team=outage-{i % tags}")
            with lock:
                outcomes.append(o)
        c.close()

    threads = [threading.Thread(target=sender, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    run.pg.start()
    say("  Postgres started again")
    wait_until("/readyz 200 after recovery", lambda: gw.status("/readyz") == 200, 30)
    everything = warm + outcomes
    n, failed, d, tok = summary(everything)
    served = sum(1 for o in outcomes if o.delivered)

    def stored():
        labels = run.pg.psql(db, "SELECT (SELECT COUNT(*) FROM end_users WHERE end_user LIKE 'outage-user-%'), "
                                 "(SELECT COUNT(*) FROM tag_values WHERE tag_value LIKE 'outage-%')")
        counted = run.pg.psql(db, "SELECT subject, COALESCE(SUM(used), 0) FROM usage_counters WHERE metric = "
                                  "'requests' AND (subject = 'end_user' AND subject_id IN (SELECT id FROM end_users "
                                  "WHERE end_user LIKE 'outage-user-%') OR subject = 'tag' AND subject_id IN "
                                  "(SELECT id FROM tag_values WHERE tag_value LIKE 'outage-%')) GROUP BY subject")
        got = dict(line.split("|") for line in counted.splitlines() if line)
        negative = int(run.pg.psql(db, "SELECT COUNT(*) FROM usage_counters WHERE subject_id < 0"))
        u, t = (int(v) for v in labels.split("|"))
        return u, t, int(got.get("end_user", 0)), int(got.get("tag", 0)), negative

    try:
        wait_until("the new labels and their counters to be stored",
                   lambda: stored()[:4] == (served, min(served, tags), served, served), 30, every=0.25)
    except Failure:
        pass
    caught_up = settle(run, db, d, tok, timeout=30)
    s_users, s_tags, c_users, c_tags, negative = stored()
    stored_req, stored_tok = run.pg.stored_usage(db, HOT_KEY)
    logs = run.pg.logged(db, HOT_KEY)
    code = gw.terminate()
    lost = (served - c_users) + (served - c_tags)
    row.requests, row.failed = n, failed
    row.delivered, row.stored, row.logs = usage_text(d, tok), usage_text(stored_req, stored_tok), str(logs)
    row.bound = (f"0 failed ({served} served during the outage); labels stored after recovery: {s_users}/{users} "
                 f"end users, {s_tags}/{tags} tags; counters lost: {lost} (end users {c_users}, tags {c_tags} "
                 f"of {served}); provisional ids stored: {negative}; key's usage and logs = delivered")
    row.check(failed == 0, f"{failed} requests failed: {codes(everything)}")
    row.check(s_users == users and s_tags == tags, f"stored {s_users} end users, {s_tags} tags")
    row.check(lost == 0, f"end-user counters {c_users}, tag counters {c_tags}, served {served}")
    row.check(negative == 0, f"{negative} counters stored under a provisional id")
    row.check(caught_up, "stored usage or logs did not catch up with delivered within 30 s of recovery")
    row.check(code == 0, f"exit status {code}")
    return row



# ---------------------------------------------------------------------------------------------
# Redis: the quota counters' shared word (issue 44, docs/scaling.md).


class Redis:
    """A redis-server of this run only (a free port on 127.0.0.1, no persistence), reached through
    a relay that can be made slow: `slow` seconds are added before each answer is passed on."""

    def __init__(self, run, name):
        self.run, self.name = run, name
        self.dir = os.path.join(run.base, name)
        os.makedirs(self.dir, exist_ok=True)
        self.slow = 0.0
        # The relay's port first, so that the server's free port cannot be the relay's own.
        self.relay = socket.socket()
        self.relay.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.relay.bind(("127.0.0.1", 0))
        self.relay.listen(64)
        self.relay_port = self.relay.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.relay_port}/"
        self.proc = None
        # A free port can be taken by another process before redis-server binds it: a server
        # that exits at its first start is started again on another port (the relay follows).
        for attempt in range(3):
            self.port = free_port()
            if self.start(first=True):
                break
        else:
            raise Failure(f"{self.name} did not start three times: {self.log_tail()}")
        threading.Thread(target=self._accept, daemon=True).start()

    def log_tail(self):
        try:
            with open(os.path.join(self.dir, "redis.log"), "rb") as f:
                return f.read()[-400:].decode(errors="replace").strip()
        except OSError:
            return "(no log)"

    def start(self, first=False):
        """Starts the server on its port and waits for its PONG; on a first start, False when it
        exited (its port was taken), where a restart raises."""
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.access(binary, os.X_OK):
            raise Failure("redis-server is not installed (apt-get install redis-server)")
        self.proc = self.run.procs.spawn(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir], {"PATH": os.environ.get("PATH", "")}, os.path.join(self.dir, "redis.log"))
        proc = self.proc
        up = wait_until(f"{self.name} to answer",
                        lambda: "exited" if proc.poll() is not None else self.command("PING") == b"+PONG", 20)
        if up == "exited":
            if first:
                return False
            raise Failure(f"{self.name} exited at its restart: {self.log_tail()}")
        return True

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=10)

    def command(self, *words):
        """One command, straight to the server (not through the relay): its first answer line."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(f"*{len(words)}\r\n".encode() + b"".join(
                    f"${len(w)}\r\n{w}\r\n".encode() for w in words))
                return s.makefile("rb").readline().rstrip(b"\r\n")
        except OSError:
            return None

    def _accept(self):
        while True:
            try:
                client, _ = self.relay.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            for src, dst, delayed in ((client, server, False), (server, client, True)):
                threading.Thread(target=self._pipe, args=(src, dst, delayed), daemon=True).start()

    def _pipe(self, src, dst, delayed):
        try:
            while data := src.recv(65536):
                if delayed and self.slow:
                    time.sleep(self.slow)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


# How long a completed request's usage may take to reach Redis: the writer's wake-up and its
# script's round trip, on a host loaded by the gateways, the load and Postgres (a debug build in
# CI took more than 50 ms): one flush interval, still well inside the bound without Redis.
REDIS_ROUND_TRIP = FLUSH_MS / 1000


def redis_replicas(run, name, fault=None, fault_after=0.3):
    """Two gateways sharing one Redis and one database, both loaded, against one requests/day
    policy; `fault(redis)` runs once `fault_after` of the limit has been sent and returns what it
    did in words. The bound: with Redis throughout, the limit plus the requests in flight
    (docs/quotas.md); with a fault, the bound without Redis (in flight plus two flush cycles of
    both gateways' traffic), since the gateways count alone while Redis is away. Nothing fails,
    nothing stored is lost, and each gateway says once that Redis went and once that it came back."""
    limit = run.n(400, 2000)
    row = Row(name)
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    db = run.pg.create_db(f"chaos_{slug}"[:60])
    redis = Redis(run, f"redis-{slug}")
    res = run.write_resources(slug, resources(run.mock.port, requests_per_day=limit))
    gws = [Gateway(run, f"{slug}-{i}", db, res, env={"AIGW_REDIS_URL": redis.url}) for i in (1, 2)]
    per = 4
    loads = [Load(g.port, threads=per, limit=limit * 2, gateway=i).start() for i, g in enumerate(gws)]
    did = ""
    if fault:
        wait_until("the load to reach the fault", lambda: sum(len(ld.outcomes) for ld in loads) >= limit * fault_after,
                   120, every=0.01)
        did = fault(redis, gws)
    for ld in loads:
        ld.join(180)
    cycle = max(FLUSH_MS / 1000 + sum(c.get(k, 0) for k in ("quota", "own_limits", "breakers"))
                for c in (g.flush_ceilings() for g in gws))
    cycle = max(cycle, CYCLE)
    outcomes = loads[0].outcomes + loads[1].outcomes
    outputs = [g.output() for g in gws]
    codes_ = [gw.terminate() for gw in gws]
    admitted = [o for o in outcomes if o.delivered]
    refused = [o for o in outcomes if o.status == 429]
    failed = len(outcomes) - len(admitted) - len(refused)
    stored_req, stored_tok = run.pg.stored_usage(db, HOT_KEY)
    logs = run.pg.logged(db, HOT_KEY)
    in_flight = per * 2
    crossed = sorted(o.ended for o in admitted)[min(limit, len(admitted)) - 1] if admitted else 0
    together = sum(rate_before(ld.outcomes, crossed) for ld in loads)
    if fault:
        bound = limit + in_flight + math.ceil(together * 2 * cycle)
        how = f"{in_flight} in flight + 2 flush cycles ({cycle * 1000:.0f} ms each) of both gateways' {together:.0f}/s"
    else:
        # A request is in flight from its check until its usage is in Redis: the clients' own
        # requests, and those completed whose usage the writer is sending.
        bound = limit + in_flight + math.ceil(together * REDIS_ROUND_TRIP)
        how = (f"{in_flight} in flight + those completing while their usage goes to Redis (at most "
               f"{REDIS_ROUND_TRIP * 1000:.0f} ms) at {together:.0f}/s")
    row.requests, row.failed = len(outcomes), failed
    row.delivered = usage_text(len(admitted), sum(o.tokens for o in admitted))
    row.stored, row.logs = usage_text(stored_req, stored_tok), str(logs)
    row.bound = (f"{did + '; ' if did else ''}admitted {len(admitted)} ≤ {bound} = limit {limit} + {how}; "
                 f"{len(refused)} refused 429; stored = admitted")
    row.check(len(admitted) <= bound, f"admitted {len(admitted)} over the bound {bound}")
    # An emptied Redis is reseeded from each gateway's own total, which may hold usage another
    # gateway then adds again: a counter reads a little high for a moment, never low.
    low = limit - (in_flight if fault else 0)
    row.check(len(admitted) >= low, f"admitted {len(admitted)} below {low}")
    row.check(failed == 0, f"{failed} failed: {codes(outcomes)}")
    row.check(stored_req == len(admitted), "stored requests differ from admitted")
    row.check(logs == len(admitted), "logs differ from admitted")
    row.check(codes_ == [0, 0], f"exit statuses {codes_}")
    if fault and did.startswith(("killed", "slowed")):
        # Once per outage: a loaded machine may add an outage of its own (a check that waited
        # past redis_timeout_ms for the CPU), but a Redis that comes and goes with every write
        # (a slow one, before writes stopped counting as its return) says so dozens of times.
        for g, out in zip(gws, outputs):
            went, back = out.count("redis unreachable"), out.count("redis reachable again")
            row.check(1 <= went <= 3, f"{g.name} said {went} times that Redis went away (1 to 3 expected)")
            if "restarted" in did or "slowed" in did:
                # Each outage ended, but for one the load's last requests may have just begun.
                row.check(max(1, went - 1) <= back <= went,
                          f"{g.name} said {back} times that Redis came back after {went} outages")
            else:
                row.check(back == 0, f"{g.name} said Redis came back {back} times; it never did")
    return row


def fault_redis_shared(run):
    """Two replicas sharing one quota through Redis, no fault: the limit plus what is in flight."""
    return redis_replicas(run, "two replicas, one quota, Redis")


def fault_redis_killed(run):
    """Redis killed (SIGKILL) under load and not restarted: the gateways count alone."""
    def kill(redis, gws):
        redis.kill()
        return "killed Redis mid-load"
    return redis_replicas(run, "Redis killed under load", kill)


def fault_redis_restarted(run):
    """Redis killed under load and restarted empty a second later: counters reseeded, none lost."""
    def restart(redis, gws):
        redis.kill()
        time.sleep(1)
        redis.start()
        wait_until("the gateways to use Redis again",
                   lambda: all(metric_value(g, "aigw_redis_up") == 1 for g in gws), 30)
        return "killed Redis mid-load, restarted it empty 1 s later"
    return redis_replicas(run, "Redis killed and restarted under load", restart)


def fault_redis_flushed(run):
    """FLUSHALL under load: the counters come back at their next write, never lower than the truth."""
    def flush(redis, gws):
        answer = redis.command("FLUSHALL")
        if answer != b"+OK":
            raise Failure(f"FLUSHALL answered {answer!r}")
        return "FLUSHALL mid-load"
    return redis_replicas(run, "Redis flushed under load", flush)


def fault_redis_slow(run):
    """Redis answering 200 ms late (past redis_timeout_ms) for two seconds under load."""
    def slow(redis, gws):
        redis.slow = 0.2
        wait_until("the gateways to count alone", lambda: all(metric_value(g, "aigw_redis_up") == 0 for g in gws), 30)
        time.sleep(run.t(1, 3))
        redis.slow = 0.0
        wait_until("the gateways to use Redis again",
                   lambda: all(metric_value(g, "aigw_redis_up") == 1 for g in gws), 30)
        return "slowed Redis by 200 ms a reply, then restored it"
    return redis_replicas(run, "Redis slowed under load", slow)


FAULTS = [fault_kill9, fault_sigterm, fault_pg_restart, fault_pg_down, fault_log_queue, fault_two_replicas,
          fault_simultaneous_start, fault_timezones, fault_breaker_burst, fault_pg_new_labels, fault_redis_shared,
          fault_redis_killed, fault_redis_restarted, fault_redis_flushed, fault_redis_slow]


# ---------------------------------------------------------------------------------------------
# The run.


class Run:
    def __init__(self, args):
        self.short = args.short
        self.bin = os.path.abspath(args.bin)
        if not os.access(self.bin, os.X_OK):
            sys.exit(f"{self.bin} is not an executable (cargo build --release --bin aigw, or pass --bin)")
        self.base = tempfile.mkdtemp(prefix="aigw-chaos-")
        self.procs = Processes()
        self.pg = None
        self.mock = None

    def t(self, short, full):
        """A duration in seconds for the short or the full run."""
        return short if self.short else full

    n = t

    def write_resources(self, name, text):
        path = os.path.join(self.base, f"{name}.toml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def setup(self):
        self.pg = Cluster(self.base)
        self.pg.init()
        say(f"private Postgres on 127.0.0.1:{self.pg.port} in {self.pg.dir}")
        self.mock = Mock(self)

    def cleanup(self):
        self.procs.stop_all()
        if self.pg:
            self.pg.destroy()
        shutil.rmtree(self.base, ignore_errors=True)


def print_table(rows):
    print("\n| fault | requests | failed | delivered | stored usage | logs | bound | holds |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.fault} | {r.requests} | {r.failed} | {r.delivered} | {r.stored} | {r.logs} | {r.bound} | "
              f"{'yes' if r.holds else 'no'} |")
    broken = [r for r in rows if not r.holds]
    for r in broken:
        print(f"\n{r.fault}: " + "; ".join(r.notes))


def interrupted(*_):
    raise KeyboardInterrupt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "aigw"), help="the aigw binary")
    ap.add_argument("--short", action="store_true", help="smaller counts and durations (CI, under 4 minutes)")
    ap.add_argument("--only", help="comma-separated fault names to run (e.g. kill9,pg_down)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (logs) for inspection")
    args = ap.parse_args()
    faults = FAULTS
    if args.only:
        wanted = {f"fault_{n.strip()}" for n in args.only.split(",")}
        faults = [f for f in FAULTS if f.__name__ in wanted]
        if not faults:
            sys.exit(f"no fault named {args.only}; the faults: "
                     + ", ".join(f.__name__.removeprefix("fault_") for f in FAULTS))

    # SIGTERM (from CI, say) ends the run like Ctrl-C: through the cleanup below.
    signal.signal(signal.SIGTERM, interrupted)
    run = Run(args)
    started = time.monotonic()
    rows = []
    try:
        run.setup()
        for fault in faults:
            say(fault.__name__.removeprefix("fault_"))
            run.mock.reset()
            try:
                row = fault(run)
                row.holds = not row.notes
            except Failure as e:
                row = Row(fault.__name__.removeprefix("fault_"), bound=f"could not run: {str(e).splitlines()[0]}")
                row.notes.append(str(e))
            run.procs.stop_all(keep=[run.mock.proc])
            rows.append(row)
            say(f"  {'holds' if row.holds else 'BROKEN: ' + '; '.join(row.notes)}")
    except KeyboardInterrupt:
        say("interrupted; cleaning up")
        run.cleanup()
        sys.exit(130)
    finally:
        if args.keep and run.base:
            say(f"kept {run.base}")
            run.procs.stop_all()
            if run.pg:
                run.pg.destroy()
        else:
            run.cleanup()
    print_table(rows)
    mode = "--short" if args.short else "full"
    print(f"\n{mode} run of {os.path.relpath(run.bin, ROOT)} in {time.monotonic() - started:.0f} s")
    sys.exit(0 if rows and all(r.holds for r in rows) else 1)


if __name__ == "__main__":
    main()
