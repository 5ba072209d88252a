"""``doctor pod``, ``doctor node``, ``doctor cluster`` and the GPU map's data, on ``Books``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from gpusched.core.fragmentation import node_fragmentation
from gpusched.core.model import GPU_MILLI, PodSpec
from gpusched.core.scheduler import feasible
from gpusched.core.status import Code, Diagnosis, NodeFailure
from gpusched.doctor.books import Books
from gpusched.doctor.checks import drift_findings
from gpusched.doctor.counterfactual import counterfactuals
from gpusched.doctor.errors import UnknownObject
from gpusched.doctor.findings import ClusterReport, Finding, NodeReport, PodReport
from gpusched.doctor.mig import mig_findings, mig_map
from gpusched.doctor.queues import (
    Admission,
    admission,
    queue_finding,
    queue_rows,
    quota_counterfactual,
    reclaim_plan,
)
from gpusched.doctor.rooms import room_findings

_NODE_SHOWN = 8
"""Nodes whose own findings a pending pod's report shows (those with errors or warnings)."""


def _close(name: str, names: list[str]) -> str:
    import difflib

    near = difflib.get_close_matches(name, names, n=3)
    return f"; did you mean {', '.join(near)}?" if near else ""


def diagnosis(books: Books, pod: PodSpec) -> Diagnosis:
    """Per-node reasons (the first failing filter of each node), as the scheduler's cycle gives them."""
    return feasible(books.profile, pod, books.state, explain=True).diagnosis(books.state)


def _resolvable_gpu(f: NodeFailure) -> bool:
    """The node turned the pod away for want of free GPUs (not its model, count or memory size)."""
    return f.plugin == "GPUFit" and f.code == Code.UNSCHEDULABLE


