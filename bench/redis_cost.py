#!/usr/bin/env python3
"""What Redis spends per request (docs/redis.md, "What Redis spends"): a redis-server of this run
only (a free port on 127.0.0.1, no persistence), the mock upstream and one release gateway with
four quota policies on its key sharing its counters through that Redis; REQUESTS non-streamed
requests on four connections, then Redis's own figures around the load: calls and time per
command (`INFO commandstats`), its CPU (`INFO cpu`), and the memory of 100,000 counters.

    cargo build --release --bin aigw && python3 bench/redis_cost.py [--requests 20000]

Needs redis-server and redis-cli (Debian's redis-server package). Traffic goes to 127.0.0.1 only.
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as R  # noqa: E402  (the proxy benchmark's gateway and load helpers)


def start_redis(tmp):
    port = R.free_port()
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20000, help="requests sent (default 20000)")
    args = ap.parse_args()
    for tool in ("redis-server", "redis-cli"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed (apt-get install redis-server)")
    if not os.path.exists(R.BIN):
        sys.exit(f"{R.BIN} is missing: cargo build --release --bin aigw")
    n = args.requests
    with tempfile.TemporaryDirectory() as tmp:
        redis, port = start_redis(tmp)
        mock_port = R.free_port()
        mock = subprocess.Popen([R.BIN, "mock-upstream", "--no-record", "--listen", f"127.0.0.1:{mock_port}"],
                                stdout=subprocess.DEVNULL)
        gw = None
        try:
            cli = lambda *a: subprocess.run(["redis-cli", "-p", str(port), *a], capture_output=True,  # noqa: E731
                                            text=True, check=True).stdout
            R.wait_ready(f"http://127.0.0.1:{mock_port}/__mock/calls", mock)
            gw, gw_port = R.start_gateway(tmp, mock_port, 4, env={"AIGW_REDIS_URL": f"redis://127.0.0.1:{port}/0"})
            R.wait_ready(f"http://127.0.0.1:{gw_port}/readyz", gw)
            R.send_exactly(gw_port, "/v1/chat/completions", R.chat_body(False), 500)  # warm-up
            time.sleep(0.5)
            cli("CONFIG", "RESETSTAT")

            def cpu():
                d = dict(line.split(":") for line in cli("INFO", "cpu").splitlines()
                         if line.startswith(("used_cpu_sys:", "used_cpu_user:")))
                return float(d["used_cpu_sys"]) + float(d["used_cpu_user"])
            cpu0, t0 = cpu(), time.time()
            if R.send_exactly(gw_port, "/v1/chat/completions", R.chat_body(False), n):
                sys.exit("some requests failed")
            elapsed = time.time() - t0
            time.sleep(0.3)  # the writer's last script
            spent = cpu() - cpu0
            print(f"# Redis per request: {n:,} requests in {elapsed:.1f} s ({n / elapsed:,.0f}/s), four policies\n")
            print("| command | calls per request | µs per call | µs per request |")
            print("|---|---|---|---|")
            for line in cli("INFO", "commandstats").splitlines():
                # The commands the gateway sends; those the script runs inside it are in its time.
                if not line.startswith(("cmdstat_mget:", "cmdstat_evalsha:", "cmdstat_publish:")):
                    continue
                name, fields = line.split(":", 1)
                f = dict(kv.split("=") for kv in fields.split(","))
                calls, usec = int(f["calls"]), int(f["usec"])
                print(f"| {name.removeprefix('cmdstat_')} | {calls / n:.2f} | {float(f['usec_per_call']):.2f} | "
                      f"{usec / n:.2f} |")
            print(f"\nRedis CPU, network included: {spent * 1e6 / n:.1f} µs per request")
        finally:
            for p in (gw, mock):
                if p:
                    p.terminate()
                    p.wait(timeout=20)
        # Memory of 100,000 counters shaped as the gateway names them, each with its expiry.
        cli("FLUSHALL")
        before = int(cli("INFO", "memory").split("used_memory:")[1].split()[0])
        pipe = "".join(f"SET aigw:{{quota}}:apikey:{100000 + i}:requests:day:1764979200 1234 EX 86700\n"
                       for i in range(100000))
        subprocess.run(["redis-cli", "-p", str(port), "--pipe"], input=pipe.replace("\n", "\r\n"), text=True,
                       capture_output=True, check=True)
        after = int(cli("INFO", "memory").split("used_memory:")[1].split()[0])
        print(f"Memory per counter: {(after - before) / 100000:.0f} B (100,000 counters)")
        redis.kill()
        redis.wait()


if __name__ == "__main__":
    main()
