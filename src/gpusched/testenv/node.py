"""``RealNode``: a real Kubernetes node on this machine — containerd, runc, CNI, the kubelet — joined to a
``ControlPlane``, with gpusched's node agent on fake GPUs as its device plugin.

What made a real kubelet work on these machines (``../shared/reference/real-kubelet.md``):

* containerd (Debian's 1.6) with its own root, state and socket under a scratch directory,
  ``restrict_oom_score_adj`` (no CAP_SYS_RESOURCE here), runc v2 with cgroupfs, CNI ``bridge`` +
  ``host-local`` + ``loopback`` on a private /24 (no masquerading, so no iptables rules), runc's state under
  the scratch directory too;
* images without a registry: ``hack/build-node-images.sh`` (pause from ``pause.c``, a static busybox),
  imported with ``ctr -n k8s.io images import``; pods use ``imagePullPolicy: Never``;
* the kubelet (``hack/build-control-plane.sh`` builds it beside kube-apiserver) with the control plane's PKI:
  a client certificate ``system:node:<name>`` in group ``system:nodes`` (the apiserver's Node authorizer),
  a serving certificate for the node's address, x509 + webhook authentication and webhook authorization (no
  anonymous access); ``failCgroupV1: false``; the device-plugin directory is fixed at
  ``/var/lib/kubelet/device-plugins`` whatever ``--root-dir`` says, so only one RealNode can run per machine
  (a lock file serialises them);
* ``python -m gpusched.cli agent run --fake FILE`` against that directory.

The host side effects are undone by ``stop()``, in this order: the pods on the node are deleted (the kubelet
stops them), then the agent, the kubelet, what is left of the containers (their processes, by cgroup; their
tasks, through containerd), containerd, its shims (those serving this containerd's address), mounts under the
scratch directory, network namespaces and the bridge it made, the kubelet's iptables chains, the kubepods
cgroups, and the sysctls the kubelet or the bridge plugin changed (restored to the values saved at start).
Every daemon is started directly (its recorded PID is its own) and only those PIDs, and shims of this
containerd, are signalled.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import fcntl
import ipaddress
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gpusched.testenv.binaries import (
    BinariesUnavailableError,
    ControlPlaneError,
    find_build_script,
    run_build_script,
)
from gpusched.testenv.controlplane import ControlPlane, free_port, stop_process
from gpusched.testenv.pki import issue_certificate

#: Directory holding pause.tar, busybox.tar and images.env (skips hack/build-node-images.sh).
ENV_NODE_IMAGES = "GPUSCHED_NODE_IMAGES"
#: A bin directory with containerd >= 1.7 (``hack/build-containerd.sh``): used instead of the one on PATH,
#: with CDI on in its CRI plugin (``enable_cdi``, specs in ``RealNode.cdi_dir``); bookworm's 1.6 has no CDI.
ENV_CONTAINERD_BIN = "GPUSCHED_CONTAINERD_BIN"
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
"""Fixed in the kubelet (it ignores ``--root-dir`` for the device-plugin socket)."""
CNI_BIN_DIR = Path("/usr/lib/cni")
LOCK_FILE = Path("/run/lock/gpusched-real-node.lock")
BRIDGE = "gpusched-br0"
POD_SUBNET = "10.250.0.0/24"
#: What the kubelet (vm.*, kernel.*) and the CNI bridge plugin (ip_forward, with isGateway) may change.
SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops", "net/ipv4/ip_forward")
_CGROUP_ROOT = Path("/sys/fs/cgroup")
_NETNS_DIR = Path("/run/netns")
_CONTAINER_LOGS = Path("/var/log/containers")
_BUILD_IMAGES = "build-node-images.sh"


class NodeError(ControlPlaneError):
    """The real node could not be started, used or stopped."""


class NodePartsMissingError(NodeError):
    """Parts a real node needs are not on this machine (``missing`` lists them, each with how to get it)."""

    def __init__(self, missing: Sequence[str]) -> None:
        super().__init__("the real node cannot run here: " + "; ".join(missing))
        self.missing = list(missing)


def missing_parts(bin_dir: Path) -> list[str]:
    """What this machine lacks to run a ``RealNode`` (empty: nothing), each with how to get it."""
    out = []
    if os.geteuid() != 0:
        out.append("not running as root (containerd, the kubelet and CNI need it)")
    for tool, pkg in (("containerd", "containerd"), ("ctr", "containerd"), ("runc", "runc"),
                      ("ip", "iproute2")):  # fmt: skip
        if shutil.which(tool) is None:
            out.append(f"no '{tool}' on PATH (apt-get install -y {pkg})")
    if shutil.which("containerd-shim-runc-v2") is None:
        out.append("no 'containerd-shim-runc-v2' on PATH (apt-get install -y containerd)")
    for plugin in ("bridge", "host-local", "loopback"):
        if not os.access(CNI_BIN_DIR / plugin, os.X_OK):
            pkg = "containernetworking-plugins"
            out.append(f"no CNI plugin {CNI_BIN_DIR / plugin} (apt-get install -y {pkg})")
    if not os.access(bin_dir / "kubelet", os.X_OK):
        out.append(f"no kubelet in {bin_dir} (hack/build-control-plane.sh builds it; needs Go)")
    if not (_CGROUP_ROOT / "memory").is_dir() and not (_CGROUP_ROOT / "cgroup.controllers").is_file():
        out.append(f"no cgroup hierarchy under {_CGROUP_ROOT}")
    return out


def find_node_images(*, build: bool = True, timeout: float = 600.0) -> Path:
    """The directory with ``pause.tar``, ``busybox.tar`` and ``images.env``: ``$GPUSCHED_NODE_IMAGES``, else
    what ``hack/build-node-images.sh`` prints (a no-op once built). Raises ``NodePartsMissingError``."""
    env_dir = os.environ.get(ENV_NODE_IMAGES)
    if env_dir:
        d = Path(env_dir)
    else:
        cp_script = find_build_script()
        script = cp_script.parent / _BUILD_IMAGES if cp_script else None
        if script is None or not script.is_file():
            raise NodePartsMissingError([f"no hack/{_BUILD_IMAGES} (set ${ENV_NODE_IMAGES})"])
        if not build:
            raise NodePartsMissingError([f"${ENV_NODE_IMAGES} is not set and building was not allowed"])
        try:
            d = run_build_script(script, timeout, tail_lines=15)
        except BinariesUnavailableError as e:
            raise NodePartsMissingError([str(e)]) from None
    missing = [n for n in ("pause.tar", "busybox.tar", "images.env") if not (d / n).is_file()]
    if missing:
        raise NodePartsMissingError([f"{d} lacks {', '.join(missing)} (hack/{_BUILD_IMAGES} makes them)"])
    return d


def node_ip() -> str:
    """The address the kubelet would pick: that of the interface of the default route (never loopback,
    which the kubelet refuses as a node IP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))  # UDP connect sends nothing; it only picks the route
            ip = str(s.getsockname()[0])
        except OSError:
            ip = ""
    if not ip or ipaddress.ip_address(ip).is_loopback:
        raise NodePartsMissingError(["no non-loopback IPv4 address with a route (the kubelet needs one)"])
    return ip


