"""How doctor's reports look in a terminal: rich text with colour, or one JSON object on stdout.
(The command line's own module, ``gpusched.cli.doctor``, decides what to show; this module how.)"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpusched.doctor.findings import ClusterReport, Counterfactual, Finding, NodeReport, PodReport

_STYLE = {"ok": "green", "info": "cyan", "warn": "yellow", "error": "bold red"}
_MARK = {"ok": "✓", "info": "·", "warn": "!", "error": "✗"}
_LEVEL_TITLE = {
    "node": "Node",
    "device": "Device plugin / container",
    "scheduling": "Scheduling",
    "counterfactual": "What would make it fit",
}


def console() -> Console:
    return Console(soft_wrap=True, highlight=False)


def json_out(obj: Any) -> None:
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n")


def _finding(out: Console, f: Finding) -> None:
    line = Text(f"  {_MARK[f.severity]} ", style=_STYLE[f.severity])
    line.append(f"{f.code}: ", style=_STYLE[f.severity])
    line.append(f.message)
    out.print(line)
    shown = {k: v for k, v in f.evidence.items() if v not in (None, "", [], {})}
    if shown and f.severity in ("warn", "error"):
        ev = ", ".join(f"{k}={v}" for k, v in shown.items())
        out.print(Text(f"      evidence: {ev}", style="dim"))


def _findings(out: Console, findings: Sequence[Finding]) -> None:
    for level in ("node", "device", "scheduling"):
        fs = [f for f in findings if f.level == level]
        if fs:
            out.print(Text(_LEVEL_TITLE[level], style="bold underline"))
            for f in fs:
                _finding(out, f)


def _counterfactuals(out: Console, cfs: Sequence[Counterfactual]) -> None:
    if not cfs:
        return
    out.print(Text(_LEVEL_TITLE["counterfactual"], style="bold underline"))
    for i, c in enumerate(cfs):
        style = "bold green" if i == 0 and c.verified else ("green" if c.verified else "yellow")
        line = Text("  → " if i == 0 else "    ", style=style)
        line.append(c.message, style=style)
        line.append("  (checked on a copy of the books)" if c.verified else "  (not checked)", style="dim")
        out.print(line)


def render_pod(r: PodReport, out: Console | None = None) -> None:
    out = out or console()
    head = Text(f"pod {r.pod}", style="bold")
    head.append(f"  {r.phase or '?'}" + (f" on {r.node}" if r.node else ""), style="dim")
    out.print(head)
    _findings(out, r.findings)
    _counterfactuals(out, r.counterfactuals)


def render_node(r: NodeReport, out: Console | None = None) -> None:
    out = out or console()
    out.print(Text(f"node {r.node}", style="bold"))
    _findings(out, r.findings)
    if r.gpus:
        t = Table("GPU", "health", "free milli", "free MiB", "pods")
        for g in r.gpus:
            pods = ", ".join(f"{p['pod']} ({p['milli']})" for p in g["pods"]) or "-"
            health = Text("ok", style="green") if g["healthy"] else Text("UNHEALTHY", style="bold red")
            t.add_row(str(g["index"]), health, str(g["free_milli"]), str(g["free_memory_mib"]), pods)
        out.print(t)
    if r.mig:
        out.print(mig_table(r.mig))


def mig_table(gpus: Sequence[Mapping[str, Any]]) -> Table:
    """One row per MIG GPU: each slice as ``profile@start`` with the pod holding it, or free."""
    t = Table("MIG GPU", "model", "state", "slices (profile@start: pod)", title="MIG slices")
    for g in gpus:
        state = "re-cutting" if g["reshaping"] else ("MIG" if g["mig_enabled"] else "MIG off")
        row = Text()
        for k, x in enumerate(g["slices"]):
            row.append(", " if k else "")
            row.append(f"{x['profile']}@{x['start']}: ")
            row.append(x["pod"] or "free", style="" if x["pod"] else "green")
        t.add_row(
            str(g["index"]), g["model"], state, row if g["slices"] else Text("no instances", style="dim")
        )
    return t


def render_cluster(r: ClusterReport, out: Console | None = None) -> None:
    out = out or console()
    out.print(Text(f"cluster: {r.nodes} nodes, {r.gpus} GPUs, {r.pending} pending pod(s)", style="bold"))
    if r.top_reasons:
        t = Table("why pods wait", "pods", title="Top reasons")
        for reason, n in r.top_reasons:
            t.add_row(reason, str(n))
        out.print(t)
    if r.stranded_by_model:
        t = Table("model", "GPUs", "free GPUs", "stranded GPUs", title="Stranded capacity by model")
        for m, v in sorted(r.stranded_by_model.items()):
            stranded = v["stranded_milli"] / 1000
            t.add_row(m, f"{v['gpus']:g}", f"{v['free_milli'] / 1000:g}",
                      Text(f"{stranded:.2f}", style="yellow" if stranded >= 1 else ""))  # fmt: skip
        out.print(t)
    if r.queues:
        t = Table("queue", "used / quota", "borrowed", "admitted", "pending", title="Tenant queues")
        for q in r.queues:
            used = ", ".join(f"{k} {q['usage'].get(k, 0)}/{v}" for k, v in q["quota"].items())
            borrowed = ", ".join(f"{k} {v}" for k, v in q["borrowed"].items()) or "-"
            shown = Text(q["invalid"], style="bold red") if q["invalid"] else Text(used)
            waiting = Text(str(q["pending"]), style="yellow" if q["pending"] else "")
            t.add_row(q["queue"], shown, borrowed, str(q["admitted"]), waiting)
        out.print(t)
    drift = [f for f in r.findings if f.code.startswith("drift")]
    out.print(Text(f"Drift: {len(drift)} pod(s)", style="bold red" if drift else "bold green"))
    _findings(out, _grouped(r.findings))


def _grouped(findings: Sequence[Finding], shown: int = 3) -> list[Finding]:
    """At most ``shown`` findings of one code, then one line counting the rest."""
    out: list[Finding] = []
    by_code: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        by_code.setdefault((f.level, f.code), []).append(f)
    for fs in by_code.values():
        out += fs[:shown]
        if len(fs) > shown:
            rest = fs[shown:]
            names = ", ".join(f.subject for f in rest[:5]) + (", ..." if len(rest) > 5 else "")
            f0 = fs[0]
            more = f"and {len(rest)} more like it: {names}"
            out.append(Finding(f0.level, f0.severity, f0.code, more, {}, ""))
    return out


def bench(result: Mapping[str, Any]) -> None:
    t = Table(
        "step", "seconds", "CPU s", title=f"doctor pod at {result['nodes']} nodes ({result['pods']} pods)"
    )
    for k, v in result["seconds"].items():
        cpu = result.get("cpu_seconds", {}).get(k)
        t.add_row(k, f"{v:.3f}", "" if cpu is None else f"{cpu:.3f}")
    console().print(t)
    console().print(f"counterfactual: {result['counterfactual']}")


def bench_queues(result: Mapping[str, Any]) -> None:
    t = Table(
        "step", "no Queues (CPU s)", "Queues (CPU s)", "ratio",
        title=f"doctor at {result['nodes']} nodes ({result['pods']} pods), without and with tenant queues",
    )  # fmt: skip
    cpu = result["cpu_seconds"]
    for k, r in result["ratio"].items():
        t.add_row(k, f"{cpu['none'][k]:.3f}", f"{cpu['queues'][k]:.3f}", f"{r:.2f}")
    console().print(t)
    console().print(f"counterfactual with queues: {result['counterfactual']}")


def wrote(path: Path, nodes: int, pods: int) -> None:
    console().print(f"wrote {path}: {nodes} nodes, {pods} pods")
