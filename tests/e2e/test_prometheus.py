"""The dashboards and the alert rules on a real Prometheus (Debian's ``prometheus``), scraping the real
standalone scheduler (two: a leader, and a standby whose Lease someone else holds), the extender and
the node agent (fake GPUs, on the test control plane's API) while a workload runs on kwok nodes.

Every panel query of every shipped dashboard and every alert expression goes through Prometheus's
HTTP API by ``gpusched.metrics.check`` (what ``gpusched metrics check`` runs; the command itself is run
once too): each must parse and return data, and every alert must fire (state ``firing`` in
``/api/v1/alerts``); the rules are loaded with ``for: 0s`` and a p99 threshold of 1 µs, the only
changes from the shipped file. kube-state-metrics (built from its Go module by
``hack/build-kube-state-metrics.sh``) watches the same API for the alerts on its series.

The scenario: 6 GPU shares of 700 milli fill the three 2-GPU "pa" nodes (every GPU keeps 300 milli
the 700-milli workload cannot use: stranded), a pod asks for a GPU model no node has (pending, while
the A10 of "pb" idles), the agent's fake GPU reports XID 79 (the agent marks it unhealthy on the Node,
the scheduler's books follow), the extender answers filter and prioritize, a ResourceQuota of one
``requests.nvidia.com/gpu`` is used up by that pending pod, another GPU node is held NotReady (a
ValidatingAdmissionPolicy refuses kwok's status updates that would make it Ready again: kwok
re-initialises every node that is not Ready), and at the end the scheduler and the extender are
killed (``up == 0``). A tenant ``Queue`` of one GPU (the Queue CRD; its namespace listed in
``spec.namespaces``) runs one GPU pod on the one-GPU "pq" node and has two more waiting for quota:
the queue panels have data and the queue-quota alert fires. A MIG node (its geometry as the agent
publishes it) holds one 3g.40gb pod and has a 7g.80gb pod waiting: the MIG panels have data.

Counts are printed in the test's output (``-s``) and recorded as user properties.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_mig_e2e import create_mig_node, mig_node_body

from gpusched.metrics.alerts import JOBS, Thresholds, alerts
from gpusched.metrics.check import Check, Connection, Report, alert_checks, check, panel_checks
from gpusched.metrics.generate import DASHBOARD_DIR, rules_yaml
from gpusched.testenv import ControlPlane, free_port, wait_until
from realparts import unavailable

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
GROUP = "gpusched.io/e2e-group"
KSM_JOB = "kube-state-metrics"
DOWN_ALERTS = {"GPUSchedSchedulerDown", "GPUSchedExtenderDown"}  # fired last: the processes are killed


def ksm_binary() -> str:
    """kube-state-metrics: ``$GPUSCHED_KSM_BIN`` (its bin directory) or ``hack/build-kube-state-metrics.sh``
    (cached by version; the first build needs Go)."""
    bin_dir = os.environ.get("GPUSCHED_KSM_BIN")
    if not bin_dir:
        out = subprocess.run([str(ROOT / "hack/build-kube-state-metrics.sh")], capture_output=True, text=True)
        if out.returncode == 2:
            unavailable(f"kube-state-metrics cannot be built: Go is not installed ({out.stderr.strip()})")
        if out.returncode != 0:
            pytest.fail(f"hack/build-kube-state-metrics.sh failed: {out.stderr[-2000:]}", pytrace=False)
        bin_dir = out.stdout.strip().splitlines()[-1]
    path = Path(bin_dir) / "kube-state-metrics"
    if not os.access(path, os.X_OK):
        pytest.fail(f"no kube-state-metrics in {bin_dir}", pytrace=False)
    return str(path)


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not installed (Debian: apt-get install prometheus)")
    return path


FAST = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}


class Prometheus:
    def __init__(
        self, tmp: Path, targets: dict[str, list[int]], *, config: dict[str, Any] | None = None
    ) -> None:
        """``targets``: static scrape jobs, rules at ``for: 0s``; or ``config``: a whole prometheus.yml."""
        self.port = free_port()
        if config is None:
            rules = tmp / "rules.yaml"
            rules.write_text(rules_yaml(Thresholds(p99_seconds=1e-6), for_override="0s"))
            config = {
                "global": FAST,
                "rule_files": [str(rules)],
                "scrape_configs": [
                    {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}]}
                    for job, ports in targets.items()
                ],
            }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (tmp / "prometheus.log").open("ab")
        self.proc = subprocess.Popen(
            [_binary("prometheus"), f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_until(self._ready, timeout=60, what="prometheus ready", interval=0.5)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"prometheus exited with {self.proc.returncode}; see {self.log.name}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:  # 400 bad_data: the body says why
            return json.loads(e.read())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def check(self, checks: list[Check]) -> Report:
        """Instant queries through ``gpusched.metrics.check`` (``gpusched metrics check``'s library)."""
        return check(Connection(self.url), checks)

    def firing(self) -> set[str]:
        return {
            a["labels"]["alertname"] for a in self.api("alerts")["data"]["alerts"] if a["state"] == "firing"
        }

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Scene:
    def __init__(self, cp: ControlPlane, tmp: Path) -> None:
        from kubernetes import client

        from gpusched.k8s.client import api_client

        self.cp, self.tmp = cp, tmp
        self.tag = uuid.uuid4().hex[:8]
        self.ns = f"prom-{self.tag}"
        self.queue_ns, self.queue = f"promq-{self.tag}", f"q-{self.tag}"
        self.scheduler = f"gpusched-{self.tag}"
        self.api = api_client(str(cp.kubeconfig_path), qps_pool=16)
        self.v1 = client.CoreV1Api(self.api)
        self.coord = client.CoordinationV1Api(self.api)
        for ns in (self.ns, self.queue_ns):
            self.v1.create_namespace({"metadata": {"name": ns}})
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.cleanups: list[Callable[[], object]] = []
        self.ksm = ""
        self._stop = threading.Event()

    # ------------------------------------------------------------------ cluster
    def nodes(self) -> None:
        specs = [(f"pa-{self.tag}-{i}", "Tesla-T4", 15360, "pa", 2) for i in range(3)]
        specs.append((f"pb-{self.tag}", "A10", 24576, "pb", 1))
        specs.append((f"pq-{self.tag}", "L4", 23034, "pq", 1))  # the tenant queue's
        for name, model, mem, pool, gpus in specs:
            res = {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
            labels = {"type": "kwok", GROUP: self.tag, "nvidia.com/gpu.product": model,
                      "nvidia.com/gpu.memory": str(mem), "gpusched.io/pool": pool}  # fmt: skip
            body = {
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                },
                "status": {"capacity": res, "allocatable": res},
            }
            self.v1.create_node(body, _preload_content=False)

        def ready() -> bool:
            items = json.loads(
                self.v1.list_node(label_selector=f"{GROUP}={self.tag}", _preload_content=False).data
            )
            return len(items["items"]) == len(specs) and all(
                any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
                and not n["spec"].get("taints")
                for n in items["items"]
            )

        wait_until(ready, timeout=240, what="kwok nodes Ready", control_plane=self.cp, interval=1)

    def gpu_quota(self) -> None:
        """A ResourceQuota of one requested GPU in the namespace (the pending H100 pod uses it up)."""
        body = {"metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}}
        self.v1.create_namespaced_resource_quota(self.ns, body, _preload_content=False)

    def tenant_queue(self) -> None:
        """A Queue of one GPU for the pods of ``queue_ns`` (before the schedulers start: they decide
        once the Queues are listed)."""
        from kubernetes import client

        from gpusched.bench.reclaim import install_queue_crd, queue_body
        from gpusched.k8s.queues import GROUP as QGROUP
        from gpusched.k8s.queues import PLURAL, VERSION

        install_queue_crd(self.cp)
        custom = client.CustomObjectsApi(self.api)
        body = queue_body(self.queue, 1, namespaces=[self.queue_ns])
        custom.create_cluster_custom_object(QGROUP, VERSION, PLURAL, body, _preload_content=False)
        name = self.queue
        self.cleanups.append(
            lambda: custom.delete_cluster_custom_object(QGROUP, VERSION, PLURAL, name, _preload_content=False)
        )

    def not_ready_node(self) -> str:
        """A GPU node held NotReady: its status says Ready=False, and a ValidatingAdmissionPolicy
        (bound to this node's label) refuses any status update that would make it Ready, so kwok's
        node-initialize stage cannot bring it back."""
        from kubernetes import client

        adm = client.AdmissionregistrationV1Api(self.api)
        name, policy = f"down-{self.tag}", f"hold-not-ready-{self.tag}"
        ready = "object.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')"
        adm.create_validating_admission_policy({
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "objectSelector": {"matchLabels": {f"{GROUP}-down": self.tag}},
                    "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                                       "resources": ["nodes", "nodes/status"]}],
                },
                "validations": [{"expression": f"!has(object.status.conditions) || !({ready})",
                                 "message": "held NotReady by the e2e test"}],
            },
        })  # fmt: skip
        adm.create_validating_admission_policy_binding(
            {"metadata": {"name": policy}, "spec": {"policyName": policy, "validationActions": ["Deny"]}}
        )
        self.cleanups.append(lambda: adm.delete_validating_admission_policy_binding(policy))
        self.cleanups.append(lambda: adm.delete_validating_admission_policy(policy))
        res = {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "4"}
        labels = {"type": "kwok", GROUP: self.tag, f"{GROUP}-down": self.tag,
                  "nvidia.com/gpu.product": "A100", "gpusched.io/pool": "pc"}  # fmt: skip
        self.v1.create_node({"metadata": {"name": name, "labels": labels}}, _preload_content=False)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        cond = {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "e2e: held down",
                "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
        status = {"status": {"capacity": res, "allocatable": res, "conditions": [cond]}}

        up = {"status": {"conditions": [{**cond, "status": "True", "reason": "KubeletReady"}]}}

        def held_down() -> bool:
            """The policy takes effect within seconds (longer on a loaded machine): until it refuses a
            Ready=True status (asked as a dry run), kwok can make the node Ready again."""
            try:
                self.v1.patch_node_status(name, up, dry_run="All", _preload_content=False)
                return False  # not in force yet
            except client.ApiException as e:
                if "held NotReady by the e2e test" not in str(e.body):
                    return False
            try:
                self.v1.patch_node_status(name, status, _preload_content=False)
            except client.ApiException:
                return False
            node = json.loads(self.v1.read_node(name, _preload_content=False).data)
            return any(c["type"] == "Ready" and c["status"] == "False" for c in node["status"]["conditions"])

        wait_until(held_down, timeout=120, what=f"node {name} held NotReady", interval=1)
        return name

    def pod(self, name: str, res: dict[str, str], selector: dict[str, str], ns: str = "") -> None:
        ns = ns or self.ns
        body = {
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "schedulerName": self.scheduler,
                "nodeSelector": {GROUP: self.tag, **selector},
                "containers": [
                    {"name": "c", "image": "pause", "resources": {"requests": res, "limits": res}}
                ],
            },
        }
        self.v1.create_namespaced_pod(ns, body, _preload_content=False)

    def pods(self, ns: str = "") -> list[dict[str, Any]]:
        resp = self.v1.list_namespaced_pod(ns or self.ns, _preload_content=False)
        return list(json.loads(resp.data)["items"])

    def hold_lease(self, name: str) -> None:
        """A Lease held by a leader Prometheus does not see, renewed every 2 s (so the standby never
        takes it): replicas up, none of them leading."""
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {"holderIdentity": "elsewhere", "leaseDurationSeconds": 15, "renewTime": now}
        body = {"metadata": {"name": name, "namespace": self.ns}, "spec": spec}
        self.coord.create_namespaced_lease(self.ns, body)

        def renew() -> None:
            while not self._stop.wait(2.0):
                t = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                try:
                    self.coord.patch_namespaced_lease(name, self.ns, {"spec": {"renewTime": t}})
                except Exception:  # the namespace is going away
                    return

        threading.Thread(target=renew, daemon=True).start()

    # ---------------------------------------------------------------- processes
    def spawn(self, name: str, *cmd: str, exe: str = sys.executable) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.log").open("ab")
        p = subprocess.Popen([exe, *cmd], stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = p
        return p

    def ksm_proc(self, binary: str, port: int) -> None:
        """kube-state-metrics on the nodes and the resource quotas (its telemetry on a spare port)."""
        self.spawn("kube-state-metrics", f"--kubeconfig={self.cp.kubeconfig_path}", "--host=127.0.0.1",
                   f"--port={port}", "--telemetry-host=127.0.0.1", f"--telemetry-port={free_port()}",
                   "--resources=nodes,resourcequotas", exe=binary)  # fmt: skip

    def scheduler_proc(self, name: str, port: int, lease: str, scheduler_name: str) -> None:
        self.spawn(name, "-m", "gpusched.cli", "scheduler", "--kubeconfig", str(self.cp.kubeconfig_path),
                   "--scheduler-name", scheduler_name, "--namespace", self.ns, "--lease-name", lease,
                   "--port", str(port))  # fmt: skip

    def extender_proc(self, port: int) -> None:
        kubeconfig = str(self.cp.kubeconfig_path)
        self.spawn("extender", "-m", "gpusched.cli", "extender", "--kubeconfig", kubeconfig,
                   "--host", "127.0.0.1", "--port", str(port), "--policy", "default")  # fmt: skip

    def agent_proc(self, node: str, port: int) -> None:
        fake = self.tmp / "gpus.yaml"
        ok = {"utilization": 40, "memoryUsedMiB": 1024, "temperature": 41, "power": 70.5}
        busy = {"utilization": 70, "memoryUsedMiB": 9000, "temperature": 60, "power": 65.0}
        t4 = {"model": "Tesla T4", "memoryMiB": 15360}
        gpus = [{**t4, "readings": ok}, {**t4, "xids": [79], "readings": busy}]  # XID 79: fell off the bus
        fake.write_text(yaml.safe_dump({"hostname": node, "gpus": gpus}))
        plugins = self.tmp / "dp"
        plugins.mkdir(exist_ok=True)
        self.spawn("agent", "-m", "gpusched.cli", "agent", "run", "--fake", str(fake), "--node", node,
                   "--kubeconfig", str(self.cp.kubeconfig_path), "--plugin-dir", str(plugins),
                   "--metrics-port", str(port), "--log-level", "warning")  # fmt: skip

    def extender_call(self, port: int, verb: str, pod: dict[str, Any], nodes: list[str]) -> int:
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/{verb}", data=json.dumps({"Pod": pod, "NodeNames": nodes}).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)

    def traffic(self, ext_port: int, pending: dict[str, Any], nodes: list[str]) -> None:
        """Keep the workload running while Prometheus watches (rates over a minute need events in
        it): the extender asked about the pending pod every second, a CPU-only pod created on a pa
        node every 2 s (a binding) and the one before it deleted."""

        def run() -> None:
            i = 0
            while not self._stop.wait(1.0):
                try:
                    self.extender_call(ext_port, "filter", pending, nodes)
                    self.extender_call(ext_port, "prioritize", pending, nodes)
                    if i % 2 == 0:
                        self.pod(f"churn-{i}", {"cpu": "100m"}, {"gpusched.io/pool": "pa"})
                        if i >= 4:
                            self.v1.delete_namespaced_pod(f"churn-{i - 4}", self.ns, grace_period_seconds=0,
                                                          _preload_content=False)  # fmt: skip
                except Exception:  # the processes are being killed at the end
                    pass
                i += 1

        threading.Thread(target=run, daemon=True, name="traffic").start()

    def cleanup(self) -> None:
        self._stop.set()
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for undo in self.cleanups:
            with contextlib.suppress(Exception):  # best effort: the namespace and the nodes still go
                undo()
        for ns in (self.ns, self.queue_ns):
            self.v1.delete_namespace(ns, _preload_content=False)
        self.v1.delete_collection_node(label_selector=f"{GROUP}={self.tag}", _preload_content=False)


@pytest.fixture
def scene(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Scene]:
    _binary("prometheus")
    ksm = ksm_binary()
    s = Scene(control_plane, tmp_path)
    s.ksm = ksm
    try:
        yield s
    finally:
        s.cleanup()


def _committed_panel_queries() -> Iterator[tuple[str, str]]:
    from gpusched.metrics.dashboards import panel_queries

    for path in sorted((ROOT / DASHBOARD_DIR).glob("*.json")):
        yield from panel_queries(json.loads(path.read_text()))


def _metrics_check_cli(url: str) -> Any:
    """``gpusched metrics check --prometheus URL --json`` as an operator runs it (exit 0: all parse)."""
    cmd = [sys.executable, "-m", "gpusched.cli", "metrics", "check", "--prometheus", url, "--json",
           "--rate-interval", "1m"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout[-2000:]
    return json.loads(out.stdout)


def test_every_panel_query_and_alert_on_a_real_prometheus(
    scene: Scene, record_property: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    s = scene
    s.nodes()
    # a MIG node (A100s cut all-balanced and 4g + 3g, as its agent would publish them): one slice held, one
    # profile no GPU has cut (its pod waits: the MIG panels have data)
    create_mig_node(s.cp, s.v1, mig_node_body(f"pm-{s.tag}", s.tag, labels={"gpusched.io/pool": "pm"}))
    s.tenant_queue()
    down = s.not_ready_node()
    s.gpu_quota()
    ports = {"scheduler": free_port(), "standby": free_port(), "extender": free_port(), "agent": free_port(),
             "ksm": free_port()}  # fmt: skip
    s.hold_lease(f"standby-{s.tag}")
    s.scheduler_proc("scheduler", ports["scheduler"], f"lease-{s.tag}", s.scheduler)
    s.scheduler_proc("standby", ports["standby"], f"standby-{s.tag}", f"{s.scheduler}-standby")
    s.extender_proc(ports["extender"])
    s.ksm_proc(s.ksm, ports["ksm"])
    targets = {JOBS[0]: [ports["scheduler"], ports["standby"]], JOBS[1]: [ports["extender"]]}
    prom = Prometheus(s.tmp, {**targets, JOBS[2]: [ports["agent"]], KSM_JOB: [ports["ksm"]]})
    try:
        # the workload: six 700-milli shares on the pa nodes, one pod for a GPU model nobody has
        for i in range(6):
            s.pod(f"share-{i}", {"cpu": "1", "gpusched.io/gpu-milli": "700"}, {"gpusched.io/pool": "pa"})
        s.pod("wants-h100", {"cpu": "1", "nvidia.com/gpu": "1"}, {"nvidia.com/gpu.product": "H100"})
        s.pod("mig-held", {"cpu": "1", "nvidia.com/mig-3g.40gb": "1"}, {"gpusched.io/pool": "pm"})
        s.pod("mig-waits", {"cpu": "1", "nvidia.com/mig-7g.80gb": "1"}, {"gpusched.io/pool": "pm"})
        for i in range(3):  # the queue's: one GPU of quota, the first takes it, two wait
            s.pod(f"tenant-{i}", {"cpu": "1", "nvidia.com/gpu": "1"}, {"gpusched.io/pool": "pq"}, s.queue_ns)

        def bound() -> bool:
            tenants = sum(1 for p in s.pods(s.queue_ns) if p["spec"].get("nodeName"))
            return sum(1 for p in s.pods() if p["spec"].get("nodeName")) >= 6 and tenants == 1

        wait_until(bound, timeout=120, what="6 shares and 1 tenant pod bound", control_plane=s.cp, interval=1)
        pa0 = f"pa-{s.tag}-0"
        s.agent_proc(pa0, ports["agent"])  # after the binds: it maps pa-0's pods onto its GPUs at start

        pending = next(p for p in s.pods() if p["metadata"]["name"] == "wants-h100")
        names = [f"pa-{s.tag}-{i}" for i in range(3)] + [f"pb-{s.tag}"]

        def extender_ready() -> bool:
            try:
                return s.extender_call(ports["extender"], "filter", pending, names) == 200
            except OSError:
                return False

        wait_until(extender_ready, timeout=60, what="the extender answers", interval=1)
        assert s.extender_call(ports["extender"], "prioritize", pending, names) == 200
        s.traffic(ports["extender"], pending, names)

        missing: list[str] = []

        def scraped() -> bool:
            needed = [
                'min(up{job=~"gpusched-.*"}) == 1',
                'count(up{job=~"gpusched-.*"}) == 4',
                f'up{{job="{KSM_JOB}"}} == 1',
                # not Ready: False as set, or Unknown once the node controller saw no heartbeat for
                # its grace period (kwok's are refused): the alert reads status="true" == 0
                f'kube_node_status_condition{{node="{down}", condition="Ready", status="true"}} == 0',
                f'kube_resourcequota{{namespace="{s.ns}", resource="requests.nvidia.com/gpu", type="used"}}',
                'gpusched_gpu_healthy{node="' + pa0 + '"} == 0',  # the agent's XID 79 reached the books
                'DCGM_FI_DEV_GPU_UTIL{pod!=""}',  # the agent mapped pods onto its GPUs
                "gpusched_gpus_stranded > 0",
                "gpusched_pending_pods_by_reason",
                "rate(gpusched_binding_duration_seconds_count[1m]) > 0",
                "rate(gpusched_extender_request_duration_seconds_count[1m]) > 0",
                f'max(gpusched_queue_gpus_used{{queue="{s.queue}"}}) == 1',
                f'max(gpusched_queue_pending_pods{{queue="{s.queue}"}}) == 2',
                'gpusched_mig_instances{state="held", profile="3g.40gb"} > 0',
                'gpusched_mig_pending_slices{profile="7g.80gb"} > 0',
            ]
            report = prom.check([Check("panel", "scraped", q, q) for q in needed])
            missing[:] = [r.expr for r in report.results if r.outcome != "data"]
            return not missing

        try:
            wait_until(scraped, timeout=120, what="every series scraped", interval=1)
        except TimeoutError:
            pytest.fail(f"never scraped: {missing} (the processes' logs: {s.tmp})", pytrace=False)

        # ---- every dashboard panel query (the committed JSON's: tests/test_metrics_check.py)
        queries = prom.check(panel_checks("1m")).results
        assert len(queries) == sum(1 for _ in _committed_panel_queries())
        errors = [f"{r.group} / {r.name}: {r.expr}: {r.error}" for r in queries if r.outcome == "error"]
        empty = [f"{r.group} / {r.name}: {r.expr}" for r in queries if r.outcome == "empty"]
        with_data = sum(1 for r in queries if r.outcome == "data")
        assert not errors, "\n".join(errors)
        assert not empty, "queries without data:\n" + "\n".join(empty)

        # ---- every alert expression, and the alerts that fire on kwok
        all_alerts = {a.name: a for a in alerts(Thresholds(p99_seconds=1e-6))}
        live = set(all_alerts) - DOWN_ALERTS
        wait_until(lambda: prom.firing() >= live, timeout=90, interval=1,
                   what=f"alerts firing: {sorted(live)}")  # fmt: skip
        expr_data = 0
        for r in prom.check(alert_checks(Thresholds(p99_seconds=1e-6))).results:
            assert r.outcome != "error", f"{r.name}: {r.error}"
            if r.name in live:
                assert r.outcome == "data", f"{r.name} fires but its expression returned nothing"
                expr_data += 1
        cli = _metrics_check_cli(prom.url)  # the command, shipped thresholds: every panel with data
        n = len(queries)
        assert cli["summary"]["panel"] == {"total": n, "data": n, "empty": 0, "error": 0}
        assert cli["summary"]["alert"]["total"] == len(all_alerts) and cli["summary"]["alert"]["error"] == 0
        fired_live = prom.firing() & set(all_alerts)
        active = prom.api("alerts")["data"]["alerts"]  # on this test's node, namespace and queue
        for alert, label, value in (("GPUSchedGPUNodeNotReady", "node", down),
                                    ("GPUSchedResourceQuotaExhausted", "namespace", s.ns),
                                    ("GPUSchedQueueQuotaExhausted", "queue", s.queue)):  # fmt: skip
            assert any(
                a["labels"]["alertname"] == alert and a["labels"].get(label) == value for a in active
            ), f"{alert} not firing for {label}={value}: {active}"
        # kill the scheduler and the extender: up == 0 (their own alerts resolve: their series go stale)
        for name in ("scheduler", "extender"):
            s.procs[name].kill()
            s.procs[name].wait()
        wait_until(lambda: prom.firing() >= DOWN_ALERTS, timeout=60, interval=1, what="down alerts firing")
        down_checks = [c for c in alert_checks(Thresholds(p99_seconds=1e-6)) if c.name in DOWN_ALERTS]
        for r in prom.check(down_checks).results:
            assert r.outcome == "data", f"{r.name}: {r.outcome} {r.error}"
            expr_data += 1
        fired = sorted(fired_live | (prom.firing() & set(all_alerts)))
    finally:
        prom.stop()

    summary = {
        "panel_queries": len(queries),
        "panel_queries_with_data": with_data,
        "alert_expressions": len(all_alerts),
        "alert_expressions_with_data": expr_data,
        "alerts_fired": fired,
        "metrics_check_cli": cli["summary"],  # gpusched metrics check, shipped thresholds
    }
    for k, v in summary.items():
        record_property(k, v)
    with capsys.disabled():
        print("\nprometheus e2e:", json.dumps(summary))
    assert with_data == len(queries)
    assert set(fired) == set(all_alerts)


def test_chart_ships_the_dashboards_and_rules(
    control_plane: ControlPlane, control_plane_bin: Path, tmp_path: Path
) -> None:
    """helm template with both monitoring flags: one ConfigMap per dashboard with the sidecar's label and
    the committed JSON (created on the real API server), and a PrometheusRule whose spec is the rules
    file; with the flags off (the default) neither is rendered."""
    from kubernetes import client

    helm = control_plane_bin / "helm"
    if not helm.is_file():
        unavailable(f"helm is not built in {control_plane_bin} (hack/build-control-plane.sh builds it)")
    env = {k: str(tmp_path / k.lower()) for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")}
    chart = ROOT / "deploy/helm/gpusched"

    def render(*flags: str) -> list[dict[str, Any]]:
        cmd = [str(helm), "template", "gpusched", str(chart), "--namespace", "monitoring", *flags]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **env})
        assert out.returncode == 0, out.stderr
        return [d for d in yaml.safe_load_all(out.stdout) if d]

    on = render(
        "--set", "monitoring.dashboards.enabled=true", "--set", "monitoring.prometheusRule.enabled=true"
    )
    maps = [d for d in on if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]]
    committed = {p.name: p.read_text() for p in (ROOT / DASHBOARD_DIR).glob("*.json")}
    assert {n for m in maps for n in m["data"]} == set(committed) and len(maps) == len(committed)
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((name, text),) = m["data"].items()
        assert json.loads(text) == json.loads(committed[name])
    (rule,) = [d for d in on if d["kind"] == "PrometheusRule"]
    assert rule["spec"] == yaml.safe_load(rules_yaml())
    off = render()
    assert not [
        d
        for d in off
        if d["kind"] == "PrometheusRule" or "grafana_dashboard" in d["metadata"].get("labels", {})
    ]

    v1 = client.CoreV1Api(control_plane.api_client())
    ns = f"mon-{uuid.uuid4().hex[:8]}"
    v1.create_namespace({"metadata": {"name": ns}})
    try:
        for m in maps:  # the API server takes them as they are (names, labels, sizes)
            v1.create_namespaced_config_map(ns, {**m, "metadata": {**m["metadata"], "namespace": ns}})
        assert len(v1.list_namespaced_config_map(ns, label_selector="grafana_dashboard=1").items) == len(maps)
    finally:
        v1.delete_namespace(ns, _preload_content=False)


# ------------------------------------------------------------------ the shipped plain scrape configuration
SCRAPE_CONFIGS = ROOT / "deploy/prometheus/scrape-configs.yaml"
SHIPPED_RULES = ROOT / "deploy/prometheus/gpusched-rules.yaml"
POD_TEMPLATES = {  # component -> the shipped manifest whose pod template it runs from
    "scheduler": ROOT / "deploy/manifests/standalone/04-deployment.yaml",
    "extender": ROOT / "deploy/manifests/extender/02-extender.yaml",
    "agent": ROOT / "deploy/manifests/agent/02-agent-daemonset.yaml",
    "webhook": ROOT / "deploy/manifests/webhook/01-webhook.yaml",  # scraped by none of the jobs
}


def _pod_template(path: Path) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    (workload,) = [d for d in docs if d["kind"] in ("Deployment", "DaemonSet")]
    return dict(workload["spec"]["template"])


def _pod_role_targets(component: str, port: int, namespace: str) -> list[dict[str, Any]]:
    """What Prometheus's ``kubernetes_sd_configs: [{role: pod}]`` makes of a Running pod from the shipped
    pod template (one target per declared container port, with the pod role's meta labels), its pod IP
    127.0.0.1 and the metrics port moved to ``port``, where the real process listens."""
    tpl = _pod_template(POD_TEMPLATES[component])
    labels = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": f"{component}-0",
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_ip": "127.0.0.1",
        "__meta_kubernetes_pod_node_name": "node-0",
        **{
            "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in k): v
            for k, v in tpl["metadata"]["labels"].items()
        },
    }
    out = []
    for c in tpl["spec"]["containers"]:
        for i, p in enumerate(c.get("ports") or []):
            address = f"127.0.0.1:{port if i == 0 else free_port()}"  # the first port serves /metrics
            meta = {"__meta_kubernetes_pod_container_name": c["name"],
                    "__meta_kubernetes_pod_container_port_name": p.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(p["containerPort"])}  # fmt: skip
            out.append({"targets": [address], "labels": {**labels, **meta}})
    return out


