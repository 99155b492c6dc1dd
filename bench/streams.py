#!/usr/bin/env python3
"""Many long streams: holds 1,000, 5,000 and 10,000 streamed chat completions open at once, each on
its own connection, direct to the mock upstream and through a release aigw, in the same run.

The mock paces every stream (`chunk_delay_ms` and `chunk_jitter_ms` of its script): 50 events,
20–50 ms apart at 1,000 streams. Above 1,000 the pace slows in proportion (100–250 ms at 5,000,
200–500 ms at 10,000), so that every size sends the same ~28,000 events a second: on 2 shared
cores, 285,000 events a second would measure the machine, not the memory and latency of holding
streams. bench/streams.rs opens the streams (ramped at --rate a second) and times every event.

Prints, per size and path: streams completed, errors, most open at once, time to first event
p50/p99, gap between events p99; for aigw, the added TTFB and gap (aigw minus direct, same run),
its CPU time per stream and per event (from /proc/PID/stat), and its RSS per thousand open streams
(peak RSS while they are held minus RSS at rest, after a warm-up). Usage:

    cargo build --release --bin aigw --example streams && python3 bench/streams.py
    python3 bench/streams.py --sizes 1000 [--events 50] [--gap-ms 20-50] [--rate 2000]
    python3 bench/streams.py --short --bin target/debug/aigw   # smoke test, seconds (.ci/run)
    python3 bench/streams.py --sizes 1000 --peers portkey,litellm [--install-peers]
    python3 bench/streams.py --upstream h2      # aigw to the mock over TLS and HTTP/2

`--upstream h2` has aigw reach the mock as the large providers are reached: over TLS, HTTP/2
negotiated by ALPN, up to 100 streams a connection (the mock's TLS listener, its certificate
signed by a CA made with `openssl`, the CA given to aigw as `upstream_ca_file`). The direct path
stays plain HTTP/1.1 (the load generator speaks nothing else), so aigw's figures include TLS.

`--peers` also runs the same load, in the same run, through other gateways pointed at the same
mock and reports the same figures for each (CPU and RSS of its whole process tree): Portkey's
gateway (npm `@portkey-ai/gateway`, run with node) and the LiteLLM proxy (PyPI `litellm[proxy]`,
one uvicorn worker). They are looked for under --peers-dir (default ~/.cache/aigw-bench), never
in the repository; a peer that is not installed there, or does not start, is skipped with a
message. `--install-peers` installs them there first (npm and pip, pinned versions); nothing is
installed without it. A peer whose streams fail is reported, not fatal: that is the finding.

Raises RLIMIT_NOFILE as far as allowed (a stream through aigw holds two sockets in aigw).
Traffic goes to 127.0.0.1 only.
"""

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
from run import CRED, KEY, RESOURCES, TICK, chat_body, cpu_seconds, free_port, wait_ready  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every stream through aigw holds one client and one upstream connection: the default caps
# (10,000 client connections, 4,096 upstream connections per host) are raised above the largest size
# (and within what a hard open-file limit of 20,000 allows without a warning).
GATEWAY_ENV = {"AIGW_MAX_CLIENT_CONNECTIONS": "12000", "AIGW_MAX_UPSTREAM_CONNECTIONS_PER_HOST": "12000"}


def raise_nofile():
    """Raises this process's open-file limit (inherited by everything it starts) as far as it may."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        with open("/proc/sys/fs/nr_open") as f:
            ceiling = int(f.read())
    except OSError:
        ceiling = hard
    for want in (ceiling, 262144, 65536, hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), max(hard, want)))
            break
        except (ValueError, OSError):
            continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def tree(pid):
    """`pid` and every process descended from it (a peer's workers and helpers)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def tree_rss_kib(pid):
    total = 0
    for p in tree(pid):
        try:
            total += rss_kib(p)
        except OSError:
            pass
    return total


def tree_cpu_seconds(pid):
    """CPU time of a process tree: the live processes' own, plus what the root's reaped children
    used (cutime, cstime)."""
    total = 0.0
    for p in tree(pid):
        try:
            total += cpu_seconds(p)
        except OSError:
            pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[13]) + int(fields[14])) / TICK
    except (OSError, IndexError, ValueError):
        pass
    return total


class PeakRss:
    """Samples a process's RSS every 20 ms in a thread while the block runs; `.peak` is the most.
    With `whole_tree`, the RSS summed over the process and its descendants (listed once a second)."""

    def __init__(self, pid, whole_tree=False):
        self.pid, self.peak, self._stop, self.whole_tree = pid, 0, threading.Event(), whole_tree

    def __enter__(self):
        def sample():
            pids, listed = [self.pid], 0.0
            while not self._stop.is_set():
                if self.whole_tree and time.time() - listed > 1.0:
                    pids, listed = tree(self.pid), time.time()
                total = 0
                for p in pids:
                    try:
                        total += rss_kib(p)
                    except OSError:
                        pass
                self.peak = max(self.peak, total)
                time.sleep(0.02)
        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status


