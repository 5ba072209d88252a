"""``gpusched metrics check`` against a fake Prometheus (an aiohttp server answering
``/api/v1/query`` as Prometheus does: data, empty, a PromQL error with 400 bad_data), and against
URLs that are not a usable Prometheus: nothing listening, HTML, 404, a timeout."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from typer.testing import CliRunner

from gpusched.cli.commands import app
from gpusched.core.errors import GpuschedError, InvalidInput
from gpusched.metrics.check import (
    Check,
    Connection,
    PrometheusUnusable,
    alert_checks,
    check,
    panel_checks,
    shipped_checks,
)
from gpusched.metrics.dashboards import RI, panel_queries
from gpusched.metrics.generate import DASHBOARD_DIR

ROOT = Path(__file__).resolve().parents[1]
Handler = Callable[[web.Request], Any]


def _vector(n: int) -> dict[str, Any]:
    result = [{"metric": {"i": str(i)}, "value": [1.0, "1"]} for i in range(n)]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def prometheus_like(answers: dict[str, int | str]) -> Handler:
    """A query in ``answers`` gets that many series (an int) or a bad_data error (a str); any other
    gets one series. The requests' queries are recorded on the handler."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        expr = request.query.get("query", "")
        seen.append(expr)
        a = answers.get(expr, 1)
        if isinstance(a, str):
            return web.json_response({"status": "error", "errorType": "bad_data", "error": a}, status=400)
        return web.json_response(_vector(a))

    handle.seen = seen  # type: ignore[attr-defined]
    return handle


@pytest.fixture
def serve() -> Iterator[Callable[[Handler, str], str]]:
    """Start an aiohttp server (own loop, own thread) routing ``path`` to ``handler``; returns its URL."""
    stops: list[Callable[[], None]] = []

    def start(handler: Handler, path: str = "/api/v1/query") -> str:
        loop = asyncio.new_event_loop()
        app_ = web.Application()
        app_.router.add_get(path, handler)
        runner = web.AppRunner(app_, access_log=None)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        t = threading.Thread(target=loop.run_forever, daemon=True)
        t.start()

        def stop() -> None:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            t.join(10)
            loop.close()

        stops.append(stop)
        return f"http://127.0.0.1:{port}"

    yield start
    for stop in stops:
        stop()


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["metrics", "check", *args])


# ------------------------------------------------------------------------------ what is checked
def test_panel_checks_are_the_committed_dashboards_queries() -> None:
    """The specs' queries are exactly those of the shipped JSON (the chart's ConfigMaps)."""
    committed = sorted(
        (title, expr)
        for p in (ROOT / DASHBOARD_DIR).glob("*.json")
        for title, expr in panel_queries(json.loads(p.read_text()))
    )
    checks = panel_checks("987654ms")
    assert sorted((c.name, c.expr.replace("987654ms", RI)) for c in checks) == committed
    assert not any(RI in c.expr for c in checks)
    assert len(alert_checks()) == 12 and {c.group for c in alert_checks()} == {"alerts"}
    assert len(shipped_checks("panel")) == len(checks) and len(shipped_checks()) == len(checks) + 12


def test_bad_rate_interval_and_bad_url_are_input_errors() -> None:
    with pytest.raises(InvalidInput, match="rate interval '5 minutes'"):
        panel_checks("5 minutes")
    for url in ("localhost:9090", "ftp://x", "http://"):
        with pytest.raises(InvalidInput, match="Prometheus URL"):
            Connection(url)


# ------------------------------------------------------------------------------ outcomes
def test_outcomes_data_empty_error_per_query(serve: Callable[..., str]) -> None:
    handler = prometheus_like({"a": 3, "b": 0, "c": "parse error: unexpected <EOF>"})
    url = serve(handler)
    checks = [
        Check("panel", "D", "pa", "a"),
        Check("panel", "D", "pb", "b"),
        Check("alert", "alerts", "X", "c"),
    ]
    report = check(Connection(url + "/"), checks)
    got = [(r.name, r.outcome, r.series, r.error) for r in report.results]
    assert got == [("pa", "data", 3, ""), ("pb", "empty", 0, ""),
                   ("X", "error", 0, "bad_data: parse error: unexpected <EOF>")]  # fmt: skip
    assert not report.parses and not report.all_data
    t = report.tally("panel")
    assert (t.total, t.data, t.empty, t.error) == (2, 1, 1, 0)
    assert sorted(handler.seen) == ["a", "b", "c", "vector(1)"]  # type: ignore[attr-defined]


