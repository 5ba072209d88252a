"""gpusched's webhook run as the chart's Deployment, from the image ``hack/build-image.sh`` builds, on the
session's real node, and registered with the session's apiserver in place of the host process
(tests/webhookfixture.py).

The chart's webhook objects are rendered by the helm of the control-plane cache. What this test cluster lacks
is given in their place, and nothing else changes:

- the apiserver runs on the host and no kube-proxy runs, so a Service's ClusterIP leads nowhere: each
  webhook's clientConfig names the pod by URL, ``https://<pod IP>:<webhook.port>/<path>`` (the pod IP is on
  the node's CNI bridge, which the host routes to). The pod keeps the chart's pod network, probes and security
  context (the chart has no hostNetwork for the webhook, and a pod IP is what a real apiserver reaches too);
- the pod IP is known only once the pod runs, after its certificate is mounted, so the serving certificate
  (made with openssl as deploy/webhook-certs.sh makes it) names the chart's Service names and every address
  of the node's pod subnet; it replaces the chart's Secret, and its CA is the caBundle;
- kube-scheduler here has only the extender's profile, so the pod names it (it asks for no GPU).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpusched.testenv import wait_until
from gpusched.testenv.node import POD_SUBNET, RealNode

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpusched"
RELEASE = "gpusched"
#: the chart's release namespace (the host-process configuration excludes it too)
NAMESPACE = "gpusched-system"
PORT = 8443  # the chart's webhook.port


def _openssl(*args: str) -> None:
    out = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise AssertionError(f"openssl {args[0]} failed: {out.stderr}")


@dataclass
class WebhookPod:
    """The chart's webhook objects, rendered for ``node`` and applied; ``delete`` removes them."""

    node: RealNode
    image: str
    writers: list[str]
    scheduler_name: str
    manifest: str = ""
    configuration: dict[str, Any] = field(default_factory=dict)
    created_namespace: bool = False

    @property
    def dir(self) -> Path:
        d = self.node.workdir / "webhook-pod"
        d.mkdir(exist_ok=True)
        return d

    def certificate(self, hosts: list[str]) -> tuple[bytes, bytes, bytes]:
        """(CA, serving certificate, key), PEM: DNS ``hosts`` and every address of the pod subnet."""
        d = Path(tempfile.mkdtemp(dir=self.dir))
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
        _openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=gpusched-webhook-ca",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                 "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"))  # fmt: skip
        _openssl(
            "req", *ec, "-subj", f"/CN={hosts[0]}", "-keyout", str(d / "tls.key"), "-out", str(d / "tls.csr")
        )
        sans = [f"DNS:{h}" for h in hosts] + [f"IP:{ip}" for ip in ipaddress.ip_network(POD_SUBNET).hosts()]
        (d / "ext.cnf").write_text(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage=serverAuth\nsubjectAltName={','.join(sans)}\n"
        )
        _openssl("x509", "-req", "-in", str(d / "tls.csr"),
                 "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2",
                 "-extfile", str(d / "ext.cnf"), "-out", str(d / "tls.crt"))  # fmt: skip
        return (d / "ca.crt").read_bytes(), (d / "tls.crt").read_bytes(), (d / "tls.key").read_bytes()

    def render(self) -> list[dict[str, Any]]:
        repo, tag = self.image.rsplit(":", 1)
        values = {
            "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
            "schedulerName": self.scheduler_name,
            "nodeSelector": {"kubernetes.io/hostname": self.node.name},
            "webhook": {
                "replicas": 1,
                "port": PORT,
                "routeGpuPods": True,
                "writers": {"assignment": self.writers, "allocated": self.writers},
            },
        }
        home = self.dir / "helm"
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=self.dir, delete=False) as f:
            yaml.safe_dump(values, f)
        out = subprocess.run(
            [str(self.node.cp.bin_dir / "helm"), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
             "-f", f.name, "--show-only", "templates/webhook.yaml"],
            capture_output=True, text=True, timeout=120, check=False,
            env={"HOME": str(home), "PATH": "/usr/bin:/bin", "HELM_CACHE_HOME": str(home),
                 "HELM_CONFIG_HOME": str(home), "HELM_DATA_HOME": str(home)},
        )  # fmt: skip
        if out.returncode != 0:
            raise AssertionError(f"helm template failed: {out.stderr}")
        return [d for d in yaml.safe_load_all(out.stdout) if d]

    def apply(self, pod_scheduler: str) -> None:
        """Everything but the MutatingWebhookConfiguration (kept for :meth:`register`), the Secret with the
        certificate made here; the pod names ``pod_scheduler``."""
        docs = self.render()
        by_kind = {d["kind"]: d for d in docs}
        assert sorted(by_kind) == ["Deployment", "MutatingWebhookConfiguration", "Secret", "Service",
                                   "ServiceAccount"], sorted(by_kind)  # fmt: skip
        service = by_kind["Service"]["metadata"]["name"]
        hosts = [
            f"{service}.{NAMESPACE}.svc",
            f"{service}.{NAMESPACE}",
            f"{service}.{NAMESPACE}.svc.cluster.local",
        ]
        ca, crt, key = self.certificate(hosts)
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        by_kind["Secret"]["data"] = {"tls.crt": b64(crt), "tls.key": b64(key), "ca.crt": b64(ca)}
        by_kind["Deployment"]["spec"]["template"]["spec"]["schedulerName"] = pod_scheduler
        self.configuration = by_kind.pop("MutatingWebhookConfiguration")
        for hook in self.configuration["webhooks"]:
            hook["clientConfig"]["caBundle"] = b64(ca)
        cp = self.node.cp
        if cp.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
            cp.kubectl("create", "namespace", NAMESPACE)
            self.created_namespace = True
        objs = [by_kind[k] for k in ("ServiceAccount", "Secret", "Service", "Deployment")]
        self.manifest = yaml.safe_dump_all(objs)
        cp.kubectl("apply", "-f", "-", input=self.manifest)

    def pods(self) -> list[dict[str, Any]]:
        selector = "app.kubernetes.io/component=webhook"
        out = self.node.cp.kubectl("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "json", check=False)
        return list(json.loads(out.stdout)["items"]) if out.returncode == 0 else []

    def ready_pod_ip(self, timeout: float = 45) -> str:
        """The IP of the Deployment's pod once its readiness probe (HTTPS /healthz on the pod IP) passes."""

        def ready() -> str | None:
            for p in self.pods():
                conds = {c["type"]: c["status"] for c in p.get("status", {}).get("conditions", [])}
                if conds.get("Ready") == "True" and p["status"].get("podIP"):
                    return str(p["status"]["podIP"])
            return None

        try:
            return str(wait_until(ready, timeout=timeout, what="the webhook pod Ready", interval=0.5))
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.describe()}") from None

    def register(self, pod_ip: str) -> dict[str, Any]:
        """The chart's MutatingWebhookConfiguration, each webhook's clientConfig the pod's URL for its path
        (the chart's caBundle and everything else as rendered), applied; returns what was applied."""
        for hook in self.configuration["webhooks"]:
            path = hook["clientConfig"].pop("service")["path"]
            hook["clientConfig"]["url"] = f"https://{pod_ip}:{PORT}{path}"
        self.node.cp.kubectl("apply", "-f", "-", input=json.dumps(self.configuration))
        return self.configuration

    def logs(self) -> str:
        return str(self.node.cp.kubectl(
            "logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=webhook", "--tail", "200", check=False
        ).stdout)  # fmt: skip

    def describe(self) -> str:
        cp = self.node.cp
        out = [cp.kubectl(*args, check=False).stdout for args in (
            ("get", "deployment,pods", "-n", NAMESPACE, "-o", "wide"),
            ("describe", "pods", "-n", NAMESPACE),
            ("get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp"),
        )]  # fmt: skip
        return ("\n".join(out) + "\n" + self.logs())[-6000:]

    def delete(self) -> None:
        """The Deployment and its objects (the configuration is the caller's to restore)."""
        cp = self.node.cp
        if self.manifest:
            cp.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=60s",
                       input=self.manifest, check=False, timeout=90)  # fmt: skip
        if self.created_namespace:
            cp.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
