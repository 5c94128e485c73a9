"""XLA confirms the search's finalists beside the baselines, and decides.

NOTE [auto floor]: the cost model ranks; XLA decides among a few. Beside the
finalists XLA always compiles the *baselines*, the layouts any user tries first:
every AUTO leaf replicated, and plain data parallelism (state replicated, a batch
split along its leading dimension, a leaf whose output spec is given laid out as
it says; the same program as the replicated one when the batch is given). The
finalists are the search's best; the same with its small leaves replicated
(:data:`SMALL`: the model cannot tell a small split from whole); the best of
each other start of the descent; and the layouts it scored on the front of
estimated collective bytes and memory within :data:`FRONT` of its time (a layout
with a collective more but fewer bytes and less memory is XLA's to judge); and, for
each mesh axis the best splits both the batch and a weight's inner dimension over,
the best layout that keeps it off the weights' inner dimensions: where a weight's
kept dimension shares an axis with the batch, XLA's propagation may reshard the
activations rather than gather the weight, which the model prices as the cheaper
move (a small GPT with AdamW on a 2x2x2 mesh, its batch over 'c' and its MLP weights
over ('b', 'c'): 13.6 MB moved where the model counted 7.1 MB; over ('a', 'b'),
6.3 MB).

Each is lowered and compiled, and XLA's own figures decide (``measure``): among
the measured layouts that no other one beats on both collective bytes and memory
(one of them strictly), the least time (the model's compute plus measured
collective bytes and count), then memory; XLA's winner with its small leaves
replicated is judged too. The baselines are among the measured, so AUTO never
returns a layout the obvious ones beat. With ``auto_memory_limit`` the model's
memory is first calibrated against XLA on the unconstrained winner, since XLA
fuses what the model counts as temporaries; only layouts XLA measures under the
limit can win, a baseline among them.

Where rematerialization is chosen (NOTE [auto remat]) the price is flops, not
time: the objective is ``"flops"``, the finalists under the limit add the layouts
the model gives the least compute, and XLA's flops decide first (then time, then
memory), flops counting in the dominance test beside collective bytes and memory.

The first finalist compiles as the call will run it (if it wins, its executable
is the one the first call runs); the others compile without optimizing the
machine code (``xla_backend_optimization_level=0``), which leaves XLA's
partitioned program and its memory analysis as they are and shortens the compile
(by how much: the README's note on the test suite, which compiles with this option).
Compiling costs more than the search on a deep unrolled program (XLA's compile
time grows faster than its size): from :data:`LARGE_PROGRAM` equations on (a
scan body counted once, as XLA compiles it), the search's best alone is
compiled beside the baselines, and the layers at the ends of a stack keep their
family's layout (NOTE [auto search]). There, without a memory limit, a baseline is
compiled only where the model cannot rule it out beside the measured finalist: XLA's
compile of such a program costs the same whatever its layout, and far more than the
search (the README's "auto" rows of search time for stacked transformer blocks and
their note, written by ``scaling_rows`` in ``benchmarks/bench_auto.py``), so
measuring a layout the decision cannot choose doubles the first call for nothing. It
cannot be chosen when its compute alone (the model's, which the decision's time uses
for every layout) exceeds the finalist's time on XLA's figures, and its estimated
memory is :data:`MARGIN` above the finalist's (it could then dominate the finalist
only if the model's memory were that far off for one and not the other). The report
shows such a baseline with the model's figures only.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ... import jax_private as jp
from ...primitives.auto_choice import Figures
from .descent import Assignment, Scored, Search, distinct, rank
from .measure import Measured, axis_roles, figures_of
from .problem import Problem
from .progress import current

#: Finalists compiled to confirm the model's ranking (more only to meet a memory limit).
FINALISTS = 3
#: From this many equations on, one finalist (NOTE [auto floor]).
LARGE_PROGRAM = 1200
#: Finalists beside the best come from the layouts within this of its estimated time.
FRONT = 0.05
#: A leaf under this share of the AUTO leaves' bytes is small: the best with its small
#: leaves replicated is a finalist (the model cannot tell a small split from whole).
SMALL = 0.02
#: The model's best layouts searched for one that keeps the batch's axis off the weights'
#: inner dimensions.
RANKED_FOR_ROLES = 500
#: At most this many more compiles looking for a layout under the memory limit.
EXTRA_FOR_LIMIT = 3
#: A large program's baseline estimated this much above the finalist's memory (and
#: slower on compute alone) is not compiled (NOTE [auto floor]).
MARGIN = 0.25


class Objective(enum.Enum):
    """What XLA's figures decide by first (NOTE [auto floor]): the estimated step time,
    or, for a rematerialized program, XLA's flops (the price of recomputing)."""

    TIME = "time"
    FLOPS = "flops"


