"""The GPU map in headless Chromium (Debian's ``chromium``): the page served by ``gpusched ui``
from the demo cluster's snapshot, its content read back from the DOM after the scripts ran, and
screenshots of the map and of ``doctor pod``'s output (in the test's temporary folder; with
``GPUSCHED_SCREENSHOTS=docs/images`` where the README takes them from)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusched.doctor.books import Books
from gpusched.doctor.demo import demo_snapshot
from gpusched.doctor.ui import BooksCache, serve


def images(tmp: Path) -> Path:
    """Where the screenshots go: ``$GPUSCHED_SCREENSHOTS`` (docs/images for the README), else ``tmp``."""
    out = Path(os.environ.get("GPUSCHED_SCREENSHOTS") or tmp / "images")
    out.mkdir(parents=True, exist_ok=True)
    return out


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (apt-get install -y chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return exe


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    books = Books.of(demo_snapshot())
    server = serve(BooksCache(lambda: books, None), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


def run_chromium(*args: str, tmp: Path) -> str:
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--user-data-dir={tmp / 'profile'}", "--virtual-time-budget=8000", *args]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_endpoints_answer_json_and_name_a_bad_pod(url: str) -> None:
    with urllib.request.urlopen(url + "api/map") as r:
        m = json.load(r)
    assert len(m["nodes"]) == 12 and len(m["pending"]) == 4
    held = {p["pod"] for n in m["nodes"] for g in n["gpus"] for p in g["pods"]}
    assert "team-b/llm-0" in held
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url + "api/pod?name=team-x/nope")
    assert e.value.code == 404 and "team-x/nope" in json.load(e.value)["error"]


def test_gpu_map_in_headless_chromium(url: str, tmp_path: Path) -> None:
    page = url + "?pod=team-a/needs-two-a100"
    dom = run_chromium("--dump-dom", page, tmp=tmp_path)
    assert 'data-ready="1"' in dom, dom[-3000:]
    assert dom.count('class="node') == 12  # every node drawn
    assert dom.count('class="gpu') >= 48  # every GPU drawn (12 nodes, 48 GPUs)
    assert 'class="gpu bad"' in dom  # the failed GPU of a100-4
    assert 'data-pod="team-b/llm-0"' in dom  # a GPU coloured by what holds it
    assert "stranded" in dom and "12 nodes" in dom and "4 pending" in dom
    for pod in ("team-c/needs-h100-toleration", "team-c/wants-b200", "team-c/wants-120gib"):
        assert f'data-pod="{pod}"' in dom  # pending pods with their reasons
    assert "GPU model mismatch" in dom
    # the counterfactual of the selected pod
    assert "fits on a100-0 if shares" in dom and "(2 moves)" in dom
    shot = images(tmp_path) / "gpu-map.png"
    run_chromium(f"--screenshot={shot}", "--window-size=1500,1000", page, tmp=tmp_path)
    assert shot.stat().st_size > 20_000


def test_doctor_output_screenshot(tmp_path: Path) -> None:
    """``gpusched doctor pod`` as the terminal shows it (rich's SVG export, rendered by Chromium)."""
    from rich.console import Console

    from gpusched.doctor.analysis import doctor_pod
    from gpusched.doctor.render import render_pod

    books = Books.of(demo_snapshot())
    con = Console(record=True, width=130, force_terminal=True, color_system="truecolor")
    for key in ("team-a/needs-two-a100", "team-c/needs-h100-toleration", "team-a/notebook-1"):
        render_pod(doctor_pod(books, key), con)
        con.print()
    text = con.export_text(clear=False)
    assert "fits on a100-0 if shares" in text and "needs a toleration for dedicated=training" in text
    assert "drift: the scheduler booked GPU(s) [1] of a100-5" in text
    svg = images(tmp_path) / "doctor-pod.svg"
    con.save_svg(str(svg), title="gpusched doctor pod")
    shot = svg.with_suffix(".png")
    run_chromium(f"--screenshot={shot}", "--window-size=1400,1150", svg.as_uri(), tmp=tmp_path)
    assert shot.stat().st_size > 20_000


def test_mig_slices_in_headless_chromium(tmp_path: Path) -> None:
    """A MIG node's GPUs drawn slice by slice: each slice at its start, coloured by the pod holding it or
    marked free; the pending 4g pod's counterfactual names the re-cut of GPU 0."""
    from gpusched.doctor.demo import mig_demo_snapshot

    books = Books.of(mig_demo_snapshot())
    server = serve(BooksCache(lambda: books, None), "127.0.0.1", 0)
    try:
        page = f"http://127.0.0.1:{server.server_address[1]}/?pod=team-b/needs-4g"
        dom = run_chromium("--dump-dom", page, tmp=tmp_path)
    finally:
        server.shutdown()
    assert 'data-ready="1"' in dom, dom[-3000:]
    assert dom.count('class="mig') == 2  # both MIG GPUs drawn
    assert dom.count('class="sl free"') == 3  # 2g@0, 1g@2, 1g@3 of GPU 0
    assert 'data-pod="team-a/train-4g" data-slice="1:4g.40gb@0"' in dom
    assert 'data-slice="0:1g.10gb@2"' in dom and "2 MIG GPU" in dom
    assert "GPU 0 of node a100-mig-0 could host it after re-cutting its free slices" in dom
