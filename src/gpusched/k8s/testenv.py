"""A real, throw-away Kubernetes control plane for gpusched's e2e tests and benchmarks.

``ControlPlane`` runs, as local processes on loopback ports with a private temporary directory:

* ``etcd`` (plain HTTP, ``--unsafe-no-fsync``: fast, and the data is thrown away anyway),
* ``kube-apiserver`` (TLS, client-certificate authentication, RBAC),
* optionally ``kube-scheduler`` (with a given KubeSchedulerConfiguration), ``kube-controller-manager`` and
  ``kwok``, which plays the kubelet of every Node: Nodes become Ready and pods bound to them Running.

The binaries are the official ones, built from the Go modules by ``hack/build-control-plane.sh`` into a cache
outside the repository (or taken from ``$GPUSCHED_CONTROLPLANE_BIN``). Certificates are made with the
``cryptography`` package when it is installed, else with the ``openssl`` command.

    with ControlPlane() as cp:
        cp.kubectl("get", "nodes")
        v1 = kubernetes.client.CoreV1Api(cp.api_client())

Nothing here is used by the scheduler itself: it is test infrastructure, kept inside the package so that the
benchmarks can use it too.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import datetime as dt
import http.client
import importlib
import ipaddress
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
from typing import IO, Any, Literal, TypeVar

__all__ = [
    "BINARIES",
    "ENV_BIN_DIR",
    "BinariesUnavailableError",
    "ControlPlane",
    "ControlPlaneError",
    "find_binaries",
    "find_build_script",
    "wait_until",
]

#: Environment variable naming a directory that holds all of ``BINARIES`` (skips the build script).
ENV_BIN_DIR = "GPUSCHED_CONTROLPLANE_BIN"
#: Keep the temporary directory (logs, certificates, kubeconfigs) after ``stop()`` when set to 1.
ENV_KEEP_WORKDIR = "GPUSCHED_CONTROLPLANE_KEEP"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "kwok")
#: Where the build script puts kwok's Stage objects, relative to the bin directory.
KWOK_STAGES_RELPATH = Path("..") / "share" / "kwok-stages.yaml"
_BUILD_SCRIPT = Path("hack") / "build-control-plane.sh"
_GO_MISSING_EXIT_CODE = 2
_SERVICE_CIDR = "10.0.0.0/24"
_POD_CIDR = "10.244.0.0/16"

CertBackend = Literal["auto", "cryptography", "openssl"]
_T = TypeVar("_T")


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or used."""


class BinariesUnavailableError(ControlPlaneError):
    """The control-plane binaries are not there and could not be built."""

    def __init__(self, message: str, *, go_missing: bool = False) -> None:
        super().__init__(message)
        self.go_missing = go_missing


# --------------------------------------------------------------------------------------------- binaries


def find_build_script(start: Path | None = None) -> Path | None:
    """``hack/build-control-plane.sh`` of the source checkout this module lives in, if any."""
    here = (start or Path(__file__)).resolve()
    for parent in here.parents:
        candidate = parent / _BUILD_SCRIPT
        if candidate.is_file():
            return candidate
    return None


def _check_bin_dir(bin_dir: Path, origin: str) -> Path:
    missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if missing:
        raise BinariesUnavailableError(f"{origin}: {bin_dir} lacks the executable(s) {', '.join(missing)}")
    return bin_dir


