"""Trace readers: every bad row is named by file and line; valid rows parse exactly."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import pytest

from gpusched.sim.traces import GPU_MEMORY_MIB, TraceError, TracePod, read_nodes, read_pods

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"
POD_HEADER_FULL = POD_HEADER + ",gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
GOOD_POD = "p0,1000,1024,1,500"
GOOD_NODE = "n0,64000,262144,2,T4"


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def expect_trace_error(fn: Callable[[Path], object], path: Path, line: int, *fragments: str) -> TraceError:
    """``fn(path)`` raises a TraceError for ``line``; its message names file, line and ``fragments``."""
    with pytest.raises(TraceError) as info:
        fn(path)
    e = info.value
    msg = str(e)
    assert e.line == line, msg
    assert e.path == str(path)
    assert str(path) in msg
    assert f"{path}:{line}:" in msg
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    return e


# --- pod lists: one bad row after a good one, so the line number is checked ------------------------------

BAD_POD_ROWS = [
    pytest.param("p1,-1000,1024,1,500", ("cpu_milli", "negative"), id="negative-cpu"),
    pytest.param("p1,1000,-1,1,500", ("memory_mib", "negative"), id="negative-memory"),
    pytest.param("p1,1000,1024,-1,500", ("num_gpu", "negative"), id="negative-num-gpu"),
    pytest.param("p1,1000,1024,1,-500", ("gpu_milli", "negative"), id="negative-gpu-milli"),
    pytest.param("p1,1000.5,1024,1,500", ("cpu_milli", "not an integer", "1000.5"), id="fraction"),
    pytest.param("p1,1000,1024,one,500", ("num_gpu", "not an integer", "one"), id="word"),
    pytest.param("p1,1000,1024,1,nan", ("gpu_milli", "not an integer"), id="nan"),
    pytest.param("p1,1000,1024,1,", ("gpu_milli", "empty"), id="empty-field"),
    pytest.param("p1,1000,1024,1,1500", ("gpu_milli", "1500", "more than one GPU"), id="gpu-milli-over-1000"),
    pytest.param("p1,1000,1024,2,500", ("gpu_milli 500", "num_gpu 2"), id="share-with-2-gpus"),
    pytest.param("p1,1000,1024,8,999", ("gpu_milli 999", "num_gpu 8"), id="share-with-8-gpus"),
    pytest.param("p1,1000,1024,0,500", ("num_gpu 0", "gpu_milli 500"), id="no-gpus-but-milli"),
    pytest.param("p1,1000,1024,1,0", ("num_gpu 1", "gpu_milli 0"), id="gpus-but-no-milli"),
    pytest.param("p1,1000,1024,1", ("4 fields", "header has 5"), id="too-few-fields"),
    pytest.param("p1,1000,1024,1,500,x", ("6 fields", "header has 5"), id="too-many-fields"),
    pytest.param("p0,2000,2048,1,1000", ("duplicate pod name", "p0"), id="duplicate-name"),
    pytest.param(",1000,1024,1,500", ("name is empty",), id="empty-name"),
]


@pytest.mark.parametrize(("row", "fragments"), BAD_POD_ROWS)
def test_bad_pod_row_names_file_and_line(tmp_path: Path, row: str, fragments: tuple[str, ...]) -> None:
    path = write(tmp_path, f"{POD_HEADER}\n{GOOD_POD}\n{row}\n")
    expect_trace_error(read_pods, path, 3, *fragments)


def test_deletion_before_creation(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"{POD_HEADER_FULL}\np0,1000,1024,1,500,,LS,Running,10,20,10\np1,1000,1024,1,500,,LS,Running,50,40,50\n",
    )
    expect_trace_error(read_pods, path, 3, "deletion_time 40", "creation_time 50")


def test_blank_lines_are_skipped_but_counted(tmp_path: Path) -> None:
    path = write(tmp_path, f"{POD_HEADER}\n{GOOD_POD}\n\n,,,,\np1,1000,1024,1,-5\n")
    expect_trace_error(read_pods, path, 5, "gpu_milli", "negative")


def test_crlf_line_endings(tmp_path: Path) -> None:
    path = write(tmp_path, f"{POD_HEADER}\r\n{GOOD_POD}\r\np1,1000,1024,2,500\r\n")
    expect_trace_error(read_pods, path, 3, "num_gpu 2")


@pytest.mark.parametrize(
    ("text", "line", "fragments"),
    [
        pytest.param("", 1, ("empty file",), id="empty-file"),
        pytest.param(f"{POD_HEADER}\n", 1, ("no data rows",), id="header-only"),
        pytest.param(f"{POD_HEADER}\n\n\n", 1, ("no data rows",), id="header-and-blank-lines"),
        pytest.param(f"{POD_HEADER},color\n{GOOD_POD},red\n", 1, ("unknown column", "color"), id="unknown"),
        pytest.param("name,cpu_milli,memory_mib,num_gpu\np,1,1,0\n", 1, ("missing", "gpu_milli"), id="miss"),
        pytest.param(f"{NODE_HEADER}\n{GOOD_NODE}\n", 1, ("missing column",), id="node-file"),
    ],
)
def test_bad_pod_file(tmp_path: Path, text: str, line: int, fragments: tuple[str, ...]) -> None:
    expect_trace_error(read_pods, write(tmp_path, text), line, *fragments)


def test_missing_pod_file(tmp_path: Path) -> None:
    expect_trace_error(read_pods, tmp_path / "nope.csv", 0, "file not found")


def test_path_given_as_str(tmp_path: Path) -> None:
    path = write(tmp_path, f"{POD_HEADER}\n{GOOD_POD}\np1,1000,1024,1,1001\n")
    with pytest.raises(TraceError) as info:
        read_pods(str(path))
    assert info.value.line == 3
    assert f"{path}:3:" in str(info.value)


# --- node lists ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "fragments"),
    [
        pytest.param("n1,-64000,262144,2,T4", ("cpu_milli", "negative"), id="negative-cpu"),
        pytest.param("n1,64000,-1,2,T4", ("memory_mib", "negative"), id="negative-memory"),
        pytest.param("n1,64000,262144,-2,T4", ("gpu", "negative"), id="negative-gpus"),
        pytest.param("n1,64000,262144,2.5,T4", ("gpu", "not an integer"), id="fractional-gpus"),
        pytest.param("n1,64000,lots,2,T4", ("memory_mib", "not an integer"), id="word"),
        pytest.param("n1,64000,262144,2,", ("n1", "2 GPUs", "no model"), id="gpus-without-model"),
        pytest.param("n0,64000,262144,2,T4", ("duplicate node name", "n0"), id="duplicate-name"),
        pytest.param(",64000,262144,2,T4", ("node name", "empty"), id="empty-name"),
        pytest.param("n1,64000,262144,2", ("4 fields",), id="too-few-fields"),
    ],
)
def test_bad_node_row_names_file_and_line(tmp_path: Path, row: str, fragments: tuple[str, ...]) -> None:
    path = write(tmp_path, f"{NODE_HEADER}\n{GOOD_NODE}\n{row}\n")
    expect_trace_error(read_nodes, path, 3, *fragments)


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        pytest.param("", ("empty file",), id="empty-file"),
        pytest.param(f"{NODE_HEADER}\n", ("no data rows",), id="header-only"),
        pytest.param(f"{NODE_HEADER},rack\n{GOOD_NODE},r1\n", ("unknown column", "rack"), id="unknown"),
        pytest.param("sn,cpu_milli,memory_mib,gpu\nn0,1,1,0\n", ("missing column", "model"), id="missing"),
        pytest.param(f"{POD_HEADER}\n{GOOD_POD}\n", ("missing column",), id="pod-file"),
    ],
)
def test_bad_node_file(tmp_path: Path, text: str, fragments: tuple[str, ...]) -> None:
    expect_trace_error(read_nodes, write(tmp_path, text), 1, *fragments)


def test_missing_node_file(tmp_path: Path) -> None:
    expect_trace_error(read_nodes, tmp_path / "nodes.csv", 0, "file not found")


# --- valid input -----------------------------------------------------------------------------------------


def test_multigpu_format_five_columns(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"{POD_HEADER}\np0,12000,16384,1,1000\np1,6000,12288,1,460\np2,32000,65536,8,1000\np3,4000,8192,0,0\n",
    )
    pods = read_pods(path)
    assert [tp.spec.name for tp in pods] == ["p0", "p1", "p2", "p3"]
    assert all(isinstance(tp, TracePod) for tp in pods)
    assert all(tp.created is None and tp.deleted is None for tp in pods)
    assert all(tp.spec.gpu_models == frozenset() for tp in pods)
    p0, p1, p2, p3 = (tp.spec for tp in pods)
    assert (p0.cpu_milli, p0.memory_mib, p0.num_gpu, p0.gpu_milli) == (12000, 16384, 1, 1000)
    assert p1.is_share and p1.gpu_demand_milli == 460
    assert p2.gpu_demand_milli == 8000 and not p2.is_share
    assert p3.num_gpu == 0 and p3.gpu_demand_milli == 0


def test_full_format_with_gpu_spec_and_times(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"{POD_HEADER_FULL}\n"
        "a,12000,16384,1,1000,V100M16|V100M32,LS,Running,0,100,0\n"
        "b,8000,30517,1,440,G2|P100|T4,LS,Running,5,,\n"
        "c,6000,12288,1,460,,BE,Running,7,9,7\n"
        "d,6000,12288,2,1000, A10 | T4 ,LS,Running,,,\n",
    )
    a, b, c, d = read_pods(path)
    assert a.spec.gpu_models == frozenset({"V100M16", "V100M32"})
    assert isinstance(a.spec.gpu_models, frozenset)
    assert (a.created, a.deleted) == (0, 100)
    assert b.spec.gpu_models == frozenset({"G2", "P100", "T4"})
    assert (b.created, b.deleted) == (5, None)
    assert c.spec.gpu_models == frozenset()
    assert (c.created, c.deleted) == (7, 9)
    assert d.spec.gpu_models == frozenset({"A10", "T4"})
    assert (d.created, d.deleted) == (None, None)


def test_columns_in_any_order_and_padded(tmp_path: Path) -> None:
    path = write(tmp_path, " gpu_milli , num_gpu ,name,memory_mib,cpu_milli\n 250 , 1 , x ,2048,3000\n")
    (tp,) = read_pods(path)
    assert (tp.spec.name, tp.spec.cpu_milli, tp.spec.memory_mib, tp.spec.num_gpu, tp.spec.gpu_milli) == (
        "x",
        3000,
        2048,
        1,
        250,
    )


def test_nodes_parse_models_and_memory(tmp_path: Path) -> None:
    rows = ["cpu0,32000,262144,0,", "t4,64000,262144,2,T4", "g2,96000,786432,8,G2", "cpu1,8000,1024,0,T4"]
    path = write(tmp_path, "\n".join([NODE_HEADER, *rows, ""]))
    nodes = read_nodes(path)
    assert [n.name for n in nodes] == ["cpu0", "t4", "g2", "cpu1"]
    cpu0, t4, g2, cpu1 = nodes
    assert (cpu0.gpu_count, cpu0.gpu_model, cpu0.gpu_memory_mib) == (0, "", 0)
    assert (t4.cpu_milli, t4.memory_mib, t4.gpu_count, t4.gpu_model) == (64000, 262144, 2, "T4")
    assert t4.gpu_memory_mib == GPU_MEMORY_MIB["T4"]
    assert (g2.gpu_count, g2.gpu_model, g2.gpu_memory_mib) == (8, "G2", 0)  # undisclosed memory
    assert (cpu1.gpu_count, cpu1.gpu_model) == (0, "")  # a model without GPUs is ignored
    assert [n.name for n in read_nodes(path, gpu_nodes_only=True)] == ["t4", "g2"]


# --- regressions: bugs found in review, now fixed ---------------------------------------------------------


@pytest.mark.parametrize("raw", ["inf", "-inf", "1e400"])
def test_infinite_value_is_a_trace_error(tmp_path: Path, raw: str) -> None:
    path = write(tmp_path, f"{POD_HEADER}\n{GOOD_POD}\np1,1000,1024,1,{raw}\n")
    expect_trace_error(read_pods, path, 3, "gpu_milli")


def test_line_number_after_multiline_quoted_field(tmp_path: Path) -> None:
    path = write(tmp_path, f'{POD_HEADER}\n"p\n0",1000,1024,1,500\np1,1000,1024,1,-5\n')
    expect_trace_error(read_pods, path, 4, "gpu_milli", "negative")


def test_gpu_nodes_only_still_validates_every_row(tmp_path: Path) -> None:
    path = write(tmp_path, f"{NODE_HEADER}\n{GOOD_NODE}\ncpu0,-5,lots,0,\n")
    expect_trace_error(lambda p: read_nodes(p, gpu_nodes_only=True), path, 3, "cpu_milli")


def test_non_utf8_bytes_are_a_trace_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(f"{POD_HEADER}\n{GOOD_POD}\np\xe9,1000,1024,1,500\n".encode("latin-1"))
    expect_trace_error(read_pods, path, 3)


def test_directory_is_a_trace_error(tmp_path: Path) -> None:
    expect_trace_error(read_pods, tmp_path, 0)


# --- the real trace --------------------------------------------------------------------------------------


def _write_pods(path: Path, pods: list[TracePod]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow([*POD_HEADER.split(","), "gpu_spec", "creation_time", "deletion_time"])
        for tp in pods:
            s = tp.spec
            spec = "|".join(sorted(s.gpu_models))
            created = "" if tp.created is None else tp.created
            deleted = "" if tp.deleted is None else tp.deleted
            w.writerow([s.name, s.cpu_milli, s.memory_mib, s.num_gpu, s.gpu_milli, spec, created, deleted])


def test_real_default_trace_round_trip(trace_csv: Path, tmp_path: Path) -> None:
    nodes = read_nodes(trace_csv / "openb_node_list_gpu_node.csv")
    pods = read_pods(trace_csv / "openb_pod_list_default.csv")
    assert len(pods) == 8152
    assert len(nodes) == 1213
    assert sum(n.gpu_count for n in nodes) == 6212
    assert all(n.gpu_count > 0 and n.gpu_model for n in nodes)
    assert len({tp.spec.name for tp in pods}) == len(pods)
    assert all(tp.created is not None for tp in pods)
    again = tmp_path / "pods.csv"
    _write_pods(again, pods)
    assert read_pods(again) == pods


def test_real_all_node_list(trace_csv: Path) -> None:
    path = trace_csv / "openb_node_list_all_node.csv"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    all_nodes = read_nodes(path)
    gpu_nodes = read_nodes(path, gpu_nodes_only=True)
    assert sum(n.gpu_count for n in all_nodes) == sum(n.gpu_count for n in gpu_nodes) == 6212
    assert len(gpu_nodes) == 1213 < len(all_nodes)


def test_real_gpuspec_and_multigpu_lists(trace_csv: Path) -> None:
    spec, multi = trace_csv / "openb_pod_list_gpuspec33.csv", trace_csv / "openb_pod_list_multigpu20.csv"
    if not (spec.is_file() and multi.is_file()):
        pytest.skip("gpuspec33/multigpu20 pod lists not present")
    constrained = [tp for tp in read_pods(spec) if tp.spec.gpu_models]
    assert constrained
    assert any(len(tp.spec.gpu_models) > 1 for tp in constrained)
    mpods = read_pods(multi)
    assert all(tp.created is None and tp.deleted is None for tp in mpods)
    assert any(tp.spec.num_gpu > 1 for tp in mpods)
