"""The search over AUTO leaves: the cost model ranks assignments, XLA confirms finalists.

NOTE [auto search]: every AUTO input leaf is a variable whose values are the
layouts of its shape that split evenly (``layouts.candidates``). Coordinate
descent walks them, largest leaf first: for each leaf in turn, every candidate
is scored with the others held (one pass of the cost model each, memoized by
assignment), and the best kept; sweeps repeat until one changes nothing. Two
starts, everything replicated and every leaf split as finely as it allows,
keep it from settling in the nearest local minimum. The objective is estimated
step time subject to the memory limit, ties to less memory (``rank``). The best
few distinct assignments are the finalists: each is lowered and compiled, and
XLA's own figures decide (``confirm``): measured collective bytes for the
communication term, measured memory for the limit. With a limit, the model's
memory is first calibrated against XLA on the unconstrained winner, since XLA
fuses what the model counts as temporaries.

An AUTO output takes the layout of the AUTO or given input at the same path
(``out[0]['w']`` and ``args[0]['w']``): a step's updated state comes back laid
out as it went in, so the next step takes it as it is (a committed argument
laid out otherwise would be an error, and a donated buffer is reused only by an
output laid out as it is). The cost of ending in that layout is part of every
assignment's score, so the search weighs it when it chooses the input's layout.
Other AUTO outputs keep the layout they arrive in.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..sharding.auto import Estimate
from .cost import BYTES_PER_S, LATENCY_S
from .layouts import Layout, candidates, local_elements
from .walk import Estimator

#: Finalists compiled to confirm the model's ranking (more only to meet a memory limit).
FINALISTS = 3
#: At most this many more compiles looking for a layout under the memory limit.
EXTRA_FOR_LIMIT = 3
_MAX_SWEEPS = 4

Assignment = tuple[int, ...]  # a candidate index per AUTO input leaf


@dataclass(frozen=True)
class Problem:
    """What the search needs, flat and in the jaxpr's input/output order.

    ``in_layouts``/``out_layouts``: a fixed layout, or None for an AUTO leaf.
    ``out_ties``: for an AUTO output, the input at the same path (or None).
    ``free_axes``: the mesh axes an AUTO leaf may be split over (the Auto ones: an
    Explicit axis is part of the traced types, which the search cannot change).
    """

    jaxpr: Any
    mesh_shape: Mapping[str, int]
    free_axes: tuple[str, ...]
    in_layouts: tuple[Layout | None, ...]
    out_layouts: tuple[Layout | None, ...]
    out_ties: tuple[int | None, ...]
    donated: tuple[bool, ...]


@dataclass(frozen=True)
class Scored:
    assignment: Assignment
    in_layouts: tuple[Layout, ...]
    out_layouts: tuple[Layout, ...]
    estimate: Estimate
    axes_used: int  # (leaf, mesh axis) pairs the AUTO inputs split


@dataclass(frozen=True)
class Measured:
    """XLA's figures for a compiled finalist."""

    collective_bytes: float
    memory_bytes: float
    collectives: float  # executions of collectives per run


