"""The deployment artefacts against a real kube-apiserver: every manifest under deploy/manifests and the
Helm chart (both modes) pass ``kubectl apply --dry-run=server`` without warnings, the RBAC grants what
gpusched needs and no more, the second kube-scheduler's configuration is one kube-scheduler accepts and
agrees with deploy/extender/scheduler-config.yaml, and ``gpusched testenv up|down`` round-trips.

helm is built by hack/build-control-plane.sh next to kubectl; without it the helm tests skip locally and
fail under ``$CI``, like every e2e test.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusched.testenv import ControlPlane, ControlPlaneError, free_port, session, wait_until
from realparts import unavailable

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
MANIFEST_DIR = DEPLOY / "manifests"
MANIFESTS = sorted(MANIFEST_DIR.rglob("*.yaml"))
CHART = DEPLOY / "helm" / "gpusched"
REFERENCE_SCHEDULER_CONFIG = DEPLOY / "extender" / "scheduler-config.yaml"
NAMESPACE = "gpusched-system"
AGENT_NAMESPACE = "gpusched-node"
MODES = ("standalone", "extender")
NODE_FOLDERS = ("agent", "webhook")
"""Folders every cluster applies besides one mode's: the node agent and the mutating webhook."""
README = DEPLOY / "README.md"


def load_docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def manifest_docs(path: Path) -> list[dict[str, Any]]:
    return load_docs(path.read_text())


def ident(doc: dict[str, Any]) -> tuple[str, str, str]:
    meta = doc["metadata"]
    return (doc["kind"], meta.get("namespace", ""), meta["name"])


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def api_server(control_plane_bin: Path) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver only, with the namespaces and PriorityClasses the manifests refer to created
    for real (a dry run of a pod needs its PriorityClass; any object needs its namespace)."""
    cp = ControlPlane(bin_dir=control_plane_bin, scheduler=False, controller_manager=False, kwok=False)
    try:
        cp.start()
    except ControlPlaneError as exc:
        pytest.fail(f"the e2e control plane did not start: {exc}", pytrace=False)
    try:
        docs = [d for path in MANIFESTS for d in manifest_docs(path)]
        prerequisites = {ident(d): d for d in docs if d["kind"] in ("Namespace", "PriorityClass")}
        cp.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"kind": "List", "apiVersion": "v1", "items": [*prerequisites.values()]}),
        )
        existing = {n for (k, _, n) in prerequisites if k == "Namespace"} | {"default", "kube-system"}
        for ns in sorted({d["metadata"].get("namespace") for d in docs} - existing - {None}):
            cp.kubectl("create", "namespace", ns)
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def helm(control_plane_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """The helm command (with private cache/config/data directories)."""
    binary = control_plane_bin / "helm"
    if not os.access(binary, os.X_OK):
        unavailable(
            f"helm is not built in {control_plane_bin} (hack/build-control-plane.sh builds it with Go)"
        )
    home = tmp_path_factory.mktemp("helm-home")
    saved = {k: os.environ.get(k) for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")}
    for key in saved:
        os.environ[key] = str(home / key.lower())
    try:
        yield [str(binary)]
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, **kwargs)


def helm_template(helm: list[str], mode: str, *extra: str) -> str:
    proc = run(
        [*helm, "template", "gpusched", str(CHART), "--namespace", NAMESPACE, "--set", f"mode={mode}", *extra]
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_helm_refuses_defragmentation_in_extender_mode(helm: list[str]) -> None:
    """The defragmentation controller's rooms are kept only by the standalone scheduler: asked for in extender
    mode, the chart fails naming the value, instead of rendering nothing."""
    proc = run(
        [*helm, "template", "gpusched", str(CHART), "--set", "mode=extender", "--set", "defrag.enabled=true"]
    )
    assert proc.returncode != 0 and "defrag.enabled=true needs mode=standalone" in proc.stderr, proc.stderr
    assert "kind: Deployment" in helm_template(helm, "standalone", "--set", "defrag.enabled=true")


def test_helm_dra_mode_runs_the_agent_as_the_driver_and_refuses_a_device_plugin_beside_it(
    api_server: ControlPlane, helm: list[str], tmp_path: Path
) -> None:
    """agent.dra.enabled: the agent runs with --dra (driver, CDI directory, taint effect), mounts the
    kubelet's plugin directories and the CDI directory, may write ResourceSlices (of its own node only, by a
    ValidatingAdmissionPolicy) and read ResourceClaims; the apiserver accepts it all. With NVIDIA's device
    plugin serving the GPUs (resources.nvidiaGpu=false) or GPU shares, the chart fails naming the values."""
    dra = ("agent.dra.enabled=true", "agent.dra.driverName=gpu.example.com", "agent.dra.shares=true")
    text = helm_template(helm, "standalone", *(a for v in dra for a in ("--set", v)))
    docs = load_docs(text)
    ds = next(d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("-agent"))
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--dra" in args and args[args.index("--dra-driver") + 1] == "gpu.example.com"
    assert args[args.index("--cdi-dir") + 1] == "/var/run/cdi" and "--dra-shares" in args
    mounts = {m["mountPath"] for m in ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi"} <= mounts
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-agent"))
    dra_rules = [r for r in role["rules"] if r.get("apiGroups") == ["resource.k8s.io"]]
    assert {tuple(r["resources"]): r["verbs"] for r in dra_rules}[("resourceclaims",)] == ["get"]
    assert any(
        d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].endswith("-own-slices")
        for d in docs
    )
    rendered = tmp_path / "dra.yaml"
    rendered.write_text(text)
    dry_run(api_server, rendered)
    assert "--dra" not in helm_template(helm, "standalone")  # off by default
    for value, says in (
        ("agent.resources.nvidiaGpu=false", "never both"),
        ("agent.sharing=mps", "agent.sharing=none"),
    ):
        proc = run(
            [*helm, "template", "gpusched", str(CHART), "--set", "agent.dra.enabled=true", "--set", value]
        )
        assert proc.returncode != 0 and says in proc.stderr, proc.stderr


def rendered_configs(helm: list[str], monkeypatch: pytest.MonkeyPatch, *extra: str) -> dict[str, Any]:
    """Each chart Deployment's container args (``$(VAR)`` filled in), parsed by the gpusched CLI for
    real: the config its ``scheduler`` / ``defrag run`` would start with, by first argument."""
    from typer.testing import CliRunner

    from gpusched.cli import app

    started: dict[str, Any] = {}
    monkeypatch.setattr(
        "gpusched.k8s.serve.serve_scheduler", lambda c, **_: started.setdefault("scheduler", c)
    )
    monkeypatch.setattr("gpusched.defrag.serve.serve_defrag", lambda c, **_: started.setdefault("defrag", c))
    for dep in (d for d in load_docs(helm_template(helm, "standalone", *extra)) if d["kind"] == "Deployment"):
        (c, *_) = dep["spec"]["template"]["spec"]["containers"]
        args = [re.sub(r"\$\((\w+)\)", lambda m: m.group(1).lower(), a) for a in c.get("args", [])]
        if args and args[0] in ("scheduler", "defrag"):
            res = CliRunner().invoke(app, args)
            assert res.exit_code == 0, (args, res.output)
    return started


def test_helm_passes_the_preemption_bound_and_recreating_kinds(
    helm: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """preemptionLimit / preemptionWindowSeconds reach the scheduler's config (defaults: its own),
    defrag.recreating the defragmentation controller's kinds; preemption=false passes no bound."""
    from gpusched.core.defrag import RECREATING_KINDS
    from gpusched.k8s.scheduler import SchedulerConfig

    default = rendered_configs(helm, monkeypatch, "--set", "defrag.enabled=true")
    assert (default["scheduler"].preemption_limit, default["scheduler"].preemption_window_s) == (
        SchedulerConfig.preemption_limit,
        SchedulerConfig.preemption_window_s,
    )
    assert default["defrag"].recreating == RECREATING_KINDS
    kinds = "{TFJob.kubeflow.org,PyTorchJob.kubeflow.org}"
    given = rendered_configs(
        helm,
        monkeypatch,
        *("--set", "preemptionLimit=5", "--set", "preemptionWindowSeconds=120"),
        *("--set", "defrag.enabled=true", "--set", f"defrag.recreating={kinds}"),
    )
    assert (given["scheduler"].preemption_limit, given["scheduler"].preemption_window_s) == (5, 120.0)
    assert given["defrag"].recreating == RECREATING_KINDS | {"TFJob.kubeflow.org", "PyTorchJob.kubeflow.org"}
    off = rendered_configs(helm, monkeypatch, "--set", "preemption=false", "--set", "preemptionLimit=5")
    assert off["scheduler"].preemption is False and off["scheduler"].preemption_limit == 3


