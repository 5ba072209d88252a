"""A stand-in for NVIDIA's mig-manager, as far as gpusched sees it (../shared/reference/mig.md §4): it watches
the node label ``nvidia.com/mig.config``; on a new value it sets ``nvidia.com/mig.config.state=pending``,
reads the named configuration from the mig-parted ConfigMap and applies it to a fake node's GPUs as
mig-parted does (a GPU whose profile counts already match is skipped; any other is emptied and re-cut, larger
profiles first, each at its lowest free start), then sets the state to ``success`` or ``failed``.
``mode``: ``ok``; ``fail`` (always reports failed); ``silent`` (never answers: the caller times out)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from gpusched.agent.fake import FakeBackend
from gpusched.agent.reshape.apply import layout_of, mig_gpu
from gpusched.agent.reshape.manager import LABEL_CONFIG, LABEL_STATE, check_mig_parted

Labels = Callable[[], Mapping[str, str]]
SetLabels = Callable[[Mapping[str, str | None]], None]
ReadConfig = Callable[[], str | None]


class StandInMigManager:
    def __init__(
        self,
        node: str,
        gpus: FakeBackend,
        labels: Labels,
        set_labels: SetLabels,
        config: ReadConfig,
        mode: str = "ok",
    ) -> None:
        self.node, self.gpus, self.mode = node, gpus, mode
        self._labels, self._set, self._config = labels, set_labels, config
        current = labels()
        # mig-manager applies the label's configuration when it starts; one the state says it applied (a
        # node set up as "already done") would be applied again and is taken as seen instead.
        self.seen: str | None = current.get(LABEL_CONFIG) if current.get(LABEL_STATE) == "success" else None
        self.applied: list[str] = []
        self.errors: list[str] = []

    def step(self) -> None:
        want = self._labels().get(LABEL_CONFIG)
        if want is None or want == self.seen:
            return
        self.seen = want
        if self.mode == "silent":
            return
        self._set({LABEL_STATE: "pending"})
        try:
            if self.mode == "fail":
                raise RuntimeError("the stand-in fails every configuration")
            self._apply(want)
        except Exception as e:  # what mig-manager does with any error: state failed
            self.errors.append(str(e))
            self._set({LABEL_STATE: "failed"})
            return
        self.applied.append(want)
        self._set({LABEL_STATE: "success"})

    def _apply(self, name: str) -> None:
        text = self._config()
        configs = check_mig_parted(yaml.safe_load(text or ""), "the mig-parted ConfigMap")
        for entry in configs[name]:
            indices = (
                [d.index for d in self.gpus.inventory().devices]
                if entry["devices"] == "all"
                else entry["devices"]
            )
            for i in indices:
                self._apply_gpu(i, entry)

    def _apply_gpu(self, index: int, entry: Mapping[str, Any]) -> None:
        dev = self.gpus.inventory().by_index(index)
        assert dev is not None, f"no GPU {index}"
        want = Counter({p: n for p, n in (entry.get("mig-devices") or {}).items() if n})
        if dev.mig_enabled != entry["mig-enabled"]:
            for m in dev.mig_instances:
                self.gpus.destroy_mig_instance(index, m.uuid)
            self.gpus.set_mig_mode(index, entry["mig-enabled"])
        elif Counter(i.profile for i in layout_of(dev)) == want:
            return  # "Skipping -- already set to desired value"
        for m in self.gpus.inventory().devices[index].mig_instances:
            self.gpus.destroy_mig_instance(index, m.uuid)
        dev = self.gpus.inventory().devices[index]
        g = mig_gpu(self.node, dev)
        assert g is not None
        for p in sorted(want.elements(), key=lambda p: (-g.geometry.kind(p).mem_slices, p)):
            starts = g.free_starts(p)
            if not starts:
                raise RuntimeError(f"GPU {index}: {p} does not fit")
            g = g.place(p, starts[0])
            self.gpus.create_mig_instance(index, p, starts[0])

    def run(self, stop: threading.Event, period: float = 0.05) -> threading.Thread:
        def loop() -> None:
            while not stop.is_set():
                try:
                    self.step()
                except Exception as e:  # a transient API error: the next round retries
                    self.errors.append(str(e))
                stop.wait(period)

        t = threading.Thread(target=loop, name="stand-in mig-manager", daemon=True)
        t.start()
        return t
