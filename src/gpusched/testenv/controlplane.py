"""``ControlPlane``: etcd, kube-apiserver and friends as local processes (see the package docstring)."""

from __future__ import annotations

import atexit
import base64
import contextlib
import http.client
import importlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

from gpusched.testenv.binaries import (
    ENV_KEEP_WORKDIR,
    KWOK_STAGES_RELPATH,
    ControlPlaneError,
    find_binaries,
)
from gpusched.testenv.pki import SERVICE_CIDR, CertBackend, Pki, _Identity, generate_pki, issue_certificate

_POD_CIDR = "10.244.0.0/16"
_T = TypeVar("_T")

# ------------------------------------------------------------------------------------------- processes


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    cmd: list[str]
    env: dict[str, str]
    probe: Callable[[], bool] | None = None
    """Its health check (set once it has passed); ``restart`` waits on it again."""
    down: bool = False
    """Killed on purpose by ``kill``: ``check_alive`` does not count it until ``restart``."""

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _kubeconfig(server: str, ca_cert: Path, ident: _Identity, user: str) -> dict[str, Any]:
    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpusched-test",
                "cluster": {"server": server, "certificate-authority-data": b64(ca_cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(ident.cert), "client-key-data": b64(ident.key)},
            }
        ],
        "contexts": [{"name": "gpusched-test", "context": {"cluster": "gpusched-test", "user": user}}],
        "current-context": "gpusched-test",
        "preferences": {},
    }


def stop_process(popen: subprocess.Popen[bytes], sig: int, timeout: float, *, group: bool = False) -> None:
    """Send ``sig`` to a running process (to its process group with ``group``), wait ``timeout``
    seconds for it to exit, then SIGKILL it and wait. Nothing happens to one that already exited."""
    if popen.poll() is not None:
        return
    send = os.killpg if group else os.kill
    with contextlib.suppress(ProcessLookupError):
        send(popen.pid, sig)
    try:
        popen.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            send(popen.pid, signal.SIGKILL)
        popen.wait()