def dry_run(cp: ControlPlane, path: Path) -> None:
    proc = cp.kubectl("apply", "--dry-run=server", "-f", str(path), check=False)
    assert proc.returncode == 0, f"{path}:\n{proc.stderr}"
    assert "Warning" not in proc.stderr, f"{path}:\n{proc.stderr}"
    assert proc.stdout.count("(server dry run)") == len(manifest_docs(path)), proc.stdout


# ------------------------------------------------------------------------------------------ plain manifests


def test_manifests_are_all_there() -> None:
    names = {str(p.relative_to(MANIFEST_DIR)) for p in MANIFESTS}
    for folder in (*MODES, *NODE_FOLDERS):
        assert any(n.startswith(f"{folder}/") for n in names), names
    kinds = {d["kind"] for p in MANIFESTS for d in manifest_docs(p)}
    assert {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "Role",
        "Deployment",
        "Service",
        "ConfigMap",
        "DaemonSet",
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    } <= kinds
    assert {"PriorityClass", "ResourceQuota", "Pod"} <= kinds


@pytest.mark.parametrize("path", MANIFESTS, ids=[str(p.relative_to(MANIFEST_DIR)) for p in MANIFESTS])
def test_manifest_server_dry_run(api_server: ControlPlane, path: Path) -> None:
    dry_run(api_server, path)


@pytest.mark.parametrize("mode", [*MODES, "webhook"])
def test_manifests_have_unique_names_and_hardened_pods(mode: str) -> None:
    docs = [d for p in sorted((MANIFEST_DIR / mode).glob("*.yaml")) for d in manifest_docs(p)]
    seen = [ident(d) for d in docs]
    assert len(seen) == len(set(seen)), seen
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert deployments
    for dep in deployments:
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"] and c["livenessProbe"] and c["readinessProbe"]


def test_standalone_deployment_command() -> None:
    docs = [d for p in sorted((MANIFEST_DIR / "standalone").glob("*.yaml")) for d in manifest_docs(p)]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert dep["spec"]["replicas"] == 2
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    env = dict(config["data"])
    args = [env.get(a[2:-1], a) if a.startswith("$(") else a for a in container["args"]]
    assert args[:6] == ["scheduler", "--leader-elect", "--scheduler-name", "gpusched", "--policy", "default"]
    options = dict(zip(args[2::2], args[3::2], strict=True))
    # The Lease is the one its Role grants, in its own namespace; the probes' port is the one it serves.
    assert options["--lease-name"] == "gpusched-scheduler" and options["--namespace"] == "$(POD_NAMESPACE)"
    assert options["--port"] == str(container["ports"][0]["containerPort"])
    assert {p["path"] for k in ("livenessProbe", "readinessProbe") for p in [container[k]["httpGet"]]} == {
        "/healthz",
        "/readyz",
    }


# ---------------------------------------------------------------------------------------------------- RBAC


def can_i(
    cp: ControlPlane, sa: str, verb: str, resource: str, namespace: str = "default", name: str = ""
) -> bool:
    """``kubectl auth can-i`` as a gpusched-system service account; ``resource`` may be ``pods/binding``."""
    resource, _, subresource = resource.partition("/")
    args = ["auth", "can-i", verb, f"{resource}/{name}" if name else resource, "-n", namespace]
    if subresource:
        args.append(f"--subresource={subresource}")
    proc = cp.kubectl(*args, f"--as=system:serviceaccount:{NAMESPACE}:{sa}", check=False)
    return proc.stdout.strip() == "yes"


@pytest.fixture(scope="module")
def rbac(api_server: ControlPlane) -> ControlPlane:
    """``api_server`` with the service accounts and RBAC of deploy/manifests applied for real."""
    for path in (
        "standalone/00-crd-queues.yaml",  # can-i knows the queues resource only once it is served
        "standalone/02-rbac.yaml",
        "extender/01-extender-rbac.yaml",
        "extender/03-kube-scheduler-rbac.yaml",
        "agent/01-agent-rbac.yaml",
    ):
        api_server.kubectl("apply", "-f", str(MANIFEST_DIR / path))
    return api_server


def test_rbac_is_least_privilege(rbac: ControlPlane) -> None:
    api_server = rbac

    def check(sa: str, allowed: list[tuple[str, ...]], denied: list[tuple[str, ...]]) -> None:
        for args in allowed:
            assert can_i(api_server, sa, *args), f"{sa} should be allowed {args}"
        for args in denied:
            assert not can_i(api_server, sa, *args), f"{sa} should not be allowed {args}"

    common_allowed = [
        ("watch", "pods"),
        ("list", "nodes"),
        ("create", "pods/binding"),
        ("patch", "pods"),
        ("create", "events"),
        ("create", "events.events.k8s.io"),
    ]
    common_denied = [
        ("update", "pods"),
        ("create", "pods"),
        ("patch", "nodes"),
        ("get", "secrets"),
        ("list", "configmaps"),
        ("create", "leases.coordination.k8s.io", "default"),
        ("update", "leases.coordination.k8s.io", "kube-system"),
    ]
    check(
        "gpusched",
        [
            *common_allowed,
            ("patch", "pods/status"),
            ("delete", "pods"),  # preemption victims
            ("create", "pods/eviction"),  # victims leave through the Eviction API
            ("watch", "poddisruptionbudgets.policy"),
            ("list", "namespaces"),  # namespaces map to tenant queues
            ("watch", "queues.gpusched.io"),
            ("patch", "queues.gpusched.io/status"),
            ("create", "leases.coordination.k8s.io", NAMESPACE),
            ("update", "leases.coordination.k8s.io", NAMESPACE, "gpusched-scheduler"),
            ("get", "leases.coordination.k8s.io", NAMESPACE, "gpusched-scheduler"),
            ("watch", "resourceslices.resource.k8s.io"),  # DRA: classes, slices, claims, taint rules
            ("watch", "devicetaintrules.resource.k8s.io"),
            ("update", "resourceclaims.resource.k8s.io/status"),  # status.allocation and reservedFor
        ],
        [
            *common_denied,
            ("update", "leases.coordination.k8s.io", NAMESPACE, "gpusched-kube-scheduler"),
            ("create", "resourceclaims.resource.k8s.io"),
            ("update", "resourceslices.resource.k8s.io"),
        ],
    )
    check(
        "gpusched-extender",
        [
            *common_allowed,
            ("watch", "resourceslices.resource.k8s.io"),  # DRA: claimed GPUs of mixed nodes (docs/dra.md)
            ("list", "resourceclaims.resource.k8s.io"),
            ("watch", "deviceclasses.resource.k8s.io"),
            ("watch", "devicetaintrules.resource.k8s.io"),
        ],
        [
            *common_denied,
            ("update", "resourceclaims.resource.k8s.io/status"),  # it reads DRA, kube-scheduler allocates
            ("delete", "pods"),  # kube-scheduler evicts preemption victims, not the extender
            ("patch", "pods/status"),
            ("create", "leases.coordination.k8s.io", NAMESPACE),
        ],
    )
    lease = ("leases.coordination.k8s.io", NAMESPACE)
    check(
        "gpusched-kube-scheduler",
        [("create", "pods/binding"), ("create", *lease), ("update", *lease, "gpusched-kube-scheduler")],
        [("update", *lease, "gpusched"), ("get", "secrets"), ("delete", "nodes")],
    )