#: XLA's figures for a compiled finalist (``measure(scored, quick=...)``).
Measure = Callable[..., Measured]


@dataclass(frozen=True)
class Outcome:
    """What a search decided: the chosen layouts with XLA's figures, the runners-up and
    the baselines (XLA's figures where compiled), and what it cost."""

    chosen: Scored
    chosen_measured: Measured
    others: list[tuple[Scored, Measured | None]]
    baselines: list[tuple[str, Scored, Measured | None]]  # None: ruled out by the model
    evaluations: int
    compiles: int
    search_s: float
    confirm_s: float

    @classmethod
    def compiled_once(cls, chosen: Scored, measured: Measured, seconds: float) -> Outcome:
        """Layouts known beforehand, confirmed by one compile and no search (a plan that
        keeps the layouts chosen without a limit, NOTE [auto remat])."""
        return cls(chosen, measured, [], [], evaluations=0, compiles=1,
                   search_s=seconds, confirm_s=seconds)  # fmt: skip


class NoLayoutFits(ValueError):
    """No layout found fits ``auto_memory_limit``; names the smallest measured.

    Attributes:
        smallest: the smallest plan found, as the message names it.
        memory_bytes: its size per device, as XLA's memory analysis counts it.
        unconstrained: the search's best layout without the limit (a ``Scored``; ``None``
            where none was searched): rematerialization tries it too (NOTE [auto remat]).
    """

    def __init__(
        self,
        message: str,
        smallest: str = "",
        memory_bytes: float = 0.0,
        unconstrained: Scored | None = None,
    ) -> None:
        super().__init__(message)
        self.smallest = smallest
        self.memory_bytes = memory_bytes
        self.unconstrained = unconstrained


def equations(jaxpr: Any) -> int:
    """Equations XLA compiles: every body once (a scan's body is one loop)."""
    seen: set[int] = set()

    def count(body: Any) -> int:
        body = getattr(body, "jaxpr", body)
        if id(body) in seen:
            return 0
        seen.add(id(body))
        return len(body.eqns) + sum(
            count(inner) for eqn in body.eqns for inner in _bodies(eqn.params.values())
        )

    return count(jaxpr)


def _bodies(values: Any) -> list[Any]:
    found = []
    for value in values:
        if isinstance(value, (jp.ClosedJaxpr, jp.Jaxpr)):
            found.append(value)
        elif isinstance(value, (tuple, list)):
            found += _bodies(value)
    return found


class _Judge:
    """XLA's figures, each assignment compiled once: the first as the call will run it
    (its executable is the one the first call runs if it wins), the others quickly
    (``measure(scored, quick=True)``: XLA's figures without optimizing the machine code)."""

    def __init__(self, measure: Measure, describe: Callable[[Scored], str]) -> None:
        self.measure = measure
        self.describe = describe
        self.measured: dict[Assignment, Measured] = {}
        self.seconds = 0.0
        self.expected = 0  # how many the search expects to compile (its progress's "of m")

    def __call__(self, scored: Scored) -> Measured:
        if scored.assignment not in self.measured:
            number = len(self.measured) + 1
            self.expected = max(self.expected, number)
            current().measuring(self.describe(scored), number, self.expected)
            start = time.perf_counter()
            self.measured[scored.assignment] = self.measure(scored, quick=bool(self.measured))
            self.seconds += time.perf_counter() - start
        return self.measured[scored.assignment]

    def figures(self, scored: Scored) -> Figures:
        """XLA's figures for ``scored`` (compiled first if it was not)."""
        return figures_of(scored.estimate, self(scored))

    def key(self, scored: Scored, limit: float | None, objective: Objective) -> tuple[float, ...]:
        """XLA's figures decide exactly: time (flops first where ``objective`` is
        :attr:`Objective.FLOPS`), then memory, then the model's order."""
        figures = self.figures(scored)
        first = (figures.flops,) if objective is Objective.FLOPS else ()
        return (*first, round(figures.time_s, 12), figures.memory_bytes, *rank(scored, limit))


