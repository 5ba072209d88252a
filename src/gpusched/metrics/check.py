"""Every shipped dashboard panel query and alert expression, evaluated against a user's Prometheus.

``gpusched metrics check --prometheus URL`` answers "do gpusched's dashboards and alerts have data
in MY Prometheus?" (dcgm-exporter or the node agent, kube-state-metrics, the scheduler and the
extender scraped under the job names ``gpusched.metrics.alerts.JOBS``). Each query is an instant
query through Prometheus's HTTP API (``GET <url>/api/v1/query``), so Thanos, Mimir or a proxy in
front of Prometheus that serves the same API work too.

Per query the outcome is ``data`` (one series or more), ``empty`` (it parses, nothing matches:
a series is not scraped) or ``error`` (Prometheus refused it; its error text is kept). Anything
that says the URL is not a usable Prometheus (refused connection, timeout, TLS, 401/403, 404, HTML
or JSON that is not the API's) raises ``PrometheusUnusable`` naming the URL and what happened.

The panel queries come from the dashboards' specs (``gpusched.metrics.dashboards.specs``: the
committed JSON is their output), with Grafana's ``$__rate_interval`` replaced by ``rate_interval``;
the alert expressions from ``gpusched.metrics.alerts.alerts`` with the shipped thresholds unless
others are given.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp

from gpusched.core.errors import GpuschedError, InvalidInput
from gpusched.metrics.alerts import Thresholds, alerts
from gpusched.metrics.dashboards import RI, specs

Kind = Literal["panel", "alert"]
Outcome = Literal["data", "empty", "error"]
KINDS: tuple[Kind, ...] = ("panel", "alert")
ALERTS_GROUP = "alerts"
DEFAULT_RATE_INTERVAL = "5m"  # 4 x a 1m scrape interval, Grafana's $__rate_interval floor rule
PROBE = "vector(1)"
_DURATION = re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+")


class PrometheusUnusable(GpuschedError, OSError):
    """The URL given as Prometheus cannot be queried: the message names the URL and why."""


@dataclass(frozen=True)
class Connection:
    """Where Prometheus's HTTP API is and how to reach it."""

    url: str
    token: str = ""
    """A bearer token (``Authorization: Bearer``), for a Prometheus behind an authenticating proxy."""
    ca_file: str = ""
    insecure: bool = False
    """Skip TLS certificate verification."""
    timeout_s: float = 30.0
    parallel: int = 8

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidInput(f"Prometheus URL {self.url!r}: give http(s)://HOST[:PORT][/PATH]")
        if self.timeout_s <= 0 or self.parallel < 1:
            raise InvalidInput("the timeout must be positive and the parallel queries at least 1")
        if self.ca_file and self.insecure:
            raise InvalidInput("give a CA file or skip verification (insecure), not both")

    @property
    def query_url(self) -> str:
        return self.url.rstrip("/") + "/api/v1/query"


@dataclass(frozen=True)
class Check:
    """One expression to evaluate: a dashboard panel's query or an alert's expression."""

    kind: Kind
    group: str
    """The dashboard's title, or ``alerts``."""
    name: str
    """The panel's title, or the alert's name."""
    expr: str


@dataclass(frozen=True)
class Result:
    kind: Kind
    group: str
    name: str
    expr: str
    outcome: Outcome
    series: int
    error: str = ""
    """Prometheus's ``errorType: error`` when the outcome is ``error``."""


@dataclass(frozen=True)
class Tally:
    total: int
    data: int
    empty: int
    error: int


@dataclass(frozen=True)
class Report:
    prometheus: str
    results: tuple[Result, ...]

    def of(self, kind: str) -> tuple[Result, ...]:
        return tuple(r for r in self.results if r.kind == kind)

    def tally(self, kind: str) -> Tally:
        rs = self.of(kind)
        n = {o: sum(1 for r in rs if r.outcome == o) for o in ("data", "empty", "error")}
        return Tally(len(rs), n["data"], n["empty"], n["error"])

    @property
    def parses(self) -> bool:
        """Every expression was accepted (empty ones included)."""
        return all(r.outcome != "error" for r in self.results)

    @property
    def all_data(self) -> bool:
        return all(r.outcome == "data" for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prometheus": self.prometheus,
            "summary": {k: asdict(self.tally(k)) for k in KINDS if self.of(k)},
            "results": [asdict(r) for r in self.results],
        }


def panel_checks(rate_interval: str = DEFAULT_RATE_INTERVAL) -> list[Check]:
    """Every query of every shipped dashboard, ``$__rate_interval`` replaced."""
    if not _DURATION.fullmatch(rate_interval):
        raise InvalidInput(f"rate interval {rate_interval!r}: give a Prometheus duration such as 5m or 90s")
    return [
        Check("panel", d.title, p.title, q.expr.replace(RI, rate_interval))
        for d in specs()
        for p in d.panels
        for q in p.queries
    ]


