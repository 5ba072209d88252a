"""The ``gpusched`` command line, driven through typer's CliRunner (and once as the installed script)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from gpusched.cli import app
from gpusched.core.policies import POLICIES

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("allocation.png", "fragmentation.png", "gpu_models.png", "free_capacity.png")
ALL_POLICIES = {"random", "dotprod", "packing", "clustering", "bestfit", "fgd", "default"}
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"

# NaN bins below the first arrival make nanmean warn while plotting; harmless here.
quiet_plots = pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:All-NaN slice")


def runner() -> CliRunner:
    return CliRunner()


def write_tiny_trace(folder: Path) -> tuple[Path, Path]:
    """6 nodes (12 GPUs of two models), 40 pods: small shares, a few whole GPUs, some CPU-only."""
    folder.mkdir(parents=True, exist_ok=True)
    nodes = folder / "nodes.csv"
    pods = folder / "pods.csv"
    node_rows = [f"n{i},64000,262144,2,{'T4' if i % 2 else 'V100M16'}" for i in range(6)]
    nodes.write_text("\n".join(["sn,cpu_milli,memory_mib,gpu,model", *node_rows, ""]), encoding="utf-8")
    shares = [100, 200, 250, 460, 150]
    rows = []
    for i in range(40):
        if i % 10 == 0:
            num, milli = 0, 0
        elif i % 13 == 0:
            num, milli = 1, 1000
        else:
            num, milli = 1, shares[i % len(shares)]
        spec = "T4" if i % 17 == 0 and num else ""
        rows.append(f"p{i:02d},{1000 * (1 + i % 4)},{1024 * (1 + i % 3)},{num},{milli},{spec}")
    pods.write_text("\n".join([POD_HEADER, *rows, ""]), encoding="utf-8")
    return nodes, pods


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_trace(tmp_path_factory.mktemp("tiny"))


def parse_json(stdout: str) -> dict[str, object]:
    obj = json.loads(stdout)  # the whole of stdout is one JSON object
    assert isinstance(obj, dict)
    return obj


def assert_clean_error(result: Result, *fragments: str) -> None:
    """Exit status 2, one 'error:' line holding every fragment, and no traceback."""
    out = result.output
    assert result.exit_code == 2, out
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in out
    lines = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, out
    for frag in fragments:
        assert frag in lines[0], f"{frag!r} not in {lines[0]!r}"


# --- policies and --help -----------------------------------------------------------------------------------


def test_policies_lists_all_seven() -> None:
    res = runner().invoke(app, ["policies"])
    assert res.exit_code == 0, res.output
    listed = res.stdout.split()
    assert set(listed) == ALL_POLICIES == set(POLICIES)
    assert len(listed) == 7


def _installed_script() -> str:
    beside = Path(sys.executable).with_name("gpusched")
    found = str(beside) if beside.exists() else shutil.which("gpusched")
    if not found:
        pytest.skip("the gpusched console script is not installed (pip install -e .)")
    return found


def test_installed_script_help() -> None:
    proc = subprocess.run([_installed_script(), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for cmd in ("simulate", "bench", "policies", "check-trace"):
        assert cmd in proc.stdout


def test_installed_script_bad_trace_is_one_line_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text(f"{POD_HEADER}\np0,1000,1024,1,500,\np1,1000,1024,2,500,\n")
    cmd = [_installed_script(), "check-trace", "bad.csv"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "bad.csv:3:" in proc.stderr
    assert "num_gpu 2" in proc.stderr


# --- simulate ----------------------------------------------------------------------------------------------


@quiet_plots
def test_simulate_json_results_and_plots(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = tiny
    out = tmp_path / "out"
    args = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1-2", "--jobs", "1"]
    res = runner().invoke(app, [*args, "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    report = parse_json(res.stdout)
    assert report["protocol"] == "paper"
    assert report["seeds"] == [1, 2]
    results = report["results"]
    assert isinstance(results, list)
    assert [r["policy"] for r in results] == ["default", "fgd", "bestfit"]
    for r in results:
        for key in ("alloc_at_100", "alloc_at_130", "per_seed"):
            assert key in r
        assert isinstance(r["alloc_at_100"], float) and 0 < r["alloc_at_100"] <= 100
        assert [s["seed"] for s in r["per_seed"]] == [1, 2]
    written = json.loads((out / "results.json").read_text())
    assert written == report
    assert sorted(Path(p).name for p in report["plots"]) == sorted(PLOTS)
    for name in PLOTS:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC, name
        assert len(data) > 1000


def test_simulate_no_plots(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = tiny
    out = tmp_path / "out"
    args = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "bestfit", "--seeds", "5"]
    opts = ["--jobs", "1", "--out", str(out), "--no-plots", "--no-bounds", "--json"]
    res = runner().invoke(app, [*args, *opts])
    assert res.exit_code == 0, res.output
    report = parse_json(res.stdout)
    assert report["plots"] == []
    assert [r["policy"] for r in report["results"]] == ["bestfit"]
    assert "bound" not in report
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]


def test_simulate_table_output(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = tiny
    args = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "-p", "fgd", "--seeds", "1"]
    res = runner().invoke(app, [*args, "--jobs", "1", "--out", str(tmp_path), "--no-plots", "--no-bounds"])
    assert res.exit_code == 0, res.output
    assert "fgd" in res.stdout
    assert "results.json" in res.stdout
    assert "Free GPU capacity at the end of the run" in res.stdout


def test_simulate_small_synthetic_default(tmp_path: Path) -> None:
    args = ["simulate", "--synthetic-nodes", "30", "--synthetic-pods", "200", "-p", "fgd", "--seeds", "1"]
    opts = ["--jobs", "1", "--out", str(tmp_path), "--no-plots", "--no-bounds", "--json"]
    res = runner().invoke(app, [*args, *opts])
    assert res.exit_code == 0, res.output
    report = parse_json(res.stdout)
    assert str(report["workload"]).startswith("synthetic")
    assert "30 nodes" in str(report["workload"])
    (r,) = report["results"]  # type: ignore[misc]
    assert r["policy"] == "fgd"
    assert 50 < r["alloc_at_100"] <= 100


# --- bench -------------------------------------------------------------------------------------------------


def bench_packing_json(nodes: Path, pods: Path, jobs: int, *policies: str) -> dict[str, object]:
    pol_args = [a for p in policies for a in ("--policy", p)]
    args = ["bench", "packing", "--nodes", str(nodes), "--pods", str(pods), *pol_args]
    res = runner().invoke(app, [*args, "--seeds", "1-2", "--tune", "1.3", "--json", "--jobs", str(jobs)])
    assert res.exit_code == 0, res.output
    return parse_json(res.stdout)


def test_bench_packing_json(tiny: tuple[Path, Path]) -> None:
    report = bench_packing_json(*tiny, 1, "fgd", "bestfit")
    assert report["tune"] == 1.3
    assert report["seeds"] == [1, 2]
    results = report["results"]
    assert isinstance(results, list)
    assert [r["policy"] for r in results] == ["fgd", "bestfit"]
    for r in results:
        for key in ("policy", "alloc_at_100", "alloc_at_130", "per_seed", "seconds_per_run"):
            assert key in r, key
        assert r["seconds_per_run"] >= 0
        assert [s["seed"] for s in r["per_seed"]] == [1, 2]
        for s in r["per_seed"]:
            for key in ("seed", "alloc_at_100", "alloc_at_130", "bound_at_100", "bound_at_130"):
                assert key in s, key
            assert s["alloc_at_100"] <= s["bound_at_100"] + 1e-6  # nobody beats the ceiling
            assert s["alloc_at_130"] <= s["bound_at_130"] + 1e-6
            assert s["arrival_bound_at_130"] <= s["bound_at_130"] + 1e-6  # arrival order only adds limits
            assert s["online_bf_at_130"] <= s["arrival_bound_at_130"] + 1e-6
        free = r["free_at_end"]
        assert free and all(x["pct"] > 0 for x in free)
        assert 0 < sum(x["pct"] for x in free) < 100
        assert all(x["holder"] in ("idle", "other") or x["holder"].split("+")[0].isdigit() for x in free)
        mean = sum(s["alloc_at_100"] for s in r["per_seed"]) / 2
        assert r["alloc_at_100"] == pytest.approx(mean, abs=0.011)


def without_timings(report: dict[str, object]) -> dict[str, object]:
    results = [{k: v for k, v in r.items() if k != "seconds_per_run"} for r in report["results"]]  # type: ignore[attr-defined]
    return {**report, "results": results}


def test_bench_packing_same_results_across_processes(tiny: tuple[Path, Path]) -> None:
    one = bench_packing_json(*tiny, 1, "fgd")
    two = bench_packing_json(*tiny, 2, "fgd")
    assert without_timings(one) == without_timings(two)


def test_bench_latency_json() -> None:
    res = runner().invoke(app, ["bench", "latency", "--nodes", "50", "--decisions", "50", "--json"])
    assert res.exit_code == 0, res.output
    report = parse_json(res.stdout)
    (row,) = report["results"]  # type: ignore[misc]
    assert row["nodes"] == 50 and row["decisions"] == 50
    assert 0 < row["p50_ms"] <= row["p99_ms"]
    assert row["pods_per_s"] > 0 and row["constraints"] is False


def test_bench_latency_with_constraints() -> None:
    from gpusched.bench.latency import latency_setting, with_constraints

    args = ["bench", "latency", "--nodes", "60", "--decisions", "60", "--constraints", "--json"]
    res = runner().invoke(app, args)
    assert res.exit_code == 0, res.output
    (row,) = parse_json(res.stdout)["results"]  # type: ignore[misc]
    assert row["constraints"] is True and row["scheduled"] > 0
    setting = latency_setting(30, 60, 0)
    snap, pods = with_constraints(setting.snap, setting.pods)
    assert all("topology.kubernetes.io/zone" in n.labels for n in snap.nodes)
    kinds = [bool(p.spread) + 2 * bool(p.preferred_pod_anti_affinity) for p in pods]
    assert kinds[:6] == [1, 2, 0, 1, 2, 0]  # spread, preferred anti-affinity, plain, ...


def test_bench_preemption_json() -> None:
    res = runner().invoke(app, ["bench", "preemption", "--nodes", "60", "--preemptors", "8", "--json"])
    assert res.exit_code == 0, res.output
    (row,) = parse_json(res.stdout)["results"]  # type: ignore[misc]
    assert row["nodes"] == 60 and row["preemptors"] == 8
    assert row["alloc_pct"] > 90  # the cluster was filled before the preemptors came
    assert row["preempting"] + row["fitted_without"] <= 8 and row["preempting"] > 0
    assert row["victims_per_preemption"] >= 1
    assert 0 < row["p50_ms"] <= row["max_ms"]


# --- bad input ---------------------------------------------------------------------------------------------


BAD_PODS = f"{POD_HEADER}\np0,1000,1024,1,500,\np1,1000,1024,1,-7,\n"  # line 3: negative gpu_milli
BAD_NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\nn1,64000,262144,4,\n"  # 3: no model


@pytest.fixture
def bad_files(tiny: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Short relative names (cwd = tmp_path), so the error line fits any console width."""
    monkeypatch.chdir(tmp_path)
    Path("badpods.csv").write_text(BAD_PODS, encoding="utf-8")
    Path("badnodes.csv").write_text(BAD_NODES, encoding="utf-8")
    shutil.copy(tiny[0], "nodes.csv")
    shutil.copy(tiny[1], "pods.csv")
    return {"nodes": "nodes.csv", "pods": "pods.csv", "badpods": "badpods.csv", "badnodes": "badnodes.csv"}


