"""Starts `aigw mock-upstream` and `aigw serve` (the binary from AIGW_BIN, default
target/debug/aigw) on free ports with a fresh SQLite database and a resources file, for the tests
of the official SDKs and client helpers, and for bench/herd.py."""

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from contextlib import contextmanager

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("AIGW_BIN", os.path.join(ROOT, "target", "debug", "aigw"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, proc, what, log):
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            with open(log) as f:
                raise RuntimeError(f"{what} exited early: {f.read()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status < 500:
                    return
        except Exception:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not start")


class Running:
    """A running gateway and its mock upstream: `gw` and `mock` are their base URLs."""

    def __init__(self, gw, mock):
        self.gw, self.mock = gw, mock

    def script(self, **rule):
        """Adds a script to the mock (see `aigw mock-upstream`)."""
        req = urllib.request.Request(self.mock + "/__mock/script", data=json.dumps(rule).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req).read()

    def reset_mock(self):
        req = urllib.request.Request(self.mock + "/__mock/reset", data=b"", method="POST")
        urllib.request.urlopen(req).read()

    def mock_calls(self):
        """The mock's counters: `count`, `by_credential`, and the calls it kept."""
        with urllib.request.urlopen(self.mock + "/__mock/calls") as r:
            return json.loads(r.read())


@contextmanager
def running(resources, env=None, record_calls=True):
    """Starts the mock and the gateway with `resources` (a TOML string; `{mock}` is replaced by
    the mock's port), yields a `Running`, stops both."""
    assert os.path.exists(BIN), f"build the gateway first (cargo build): {BIN} is missing"
    tmp = tempfile.mkdtemp(prefix="aigw-clients-")
    mock_port, gw_port = free_port(), free_port()
    mock_cmd = [BIN, "mock-upstream", "--listen", f"127.0.0.1:{mock_port}"]
    if not record_calls:
        mock_cmd.append("--no-record")
    # Logs go to files: a pipe nobody reads would block a busy process.
    mock_log, gw_log = os.path.join(tmp, "mock.log"), os.path.join(tmp, "aigw.log")
    mock = subprocess.Popen(mock_cmd, stdout=subprocess.DEVNULL, stderr=open(mock_log, "w"))
    res = os.path.join(tmp, "resources.toml")
    with open(res, "w") as f:
        f.write(resources.replace("{mock}", str(mock_port)))
    full_env = {"PATH": os.environ.get("PATH", ""), "AIGW_LISTEN": f"127.0.0.1:{gw_port}",
                "AIGW_DATABASE_URL": f"sqlite://{tmp}/aigw.db",
                "AIGW_BOOTSTRAP_PASSWORD": "clients-owner-pass", "AIGW_LOG": "warn"}
    full_env.update(env or {})
    gw = subprocess.Popen([BIN, "serve", "--resources", res], env=full_env, cwd=tmp,
                          stdout=subprocess.DEVNULL, stderr=open(gw_log, "w"))
    try:
        wait_ready(f"http://127.0.0.1:{mock_port}/__mock/calls", mock, "mock upstream", mock_log)
        wait_ready(f"http://127.0.0.1:{gw_port}/readyz", gw, "aigw", gw_log)
        yield Running(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{mock_port}")
    finally:
        for p in (gw, mock):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
