#!/usr/bin/env python3
"""What Redis spends per request (docs/redis.md, "What Redis spends"): a redis-server of this run
only (a free port on 127.0.0.1, no persistence), the mock upstream and one release gateway with
four quota policies on its key sharing its counters through that Redis; REQUESTS non-streamed
requests on four connections, then Redis's own figures around the load: calls and time per
command (`INFO commandstats`), its CPU (`INFO cpu`), and the memory of 100,000 counters.

    cargo build --release --bin aigw && python3 bench/redis_cost.py [--requests 20000]
    cargo build --release --bin aigw --example probe && python3 bench/redis_cost.py --latency 4

With --latency ROUNDS: instead, what the round trip adds to a request at one connection: two
gateways with the four policies, one sharing its counters through Redis and one not, timed in
alternation by bench/probe.rs (3 s each, ROUNDS times); the p50 of each round and their medians,
and in each round the floor of this host: Redis's own client's round trip (`redis-benchmark`).

Needs redis-server, redis-cli and redis-benchmark (Debian's redis-server and redis-tools). Traffic goes to 127.0.0.1 only.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as R  # noqa: E402  (the proxy benchmark's gateway and load helpers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20000, help="requests sent (default 20000)")
    ap.add_argument("--latency", type=int, metavar="ROUNDS", default=0,
                    help="the p50 added at one connection, with against without Redis, in alternation")
    args = ap.parse_args()
    for tool in ("redis-server", "redis-cli", "redis-benchmark"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed (apt-get install redis-server)")
    if not os.path.exists(R.BIN):
        sys.exit(f"{R.BIN} is missing: cargo build --release --bin aigw")
    if args.latency:
        return added_latency(args.latency)
    n = args.requests
    with tempfile.TemporaryDirectory() as tmp:
        redis, port = R.start_redis(tmp)
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
        pipe = "".join(f"SET aigw:{{quota:1}}:apikey:{100000 + i}:requests:day:1764979200 1234 EX 86700\n"
                       for i in range(100000))
        subprocess.run(["redis-cli", "-p", str(port), "--pipe"], input=pipe.replace("\n", "\r\n"), text=True,
                       capture_output=True, check=True)
        after = int(cli("INFO", "memory").split("used_memory:")[1].split()[0])
        print(f"Memory per counter: {(after - before) / 100000:.0f} B (100,000 counters)")
        redis.kill()
        redis.wait()


def added_latency(rounds):
    """Two gateways with the four policies, one with Redis; one connection each in turn."""
    if not os.path.exists(R.PROBE):
        sys.exit(f"{R.PROBE} is missing: cargo build --release --example probe")
    with tempfile.TemporaryDirectory() as tmp:
        redis, port = R.start_redis(tmp)
        mock_port = R.free_port()
        mock = subprocess.Popen([R.BIN, "mock-upstream", "--no-record", "--listen", f"127.0.0.1:{mock_port}"],
                                stdout=subprocess.DEVNULL)
        gws = []
        try:
            R.wait_ready(f"http://127.0.0.1:{mock_port}/__mock/calls", mock)
            gws.append(R.start_gateway(tmp, mock_port, 4, name="alone"))
            gws.append(R.start_gateway(tmp, mock_port, 4, name="redis",
                                       env={"AIGW_REDIS_URL": f"redis://127.0.0.1:{port}/0"}))
            body = R.chat_body(False)
            urls = [f"http://127.0.0.1:{p}/v1/chat/completions" for _, p in gws]
            for (gw, p), url in zip(gws, urls):
                R.wait_ready(f"http://127.0.0.1:{p}/readyz", gw)
                R.wrk(url, R.KEY, body, 4, 2)
            p50 = ([], [], [])
            for _ in range(rounds):
                for i, url in enumerate(urls):
                    p50[i].append(R.probe(url, R.KEY, body, 3)["p50"])
                p50[2].append(floor(port))
        finally:
            for gw, _ in gws:
                gw.terminate()
                gw.wait(timeout=20)
            mock.terminate()
            mock.wait(timeout=20)
            redis.kill()
            redis.wait()
    alone, shared, own = (statistics.median(v) for v in p50)
    print(f"# the round trip's cost at one connection ({rounds} rounds of 3 s, four policies, in alternation)\n")
    print("| | p50 of each round, µs | median |")
    print("|---|---|---|")
    print(f"| without Redis | {', '.join(map(str, p50[0]))} | {alone:.0f} |")
    print(f"| with Redis | {', '.join(map(str, p50[1]))} | {shared:.0f} |")
    print(f"| Redis's own round trip (`redis-benchmark -c 1 -t get`) | {', '.join(map(str, p50[2]))} | {own:.0f} |")
    print(f"\nadded at p50: {shared - alone:.0f} µs, of which Redis's own round trip on this host {own:.0f} µs"
          f" and the gateway's part {shared - alone - own:.0f} µs")


def floor(port):
    """The p50 of one `GET` round trip at one connection from Redis's own C client, in µs: what
    no client of this host can go under."""
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-c", "1", "-n", "20000", "-t", "get", "-q"],
                         capture_output=True, text=True, check=True).stdout
    # The last line: "GET: 13253.81 requests per second, p50=0.071 msec".
    msec = out.strip().splitlines()[-1].split("p50=")[1].split()[0]
    return round(float(msec) * 1000)


if __name__ == "__main__":
    main()
