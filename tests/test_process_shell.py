"""k8s/process.py, the process shell of the scheduler and the defrag controller: probes, metrics,
SIGTERM, the order of start-up and shutdown. Run in a child process (it installs signal handlers)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

CHILD = r"""
import json, logging, os, signal, sys, threading, urllib.error, urllib.request
from gpusched.k8s.process import configure_logging, run_until_signal

port = int(sys.argv[1])
calls, answers = [], []


class Service:
    ready = False

    def synced(self):
        return self.ready

    def start(self, lead=True):
        calls.append(f"start lead={lead}")

    def start_leading(self):
        calls.append("lead")

    def stop_leading(self):
        calls.append("unlead")

    def stop(self):
        calls.append("stop")


service = Service()


def get(path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def probe():
    answers.append(get("/readyz"))
    service.ready = True
    answers.append(get("/readyz"))
    answers.append(get("/healthz"))
    answers.append(get("/metrics"))
    os.kill(os.getpid(), signal.SIGTERM)


def started(stop):
    calls.append("started")
    threading.Thread(target=probe, daemon=True).start()


configure_logging("INFO")
run_until_signal(None, service, port=port, metrics=lambda: b"m 1\n", not_ready="not yet\n", lease=None,
                 log=logging.getLogger("shell-test"), banner="test service", started=started)
print(json.dumps({"calls": calls, "answers": answers}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_shell_serves_probes_and_stops_the_service_on_sigterm() -> None:
    port = free_port()
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(port)], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # without a Lease the service leads from the start; the caller's start-up work runs after it
    # starts; SIGTERM stops it
    assert out["calls"] == ["start lead=True", "started", "stop"]
    assert out["answers"] == [[503, "not yet\n"], [200, "ok\n"], [200, "ok\n"], [200, "m 1\n"]]
    assert f"shell-test: test service port={port}" in r.stderr
    assert "shell-test: shutting down" in r.stderr