@pytest.mark.parametrize(
    ("cmd", "expected"),
    [
        (["simulate", "--nodes", "nodes.csv", "--pods", "badpods.csv"], "badpods.csv:3:"),
        (["simulate", "--nodes", "badnodes.csv", "--pods", "pods.csv"], "badnodes.csv:3:"),
        (["simulate", "--nodes", "nodes.csv", "--pods", "missing.csv"], "missing.csv:0:"),
        (["bench", "packing", "--nodes", "nodes.csv", "--pods", "badpods.csv"], "badpods.csv:3:"),
        (["bench", "packing", "--nodes", "badnodes.csv", "--pods", "pods.csv"], "badnodes.csv:3:"),
        (["check-trace", "pods.csv", "badpods.csv"], "badpods.csv:3:"),
        (["check-trace", "pods.csv", "--nodes", "badnodes.csv"], "badnodes.csv:3:"),
        (["check-trace", "missing.csv"], "missing.csv:0:"),
    ],
)
def test_malformed_trace_exits_2_naming_file_and_line(
    bad_files: dict[str, str], tmp_path: Path, cmd: list[str], expected: str
) -> None:
    extra = ["--seeds", "1", "--jobs", "1"] if cmd[0] != "check-trace" else []
    if cmd[0] == "simulate":
        extra += ["--out", str(tmp_path / "out")]
    res = runner().invoke(app, [*cmd, *extra])
    assert_clean_error(res, expected)