class Search:
    """One search (NOTE [auto search]); ``evaluations`` counts cost-model passes."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.estimator = Estimator(problem.jaxpr, problem.mesh_shape)
        order = tuple(problem.mesh_shape)
        avals = problem.jaxpr.in_avals
        self.variables = [i for i, lay in enumerate(problem.in_layouts) if lay is None]
        self.options: list[list[Layout]] = [
            candidates(tuple(avals[i].shape), order, problem.mesh_shape, problem.free_axes)
            for i in self.variables
        ]
        self.scored: dict[Assignment, Scored] = {}

    @property
    def evaluations(self) -> int:
        return len(self.scored)

    def score(self, assignment: Assignment) -> Scored:
        found = self.scored.get(assignment)
        if found is not None:
            return found
        ins = list(self.problem.in_layouts)
        for var, (i, opts) in zip(
            assignment, zip(self.variables, self.options, strict=True), strict=True
        ):
            ins[i] = opts[var]
        in_layouts: tuple[Layout, ...] = tuple(ins)  # type: ignore[arg-type]
        targets: list[Layout | None] = []
        for fixed, tie in zip(self.problem.out_layouts, self.problem.out_ties, strict=True):
            if fixed is not None:
                targets.append(fixed)
            else:
                targets.append(None if tie is None else in_layouts[tie])
        estimate, outs = self.estimator.run(in_layouts, targets, self.problem.donated)
        used = sum(len(d) for i in self.variables for d in in_layouts[i])
        found = self.scored[assignment] = Scored(
            assignment, in_layouts, tuple(outs), estimate, used
        )
        return found

    def descend(self, limit: float | None) -> Scored:
        """Coordinate descent from each start; the best assignment found."""
        sizes = self.problem.mesh_shape
        avals = self.problem.jaxpr.in_avals

        def finest(i: int, opts: list[Layout]) -> int:
            blocks = [local_elements(tuple(avals[i].shape), o, sizes) for o in opts]
            return blocks.index(min(blocks))

        smallest = tuple(finest(i, o) for i, o in zip(self.variables, self.options, strict=True))
        by_size = sorted(
            range(len(self.variables)),
            key=lambda k: -math.prod(avals[self.variables[k]].shape),
        )
        best: Scored | None = None
        for start in dict.fromkeys(((0,) * len(self.variables), smallest)):
            current = self.score(start)
            for _ in range(_MAX_SWEEPS):
                changed = False
                for k in by_size:
                    for option in range(len(self.options[k])):
                        trial = current.assignment[:k] + (option,) + current.assignment[k + 1 :]
                        scored = self.score(trial)
                        if rank(scored, limit) < rank(current, limit):
                            current, changed = scored, True
                if not changed:
                    break
            if best is None or rank(current, limit) < rank(best, limit):
                best = current
        assert best is not None
        return best

    def ranked(self, limit: float | None) -> list[Scored]:
        """Everything scored so far, best first."""
        return sorted(self.scored.values(), key=lambda s: rank(s, limit))


#: Estimates closer than this (relative) are ties: the model is not more precise.
TIE = 0.001


def _bucket(x: float) -> int:
    return math.floor(math.log(x) / math.log1p(TIE)) if x > 0 else -(10**9)


def rank(s: Scored, limit: float | None) -> tuple[float, ...]:
    """Smaller is better: fitting the limit first; then time, then memory, each to
    :data:`TIE`; then fewer mesh axes used by AUTO leaves (the model cannot tell a
    tiny vector split from whole, XLA can: NOTE [auto search]); then exactly."""
    e = s.estimate
    if limit is not None and e.memory_bytes > limit:
        return (1.0, e.memory_bytes, e.time_s)
    return (0.0, _bucket(e.time_s), _bucket(e.memory_bytes), s.axes_used, e.time_s, e.memory_bytes)


def measured_time(s: Scored, m: Measured) -> float:
    """The model's compute with XLA's collectives."""
    return s.estimate.compute_s + m.collective_bytes / BYTES_PER_S + m.collectives * LATENCY_S


@dataclass(frozen=True)
class Outcome:
    chosen: Scored
    chosen_measured: Measured
    others: list[tuple[Scored, Measured | None]]
    evaluations: int
    compiles: int
    search_s: float


class NoLayoutFits(ValueError):
    """No layout found fits ``auto_memory_limit``; names the smallest measured."""


def solve(
    problem: Problem,
    measure: Callable[[Scored], Measured],
    memory_limit: int | None,
    describe: Callable[[Scored], str],
    api: str,
) -> Outcome:
    """Search, then confirm finalists with XLA (NOTE [auto search])."""
    t0 = time.perf_counter()
    search = Search(problem)
    measured: dict[Assignment, Measured] = {}

    def confirm(s: Scored) -> Measured:
        if s.assignment not in measured:
            measured[s.assignment] = measure(s)
        return measured[s.assignment]

    search.descend(None)
    finalists = _distinct(search.ranked(None), FINALISTS)
    est_limit: float | None = None
    if memory_limit is not None:
        first = confirm(finalists[0])
        scale = first.memory_bytes / max(finalists[0].estimate.memory_bytes, 1.0)
        est_limit = memory_limit / scale
        search.descend(est_limit)
        fitting = [s for s in search.ranked(est_limit) if s.estimate.memory_bytes <= est_limit]
        smallest = sorted(search.scored.values(), key=lambda s: s.estimate.memory_bytes)
        finalists = _distinct(fitting, FINALISTS) + _distinct(smallest, EXTRA_FOR_LIMIT)
        finalists = list({s.assignment: s for s in finalists}.values())
    for s in finalists:
        confirm(s)
    pool = [s for s in finalists if s.assignment in measured]
    if memory_limit is not None:
        fits = [s for s in pool if measured[s.assignment].memory_bytes <= memory_limit]
        if not fits:
            every = [s for a, s in search.scored.items() if a in measured]
            small = min(every, key=lambda s: measured[s.assignment].memory_bytes)
            raise NoLayoutFits(
                f"{api}: no layout found fits auto_memory_limit={memory_limit:,} bytes per "
                f"device; the smallest found, {describe(small)}, needs "
                f"{measured[small.assignment].memory_bytes:,.0f} bytes per device (XLA's memory "
                "analysis). Raise the limit, use a larger mesh, or give some specs by hand."
            )
        pool = fits
    # XLA's figures decide exactly: time, then memory, then the model's order.
    chosen = min(
        pool,
        key=lambda s: (
            round(measured_time(s, measured[s.assignment]), 12),
            measured[s.assignment].memory_bytes,
            rank(s, est_limit),
        ),
    )
    others: list[tuple[Scored, Measured | None]] = [
        (s, measured.get(s.assignment))
        for s in _distinct(search.ranked(est_limit), FINALISTS + 1)
        if s.assignment != chosen.assignment
    ][:FINALISTS]
    return Outcome(
        chosen=chosen,
        chosen_measured=measured[chosen.assignment],
        others=others,
        evaluations=search.evaluations,
        compiles=len(measured),
        search_s=time.perf_counter() - t0,
    )


def _distinct(ranked: Sequence[Scored], n: int) -> list[Scored]:
    """The first ``n`` with distinct layouts (two assignments can mean the same program)."""
    seen: set[tuple[tuple[Layout, ...], tuple[Layout, ...]]] = set()
    out: list[Scored] = []
    for s in ranked:
        key = (s.in_layouts, s.out_layouts)
        if key not in seen:
            seen.add(key)
            out.append(s)
        if len(out) == n:
            break
    return out