def find_binaries(*, build: bool = True, timeout: float = 3600.0) -> Path:
    """The directory holding every control-plane binary.

    ``$GPUSCHED_CONTROLPLANE_BIN`` wins; otherwise ``hack/build-control-plane.sh`` is run (a no-op when its
    cache is already populated; the first build takes many minutes). Raises ``BinariesUnavailableError`` (with
    ``go_missing`` set when the reason is that Go is not installed).
    """
    env_dir = os.environ.get(ENV_BIN_DIR)
    if env_dir:
        return _check_bin_dir(Path(env_dir).expanduser().resolve(), f"${ENV_BIN_DIR}")
    script = find_build_script()
    if script is None:
        raise BinariesUnavailableError(
            f"no {_BUILD_SCRIPT} above {Path(__file__).resolve().parent} (not a source checkout?): "
            f"set ${ENV_BIN_DIR} to a directory holding {', '.join(BINARIES)}"
        )
    if not build:
        raise BinariesUnavailableError(f"${ENV_BIN_DIR} is not set and building was not allowed")
    try:
        proc = subprocess.run(
            ["bash", str(script)], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise BinariesUnavailableError(f"{script} did not finish within {timeout:.0f}s") from exc
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
        raise BinariesUnavailableError(
            f"{script} failed (exit {proc.returncode}):\n{tail}",
            go_missing=proc.returncode == _GO_MISSING_EXIT_CODE,
        )
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise BinariesUnavailableError(f"{script} printed no bin directory")
    return _check_bin_dir(Path(lines[-1]), str(script))


# ------------------------------------------------------------------------------------------ certificates


@dataclass(frozen=True)
class _Identity:
    """A client certificate and its key."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Every certificate and key the control plane uses (PEM files)."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    admin: _Identity
    scheduler: _Identity
    controller_manager: _Identity


_SERVING_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


def _serving_ips() -> tuple[str, ...]:
    first_service_ip = next(ipaddress.ip_network(_SERVICE_CIDR).hosts())
    return ("127.0.0.1", str(first_service_ip))


_CLIENTS: dict[str, tuple[str, str | None]] = {
    # name -> (CN, O)
    "admin": ("gpusched-admin", "system:masters"),
    "scheduler": ("system:kube-scheduler", None),
    "controller-manager": ("system:kube-controller-manager", None),
}


def _pki_paths(d: Path) -> Pki:
    def ident(name: str) -> _Identity:
        return _Identity(d / f"{name}.crt", d / f"{name}.key")

    return Pki(
        ca_cert=d / "ca.crt",
        ca_key=d / "ca.key",
        serving_cert=d / "apiserver.crt",
        serving_key=d / "apiserver.key",
        sa_key=d / "sa.key",
        sa_pub=d / "sa.pub",
        admin=ident("admin"),
        scheduler=ident("scheduler"),
        controller_manager=ident("controller-manager"),
    )


def _cryptography_available() -> bool:
    try:
        import cryptography.x509  # noqa: F401
    except ImportError:
        return False
    return True


def generate_pki(directory: Path, backend: CertBackend = "auto") -> Pki:
    """Make a CA, the apiserver serving certificate, the service-account key pair and client certificates."""
    directory.mkdir(parents=True, exist_ok=True)
    if backend == "auto":
        backend = "cryptography" if _cryptography_available() else "openssl"
    pki = _pki_paths(directory)
    if backend == "cryptography":
        _pki_with_cryptography(pki)
    else:
        _pki_with_openssl(pki)
    for path in directory.iterdir():
        if path.suffix == ".key":
            path.chmod(0o600)
    return pki


def _pki_with_cryptography(pki: Pki) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    not_before, not_after = now - dt.timedelta(hours=1), now + dt.timedelta(days=365)

    def new_key(path: Path) -> ec.EllipticCurvePrivateKey:
        key = ec.generate_private_key(ec.SECP256R1())
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return key

    def name(cn: str, org: str | None = None) -> x509.Name:
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return x509.Name(attrs)

    ca_key = new_key(pki.ca_key)
    ca_name = name("gpusched-test-ca")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))

    def leaf(
        cert_path: Path,
        key_path: Path,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName] | None = None,
    ) -> None:
        key = new_key(key_path)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=True,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert_path.write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))

    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in _SERVING_DNS]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in _serving_ips()]
    leaf(pki.serving_cert, pki.serving_key, name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, sans)
    for ident, (cn, org) in zip(
        (pki.admin, pki.scheduler, pki.controller_manager), _CLIENTS.values(), strict=True
    ):
        leaf(ident.cert, ident.key, name(cn, org), ExtendedKeyUsageOID.CLIENT_AUTH)

    sa_key = new_key(pki.sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ControlPlaneError("neither the 'cryptography' package nor the 'openssl' command is available")
    proc = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def _pki_with_openssl(pki: Pki) -> None:
    d = pki.ca_cert.parent

    def new_key(path: Path) -> None:
        _openssl(
            "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path), cwd=d
        )

    def config(stem: str, cn: str, org: str | None, extensions: list[str]) -> Path:
        dn = ([f"O = {org}"] if org else []) + [f"CN = {cn}"]
        text = "\n".join(
            ["[req]", "distinguished_name = dn", "prompt = no", "[dn]", *dn, "[ext]", *extensions, ""]
        )
        path = d / f"{stem}.cnf"
        path.write_text(text)
        return path

    days = "365"
    new_key(pki.ca_key)
    ca_cnf = config(
        "ca",
        "gpusched-test-ca",
        None,
        [
            "basicConstraints = critical,CA:TRUE",
            "keyUsage = critical,digitalSignature,keyCertSign,cRLSign",
            "subjectKeyIdentifier = hash",
        ],
    )
    _openssl(
        "req", "-x509", "-new", "-key", str(pki.ca_key), "-out", str(pki.ca_cert), "-days", days,
        "-config", str(ca_cnf), "-extensions", "ext", cwd=d,
    )  # fmt: skip

    def leaf(stem: str, cert: Path, key: Path, cn: str, org: str | None, usage: str, san: str = "") -> None:
        new_key(key)
        extensions = [
            "basicConstraints = critical,CA:FALSE",
            "keyUsage = critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage = {usage}",
            "authorityKeyIdentifier = keyid",
        ]
        if san:
            extensions.append(f"subjectAltName = {san}")
        cnf = config(stem, cn, org, extensions)
        csr = d / f"{stem}.csr"
        _openssl("req", "-new", "-key", str(key), "-out", str(csr), "-config", str(cnf), cwd=d)
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(pki.ca_cert), "-CAkey", str(pki.ca_key),
            "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", days, "-out", str(cert),
            "-extfile", str(cnf), "-extensions", "ext", cwd=d,
        )  # fmt: skip

    san = ",".join([f"DNS:{n}" for n in _SERVING_DNS] + [f"IP:{ip}" for ip in _serving_ips()])
    leaf("apiserver", pki.serving_cert, pki.serving_key, "kube-apiserver", None, "serverAuth", san)
    for (stem, (cn, org)), ident in zip(
        _CLIENTS.items(), (pki.admin, pki.scheduler, pki.controller_manager), strict=True
    ):
        leaf(stem, ident.cert, ident.key, cn, org, "clientAuth")
    new_key(pki.sa_key)
    _openssl("pkey", "-in", str(pki.sa_key), "-pubout", "-out", str(pki.sa_pub), cwd=d)


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
            if code is not None:
                raise ControlPlaneError(f"{proc.name} exited with {code}; log tail:\n{proc.log_tail()}")

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
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={_SERVICE_CIDR}",
                # Pods get no service-account token volume: there is no kubelet to mount one anyway.
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                "--profiling=false",
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
                f"--service-cluster-ip-range={_SERVICE_CIDR}",
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
        popen = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # own process group: killpg reaches its children, Ctrl-C does not
        )
        self._processes.append(_Process(name, popen, log_path, log_file))

    def _wait(self, name: str, probe: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self._startup_timeout
        while True:
            self.check_alive()
            try:
                if probe():
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