def pace(mock_port, events, gap_lo, gap_hi):
    """Scripts every call to the mock: `events` events (role, words, finish, [DONE]), the first
    `gap_lo` ms after the head, the rest gap_lo..gap_hi ms apart."""
    post(f"http://127.0.0.1:{mock_port}/__mock/reset", {})
    post(f"http://127.0.0.1:{mock_port}/__mock/script",
         {"words": max(events - 3, 1), "chunk_delay_ms": gap_lo, "chunk_jitter_ms": gap_hi - gap_lo})


# With --pin: the CPUs of the gateway, and of the mock and the load generator (None: any).
PIN = {"gateway": None, "others": None}


def pinned(role):
    """A preexec_fn that keeps the child on its role's CPUs (--pin), or None."""
    cpus = PIN[role]
    return None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))


def load(gen, port, key, count, rate, headers=()):
    """Runs the load generator; returns its STREAMS line as a dict of numbers (errors_by as text)."""
    done = subprocess.run([gen, f"127.0.0.1:{port}", "/v1/chat/completions", key, str(count), str(rate), *headers],
                          input=chat_body(True), capture_output=True, text=True, preexec_fn=pinned("others"))
    m = re.search(r"STREAMS (.*)", done.stdout)
    if done.returncode != 0 or not m:
        sys.exit(f"the load generator failed against 127.0.0.1:{port}:\n{done.stdout}{done.stderr}")
    r = dict(kv.split("=", 1) for kv in m.group(1).split())
    return {k: (v if k == "errors_by" else int(v)) for k, v in r.items()}


def company_ca(tmp):
    """A CA and a certificate for `localhost` it signed (PEM files, made with openssl), as a
    company's own CA would: (CA, certificate, key)."""
    ca, ca_key = os.path.join(tmp, "ca.pem"), os.path.join(tmp, "ca-key.pem")
    cert, key, csr = (os.path.join(tmp, f) for f in ("mock-cert.pem", "mock-key.pem", "mock.csr"))
    ext = os.path.join(tmp, "mock.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    for cmd in (["req", "-x509", *ec, "-days", "1", "-subj", "/CN=bench CA", "-keyout", ca_key, "-out", ca],
                ["req", *ec, "-subj", "/CN=localhost", "-keyout", key, "-out", csr],
                ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "1",
                 "-extfile", ext, "-out", cert]):
        made = subprocess.run(["openssl", *cmd], capture_output=True, text=True)
        if made.returncode != 0:
            sys.exit(f"--upstream h2 needs openssl to make a certificate:\n{made.stderr}")
    return ca, cert, key


def start_gateway(binary, tmp, mock_port, tls=None):
    """aigw on the mock: plain HTTP/1.1 to `mock_port`, or with `tls` = (port, CA file) over TLS
    (HTTP/2) to https://localhost:PORT."""
    port = free_port()
    home = os.path.join(tmp, "gw")
    os.makedirs(home)
    res = os.path.join(home, "resources.toml")
    resources = RESOURCES.format(key=KEY, mock=mock_port, cred=CRED).replace(
        "max_in_flight = 1024", "max_in_flight = 100000")
    if tls:
        resources = resources.replace(f"http://127.0.0.1:{mock_port}/v1", f"https://localhost:{tls[0]}/v1")
    with open(res, "w") as f:
        f.write(resources)
    # Settings given to this script (AIGW_IDLE_POLL_US=0 …) and allocator options pass through;
    # the script's own come last and win.
    passed = {k: v for k, v in os.environ.items() if k.startswith(("AIGW_", "MIMALLOC_"))}
    env = {**passed, "PATH": os.environ.get("PATH", ""), "AIGW_LISTEN": f"127.0.0.1:{port}",
           "AIGW_DATABASE_URL": f"sqlite://{home}/aigw.db", "AIGW_LOG": "warn",
           "AIGW_BOOTSTRAP_PASSWORD": "bench-owner-pass", **GATEWAY_ENV}
    if tls:
        env["AIGW_UPSTREAM_CA_FILE"] = tls[1]
    gw = subprocess.Popen([binary, "serve", "--resources", res], env=env, cwd=home,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=pinned("gateway"))
    return gw, port


def measure(gen, pid, port, key, n, rate, headers=(), whole_tree=False):
    """One path's load; adds the CPU time its process (or tree) spent and its peak RSS (KiB)."""
    cpu = tree_cpu_seconds if whole_tree else cpu_seconds
    cpu0 = cpu(pid)
    with PeakRss(pid, whole_tree) as peak:
        r = load(gen, port, key, n, rate, headers)
    # A process that died during the run reads as no CPU: its row then says it fell over.
    r["cpu"], r["peak_rss"] = max(cpu(pid) - cpu0, 0.0), peak.peak
    return r


