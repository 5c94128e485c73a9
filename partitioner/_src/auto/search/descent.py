"""The search over AUTO leaves: the cost model ranks assignments of layouts.

NOTE [auto search]: AUTO input leaves are tied into groups that share a layout
(NOTE [auto repeats] in ``structure.py``: the same parameter of equal layers);
each group is a variable whose values are the layouts of its leaves' shape that
split evenly (``layouts.candidates``). Coordinate descent walks them, largest
first: for each group in turn, every candidate is scored with the others held
(one pass of the cost model each, memoized by assignment; the pass itself
replays what an assignment did not change, NOTE [auto walk memo]), and the best
kept (``improves``: time to a tolerance, then memory, then fewer axes); sweeps
repeat until one changes nothing. It first moves whole families (every layer of
a stack alike, as a scan's stacked parameters must be), so an unrolled stack
reaches what its scanned twin reaches, then the groups (the layers at the ends
of a stack may differ). Three starts, everything replicated, every leaf split as
finely as it allows, and every leaf split over the last mesh axis along its
largest dimension (where Megatron-style pairs of column- and row-split weights
are one move away, which coordinate descent from the others may not reach), keep
it from settling in the nearest local minimum (that start splits a square weight's
last dimension, its output features: of Megatron's pairs the column-split weight
comes first, and attention has three, ``q``, ``k`` and ``v``, to one row-split
``o``). A weight's split pays only once its partner's is there (an MLP's up and down
projections split over the same axes, the hidden layer between them never moved),
which coordinate descent, one block at a time, does not see: each sweep over the
families also moves each pair of families whose shapes are each other's transposed
(the last two dimensions swapped, and unequal) together, the second split over the
same axes on the swapped dimension (on 8 unrolled blocks, Megatron's MLP to the MLP
over both mesh axes). The objective is estimated step time subject to the memory
limit. The best of each start and a few more are the finalists, confirmed by XLA
beside the baselines (NOTE [auto floor] in ``confirm.py``).

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...primitives.auto_choice import Estimate
from ..cost.layouts import Layout, candidates, canonical, local_elements, replicated, shards
from ..cost.walk import Estimator
from .problem import Problem
from .structure import tie

_MAX_SWEEPS = 4

Assignment = tuple[int, ...]  # a candidate index per group of tied AUTO input leaves


@dataclass(frozen=True)
class Scored:
    assignment: Assignment
    in_layouts: tuple[Layout, ...]
    out_layouts: tuple[Layout, ...]
    estimate: Estimate
    axes_used: int  # (leaf, mesh axis) pairs the AUTO inputs split


class Search:
    """One search (NOTE [auto search]); ``evaluations`` counts cost-model passes."""

    def __init__(self, problem: Problem, refine: bool = True) -> None:
        self.problem = problem
        self.refine = refine  # the groups settled after the families (small programs)
        self.estimator = Estimator(problem.jaxpr, problem.mesh_shape)
        auto = [i for i, lay in enumerate(problem.in_layouts) if lay is None]
        families = problem.in_families or (None,) * len(problem.in_layouts)
        self.groups = tie(problem.jaxpr, auto, families, self.estimator.structures)
        order = tuple(problem.mesh_shape)
        self.options: list[list[Layout]] = [
            candidates(self.shape(group), order, problem.mesh_shape, problem.free_axes)
            for group in self.groups
        ]
        self.scored: dict[Assignment, Scored] = {}

    @property
    def evaluations(self) -> int:
        return len(self.scored)

    def shape(self, group: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.problem.jaxpr.in_avals[group[0]].shape)

    def score(self, assignment: Assignment) -> Scored:
        found = self.scored.get(assignment)
        if found is not None:
            return found
        ins = list(self.problem.in_layouts)
        for option, group, opts in zip(assignment, self.groups, self.options, strict=True):
            for i in group:
                ins[i] = opts[option]
        in_layouts: tuple[Layout, ...] = tuple(ins)  # type: ignore[arg-type]
        targets: list[Layout | None] = []
        for fixed, tie_ in zip(self.problem.out_layouts, self.problem.out_ties, strict=True):
            targets.append(fixed if fixed is not None or tie_ is None else in_layouts[tie_])
        estimate, outs = self.estimator.run(in_layouts, targets, self.problem.donated)
        used = sum(len(axes) for group in self.groups for i in group for axes in in_layouts[i])
        found = self.scored[assignment] = Scored(
            assignment, in_layouts, tuple(outs), estimate, used
        )
        return found

    def descend(self, limit: float | None) -> Scored:
        """Coordinate descent from each start (:meth:`starts`), first over the layers'
        families (every layer of a stack alike, as a scan's stacked parameters are),
        then over the groups (the layers at the ends of a stack free to differ); the
        best found."""
        return self.descents(limit)[0]

    def descents(self, limit: float | None) -> list[Scored]:
        """The result of the descent from each start (:meth:`descend`), best first: every
        start settled over the families, the best of them then over the groups (unless
        ``refine`` is off: on a large program the model's tolerances, relative to the
        whole, are too coarse to judge one layer at the end of a stack)."""
        families = self._largest_first(self._families())
        groups = self._largest_first([[k] for k in range(len(self.groups))])
        found: list[Scored] = []
        for start in self.starts():
            found.append(self._settle(self.score(start), families, limit, pairs=True))
        best = found[0]
        for candidate in found[1:]:
            if improves(candidate, best, limit):
                best = candidate
        rest = [candidate for candidate in found if candidate is not best]
        return [self._settle(best, groups, limit) if self.refine else best, *rest]

    def starts(self) -> list[Assignment]:
        """Everything replicated; everything split as finely as it allows; and every leaf
        split over the last free mesh axis (a tensor-parallel axis, by convention) along
        its largest dimension that takes it: coordinate descent from each. Where two
        dimensions are as large, the last one (a weight's output features, as ``x @ w``,
        flax's kernels and convolutions' HWIO order them): of a Megatron pair the
        column-split weight comes first, and an attention block has three (``q``, ``k``,
        ``v``) to one row-split ``o``, one move from that start where splitting the first
        dimension is three."""
        sizes = self.problem.mesh_shape
        free = [axis for axis in sizes if axis in self.problem.free_axes and sizes[axis] > 1]
        finest, parallel = [], []
        for group, opts in zip(self.groups, self.options, strict=True):
            shape = self.shape(group)
            blocks = [local_elements(shape, layout, sizes) for layout in opts]
            finest.append(blocks.index(min(blocks)))
            split = [
                k
                for k, layout in enumerate(opts)
                if free and [axis for axes in layout for axis in axes] == [free[-1]]
            ]
            parallel.append(max(split, key=lambda k: _along(opts[k], shape), default=0))
        replicated_ = (0,) * len(self.groups)
        return list(dict.fromkeys((replicated_, tuple(finest), tuple(parallel))))

    def _families(self) -> list[list[int]]:
        """Groups whose leaves share a family and a type, together (NOTE [auto repeats])."""
        merged: dict[Any, list[int]] = {}
        families = self.problem.in_families or (None,) * len(self.problem.in_layouts)
        for k, group in enumerate(self.groups):
            key = (k,) if families[group[0]] is None else (families[group[0]], self.shape(group))
            merged.setdefault(key, []).append(k)
        return list(merged.values())

    def _largest_first(self, blocks: list[list[int]]) -> list[list[int]]:
        def size(block: list[int]) -> int:
            return sum(math.prod(self.shape(self.groups[k])) * len(self.groups[k]) for k in block)

        return sorted(blocks, key=lambda block: -size(block))

    def _settle(
        self,
        current: Scored,
        blocks: Sequence[list[int]],
        limit: float | None,
        pairs: bool = False,
    ) -> Scored:
        """Sweeps of coordinate descent from ``current``, each block of groups taking one
        option together, then (``pairs``) each pair of blocks of transposed shapes two
        options that split alike (NOTE [auto search]), until a sweep changes nothing."""
        paired = self._pairs(blocks) if pairs else []
        for _ in range(_MAX_SWEEPS):
            changed = False
            for block in blocks:
                for option in range(len(self.options[block[0]])):
                    trial = list(current.assignment)
                    for k in block:
                        trial[k] = option
                    scored = self.score(tuple(trial))
                    if improves(scored, current, limit):
                        current, changed = scored, True
            for first, second, partner in paired:
                for option, other in partner.items():
                    trial = list(current.assignment)
                    for k in first:
                        trial[k] = option
                    for k in second:
                        trial[k] = other
                    scored = self.score(tuple(trial))
                    if improves(scored, current, limit):
                        current, changed = scored, True
            if not changed:
                break
        return current

    def _pairs(
        self, blocks: Sequence[list[int]]
    ) -> list[tuple[list[int], list[int], dict[int, int]]]:
        """Pairs of blocks whose leaves' shapes are each other's with the last two
        dimensions swapped (and unequal: an MLP's up and down projections, stacked or
        not), with the options of the second that split as each option of the first does,
        those two dimensions swapped (a split of the first's output features, the
        second's input features over the same axes: Megatron's pair, over any axes)."""
        found = []
        for i, first in enumerate(blocks):
            shape = self.shape(self.groups[first[0]])
            if len(shape) < 2 or shape[-1] == shape[-2]:
                continue
            for second in blocks[i + 1 :]:
                if self.shape(self.groups[second[0]]) != (*shape[:-2], shape[-1], shape[-2]):
                    continue
                theirs = {layout: k for k, layout in enumerate(self.options[second[0]])}
                partner = {
                    k: theirs[swapped]
                    for k, layout in enumerate(self.options[first[0]])
                    if (swapped := (*layout[:-2], layout[-1], layout[-2])) in theirs
                }
                found.append((first, second, partner))
        return found

    def adopt(self, in_layouts: Sequence[Layout]) -> Scored:
        """The assignment laying this problem's AUTO leaves out as ``in_layouts`` (another
        program's, over the same inputs: each group takes its first leaf's layout), scored."""
        return self.score(
            tuple(self._option(k, in_layouts[group[0]]) for k, group in enumerate(self.groups))
        )

    def around(self, in_layouts: Sequence[Layout], axis: str) -> Scored:
        """The best of ``in_layouts`` without ``axis`` (another program's choice, where
        ``axis`` now does something else: a pipeline's stages) and the layouts that put
        ``axis`` back on one dimension of a family's leaves: one sweep of coordinate
        descent over the families, each trying its few placements of ``axis``; then
        coordinate descent over the families from there (one start, not three: the
        pipeline's program is not the plain one, and the layouts that suit it can move
        more than ``axis``; on the SwiGLU stack with AdamW of ``bench_plan.py``, a
        gpipe pipeline over 'a' moved 14.6 MB from the sweep alone, 4.2 MB after it)."""
        current = self.adopt([_without(layout, axis) for layout in in_layouts])
        for block in self._largest_first(self._families()):
            base = current.in_layouts[self.groups[block[0]][0]]
            for layout in self.options[block[0]]:
                if not _adds(base, layout, axis):
                    continue
                trial = list(current.assignment)
                for k in block:
                    trial[k] = self._option(k, layout)
                scored = self.score(tuple(trial))
                if improves(scored, current, None):
                    current = scored
        return self._settle(current, self._largest_first(self._families()), None, pairs=True)

    def simplified(self, scored: Scored, small: float) -> Scored:
        """``scored`` with every group whose leaves hold less than ``small`` of the AUTO
        leaves' bytes replicated."""
        size = [math.prod(self.shape(group)) * len(group) for group in self.groups]
        total = sum(size) or 1
        return self.score(
            tuple(
                0 if group_size < small * total else option
                for group_size, option in zip(size, scored.assignment, strict=True)
            )
        )

    def front(self, best: Scored, slack: float = 0.05) -> list[Scored]:
        """The scored assignments within ``slack`` of ``best``'s estimated time that no
        other beats on both estimated collective bytes and memory, fastest first."""
        near = [
            candidate
            for candidate in self.scored.values()
            if candidate.estimate.time_s <= best.estimate.time_s * (1 + slack)
        ]

        def beaten(candidate: Scored) -> bool:
            estimate = candidate.estimate
            return any(
                other.estimate.collective_bytes <= estimate.collective_bytes
                and other.estimate.memory_bytes <= estimate.memory_bytes
                and (other.estimate.collective_bytes, other.estimate.memory_bytes)
                != (estimate.collective_bytes, estimate.memory_bytes)
                for other in near
            )

        return sorted(
            (candidate for candidate in near if not beaten(candidate)),
            key=lambda candidate: candidate.estimate.time_s,
        )

    def ranked(self, limit: float | None) -> list[Scored]:
        """Everything scored so far, best first."""
        return sorted(self.scored.values(), key=lambda scored: rank(scored, limit))

    # --- the baselines (NOTE [auto floor] in confirm.py) ---

    def baselines(self) -> list[tuple[str, Scored]]:
        """The replicated layout, and plain data parallelism where it differs."""
        replicated_ = self.score((0,) * len(self.groups))
        parallel = self.score(tuple(self._option(k, self._parallel(group))
                                    for k, group in enumerate(self.groups)))  # fmt: skip
        if parallel.in_layouts == replicated_.in_layouts:
            return [("replicated = data-parallel", replicated_)]
        return [("replicated", replicated_), ("data-parallel", parallel)]

    def _parallel(self, group: Sequence[int]) -> Layout:
        """A leaf's data-parallel layout: as a given output spec at its path forces it;
        state (a leaf an output updates) replicated; in a step with state, another
        leaf (a batch) split along its leading dimension over every free axis it takes."""
        problem = self.problem
        i = group[0]
        forced = problem.in_forced[i] if problem.in_forced else None
        if forced is not None:
            return forced
        shape = self.shape(group)
        state = {position for position in problem.out_ties if position is not None}
        if not shape or not state or i in state:
            return replicated(len(shape))
        axes: list[str] = []
        for axis in problem.mesh_shape:
            if (
                axis in problem.free_axes
                and shape[0] % (shards(axes, problem.mesh_shape) * problem.mesh_shape[axis]) == 0
            ):
                axes.append(axis)
        return canonical([axes] + [[] for _ in shape[1:]], tuple(problem.mesh_shape))

    def _option(self, k: int, layout: Layout) -> int:
        if layout not in self.options[k]:
            self.options[k].append(layout)
        return self.options[k].index(layout)


def _along(layout: Layout, shape: Sequence[int]) -> tuple[int, ...]:
    """Larger for a layout splitting a larger dimension, fewer dimensions, a later one."""
    dims = [dim for dim, axes in enumerate(layout) if axes]
    return max(((shape[dim], -len(dims), dim) for dim in dims), default=(0, 0, 0))


def _without(layout: Layout, axis: str) -> Layout:
    return tuple(tuple(a for a in dim if a != axis) for dim in layout)


def _adds(base: Layout, layout: Layout, axis: str) -> bool:
    """Whether ``layout`` is ``base`` with ``axis`` added to one dimension."""
    return len(layout) == len(base) and _without(layout, axis) == base and layout != base


#: Times closer than this (relative) are ties: the model is not more precise.
TIE = 0.001
#: Memories closer than this (relative) are ties: the model's memory is off from XLA's
#: by a few percent (it cannot see XLA's fusion and buffer reuse).
MEMORY_TIE = 0.01


def _bucket(x: float, tie: float = TIE) -> int:
    return math.floor(math.log(x) / math.log1p(tie)) if x > 0 else -(10**9)


def improves(candidate: Scored, current: Scored, limit: float | None) -> bool:
    """Whether the search moves from ``current`` to ``candidate``: under the limit first (else less
    memory); then less time, by more than :data:`TIE`; then less memory, by more than
    :data:`MEMORY_TIE`; then fewer mesh axes used; then exactly. Tolerances, not
    buckets: two estimates a hair apart never fall on two sides of a boundary."""
    mine, theirs = candidate.estimate, current.estimate
    if limit is not None and (mine.memory_bytes > limit or theirs.memory_bytes > limit):
        if (mine.memory_bytes > limit) != (theirs.memory_bytes > limit):
            return mine.memory_bytes <= limit
        return mine.memory_bytes < theirs.memory_bytes
    for x, y, tolerance in (
        (mine.time_s, theirs.time_s, TIE),
        (mine.memory_bytes, theirs.memory_bytes, MEMORY_TIE),
    ):
        if x < y * (1 - tolerance):
            return True
        if x > y * (1 + tolerance):
            return False
    return (candidate.axes_used, mine.time_s, mine.memory_bytes) < (
        current.axes_used,
        theirs.time_s,
        theirs.memory_bytes,
    )


def rank(scored: Scored, limit: float | None) -> tuple[float, ...]:
    """Smaller is better: fitting the limit first; then time to :data:`TIE`, memory to
    :data:`MEMORY_TIE`; then fewer mesh axes used by AUTO leaves (the model cannot
    tell a tiny vector split from whole, nor a layout that saves a few bytes from one
    that XLA lays out no better, XLA can: NOTE [auto search]); then exactly."""
    estimate = scored.estimate
    if limit is not None and estimate.memory_bytes > limit:
        return (1.0, estimate.memory_bytes, estimate.time_s)
    memory = _bucket(estimate.memory_bytes, MEMORY_TIE)
    return (
        0.0,
        _bucket(estimate.time_s),
        memory,
        scored.axes_used,
        estimate.time_s,
        estimate.memory_bytes,
    )


def distinct(ranked: Sequence[Scored], n: int) -> list[Scored]:
    """The first ``n`` with distinct layouts (two assignments can mean the same program)."""
    seen: set[tuple[tuple[Layout, ...], tuple[Layout, ...]]] = set()
    out: list[Scored] = []
    for scored in ranked:
        key = (scored.in_layouts, scored.out_layouts)
        if key not in seen:
            seen.add(key)
            out.append(scored)
        if len(out) == n:
            break
    return out