def test_check_trace_ok(bad_files: dict[str, str]) -> None:
    res = runner().invoke(app, ["check-trace", "pods.csv", "--nodes", "nodes.csv"])
    assert res.exit_code == 0, res.output
    assert "pods.csv: 40 pods ok" in res.stdout
    assert "nodes.csv: 6 nodes ok" in res.stdout


@pytest.mark.parametrize(
    "cmd",
    [
        pytest.param(["simulate", "--nodes", "nodes.csv"], id="simulate-nodes-only"),
        pytest.param(["simulate", "--pods", "pods.csv"], id="simulate-pods-only"),
        pytest.param(["bench", "packing", "--nodes", "nodes.csv"], id="bench-nodes-only"),
        pytest.param(["bench", "packing", "--pods", "pods.csv"], id="bench-pods-only"),
    ],
)
def test_only_one_of_nodes_and_pods(bad_files: dict[str, str], cmd: list[str]) -> None:
    res = runner().invoke(app, [*cmd, "--seeds", "1", "--jobs", "1"])
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit)
    text = " ".join(res.output.split())  # the console may wrap the message
    assert "--nodes" in text and "--pods" in text


@pytest.mark.parametrize(
    "cmd",
    [
        ["simulate", "--policy", "nosuchpolicy"],
        ["simulate", "--policy", "fgd", "--policy", "nosuchpolicy"],
        ["bench", "packing", "-p", "nosuchpolicy"],
        ["bench", "latency", "--policy", "nosuchpolicy"],
        ["bench", "preemption", "--policy", "nosuchpolicy"],
    ],
)
def test_unknown_policy(bad_files: dict[str, str], cmd: list[str]) -> None:
    res = runner().invoke(app, [*cmd, "--nodes", "50"] if cmd[1] in ("latency", "preemption") else cmd)
    assert res.exit_code != 0
    assert isinstance(res.exception, SystemExit)
    assert "nosuchpolicy" in res.output
    assert "unknown policy" in " ".join(res.output.split())


