"""A fake kubelet for tests and benchmarks: the ``Registration`` service on ``kubelet.sock``, and a client of
the
plugins' ``DevicePlugin`` service."""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gpusched.agent.v1beta1 import api_pb2 as pb
from gpusched.agent.v1beta1 import api_pb2_grpc as pbg


class _Registration(pbg.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        with self.kubelet.cond:
            self.kubelet.registrations.append(request)
            self.kubelet.cond.notify_all()
        return pb.Empty()


class FakeKubelet:
    """Serves Registration on ``<plugin_dir>/kubelet.sock``. ``restart()`` does what a restarting kubelet
    does:
    empties the directory (removing the plugins' sockets) and serves a new socket."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / "kubelet.sock"
        self.registrations: list[pb.RegisterRequest] = []
        self.cond = threading.Condition()
        self._server: grpc.Server | None = None

    def start(self) -> FakeKubelet:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pbg.add_RegistrationServicer_to_server(_Registration(self), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None

    def restart(self) -> None:
        self.stop()
        for p in self.plugin_dir.iterdir():
            p.unlink()
        self.start()

    def wait_registrations(self, n: int, timeout_s: float = 20.0) -> list[pb.RegisterRequest]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.registrations) >= n, timeout_s)
            return list(self.registrations)

    def plugin(self, endpoint: str) -> tuple[grpc.Channel, pbg.DevicePluginStub]:
        ch = grpc.insecure_channel(f"unix://{self.plugin_dir / endpoint}")
        return ch, pbg.DevicePluginStub(ch)  # type: ignore[no-untyped-call]


class Watcher:
    """Consumes a plugin's ListAndWatch stream as the kubelet does, keeping every list it received."""

    def __init__(self, kubelet: FakeKubelet, endpoint: str) -> None:
        self.channel, self.stub = kubelet.plugin(endpoint)
        self.lists: list[dict[str, str]] = []
        self.cond = threading.Condition()
        self._stream = self.stub.ListAndWatch(pb.Empty())
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for resp in self._stream:
                with self.cond:
                    self.lists.append({d.ID: d.health for d in resp.devices})
                    self.cond.notify_all()
        except grpc.RpcError:
            pass

    def wait_for(self, pred: Any, timeout_s: float = 20.0) -> dict[str, str]:
        with self.cond:
            self.cond.wait_for(lambda: bool(self.lists) and pred(self.lists[-1]), timeout_s)
            return self.lists[-1] if self.lists else {}

    def close(self) -> None:
        self._stream.cancel()
        self.channel.close()
