"""The chaos scenarios, each a bounded run that stops by itself, for either front end.

Every scenario: the front end starts and syncs, pods arrive at a steady rate in a thread while the fault
happens, the faults stop, the backlog drains (bounded), and ``Run.check`` reads everything back from the API
and asserts that no GPU is booked twice and that every pod that fits is bound.
"""

from __future__ import annotations

import time
from pathlib import Path

from chaoslib import Run
from faultproxy import Fault, FaultProxy, Rule, binding_rule

READY_S = 90.0


def apiserver_killed(run: Run, kills: tuple[float, ...] = (0.25, 0.5, 0.75), burst: int = 30) -> None:
    """kube-apiserver SIGKILLed while pods arrive, down 0.5–2.5 s, then restarted with the same flags,
    port and etcd data. Each kill lands 50–300 ms after a burst of ``burst`` GPU shares was created, while
    the front end has many bindings in flight: some fail after the API committed them, some before."""
    run.front.start(wait_ready=READY_S)
    creator = run.start_creating()
    for k, at in enumerate(kills):
        run.wait_created(at)
        run.burst(burst, f"b{k}")
        time.sleep(run.rng.uniform(0.05, 0.3))
        down = run.rng.uniform(0.5, 2.5)
        run.note(f"kill -9 kube-apiserver (down {down:.1f}s) with {run.created} pods created")
        run.cp.restart_apiserver(down_s=down)
        run.note("kube-apiserver ready again")
    run.extra["apiserver_kills"] = len(kills)
    run.join(creator)
    run.finish()
    run.check()


def front_end_killed(
    run: Run,
    workdir: Path,
    delay_s: tuple[float, float],
    kills: tuple[float, ...] = (0.25, 0.5, 0.75),
    list_delay_s: float = 2.0,
) -> None:
    """The front end SIGKILLed while pods arrive, and started again ``delay_s`` (a seeded uniform range)
    later, while kube-scheduler (extender) and the pods' arrival keep going. It reaches the apiserver
    through ``FaultProxy``, which holds each list of all pods ``list_delay_s`` seconds (as a list of
    thousands of pods takes): a restarted front end knows the nodes well before the pods that hold their
    GPUs, and must not decide or answer from those empty books."""
    rules = [Rule(Fault.DELAY, "GET", r"/api/v1/pods", watch=False, every=1, delay_s=list_delay_s)]
    proxy = FaultProxy.for_control_plane(run.cp, workdir, rules=rules).start()
    try:
        run.front.kubeconfig = proxy.write_kubeconfig(workdir / f"proxy-{run.tag}.kubeconfig")
        run.front.start(wait_ready=READY_S)
        creator = run.start_creating()
        for at in kills:
            run.wait_created(at)
            run.front.wait_serving()  # each kill hits a process that serves (books synced or not)
            time.sleep(run.rng.uniform(0.1, 1.0))
            run.front.kill()
            delay = run.rng.uniform(*delay_s)
            run.note(f"SIGKILL {run.front.kind} with {run.created} pods created; restart in {delay:.1f}s")
            time.sleep(delay)
            run.front.start()
        run.join(creator)
        run.extra.update(proxy.stats())
        run.finish()
    finally:
        run.front.stop()  # before the proxy it talks through
        proxy.stop()
    run.check()


def pods_deleted(run: Run) -> None:
    """Bound pods deleted at random (grace 0) while pods arrive: their GPUs free up and are reused."""
    run.front.start(wait_ready=READY_S)
    creator = run.start_creating()
    deleter = run.start_deleting(until=creator)
    run.join(creator)
    run.join(deleter)
    run.finish()
    run.check()


def ambiguous_binding(run: Run, workdir: Path, after: float = 0.1, before: float = 0.05) -> None:
    """The front end reaches the apiserver through ``FaultProxy``: a seeded ``after`` share of the binding
    calls is forwarded and committed, then the front end's connection is dropped without the answer; a
    ``before`` share is dropped without being forwarded. Each fault first breaks the front end's watch
    streams, as a broken connection to the apiserver does, so it learns what the binding did only when it
    re-watches (about a second later): until then its books must not give the GPUs away. The faults stop
    when every pod is created."""
    rules = [
        binding_rule(Fault.AFTER, probability=after, seed=run.seed, sever_watches=True),
        binding_rule(Fault.BEFORE, probability=before, seed=run.seed + 100_000, sever_watches=True),
    ]
    proxy = FaultProxy.for_control_plane(run.cp, workdir, rules=rules).start()
    try:
        run.front.kubeconfig = proxy.write_kubeconfig(workdir / f"proxy-{run.tag}.kubeconfig")
        run.front.start(wait_ready=READY_S)
        creator = run.start_creating()
        run.join(creator)
        proxy.enabled = False
        stats = proxy.stats()
        run.note(f"faults off: {stats}")
        run.extra.update(stats)
        run.extra["faulted_pods_after"] = sorted({f.pod for f in proxy.faulted(Fault.AFTER)})[:20]
        run.finish()
    finally:
        run.front.stop()  # before the proxy it talks through
        proxy.stop()
    run.check()