def test_a_path_prefix_and_the_bearer_token_are_used(serve: Callable[..., str]) -> None:
    tokens: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        tokens.append(request.headers.get("Authorization", ""))
        return web.json_response(_vector(1))

    url = serve(handle, "/prom/api/v1/query")
    report = check(Connection(url + "/prom", token="s3cret"), [Check("panel", "D", "p", "up")])
    assert report.all_data and set(tokens) == {"Bearer s3cret"}


def test_cli_all_shipped_queries_json_and_exit_status(serve: Callable[..., str]) -> None:
    checks = shipped_checks()
    empty_expr = checks[0].expr
    url = serve(prometheus_like({empty_expr: 0}))
    r = invoke("--prometheus", url, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    panels = len(panel_checks())
    assert out["summary"]["panel"] == {"total": panels, "data": panels - 1, "empty": 1, "error": 0}
    assert out["summary"]["alert"] == {"total": 12, "data": 12, "empty": 0, "error": 0}
    assert next(x["outcome"] for x in out["results"] if x["expr"] == empty_expr) == "empty"
    assert invoke("--prometheus", url, "--require-data").exit_code == 1
    r = invoke("--prometheus", url, "--only", "alerts", "--require-data")
    assert r.exit_code == 0, r.output
    assert "12/12 alert expressions with data" in r.stdout and "panel queries" not in r.stdout
    r = invoke("--prometheus", url, "--only", "dashboards")
    assert r.exit_code == 0 and f"{panels - 1}/{panels} panel queries with data (1 empty)" in r.stdout
    assert "gpusched / Cluster overview" in r.stdout  # grouped by dashboard


def test_cli_a_refused_expression_exits_1_and_shows_the_error(serve: Callable[..., str]) -> None:
    bad = alert_checks()[0]
    url = serve(prometheus_like({bad.expr: "1:5: parse error: unexpected identifier"}))
    r = invoke("--prometheus", url, "--only", "alerts")
    assert r.exit_code == 1
    assert "unexpected identifier" in r.stdout and "11/12 alert expressions with data (1 error)" in r.stdout


# ------------------------------------------------------------------------------ not a Prometheus
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cli_unreachable_prometheus_exits_2_naming_the_url() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    r = invoke("--prometheus", url)
    assert r.exit_code == 2
    assert r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and url in line and "cannot connect" in line


def test_cli_bad_url_exits_2() -> None:
    r = invoke("--prometheus", "prometheus:9090")
    assert r.exit_code == 2 and "error: Prometheus URL 'prometheus:9090'" in r.stderr


async def _html(request: web.Request) -> web.Response:
    return web.Response(text="<!doctype html><html><body>Grafana</body></html>", content_type="text/html")


async def _not_json_api(request: web.Request) -> web.Response:
    return web.json_response({"hello": "world"})


@pytest.mark.parametrize(
    ("handler", "path", "needle"),
    [
        (_html, "/api/v1/query", "answered HTML, not Prometheus's query API"),
        (_not_json_api, "/api/v1/query", "not Prometheus's query API"),
        (_html, "/elsewhere", "HTTP 404"),
    ],
    ids=["html-200", "json-not-the-api", "404"],
)
def test_a_server_that_is_not_prometheus(
    serve: Callable[..., str], handler: Handler, path: str, needle: str
) -> None:
    url = serve(handler, path)
    with pytest.raises(PrometheusUnusable, match=needle) as e:
        check(Connection(url), shipped_checks())
    assert isinstance(e.value, GpuschedError) and url in str(e.value)
    r = invoke("--prometheus", url)
    assert r.exit_code == 2 and needle in r.stderr and url in r.stderr


def test_unauthorised_and_timeout(serve: Callable[..., str]) -> None:
    async def denied(request: web.Request) -> web.Response:
        return web.Response(status=401, text="Unauthorized")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.json_response(_vector(1))

    with pytest.raises(PrometheusUnusable, match="HTTP 401: not authorised"):
        check(Connection(serve(denied)), [])
    url = serve(slow)
    with pytest.raises(PrometheusUnusable, match=r"no answer within 0.2 s") as e:
        check(Connection(url, timeout_s=0.2), [])
    assert url in str(e.value)
