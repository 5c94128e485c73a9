"""Which recompute policy to rematerialize with: found in the program, judged and priced
by XLA.

:func:`find` looks for the parts a recompute policy may recompute (NOTE [auto remat]
in ``__init__.py``) and returns them with the rewrite that applies a policy to them;
:func:`rematerialize` tries the recompute policies, cheapest first, until it has the one that
fits the memory limit with the fewest flops; :func:`trimmed` keeps a differentiated
scan's body to what XLA would keep of its unrolled twin (NOTE [auto scan
residuals]).

NOTE [auto scan residuals]: a scan pays for being a loop even when every layout
fits. Of an unrolled stack's residuals XLA keeps little more than the matmul
outputs: it fuses the element-wise work between them into the backward pass and
computes it again there. A loop boundary stops it, so the forward scan stacks every
residual jax saved, and a scanned stack holds more memory than its unrolled twin at
the same layouts and the same collective bytes (README's "8 scanned blocks vs the
same 8 unrolled" row). So, whatever the limit, a call's differentiated scans are
also tried with their bodies under ``dots_saveable`` (``policies.TRIM``): what XLA
does to the unrolled twin, done to the loop. The chosen layouts are kept; the policy is
kept where XLA's figures for it show less memory, at most ``policies.TRIM_FLOPS``
more flops and no more collective bytes (a body whose collectives would run again
is not). One compile, of a loop: it does not grow with the scan's length. The
report shows it as any recomputation.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from jax.tree_util import KeyPath

from ...primitives.call_plan import CallPlan
from ..search.confirm import NoLayoutFits, Objective, Outcome, no_fit, solve
from ..search.descent import Scored
from ..search.measure import Measured, measure
from ..search.problem import Problem
from ..search.progress import current
from . import policies, scans, unrolled
from .inline import inlined
from .interpret import same_types
from .policies import Recomputable, RecomputePolicy, policies_to_try


@dataclasses.dataclass(frozen=True)
class Found:
    """The parts of ``program`` a recompute policy may recompute, and the rewrite that
    applies one to them (``rewrite(program, recompute)``)."""

    program: Any  # the call's program, its jit calls inlined where that found the parts
    parts: tuple[Recomputable, ...]
    rewrite: Callable[[Any, RecomputePolicy[Any]], Any]

    def rewritten(self, recompute: RecomputePolicy[Any]) -> Any:
        return self.rewrite(self.program, recompute)


def find(program: Any, in_paths: Sequence[KeyPath]) -> Found | None:
    """What a recompute policy may recompute in ``program`` (a ``ClosedJaxpr`` whose inputs have the
    key paths ``in_paths``): its differentiated scans; failing that, those inside its
    jit calls; failing that, the layers of an unrolled stack. ``None``: nothing (the
    layouts were all there was)."""
    found_scans = scans.blocks(program)
    if found_scans:
        return Found(program, tuple(found_scans), scans.rewrite)
    entered = inlined(program)
    found_scans = scans.blocks(entered)
    if found_scans:
        return Found(entered, tuple(found_scans), scans.rewrite)
    layers = unrolled.layers(entered, in_paths)
    if layers:
        return Found(entered, tuple(layers), unrolled.rewrite)
    return None


@dataclasses.dataclass(frozen=True)
class Rematerialized:
    """The chosen rematerialization: the recompute policy, the program rewritten as it
    says, the search's outcome on it, and XLA's flops for the same layouts recomputing
    nothing."""

    recompute: RecomputePolicy[Any]
    body: Any
    outcome: Outcome
    layout_only_flops: float
    to_fit: bool = True  # chosen to meet the limit (not NOTE [auto scan residuals])


def with_program(plan: CallPlan, jaxpr: Any) -> CallPlan:
    """``plan`` running ``jaxpr`` (the same inputs and outputs) instead of its own body."""
    return dataclasses.replace(plan, params=dataclasses.replace(plan.params, jaxpr=jaxpr))


#: The smallest program tried so far: its memory per device, and how messages name it.
_Smallest = tuple[float, str]


def rematerialize(
    plan: CallPlan, problem: Problem, in_paths: Sequence[KeyPath], failed: NoLayoutFits
) -> Rematerialized:
    """The recompute policy that recomputes the fewest flops (XLA's cost analysis) and fits
    ``problem.memory_limit``, its layouts searched and confirmed as any program's
    (NOTE [auto remat]); ``failed``: the search without rematerializing.

    Raises:
        NoLayoutFits: nothing to recompute, or no policy fits (naming the smallest).
    """
    found = find(plan.params.jaxpr, in_paths)
    if found is None:  # nothing differentiated to recompute: the layouts were all there was
        raise failed
    plan = with_program(plan, found.program)
    smallest: _Smallest = (failed.memory_bytes, failed.smallest)
    best: tuple[tuple[float, float], RecomputePolicy[Any], Any, Outcome] | None = None
    seen: set[str] = set()
    fitting: list[RecomputePolicy[Any]] = []
    to_try = policies_to_try(found.parts)
    current().note(
        "no layout fits %s bytes per device; %d parts may be recomputed, %d recompute "
        "policies to try",
        f"{problem.memory_limit or 0:,}",
        len(found.parts),
        len(to_try),
    )
    for number, recompute in enumerate(to_try, 1):
        if any(recompute.recomputes_more_than(fits) for fits in fitting):
            continue  # no cheaper than a policy that fits
        body = found.rewritten(recompute)
        if str(body.jaxpr) in seen or not same_types(body, found.program):
            continue  # two policies that keep the same values; or types retracing cannot keep
        seen.add(str(body.jaxpr))
        what = ", ".join(f"{part} with {policy}" for part, policy in recompute.rematerialized())
        current().note("recompute policy %d of %d: %s", number, len(to_try), what)
        outcome, smallest = _fitted(with_program(plan, body), problem, recompute, failed, smallest)
        if outcome is None:
            continue
        fitting.append(recompute)
        price = (outcome.chosen_measured.flops, outcome.chosen_measured.memory_bytes)
        if best is None or price < best[0]:
            best = (price, recompute, body, outcome)
    if best is None:
        raise no_fit(
            plan.api, problem.memory_limit or 0, smallest[1], smallest[0],
            "layout or rematerialization",
        )  # fmt: skip
    _, chosen, body, outcome = best
    layout_only = measure(plan, outcome.chosen, quick=True)
    return Rematerialized(chosen, body, outcome, layout_only.flops)


def _fitted(
    trial: CallPlan,
    problem: Problem,
    recompute: RecomputePolicy[Any],
    failed: NoLayoutFits,
    smallest: _Smallest,
) -> tuple[Outcome | None, _Smallest]:
    """``trial`` (the program rewritten as ``recompute`` says) laid out to fit: with the
    layouts chosen without the limit where they fit (one compile), else searched under
    it; ``None`` where nothing fits. And the smallest program tried so far."""
    what = ", ".join(f"{part} with {policy}" for part, policy in recompute.rematerialized())
    unconstrained = failed.unconstrained
    if unconstrained is not None:
        outcome, kept = _keeping_layouts(trial, unconstrained, problem.memory_limit or 0)
        if outcome is not None:
            return outcome, smallest
        where = problem.describe(unconstrained.in_layouts)
        smallest = min(smallest, (kept.memory_bytes, f"{where}, {what} rematerialized"))
    try:
        return solve(problem_for(problem, trial), _measure(trial), Objective.FLOPS), smallest
    except NoLayoutFits as failure:  # the layouts too must change, and none fits
        return None, min(
            smallest, (failure.memory_bytes, f"{failure.smallest}, {what} rematerialized")
        )


def problem_for(problem: Problem, trial: CallPlan) -> Problem:
    """``problem`` for ``trial``'s program (the same inputs and outputs)."""
    return dataclasses.replace(problem, jaxpr=trial.params.jaxpr)


def _measure(plan: CallPlan) -> Callable[..., Measured]:
    return functools.partial(measure, plan)


def _keeping_layouts(
    trial: CallPlan, unconstrained: Scored, memory_limit: int
) -> tuple[Outcome | None, Measured]:
    """The layouts chosen without the limit, with ``trial``'s rematerialized program:
    the outcome where they fit (one compile, no search), and XLA's figures."""
    start = time.perf_counter()
    kept = measure(trial, unconstrained, quick=True)
    if kept.memory_bytes > memory_limit:
        return None, kept
    return Outcome.compiled_once(unconstrained, kept, time.perf_counter() - start), kept


def trimmed(plan: CallPlan, outcome: Outcome) -> Rematerialized | None:
    """The chosen layouts with every differentiated scan's body under ``policies.TRIM``,
    where XLA's figures say it costs nothing worth counting (NOTE [auto scan
    residuals]); ``None`` where there is no such scan or it does not."""
    found = scans.blocks(plan.params.jaxpr)
    if not found:
        return None
    current().note("the differentiated scans' bodies under %s, as XLA keeps an unrolled stack's",
                   policies.TRIM)  # fmt: skip
    trim = RecomputePolicy(tuple(found), (policies.TRIM,) * len(found))
    body = scans.rewrite(plan.params.jaxpr, trim)
    if not same_types(body, plan.params.jaxpr):
        return None
    start = time.perf_counter()
    trial = measure(with_program(plan, body), outcome.chosen, quick=True)
    spent = time.perf_counter() - start
    base = outcome.chosen_measured
    cheap = trial.flops <= base.flops * (1 + policies.TRIM_FLOPS)
    if not (trial.memory_bytes < base.memory_bytes and cheap):
        return None
    if trial.collective_bytes > base.collective_bytes:
        return None  # collectives in the body, run again: not free
    with_trim = dataclasses.replace(
        outcome,
        chosen_measured=trial,
        compiles=outcome.compiles + 1,
        search_s=outcome.search_s + spent,
        confirm_s=outcome.confirm_s + spent,
    )
    return Rematerialized(trim, body, with_trim, base.flops, to_fit=False)
