"""Other gateways run beside aigw by bench/streams.py --peers: where each is installed (outside the
repository), how to install it, start it against the mock upstream, and route a stream through it.

- portkey: Portkey's open-source gateway, npm `@portkey-ai/gateway`, run with node. It is routed
  per request: `x-portkey-provider: openai` and `x-portkey-custom-host: http://127.0.0.1:MOCK/v1`,
  the client's bearer token passed on to the upstream. Installed with `@hono/node-server` held
  at 1.13.5 (the version the gateway's own repository patches and builds with): with a newer
  one, which npm picks by default, every streamed answer fails with `TypeError: immutable` and
  a 500 (Portkey-AI/gateway issue 1389). Its HTTP server and fetch client have no connection
  caps to raise. It listens on all addresses (the port is its only setting); traffic stays on
  127.0.0.1.
- litellm: the LiteLLM proxy, PyPI `litellm[proxy]`, in its own venv, one uvicorn worker
  (`--num_workers 1`), a config.yaml naming `openai/gpt-4o-mini` at the mock's `api_base`, a
  master key (it refuses to start without one) and no database. Its connection pool to an
  upstream is capped at 500 per host and 1,000 in all by default; both are raised to 12,000
  (`AIOHTTP_CONNECTOR_LIMIT_PER_HOST`, `AIOHTTP_CONNECTOR_LIMIT`), like aigw's caps. The model
  cost map is read from the package (`LITELLM_LOCAL_MODEL_COST_MAP`), not fetched.

Each peer's output goes to a log file in the run's temporary folder; on a failed start its tail
is printed.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

PORTKEY_VERSION = "1.15.2"
HONO_NODE_SERVER = "1.13.5"
LITELLM_VERSION = "1.108.7"
DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "aigw-bench")
# The caps on a peer's connections, raised as aigw's are in bench/streams.py (GATEWAY_ENV).
CONNECTIONS = "12000"


class Peer:
    """One gateway to compare. `start(tmp, port, mock_port, cred, key)` returns the running process,
    its log file, and the bearer token and extra headers for the load generator, or raises
    PeerUnavailable."""

    name = ""

    def __init__(self, root):
        self.dir = os.path.join(root, self.name)

    def version(self):
        return "?"


class PeerUnavailable(Exception):
    pass


def wait_up(url, proc, log, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise PeerUnavailable(f"exited with code {proc.returncode} while starting:\n{tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except Exception:
            time.sleep(0.2)
    raise PeerUnavailable(f"{url} not answering after {timeout} s:\n{tail(log)}")


def tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def spawn(cmd, log, cwd, env):
    out = open(log, "w")
    try:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    finally:
        out.close()


class Portkey(Peer):
    name = "portkey"

    def entry(self):
        return os.path.join(self.dir, "node_modules", "@portkey-ai", "gateway", "build", "start-server.js")

    def missing(self):
        if not shutil.which("node"):
            return "node is not on PATH"
        if not os.path.exists(self.entry()):
            return f"{self.entry()} is missing"
        return None

    def version(self):
        try:
            with open(os.path.join(os.path.dirname(os.path.dirname(self.entry())), "package.json")) as f:
                return json.load(f)["version"]
        except (OSError, ValueError, KeyError):
            return "?"

    def install(self):
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, "package.json"), "w") as f:
            json.dump({"name": "aigw-bench-portkey", "private": True,
                       "dependencies": {"@portkey-ai/gateway": PORTKEY_VERSION},
                       "overrides": {"@hono/node-server": HONO_NODE_SERVER}}, f, indent=2)
        return subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=self.dir).returncode == 0

    def start(self, tmp, port, mock_port, cred, key):
        log = os.path.join(tmp, "portkey.log")
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/root"),
               "NODE_ENV": "production"}
        proc = spawn(["node", self.entry(), f"--port={port}", "--headless"], log, self.dir, env)
        try:
            wait_up(f"http://127.0.0.1:{port}/", proc, log, 60)
        except PeerUnavailable:
            stop(proc)
            raise
        headers = ["x-portkey-provider: openai", f"x-portkey-custom-host: http://127.0.0.1:{mock_port}/v1"]
        return proc, log, cred, headers


class LiteLLM(Peer):
    name = "litellm"

    def exe(self):
        return os.path.join(self.dir, "bin", "litellm")

    def missing(self):
        return None if os.path.exists(self.exe()) else f"{self.exe()} is missing"

    def version(self):
        found = glob.glob(os.path.join(self.dir, "lib", "python*", "site-packages", "litellm-*.dist-info"))
        return os.path.basename(found[0])[len("litellm-"):-len(".dist-info")] if found else "?"

    def install(self):
        if subprocess.run([sys.executable, "-m", "venv", self.dir]).returncode != 0:
            return False
        pip = os.path.join(self.dir, "bin", "pip")
        return subprocess.run([pip, "install", f"litellm[proxy]=={LITELLM_VERSION}"]).returncode == 0

    def start(self, tmp, port, mock_port, cred, key):
        log = os.path.join(tmp, "litellm.log")
        config = os.path.join(tmp, "litellm.yaml")
        with open(config, "w") as f:
            f.write("model_list:\n"
                    "  - model_name: gpt-4o-mini\n"
                    "    litellm_params:\n"
                    "      model: openai/gpt-4o-mini\n"
                    f"      api_base: http://127.0.0.1:{mock_port}/v1\n"
                    f"      api_key: {cred}\n"
                    "general_settings:\n"
                    f"  master_key: {key}\n")
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/root"),
               "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
               "AIOHTTP_CONNECTOR_LIMIT": CONNECTIONS, "AIOHTTP_CONNECTOR_LIMIT_PER_HOST": CONNECTIONS}
        proc = spawn([self.exe(), "--config", config, "--host", "127.0.0.1", "--port", str(port),
                      "--num_workers", "1"], log, tmp, env)
        try:
            # Imports and the proxy's start take 10-30 s on a busy 2-core host.
            wait_up(f"http://127.0.0.1:{port}/health/liveliness", proc, log, 180)
        except PeerUnavailable:
            stop(proc)
            raise
        return proc, log, key, []


def stop(proc):
    """Ends a peer (SIGTERM, then SIGKILL after 20 s) and waits for it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


KNOWN = {"portkey": Portkey, "litellm": LiteLLM}


def chosen(names, root, install):
    """The peers asked for that are installed (installing them first with `install`); prints why
    each other one is skipped."""
    peers = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name not in KNOWN:
            sys.exit(f"--peers: unknown peer {name!r} (known: {', '.join(KNOWN)})")
        peer = KNOWN[name](root)
        if install and peer.missing():
            print(f"{name}: installing into {peer.dir}", file=sys.stderr)
            if not peer.install():
                print(f"{name}: skipped, the install into {peer.dir} failed", file=sys.stderr)
                continue
        why = peer.missing()
        if why:
            print(f"{name}: skipped, not installed ({why}); --install-peers installs it into {peer.dir}",
                  file=sys.stderr)
            continue
        peers.append(peer)
    return peers