def service_account_kubeconfig(cp: ControlPlane, sa: str, path: Path) -> Path:
    """A kubeconfig authenticating as ``sa`` of gpusched-system with a bound token (TokenRequest)."""
    token = cp.kubectl("create", "token", sa, "-n", NAMESPACE, "--duration=1h").stdout.strip()
    return token_kubeconfig(cp, sa, token, path)


def token_kubeconfig(cp: ControlPlane, sa: str, token: str, path: Path) -> Path:
    """A kubeconfig authenticating with ``token`` (user name ``sa`` in the file only)."""
    ca = base64.b64encode(cp.ca_cert_path.read_bytes()).decode()
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": cp.server, "certificate-authority-data": ca}}
                ],
                "users": [{"name": sa, "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": sa}}],
                "current-context": "c",
            }
        )
    )
    return path


def container_command(path: Path, env: dict[str, str]) -> list[str]:
    """The (only) Deployment's container args in ``path``, with ``$(VAR)`` expanded from ``env`` and the
    settings ConfigMaps of that directory, as the kubelet expands them."""
    docs = manifest_docs(path)
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    siblings = [d for p in sorted(path.parent.glob("*.yaml")) for d in manifest_docs(p)]
    for cm in (d for d in siblings if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config")):
        env = {**cm["data"], **env}
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]


def set_option(args: list[str], option: str, value: str) -> list[str]:
    i = args.index(option)
    return [*args[: i + 1], value, *args[i + 2 :]]


def run_until_ready(cmd: list[str], port: int, log: Path, probe: Callable[[], bool] | None = None) -> None:
    """Start ``cmd``, wait for its /readyz (and ``probe``), then stop it with SIGTERM."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:

            def ready() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                        return bool(resp.status == 200) and (probe is None or probe())
                except OSError:
                    return False

            wait_until(ready, timeout=90, what=f"/readyz of {cmd[2:]}", interval=0.5)
            assert b"Forbidden" not in log.read_bytes(), log.read_text()[-3000:]
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_scheduler_runs_under_its_rbac(rbac: ControlPlane, tmp_path: Path) -> None:
    """The standalone Deployment's very arguments, as its service account: informers sync (list/watch pods and
    nodes) and it takes its Lease (create/get/update) in gpusched-system."""
    kubeconfig = service_account_kubeconfig(rbac, "gpusched", tmp_path / "sa.kubeconfig")
    args = container_command(MANIFEST_DIR / "standalone" / "04-deployment.yaml", {"POD_NAMESPACE": NAMESPACE})
    assert args[0] == "scheduler"
    port = free_port()
    args = set_option(args, "--port", str(port))
    runner = (
        "import sys; from gpusched.cli.serve import scheduler_main; sys.argv[0] = 'gpusched scheduler'; "
        "scheduler_main()"
    )
    cmd = [sys.executable, "-c", runner, *args[1:], "--kubeconfig", str(kubeconfig)]

    def leading() -> bool:
        out = rbac.kubectl("get", "lease", "gpusched-scheduler", "-n", NAMESPACE, "-o", "json", check=False)
        return out.returncode == 0 and bool(json.loads(out.stdout)["spec"].get("holderIdentity"))

    run_until_ready(cmd, port, tmp_path / "scheduler.log", leading)


def test_extender_runs_under_its_rbac(rbac: ControlPlane, tmp_path: Path) -> None:
    kubeconfig = service_account_kubeconfig(rbac, "gpusched-extender", tmp_path / "sa.kubeconfig")
    args = container_command(MANIFEST_DIR / "extender" / "02-extender.yaml", {})
    assert args[0] == "extender"
    port = free_port()
    args = set_option(args, "--port", str(port))
    runner = "import sys; from gpusched.cli.serve import extender_main; extender_main(sys.argv[1:])"
    cmd = [sys.executable, "-c", runner, *args[1:], "--kubeconfig", str(kubeconfig)]
    run_until_ready(cmd, port, tmp_path / "extender.log")


# ------------------------------------------------------------------------------ kube-scheduler configuration


def scheduler_config_from(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("kube-scheduler-config")
    ]
    config: dict[str, Any] = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    return config


def defaulted(cp: ControlPlane, config: dict[str, Any], tmp_path: Path, name: str) -> dict[str, Any]:
    """The configuration as kube-scheduler reads, defaults and validates it (then exits)."""
    config = copy.deepcopy(config)
    config.setdefault("clientConnection", {})["kubeconfig"] = str(cp.kubeconfig_path)
    src, out = tmp_path / f"{name}.yaml", tmp_path / f"{name}.out.yaml"
    src.write_text(yaml.safe_dump(config))
    proc = run([str(cp.bin_dir / "kube-scheduler"), f"--config={src}", f"--write-config-to={out}"])
    assert proc.returncode == 0, f"kube-scheduler rejects the {name} configuration:\n{proc.stderr[-3000:]}"
    result: dict[str, Any] = yaml.safe_load(out.read_text())
    return result


def check_scheduler_config(cp: ControlPlane, config: dict[str, Any], tmp_path: Path, name: str) -> None:
    """kube-scheduler accepts it, and it is deploy/extender/scheduler-config.yaml (after defaulting)."""
    ours = defaulted(cp, config, tmp_path, name)
    assert ours["leaderElection"]["resourceNamespace"] == NAMESPACE
    assert ours["leaderElection"]["resourceName"] == "gpusched-kube-scheduler"  # the Lease its Role grants
    assert [e["urlPrefix"] for e in ours["extenders"]] == [
        "http://gpusched-extender.gpusched-system.svc:8888"
    ]
    if not REFERENCE_SCHEDULER_CONFIG.is_file():
        pytest.fail(
            f"{REFERENCE_SCHEDULER_CONFIG.relative_to(REPO)} is missing: nothing to check {name} against"
        )
    reference = defaulted(cp, yaml.safe_load(REFERENCE_SCHEDULER_CONFIG.read_text()), tmp_path, "reference")
    assert ours == reference


def test_extender_manifest_scheduler_config(api_server: ControlPlane, tmp_path: Path) -> None:
    docs = manifest_docs(MANIFEST_DIR / "extender" / "04-kube-scheduler-config.yaml")
    check_scheduler_config(api_server, scheduler_config_from(docs), tmp_path, "manifest")


def test_helm_chart_scheduler_config(api_server: ControlPlane, helm: list[str], tmp_path: Path) -> None:
    docs = load_docs(helm_template(helm, "extender"))
    check_scheduler_config(api_server, scheduler_config_from(docs), tmp_path, "chart")


# ------------------------------------------------------------------------------------------------------ helm


@pytest.mark.parametrize("mode", MODES)
def test_helm_lint(helm: list[str], mode: str) -> None:
    proc = run(
        [*helm, "lint", "--strict", str(CHART), "--set", f"mode={mode}", "--set", "quotaExample.enabled=true"]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_helm_rejects_unknown_mode(helm: list[str]) -> None:
    proc = run([*helm, "template", "gpusched", str(CHART), "--set", "mode=sidecar"])
    assert proc.returncode != 0 and "mode must be" in proc.stderr


@pytest.mark.parametrize("mode", MODES)
def test_helm_template_server_dry_run(
    api_server: ControlPlane, helm: list[str], mode: str, tmp_path: Path
) -> None:
    rendered = tmp_path / f"{mode}.yaml"
    rendered.write_text(helm_template(helm, mode, "--set", "quotaExample.enabled=true"))
    dry_run(api_server, rendered)


@pytest.mark.parametrize("mode", MODES)
def test_helm_chart_matches_manifests(helm: list[str], mode: str) -> None:
    """With release name gpusched, the chart renders the objects of deploy/manifests/<mode>, agent/ and
    webhook/ (plus PriorityClasses, the agent's namespace and the webhook's generated certificate; the
    namespace of the others is the release's)."""
    chart = {ident(d) for d in load_docs(helm_template(helm, mode))}
    plain = {
        ident(d)
        for folder in (mode, *NODE_FOLDERS)
        for p in sorted((MANIFEST_DIR / folder).glob("*.yaml"))
        for d in manifest_docs(p)
        if d["kind"] not in ("Namespace", "CustomResourceDefinition")  # CRDs: the chart's crds/ (linked)
    }
    assert plain <= chart, plain - chart
    extra = {i for i in chart - plain if i[0] != "PriorityClass"}
    assert extra == {("Namespace", "", AGENT_NAMESPACE), ("Secret", NAMESPACE, "gpusched-webhook-tls")}, extra


def test_helm_agent_policies_are_the_manifests(helm: list[str]) -> None:
    """The agent's ValidatingAdmissionPolicies and bindings the chart renders have the specs of
    agent/01-agent-rbac.yaml (which the e2e tests apply): own node, and own DeviceTaintRules where the agent
    may write them (held-GPU taints, not the DRA driver); agent.restrictToOwnNode=false renders none."""
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")

    def specs(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str], Any]:
        return {ident(d): d["spec"] for d in docs if d["kind"] in kinds}

    plain = specs(manifest_docs(MANIFEST_DIR / "agent" / "01-agent-rbac.yaml"))
    assert ("ValidatingAdmissionPolicy", "", "gpusched-agent-own-taint-rules") in plain
    assert specs(load_docs(helm_template(helm, "standalone"))) == plain
    dra = specs(load_docs(helm_template(helm, "standalone", "--set", "agent.dra.enabled=true")))
    assert {n for (_, _, n) in dra} == {"gpusched-agent-own-node", "gpusched-agent-own-slices"}, dra
    held_off = load_docs(helm_template(helm, "standalone", "--set", "agent.heldGpuTaints=false"))
    assert {n for (_, _, n) in specs(held_off)} == {"gpusched-agent-own-node"}
    assert not specs(load_docs(helm_template(helm, "standalone", "--set", "agent.restrictToOwnNode=false")))


