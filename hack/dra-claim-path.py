"""The standalone scheduler's claim path in process, without the API (docs/dra-bench.md, "The claim path,
faster"): the bench's 4 kwok nodes of 8 A100s as ResourceSlices in ``DraBooks``, each pod's claim resolved
and decided by ``schedule_one`` (DynamicResources Filter, Prefer and Reserve into the books' ledger).

    PYTHONPATH=<tree>/src python hack/dra-claim-path.py

prints, per stream (the bench's mig-heavy and mixed at seeds 0-2, and its throughput backlog of 160
1g.5gb pods), the pods placed, a digest of every decision (node and devices, or the refusal's message)
and the seconds. Run it on two trees: equal digests mean the same decisions.
"""

from __future__ import annotations

import hashlib
import time

from gpusched.bench import dra_shape as shape
from gpusched.core.cluster import ClusterState
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.k8s.dra.books import DraBooks
from gpusched.k8s.dra.podclaims import Ready, resolve

NODES = 4


def decide(asks: list[shape.Ask]) -> tuple[list[tuple[str, object]], float]:
    books = DraBooks(CelCompiler())
    classes = shape.Classes.for_tag("t")
    for obj in classes.objects():
        books.upsert_class(obj)
    names = [f"n{i}" for i in range(NODES)]
    for n in names:
        for obj in shape.node_slices(n):
            books.upsert_slice(obj)
    snap = ClusterState([NodeSpec(n, 128000, 1 << 20, labels={shape.LABEL: "t"}) for n in names])
    profile = make_profile("bestfit")
    out: list[tuple[str, object]] = []
    t0 = time.perf_counter()
    for i, ask in enumerate(asks):
        claim = classes.claim(f"c{i}", ask)
        claim["metadata"].update(namespace="ns", uid=f"u{i}")
        books.upsert_claim(claim)
        pod = shape.claim_pod(f"p{i}", f"c{i}", "t", "gpusched")
        pod["metadata"].update(namespace="ns", uid=f"pu{i}")
        r = resolve(pod, books)
        assert isinstance(r, Ready), r
        res = schedule_one(profile, PodSpec(f"p{i}", cpu_milli=100, namespace="ns", claims=r.claims), snap)
        if res.scheduled:
            (reservation,) = [v for k, v in books._reserved.items() if k == f"ns/p{i}"]
            out.append((str(res.node_name), [d.device for a in reservation.allocations for d in a.results]))
        else:
            out.append(("refused", res.status.message()))
    return out, time.perf_counter() - t0


def main() -> None:
    streams = [(f"{m}/{s}", shape.stream(m, 8 * NODES, s)) for m in ("mig-heavy", "mixed") for s in (0, 1, 2)]
    streams.append(("throughput", shape.throughput_stream(8 * NODES, 5)))
    for name, asks in streams:
        out, seconds = decide(asks)
        placed = sum(1 for node, _ in out if node != "refused")
        digest = hashlib.sha1(repr(out).encode()).hexdigest()[:10]
        print(f"{name:12} {placed:3}/{len(out)} placed  digest {digest}  {seconds:.2f} s")


if __name__ == "__main__":
    main()
