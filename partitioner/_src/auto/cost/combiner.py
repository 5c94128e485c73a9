"""XLA's all-reduce combiner, as the cost model counts it: collective depths per group.

NOTE [all-reduce combiner]: XLA:CPU's pipeline runs an all-reduce combiner after
fusion (``CpuAllReduceCombiner`` in XLA's ``cpu_compiler.cc``: no byte threshold, at
most 256 operands). Within one computation (the program, or one loop body: once per
trip) it merges all-reduces with the same key (reduction, replica groups, element type;
a bf16 all-reduce is an f32 one by then) that do not depend on each other into one
all-reduce of a tuple, which moves the sum of their bytes. It merges nothing else:
all-gathers, all-to-alls, explicit reduce-scatters and collective-permutes stay one
each, and an all-reduce in a loop body never merges with one outside it. A GSPMD
reduction on CPU is always an all-reduce (a partial sum a consumer wants split is
all-reduced, then sliced): the model's reduce-scatter is one of them here. In a train
step it merges the gradients' all-reduces over the batch's axis (every parameter's,
independent of each other) into one, and the partial sums one backward step reduces
side by side (the input gradients through ``q``, ``k`` and ``v``) into one. Probed
with ``shard_map`` programs on the 4x2 mesh: two independent sums merge (of 4 MB each
too), a sum and a max do not, nor sums over different axes, nor an f32 and an s32 sum,
nor a sum and one that reads its result, nor a sum in a scan's body and one outside;
two in one body merge, per trip (``tests/auto/test_combiner.py`` checks the model's
count against XLA's on such programs).

The model counts a step's *groups* (:data:`Group`: reduction and mesh axes; a move's
all-reduces and reduce-scatters are sums) by depth: each value carries, per group,
the number of that group's all-reduces on its longest path from the computation's
inputs (its *levels*). Two all-reduces of one group at the same level cannot depend
on each other, so the combiner may merge them; a computation runs, per group, as
many all-reduces as the deepest level it reaches (the length of its longest chain
of them, the fewest groups of independent ones that cover them all). Bytes are
unchanged: a combined all-reduce moves the sum. XLA's combiner is greedy (it takes
all-reduces in post-order until one depends on those taken), so it can run more than
the longest chain where independent chains interleave (two chains of two: three); on
``bench_auto``'s 8 transformer blocks, scanned and unrolled, with and without layer
norms, laid out as Megatron and as Megatron's attention with the MLP over both mesh
axes, it ran as many as the model counts (Megatron's without norms: 32, where the
model counted 93).

Levels are vectors, one entry per group seen, interned as small ints (0: none) so
that the walk's hot loop joins and adds them as ints. An equation's results sit at
the join of its operands' levels, each operand's raised by the groups its move
reduces (a copy an earlier equation reduced, read again, too), then raised by the
groups it reduces its result over (a maximum over a split dimension); a call's body
(inlined by XLA) is walked from the join of the call's operands; a loop body or a
branch is a computation of its own, walked from level 0, its deepest level counted
once per trip (``control.py``). The walk's memo (NOTE [auto walk memo] in
``walk.py``) keeps what an equation adds, per operand and per result, never the
levels it found, so a replay is exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

#: What XLA's combiner merges by: the reduction (``"add"`` for a partial sum) and the
#: mesh axes the all-reduce spans; None for a collective it never merges.
Group = tuple[str, tuple[str, ...]] | None
#: Interned levels (a vector of per-group depths); 0 is none.
Level = int
NONE: Level = 0


class Levels:
    """The per-group depths of values (NOTE [all-reduce combiner]), interned as ints.

    Invariants: ``join`` and ``add`` are elementwise max and sum of the vectors,
    commutative, with :data:`NONE` their identity; ``total`` is the sum of a vector's
    entries (the all-reduces a computation reaching it runs).
    """

    def __init__(self) -> None:
        self._groups: dict[Any, int] = {}
        self._vectors: list[tuple[int, ...]] = [()]
        self._ids: dict[tuple[int, ...], int] = {(): NONE}
        #: Joins found, under both orders of their operands (the walk's hot loop reads it).
        self.joins: dict[tuple[int, int], int] = {}
        self._adds: dict[tuple[int, int], int] = {}
        self._steps: dict[Any, int] = {}

    def _intern(self, vector: Sequence[int]) -> Level:
        vector = tuple(vector)
        while vector and not vector[-1]:
            vector = vector[:-1]
        found = self._ids.get(vector)
        if found is None:
            found = self._ids[vector] = len(self._vectors)
            self._vectors.append(vector)
        return found

    def of(self, groups: Iterable[Group]) -> Level:
        """One level of each group in ``groups`` (None entries ignored)."""
        indices = {self._groups.setdefault(g, len(self._groups)) for g in groups if g is not None}
        if not indices:
            return NONE
        vector = [0] * (max(indices) + 1)
        for i in indices:
            vector[i] = 1
        return self._intern(vector)

    def of_steps(self, steps: Sequence[tuple[Any, ...]]) -> Level:
        """The levels a move's collectives add (those over more than one device)."""
        found = self._steps.get(steps)
        if found is None:
            found = self._steps[steps] = self.of(step[3] for step in steps if step[1] > 1)
        return found

    def join(self, a: Level, b: Level) -> Level:
        if a == b or not b:
            return a
        if not a:
            return b
        found = self.joins.get((a, b))
        if found is None:
            x, y = self._vectors[a], self._vectors[b]
            if len(x) < len(y):
                x, y = y, x
            found = self._intern([max(u, y[i]) if i < len(y) else u for i, u in enumerate(x)])
            self.joins[a, b] = self.joins[b, a] = found
        return found

    def add(self, a: Level, b: Level) -> Level:
        if not b:
            return a
        if not a:
            return b
        key = (a, b) if a < b else (b, a)
        found = self._adds.get(key)
        if found is None:
            x, y = self._vectors[a], self._vectors[b]
            if len(x) < len(y):
                x, y = y, x
            found = self._adds[key] = self._intern(
                [u + y[i] if i < len(y) else u for i, u in enumerate(x)]
            )
        return found

    def total(self, a: Level) -> int:
        """The all-reduces run by a computation whose deepest levels are ``a``."""
        return sum(self._vectors[a])