def solve(problem: Problem, measure: Measure, objective: Objective = Objective.TIME) -> Outcome:
    """Search, then confirm finalists and baselines with XLA (NOTE [auto floor]) under
    ``problem.memory_limit``; ``objective``: :attr:`Objective.FLOPS` for a
    rematerialized program.

    Raises:
        NoLayoutFits: no layout measured fits the limit.
    """
    memory_limit = problem.memory_limit
    start = time.perf_counter()
    small = equations(problem.jaxpr) < LARGE_PROGRAM
    search = Search(problem, refine=small)
    judge = _Judge(measure, lambda scored: problem.describe(scored.in_layouts))
    many = FINALISTS if small else 1
    judge.expected = many + 2  # the finalists and the baselines, until both are known
    finalists, est_limit = _finalists(search, judge, memory_limit, many, objective)
    current().note(
        "the cost model scored %d layouts of %d groups of AUTO leaves",
        search.evaluations,
        len(search.groups),
    )
    baselines = search.baselines()
    compared = [candidate for _, candidate in baselines]
    if not small and memory_limit is None:
        ruled_out = _ruled_out(finalists[0], judge)
        compared = [candidate for candidate in compared if not ruled_out(candidate)]
    pool = [*finalists, *compared]
    unmeasured = {candidate.assignment for candidate in pool} - set(judge.measured)
    judge.expected = len(judge.measured) + len(unmeasured)

    def allowed(candidate: Scored) -> bool:
        return memory_limit is None or judge(candidate).memory_bytes <= memory_limit

    pool = [candidate for candidate in pool if allowed(candidate)]
    if not pool:
        raise _no_fit(search, judge, problem, unconstrained=search.descents(None)[0])

    def best() -> Scored:
        undominated = _undominated(pool, judge, with_flops=objective is Objective.FLOPS)
        return min(undominated, key=lambda candidate: judge.key(candidate, est_limit, objective))

    chosen = best()
    simpler = search.simplified(chosen, SMALL)
    if many > 1 and simpler.assignment not in judge.measured and allowed(simpler):
        pool.append(simpler)  # XLA's winner with its small leaves whole, judged too
        chosen = best()
    others: list[tuple[Scored, Measured | None]] = [
        (scored, judge.measured.get(scored.assignment))
        for scored in distinct(search.ranked(est_limit), FINALISTS + 1)
        if scored.assignment != chosen.assignment
    ][:FINALISTS]
    return Outcome(
        chosen=chosen,
        chosen_measured=judge(chosen),
        others=others,
        baselines=[
            (name, baseline, judge.measured.get(baseline.assignment))
            for name, baseline in baselines
        ],
        evaluations=search.evaluations,
        compiles=len(judge.measured),
        search_s=time.perf_counter() - start,
        confirm_s=judge.seconds,
    )


def _finalists(
    search: Search, judge: _Judge, memory_limit: int | None, many: int, objective: Objective
) -> tuple[list[Scored], float | None]:
    """The finalists (NOTE [auto floor]) and, with a limit, the limit calibrated to the
    model's memory (the finalists are then searched again under it)."""
    descents = search.descents(None)
    best = descents[0]
    simpler = search.simplified(best, SMALL)
    finalists = distinct(
        [best, simpler, *descents[1:], *search.front(best, FRONT), *search.ranked(None)], many
    )
    if memory_limit is None:
        if many > 1:
            alone = _batch_alone(search, best)
            finalists = distinct([*finalists, *alone], len(finalists) + len(alone))
        return finalists, None
    est_limit = _calibrated(judge, finalists[0], memory_limit)
    return _under_limit(search, est_limit, many, objective), est_limit


