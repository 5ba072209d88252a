"""kube-scheduler's structured allocation for one node: the first full solution in device order.

Claims are taken in the order given, each claim's requests in order, and each wanted device is
searched depth first with backtracking across devices, ``firstAvailable`` alternatives, requests and
claims. Pools are visited by (driver, pool) name, devices in their slice's order, as upstream does
(k8s.io/dynamic-resource-allocation/structured). With ``FIRST_FIT`` (the default) the first solution
wins, as in kube-scheduler. With a larger ``SearchBudget`` (the scheduler's ``SCORED``) the search goes
on after the first solution, up to the budget's solutions and device tries, and keeps the solution with
the least ``score.Score`` (ties keep the earlier one); only solutions with the first solution's
``firstAvailable`` alternatives are ranked (the claim's order of preference is kept). Whether the
claims fit, and every error raised before the first solution, is the same either way: the first
solution is found exactly as before, and an error met after it only ends the enumeration.

Outcomes: ``Fits`` with one ``ClaimAllocation`` per claim, ``DoesNotFit`` with a reason, or a
``DraError`` for input that can never be allocated as written (unknown class, bad CEL, ``All`` over a
pool being updated).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpusched.core.dra.constraints import ConstraintBook
from gpusched.core.dra.memo import AllocatorMemo
from gpusched.core.dra.model import (
    AllocatedState,
    AllocationMode,
    Claim,
    ClaimAllocation,
    DeviceClass,
    DeviceId,
    DeviceResult,
    ExactRequest,
    Node,
    Request,
    ResourceSlice,
    TaintEffect,
)
from gpusched.core.dra.pools import Candidate, Pool
from gpusched.core.dra.score import FIRST_FIT, Score, Scorer, SearchBudget, Usage
from gpusched.core.dra.selector import (
    CompiledSelector,
    DraError,
    SelectorCompiler,
    SelectorError,
)


@dataclass(frozen=True)
class Fits:
    allocations: tuple[ClaimAllocation, ...]
    score: Score | None = None  # the chosen solution's score (None: first-fit, not scored)


@dataclass(frozen=True)
class DoesNotFit:
    reason: str


Outcome = Fits | DoesNotFit


@dataclass(frozen=True)
class _Choice:
    """One alternative for a request: the exact request, its result name, its static candidates.

    For ``All`` the candidates are the devices its selectors match (evaluated up front, as upstream
    gathers them). For ``ExactCount`` they are not filtered by selectors: ``lazy`` holds them, and the
    search evaluates them only on devices not in use, when it reaches them (upstream's order: "checking
    for in use is cheap and thus gets done first"), so a selector that fails on a device the search
    never tries is no error, as in kube-scheduler."""

    exact: ExactRequest
    result_name: str
    candidates: tuple[Candidate, ...]
    lazy: tuple[CompiledSelector, ...] = ()
    where: str = ""


class Allocator:
    """Allocates claims on one node against the cluster's classes and slices and what is allocated."""

    def __init__(
        self,
        classes: Mapping[str, DeviceClass],
        slices: Sequence[ResourceSlice],
        compiler: SelectorCompiler,
        allocated: AllocatedState | None = None,
        budget: SearchBudget = FIRST_FIT,
        memo: AllocatorMemo | None = None,
    ) -> None:
        self._classes = classes
        self._slices = tuple(slices)
        self._compiler = compiler
        self._allocated = allocated or AllocatedState()
        self._budget = budget
        self._memo = memo or AllocatorMemo()
        """Pools and selector results kept across calls (an inventory's; a fresh one by default)."""

    def allocate(self, node: Node, claims: Sequence[Claim]) -> Outcome:
        pools = self._memo.pools(self._slices, node)
        search = _Search(pools, self._allocated, self._budget, self._memo)
        plans = [[self._choices(c, r, pools) for r in c.requests] for c in claims]
        for claim, plan in zip(claims, plans, strict=True):
            _check_claim_limit(claim, plan)
        if not claims:
            return Fits(())
        if search.run(claims, plans):
            return Fits(search.allocations(claims, node), search.best_score)
        invalid = [f"{p.driver}/{p.name} ({p.invalid})" for p in pools if p.invalid is not None]
        if invalid:
            raise DraError("invalid resource pools were encountered: " + ", ".join(invalid))
        notes = [n for p in pools for n in p.notes()]
        reason = _reason(node, claims, plans, self._memo)
        return DoesNotFit(reason + "; " + "; ".join(notes) if notes else reason)

    def _choices(self, claim: Claim, request: Request, pools: list[Pool]) -> list[_Choice]:
        if request.exactly is not None:
            return [self._choice(claim, request.exactly, request.name, pools)]
        if not request.first_available:
            raise DraError(f"claim {claim.name}, request {request.name}: neither exactly nor firstAvailable")
        return [
            self._choice(claim, sub, f"{request.name}/{sub.name}", pools)
            for sub in request.first_available
            if sub.mode is AllocationMode.ALL or sub.count <= MAX_RESULTS  # a larger one can never fit
        ]

    def _choice(self, claim: Claim, exact: ExactRequest, name: str, pools: list[Pool]) -> _Choice:
        where = f"claim {claim.name}, request {name}"
        if not exact.class_name:
            raise DraError(f"{where}: missing device class name")
        dclass = self._classes.get(exact.class_name)
        if dclass is None:
            raise DraError(f"{where}: unknown device class {exact.class_name}")
        selectors = [self._compile(where, e) for e in (*dclass.selectors, *exact.selectors)]
        out = []
        eager = exact.mode is AllocationMode.ALL
        for pool in pools:
            if pool.invalid is not None:
                continue  # reported if nothing fits (``allocate``)
            for cand in pool.devices:
                consumed = self._allocated.consumed
                held = (
                    consumed.get(DeviceId(cand.driver, cand.pool, cand.device.name), {}) if consumed else {}
                )
                if (eager and not _selected(where, selectors, cand, self._memo)) or not _capacity_fits(
                    exact, cand, held, self._memo
                ):
                    continue  # (taints are checked when a device is taken: "All" fails on one)
                if pool.incomplete:
                    if exact.mode is AllocationMode.ALL:
                        raise DraError(
                            f"{where}: asks for all devices, but resource pool {pool.driver}/{pool.name}"
                            " is currently being updated"
                        )
                    continue  # an incomplete pool is not used until all its slices are seen
                out.append(cand)
        return _Choice(exact, name, tuple(out), () if eager else tuple(selectors), where)

    def _compile(self, where: str, expression: str) -> CompiledSelector:
        try:
            return self._compiler.compile(expression)
        except SelectorError as e:
            raise DraError(f"{where}: selector {expression!r}: {e}") from None


def _selected(
    where: str, selectors: Sequence[CompiledSelector], cand: Candidate, memo: AllocatorMemo
) -> bool:
    for sel in selectors:
        try:
            if not memo.matches(sel, cand.driver, cand.device):
                return False
        except SelectorError as e:
            raise DraError(
                f"{where}: selector {sel.expression!r} on device {cand.driver}/{cand.pool}/"
                f"{cand.device.name}: {e}"
            ) from None
    return True


def _any_match(choice: _Choice, memo: AllocatorMemo) -> bool:
    """Whether any candidate matches the choice's selectors (one that fails to evaluate does not)."""
    for cand in choice.candidates:
        try:
            if _selected(choice.where, choice.lazy, cand, memo):
                return True
        except DraError:
            continue
    return False


def _reason(
    node: Node, claims: Sequence[Claim], plans: list[list[list[_Choice]]], memo: AllocatorMemo
) -> str:
    """Why nothing fits: the first request without a single matching device, else the claims together."""
    for claim, plan in zip(claims, plans, strict=True):
        for request, choices in zip(claim.requests, plan, strict=True):
            if not any(_any_match(c, memo) for c in choices):
                classes = sorted({c.exact.class_name for c in choices})
                return (
                    f"claim {claim.name}, request {request.name}: no device on node {node.name} matches"
                    f" class {', '.join(classes)} and the request's selectors and capacity"
                )
    names = ", ".join(c.name for c in claims)
    return (
        f"claims {names}: devices match every request on node {node.name}, but not together (held by"
        " other claims, tainted, over counters or capacity, or against a constraint or the claim limit)"
    )


MAX_RESULTS = 32  # resource.k8s.io/v1 AllocationResultsMaxSize: devices per claim


def _least(choices: list[_Choice]) -> int:
    """The fewest devices any alternative of a request takes (0 when one is "All" or none is left)."""
    counts = [c.exact.count for c in choices if c.exact.mode is AllocationMode.EXACT_COUNT]
    return min(counts) if counts and len(counts) == len(choices) else 0


def _check_claim_limit(claim: Claim, plan: list[list[_Choice]]) -> None:
    least = sum(_least(choices) for choices in plan)
    if least > MAX_RESULTS:
        raise DraError(
            f"claim {claim.name}: number of requested devices {least} exceeds the claim limit"
            f" of {MAX_RESULTS}"
        )


def _capacity_fits(
    exact: ExactRequest, cand: Candidate, held: Mapping[str, int], memo: AllocatorMemo
) -> bool:
    """Whether one allocation's consumption fits what other claims left of the device (a device that
    cannot is not a candidate at all, also not for "All")."""
    if not held and not exact.capacity_requests:
        return memo.fits_alone(cand.driver, cand.device)
    used = memo.consumption(cand.driver, cand.device, exact.capacity_requests)
    if not used:
        return used is not None
    limits = memo.limits(cand.driver, cand.device)
    return all(held.get(n, 0) + v <= limits[n] for n, v in used.items())


def _tolerated(exact: ExactRequest, cand: Candidate) -> bool:
    for taint in cand.device.taints:
        if taint.effect is TaintEffect.NONE:
            continue
        if not any(t.tolerates(taint) for t in exact.tolerations):
            return False
    return True


class _Stop(Exception):
    """The search budget is spent: keep the best solution found."""


class _Search:
    """The mutable state of one depth-first search (undone step by step when it backtracks)."""

    def __init__(
        self,
        pools: list[Pool],
        allocated: AllocatedState,
        budget: SearchBudget = FIRST_FIT,
        memo: AllocatorMemo | None = None,
    ) -> None:
        self.memo = memo or AllocatorMemo()
        self.pools = {(p.driver, p.name): p for p in pools}
        self.exclusive: set[DeviceId] = set(allocated.devices)
        self.consumed: dict[DeviceId, dict[str, int]] = {k: dict(v) for k, v in allocated.consumed.items()}
        self.shares: dict[DeviceId, int] = {k: 1 for k in allocated.consumed}
        self.counters: dict[tuple[str, str, str], dict[str, int]] = {}
        for p in pools:
            for c in p.every_device:
                did = DeviceId(c.driver, c.pool, c.device.name)
                if did in self.exclusive or did in self.consumed:
                    self._charge(c, +1)
        self.results: list[list[DeviceResult]] = []
        self.books: list[ConstraintBook] = []
        self.selected: dict[tuple[int, str, DeviceId], bool] = {}  # lazily evaluated selectors
        self.budget = budget
        self.usage = Usage(self.exclusive, self.consumed, self.shares, self.counters)
        self.scorer = Scorer(pools, self.usage) if budget.solutions > 1 else None
        self.found = 0
        self.tries_left = budget.tries
        self.best: list[list[DeviceResult]] = []
        self.best_score: Score | None = None
        self.alternatives: list[str] = []  # per flat request, the alternative being searched
        self.first: tuple[str, ...] | None = None  # the first solution's alternatives

    # -- counters -----------------------------------------------------------------------------
    def _charge(self, cand: Candidate, sign: int) -> None:
        for use in cand.device.consumes_counters:
            book = self.counters.setdefault((cand.driver, cand.pool, use.counter_set), {})
            for name, value in use.counters.items():
                book[name] = book.get(name, 0) + sign * value

    def _counters_fit(self, cand: Candidate) -> bool:
        pool = self.pools[(cand.driver, cand.pool)]
        for use in cand.device.consumes_counters:
            cset = pool.counter_sets.get(use.counter_set)
            if cset is None:
                return False
            book = self.counters.get((cand.driver, cand.pool, use.counter_set), {})
            for name, value in use.counters.items():
                if name not in cset.counters or book.get(name, 0) + value > cset.counters[name]:
                    return False
        return True

    def _matches(self, ci: int, choice: _Choice, cand: Candidate, did: DeviceId) -> bool:
        key = (ci, choice.result_name, did)
        hit = self.selected.get(key)
        if hit is None:
            hit = self.selected[key] = _selected(choice.where, choice.lazy, cand, self.memo)
        return hit

    # -- the search ---------------------------------------------------------------------------
    def run(self, claims: Sequence[Claim], plans: list[list[list[_Choice]]]) -> bool:
        self.flat = [(ci, ri) for ci, c in enumerate(claims) for ri in range(len(c.requests))]
        self.claims, self.plans = claims, plans
        self.results = [[] for _ in claims]
        self.books = [ConstraintBook(c) for c in claims]
        self.alternatives = [""] * len(self.flat)
        try:
            done = self._request(0)
        except _Stop:
            done = True
        except DraError:
            if not self.found:
                raise
            done = True  # met after the first solution (kube-scheduler would have stopped there)
        if self.scorer is None:
            return done
        self.results = self.best
        return self.found > 0

    def _solution(self) -> bool:
        """A full solution while scoring: keep it if it beats the best; True ends the search."""
        assert self.scorer is not None
        score = self.scorer.score(self.results, self.usage)
        self.found += 1
        if self.first is None:
            self.first = tuple(self.alternatives)
        if self.best_score is None or score < self.best_score:
            self.best, self.best_score = [list(r) for r in self.results], score
        return self.found >= self.budget.solutions or (score == Score() and self.scorer.floor_is_zero)

    def _request(self, k: int) -> bool:
        if k == len(self.flat):
            return True if self.scorer is None else self._solution()
        ci, ri = self.flat[k]
        parent = self.claims[ci].requests[ri].name
        rest = sum(_least(c) for c in self.plans[ci][ri + 1 :])
        for choice in self.plans[ci][ri]:
            if self.first is not None and choice.result_name != self.first[k]:
                continue  # scored solutions keep the first solution's firstAvailable alternatives
            self.alternatives[k] = choice.result_name
            want = choice.exact.count
            if choice.exact.mode is AllocationMode.ALL:
                want = len(choice.candidates)
                if want == 0:
                    continue
            if len(self.results[ci]) + want + rest > MAX_RESULTS:
                continue  # this alternative would take the claim past its limit
            if self._device(k, ci, parent, choice, want, 0):
                return True
        return False

    def _device(
        self, k: int, ci: int, parent: str, choice: _Choice, want: int, got: int, start: int = 0
    ) -> bool:
        """Choose the request's device number ``got``. A request's devices form a set, so later picks
        come after earlier ones in device order (combinations, not permutations: the first solution is
        the same, found without trying {b, a} after {a, b})."""
        if got == want:
            return self._request(k + 1)
        cands = choice.candidates
        first, last = start, len(cands) - (want - got - 1)  # leave room for the picks still to come
        if choice.exact.mode is AllocationMode.ALL:
            cands, first, last = (cands[got],), 0, 1
            self.books[ci].last_refusal = None
        for i in range(first, last):
            if self.found:
                self.tries_left -= 1
                if self.tries_left < 0:
                    raise _Stop
            cand = cands[i]
            share = self._take(ci, parent, choice, cand)
            if share is None:
                continue
            if self._device(k, ci, parent, choice, want, got + 1, i + 1):
                return True
            self._release(ci, cand, share)
        if choice.exact.mode is AllocationMode.ALL and self.books[ci].last_refusal == cands[0]:
            d = cands[0]
            raise DraError(
                f"claim {self.claims[ci].name}, request {choice.result_name}: cannot add device "
                f"{d.driver}/{d.pool}/{d.device.name} because a claim constraint would not be satisfied"
            )
        return False

    def _take(self, ci: int, parent: str, choice: _Choice, cand: Candidate) -> dict[str, int] | None:
        """Allocate ``cand`` for the request if it is free; returns the consumed capacity (maybe empty)."""
        exact, dev = choice.exact, cand.device
        did = DeviceId(cand.driver, cand.pool, dev.name)
        if any(
            r.device_id == did and (r.request == choice.result_name or not r.shared) for r in self.results[ci]
        ):
            return None  # a claim takes a device once; a shared one once per request
        multi = dev.allow_multiple_allocations and not exact.admin_access
        if not exact.admin_access and (did in self.exclusive or (not multi and self.shares.get(did))):
            return None  # held whole, or (no longer multi-allocatable) still shared
        if choice.lazy and not self._matches(ci, choice, cand, did):
            return None  # selectors last of the cheap checks, first of the rest (upstream's order)
        if not _tolerated(exact, cand):
            return None
        used = self.memo.consumption(cand.driver, dev, exact.capacity_requests)
        if used is None:
            return None
        if not exact.admin_access:
            held = self.consumed.get(did, {})
            limit = self.memo.limits(cand.driver, dev)
            if any(held.get(n, 0) + v > limit[n] for n, v in used.items()):
                return None
            if not self.shares.get(did) and not self._counters_fit(cand):
                return None
        if not self.books[ci].add(parent, choice.result_name, cand):
            return None
        if not exact.admin_access:
            if multi:
                if not self.shares.get(did):
                    self._charge(cand, +1)
                self.shares[did] = self.shares.get(did, 0) + 1
                book = self.consumed.setdefault(did, {})
                for n, v in used.items():
                    book[n] = book.get(n, 0) + v
            else:
                self.exclusive.add(did)
                self._charge(cand, +1)
        self.results[ci].append(
            DeviceResult(
                choice.result_name,
                cand.driver,
                cand.pool,
                dev.name,
                exact.admin_access,
                dict(used) if multi else {},
                multi,
                dev.binding_conditions,
                dev.binding_failure_conditions,
            )
        )
        return dict(used) if multi else {}

    def _release(self, ci: int, cand: Candidate, share: dict[str, int]) -> None:
        result = self.results[ci].pop()
        self.books[ci].remove()
        if result.admin_access:
            return
        did = result.device_id
        if result.shared:
            book = self.consumed[did]
            for n, v in share.items():
                book[n] -= v
            self.shares[did] -= 1
            if not self.shares[did]:
                del self.shares[did]
                self._charge(cand, -1)
        else:
            self.exclusive.discard(did)
            self._charge(cand, -1)

    def allocations(self, claims: Sequence[Claim], node: Node) -> tuple[ClaimAllocation, ...]:
        out = []
        for claim, results in zip(claims, self.results, strict=True):
            local = any(self._local(r) for r in results)
            out.append(ClaimAllocation(claim.name, tuple(results), node.name if local else None))
        return tuple(out)

    def _local(self, result: DeviceResult) -> bool:
        pool = self.pools[(result.driver, result.pool)]
        return any(
            c.node_local or c.device.binds_to_node for c in pool.devices if c.device.name == result.device
        )