class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler, kube-controller-manager, kwok) in a temporary directory.

    Use as a context manager, or call ``start()`` and ``stop()``. ``stop()`` is also registered with
    ``atexit`` so that an interrupted test run does not leak processes. ``detach()`` hands the running
    processes over to the caller instead (``gpusched testenv up`` keeps a control plane running that way).

    Args:
        bin_dir: directory holding ``BINARIES``; default: ``find_binaries()`` (which may build them).
        scheduler: start kube-scheduler.
        scheduler_config: a KubeSchedulerConfiguration (path to a YAML/JSON file, or a mapping) for
            kube-scheduler. Its ``clientConnection.kubeconfig`` is set to the scheduler's kubeconfig and
            leader election is turned off. Default: the built-in default profile.
        controller_manager: start kube-controller-manager (garbage collector, namespaces, node lifecycle,
            ReplicaSets, Jobs, ...).
        kwok: start kwok, managing every Node; needs the Stage objects in ``kwok_stages``.
        kwok_stages: kwok Stage objects (YAML); default ``<bin_dir>/../share/kwok-stages.yaml``.
        extra_args: extra command-line flags per process name (``"kube-apiserver"``, ``"etcd"``, ...).
        startup_timeout: seconds each component gets to become healthy.
        cert_backend: ``"cryptography"``, ``"openssl"`` or ``"auto"`` (the former if installed).
        workdir: where to put data, certificates, kubeconfigs and logs; default a fresh temporary directory,
            removed by ``stop()`` unless ``keep_workdir`` (or ``$GPUSCHED_CONTROLPLANE_KEEP=1``).
    """

    def __init__(
        self,
        *,
        bin_dir: Path | str | None = None,
        scheduler: bool = True,
        scheduler_config: Path | str | Mapping[str, Any] | None = None,
        controller_manager: bool = True,
        kwok: bool = True,
        kwok_stages: Path | str | None = None,
        extra_args: Mapping[str, Sequence[str]] | None = None,
        startup_timeout: float = 120.0,
        cert_backend: CertBackend = "auto",
        workdir: Path | str | None = None,
        keep_workdir: bool | None = None,
    ) -> None:
        self._bin_dir = Path(bin_dir) if bin_dir is not None else None
        self._want_scheduler = scheduler
        self._scheduler_config = scheduler_config
        self._want_controller_manager = controller_manager
        self._want_kwok = kwok
        self._kwok_stages = Path(kwok_stages) if kwok_stages is not None else None
        self._extra_args = {k: list(v) for k, v in (extra_args or {}).items()}
        self._startup_timeout = startup_timeout
        self._cert_backend: CertBackend = cert_backend
        self._workdir_arg = Path(workdir) if workdir is not None else None
        if keep_workdir is None:
            keep_workdir = os.environ.get(ENV_KEEP_WORKDIR, "") == "1"
        self._keep_workdir = keep_workdir
        self._workdir: Path | None = None
        self._processes: list[_Process] = []
        self._server: str | None = None
        self._kubeconfig: Path | None = None
        self._pki: Pki | None = None
        self._ssl_context: ssl.SSLContext | None = None
        self._etcd_url: str | None = None
        self._kubelet_client: _Identity | None = None

    # -- public API ------------------------------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = find_binaries()
        return self._bin_dir

    @property
    def workdir(self) -> Path:
        return self._require(self._workdir, "workdir")

    @property
    def server(self) -> str:
        """The apiserver URL, ``https://127.0.0.1:<port>``."""
        return self._require(self._server, "server")

    @property
    def kubeconfig_path(self) -> Path:
        """An admin (``system:masters``) kubeconfig with embedded certificates."""
        return self._require(self._kubeconfig, "kubeconfig_path")

    @property
    def ca_cert_path(self) -> Path:
        return self._require(self._pki, "pki").ca_cert

    @property
    def pki(self) -> Pki:
        """The cluster's certificates (the CA signs further identities: ``pki.issue_certificate``)."""
        return self._require(self._pki, "pki")

    def write_kubeconfig(self, user: str, ident: _Identity) -> Path:
        """A kubeconfig for this control plane with ``ident``'s client certificate, in the workdir."""
        return self._write_kubeconfig(user, ident)

    @property
    def etcd_url(self) -> str:
        return self._require(self._etcd_url, "etcd_url")

    @property
    def log_paths(self) -> dict[str, Path]:
        """The log file of every started process, by process name."""
        return {p.name: p.log_path for p in self._processes}

    @property
    def running(self) -> bool:
        return bool(self._processes)

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self._processes:
            raise ControlPlaneError("already started")
        bin_dir = self.bin_dir  # may build: do it before taking any resource
        if self._want_kwok:
            stages = self._kwok_stages or (bin_dir / KWOK_STAGES_RELPATH).resolve()
            if not stages.is_file():
                raise ControlPlaneError(f"kwok Stage objects not found at {stages} (pass kwok_stages=...)")
            self._kwok_stages = stages
        if self._workdir_arg is not None:
            self._workdir = self._workdir_arg
            self._workdir.mkdir(parents=True, exist_ok=True)
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="gpusched-cp-"))
        atexit.register(self.stop)
        try:
            self._pki = generate_pki(self._workdir / "pki", self._cert_backend)
            # kube-apiserver's identity towards kubelets (logs, exec): a cluster admin, as kubeadm makes it.
            self._kubelet_client = issue_certificate(
                self._pki, "apiserver-kubelet-client", cn="kube-apiserver-kubelet-client",
                org="system:masters",
            )  # fmt: skip
            self._start_etcd()
            self._start_apiserver()
            if self._want_controller_manager:
                self._start_controller_manager()
            if self._want_scheduler:
                self._start_scheduler()
            if self._want_kwok:
                self._start_kwok()
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate every process (SIGTERM, then SIGKILL after ``timeout``) and remove the workdir."""
        atexit.unregister(self.stop)
        for proc in reversed(self._processes):
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in reversed(self._processes):
            try:
                proc.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait()
            proc.log_file.close()
        self._processes.clear()
        if self._workdir is not None and not self._keep_workdir and self._workdir_arg is None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._server = None

    def pids(self) -> dict[str, int]:
        """The pid of each running process by name (``etcd``, ``kube-apiserver``, ``kwok``, ...)."""
        return {p.name: p.popen.pid for p in self._processes if p.popen.poll() is None}

    def detach(self) -> dict[str, int]:
        """Let the running processes outlive this object and this Python process; return their pids by name.

        Each process leads its own process group (``os.killpg(pid, ...)`` stops it with its children). After
        this, ``stop()`` and the ``atexit`` hook leave them, and the workdir (their data, certificates,
        kubeconfigs and logs), alone: whoever detaches owns stopping them and removing the workdir.
        """
        if not self._processes:
            raise ControlPlaneError("not started")
        atexit.unregister(self.stop)
        pids = {p.name: p.popen.pid for p in self._processes}
        for proc in self._processes:
            proc.log_file.close()  # the child has its own copy of the descriptor
        self._processes.clear()
        self._keep_workdir = True
        return pids

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the built ``kubectl`` against this control plane (as admin)."""
        cmd = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig_path), *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed (exit {proc.returncode}): {proc.stderr.strip()}"
            )
        return proc

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` (the official Python client, imported lazily) for the admin."""
        kube_config: Any = importlib.import_module("kubernetes.config")  # untyped; optional dependency
        return kube_config.new_client_from_config(config_file=str(self.kubeconfig_path))

    def check_alive(self) -> None:
        """Raise ``ControlPlaneError`` (with the log tail) if a process has exited."""
        for proc in self._processes:
            code = proc.popen.poll()
            if code is not None and not proc.down:
                raise ControlPlaneError(f"{proc.name} exited with {code}; log tail:\n{proc.log_tail()}")

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout: float = 30.0) -> None:
        """Send ``sig`` (default SIGKILL, as a crash) to process ``name`` (``"kube-apiserver"``, ``"etcd"``,
        ...) and its children, and wait until it has exited. Its data stays; ``restart(name)`` brings it back,
        and until then ``check_alive`` does not count it as dead."""
        proc = self._process(name)
        proc.down = True
        stop_process(proc.popen, sig, timeout, group=True)

    def restart(self, name: str) -> None:
        """Start process ``name`` again with the same command line, environment, port and data (SIGKILLing it
        first if it still runs) and wait until it is healthy again."""
        proc = self._process(name)
        if proc.popen.poll() is None:
            self.kill(name)
        proc.log_file.write(f"$ (restart) {' '.join(proc.cmd)}\n".encode())
        proc.log_file.flush()
        proc.popen = self._popen(proc.cmd, proc.env, proc.log_file)
        proc.down = False
        if proc.probe is not None:
            self._wait(name, proc.probe)

    def restart_apiserver(self, down_s: float = 0.0) -> None:
        """Crash kube-apiserver (SIGKILL), leave it down ``down_s`` seconds, start it again with the same
        flags, port and etcd data, and wait until it is ready. Clients reconnect to the same URL."""
        self.kill("kube-apiserver")
        time.sleep(down_s)
        self.restart("kube-apiserver")

    # -- components ------------------------------------------------------------------------------------

    def _start_etcd(self) -> None:
        client_port, peer_port = free_port(), free_port()
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._etcd_url = client_url

        def healthy() -> bool:
            body = _http_get(f"{client_url}/health")
            return body is not None and json.loads(body).get("health") == "true"

        self._wait("etcd", healthy)

    def _start_apiserver(self) -> None:
        pki = self._require(self._pki, "pki")
        kubelet_client = self._require(self._kubelet_client, "kubelet client certificate")
        port = free_port()
        self._server = f"https://127.0.0.1:{port}"
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # Kubernetes >= 1.37 refuses a loopback address for the endpoints of the `kubernetes` Service;
                # nothing runs in-cluster here, so that Service needs no endpoints.
                "--endpoint-reconciler-type=none",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                # Node: kubelets (group system:nodes) get what their pods and Node need, as in a real cluster.
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                # Towards real kubelets (tests/kubelet): a client certificate, their serving certificates
                # checked against the cluster CA, and the Node's InternalIP (its hostname need not resolve).
                f"--kubelet-client-certificate={kubelet_client.cert}",
                f"--kubelet-client-key={kubelet_client.key}",
                f"--kubelet-certificate-authority={pki.ca_cert}",
                "--kubelet-preferred-address-types=InternalIP",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # Pods get no service-account token volume: there is no kubelet to mount one anyway.
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                "--profiling=false",
                # Kubernetes' own gang API (scheduling.k8s.io/v1beta1 PodGroup, Workload; the pod's
                # spec.schedulingGroup), which gpusched's standalone scheduler reads (k8s/podgroups.py).
                "--feature-gates=GenericWorkload=true",
                "--runtime-config=scheduling.k8s.io/v1beta1=true",
            ],
        )
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        ctx.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))
        self._ssl_context = ctx
        self._kubeconfig = self._write_kubeconfig("admin", pki.admin)
        self._wait("kube-apiserver", lambda: _http_get(f"{self.server}/readyz", ctx) == "ok")

    def _start_controller_manager(self) -> None:
        pki = self._require(self._pki, "pki")
        kubeconfig = self._write_kubeconfig("controller-manager", pki.controller_manager)
        port = free_port()
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'controller-manager-certs'}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_cert}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--profiling=false",
            ],
        )
        self._wait("kube-controller-manager", lambda: _http_get(f"https://127.0.0.1:{port}/healthz") == "ok")

    def _start_scheduler(self) -> None:
        pki = self._require(self._pki, "pki")
        kubeconfig = self._write_kubeconfig("scheduler", pki.scheduler)
        config_path = self.workdir / "kube-scheduler-config.json"
        config_path.write_text(json.dumps(self._scheduler_configuration(kubeconfig), indent=2))
        port = free_port()
        self._spawn(
            "kube-scheduler",
            [
                f"--config={config_path}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'scheduler-certs'}",
                "--leader-elect=false",
            ],
        )
        self._wait("kube-scheduler", lambda: _http_get(f"https://127.0.0.1:{port}/healthz") == "ok")

    def _scheduler_configuration(self, kubeconfig: Path) -> dict[str, Any]:
        source = self._scheduler_config
        if source is None:
            config: dict[str, Any] = {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
            }
        elif isinstance(source, Mapping):
            config = json.loads(json.dumps(dict(source)))  # deep copy, JSON-clean
        else:
            import yaml  # PyYAML: a dependency of the kubernetes client

            loaded = yaml.safe_load(Path(source).read_text())
            if not isinstance(loaded, dict):
                raise ControlPlaneError(f"{source} is not a KubeSchedulerConfiguration")
            config = loaded
        config.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
        config.setdefault("leaderElection", {})["leaderElect"] = False
        return config

    def _start_kwok(self) -> None:
        stages = self._require(self._kwok_stages, "kwok_stages")
        port = free_port()
        home = self.workdir / "kwok-home"  # kwok also reads ~/.kwok/kwok.yaml: keep it hermetic
        home.mkdir(exist_ok=True)
        self._spawn(
            "kwok",
            [
                f"--kubeconfig={self.kubeconfig_path}",
                f"--config={stages}",
                "--manage-all-nodes=true",
                # Keep a Lease per Node (as a kubelet does), so the node lifecycle controller keeps it Ready;
                # the node-heartbeat-with-lease stage then only refreshes the status every ~10 minutes.
                "--node-lease-duration-seconds=40",
                f"--cidr={_POD_CIDR}",
                f"--server-address=127.0.0.1:{port}",
            ],
            env={"HOME": str(home)},
        )
        self._wait("kwok", lambda: _http_get(f"http://127.0.0.1:{port}/healthz") is not None)

    # -- helpers ---------------------------------------------------------------------------------------

    def _write_kubeconfig(self, user: str, ident: _Identity) -> Path:
        pki = self._require(self._pki, "pki")
        path = self.workdir / f"{user}.kubeconfig"
        path.write_text(json.dumps(_kubeconfig(self.server, pki.ca_cert, ident, user), indent=2))
        path.chmod(0o600)
        return path

    def _spawn(self, name: str, args: list[str], env: Mapping[str, str] | None = None) -> None:
        log_dir = self.workdir / "logs"
        log_dir.mkdir(exist_ok=True)
        log_path = log_dir / f"{name}.log"
        log_file = log_path.open("ab")
        cmd = [str(self.bin_dir / name), *args, *self._extra_args.get(name, [])]
        log_file.write(f"$ {' '.join(cmd)}\n".encode())
        log_file.flush()
        full_env = {**os.environ, **(env or {})}
        popen = self._popen(cmd, full_env, log_file)
        self._processes.append(_Process(name, popen, log_path, log_file, cmd, full_env))

    def _popen(self, cmd: list[str], env: dict[str, str], log_file: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env=env,
            start_new_session=True,  # own process group: killpg reaches its children, Ctrl-C does not
        )

    def _process(self, name: str) -> _Process:
        for proc in self._processes:
            if proc.name == name:
                return proc
        names = ", ".join(p.name for p in self._processes)
        raise ControlPlaneError(f"no process {name!r} (running: {names})")

    def _wait(self, name: str, probe: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self._startup_timeout
        while True:
            self.check_alive()
            try:
                if probe():
                    for proc in self._processes:
                        if proc.name == name:
                            proc.probe = probe
                    return
            except (OSError, ValueError, http.client.HTTPException):
                pass
            if time.monotonic() > deadline:
                tail = next((p.log_tail() for p in self._processes if p.name == name), "")
                raise ControlPlaneError(
                    f"{name} not healthy after {self._startup_timeout:.0f}s; log tail:\n{tail}"
                )
            time.sleep(0.2)

    @staticmethod
    def _require(value: _T | None, what: str) -> _T:
        if value is None:
            raise ControlPlaneError(f"{what} is not available: the control plane is not started")
        return value


def wait_until(
    probe: Callable[[], _T | None],
    *,
    timeout: float,
    what: str,
    control_plane: ControlPlane | None = None,
    interval: float = 0.25,
) -> _T:
    """Poll ``probe`` until it returns something other than None/False and return that.

    Raises ``TimeoutError`` naming ``what`` after ``timeout`` seconds, and ``ControlPlaneError`` at once if a
    process of ``control_plane`` has died meanwhile.
    """
    deadline = time.monotonic() + timeout
    while True:
        if control_plane is not None:
            control_plane.check_alive()
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _http_get(url: str, context: ssl.SSLContext | None = None, timeout: float = 5.0) -> str | None:
    """The body of a 200 response, or None for any other status."""
    if context is None and url.startswith("https:"):
        # A component's self-signed serving certificate: only its health is asked, nothing is sent.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as resp:
            return resp.read().decode() if resp.status == 200 else None
    except urllib.error.HTTPError:
        return None