def _batch_alone(search: Search, best: Scored) -> list[Scored]:
    """For each mesh axis ``best`` splits both the batch and a weight's inner dimension
    over (any but its leading one: the layer dimension of a stack), the fastest layout
    scored that keeps that axis off every weight's inner dimensions (NOTE [auto floor]:
    where a weight's kept dimension and the batch share an axis, XLA's propagation may
    move activations rather than the weight, which the model does not price)."""
    problem = search.problem
    weights = {i for i in problem.out_ties if i is not None} or set(problem.auto_inputs)

    def inner(scored: Scored, axis: str) -> bool:
        layouts = scored.in_layouts
        return any(axis in dim for i in weights for dim in layouts[i][1:])

    shared = [
        axis
        for axis, role in axis_roles(problem, best.in_layouts)
        if role == "FSDP" and inner(best, axis)
    ]
    if not shared:
        return []  # the usual case: nothing to rank
    ranked = search.ranked(None)[:RANKED_FOR_ROLES]
    found = (next((s for s in ranked if not inner(s, axis)), None) for axis in shared)
    return [alone for alone in found if alone is not None]


def _ruled_out(finalist: Scored, judge: _Judge) -> Callable[[Scored], bool]:
    """Whether a large program's baseline cannot be chosen beside the (measured, first)
    ``finalist``, as the model says (NOTE [auto floor])."""
    time_s = judge.figures(finalist).time_s
    memory = (1 + MARGIN) * finalist.estimate.memory_bytes
    return lambda baseline: (
        baseline.estimate.compute_s > time_s and baseline.estimate.memory_bytes >= memory
    )


def _calibrated(judge: _Judge, first: Scored, memory_limit: int) -> float:
    """The limit in the model's memory: scaled by XLA's memory over the model's for the
    unconstrained winner."""
    scale = judge(first).memory_bytes / max(first.estimate.memory_bytes, 1.0)
    return memory_limit / scale


def _under_limit(search: Search, est_limit: float, many: int, objective: Objective) -> list[Scored]:
    """Search again under the (calibrated) limit: the best that fit, and the smallest;
    for :attr:`Objective.FLOPS`, also those that fit with the least estimated compute."""
    best = search.descend(est_limit)
    ranked = [best, *search.ranked(est_limit)]
    fitting = [scored for scored in ranked if scored.estimate.memory_bytes <= est_limit]
    smallest = sorted(search.scored.values(), key=lambda scored: scored.estimate.memory_bytes)
    finalists = distinct(fitting, many) + distinct(smallest, EXTRA_FOR_LIMIT)
    if objective is Objective.FLOPS:
        least = sorted(
            fitting, key=lambda scored: (scored.estimate.compute_s, scored.estimate.time_s)
        )
        finalists += distinct(least, many)
    return list({scored.assignment: scored for scored in finalists}.values())


def _undominated(pool: list[Scored], judge: _Judge, *, with_flops: bool) -> list[Scored]:
    """The measured layouts no other one beats on XLA's collective bytes and memory (and
    flops, ``with_flops``: where they are the price) (NOTE [auto floor]): the baselines
    among the others, so none of them beats the choice."""
    return [
        candidate
        for candidate in pool
        if not any(
            judge.figures(other).dominates(judge.figures(candidate), with_flops=with_flops)
            for other in pool
        )
    ]


def _no_fit(
    search: Search, judge: _Judge, problem: Problem, *, unconstrained: Scored
) -> NoLayoutFits:
    every = [scored for assignment, scored in search.scored.items() if assignment in judge.measured]
    small = min(every, key=lambda scored: judge.measured[scored.assignment].memory_bytes)
    return no_fit(
        problem.api,
        problem.memory_limit or 0,
        problem.describe(small.in_layouts),
        judge.measured[small.assignment].memory_bytes,
        unconstrained=unconstrained,
    )


def no_fit(
    api: str,
    limit: int,
    smallest: str,
    memory_bytes: float,
    what: str = "layout",
    *,
    unconstrained: Scored | None = None,
) -> NoLayoutFits:
    """The error for a limit nothing found meets, naming the smallest found and its size."""
    return NoLayoutFits(
        f"{api}: no {what} found fits auto_memory_limit={limit:,} bytes per "
        f"device; the smallest found, {smallest}, needs {memory_bytes:,.0f} bytes per device "
        "(XLA's memory analysis). Raise the limit, use a larger mesh, or give some specs by "
        "hand.",
        smallest,
        memory_bytes,
        unconstrained,
    )
