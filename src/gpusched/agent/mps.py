"""NVIDIA MPS control daemons, one per shared GPU, for ``gpusched agent run --sharing mps``.

Each GPU with at least one running share has its own daemon, under ``<root>/<GPU UUID>/``:

- ``pipe/``: ``CUDA_MPS_PIPE_DIRECTORY`` of the daemon and of its clients (mounted into the share
  containers);
- ``log/``: ``CUDA_MPS_LOG_DIRECTORY`` (``control.log``, ``server.log``);
- ``shm/``: the daemon's ``/dev/shm``, mounted at ``/dev/shm`` in the share containers too: MPS clients and
  their server exchange shared memory, so both must see the same one. The daemon is started in a mount
  namespace of its own with that directory bound over ``/dev/shm`` (``python -m gpusched.agent.mpsexec``),
  which needs CAP_SYS_ADMIN (root on the host; a privileged agent container).

The daemon starts (``nvidia-cuda-mps-control -d`` with ``CUDA_VISIBLE_DEVICES=<UUID>``) when the GPU's first
share is allocated, before ``Allocate`` answers, and is asked to ``quit`` once no share on that GPU is left
(:meth:`MpsDaemons.reconcile`, from the pods on the node). A daemon counts as running when it answers a query
(``get_default_active_thread_percentage``), as NVIDIA's device plugin checks its health; so a restarted agent
finds the daemons of its running shares answering and keeps them (:meth:`MpsDaemons.adopt`) rather than
starting new ones under running clients.

The limits themselves are per client (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``,
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` in the container's environment, see :mod:`gpusched.agent.sharing`):
shares of one GPU differ, so one daemon-wide default could not express them.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path

from gpusched.core.errors import GpuschedError

log = logging.getLogger(__name__)

DEFAULT_ROOT = Path("/run/gpusched/mps")
DEFAULT_CONTROL = "nvidia-cuda-mps-control"
HEALTH_QUERY = "get_default_active_thread_percentage"
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")

ShareKey = tuple[str, str]
"""(pod UID, container name): one share container."""


class MpsError(GpuschedError):
    """An MPS control daemon could not be started, queried or stopped; the message names the GPU."""


@dataclass
class MpsDaemons:
    """The MPS control daemons of this node's shared GPUs.

    Args:
        root: where each GPU's ``pipe/``, ``log/`` and ``shm/`` live (a host path; in a pod, mounted at the
            same path so that the kubelet can mount it into share containers).
        control: the ``nvidia-cuda-mps-control`` binary (a name on ``PATH`` or a path).
        isolate_shm: start each daemon with its GPU's ``shm/`` over ``/dev/shm`` (the share containers get the
            same directory); off only where clients share the daemon's IPC namespace some other way.
        grace_s: a share allocated this recently counts as running even before the pods say so (its
            ``gpusched.io/allocated`` annotation may not be written yet).
    """

    root: Path = DEFAULT_ROOT
    control: str = DEFAULT_CONTROL
    isolate_shm: bool = True
    grace_s: float = 10.0
    timeout_s: float = 30.0
    shares: dict[str, set[ShareKey]] = field(default_factory=dict)
    """GPU UUID -> the share containers using its daemon (a GPU is here iff its daemon runs)."""
    starts: int = 0
    stops: int = 0
    _since: dict[ShareKey, float] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    # -- paths ---------------------------------------------------------------------------------------------

    def gpu_dir(self, uuid: str) -> Path:
        if not _UUID.match(uuid):
            raise MpsError(f"not a GPU UUID: {uuid!r}")
        return self.root / uuid

    def pipe_dir(self, uuid: str) -> Path:
        return self.gpu_dir(uuid) / "pipe"

    def log_dir(self, uuid: str) -> Path:
        return self.gpu_dir(uuid) / "log"

    def shm_dir(self, uuid: str) -> Path:
        return self.gpu_dir(uuid) / "shm"

    # -- the control binary --------------------------------------------------------------------------------

    def _env(self, uuid: str) -> dict[str, str]:
        return {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(uuid)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(uuid)),
        }

    def command(self, uuid: str, command: str) -> str:
        """Send one command to the GPU's daemon (``echo COMMAND | nvidia-cuda-mps-control``); its answer."""
        try:
            out = subprocess.run(
                [self.control], input=command + "\n", env=self._env(uuid), capture_output=True, text=True,
                timeout=self.timeout_s, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            raise MpsError(f"GPU {uuid}: {self.control} {command!r} failed: {e}") from None
        if out.returncode != 0:
            raise MpsError(
                f"GPU {uuid}: {self.control} {command!r} exited {out.returncode}: "
                f"{(out.stderr or out.stdout).strip()[-500:]}"
            )
        return out.stdout.strip()

    def answers(self, uuid: str) -> bool:
        """The GPU's daemon runs and answers (its pipe directory exists and a query succeeds)."""
        if not (self.pipe_dir(uuid) / "control").exists():
            return False
        try:
            self.command(uuid, HEALTH_QUERY)
        except MpsError:
            return False
        return True

    def _launch(self, uuid: str) -> None:
        for d in (self.pipe_dir(uuid), self.log_dir(uuid), self.shm_dir(uuid)):
            d.mkdir(parents=True, exist_ok=True)
        self.shm_dir(uuid).chmod(0o1777)
        cmd = [self.control, "-d"]
        if self.isolate_shm:
            cmd = [sys.executable, "-m", "gpusched.agent.mpsexec", str(self.shm_dir(uuid)), *cmd]
        try:
            out = subprocess.run(
                cmd, env=self._env(uuid), capture_output=True, text=True, timeout=self.timeout_s, check=False,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            what = f"GPU {uuid}: starting the MPS control daemon ({' '.join(cmd)})"
            raise MpsError(f"{what} failed: {e}") from None
        if out.returncode != 0:
            raise MpsError(
                f"GPU {uuid}: starting the MPS control daemon ({' '.join(cmd)}) exited {out.returncode}: "
                f"{(out.stderr or out.stdout).strip()[-500:]}"
            )
        deadline = time.monotonic() + self.timeout_s
        while not self.answers(uuid):
            if time.monotonic() > deadline:
                raise MpsError(
                    f"GPU {uuid}: the MPS control daemon started but does not answer after "
                    f"{self.timeout_s:.0f} s "
                    f"(log: {self.log_dir(uuid) / 'control.log'})"
                )
            time.sleep(0.05)

    # -- lifecycle -----------------------------------------------------------------------------------------

    def adopt(self, uuids: Set[str]) -> list[str]:
        """At agent start: the daemons already running for these GPUs (an earlier agent started them) are
        kept, with no share yet; ``reconcile`` then stops those whose shares are gone. Returns the adopted
        GPUs."""
        out = []
        with self._lock:
            for uuid in sorted(uuids):
                if uuid not in self.shares and self.answers(uuid):
                    self.shares[uuid] = set()
                    out.append(uuid)
        if out:
            log.info("MPS: kept the running control daemons of %s", ", ".join(out))
        return out

    def acquire(self, uuid: str, key: ShareKey, now: float | None = None) -> bool:
        """A share container of ``uuid`` is being allocated: its daemon runs when this returns (started if it
        is the GPU's first share). True when it was started now."""
        with self._lock:
            self._since[key] = time.monotonic() if now is None else now
            if uuid in self.shares:
                self.shares[uuid].add(key)
                return False
            self._launch(uuid)
            self.shares[uuid] = {key}
            self.starts += 1
            log.info("MPS: started the control daemon of GPU %s (pipe %s)", uuid, self.pipe_dir(uuid))
            return True

    def stop(self, uuid: str) -> None:
        with self._lock:
            if self.answers(uuid):
                self.command(uuid, "quit")
            self.shares.pop(uuid, None)
            self.stops += 1
            log.info("MPS: stopped the control daemon of GPU %s (its last share is gone)", uuid)

    def reconcile(self, live: Mapping[str, Set[ShareKey]], now: float | None = None) -> list[str]:
        """``live``: GPU UUID -> the share containers the pods on the node still run. Each GPU's daemon keeps
        the shares that are live or were allocated within ``grace_s``; a daemon left without any is stopped.
        Returns the GPUs whose daemon was stopped."""
        t = time.monotonic() if now is None else now
        stopped = []
        with self._lock:
            for uuid, keys in live.items():
                if keys and uuid not in self.shares:
                    # running shares whose daemon is gone (it died, or the host rebooted under them): new
                    # processes of those containers find one again
                    log.warning("MPS: GPU %s has running shares but no control daemon: starting it", uuid)
                    try:
                        self._launch(uuid)
                    except MpsError as e:
                        log.warning("MPS: %s (will retry)", e)
                        continue
                    self.shares[uuid] = set(keys)
                    self.starts += 1
            for uuid in list(self.shares):
                recent = {k for k in self.shares[uuid] if t - self._since.get(k, -1e18) < self.grace_s}
                keep = recent | set(live.get(uuid, ()))
                if keep:
                    self.shares[uuid] = keep
                    continue
                try:
                    self.stop(uuid)
                    stopped.append(uuid)
                except MpsError as e:
                    log.warning("MPS: %s (will retry)", e)
            for k in [k for k, s in self._since.items() if t - s >= self.grace_s]:
                del self._since[k]
        return stopped
