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
with a collective more but fewer bytes and less memory is XLA's to judge).

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
partitioned program and its memory analysis as they are and halves the compile.
Compiling costs more than the search on a deep unrolled program (XLA's compile
time grows faster than its size): from :data:`LARGE_PROGRAM` equations on (a
scan body counted once, as XLA compiles it), the search's best alone is
compiled beside the baselines, and the layers at the ends of a stack keep their
family's layout (NOTE [auto search]). There, without a memory limit, a baseline is
compiled only where the model cannot rule it out beside the measured finalist: XLA's
compile of such a program costs the same whatever its layout (a minute for 32
unrolled transformer blocks here, against 8 s of search), so measuring a layout the
decision cannot choose doubles the first call for nothing. It cannot be chosen when
its compute alone (the model's, which the decision's time uses for every layout)
exceeds the finalist's time on XLA's figures, and its estimated memory is
:data:`MARGIN` above the finalist's (it could then dominate the finalist only if the
model's memory were that far off for one and not the other). The report shows such a
baseline with the model's figures only.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ... import jax_private as jp
from ..cost.rates import BYTES_PER_S, LATENCY_S
from .descent import Assignment, Scored, Search, distinct, rank
from .measure import Measured
from .problem import Problem

#: Finalists compiled to confirm the model's ranking (more only to meet a memory limit).
FINALISTS = 3
#: From this many equations on, one finalist (NOTE [auto floor]).
LARGE_PROGRAM = 1200
#: Finalists beside the best come from the layouts within this of its estimated time.
FRONT = 0.05
#: A leaf under this share of the AUTO leaves' bytes is small: the best with its small
#: leaves replicated is a finalist (the model cannot tell a small split from whole).
SMALL = 0.02
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


def measured_time(s: Scored, m: Measured) -> float:
    """The model's compute with XLA's collectives."""
    return s.estimate.compute_s + m.collective_bytes / BYTES_PER_S + m.collectives * LATENCY_S


def equations(jaxpr: Any) -> int:
    """Equations XLA compiles: every body once (a scan's body is one loop)."""
    seen: set[int] = set()

    def count(j: Any) -> int:
        j = getattr(j, "jaxpr", j)
        if id(j) in seen:
            return 0
        seen.add(id(j))
        return len(j.eqns) + sum(count(v) for e in j.eqns for v in _bodies(e.params.values()))

    return count(jaxpr)


def _bodies(values: Any) -> list[Any]:
    found = []
    for v in values:
        if isinstance(v, (jp.ClosedJaxpr, jp.Jaxpr)):
            found.append(v)
        elif isinstance(v, (tuple, list)):
            found += _bodies(v)
    return found


class _Judge:
    """XLA's figures, each assignment compiled once: the first as the call will run it
    (its executable is the one the first call runs if it wins), the others quickly
    (``measure(s, quick=True)``: XLA's figures without optimizing the machine code)."""

    def __init__(self, measure: Measure) -> None:
        self.measure = measure
        self.measured: dict[Assignment, Measured] = {}
        self.seconds = 0.0

    def __call__(self, s: Scored) -> Measured:
        if s.assignment not in self.measured:
            t0 = time.perf_counter()
            self.measured[s.assignment] = self.measure(s, quick=bool(self.measured))
            self.seconds += time.perf_counter() - t0
        return self.measured[s.assignment]

    def key(self, s: Scored, limit: float | None, objective: Objective) -> tuple[float, ...]:
        """XLA's figures decide exactly: time (flops first where ``objective`` is
        :attr:`Objective.FLOPS`), then memory, then the model's order."""
        m = self.measured[s.assignment]
        first = (m.flops,) if objective is Objective.FLOPS else ()
        return (*first, round(measured_time(s, m), 12), m.memory_bytes, *rank(s, limit))