def alert_checks(thresholds: Thresholds | None = None) -> list[Check]:
    """Every alert's expression, with the shipped thresholds unless others are given."""
    return [Check("alert", ALERTS_GROUP, a.name, a.expr) for a in alerts(thresholds)]


def shipped_checks(
    only: Kind | None = None,
    *,
    thresholds: Thresholds | None = None,
    rate_interval: str = DEFAULT_RATE_INTERVAL,
) -> list[Check]:
    out: list[Check] = []
    if only in (None, "panel"):
        out += panel_checks(rate_interval)
    if only in (None, "alert"):
        out += alert_checks(thresholds)
    return out


def check(conn: Connection, checks: Sequence[Check]) -> Report:
    """Probe the URL (``vector(1)``), then evaluate every check as an instant query."""
    return asyncio.run(_check(conn, checks))


async def _check(conn: Connection, checks: Sequence[Check]) -> Report:
    ssl_arg: ssl.SSLContext | bool = True
    if conn.insecure:
        ssl_arg = False
    elif conn.ca_file:
        try:
            ssl_arg = ssl.create_default_context(cafile=conn.ca_file)
        except (OSError, ssl.SSLError) as e:
            raise InvalidInput(f"CA file {conn.ca_file}: {e}") from None
    headers = {"Accept": "application/json"}
    if conn.token:
        headers["Authorization"] = f"Bearer {conn.token}"
    timeout = aiohttp.ClientTimeout(total=conn.timeout_s)
    connector = aiohttp.TCPConnector(limit=conn.parallel, ssl=ssl_arg)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers, connector=connector) as session:
        probe = await _query(session, conn, PROBE)
        if probe.outcome != "data":
            raise PrometheusUnusable(
                f"Prometheus at {conn.url}: {PROBE} answered {probe.outcome} {probe.error}"
            )
        answers = await asyncio.gather(
            *(_query(session, conn, c.expr) for c in checks), return_exceptions=True
        )
    for a in answers:  # the first that says the URL is unusable (a bug keeps its traceback)
        if isinstance(a, BaseException):
            raise a
    found = [a for a in answers if isinstance(a, _Found)]
    results = tuple(
        Result(c.kind, c.group, c.name, c.expr, f.outcome, f.series, f.error)
        for c, f in zip(checks, found, strict=True)
    )
    return Report(conn.url, results)


@dataclass(frozen=True)
class _Found:
    outcome: Outcome
    series: int
    error: str = ""


# Prometheus answers a query it refuses with one of these and a JSON body saying why: 400 bad_data
# (does not parse), 422 execution, 503 timeout/canceled (the query ran too long there).
_REFUSED = (400, 422, 503)


async def _query(session: aiohttp.ClientSession, conn: Connection, expr: str) -> _Found:
    where = f"Prometheus at {conn.url} (GET {conn.query_url})"
    try:
        async with session.get(conn.query_url, params={"query": expr}) as resp:
            text = await resp.text(errors="replace")
            status, ctype = resp.status, resp.headers.get("Content-Type", "")
    except TimeoutError:
        raise PrometheusUnusable(f"{where}: no answer within {conn.timeout_s:g} s") from None
    except aiohttp.ClientSSLError as e:
        raise PrometheusUnusable(f"{where}: TLS failed: {e}") from None
    except (aiohttp.ClientError, OSError) as e:
        raise PrometheusUnusable(f"{where}: cannot connect: {e}") from None
    if status in (401, 403):
        raise PrometheusUnusable(f"{where}: HTTP {status}: not authorised (give a bearer token?)")
    body = _json(text)
    if status == 200 or (status in _REFUSED and body is not None and body.get("status") == "error"):
        if body is None or body.get("status") not in ("success", "error"):
            what = "HTML" if "html" in ctype or text.lstrip().startswith("<") else f"{ctype or 'a body'}"
            raise PrometheusUnusable(
                f"{where}: answered {what}, not Prometheus's query API (is this Prometheus's base URL?)"
            )
        if body["status"] == "error":
            return _Found("error", 0, f"{body.get('errorType', 'error')}: {body.get('error', '')}")
        return _series(body, where)
    raise PrometheusUnusable(
        f"{where}: HTTP {status} (is this Prometheus's base URL?): {text.strip()[:200]!r}"
    )


def _json(text: str) -> dict[str, Any] | None:
    try:
        body = json.loads(text)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _series(body: dict[str, Any], where: str) -> _Found:
    data = body.get("data")
    if not isinstance(data, dict) or "result" not in data:
        raise PrometheusUnusable(f"{where}: a success without data.result: not Prometheus's query API")
    result = data["result"]
    if data.get("resultType") in ("scalar", "string"):  # one value: always data
        return _Found("data", 1)
    if not isinstance(result, list):
        raise PrometheusUnusable(f"{where}: data.result is {type(result).__name__}, not a list")
    return _Found("data" if result else "empty", len(result))