def _scheduling_causes(books: Books, pod: PodSpec, diag: Diagnosis, healed: set[str]) -> list[Finding]:
    """``healed``: the nodes where the pod would fit were their failed GPUs healthy."""
    snap, key = books.state, pod.key
    out: list[Finding] = []
    counts = dict(diag.reason_counts())
    if diag.pre_filter is not None and not diag.pre_filter.ok:
        out.append(
            Finding(
                "scheduling", "error", "pre-filter", diag.message(), {"plugin": diag.pre_filter.plugin}, key
            )
        )
        return out
    sev = "error" if diag.failures else "ok"
    out.append(
        Finding(
            "scheduling",
            sev,
            "unschedulable" if diag.failures else "fits",
            diag.message() if diag.failures else f"fits on {len(snap) - len(diag.failures)} node(s)",
            {"reasons": counts, "nodes": len(snap)},
            key,
        )
    )
    gpu_nodes = [nd for nd in snap.nodes if nd.gpu_count]
    if pod.num_gpu and pod.gpu_models and not set(pod.gpu_models) & set(snap.models):
        out.append(
            Finding(
                "scheduling",
                "error",
                "no-such-model",
                f"no node has this GPU model: the pod asks for {'|'.join(sorted(pod.gpu_models))}, "
                f"the cluster has {', '.join(snap.models) or 'no GPUs'}",
                {"asked": sorted(pod.gpu_models), "cluster": list(snap.models)},
                key,
            )
        )
    qualifying = [nd for nd in gpu_nodes if not pod.gpu_models or nd.gpu_model in pod.gpu_models]
    if pod.num_gpu and pod.gpu_memory_mib and qualifying:
        most = max(nd.gpu_memory_mib for nd in qualifying)
        if most < pod.gpu_memory_mib:
            out.append(
                Finding(
                    "scheduling",
                    "error",
                    "gpu-memory-too-large",
                    f"the pod asks {pod.gpu_memory_mib} MiB of GPU memory per GPU; the largest GPU "
                    f"{'of its models ' if pod.gpu_models else ''}has {most} MiB",
                    {"asked_mib": pod.gpu_memory_mib, "largest_mib": most},
                    key,
                )
            )
    if pod.is_whole and gpu_nodes and pod.num_gpu > max(nd.gpu_count for nd in gpu_nodes):
        out.append(
            Finding(
                "scheduling",
                "error",
                "gpu-count-too-large",
                f"the pod asks {pod.num_gpu} GPUs; no node has more than "
                f"{max(nd.gpu_count for nd in gpu_nodes)}",
                {"asked": pod.num_gpu},
                key,
            )
        )
    taints = Counter(r for r in counts if r.startswith("node(s) had untolerated taint"))
    if taints:
        out.append(
            Finding(
                "scheduling",
                "error",
                "untolerated-taint",
                f"{sum(counts[r] for r in taints)} node(s) have taints the pod does not tolerate",
                {r: counts[r] for r in taints},
                key,
            )
        )
    failed = {f.node: f for f in diag.failures}
    sick = [
        nd
        for nd in snap.nodes
        if nd.unhealthy_gpus and nd.name in failed and _resolvable_gpu(failed[nd.name])
    ]
    if sick:
        blocking = [nd for nd in sick if nd.name in healed]
        shown = blocking or sick
        names = ", ".join(f"{nd.name} GPU {sorted(nd.unhealthy_gpus)}" for nd in shown[:4])
        msg = (
            f"{len(blocking)} node(s) would take the pod but for failed GPUs: {names}"
            if blocking
            else f"{len(sick)} node(s) have failed GPUs ({names}); the pod would not fit there even healthy"
        )
        ev = {nd.name: sorted(nd.unhealthy_gpus) for nd in shown}
        out.append(Finding("scheduling", "error" if blocking else "info", "unhealthy-gpu", msg, ev, key))
    if diag.failures and any(_resolvable_gpu(f) for f in diag.failures):
        near = [snap.index[f.node] for f in diag.failures if _resolvable_gpu(f)]  # only GPUs it could use
        free = sum(
            int(
                snap.gpu_free[i, : int(snap.gpu_count[i])][snap.gpu_exists[i, : int(snap.gpu_count[i])]].sum()
            )
            for i in near
        )
        if pod.num_gpu and free >= pod.gpu_demand_milli:
            out.append(
                Finding(
                    "scheduling",
                    "warn",
                    "fragmented",
                    f"{free / GPU_MILLI:g} GPUs are free on the nodes it could use, but in pieces "
                    f"none can give the pod ({pod.num_gpu} × {pod.gpu_milli} milli)",
                    {"free_milli": free},
                    key,
                )
            )
    unreadable = books.snapshot.queues_unreadable
    if pod.queue and books.queues is None:
        msg = (
            f"queue {pod.queue}: the API refused doctor the Queues ({unreadable}); its quota is not checked"
            if unreadable
            else f"queue {pod.queue}: the cluster does not serve Queues (queues.gpusched.io); the "
            "scheduler ignores the pod's queue and nothing waits for quota"
        )
        out.append(
            Finding("scheduling", "warn" if unreadable else "info", "queue", msg, {"queue": pod.queue}, key)
        )
    return out


def _fitting(books: Books, diag: Diagnosis) -> list[int]:
    """The nodes that pass every filter: those the diagnosis does not name (none after a
    PreFilter failure)."""
    if diag.pre_filter is not None and not diag.pre_filter.ok:
        return []
    failed = {f.node for f in diag.failures}
    return [i for i, name in enumerate(books.state.names) if name not in failed]


def _admission(books: Books, pod: PodSpec, diag: Diagnosis) -> Admission | None:
    """The pod's queue's answer, as the scheduler asks it (None: no queues, or under none)."""
    if books.queues is None:
        return None
    nodes = books.state.nodes
    return admission(books.queues, pod, lambda: sorted({nodes[i].gpu_model for i in _fitting(books, diag)}))