def test_scheduler_down_fires_through_the_shipped_scrape_config_with_the_shipped_for(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """deploy/prometheus/scrape-configs.yaml's jobs (their relabel rules as shipped) and gpusched-rules.yaml
    as shipped (``for: 2m``): the scheduler, the extender and the agent run as processes, their targets
    are the shipped manifests' pods as the pod role discovers them; the jobs find exactly their component,
    named as the rules expect; the scheduler and the extender are killed and GPUSchedSchedulerDown and
    GPUSchedExtenderDown fire after the shipped ``for:``.

    Debian's Prometheus is built without Kubernetes service discovery, so the one change to the shipped jobs
    is ``kubernetes_sd_configs`` replaced by a ``file_sd_configs`` file holding the pod role's targets;
    scrape and evaluation run every second. The wait is the shipped ``for:`` (2 minutes) itself, about 2.5
    minutes in all: the point of the test is that the shipped duration, not a test one, fires."""
    _binary("prometheus")
    shipped = yaml.safe_load(SCRAPE_CONFIGS.read_text())["scrape_configs"]
    assert [j["job_name"] for j in shipped] == list(JOBS)
    rules = yaml.safe_load(SHIPPED_RULES.read_text())
    (down_rule,) = [
        r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "GPUSchedSchedulerDown"
    ]
    for_s = int(down_rule["for"].rstrip("m")) * 60
    assert down_rule["for"].endswith("m") and 0 < for_s <= 300, down_rule["for"]

    ports = {"scheduler": free_port(), "extender": free_port(), "agent": free_port(), "webhook": free_port()}
    kubeconfig = str(control_plane.kubeconfig_path)
    ns, tag = "gpusched", uuid.uuid4().hex[:8]
    fake = tmp_path / "gpus.yaml"
    fake.write_text(yaml.safe_dump({"hostname": "node-0", "gpus": [{"model": "NVIDIA A100-SXM4-80GB"}]}))
    (tmp_path / "dp").mkdir()
    cmds = {
        "scheduler": ["-m", "gpusched.cli", "scheduler", "--kubeconfig", kubeconfig, "--scheduler-name",
                      f"gpusched-{tag}", "--namespace", "default", "--lease-name", f"lease-{tag}",
                      "--port", str(ports["scheduler"])],
        "extender": ["-m", "gpusched.cli", "extender", "--kubeconfig", kubeconfig,
                     "--host", "127.0.0.1", "--port", str(ports["extender"])],
        "agent": ["-m", "gpusched.cli", "agent", "run", "--fake", str(fake), "--no-api", "--node", "node-0",
                  "--plugin-dir", str(tmp_path / "dp"), "--metrics-port", str(ports["agent"]),
                  "--log-level", "warning"],
    }  # fmt: skip
    procs: dict[str, subprocess.Popen[bytes]] = {}
    prom: Prometheus | None = None
    try:
        for name, cmd in cmds.items():
            log = (tmp_path / f"{name}.log").open("ab")
            procs[name] = subprocess.Popen([sys.executable, *cmd], stdout=log, stderr=subprocess.STDOUT)
        groups = [g for c, p in ports.items() for g in _pod_role_targets(c, p, ns)]
        (tmp_path / "pods.json").write_text(json.dumps(groups))
        jobs = []
        for job in shipped:
            job = {k: v for k, v in job.items() if k != "kubernetes_sd_configs"}
            jobs.append({**job, "file_sd_configs": [{"files": [str(tmp_path / "pods.json")]}]})
        config = {"global": FAST, "rule_files": [str(SHIPPED_RULES)], "scrape_configs": jobs}
        prom = Prometheus(tmp_path, {}, config=config)

        def all_up() -> bool:
            active = prom.api("targets")["data"]["activeTargets"]
            by_job = {j: [t for t in active if t["labels"]["job"] == j] for j in JOBS}
            return (
                all(len(ts) == 1 and ts[0]["health"] == "up" for ts in by_job.values()) and len(active) == 3
            )

        wait_until(all_up, timeout=60, interval=1, what=f"one healthy target per job (logs: {tmp_path})")
        for t in prom.api("targets")["data"]["activeTargets"]:  # each job its own component, nothing else
            assert t["labels"]["kubernetes_pod"] == f"{t['labels']['job'].removeprefix('gpusched-')}-0"
        for name in ("scheduler", "extender"):
            procs[name].kill()
            procs[name].wait()
        killed = time.monotonic()

        def firing() -> set[str]:
            assert prom is not None
            return prom.firing()

        wait_until(lambda: "GPUSchedSchedulerDown" in {a["labels"]["alertname"]
                   for a in prom.api("alerts")["data"]["alerts"]}, timeout=30, interval=1,
                   what="GPUSchedSchedulerDown pending")  # fmt: skip
        assert "GPUSchedSchedulerDown" not in firing()  # pending: the for: holds it back
        wait_until(lambda: firing() >= DOWN_ALERTS, timeout=for_s + 60, interval=1, what="down alerts firing")
        waited = time.monotonic() - killed
        assert waited >= for_s, f"fired after {waited:.0f} s, before the shipped for: {down_rule['for']}"
        assert (
            prom.check([Check("panel", "agent", q, q) for q in ['up{job="gpusched-agent"} == 1']])
            .results[0]
            .outcome
            == "data"
        )
    finally:
        if prom is not None:
            prom.stop()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def test_chart_servicemonitors_name_the_jobs_the_alert_rules_match(
    control_plane_bin: Path, tmp_path: Path
) -> None:
    """helm template: with the Prometheus Operator's CRD among the API versions, one ServiceMonitor per
    component, its job relabelled to the name the rules match, its selector, namespace and port those of a
    rendered Service whose selector picks the component's pods and whose port is the container's metrics
    port (the agent's a headless Service of its own); without the CRD, or switched off, none."""
    helm = control_plane_bin / "helm"
    if not helm.is_file():
        unavailable(f"helm is not built in {control_plane_bin} (hack/build-control-plane.sh builds it)")
    env = {k: str(tmp_path / k.lower()) for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")}
    crd = ("--api-versions", "monitoring.coreos.com/v1/ServiceMonitor")

    def render(*flags: str) -> list[dict[str, Any]]:
        cmd = [
            str(helm),
            "template",
            "gpusched",
            str(ROOT / "deploy/helm/gpusched"),
            "-n",
            "gpusched",
            *flags,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **env})
        assert out.returncode == 0, out.stderr
        return [d for d in yaml.safe_load_all(out.stdout) if d]

    for mode, jobs in (("standalone", {"gpusched-scheduler", "gpusched-agent"}),
                       ("extender", {"gpusched-extender", "gpusched-agent"})):  # fmt: skip
        docs = render("--set", f"mode={mode}", *crd)
        monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
        assert {m["spec"]["endpoints"][0]["relabelings"][-1]["replacement"] for m in monitors} == jobs
        assert jobs <= set(JOBS)
        for m in monitors:
            (ep,) = m["spec"]["endpoints"]
            assert ep["relabelings"][-1]["targetLabel"] == "job"
            sel, (ns,) = m["spec"]["selector"]["matchLabels"], m["spec"]["namespaceSelector"]["matchNames"]
            services = [d for d in docs if d["kind"] == "Service" and d["metadata"]["namespace"] == ns
                        and sel.items() <= d["metadata"]["labels"].items()]  # fmt: skip
            (svc,) = [s for s in services if any(p["name"] == ep["port"] for p in s["spec"]["ports"])]
            (port,) = [p for p in svc["spec"]["ports"] if p["name"] == ep["port"]]
            workloads = [
                d
                for d in docs
                if d["kind"] in ("Deployment", "DaemonSet")
                and svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
            ]
            (w,) = workloads  # fmt: skip
            containers = w["spec"]["template"]["spec"]["containers"]
            container_ports = {
                p["name"]: p["containerPort"] for c in containers for p in c.get("ports") or []
            }
            assert port["targetPort"] in container_ports, (m["metadata"]["name"], port, container_ports)
            assert ep.get("honorLabels", False) == (m["metadata"]["name"] == "gpusched-agent")
    assert not [d for d in render() if d["kind"] == "ServiceMonitor"]  # no CRD: nothing to create
    assert not [d for d in render("--set", "monitoring.serviceMonitor.enabled=false", *crd)
                if d["kind"] == "ServiceMonitor"]  # fmt: skip