def solve(problem: Problem, measure: Measure, objective: Objective = Objective.TIME) -> Outcome:
    """Search, then confirm finalists and baselines with XLA (NOTE [auto floor]) under
    ``problem.memory_limit``; ``objective``: :attr:`Objective.FLOPS` for a
    rematerialized program.

    Raises:
        NoLayoutFits: no layout measured fits the limit.
    """
    memory_limit = problem.memory_limit
    t0 = time.perf_counter()
    small = equations(problem.jaxpr) < LARGE_PROGRAM
    search = Search(problem, refine=small)
    judge = _Judge(measure)
    many = FINALISTS if small else 1
    finalists, est_limit = _finalists(search, judge, memory_limit, many, objective)
    baselines = search.baselines()
    compared = [s for _, s in baselines]
    if not small and memory_limit is None:
        ruled_out = _ruled_out(finalists[0], judge)
        compared = [s for s in compared if not ruled_out(s)]
    pool = [*finalists, *compared]

    def allowed(s: Scored) -> bool:
        return memory_limit is None or judge(s).memory_bytes <= memory_limit

    pool = [s for s in pool if allowed(s)]
    if not pool:
        raise _no_fit(search, judge, problem, unconstrained=search.descents(None)[0])

    def best() -> Scored:
        undominated = _undominated(pool, judge, with_flops=objective is Objective.FLOPS)
        return min(undominated, key=lambda s: judge.key(s, est_limit, objective))

    chosen = best()
    simpler = search.simplified(chosen, SMALL)
    if many > 1 and simpler.assignment not in judge.measured and allowed(simpler):
        pool.append(simpler)  # XLA's winner with its small leaves whole, judged too
        chosen = best()
    others: list[tuple[Scored, Measured | None]] = [
        (s, judge.measured.get(s.assignment))
        for s in distinct(search.ranked(est_limit), FINALISTS + 1)
        if s.assignment != chosen.assignment
    ][:FINALISTS]
    return Outcome(
        chosen=chosen,
        chosen_measured=judge(chosen),
        others=others,
        baselines=[(name, s, judge.measured.get(s.assignment)) for name, s in baselines],
        evaluations=search.evaluations,
        compiles=len(judge.measured),
        search_s=time.perf_counter() - t0,
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
        return finalists, None
    est_limit = _calibrated(judge, finalists[0], memory_limit)
    return _under_limit(search, est_limit, many, objective), est_limit


def _ruled_out(finalist: Scored, judge: _Judge) -> Callable[[Scored], bool]:
    """Whether a large program's baseline cannot be chosen beside the (measured, first)
    ``finalist``, as the model says (NOTE [auto floor])."""
    time_s = measured_time(finalist, judge(finalist))
    memory = (1 + MARGIN) * finalist.estimate.memory_bytes
    return lambda s: s.estimate.compute_s > time_s and s.estimate.memory_bytes >= memory


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
    fitting = [s for s in ranked if s.estimate.memory_bytes <= est_limit]
    smallest = sorted(search.scored.values(), key=lambda s: s.estimate.memory_bytes)
    finalists = distinct(fitting, many) + distinct(smallest, EXTRA_FOR_LIMIT)
    if objective is Objective.FLOPS:
        least = sorted(fitting, key=lambda s: (s.estimate.compute_s, s.estimate.time_s))
        finalists += distinct(least, many)
    return list({s.assignment: s for s in finalists}.values())


def _undominated(pool: list[Scored], judge: _Judge, *, with_flops: bool) -> list[Scored]:
    """The measured layouts no other one beats on XLA's collective bytes and memory (and
    flops, ``with_flops``: where they are the price) (NOTE [auto floor]): the baselines
    among the others, so none of them beats the choice."""
    return [
        s for s in pool if not any(_beats(judge(o), judge(s), with_flops=with_flops) for o in pool)
    ]


def _beats(a: Measured, b: Measured, *, with_flops: bool) -> bool:
    pairs = [(a.collective_bytes, b.collective_bytes), (a.memory_bytes, b.memory_bytes)]
    if with_flops:
        pairs.append((a.flops, b.flops))
    return all(x <= y for x, y in pairs) and any(x < y for x, y in pairs)


def _no_fit(
    search: Search, judge: _Judge, problem: Problem, *, unconstrained: Scored
) -> NoLayoutFits:
    every = [s for a, s in search.scored.items() if a in judge.measured]
    small = min(every, key=lambda s: judge.measured[s.assignment].memory_bytes)
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
