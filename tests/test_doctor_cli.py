"""``gpusched doctor`` and ``kubectl gpusched doctor`` on the command line: text, ``--json``, and
bad input (unknown pod or node, malformed snapshot, API unreachable): one ``error:`` line naming
what is wrong, exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpusched.cli.doctor import kubectl_app
from gpusched.doctor.demo import demo_snapshot
from gpusched.doctor.snapshot import write_snapshot


@pytest.fixture(scope="module")
def snap(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_snapshot(tmp_path_factory.mktemp("doctor") / "demo.json", demo_snapshot())


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(kubectl_app(), list(args))
    return r.exit_code, r.stdout, r.stderr


def test_pod_text_walks_the_levels_and_gives_the_counterfactual(snap: Path) -> None:
    code, out, _ = run("doctor", "pod", "team-c/needs-h100-toleration", "--snapshot", str(snap))
    assert code == 0, out
    assert "Scheduling" in out and "What would make it fit" in out
    assert "0/12 nodes are available:" in out and "untolerated taint {dedicated: training}" in out
    assert "needs a toleration for dedicated=training:NoSchedule" in out
    code, out, _ = run("doctor", "pod", "team-a/notebook-1", "--snapshot", str(snap))
    assert code == 0 and "Node" in out and "Device plugin / container" in out and "drift-gpus" in out


def test_pod_json(snap: Path) -> None:
    code, out, _ = run("doctor", "pod", "team-c/wants-120gib", "--snapshot", str(snap), "--json")
    assert code == 0
    r = json.loads(out)
    assert r["pod"] == "team-c/wants-120gib" and r["reasons"] == {"Insufficient GPU memory": 12}
    assert r["counterfactuals"][0]["kind"] == "gpu-memory" and r["counterfactuals"][0]["verified"]


def test_node_and_cluster(snap: Path) -> None:
    code, out, _ = run("doctor", "node", "a100-4", "--snapshot", str(snap))
    assert code == 0 and "unhealthy-gpu" in out and "UNHEALTHY" in out
    code, out, _ = run("doctor", "cluster", "--snapshot", str(snap), "--json")
    c = json.loads(out)
    assert code == 0 and c["pending"] == 4 and c["stranded_by_model"]["A100"]["gpus"] == 20
    assert any(f["code"] == "drift-gpus" for f in c["findings"])
    code, out, _ = run("doctor", "cluster", "--snapshot", str(snap))
    assert (
        code == 0 and "Top reasons" in out and "Stranded capacity by model" in out and "Drift: 1 pod" in out
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("pod", "team-c/nope"), "error: pod team-c/nope not found in demo cluster"),
        (("node", "gpu-99"), "error: node gpu-99 not found in demo cluster"),
    ],
)
def test_unknown_pod_or_node_exits_2(snap: Path, args: tuple[str, ...], message: str) -> None:
    code, out, err = run("doctor", *args, "--snapshot", str(snap))
    assert code == 2 and message in err and out == ""


def test_malformed_snapshot_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "gpusched.io/doctor-snapshot", "version": 1, "nodes": 3}')
    code, _, err = run("doctor", "cluster", "--snapshot", str(bad))
    assert code == 2 and f"error: snapshot {bad}: field 'nodes' must be a list" in err


def test_api_unreachable_exits_2(tmp_path: Path) -> None:
    kc = tmp_path / "kubeconfig"
    kc.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))  # fmt: skip
    code, _, err = run("doctor", "pod", "default/p", "--kubeconfig", str(kc))
    assert code == 2 and "error: Kubernetes API at http://127.0.0.1:9 is unreachable" in err
    code, _, err = run("doctor", "pod", "default/p", "--kubeconfig", str(tmp_path / "missing"))
    assert code == 2 and "error: Kubernetes API: cannot load kubeconfig" in err


def test_kubectl_plugin_entry_point(snap: Path) -> None:
    """As kubectl runs it: ``kubectl-gpusched doctor pod ...``."""
    code = "from gpusched.cli.doctor import kubectl_main; kubectl_main()"
    args = [sys.executable, "-c", code, "doctor", "pod", "team-c/wants-b200", "--snapshot", str(snap)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "no-such-model" in r.stdout and "fits if gpu-models allows" in r.stdout
    r = subprocess.run([sys.executable, "-c", code, "doctor", "pod", "x/y", "--snapshot", str(snap)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and "error: pod x/y not found" in r.stderr


def test_ui_books_cache_reads_live_books_again_but_a_snapshot_once() -> None:
    from gpusched.doctor.books import Books
    from gpusched.doctor.ui import BooksCache

    loads: list[int] = []

    def load() -> Books:
        loads.append(1)
        return Books.of(demo_snapshot())

    live, fixed = BooksCache(load, 0.0), BooksCache(load, None)
    live.get(), live.get()
    assert len(loads) == 2
    fixed.get(), fixed.get()
    assert len(loads) == 3