def warm_up(gen, pid, port, key, mock_port, headers=(), whole_tree=False):
    """Warms a gateway up (caches, the first page faults, the log writer), lets it settle, and
    returns its RSS at rest (KiB)."""
    pace(mock_port, 10, 1, 2)
    load(gen, port, key, 100, 1000, headers)
    time.sleep(1.0)
    return tree_rss_kib(pid) if whole_tree else rss_kib(pid)


def run_peer(peer, gen, tmp, mock_port, n, rate, events, lo, hi):
    """Starts a peer alone, warms it up, runs the size through it and stops it. Returns its result
    (with `rest`), or None when it did not start; notes in `result["fell_over"]` how it failed."""
    port = free_port()
    try:
        proc, log, key, headers = peer.start(tmp, port, mock_port, CRED, KEY)
    except peers.PeerUnavailable as e:
        print(f"{peer.name}: skipped at {n:,} streams, it did not start: {e}", file=sys.stderr)
        return None
    try:
        rest = warm_up(gen, proc.pid, port, key, mock_port, headers, whole_tree=True)
        pace(mock_port, events, lo, hi)
        r = measure(gen, proc.pid, port, key, n, rate, headers, whole_tree=True)
        r["rest"], r["fell_over"] = rest, None
        if proc.poll() is not None:
            r["fell_over"] = f"exited with code {proc.returncode} during the run"
        elif r["errors"]:
            r["fell_over"] = f"{r['errors']} errors ({r['errors_by']})"
        if r["fell_over"]:
            print(f"{peer.name} at {n:,} streams: {r['fell_over']}; the end of its log:\n{peers.tail(log)}",
                  file=sys.stderr)
        return r
    finally:
        peers.stop(proc)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "aigw"))
    ap.add_argument("--gen", default=None, help="the load generator (default: beside --bin, examples/streams)")
    ap.add_argument("--sizes", default="1000,5000,10000", help="stream counts, comma-separated")
    ap.add_argument("--events", type=int, default=50, help="events per stream")
    ap.add_argument("--gap-ms", default="20-50", help="gap between events at --per streams (ms, LO-HI)")
    ap.add_argument("--per", type=int, default=1000, help="above this many streams the gap grows in proportion")
    ap.add_argument("--rate", type=int, default=2000, help="new streams a second during the ramp")
    ap.add_argument("--short", action="store_true", help="smoke test: 50 streams of 10 events, 5-10 ms apart")
    ap.add_argument("--upstream", choices=["http1", "h2"], default="http1",
                    help="how aigw reaches the mock: plain HTTP/1.1, or TLS and HTTP/2 as the providers")
    ap.add_argument("--pin", action="store_true",
                    help="the gateway on a core of its own (the last), the mock and the load generator on the others")
    ap.add_argument("--peers", default="", help="other gateways to run the same load through: portkey,litellm")
    ap.add_argument("--peers-dir", default=peers.DEFAULT_DIR, help="where the peers are installed")
    ap.add_argument("--install-peers", action="store_true", help="install missing --peers into --peers-dir first")
    args = ap.parse_args()
    if args.short:
        args.sizes, args.events, args.gap_ms = "50", 10, "5-10"
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            sys.exit("--pin needs two CPUs or more")
        PIN["gateway"], PIN["others"] = {cpus[-1]}, set(cpus[:-1])
    args.bin = os.path.abspath(args.bin)
    gen = os.path.abspath(args.gen or os.path.join(os.path.dirname(args.bin), "examples", "streams"))
    for path in (args.bin, gen):
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: cargo build --release --bin aigw --example streams")
    sizes = [int(s) for s in args.sizes.split(",")]
    gap_lo, gap_hi = (int(x) for x in args.gap_ms.split("-"))
    others = peers.chosen(args.peers, args.peers_dir, args.install_peers)
    nofile = raise_nofile()
    # Over HTTP/1.1 a stream holds a client and an upstream socket in aigw; over HTTP/2 the
    # upstream sockets are one per 100 streams.
    sockets = max(sizes) * 2 if args.upstream == "http1" else max(sizes) + max(sizes) // 100 + 1
    if nofile < sockets + 100:
        print(f"warning: RLIMIT_NOFILE is {nofile}; aigw needs {sockets} sockets and its own files",
              file=sys.stderr)

    load_before = os.getloadavg()
    tmp = tempfile.mkdtemp(prefix="aigw-streams-")
    mock_port = free_port()
    mock_cmd = [args.bin, "mock-upstream", "--no-record", "--listen", f"127.0.0.1:{mock_port}"]
    tls = None
    if args.upstream == "h2":
        ca, cert, key = company_ca(tmp)
        tls = (free_port(), ca)
        mock_cmd += ["--tls-listen", f"127.0.0.1:{tls[0]}", "--tls-cert", cert, "--tls-key", key]
    mock = subprocess.Popen(mock_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=pinned("others"))
    gw, rows, failed = None, [], []
    try:
        gw, gw_port = start_gateway(args.bin, tmp, mock_port, tls)
        wait_ready(f"http://127.0.0.1:{mock_port}/__mock/calls", mock)
        wait_ready(f"http://127.0.0.1:{gw_port}/readyz", gw)
        rest = warm_up(gen, gw.pid, gw_port, KEY, mock_port)
        mock_rest = rss_kib(mock.pid)
        for n in sizes:
            scale = max(1.0, n / args.per)
            lo, hi = round(gap_lo * scale), round(gap_hi * scale)
            pace(mock_port, args.events, lo, hi)
            with PeakRss(mock.pid) as mock_peak:
                direct = load(gen, mock_port, CRED, n, args.rate)
            through = measure(gen, gw.pid, gw_port, KEY, n, args.rate)
            through["rest"], through["fell_over"] = rest, None
            paths = [("aigw", through)]
            for peer in others:
                r = run_peer(peer, gen, tmp, mock_port, n, args.rate, args.events, lo, hi)
                if r is not None:
                    paths.append((peer.name, r))
            rows.append((n, lo, hi, direct, paths, mock_peak.peak))
            for path, r in (("direct", direct), ("aigw", through)):
                if r["errors"]:
                    failed.append(f"{n} streams {path}: {r['errors']} errors ({r['errors_by']})")
    finally:
        for p in (p for p in (gw, mock) if p):
            p.terminate()
            p.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()

    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    upstream = "TLS and HTTP/2" if tls else "HTTP/1.1"
    pin = (f", aigw pinned to CPU {min(PIN['gateway'])}, the mock and the generator to the others"
           if args.pin else "")
    print(f"# many long streams ({rev}, {args.bin}, {args.events} events a stream, ramp {args.rate}/s, "
          f"aigw to the mock over {upstream}, {os.cpu_count()} cores, RLIMIT_NOFILE {nofile}{pin}; "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after)\n")
    if others:
        print("peers: " + ", ".join(f"{p.name} {p.version()}" for p in others) + "\n")
    print("| streams | gap | path | completed | errors | most open | TTFB p50 | TTFB p99 | gap p99 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, lo, hi, direct, paths, _ in rows:
        for path, r in [("direct", direct), *paths]:
            print(f"| {n:,} | {lo}–{hi} ms | {path} | {r['completed']:,} | {r['errors']} | {r['peak_open']:,} | "
                  f"{r['ttfb_p50'] / 1000:.2f} ms | {r['ttfb_p99'] / 1000:.2f} ms | {r['gap_p99'] / 1000:.2f} ms |")
    print()
    print("| streams | path | added TTFB p50 | added TTFB p99 | added gap p99 | CPU per stream | per event "
          "| RSS per 1,000 open | per open stream | the mock's, direct |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n, _, _, direct, paths, mock_peak in rows:
        mock_k = (mock_peak - mock_rest) / max(direct["peak_open"], 1) * 1000 / 1024
        for path, r in paths:
            per_k = (r["peak_rss"] - r["rest"]) / max(r["peak_open"], 1) * 1000 / 1024
            print(f"| {n:,} | {path} | {(r['ttfb_p50'] - direct['ttfb_p50']) / 1000:.2f} ms | "
                  f"{(r['ttfb_p99'] - direct['ttfb_p99']) / 1000:.2f} ms | "
                  f"{(r['gap_p99'] - direct['gap_p99']) / 1000:.2f} ms | "
                  f"{r['cpu'] / max(r['completed'], 1) * 1e6:,.0f} µs | {r['cpu'] / max(r['events'], 1) * 1e6:.1f} µs | "
                  f"{per_k:.1f} MiB | {per_k * 1024 / 1000:.1f} KiB | {mock_k * 1024 / 1000:.1f} KiB |")
    print()
    for name in ["aigw", *(p.name for p in others)]:
        ran = [(n, r) for n, _, _, _, paths, _ in rows for path, r in paths if path == name]
        if ran:
            print(f"{name} RSS at rest {ran[0][1]['rest'] / 1024:.1f} MiB; peak "
                  f"{max(r['peak_rss'] for _, r in ran) / 1024:.1f} MiB")
    fell = [f"{path} at {n:,} streams: {r['fell_over']}" for n, _, _, _, paths, _ in rows
            for path, r in paths if path != "aigw" and r["fell_over"]]
    if fell:
        print("\npeers that failed streams: " + "; ".join(fell))
    if failed:
        sys.exit("errors: " + "; ".join(failed))


if __name__ == "__main__":
    main()