# ---------------------------------------------------------------------------------------- gpusched testenv


def test_testenv_up_down_round_trip(control_plane_bin: Path, tmp_path: Path) -> None:
    state_dir = tmp_path / "testenv"
    from gpusched.agent.fake import fake_node_labels

    cmd = [sys.executable, "-m", "gpusched.cli", "testenv", "up", "--nodes", "2", "--gpus-per-node", "4",
           "--with-scheduler", "--state-dir", str(state_dir)]  # fmt: skip
    try:
        # In a child process: the control plane must outlive the command that started it.
        proc = run(cmd, env={**os.environ, "GPUSCHED_CONTROLPLANE_BIN": str(control_plane_bin)})
        assert proc.returncode == 0, proc.stderr
        state = session.read_state(state_dir)
        assert state is not None
        assert f"export KUBECONFIG={state.kubeconfig}" in proc.stdout
        assert {p.name for p in state.processes} == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        }
        assert all(session._alive(p) for p in state.processes)

        kubectl = [str(control_plane_bin / "kubectl"), "--kubeconfig", state.kubeconfig]
        out = run([*kubectl, "get", "nodes", "-o", "json"])
        assert out.returncode == 0, out.stderr
        nodes = {n["metadata"]["name"]: n for n in json.loads(out.stdout)["items"]}
        assert sorted(nodes) == ["gpu-node-0", "gpu-node-1"] == state.nodes
        for node in nodes.values():
            assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
            labels, alloc = node["metadata"]["labels"], node["status"]["allocatable"]
            assert (
                labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
            )  # as the agent labels a real node
            assert fake_node_labels("NVIDIA A100-SXM4-80GB", 4).items() <= labels.items()
            assert labels["nvidia.com/gpu.memory"] == "81920"
            assert labels["nvidia.com/gpu.count"] == "4"
            assert alloc["nvidia.com/gpu"] == "4"
            assert alloc["gpusched.io/gpu-milli"] in ("4000", "4k")
            assert alloc["gpusched.io/gpu-memory"] == str(4 * 81920)

        with pytest.raises(session.TestEnvError, match="already up"):
            session.testenv_up(state_dir, 1, 1, False, bin_dir=control_plane_bin)

        assert session.testenv_down(state_dir) is True
        assert not any(session._alive(p) for p in state.processes)
        assert not state_dir.exists()
        assert session.testenv_down(state_dir) is False
    finally:
        if (state_dir / session.STATE_FILE).exists():
            session.testenv_down(state_dir, quiet=True)


# ---------------------------------------------------------------------------------- node agent and webhook


def can_agent(cp: ControlPlane, verb: str, resource: str, namespace: str = "default") -> bool:
    """``kubectl auth can-i`` as the agent's service account; ``resource`` may be ``nodes/status``."""
    resource, _, subresource = resource.partition("/")
    args = ["auth", "can-i", verb, resource, "-n", namespace]
    if subresource:
        args.append(f"--subresource={subresource}")
    proc = cp.kubectl(*args, f"--as=system:serviceaccount:{AGENT_NAMESPACE}:gpusched-agent", check=False)
    return proc.stdout.strip() == "yes"


def test_agent_rbac_is_least_privilege(rbac: ControlPlane) -> None:
    allowed = [("get", "nodes"), ("patch", "nodes"), ("list", "pods"), ("watch", "pods"), ("patch", "pods")]
    allowed += [("create", "events"), ("list", "resourceslices.resource.k8s.io")]
    allowed += [(v, "devicetaintrules.resource.k8s.io") for v in ("list", "create", "delete")]
    denied = [
        ("create", "resourceslices.resource.k8s.io"), ("update", "devicetaintrules.resource.k8s.io"),
        ("list", "nodes"), ("update", "nodes"), ("delete", "nodes"), ("patch", "nodes/status"),
        ("create", "pods"), ("delete", "pods"), ("update", "pods"), ("create", "pods/binding"),
        ("get", "secrets"), ("list", "configmaps"), ("patch", "events"), ("create", "events.events.k8s.io"),
    ]  # fmt: skip
    for verb, res in allowed:
        assert can_agent(rbac, verb, res), f"the agent should be allowed {verb} {res}"
    for verb, res in denied:
        assert not can_agent(rbac, verb, res), f"the agent should not be allowed {verb} {res}"


