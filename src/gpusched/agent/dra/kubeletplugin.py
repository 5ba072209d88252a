"""The agent as a kubelet DRA plugin: registration through the plugin watcher, the DRA service on its socket.

As upstream's drivers (``k8s.io/dynamic-resource-allocation/kubeletplugin``):

- the DRA service v1 listens on ``<plugins dir>/<driver>/dra.sock`` (``/var/lib/kubelet/plugins/...``);
- the registration service (``pluginregistration.Registration``) listens on
  ``<registry dir>/<driver>-reg.sock`` (``/var/lib/kubelet/plugins_registry``), where the kubelet's plugin
  watcher finds it, calls ``GetInfo`` (type ``DRAPlugin``, the driver's name, the DRA socket, the gRPC
  services served: ``v1.DRAPlugin``) and then ``NotifyRegistrationStatus``.

A socket that disappears (someone cleaned the directory) is served again by a watcher; the plugin watcher
then registers the driver again. On stop both sockets are removed, which the kubelet takes as the driver
unregistering.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gpusched.agent.dra.driver import DraServicer, Preparer
from gpusched.agent.dra.pluginregistration_v1 import api_pb2 as regpb
from gpusched.agent.dra.pluginregistration_v1 import api_pb2_grpc as regpbg
from gpusched.agent.dra.v1 import api_pb2_grpc as pbg

log = logging.getLogger(__name__)

DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
PLUGIN_TYPE = "DRAPlugin"
SERVICES = ("v1.DRAPlugin",)


class RegistrationServicer(regpbg.RegistrationServicer):
    def __init__(self, driver: str, endpoint: Path) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.registered = threading.Event()
        self.last_error = ""

    def GetInfo(self, request: regpb.InfoRequest, context: Any) -> regpb.PluginInfo:
        return regpb.PluginInfo(
            type=PLUGIN_TYPE, name=self.driver, endpoint=str(self.endpoint), supported_versions=list(SERVICES)
        )

    def NotifyRegistrationStatus(
        self, request: regpb.RegistrationStatus, context: Any
    ) -> regpb.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("the kubelet registered DRA driver %s (%s)", self.driver, self.endpoint)
            self.last_error = ""
            self.registered.set()
        else:
            log.error("the kubelet refused DRA driver %s: %s", self.driver, request.error)
            self.last_error = request.error
            self.registered.clear()
        return regpb.RegistrationStatusResponse()


def _serve(path: Path, add: Any, servicer: Any) -> grpc.Server:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add(servicer, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


class KubeletPlugin:
    """Both sockets of one driver, served again when one disappears."""

    def __init__(
        self,
        driver: str,
        preparer: Preparer,
        *,
        registry_dir: Path = DEFAULT_REGISTRY_DIR,
        plugins_dir: Path = DEFAULT_PLUGINS_DIR,
    ) -> None:
        self.driver = driver
        self.dra_socket = plugins_dir / driver / "dra.sock"
        self.registration_socket = registry_dir / f"{driver}-reg.sock"
        self.registration = RegistrationServicer(driver, self.dra_socket)
        self.servicer = DraServicer(preparer)
        self._servers: dict[Path, grpc.Server] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _serve_missing(self) -> None:
        # the DRA socket first: the plugin watcher calls GetInfo, then the kubelet dials the endpoint
        if not self.dra_socket.exists():
            self._restart(self.dra_socket, pbg.add_DRAPluginServicer_to_server, self.servicer)
        if not self.registration_socket.exists():
            self._restart(
                self.registration_socket, regpbg.add_RegistrationServicer_to_server, self.registration
            )
            log.info("serving DRA driver %s: registration at %s", self.driver, self.registration_socket)

    def _restart(self, path: Path, add: Any, servicer: Any) -> None:
        old = self._servers.pop(path, None)
        if old is not None:
            old.stop(grace=0.5).wait()
        self._servers[path] = _serve(path, add, servicer)

    def start(self, *, watch_interval_s: float = 1.0) -> None:
        self._serve_missing()
        self._thread = threading.Thread(
            target=self._watch, args=(watch_interval_s,), daemon=True, name="gpusched-dra-plugin-watch"
        )
        self._thread.start()

    def _watch(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self._serve_missing()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for path in (self.registration_socket, self.dra_socket):  # unregister first
            server = self._servers.pop(path, None)
            if server is not None:
                server.stop(grace=1.0).wait()
            with contextlib.suppress(OSError):
                path.unlink()
