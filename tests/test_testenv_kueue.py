"""Finding a Kueue build (``$GPUSCHED_KUEUE``) and the Configuration the test environment runs it with."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.testenv.binaries import BinariesUnavailableError
from gpusched.testenv.kueue import ENV_KUEUE, find_kueue, kueue_configuration


def _build(
    root: Path, *, binary: bool = True, crds: tuple[str, ...] = ("workloads", "clusterqueues")
) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "crds").mkdir()
    if binary:
        (root / "bin" / "kueue").write_text("#!/bin/sh\n")
        (root / "bin" / "kueue").chmod(0o755)
    for name in crds:
        (root / "crds" / f"kueue.x-k8s.io_{name}.yaml").write_text("kind: CustomResourceDefinition\n")
    return root


def test_env_names_a_complete_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _build(tmp_path / "k")
    monkeypatch.setenv(ENV_KUEUE, str(root))
    build = find_kueue()
    assert build.binary == root.resolve() / "bin" / "kueue"
    assert [p.name for p in build.crds] == [
        "kueue.x-k8s.io_clusterqueues.yaml",
        "kueue.x-k8s.io_workloads.yaml",
    ]


@pytest.mark.parametrize("kwargs", [{"binary": False}, {"crds": ("clusterqueues",)}])
def test_an_incomplete_build_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, object]
) -> None:
    monkeypatch.setenv(ENV_KUEUE, str(_build(tmp_path / "k", **kwargs)))  # type: ignore[arg-type]
    with pytest.raises(BinariesUnavailableError, match=r"\$GPUSCHED_KUEUE: .* lacks bin/kueue or crds/"):
        find_kueue()


def test_configuration_keeps_kueue_local_and_job_only(tmp_path: Path) -> None:
    cfg = kueue_configuration(1001, 1002, 1003, tmp_path)
    assert cfg["integrations"] == {"frameworks": ["batch/job"]}
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert cfg["internalCertManagement"] == {"enable": False}
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 1003, "certDir": str(tmp_path)}
    assert cfg["health"] == {"healthProbeBindAddress": "127.0.0.1:1001"}
    assert cfg["metrics"] == {"bindAddress": "127.0.0.1:1002"}