@dataclass
class _Daemon:
    name: str
    cmd: list[str]
    env: dict[str, str]
    log_path: Path
    log_file: IO[bytes]
    popen: subprocess.Popen[bytes] | None = None
    stopping: bool = False
    """Being stopped on purpose: ``check_alive`` does not count its exit."""

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None and self.popen.poll() is None else None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


class RealNode:
    """One real node (containerd + kubelet + gpusched agent on fake GPUs) joined to ``control_plane``.

    Args:
        control_plane: a started ``ControlPlane`` (with the controller manager, which lifts the not-ready
            taint, and without kwok, which would take the node over).
        gpus: the fake backend's ``gpus`` entries (see ``gpusched.agent.fake``); give explicit ``uuid``s to
            know what the containers must see.
        name: the Node's name (default ``gpusched-node-<random>``).
        images_dir: from ``find_node_images()`` by default.
        slots: ``gpusched.io/gpu-share`` slots per GPU (the agent's ``--slots``).
        agent: start the agent (``start_agent()`` later otherwise).
        agent_args: extra arguments for ``gpusched agent run``.
    """

    def __init__(
        self,
        control_plane: ControlPlane,
        gpus: Sequence[Mapping[str, Any]],
        *,
        name: str | None = None,
        images_dir: Path | None = None,
        slots: int = 16,
        agent: bool = True,
        agent_args: Sequence[str] = (),
        startup_timeout: float = 120.0,
        lock_timeout: float = 600.0,
    ) -> None:
        self.cp = control_plane
        self.name = name or f"gpusched-node-{uuid.uuid4().hex[:6]}"
        self._gpus = [dict(g) for g in gpus]
        self._images_dir = images_dir
        self.slots = slots
        self._want_agent = agent
        self._agent_args = list(agent_args)
        self._startup_timeout = startup_timeout
        self._lock_timeout = lock_timeout
        self._lock: IO[bytes] | None = None
        self.workdir = Path()
        self._daemons: dict[str, _Daemon] = {}
        self._saved_sysctls: dict[str, str] = {}
        self._netns_before: set[str] = set()
        self._logs_before: set[str] = set()
        self._created_var_lib_kubelet = False
        self._created_container_logs = False
        self._created_netns_dir = False
        self._chains_before: dict[str, set[tuple[str, str]]] = {}
        self._created_cgroups: list[Path] = []
        self.ip = ""
        self.pause_image = ""
        self.busybox_image = ""
        self.started = False

    # -- paths -----------------------------------------------------------------------------------------

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def cdi_dir(self) -> Path:
        """Where containerd reads CDI specs (``$GPUSCHED_CONTAINERD_BIN``) and a DRA agent writes them."""
        return self.workdir / "cdi"

    @property
    def cdi(self) -> bool:
        """This node's containerd injects CDI devices (``$GPUSCHED_CONTAINERD_BIN``: containerd >= 1.7)."""
        return _containerd_bin() is not None

    @property
    def plugins_registry(self) -> Path:
        """The kubelet's plugin-watcher directory, where DRA drivers register."""
        return self.workdir / "kubelet" / "root" / "plugins_registry"

    def dra_agent_args(self, dev_root: Path) -> list[str]:
        """``gpusched agent run`` arguments for the agent as this node's DRA driver (device nodes from
        ``dev_root``)."""
        return ["--dra", "--cdi-dir", str(self.cdi_dir), "--dra-registry-dir", str(self.plugins_registry),
                "--dra-plugins-dir", str(self.workdir / "kubelet" / "root" / "plugins"),
                "--dra-dev-root", str(dev_root)]  # fmt: skip

    @property
    def fake_gpus_path(self) -> Path:
        return self.workdir / "fake-gpus.yaml"

    @property
    def xid_file(self) -> Path:
        return self.workdir / "xids"

    @property
    def pids(self) -> dict[str, int]:
        """The PIDs of the running daemons (``containerd``, ``kubelet``, ``agent``)."""
        return {n: d.pid for n, d in self._daemons.items() if d.pid is not None}

    @property
    def log_paths(self) -> dict[str, Path]:
        return {n: d.log_path for n, d in self._daemons.items()}

    # -- start -----------------------------------------------------------------------------------------

    def start(self) -> None:
        if self.started:
            raise NodeError("already started")
        missing = missing_parts(self.cp.bin_dir)
        if missing:
            raise NodePartsMissingError(missing)
        images = self._images_dir or find_node_images()
        env_file = dict(
            line.split("=", 1) for line in (images / "images.env").read_text().splitlines() if "=" in line
        )
        self.pause_image, self.busybox_image = env_file["PAUSE_IMAGE"], env_file["BUSYBOX_IMAGE"]
        self.ip = node_ip()
        self._take_lock()
        self.workdir = Path(tempfile.mkdtemp(prefix="gpusched-node-"))
        self.workdir.chmod(0o755)
        atexit.register(self.stop)
        self.started = True
        try:
            self._snapshot_host()
            self._start_containerd(images)
            self._start_kubelet()
            if self._want_agent:
                self.start_agent()
        except BaseException:
            self.stop()
            raise

    def _take_lock(self) -> None:
        LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
        f = LOCK_FILE.open("ab")
        deadline = time.monotonic() + self._lock_timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    f.close()
                    raise NodeError(
                        f"another real node holds {LOCK_FILE} (one per machine: the kubelet's device-plugin "
                        f"directory {DEVICE_PLUGIN_DIR} is fixed) for over {self._lock_timeout:.0f}s"
                    ) from None
                time.sleep(1.0)
        self._lock = f

    def _snapshot_host(self) -> None:
        for key in SYSCTLS:
            value = _read(Path("/proc/sys") / key)
            if value is not None:
                self._saved_sysctls[key] = value.strip()
        self._netns_before = set(os.listdir(_NETNS_DIR)) if _NETNS_DIR.is_dir() else set()
        self._created_netns_dir = not _NETNS_DIR.exists()
        self._logs_before = set(os.listdir(_CONTAINER_LOGS)) if _CONTAINER_LOGS.is_dir() else set()
        self._created_var_lib_kubelet = not Path("/var/lib/kubelet").exists()
        self._created_container_logs = not _CONTAINER_LOGS.exists()
        self._chains_before = {cmd: _iptables_chains(cmd) for cmd in _IPTABLES}
        self._created_cgroups = [
            c / "kubepods" for c in _cgroup_controllers() if not (c / "kubepods").exists()
        ]
        if _link_exists(BRIDGE):
            raise NodeError(f"the bridge {BRIDGE} exists (left by an earlier run?): ip link del {BRIDGE}")
        if DEVICE_PLUGIN_DIR.is_dir() and any(DEVICE_PLUGIN_DIR.glob("*.sock")):
            # a kubelet left by someone else would fight ours for this directory
            socks = ", ".join(sorted(p.name for p in DEVICE_PLUGIN_DIR.glob("*.sock")))
            if any(_listening(p) for p in DEVICE_PLUGIN_DIR.glob("kubelet.sock")):
                raise NodeError(f"a kubelet already serves {DEVICE_PLUGIN_DIR}/kubelet.sock ({socks})")

    def _spawn(self, name: str, cmd: list[str], env: Mapping[str, str] | None = None) -> _Daemon:
        d = self._daemons.get(name)
        if d is None:
            log_dir = self.workdir / "logs"
            log_dir.mkdir(exist_ok=True)
            log_path = log_dir / f"{name}.log"
            d = _Daemon(name, cmd, {**os.environ, **(env or {})}, log_path, log_path.open("ab"))
            self._daemons[name] = d
        d.log_file.write(f"$ {' '.join(d.cmd)}\n".encode())
        d.log_file.flush()
        d.popen = subprocess.Popen(
            d.cmd, stdin=subprocess.DEVNULL, stdout=d.log_file, stderr=subprocess.STDOUT, env=d.env,
            cwd=self.workdir, start_new_session=True,
        )  # fmt: skip
        return d

    def _wait(self, what: str, probe: Callable[[], bool], daemon: str, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self._startup_timeout)
        d = self._daemons[daemon]
        while True:
            if d.popen is not None and d.popen.poll() is not None:
                code = d.popen.returncode
                raise NodeError(f"{daemon} exited with {code} before {what}; log tail:\n{d.log_tail()}")
            with contextlib.suppress(Exception):
                if probe():
                    return
            if time.monotonic() > deadline:
                raise NodeError(f"timed out waiting for {what}; {daemon} log tail:\n{d.log_tail()}")
            time.sleep(0.25)

    def _start_containerd(self, images: Path) -> None:
        base = self.workdir / "containerd"
        for sub in ("root", "state", "opt", "runc"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        net_d = self.workdir / "cni" / "net.d"
        net_d.mkdir(parents=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": "gpusched-test",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,  # the pods talk to this machine only: no NAT rules to leave behind
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "dataDir": str(self.workdir / "cni" / "ipam"),
                    },
                },
                {"type": "loopback"},
            ],
        }
        (net_d / "10-gpusched.conflist").write_text(json.dumps(conflist, indent=2))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""version = 2