@pytest.mark.parametrize("seeds", ["5-1", "a-b", "x", "", ",", "1-2-3"])
@pytest.mark.parametrize("cmd", [["simulate"], ["bench", "packing"]])
def test_bad_seeds(bad_files: dict[str, str], cmd: list[str], seeds: str) -> None:
    res = runner().invoke(app, [*cmd, "--nodes", "nodes.csv", "--pods", "pods.csv", "--seeds", seeds])
    assert res.exit_code != 0
    assert isinstance(res.exception, SystemExit)
    assert "seeds" in res.output


def test_bad_protocol(bad_files: dict[str, str]) -> None:
    args = ["simulate", "--nodes", "nodes.csv", "--pods", "pods.csv", "--protocol", "nope"]
    res = runner().invoke(app, args)
    assert res.exit_code != 0
    assert "nope" in res.output


def test_nodes_without_gpus(bad_files: dict[str, str]) -> None:
    Path("cpu_nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nc0,1000,1024,0,\n", encoding="utf-8")
    res = runner().invoke(app, ["bench", "packing", "--nodes", "cpu_nodes.csv", "--pods", "pods.csv"])
    assert_clean_error(res, "cpu_nodes.csv", "no node has a GPU")


# --- known bugs --------------------------------------------------------------------------------------------