def doctor_pod(books: Books, key: str) -> PodReport:
    """Node, device plugin and scheduling findings for pod ``key`` (``NS/NAME``), and for a
    pending pod the counterfactuals. Raises UnknownObject for a pod the snapshot lacks."""
    if "/" not in key:
        key = f"default/{key}"
    obj = books.pod_objs.get(key)
    if obj is None:
        raise UnknownObject(
            f"pod {key} not found in {books.snapshot.source}" + _close(key, list(books.pod_objs))
        )
    why = books.invalid.get(f"pod/{key}")
    node = str((obj.get("spec") or {}).get("nodeName") or "")
    phase = str((obj.get("status") or {}).get("phase") or "")
    findings: list[Finding] = []
    if why:
        findings.append(Finding("scheduling", "error", "invalid-request", why, {}, key))
        return PodReport(key, phase, node, tuple(findings), summary=why)
    if node:
        nobj = books.node_objs.get(node)
        if nobj is None:
            findings.append(
                Finding(
                    "node",
                    "error",
                    "node-missing",
                    f"pod {key} is bound to node {node}, which the API does not have",
                    {},
                    node,
                )
            )
        else:
            findings += books.node_findings(node)
        findings += drift_findings(obj, nobj)
        a = books.state.allocations.get(key)
        if a is not None:
            bad = sorted(set(a.gpus) & set(books.state.nodes[a.node].unhealthy_gpus))
            if bad:
                findings.append(
                    Finding(
                        "device",
                        "error",
                        "on-unhealthy-gpu",
                        f"pod {key} runs on failed GPU(s) {bad} of {node}",
                        {"gpus": list(a.gpus)},
                        key,
                    )
                )
            findings.append(
                Finding(
                    "scheduling",
                    "ok",
                    "bound",
                    f"bound to {node}, GPU(s) {list(a.gpus)}",
                    {"gpus": list(a.gpus)},
                    key,
                )
            )
        conflicts = [c for c in books.conflicts if c.startswith(f"{key}:")]
        for c in conflicts:
            findings.append(Finding("device", "error", "drift-overcommit", f"drift: {c}", {}, key))
        summary = "; ".join(f.message for f in findings if f.severity == "error") or f"running on {node}"
        return PodReport(key, phase, node, tuple(_ordered(findings)), summary=summary)
    pod = books.pending.get(key)
    if pod is None:
        return PodReport(
            key, phase, node, (), summary=f"pod {key} is {phase or 'not pending'}; nothing to diagnose"
        )
    wait = books.claim_waits.get(key)
    if wait is not None:  # its claims are not ready to allocate: the scheduler does not decide it yet
        msg = f"pod {key} waits for its ResourceClaims: {wait}"
        findings.append(Finding("scheduling", "error", "claims-waiting", msg, {}, key))
        return PodReport(key, phase, node, tuple(findings), summary=msg)
    diag = diagnosis(books, pod)
    quota = None
    adm = _admission(books, pod, diag)
    if adm is not None:
        assert books.queues is not None
        plan = reclaim_plan(books.queues, adm, pod, books.profile, books.state)
        findings.append(queue_finding(books.queues, adm, key, plan, pod.gang))
        if not adm.ok:
            fits = _fitting(books, diag)
            node_ = books.state.names[fits[0]] if fits else ""
            quota = quota_counterfactual(books.queues, adm, pod, node_)
    cfs = counterfactuals(books.profile, pod, books.state, diag, quota)
    healed = {n for c in cfs if c.kind == "healthy-gpu" for n in c.change.get("fits_on", [c.node])}
    findings += _scheduling_causes(books, pod, diag, healed)
    findings += mig_findings(books.profile, pod, books.state)
    findings += room_findings(books, pod)  # defragmentation rooms held against it, or its own
    failed = {f.node: f for f in diag.failures}
    shown = 0
    for name in books.state.names:
        if shown >= _NODE_SHOWN or name not in failed:
            continue
        if not _resolvable_gpu(failed[name]) or (
            books.state.nodes[books.state.index[name]].unhealthy_gpus and name not in healed
        ):
            continue
        trouble = [f for f in books.node_findings(name) if f.severity in ("warn", "error")]
        if trouble:
            findings += trouble
            shown += 1
    causes = [f.message for f in findings if f.severity == "error" and f.level == "scheduling"]
    return PodReport(
        key,
        phase,
        node,
        tuple(_ordered(findings)),
        tuple(cfs),
        summary=causes[0] if causes else "",
        reasons=dict(diag.reason_counts()),
    )


