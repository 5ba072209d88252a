"""gpusched's mutating webhook (``python -m gpusched.cli webhook``) as a test process behind a real
kube-apiserver: served on loopback with a certificate of a CA made here, and registered with
deploy/manifests/webhook/'s MutatingWebhookConfiguration (rules, failurePolicy, namespaceSelector,
matchConditions), only its clientConfig pointed at this process (URL and caBundle). Used by
tests/e2e/test_webhook.py and tests/kubelet."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gpusched.k8s.convert import RES_MEMORY, RES_SHARE
from gpusched.testenv import ControlPlane, free_port, wait_until
from gpusched.testenv.pki import generate_pki

REPO = Path(__file__).resolve().parents[1]
WEBHOOK_CONFIG = REPO / "deploy" / "manifests" / "webhook" / "02-mutatingwebhookconfiguration.yaml"


class Webhook:
    """``python -m gpusched.cli webhook`` on 127.0.0.1 with a certificate of its own CA."""

    def __init__(self, tmp: Path, args: Sequence[str] = ()) -> None:
        """``args``: more options of ``gpusched webhook`` (e.g. ``--scheduler-name``, the writers)."""
        self.pki = generate_pki(tmp / "pki")  # its serving certificate is for 127.0.0.1 and localhost
        self.args = list(args)
        self.port = free_port()
        self.log = tmp / "webhook.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [
            *(sys.executable, "-m", "gpusched.cli", "webhook"),
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--tls-cert-file", str(self.pki.serving_cert), "--tls-key-file", str(self.pki.serving_key)),
            *self.args,
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))

        def healthy() -> bool:
            self.check_alive()
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{self.port}/healthz", context=ctx, timeout=2
                ) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_until(healthy, timeout=30, what="the webhook's /healthz", interval=0.2)

    def check_alive(self) -> None:
        """Raise AssertionError with the end of its log when the process has exited."""
        assert self.proc is not None, "the webhook was never started"
        if self.proc.poll() is not None:
            raise AssertionError(
                f"the webhook exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
            )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def configuration(self) -> dict[str, Any]:
        """deploy/manifests' MutatingWebhookConfiguration, each webhook pointed at its path here."""
        (doc,) = [d for d in yaml.safe_load_all(WEBHOOK_CONFIG.read_text()) if d]
        ca = base64.b64encode(self.pki.ca_cert.read_bytes()).decode()
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.port}{path}", "caBundle": ca}
        return dict(doc)

    def register(self, cp: ControlPlane, probe_namespace: str = "default") -> None:
        """Apply :meth:`configuration` to the control plane and wait until its apiserver calls this process:
        a server-side dry run of a memory-only share pod in ``probe_namespace`` comes back with its slot."""
        cp.kubectl("apply", "-f", "-", input=json.dumps(self.configuration()))
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "webhook-probe"},
            "spec": {
                "containers": [
                    {"name": "main", "image": "busybox", "resources": {"limits": {RES_MEMORY: "1"}}}
                ]
            },
        }

        def mutated() -> bool:
            self.check_alive()
            out = cp.kubectl(
                *("create", "--dry-run=server", "-n", probe_namespace, "-o", "json", "-f", "-"),
                input=json.dumps(probe),
                check=False,
            )
            if out.returncode != 0:
                return False
            limits = json.loads(out.stdout)["spec"]["containers"][0]["resources"]["limits"]
            return bool(limits.get(RES_SHARE) == "1")

        wait_until(mutated, timeout=30, what="the apiserver calling the webhook", interval=0.2)