def test_error_line_is_not_wrapped(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*(["a_rather_long_folder_name_for_a_trace_file"] * 10))
    deep.mkdir(parents=True)
    bad = deep / "bad.csv"
    bad.write_text(BAD_PODS, encoding="utf-8")
    res = runner().invoke(app, ["check-trace", str(bad)])
    assert res.exit_code == 2
    assert any(f"{bad}:3:" in ln for ln in res.output.splitlines()), res.output


@pytest.mark.parametrize("value", ["[bold]", "[/x]"])
def test_error_text_is_not_markup(bad_files: dict[str, str], value: str) -> None:
    Path("brackets.csv").write_text(f"{POD_HEADER}\np0,1000,1024,1,{value},\n", encoding="utf-8")
    res = runner().invoke(app, ["check-trace", "brackets.csv"])
    assert_clean_error(res, "brackets.csv:2:", value)


@pytest.mark.parametrize("case", ["inf", "directory", "latin1"])
def test_check_trace_other_bad_input(bad_files: dict[str, str], case: str) -> None:
    if case == "inf":
        Path("inf.csv").write_text(f"{POD_HEADER}\np0,1000,1024,1,inf,\n", encoding="utf-8")
        target, frag = "inf.csv", "inf.csv:2:"
    elif case == "directory":
        os.mkdir("adir")
        target, frag = "adir", "adir"
    else:
        Path("latin1.csv").write_bytes(f"{POD_HEADER}\np\xe9,1000,1024,1,500,\n".encode("latin-1"))
        target, frag = "latin1.csv", "latin1.csv:2:"
    res = runner().invoke(app, ["check-trace", target])
    assert_clean_error(res, frag)


def test_bench_traces_all_includes_families_without_published_results(tmp_path: Path) -> None:
    root = tmp_path / "alibaba"
    nodes, pods = write_tiny_trace(tmp_path / "src")
    (root / "csv").mkdir(parents=True)
    shutil.copy(nodes, root / "csv" / "openb_node_list_gpu_node.csv")
    for fam in ("openb_pod_list_alpha", "openb_pod_list_beta"):
        shutil.copy(pods, root / "csv" / f"{fam}.csv")
    (root / "fgd-expected-results").mkdir()
    head = "workload,sc_policy,tune,seed,total_gpus," + ",".join(str(i) for i in range(131))
    row = "openb_pod_list_alpha,06-FGD,1.3,42,12," + ",".join(str(min(i, 90)) for i in range(131))
    (root / "fgd-expected-results" / "analysis_allo_discrete.csv").write_text(f"{head}\n{row}\n")
    args = ["bench", "traces", "--traces", str(root), "--seeds", "42", "-p", "bestfit", "-j", "1", "--json"]
    only_published = parse_json(runner().invoke(app, args).stdout)
    assert [r["trace"] for r in only_published["traces"]] == ["openb_pod_list_alpha"]  # type: ignore[index]
    every = parse_json(runner().invoke(app, [*args, "--all"]).stdout)
    rows = {r["trace"]: r for r in every["traces"]}  # type: ignore[attr-defined]
    assert set(rows) == {"openb_pod_list_alpha", "openb_pod_list_beta"}
    assert rows["openb_pod_list_alpha"]["published_fgd_at_100"] == 90.0
    assert rows["openb_pod_list_beta"]["published_fgd_at_100"] is None
    assert 0.0 < rows["openb_pod_list_beta"]["bestfit_at_100"] <= 100.0