def _ordered(fs: list[Finding]) -> list[Finding]:
    levels = {"node": 0, "device": 1, "scheduling": 2, "counterfactual": 3}
    return sorted(fs, key=lambda f: levels[f.level])


def node_gpus(books: Books, name: str) -> list[dict[str, Any]]:
    """Per GPU of node ``name``: free milli and memory, health, the pods holding it."""
    snap = books.state
    i = snap.index.get(name)
    if i is None:
        return []
    holders: dict[int, list[dict[str, Any]]] = {}
    for key in sorted(snap.node_pods[i]):
        a = snap.allocations[key]
        for g in a.gpus:
            holders.setdefault(g, []).append(
                {
                    "pod": key,
                    "milli": a.pod.gpu_milli,
                    "memory_mib": a.pod.gpu_memory_booked(snap.nodes[i].gpu_memory_mib),
                }
            )
    nd = snap.nodes[i]
    return [
        {
            "index": g,
            "free_milli": int(snap.gpu_free[i, g]),
            "free_memory_mib": int(snap.gpu_mem_free[i, g]),
            "memory_mib": nd.gpu_memory_mib,
            "healthy": g not in nd.unhealthy_gpus,
            "pods": holders.get(g, []),
        }
        for g in range(nd.gpu_count)
    ]


def doctor_node(books: Books, name: str) -> NodeReport:
    obj = books.node_objs.get(name)
    if obj is None:
        raise UnknownObject(
            f"node {name} not found in {books.snapshot.source}" + _close(name, list(books.node_objs))
        )
    findings = list(books.node_findings(name))
    for p in books.pod_objs.values():
        if (p.get("spec") or {}).get("nodeName") == name:
            findings += [f for f in drift_findings(p, obj) if f.severity != "ok"]
    findings += [
        Finding("device", "error", "drift-overcommit", f"drift: {c}", {}, name)
        for c in books.conflicts
        if (a := books.state.allocations.get(c.split(":", 1)[0])) and books.state.names[a.node] == name
    ]
    i = books.state.index.get(name)
    mig = tuple(mig_map(books.state, i)) if i is not None else ()
    return NodeReport(name, tuple(_ordered(findings)), tuple(node_gpus(books, name)), mig)


def _pending_summary(books: Books) -> list[dict[str, Any]]:
    out = []
    for key, pod in sorted(books.pending.items()):
        diag = diagnosis(books, pod)
        reasons = dict(diag.reason_counts())
        message = diag.message()
        adm = _admission(books, pod, diag)
        if adm is not None and not adm.ok:  # quota is asked first: it leads
            why = f"queue {adm.queue} is unusable" if adm.problem else f"waits for quota in queue {adm.queue}"
            reasons = {why: 1, **reasons}
            message = f"{why}: {adm.problem or (adm.verdict.reason if adm.verdict else '')}; {message}"
        out.append(
            {
                "pod": key,
                "message": message,
                "reasons": reasons,
                "gpus": pod.num_gpu,
                "gpu_milli": pod.gpu_milli,
                "gpu_memory_mib": pod.gpu_memory_mib,
            }
        )
    return out