root = "{base / "root"}"
state = "{base / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{self.containerd_socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{base / "opt"}"
[{cri}]
  sandbox_image = "{self.pause_image}"
  restrict_oom_score_adj = true
  enable_selinux = false
  [{cri}.containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{base / "runc"}"
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{net_d}"
"""
        own = _containerd_bin()
        env = None
        if own is not None:  # containerd >= 1.7: CDI in CRI, and its own shim first on PATH
            config = config.replace(
                f"[{cri}]\n", f'[{cri}]\n  enable_cdi = true\n  cdi_spec_dirs = ["{self.cdi_dir}"]\n', 1
            )
            env = {"PATH": f"{own}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        self.cdi_dir.mkdir(exist_ok=True)
        cfg = base / "config.toml"
        cfg.write_text(config)
        self._spawn(
            "containerd", [str(own / "containerd") if own else "containerd", "--config", str(cfg)], env
        )
        self._wait("containerd's socket", lambda: _listening(self.containerd_socket), "containerd")
        for tar in ("pause.tar", "busybox.tar"):
            out = self.ctr("images", "import", str(images / tar), timeout=120)
            if out.returncode != 0:
                raise NodeError(f"ctr images import {images / tar} failed: {out.stderr.strip()}")

    def ctr(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """``ctr`` against this node's containerd, namespace ``k8s.io`` (the CRI's)."""
        return subprocess.run(
            ["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", *args],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def _start_kubelet(self) -> None:
        pki = self.cp.pki
        kdir = self.workdir / "kubelet"
        kdir.mkdir()
        client = issue_certificate(pki, f"kubelet-{self.name}-client", cn=f"system:node:{self.name}",
                                   org="system:nodes")  # fmt: skip
        serving = issue_certificate(
            pki, f"kubelet-{self.name}-serving", cn=f"system:node:{self.name}", server=True,
            dns=(self.name, socket.gethostname()), ips=(self.ip,),
        )  # fmt: skip
        kubeconfig = self.cp.write_kubeconfig(f"kubelet-{self.name}", client)
        self._kubelet_port, self._healthz_port = free_port(), free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "address": self.ip,
            "port": self._kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self._healthz_port,
            "resolvConf": "",
            "clusterDomain": "cluster.local",
            "tlsCertFile": str(serving.cert),
            "tlsPrivateKeyFile": str(serving.key),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True, "cacheTTL": "10s"},
                "x509": {"clientCAFile": str(pki.ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "podLogsDir": str(self.workdir / "pod-logs"),
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
                "imagefs.inodesFree": "1%",
            },
            "nodeStatusUpdateFrequency": "2s",
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "5s",
            "serializeImagePulls": False,
            "maxPods": 110,
            "shutdownGracePeriod": "0s",
            "containerLogMaxSize": "1Mi",
        }
        cfg = kdir / "config.json"
        cfg.write_text(json.dumps(config, indent=2))
        self._spawn(
            "kubelet",
            [
                str(self.cp.bin_dir / "kubelet"),
                f"--config={cfg}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={kdir / 'root'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.ip}",
                "--v=1",
            ],
        )
        self._wait_kubelet_up(time.time(), "Ready")

    def _wait_kubelet_up(self, since: float, what: str) -> None:
        """Until this kubelet (not a stale Node status) says Ready: its healthz answers, its server accepts
        connections, and the Node's Ready heartbeat is newer than ``since`` (wall clock)."""

        def up() -> bool:
            url = f"http://127.0.0.1:{self._healthz_port}/healthz"
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.read() != b"ok":
                    return False
            with socket.create_connection((self.ip, self._kubelet_port), timeout=2):
                pass
            return self.ready(heartbeat_after=since)

        self._wait(f"Node {self.name} {what}", up, "kubelet")

    def node(self) -> dict[str, Any]:
        """The Node object (``{}`` if it does not exist)."""
        out = self.cp.kubectl("get", "node", self.name, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def ready(self, heartbeat_after: float = 0.0) -> bool:
        """The Node is Ready (with a heartbeat after ``heartbeat_after``, wall clock) and has no
        ``node.kubernetes.io/*`` taint."""
        n = self.node()
        conds = (n.get("status") or {}).get("conditions") or []
        ok = any(
            c.get("type") == "Ready"
            and c.get("status") == "True"
            and _epoch(c.get("lastHeartbeatTime", "")) >= int(heartbeat_after)
            for c in conds
        )
        taints = (n.get("spec") or {}).get("taints") or []
        return ok and not any(t.get("key", "").startswith("node.kubernetes.io/") for t in taints)

    def allocatable(self, resource: str) -> int:
        return _count(((self.node().get("status") or {}).get("allocatable") or {}).get(resource, "0"))

    def capacity(self, resource: str) -> int:
        return _count(((self.node().get("status") or {}).get("capacity") or {}).get(resource, "0"))

    # -- the agent -------------------------------------------------------------------------------------

    def start_agent(self, *, wait: bool = True) -> None:
        """Start (or start again) ``python -m gpusched.cli agent run`` on the fake GPUs; with ``wait``, until
        the kubelet advertises every GPU in the Node's capacity."""
        if not self.fake_gpus_path.exists():
            import yaml

            self.xid_file.touch()
            doc = {"hostname": self.name, "driverVersion": "550.107.02", "cudaVersion": "12.4",
                   "xidFile": str(self.xid_file), "gpus": self._gpus}  # fmt: skip
            self.fake_gpus_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        d = self._daemons.get("agent")
        if d is not None and d.pid is not None:
            raise NodeError("the agent is already running")
        self.metrics_port = getattr(self, "metrics_port", 0) or free_port()
        cmd = [
            sys.executable, "-m", "gpusched.cli", "agent", "run",
            "--fake", str(self.fake_gpus_path), "--node", self.name,
            "--kubeconfig", str(self.cp.kubeconfig_path), "--plugin-dir", str(DEVICE_PLUGIN_DIR),
            "--slots", str(self.slots), "--metrics-port", str(self.metrics_port),
            "--pod-resources-socket", str(self.workdir / "kubelet/root/pod-resources/kubelet.sock"),
            *self._agent_args,
        ]  # fmt: skip
        if d is not None:
            d.cmd = cmd  # the arguments may have changed (restart_agent(agent_args=...))
        self._spawn("agent", cmd)
        if wait and "--dra" in cmd:
            self._wait(f"the agent's ResourceSlice of {self.name}", self._has_resource_slice, "agent")
        elif wait:
            n = sum(int(g.get("count", 1)) for g in self._gpus if not g.get("migMode"))
            self._wait(
                f"nvidia.com/gpu {n} in Node {self.name}'s capacity",
                lambda: self.capacity("nvidia.com/gpu") == n and self.capacity("gpusched.io/gpu-share") > 0,
                "agent",
            )

    def _has_resource_slice(self) -> bool:
        out = self.cp.kubectl("get", "resourceslices", "--field-selector", f"spec.nodeName={self.name}",
                              "-o", "name", check=False)  # fmt: skip
        return out.returncode == 0 and bool(out.stdout.strip())

    def stop_agent(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        self._stop_daemon("agent", sig, timeout)

    def restart_agent(self, agent_args: Sequence[str] | None = None) -> None:
        """Stop the agent and start it again (with ``agent_args`` instead of the current extra arguments, when
        given: they stay for later restarts)."""
        self.stop_agent()
        if agent_args is not None:
            self._agent_args = list(agent_args)
            d = self._daemons.get("agent")
            if d is not None:
                d.popen = None
                del self._daemons["agent"]  # the command is built again, with the new arguments
                d.log_file.close()
        self.start_agent()

    def restart_kubelet(self, sig: int = signal.SIGTERM) -> None:
        """Stop the kubelet (``sig``), start it again with the same flags and wait until the Node is Ready."""
        self._stop_daemon("kubelet", sig, 30.0)
        d = self._daemons["kubelet"]
        since = time.time()
        self._spawn("kubelet", d.cmd)
        self._wait_kubelet_up(since, "Ready after a restart")

    def inject_xid(self, gpu_index: int, xid: int) -> None:
        """An XID event on GPU ``gpu_index`` (the fake backend's ``xidFile``)."""
        with self.xid_file.open("a") as f:
            f.write(f"{gpu_index} {xid}\n")

    def check_alive(self) -> None:
        for name, d in self._daemons.items():
            if d.popen is not None and d.popen.poll() is not None and not d.stopping:
                raise NodeError(f"{name} exited with {d.popen.returncode}; log tail:\n{d.log_tail()}")

    def _stop_daemon(self, name: str, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        d = self._daemons.get(name)
        if d is None or d.popen is None:
            return
        d.stopping = True
        stop_process(d.popen, sig, timeout)
        d.stopping = False
        d.popen = None

    # -- stop ------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Undo everything ``start`` did (see the module docstring); safe to call twice."""
        atexit.unregister(self.stop)
        if not self.started:
            return
        errors: list[str] = []

        def step(what: str, fn: Callable[[], None]) -> None:
            try:
                fn()
            except Exception as e:
                errors.append(f"{what}: {e}")

        step("deleting the pods", self._delete_pods)
        step("stopping the agent", lambda: self._stop_daemon("agent"))
        step("stopping the kubelet", lambda: self._stop_daemon("kubelet", timeout=30.0))
        step("killing pod processes", self._kill_pod_processes)
        step("deleting containerd tasks", self._delete_tasks)
        step("stopping containerd", lambda: self._stop_daemon("containerd", timeout=20.0))
        step("killing containerd's shims", self._kill_shims)
        step("unmounting", self._unmount)
        step("removing network namespaces", self._remove_netns)
        step("removing the bridge", lambda: _run_quiet(["ip", "link", "del", BRIDGE]) if _link_exists(BRIDGE)
             else None)  # fmt: skip
        step("removing the kubelet's iptables chains", self._remove_iptables_chains)
        step("removing cgroups", self._remove_cgroups)
        step("restoring sysctls", self._restore_sysctls)
        step("removing files", self._remove_files)
        step("deleting the Node", self._delete_node)
        for d in self._daemons.values():
            d.log_file.close()
        self._daemons.clear()
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        self.started = False
        if errors:
            raise NodeError("the real node was not cleanly removed: " + "; ".join(errors))

    def _delete_pods(self) -> None:
        d = self._daemons.get("kubelet")
        if d is None or d.pid is None or not self.cp.running:
            return
        self.cp.kubectl("delete", "pods", "-A", "--field-selector", f"spec.nodeName={self.name}",
                        "--grace-period=1", "--wait=false", check=False, timeout=30)  # fmt: skip
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            out = self.cp.kubectl("get", "pods", "-A", "--field-selector", f"spec.nodeName={self.name}",
                                  "-o", "name", check=False)  # fmt: skip
            if out.returncode == 0 and not out.stdout.strip():
                return
            time.sleep(0.5)
        raise NodeError(f"pods on {self.name} still there after 45 s")

    def _delete_node(self) -> None:
        if self.cp.running:
            self.cp.kubectl("delete", "node", self.name, "--ignore-not-found", "--wait=false", check=False)

    def _kubepods_dirs(self) -> list[Path]:
        return [c / "kubepods" for c in _cgroup_controllers() if (c / "kubepods").is_dir()]

    def _kill_pod_processes(self) -> None:
        for _ in range(3):
            pids: set[int] = set()
            for top in self._kubepods_dirs():
                for procs in top.rglob("cgroup.procs"):
                    text = _read(procs) or ""
                    pids.update(int(p) for p in text.split())
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)

    def _delete_tasks(self) -> None:
        d = self._daemons.get("containerd")
        if d is None or d.pid is None:
            return
        tasks = self.ctr("tasks", "ls", "-q").stdout.split()
        for t in tasks:
            self.ctr("tasks", "kill", "-s", "SIGKILL", t)
            self.ctr("tasks", "delete", "-f", t)
        for c in self.ctr("containers", "ls", "-q").stdout.split():
            self.ctr("containers", "delete", c)

    def _kill_shims(self) -> None:
        """SIGKILL the shims serving this containerd (their command line names its address)."""
        address = str(self.containerd_socket)
        for pid in _pids_with_arg(address):
            comm = _read(Path(f"/proc/{pid}/comm")) or ""
            if comm.strip().startswith("containerd-shim"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def _unmount(self) -> None:
        prefixes = (str(self.workdir) + "/",)
        mounts = []
        for line in (_read(Path("/proc/self/mountinfo")) or "").splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefixes):
                mounts.append(point)
        for point in sorted(mounts, key=len, reverse=True):
            _run_quiet(["umount", "-l", point])

    def _remove_netns(self) -> None:
        if not _NETNS_DIR.is_dir():
            return
        for ns in sorted(set(os.listdir(_NETNS_DIR)) - self._netns_before):
            if ns.startswith("cni-"):
                _run_quiet(["umount", "-l", str(_NETNS_DIR / ns)])
                with contextlib.suppress(OSError):
                    (_NETNS_DIR / ns).unlink()
        if self._created_netns_dir:
            with contextlib.suppress(OSError):
                _NETNS_DIR.rmdir()  # only if empty

    def _remove_cgroups(self) -> None:
        left = []
        for top in self._created_cgroups:
            if not top.is_dir():
                continue
            subdirs = [p for p in top.rglob("*") if p.is_dir()]
            for d in sorted(subdirs, key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
            try:
                top.rmdir()
            except OSError as e:
                left.append(f"{top}: {e}")
        if left:
            raise NodeError("cgroups left: " + ", ".join(left))

    def _remove_iptables_chains(self) -> None:
        """The kubelet adds KUBE-FIREWALL (a rule in INPUT and OUTPUT), KUBE-KUBELET-CANARY and
        KUBE-IPTABLES-HINT: remove the chains that were not there at start, and the rules jumping to them."""
        for cmd, before in self._chains_before.items():
            new = _iptables_chains(cmd) - before
            if not new:
                continue
            names = {c for _, c in new}
            table = ""
            for line in _iptables_save(cmd).splitlines():
                if line.startswith("*"):
                    table = line[1:]
                elif line.startswith("-A "):
                    words = shlex.split(line)
                    target = words[words.index("-j") + 1] if "-j" in words else ""
                    if target in names and (table, words[1]) not in new:
                        _run_quiet([cmd, "-w", "5", "-t", table, "-D", *words[1:]])
            for t, chain in sorted(new):
                _run_quiet([cmd, "-w", "5", "-t", t, "-F", chain])
            for t, chain in sorted(new):
                _run_quiet([cmd, "-w", "5", "-t", t, "-X", chain])

    def _restore_sysctls(self) -> None:
        for key, value in self._saved_sysctls.items():
            path = Path("/proc/sys") / key
            if (_read(path) or "").strip() != value:
                path.write_text(value + "\n")

    def _remove_files(self) -> None:
        if _CONTAINER_LOGS.is_dir():
            for n in set(os.listdir(_CONTAINER_LOGS)) - self._logs_before:
                with contextlib.suppress(OSError):
                    (_CONTAINER_LOGS / n).unlink()
        if self._created_container_logs:
            with contextlib.suppress(OSError):
                _CONTAINER_LOGS.rmdir()
        if self._created_var_lib_kubelet:
            shutil.rmtree("/var/lib/kubelet", ignore_errors=True)
        if os.environ.get("GPUSCHED_NODE_KEEP") == "1":
            return
        shutil.rmtree(self.workdir, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ helpers


_IPTABLES = ("iptables", "ip6tables")


def _iptables_save(cmd: str) -> str:
    if shutil.which(f"{cmd}-save") is None:
        return ""
    out = subprocess.run([f"{cmd}-save"], capture_output=True, text=True, timeout=30, check=False)
    return out.stdout if out.returncode == 0 else ""


def _iptables_chains(cmd: str) -> set[tuple[str, str]]:
    """(table, chain) of the user-defined chains (``:NAME - [0:0]`` lines) that ``<cmd>-save`` shows."""
    chains, table = set(), ""
    for line in _iptables_save(cmd).splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":") and line.split()[1] == "-":
            chains.add((table, line[1:].split()[0]))
    return chains


def _count(quantity: str) -> int:
    """A whole-number quantity as the API serialises it (``8``, ``1k``, ``8k``)."""
    from kubernetes.utils import parse_quantity  # optional dependency, like every API use here

    return int(parse_quantity(quantity))  # type: ignore[no-untyped-call]


def _epoch(rfc3339: str) -> float:
    """Seconds since the epoch of a Kubernetes timestamp (``2026-12-03T13:04:05Z``); 0 if unreadable."""
    try:
        return dt.datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        return 0.0


def _cgroup_controllers() -> list[Path]:
    if (_CGROUP_ROOT / "cgroup.controllers").is_file():  # cgroup v2: one hierarchy
        return [_CGROUP_ROOT]
    return [p for p in _CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink()]


def _containerd_bin() -> Path | None:
    """``$GPUSCHED_CONTAINERD_BIN`` when it holds containerd and its runc shim, else None."""
    d = os.environ.get(ENV_CONTAINERD_BIN)
    if not d:
        return None
    p = Path(d)
    ok = all(os.access(p / b, os.X_OK) for b in ("containerd", "containerd-shim-runc-v2"))
    return p if ok else None


def _listening(path: Path) -> bool:
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _run_quiet(cmd: list[str]) -> None:
    subprocess.run(cmd, capture_output=True, timeout=30, check=False)


def _pids_with_arg(arg: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            args = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if arg.encode() in args:
            out.append(int(p.name))
    return out


def process_usage(pid: int) -> tuple[float, int]:
    """(CPU seconds used so far, resident memory in bytes) of process ``pid``, from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return cpu, rss