def test_bench_traces_names_a_missing_or_broken_results_file(tmp_path: Path) -> None:
    root = tmp_path / "alibaba"
    nodes, pods = write_tiny_trace(tmp_path / "src")
    (root / "csv").mkdir(parents=True)
    shutil.copy(nodes, root / "csv" / "openb_node_list_gpu_node.csv")
    shutil.copy(pods, root / "csv" / "openb_pod_list_alpha.csv")
    args = ["bench", "traces", "--traces", str(root), "--seeds", "42", "-p", "bestfit", "-j", "1", "--json"]
    r = runner().invoke(app, args)
    assert r.exit_code != 0 and "no published results at" in r.output and "Traceback" not in r.output
    ok = runner().invoke(app, [*args, "--all"])  # --all needs no published results
    assert ok.exit_code == 0, ok.output
    (root / "fgd-expected-results").mkdir()
    (root / "fgd-expected-results" / "analysis_allo_discrete.csv").write_text("workload,seed\nx,notanumber\n")
    bad = runner().invoke(app, args)
    assert bad.exit_code != 0 and "analysis_allo_discrete.csv:2" in bad.output
    assert "Traceback" not in bad.output


@quiet_plots
def test_simulate_replay_prints_both_tables_and_json_by_class(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\n")
    rows = [
        "a,1000,1024,1,500,,0,100",
        "big,1000,1024,2,1000,,10,1000",
        "c,1000,1024,0,0,,20,30",
    ]
    header = f"{POD_HEADER},creation_time,deletion_time"
    (tmp_path / "pods.csv").write_text("\n".join([header, *rows, ""]))
    args = ["simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")]
    args += ["--protocol", "replay", "-p", "bestfit", "--seeds", "1", "--out", str(tmp_path / "out")]
    table = runner().invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "Pending time by request size" in table.output and "2 GPUs" in table.output
    res = runner().invoke(app, [*args, "--json", "--no-plots"])
    (result,) = parse_json(res.stdout)["results"]  # type: ignore[misc]
    assert result["by_class"]["2 GPUs"]["pending_max_s"] == 90.0
    assert result["by_class"]["cpu only"]["scheduled"] == 1


# --- the error convention and the older entry points -------------------------------------------------------


def test_run_cli_turns_only_gpusched_errors_into_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import typer

    from gpusched.cli import run_cli
    from gpusched.core.errors import GpuschedError, InvalidInput
    from gpusched.testenv import ControlPlaneError

    def raising(err: BaseException) -> Callable[[], None]:
        def fn() -> None:
            raise err

        return fn

    for err in (InvalidInput("bad.csv:3: num_gpu 2"), ControlPlaneError("etcd did not start")):
        assert isinstance(err, GpuschedError)
        with pytest.raises(typer.Exit) as exit_info:
            run_cli(raising(err))
        assert exit_info.value.exit_code == 2
        assert capsys.readouterr().err.strip() == f"error: {err}"

    with pytest.raises(KeyError):
        run_cli(raising(KeyError("a bug keeps its traceback")))