def stranded_by_model(books: Books) -> dict[str, dict[str, float]]:
    """Per model: GPUs, free milli, and the stranded part of it (free milli the target workload
    cannot use, by the FGD fragmentation measure)."""
    snap = books.state
    frag = node_fragmentation(snap, books.workload) if len(snap) else np.zeros(0)
    out: dict[str, dict[str, float]] = {}
    for i, nd in enumerate(snap.nodes):
        if not nd.gpu_count:
            continue
        row = out.setdefault(nd.gpu_model, {"gpus": 0, "free_milli": 0, "stranded_milli": 0.0})
        row["gpus"] += nd.gpu_count
        row["free_milli"] += int(snap.gpu_free[i, : nd.gpu_count].sum())
        row["stranded_milli"] += round(float(frag[i]), 1)
    return out


def doctor_cluster(books: Books) -> ClusterReport:
    snap = books.state
    pending = _pending_summary(books)
    reasons: Counter[str] = Counter()
    for p in pending:
        reasons.update(set(p["reasons"]))
    findings: list[Finding] = []
    for name in snap.names:
        findings += [f for f in books.node_findings(name) if f.severity in ("warn", "error")]
    for key, pobj in sorted(books.pod_objs.items()):
        node = (pobj.get("spec") or {}).get("nodeName")
        if node:
            a = snap.allocations.get(key)
            drift = drift_findings(pobj, books.node_objs.get(node), a.pod if a is not None else None)
            findings += [f for f in drift if f.severity == "error"]
    findings += [
        Finding("device", "error", "drift-overcommit", f"drift: {c}", {}, c.split(":", 1)[0])
        for c in books.conflicts
    ]
    findings += [
        Finding("scheduling", "error", "unreadable", why, {}, what)
        for what, why in sorted(books.invalid.items())
    ]
    if books.snapshot.queues_unreadable:
        why = f"the API refused doctor the Queues ({books.snapshot.queues_unreadable}): quotas not checked"
        findings.append(Finding("scheduling", "warn", "queues-unreadable", why, {}, "queues"))
    if books.queues is not None:  # the scheduler makes the pods of an invalid Queue wait
        findings += [
            Finding("scheduling", "error", "queue-invalid", why, {"queue": q}, q)
            for q, why in sorted(books.queues.directory.invalid.items())
        ]
    return ClusterReport(
        len(snap),
        int(snap.gpu_count.sum()),
        len(pending),
        tuple(reasons.most_common(10)),
        stranded_by_model(books),
        tuple(_ordered(findings)),
        tuple(pending),
        tuple(queue_rows(books.queues)) if books.queues is not None else (),
    )


def gpu_map(books: Books) -> dict[str, Any]:
    """The GPU map's data: every node's GPUs and who holds them, stranded capacity, pending pods."""
    snap = books.state
    frag = node_fragmentation(snap, books.workload) if len(snap) else np.zeros(0)
    nodes = []
    for i, nd in enumerate(snap.nodes):
        sev = Counter(f.severity for f in books.node_findings(nd.name))
        nodes.append(
            {
                "name": nd.name,
                "model": nd.gpu_model,
                "gpu_memory_mib": nd.gpu_memory_mib,
                "gpus": node_gpus(books, nd.name),
                "mig": mig_map(snap, i),
                "stranded_milli": round(float(frag[i]), 1) if nd.gpu_count else 0.0,
                "taints": [f"{t.key}={t.value}:{t.effect}" for t in nd.taints],
                "errors": sev.get("error", 0),
                "warnings": sev.get("warn", 0),
            }
        )
    report = doctor_cluster(books)
    return {
        "source": books.snapshot.source,
        "nodes": nodes,
        "pending": list(report.pending_pods),
        "stranded_by_model": report.stranded_by_model,
        "top_reasons": [list(r) for r in report.top_reasons],
        "findings": [f.to_dict() for f in report.findings if f.severity == "error"],
    }


def holders(books: Books) -> Mapping[str, str]:
    return {k: books.state.names[a.node] for k, a in books.state.allocations.items()}