def test_agent_changes_only_its_own_node_and_its_pods(rbac: ControlPlane) -> None:
    """RBAC lets the agent patch any node; the ValidatingAdmissionPolicy of agent/01-agent-rbac.yaml admits
    only changes to the node its token names (user extra authentication.kubernetes.io/node-name, as a pod's
    projected token carries it), and only to what the agent writes there, and to the pods bound there."""
    cp = rbac
    for n in ("vap-a", "vap-b"):
        cp.kubectl("create", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": n, "labels": {"zone": "z1"}, "annotations": {"owner": "ops"}},
            "spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]},
        }))  # fmt: skip
        cp.kubectl("create", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"pod-on-{n}", "namespace": "default"},
            "spec": {"nodeName": n, "containers": [{"name": "c", "image": "x"}]},
        }))  # fmt: skip
    taints = json.loads(cp.kubectl("get", "node", "vap-a", "-o", "json").stdout)["spec"]["taints"]

    def patch(kind: str, name: str, body: dict[str, Any], node: str | None = "vap-a") -> str:
        extra = [f"--as-user-extra=authentication.kubernetes.io/node-name={node}"] if node else []
        proc = cp.kubectl(
            "patch", kind, name, "-n", "default", "--type", "merge", "-p", json.dumps(body),
            f"--as=system:serviceaccount:{AGENT_NAMESPACE}:gpusched-agent", *extra, check=False,
        )  # fmt: skip
        return "ok" if proc.returncode == 0 else proc.stderr

    gpu_labels = {"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}}
    # the policy takes a moment to reach the admission chain after it is created
    wait_until(
        lambda: "own node" in patch("node", "vap-b", gpu_labels), timeout=30, what="the agent's policy"
    )
    health = {
        "metadata": {"annotations": {"gpusched.io/unhealthy-gpus": "0,1"}, "labels": {"gpusched.io/x": "1"}},
        "spec": {
            "taints": [*taints, {"key": "gpusched.io/gpu-unhealthy", "value": "true", "effect": "NoSchedule"}]
        },
    }
    assert patch("node", "vap-a", gpu_labels) == "ok"
    assert patch("node", "vap-a", health) == "ok"
    assert patch("node", "vap-a", {"spec": {"taints": taints}}) == "ok"  # recovery removes its taint
    assert (
        patch("pod", "pod-on-vap-a", {"metadata": {"annotations": {"gpusched.io/allocated": "{}"}}}) == "ok"
    )
    denied = {
        "another node": ("node", "vap-b", gpu_labels, "vap-a"),
        "no node in the token": ("node", "vap-a", gpu_labels, None),
        "another label": ("node", "vap-a", {"metadata": {"labels": {"zone": "z2"}}}, "vap-a"),
        "a label removed": ("node", "vap-a", {"metadata": {"labels": {"zone": None}}}, "vap-a"),
        "another annotation": ("node", "vap-a", {"metadata": {"annotations": {"owner": "me"}}}, "vap-a"),
        "another taint": ("node", "vap-a", {"spec": {"taints": []}}, "vap-a"),
        "cordon": ("node", "vap-a", {"spec": {"unschedulable": True}}, "vap-a"),
        "a pod elsewhere": (
            "pod",
            "pod-on-vap-b",
            {"metadata": {"annotations": {"gpusched.io/a": "1"}}},
            "vap-a",
        ),
        "a pod label": ("pod", "pod-on-vap-a", {"metadata": {"labels": {"x": "y"}}}, "vap-a"),
    }
    for what, (kind, name, body, node) in denied.items():
        err = patch(kind, name, body, node)
        assert "ValidatingAdmissionPolicy 'gpusched-agent-own-node'" in err and "denied" in err, (what, err)


def test_agent_writes_only_the_device_taint_rules_of_its_own_node(rbac: ControlPlane, tmp_path: Path) -> None:
    """RBAC lets the agent create and delete any DeviceTaintRule, and no node authorizer guards them; the
    ValidatingAdmissionPolicy gpusched-agent-own-taint-rules of agent/01-agent-rbac.yaml (the chart renders
    the same spec) admits the agent's rule only for the node its token names. The token is a real one,
    requested through the TokenRequest API bound to a pod on node taint-a (the apiserver adds the node's
    name); the rules are built by the agent's own code (heldtaints.rule). The admin is unaffected; a token
    bound to no pod is refused."""
    from gpusched.agent.dra.heldtaints import HeldDevice, HeldTaints, KubeTaintRules, rule

    cp = rbac
    for n in ("taint-a", "taint-b"):
        cp.kubectl(
            "create",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}),
        )
    cp.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "agent-on-taint-a", "namespace": AGENT_NAMESPACE},
        "spec": {"nodeName": "taint-a", "serviceAccountName": "gpusched-agent",
                 "containers": [{"name": "agent", "image": "gpusched"}]},
    }))  # fmt: skip
    uid = cp.kubectl(
        "get", "pod", "agent-on-taint-a", "-n", AGENT_NAMESPACE, "-o", "jsonpath={.metadata.uid}"
    )
    token = ("create", "token", "gpusched-agent", "-n", AGENT_NAMESPACE, "--duration=1h")
    bound = cp.kubectl(*token, "--bound-object-kind=Pod", "--bound-object-name=agent-on-taint-a",
                       f"--bound-object-uid={uid.stdout.strip()}").stdout.strip()  # fmt: skip
    agent = token_kubeconfig(cp, "gpusched-agent", bound, tmp_path / "agent.kubeconfig")
    unbound = token_kubeconfig(
        cp, "gpusched-agent", cp.kubectl(*token).stdout.strip(), tmp_path / "sa.kubeconfig"
    )
    kubectl = str(cp.bin_dir / "kubectl")

    def call(
        kubeconfig: Path | None, *args: str, body: dict[str, Any] | None = None
    ) -> subprocess.CompletedProcess[str]:
        auth = ["--kubeconfig", str(kubeconfig or cp.kubeconfig_path)]
        return run([kubectl, *auth, *args], input=json.dumps(body) if body else None)

    def as_(kubeconfig: Path | None, *args: str, body: dict[str, Any] | None = None) -> str:
        proc = call(kubeconfig, *args, body=body)
        return "ok" if proc.returncode == 0 else proc.stderr

    who = json.loads(call(agent, "auth", "whoami", "-o", "json").stdout)
    assert who["status"]["userInfo"]["extra"]["authentication.kubernetes.io/node-name"] == ["taint-a"], who

    def held(
        node: str,
        device: str = "gpu-0",
        pool: str | None = None,
        taint: dict[str, str] | None = None,
        **meta: Any,
    ) -> dict[str, Any]:
        """The agent's rule for ``device`` of ``node``, with ``pool``, ``taint`` and ``meta`` changed."""
        body = rule(node, HeldDevice("gpu.nvidia.com", pool or node, device, f"GPU-{node}-{device}"))
        body["spec"]["taint"].update(taint or {})
        body["metadata"].update(meta)
        return body

    mine, theirs = held("taint-a"), held("taint-b")
    policy = "ValidatingAdmissionPolicy 'gpusched-agent-own-taint-rules'"
    # the policy takes a moment to reach the admission chain after it is created (a dry run is admitted too)
    wait_until(
        lambda: policy in as_(agent, "create", "--dry-run=server", "-f", "-", body=theirs),
        timeout=30,
        what="the agent's taint-rule policy",
    )
    assert as_(agent, "create", "-f", "-", body=mine) == "ok"
    assert as_(None, "create", "-f", "-", body=theirs) == "ok"  # the admin is not affected
    other_node = 'its token names node "taint-a", DeviceTaintRule '
    denied = {
        "another node's rule": ("create", theirs, other_node),
        "another node's rule deleted": ("delete", theirs, other_node),
        "another node's pool": ("create", held("taint-a", "gpu-1", pool="taint-b"), 'selects pool "taint-b"'),
        "another node's label": (
            "create",
            held("taint-a", "gpu-2", labels={"gpusched.io/held-gpu-node": "taint-b"}),
            'labelled gpusched.io/held-gpu-node="taint-b"',
        ),
        "another node's name": (
            "create",
            held("taint-a", "gpu-3", name=held("taint-b", "gpu-3")["metadata"]["name"]),
            other_node,
        ),
        "an evicting taint": (
            "create",
            held("taint-a", "gpu-4", taint={"effect": "NoExecute"}),
            "effect NoSchedule",
        ),
        "another taint": (
            "create",
            held("taint-a", "gpu-5", taint={"key": "example.com/x"}),
            "a gpusched.io/* taint",
        ),
    }
    for what, (verb, body, says) in denied.items():
        args = (verb, "devicetaintrule", body["metadata"]["name"]) if verb == "delete" else (verb, "-f", "-")
        err = as_(agent, *args, body=None if verb == "delete" else body)
        assert policy in err and "denied" in err and says in err, (what, err)
    err = as_(unbound, "create", "-f", "-", body=held("taint-a", "gpu-6"))
    assert policy in err and "only with a token bound to a pod on a node" in err, err
    listed = call(None, "get", "devicetaintrules", "-o", "jsonpath={.items[*].metadata.name}").stdout
    assert sorted(listed.split()) == sorted(b["metadata"]["name"] for b in (mine, theirs)), listed
    assert as_(agent, "delete", "devicetaintrule", mine["metadata"]["name"]) == "ok"
    assert as_(None, "delete", "devicetaintrule", theirs["metadata"]["name"]) == "ok"

    # The agent's own client (KubeTaintRules, HeldTaints) with that token: its node's GPU is tainted, then
    # freed; posing as taint-b (a compromised agent) it creates nothing.
    for n in ("taint-a", "taint-b"):
        cp.kubectl("create", "-f", "-", input=json.dumps({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{n}-gpu"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": n,
                     "pool": {"name": n, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": f"GPU-{n}"}}}]},
        }))  # fmt: skip
    api = KubeTaintRules(str(agent))
    created, _ = HeldTaints(api, "taint-a").sync({"GPU-taint-a"})
    assert len(created) == 1 and [r["metadata"]["name"] for r in api.list_rules("taint-a")] == created
    assert HeldTaints(api, "taint-a").sync(set()) == ([], created)
    assert HeldTaints(api, "taint-b").sync({"GPU-taint-b"}) == ([], [])
    assert not api.list_rules("taint-b")


def daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    return ds


def test_agent_daemonset() -> None:
    """The DaemonSet runs the agent's light entry point with flags `gpusched agent run` has, on GPU nodes
    whatever their GPU taints, with the kubelet's device-plugin directory and a liveness probe on the port it
    serves metrics on."""
    ds = daemonset(manifest_docs(MANIFEST_DIR / "agent" / "02-agent-daemonset.yaml"))
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["python", "-m", "gpusched.cli", "agent"] and c["args"][0] == "run"
    flags = {a for a in c["args"][1:] if a.startswith("--")}
    assert flags <= agent_run_options(), flags - agent_run_options()
    options = dict(zip(c["args"][1::2], c["args"][2::2], strict=True))
    assert options["--plugin-dir"] == "/var/lib/kubelet/device-plugins"
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == options["--plugin-dir"]]
    (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert vol["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"
    (port,) = [p for p in c["ports"] if p["name"] == c["livenessProbe"]["httpGet"]["port"]]
    assert str(port["containerPort"]) == options["--metrics-port"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in c["env"]
    tolerated = {t["key"] for t in pod["tolerations"] if t["operator"] == "Exists"}
    assert {"nvidia.com/gpu", "gpusched.io/gpu-unhealthy"} <= tolerated
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {e["key"] for t in terms for e in t["matchExpressions"]} >= {"nvidia.com/gpu.present"}
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True and "privileged" not in sc


def rendered_agent_args(helm: list[str], *extra: str) -> list[str]:
    ds = daemonset(load_docs(helm_template(helm, "standalone", *extra)))
    return list(ds["spec"]["template"]["spec"]["containers"][0]["args"])


def test_helm_agent_beside_nvidia_device_plugin(helm: list[str]) -> None:
    """agent.resources.nvidiaGpu: true (default) — the agent serves nvidia.com/gpu and MIG itself (the GPU
    Operator with devicePlugin.enabled=false); false — NVIDIA's plugin keeps them and the agent serves only
    the gpusched.io/gpu-share slots (--no-nvidia-resources)."""
    takeover = rendered_agent_args(helm)
    beside = rendered_agent_args(helm, "--set", "agent.resources.nvidiaGpu=false")
    assert "--no-nvidia-resources" not in takeover
    assert "--no-nvidia-resources" in beside
    assert [a for a in beside if a != "--no-nvidia-resources"] == takeover
    assert "--no-gfd-labels" in rendered_agent_args(helm, "--set", "agent.gfdLabels=false")
    # beside NVIDIA's plugin the agent reads the kubelet's PodResources (its default socket), read-only
    for extra, mounted in (((), False), (("--set", "agent.resources.nvidiaGpu=false"), True)):
        pod = daemonset(load_docs(helm_template(helm, "standalone", *extra)))["spec"]["template"]["spec"]
        mounts = [
            m
            for m in pod["containers"][0]["volumeMounts"]
            if m["mountPath"] == "/var/lib/kubelet/pod-resources"
        ]
        assert bool(mounts) == mounted, extra
        if mounted:
            (vol,) = [v for v in pod["volumes"] if v["name"] == mounts[0]["name"]]
            assert (
                vol["hostPath"]["path"] == "/var/lib/kubelet/pod-resources" and mounts[0]["readOnly"] is True
            )
    docs = load_docs(helm_template(helm, "standalone", "--set", "agent.enabled=false"))
    assert not [d for d in docs if d["metadata"].get("name", "").startswith("gpusched-agent")]


def agent_run_options() -> set[str]:
    from typer.main import get_command

    from gpusched.cli.agent import agent_app

    run_cmd = get_command(agent_app).commands["run"]  # type: ignore[attr-defined]
    return {o for p in run_cmd.params for o in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize(
    "nvidia_gpu",
    [
        "true",
        "false",
    ],
)
def test_helm_agent_flags_are_the_agents(helm: list[str], nvidia_gpu: str) -> None:
    args = rendered_agent_args(
        helm, "--set", f"agent.resources.nvidiaGpu={nvidia_gpu}", "--set", "agent.gfdLabels=false"
    )
    flags = {a for a in args if a.startswith("--")}
    assert flags <= agent_run_options(), flags - agent_run_options()


@pytest.mark.parametrize("nvidia_gpu", ["true", "false"])
def test_helm_agent_modes_server_dry_run(
    api_server: ControlPlane, helm: list[str], nvidia_gpu: str, tmp_path: Path
) -> None:
    rendered = tmp_path / "agent.yaml"
    rendered.write_text(helm_template(helm, "standalone", "--set", f"agent.resources.nvidiaGpu={nvidia_gpu}"))
    dry_run(api_server, rendered)


@pytest.mark.parametrize("sharing", ["mps", "hami-core"])
def test_helm_agent_sharing_modes(
    api_server: ControlPlane, helm: list[str], sharing: str, tmp_path: Path
) -> None:
    """agent.sharing gives the agent its mode and what the mode needs (docs/gpu-sharing.md): mps the MPS root
    at its host path, the compute capability (nvidia-cuda-mps-control) and privilege (a mount namespace per
    daemon); hami-core the library's directory, read-only. The flags are the agent's; the API takes it."""
    text = helm_template(helm, "standalone", "--set", f"agent.sharing={sharing}")
    pod = daemonset(load_docs(text))["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    args = c["args"]
    assert {a for a in args if a.startswith("--")} <= agent_run_options()
    assert args[args.index("--sharing") + 1] == sharing
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    env = {e["name"]: e.get("value") for e in c["env"]}
    if sharing == "mps":
        root = args[args.index("--mps-root") + 1]
        assert paths[mounts[root]["name"]] == root == "/run/gpusched/mps"
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility" and c["securityContext"]["privileged"]
    else:
        lib = args[args.index("--hami-lib") + 1]
        d = lib.rsplit("/", 1)[0]
        assert paths[mounts[d]["name"]] == d and mounts[d]["readOnly"] is True
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility" and "privileged" not in c["securityContext"]
    rendered = tmp_path / "agent.yaml"
    rendered.write_text(text)
    dry_run(api_server, rendered)


def test_helm_agent_mig_manager_way_gets_its_flags_and_a_role_on_one_configmap(
    api_server: ControlPlane, helm: list[str], tmp_path: Path
) -> None:
    """agent.migReshape.migManager.enabled: the agent gets mig-manager's ConfigMap settings as its own flags
    and a Role in that namespace whose get/update name only that ConfigMap, bound to the agent's account."""
    text = helm_template(
        helm, "standalone",
        "--set", "agent.migReshape.migManager.enabled=true",
        "--set", "agent.migReshape.migManager.namespace=gpu-operator",
        "--set", "agent.migReshape.migManager.configMap=my-mig-config",
    )  # fmt: skip
    docs = load_docs(text)
    (c,) = daemonset(docs)["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    assert {a for a in args if a.startswith("--")} <= agent_run_options()
    assert args[args.index("--mig-manager-configmap") + 1] == "my-mig-config"
    assert args[args.index("--mig-reshape-way") + 1] == "nvml"  # the node label picks mig-manager per pool
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-mig-parted")]
    assert role["metadata"]["namespace"] == "gpu-operator"
    named = [r for r in role["rules"] if "resourceNames" in r]
    assert named == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["my-mig-config"],
            "verbs": ["get", "update"],
        }
    ]
    (binding,) = [
        d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == role["metadata"]["name"]
    ]
    assert binding["subjects"][0]["name"] == daemonset(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    plain = load_docs(helm_template(helm, "standalone"))
    assert not [d for d in plain if d["kind"] == "Role" and d["metadata"]["name"].endswith("-mig-parted")]
    assert (
        "--mig-manager-configmap" not in daemonset(plain)["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    rendered = tmp_path / "agent.yaml"
    rendered.write_text(text.replace("namespace: gpu-operator", "namespace: default"))
    dry_run(api_server, rendered)


def webhooks(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (config,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    return list(config["webhooks"])


def test_helm_webhook_certificate_and_configuration(helm: list[str]) -> None:
    """The chart's certificate (genSignedCert) is for the webhook's Service and signed by the caBundle's CA;
    its webhook configuration is the manifests' (rules, selectors, conditions, failure policy)."""
    x509 = pytest.importorskip("cryptography.x509")
    docs = load_docs(helm_template(helm, "standalone"))
    hooks = webhooks(docs)
    plains = webhooks(manifest_docs(MANIFEST_DIR / "webhook" / "02-mutatingwebhookconfiguration.yaml"))
    assert [h["name"] for h in hooks] == [p["name"] for p in plains] == [
        "gpu-share.gpusched.io", "assignment-guard.gpusched.io", "gpu-routing.gpusched.io"
    ]  # fmt: skip
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "gpusched-webhook-tls"]
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    for hook, plain in zip(hooks, plains, strict=True):
        ca = x509.load_pem_x509_certificate(base64.b64decode(hook["clientConfig"]["caBundle"]))
        cert.verify_directly_issued_by(ca)
        service = hook["clientConfig"]["service"]
        assert f"{service['name']}.{service['namespace']}.svc" in sans
        for key in ("rules", "namespaceSelector", "matchConditions", "failurePolicy", "sideEffects", "name"):
            assert hook.get(key) == plain.get(key), (hook["name"], key)
        assert {k: v for k, v in service.items()} == plain["clientConfig"]["service"]
    # the webhook's flags name the same writers as the guard's matchConditions
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpusched-webhook"
    ]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    writers = {args[i + 1] for i, a in enumerate(args) if a in ("--assignment-writer", "--allocated-writer")}
    assert writers == {
        "system:serviceaccount:gpusched-system:gpusched",
        "system:serviceaccount:gpusched-system:gpusched-extender",
        "system:serviceaccount:gpusched-node:gpusched-agent",
    }
    assert all(w in hooks[1]["matchConditions"][0]["expression"] for w in writers)


def test_helm_webhook_with_cert_manager(helm: list[str]) -> None:
    docs = load_docs(helm_template(helm, "standalone", "--set", "certManager.enabled=true"))
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Issuer", "gpusched-webhook"), ("Certificate", "gpusched-webhook")} <= kinds
    assert ("Secret", "gpusched-webhook-tls") not in kinds
    (config,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert (
        config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/gpusched-webhook"
    )
    assert not any("caBundle" in h["clientConfig"] for h in config["webhooks"])
    (cert,) = [d for d in docs if d["kind"] == "Certificate"]
    assert cert["spec"]["secretName"] == "gpusched-webhook-tls"
    assert f"gpusched-webhook.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]


# ----------------------------------------------------------------------- a newcomer's commands, as written


def readme_commands() -> list[str]:
    """The deployment commands of deploy/README.md's sh blocks, in order: each `kubectl apply -f
    deploy/manifests/...` and `deploy/webhook-certs.sh`, comments stripped."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(), re.S):
        for line in block.splitlines():
            cmd = line.split("#", 1)[0].strip()
            if cmd.startswith("kubectl apply -f deploy/manifests/") or cmd == "deploy/webhook-certs.sh":
                commands.append(cmd)
    return commands


def test_readme_applies_every_manifests_folder_once() -> None:
    folders = {str(p.parent.relative_to(REPO)) + "/" for p in MANIFESTS}
    applied = [c.split()[-1] for c in readme_commands() if c.startswith("kubectl")]
    assert sorted(applied) == sorted(folders), (applied, folders)


class LocalCluster:
    """``gpusched up`` (``gpusched.testenv.local.cluster_up``) in ``tmp``: the control plane, kwok GPU nodes
    labelled as the agent labels NVIDIA A100-SXM4-80GB GPUs, gpusched's scheduler (``schedulerName:
    gpusched``) and webhook processes; ``down()`` stops it all."""

    def __init__(self, bin_dir: Path, tmp: Path, nodes: int = 1, gpus: int = 4) -> None:
        from gpusched.agent.fake import fake_node_labels
        from gpusched.testenv import local

        self.bin_dir, self.state_dir = bin_dir, tmp / "state"
        self.state = local.cluster_up(
            self.state_dir, nodes, gpus, fake_node_labels("NVIDIA A100-SXM4-80GB", gpus), bin_dir=bin_dir
        )
        self.kubectl_cmd = [str(bin_dir / "kubectl"), "--kubeconfig", self.state.kubeconfig]

    def kubectl(self, *args: str, input: str | None = None) -> str:
        proc = run([*self.kubectl_cmd, *args], input=input)
        assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
        return proc.stdout

    def get(self, kind: str, name: str, namespace: str = "") -> dict[str, Any]:
        ns = ["-n", namespace] if namespace else []
        return dict(json.loads(self.kubectl("get", kind, name, *ns, "-o", "json")))

    def add_agent_labelled_node(self, name: str, model: str, gpus: int) -> dict[str, str]:
        """A kwok node with the labels the agent writes for ``gpus`` fake GPUs of NVML name ``model``."""
        from gpusched.agent.fake import fake_node_labels
        from gpusched.k8s.convert import LABEL_MEMORY, LABEL_PRODUCT
        from gpusched.testenv.kwoknodes import kwok_gpu_node

        labels = fake_node_labels(model, gpus, hostname=name)
        product, memory = labels[LABEL_PRODUCT], int(labels[LABEL_MEMORY])
        node = kwok_gpu_node(name, gpus, model=product, gpu_memory_mib=memory, labels=labels)
        self.kubectl("apply", "-f", "-", input=json.dumps(node))
        return labels

    def down(self) -> None:
        from gpusched.testenv import local

        local.cluster_down(self.state_dir)


def test_readme_commands_on_a_fresh_api_server(control_plane_bin: Path, tmp_path: Path) -> None:
    """A newcomer's first steps: deploy/README.md's commands exactly as written, in order, each once, on an
    API server that has nothing of gpusched's yet (no namespace, PriorityClass, RBAC, ...): each folder
    brings what it needs in file order. Both modes' blocks run too: they apply side by side, though a
    cluster runs only one. The share pod of the examples, applied last as README says, is admitted through
    the webhook (its container carries the slot gpusched.io/gpu-share: 1) and lands: gpusched binds it to a
    node labelled as the agent labels one, with its assignment. The cluster is ``gpusched up``'s (kwok
    nodes, the scheduler and the webhook as processes); the one change the test makes is the webhook
    configuration's clientConfig, pointed (right after deploy/webhook-certs.sh) at the webhook process: there
    is no kube-proxy to route its Service (``gpusched up``'s own registration is deleted first)."""
    if not os.access("/usr/bin/openssl", os.X_OK) and not any(
        os.access(Path(d) / "openssl", os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep)
    ):
        unavailable("openssl is not installed (deploy/webhook-certs.sh needs it)")
    cluster = LocalCluster(control_plane_bin, tmp_path)
    try:
        local_hook = cluster.get("mutatingwebhookconfiguration", "gpusched-webhook")["webhooks"][0][
            "clientConfig"
        ]
        cluster.kubectl("delete", "mutatingwebhookconfiguration", "gpusched-webhook")  # nothing of gpusched's
        kubectl = " ".join(cluster.kubectl_cmd)
        for cmd in readme_commands():
            if cmd.startswith("kubectl "):
                proc = run([*cluster.kubectl_cmd, *cmd.split()[1:]], cwd=REPO)
            else:
                proc = run(["bash", cmd], cwd=REPO, env={**os.environ, "KUBECTL": kubectl})
            assert proc.returncode == 0, f"{cmd}:\n{proc.stdout}\n{proc.stderr}"
            assert "Warning" not in proc.stderr, f"{cmd}:\n{proc.stderr}"
            if cmd == "deploy/webhook-certs.sh":  # the webhooks' Service, as the cluster would route it
                hooks = cluster.get("mutatingwebhookconfiguration", "gpusched-webhook")["webhooks"]
                assert all(h["clientConfig"]["caBundle"] for h in hooks)  # the CA in every webhook
                base = local_hook["url"].rsplit("/", 1)[0]  # each webhook at its own path on the local one
                patch = [
                    {"op": "replace", "path": f"/webhooks/{i}/clientConfig",
                     "value": {**local_hook, "url": base + h["clientConfig"]["service"]["path"]}}
                    for i, h in enumerate(hooks)
                ]  # fmt: skip
                cluster.kubectl("patch", "mutatingwebhookconfiguration", "gpusched-webhook", "--type=json",
                                "-p", json.dumps(patch))  # fmt: skip
        secret = cluster.get("secret", "gpusched-webhook-tls", NAMESPACE)
        assert secret["data"]["tls.crt"]
        pod = cluster.get("pod", "gpu-share-example", "gpu-team-a")
        assert pod["spec"]["priorityClassName"] == "gpu-batch"
        assert pod["spec"]["containers"][0]["resources"]["limits"]["gpusched.io/gpu-share"] == "1"

        def landed() -> bool:
            return bool(cluster.get("pod", "gpu-share-example", "gpu-team-a")["spec"].get("nodeName"))

        wait_until(landed, timeout=60, what="the README's share pod bound", interval=0.5)
        pod = cluster.get("pod", "gpu-share-example", "gpu-team-a")
        assignment = json.loads(pod["metadata"]["annotations"]["gpusched.io/assignment"])
        assert assignment["node"] == pod["spec"]["nodeName"] and assignment["milli"] == 500
        node = cluster.get("node", pod["spec"]["nodeName"])
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    finally:
        cluster.down()


EXAMPLE_DIRS = [DEPLOY / "examples" / "local", DEPLOY / "manifests" / "standalone" / "examples"]
NEVER_FITS = {"gpu-demo/too-big"}  # 8 whole GPUs on nodes of 4: the quickstart's pod for doctor


def test_every_example_lands_on_nodes_labelled_as_the_agent_labels_them(
    control_plane_bin: Path, tmp_path: Path
) -> None:
    """Every example folder in deploy/ applied as is (the local one first: it brings the PriorityClasses),
    with gpusched up's scheduler and webhook, on kwok nodes whose labels are exactly the agent's for fake
    NVIDIA A100-SXM4-80GB, NVIDIA H100 80GB HBM3 and Tesla T4 GPUs: every example pod is bound, to a node
    whose nvidia.com/gpu.product is one of the models its gpusched.io/gpu-models names (in either form, with
    or without the vendor prefix), with its assignment and, for a share, its slot; but the one meant never to
    fit, which stays Pending with a FailedScheduling event."""
    from gpusched.core.gpumodel import canonical_gpu_model

    found = sorted(p.relative_to(DEPLOY) for p in DEPLOY.rglob("*.yaml") if "examples" in p.parts)
    assert found == sorted(p.relative_to(DEPLOY) for d in EXAMPLE_DIRS for p in d.glob("*.yaml")), found
    cluster = LocalCluster(control_plane_bin, tmp_path, nodes=1, gpus=4)
    try:
        models = {"h100-node": "NVIDIA H100 80GB HBM3", "t4-node": "Tesla T4"}
        labelled = {n: cluster.add_agent_labelled_node(n, m, 4) for n, m in models.items()}
        for d in EXAMPLE_DIRS:
            out = run([*cluster.kubectl_cmd, "apply", "-f", str(d)], cwd=REPO)
            assert out.returncode == 0 and "Warning" not in out.stderr, f"{d}: {out.stderr}"
        pods = [doc for d in EXAMPLE_DIRS for p in sorted(d.glob("*.yaml")) for doc in manifest_docs(p)
                if doc["kind"] == "Pod"]  # fmt: skip
        keys = {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods}
        assert keys >= NEVER_FITS and len(keys) >= 4

        def live(key: str) -> dict[str, Any]:
            ns, name = key.split("/")
            return cluster.get("pod", name, ns)

        def bound() -> bool:
            return all(live(k)["spec"].get("nodeName") for k in keys - NEVER_FITS)

        wait_until(bound, timeout=90, what=f"the example pods {sorted(keys - NEVER_FITS)} bound", interval=1)
        for key in sorted(keys - NEVER_FITS):
            pod = live(key)
            node = cluster.get("node", pod["spec"]["nodeName"])
            product = node["metadata"]["labels"]["nvidia.com/gpu.product"]
            asked = (pod["metadata"].get("annotations") or {}).get("gpusched.io/gpu-models")
            if asked:
                assert canonical_gpu_model(product) in {canonical_gpu_model(m) for m in asked.split("|")}, key
            if node["metadata"]["name"] in labelled:
                assert labelled[node["metadata"]["name"]].items() <= node["metadata"]["labels"].items()
            assert product.startswith(("NVIDIA-", "Tesla-")), product  # as the agent and GFD write it
            assignment = json.loads(pod["metadata"]["annotations"]["gpusched.io/assignment"])
            assert assignment["node"] == node["metadata"]["name"]
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            if "gpusched.io/gpu-milli" in limits or "gpusched.io/gpu-memory" in limits:
                assert limits.get("gpusched.io/gpu-share") == "1", key  # the webhook's slot
        (never,) = NEVER_FITS
        ns, name = never.split("/")

        def refused() -> bool:
            events = json.loads(cluster.kubectl("get", "events", "-n", ns, "-o", "json"))["items"]
            return any(
                e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == name for e in events
            )

        wait_until(refused, timeout=30, what=f"a FailedScheduling event for {never}", interval=1)
        assert not live(never)["spec"].get("nodeName")
    finally:
        cluster.down()


def test_helm_passes_the_gang_topology_levels(helm: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """gangTopologyLevels reaches the scheduler's config (default: its own), in order."""
    from gpusched.core.gangtopology import TopologyLevels

    default = rendered_configs(helm, monkeypatch)
    assert default["scheduler"].gang_topology_levels == TopologyLevels()
    given = rendered_configs(
        helm, monkeypatch, "--set", "gangTopologyLevels={example.com/tray,example.com/row}"
    )
    assert given["scheduler"].gang_topology_levels.keys == ("example.com/tray", "example.com/row")