@pytest.mark.parametrize("command", ["scheduler", "extender", "webhook"])
def test_the_light_entry_points_take_the_same_options(command: str) -> None:
    """``python -m gpusched.cli scheduler|extender|webhook`` (started without the rest of the CLI,
    ``gpusched.cli.main``): the options of the whole app's ``gpusched scheduler|extender|webhook``,
    defined once."""
    import re

    proc = subprocess.run(
        [sys.executable, "-m", "gpusched.cli", command, "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    res = runner().invoke(app, [command, "--help"])
    assert res.exit_code == 0, res.output

    def options(text: str) -> set[str]:
        return set(re.findall(r"--[a-z][a-z-]+", text))

    assert options(proc.stdout) == options(res.output)
    assert "--port" in options(proc.stdout)
    if command != "webhook":
        assert "--kubeconfig" in options(proc.stdout) and "--policy" in options(proc.stdout)


def test_the_front_ends_start_without_the_rest_of_the_cli() -> None:
    """``gpusched scheduler|extender|webhook`` parse their options without loading the whole app (the
    simulator, the other commands): the webhook Deployment's pods start light."""
    code = (
        "import contextlib, io, sys, gpusched.cli as c\n"
        "for command in ('scheduler', 'extender', 'webhook'):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        c.main([command, '--help'])\n"
        "print(sorted(m for m in sys.modules if m.startswith(('gpusched.sim', 'gpusched.cli.commands', "
        "'gpusched.cli.bench', 'gpusched.cli.doctor'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout


def test_bench_defrag_compares_off_with_each_mode_and_budget(tmp_path: Path) -> None:
    args = ["bench", "defrag", "--sample", "30", "--seeds", "0", "--hours", "2", "--budgets", "0.02"]
    res = runner().invoke(app, [*args, "--modes", "triggered", "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    report = parse_json(res.stdout)
    labels = [row["label"] for row in report["summary"]]
    assert labels[0] == "off" and any(lbl.startswith("triggered") for lbl in labels), labels
    assert all(0 <= row["moved_pct"] <= 2 for row in report["summary"])  # the budget holds
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["churn_allocation_seed0.png", "churn_budget_curve.png"]


@pytest.mark.parametrize("budgets", ["0", "1.5", "a,b", ""])
def test_bench_defrag_refuses_bad_budgets(budgets: str) -> None:
    res = runner().invoke(app, ["bench", "defrag", "--budgets", budgets, "--no-plots"])
    assert res.exit_code == 2
    assert "budgets" in res.output


def test_bench_defrag_planner_reports_each_size() -> None:
    res = runner().invoke(app, ["bench", "defrag-planner", "--nodes", "60", "--instances", "2", "--json"])
    assert res.exit_code == 0, res.output
    (row,) = parse_json(res.stdout)["sizes"]
    assert row["nodes"] == 60 and row["instances"] <= 2
    assert set(row) >= {"greedy", "exact", "both", "heuristic_gap_moves"}


def test_scheduler_preemption_bound_flags_reach_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--preemption-limit`` / ``--preemption-window-s`` set ``SchedulerConfig``'s bound on
    preemptions per pod and node (issue 28 F1); unset, the config's defaults; 0 is refused."""
    from gpusched.k8s.scheduler import SchedulerConfig

    started: list[SchedulerConfig] = []
    monkeypatch.setattr("gpusched.k8s.serve.serve_scheduler", lambda config, **_: started.append(config))
    res = runner().invoke(app, ["scheduler", "--preemption-limit", "5", "--preemption-window-s", "120"])
    assert res.exit_code == 0, res.output
    res = runner().invoke(app, ["scheduler"])
    assert res.exit_code == 0, res.output
    given, default = started
    assert (given.preemption_limit, given.preemption_window_s) == (5, 120.0)
    assert (default.preemption_limit, default.preemption_window_s) == (
        SchedulerConfig.preemption_limit,
        SchedulerConfig.preemption_window_s,
    )
    for bad in (
        ["--preemption-limit", "0"],
        ["--preemption-window-s", "0"],
        ["--preemption-window-s", "nan"],
    ):
        res = runner().invoke(app, ["scheduler", *bad])
        assert res.exit_code == 2 and bad[0] in res.output, res.output
    assert len(started) == 2
