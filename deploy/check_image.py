#!/usr/bin/env python3
"""Runs the runtime stage of deploy/Dockerfile as its image would, without a container engine:
its ENTRYPOINT and CMD, its ENV, as its USER (uid and gid, no other groups), in a fresh data
folder standing for its WORKDIR and VOLUME. Checks that the gateway starts, becomes ready,
writes its database and generated secrets (mode 0600) into that folder, answers as that user,
and stops cleanly on the image's STOPSIGNAL. CI runs it where no image can be built.

  python3 deploy/check_image.py --bin target/debug/aigw      (as root, for the user switch)
"""

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import json

HERE = os.path.dirname(os.path.abspath(__file__))


def runtime_stage(path):
    """The instructions of the Dockerfile's last stage, continuation lines joined."""
    lines, current = [], ""
    for raw in open(path, encoding="utf-8"):
        line = raw.rstrip("\n")
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    last = max(i for i, l in enumerate(lines) if l.split()[0].upper() == "FROM")
    return [(l.split(None, 1)[0].upper(), l.split(None, 1)[1].strip()) for l in lines[last:]]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True, help="the aigw binary the image would hold")
    parser.add_argument("--dockerfile", default=os.path.join(HERE, "Dockerfile"))
    args = parser.parse_args()

    stage = runtime_stage(args.dockerfile)
    env, user, workdir, entrypoint, cmd, stopsignal = {}, None, None, [], [], "SIGTERM"
    for op, rest in stage:
        if op == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
        elif op == "USER":
            user = rest
        elif op == "WORKDIR":
            workdir = rest
        elif op == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif op == "CMD":
            cmd = json.loads(rest)
        elif op == "STOPSIGNAL":
            stopsignal = rest
    uid, _, gid = (user or "").partition(":")
    assert uid and uid != "0" and uid != "root", f"the image must not run as root (USER {user!r})"
    assert entrypoint and entrypoint[0] == "/usr/local/bin/aigw", entrypoint
    assert workdir, "a WORKDIR for the data"
    assert env.get("AIGW_LISTEN", "").startswith("0.0.0.0:"), "listens on every address of the container"

    data = tempfile.mkdtemp(prefix="aigw-image-")
    os.chown(data, int(uid), int(gid or uid))
    os.chmod(data, 0o700)
    port = free_port()
    run_env = {"PATH": "/usr/bin:/bin"}
    for key, value in env.items():
        run_env[key] = value.replace(workdir, data)
    # The image listens on every address of its own network; here, on loopback only.
    run_env["AIGW_LISTEN"] = f"127.0.0.1:{port}"
    command = [
        "setpriv", f"--reuid={uid}", f"--regid={gid or uid}", "--clear-groups",
        os.path.abspath(args.bin), *entrypoint[1:], *cmd,
    ]
    proc = subprocess.Popen(command, cwd=data, env=run_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None, f"exited early: {proc.stderr.read()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, "not ready within 60 s"
            time.sleep(0.2)
        status = open(f"/proc/{proc.pid}/status").read()
        ids = {l.split(":")[0]: l.split()[1:] for l in status.splitlines() if l.startswith(("Uid", "Gid"))}
        assert ids["Uid"][0] == uid and ids["Gid"][0] == (gid or uid), ids
        names = sorted(os.listdir(data))
        assert "aigw.db" in names and "aigw.keys" in names, names
        assert os.stat(os.path.join(data, "aigw.keys")).st_mode & 0o077 == 0, "aigw.keys is private"
        assert os.stat(os.path.join(data, "aigw.db")).st_uid == int(uid)
        proc.send_signal(getattr(signal, stopsignal))
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, f"exit {proc.returncode}: {err}"
        assert "first owner" in out and "console at" in out, out
        print(f"image entrypoint: ready as uid {uid}, data in its folder ({', '.join(names)}), "
              f"stopped by {stopsignal}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run(["rm", "-rf", data], check=False)


if __name__ == "__main__":
    sys.exit(main())
