"""The cost model's vocabulary: a value's state, the tally of costs, and the moves a rule pays.

NOTE [auto cost model]: layouts flow forward through the jaxpr as GSPMD's
propagation would move them. Each equation picks, among the strategies its
operands suggest, the one with the least local cost: the collectives that bring
its operands to the layouts the strategy needs (``layouts.moves``) plus its
floating-point work divided over the devices that share it. A ``dot_general``
may shard each mesh axis over a batch, a free or a contracting dimension (the
last leaves a partial sum, reduced where a consumer needs it: all-reduce, or
reduce-scatter when the consumer shards the result over that axis); a
convolution likewise over its batch, input-feature (a partial sum) or
output-feature dimension; a gather keeps its indices' batch split and its
operand's split of whole slices, and leaves a partial sum where the operand is
split over the looked-up dimension (each device contributes its rows); a
scatter-add of updates split over their batch is a partial sum of the whole
table; elementwise operations take one operand's layout; reductions over a
sharded dimension leave a partial sum (``reduce_sum``) or all-reduce (max, min,
...); reshapes, transposes and broadcasts carry an axis along with its
dimension; operations along a dimension (cumulative sums, sort, windows, slices
and dynamic slices and updates) keep that dimension whole and the others as they
are; a sharding constraint moves its operand to its spec, but for its UNCONSTRAINED
dimensions, which keep the split they have; an operation the model does not know
gathers its operands. A value moved to one layout once is not moved there again (XLA
reuses it). Calls, ``remat``, custom derivatives and nested pjits are followed inside;
a ``scan`` body counts ``length`` times, a ``while`` body its trip count where the loop
counts a literal bound (``fori_loop``), else once, a ``cond`` its dearest branch.

Time is ``flops / FLOPS_PER_S + collective bytes / BYTES_PER_S + collectives *
LATENCY_S`` per device (``rates.py``) (docs/howto/auto.md states the model), the
collectives counted as XLA runs them: all-reduces its combiner merges count once
(NOTE [all-reduce combiner] in ``combiner.py``); memory is arguments
+ outputs + the peak of live temporaries - donated inputs an output of the same
per-device size can reuse. Temporaries are the values XLA materializes: results
of equations it does not fuse (dots, reductions, calls) and the fused values such
an equation reads; copies moved to a second layout count while the value lives.

This module holds what every rule reads and pays through (:class:`Values`); the
walk over a jaxpr is ``walk.py``; the rules are in ``contractions.py``,
``elementwise.py``, ``slices.py`` and ``control.py``, registered in ``rules.py``; the
work each equation does is ``flops.py``'s, the rates ``rates.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import jax_private as jp
from ...sharding.parsed import ParsedPartitionSpec
from . import rates
from .combiner import NONE, Group, Level, Levels
from .equations import itemsize_of, shape_of
from .flops import counted
from .layouts import (
    NO_AXES,
    REMATERIALIZE,
    Axes,
    Layout,
    canonical,
    local_elements,
    moves,
    replicated,
    shards,
)

State = tuple[Layout, Axes]  # a value's layout and the axes it is a partial sum over
#: A collective: kind, devices per group, operand bytes, what XLA's all-reduce combiner
#: merges it by (None: nothing; NOTE [all-reduce combiner] in ``combiner.py``).
Step = tuple[str, int, float, Group]


def spec_layout(spec: ParsedPartitionSpec, ndim: int, order: Sequence[str]) -> Layout:
    parts = list(spec.partitions) + [()] * (ndim - len(spec.partitions))
    return canonical([[str(axis) for axis in part] for part in parts[:ndim]], order)


@dataclass
class Tally:
    flops: float = 0.0
    collective_bytes: float = 0.0
    collectives: float = 0.0

    def pay(self, steps: Sequence[Step], mult: float) -> float:
        """Count the bytes of a move's collectives (groups of one device cost nothing) and
        those XLA's all-reduce combiner leaves alone; their bytes. The all-reduces it may
        merge are counted by the walk's levels (NOTE [all-reduce combiner])."""
        paid = 0.0
        for _, devices, nbytes, group in steps:
            if devices > 1:
                paid += nbytes
                if group is None:
                    self.collectives += mult
        self.collective_bytes += paid * mult
        return paid

    def add(self, other: Tally) -> None:
        self.flops += other.flops
        self.collective_bytes += other.collective_bytes
        self.collectives += other.collectives

    def seconds(self) -> float:
        return rates.seconds(self.flops, self.collective_bytes, self.collectives)


@dataclass
class Frame:
    """One jaxpr being walked: its values' states and the moves already paid for.

    ``moved`` holds, per value, the layouts it was moved to (in order); ``log``,
    while an equation is being recorded (NOTE [auto walk memo] in ``walk.py``),
    collects each move it pays: ``(value, layout, copy bytes)``. ``depth`` holds each
    value's levels (absent: none), ``top`` the deepest levels this computation reached;
    while an equation is applied, ``incs`` the groups it reduces per operand (the levels
    its copy of the operand sits above the operand), ``inc`` those it reduces its result
    over, and ``called`` what a call's body left (each result's levels and the deepest,
    over the join of the call's operands) (NOTE [all-reduce combiner] in ``combiner.py``).
    """

    env: dict[Any, State] = field(default_factory=dict)
    moved: dict[Any, tuple[Layout, ...]] = field(default_factory=dict)
    extra_bytes: dict[Any, float] = field(default_factory=dict)  # moved copies' bytes, by var
    extra_live: float = 0.0  # their sum while the originals are live
    log: list[tuple[Any, Layout, float]] | None = None
    outside: dict[Any, Outside] = field(default_factory=dict)  # a loop body's invariants
    depth: dict[Any, Level] = field(default_factory=dict)
    top: Level = NONE
    incs: dict[Any, Level] = field(default_factory=dict)
    inc: Level = NONE
    called: tuple[tuple[Level, ...], Level] | None = None

    def note_move(self, var: Any, dst: Layout, copy: float) -> None:
        self.moved[var] = self.moved.get(var, ()) + (dst,)
        self.extra_bytes[var] = self.extra_bytes.get(var, 0.0) + copy
        self.extra_live += copy


@dataclass(frozen=True)
class Outside:
    """A loop body's input that is the same on every trip, and where it comes from.

    NOTE [loop invariants]: XLA hoists a move of a loop-invariant value (the
    all-gather of a stack of layers split over its leading dimension, read a slice
    per trip by a ``fori_loop`` body) out of the loop: it runs once, on the value
    the loop reads, and a second loop reading the same value reuses it. A body's
    move of an invariant is paid so, as a move of ``var`` in the caller's ``frame``.
    """

    var: Any
    frame: Frame
    tally: Tally
    mult: float


class Values:
    """What a rule asks of the model about values: sizes, states, and the moves it pays.

    Pure functions of shapes and layouts are memoized (the mesh is fixed), since the
    search asks them again and again across assignments.
    """

    def __init__(self, mesh_shape: Mapping[str, int]) -> None:
        self.sizes = dict(mesh_shape)
        self.order = tuple(mesh_shape)
        self._locals: dict[tuple[tuple[int, ...], Layout], int] = {}
        self._steps: dict[Any, tuple[Step, ...]] = {}
        self._seconds: dict[Any, float] = {}
        self.levels = Levels()

    def local(self, shape: tuple[int, ...], layout: Layout) -> int:
        """Elements of one device's block of ``shape`` laid out as ``layout``."""
        key = (shape, layout)
        found = self._locals.get(key)
        if found is None:
            found = self._locals[key] = local_elements(shape, layout, self.sizes)
        return found

    def steps(self, var: Any, src: Layout, partial: Axes, dst: Layout) -> tuple[Step, ...]:
        """The collectives that move ``var`` from ``src`` (+ ``partial``) to ``dst``."""
        key = (shape_of(var), itemsize_of(var), src, partial, dst)
        found = self._steps.get(key)
        if found is None:
            found = self._steps[key] = tuple(moves(*key, self.sizes))
        return found

    def read(self, frame: Frame, var: Any) -> State:
        if isinstance(var, jp.Literal) or var not in frame.env:
            return (replicated(len(shape_of(var))), NO_AXES)
        return frame.env[var]

    def set(self, frame: Frame, var: Any, state: State) -> None:
        if not isinstance(var, jp.DropVar):
            frame.env[var] = state

    def nbytes(self, var: Any, layout: Layout) -> float:
        return float(self.local(shape_of(var), layout) * itemsize_of(var))

    def move(self, var: Any, dst: Layout, frame: Frame, tally: Tally, mult: float) -> float:
        """Bring ``var`` to ``dst``; the operand bytes of the collectives (counted once per layout)."""
        if isinstance(var, jp.Literal):
            return 0.0
        src, partial = self.read(frame, var)
        if src == dst and not partial:
            return 0.0
        if dst in frame.moved.get(var, ()):
            if partial:  # the reduced copy, read again: after its all-reduce
                self._reduced(frame, var, self.steps(var, src, partial, dst))
            return 0.0
        outside = frame.outside.get(var) if frame.outside else None
        if outside is not None:  # NOTE [loop invariants]
            frame.note_move(var, dst, 0.0)
            return self.move(outside.var, dst, outside.frame, outside.tally, outside.mult)
        steps = self.steps(var, src, partial, dst)
        cost = self.pay(frame, tally, steps, mult, var)
        # A move XLA makes by replicating the value holds all of it (NOTE [involuntary
        # rematerialization] in layouts.py); any other, the target's block.
        whole = any(step[0] == REMATERIALIZE for step in steps)
        copy = self.nbytes(var, replicated(len(shape_of(var))) if whole else dst)
        frame.note_move(var, dst, copy)
        if frame.log is not None:
            frame.log.append((var, dst, copy))
        return cost

    def move_cost(self, var: Any, dst: Layout, frame: Frame, partial: Axes | None = None) -> float:
        """The seconds :meth:`move` would cost, without paying them; ``partial``: those of
        ``var`` laid out as ``dst`` and a partial sum over these axes, reduced in place."""
        if isinstance(var, jp.Literal):
            return 0.0
        if partial is not None:
            src = dst
        else:
            src, partial = self.read(frame, var)
        if (src == dst and not partial) or dst in frame.moved.get(var, ()):
            return 0.0
        key = (shape_of(var), itemsize_of(var), src, partial, dst)
        found = self._seconds.get(key)
        if found is None:  # every collective counted: a rule weighs one move alone
            steps = [step for step in self.steps(var, src, partial, dst) if step[1] > 1]
            found = self._seconds[key] = rates.seconds(
                0.0, sum(step[2] for step in steps), len(steps)
            )
        return found

    def pay(
        self, frame: Frame, tally: Tally, steps: Sequence[Step], mult: float, var: Any = None
    ) -> float:
        """Pay ``steps`` in ``frame``'s computation, moving the operand ``var`` (None: the
        equation's result): the tally counts their bytes, the equation being applied the
        groups its all-reduces reduce (NOTE [all-reduce combiner]); their bytes."""
        if var is None:
            frame.inc = self.levels.join(frame.inc, self.levels.of_steps(tuple(steps)))
        else:
            self._reduced(frame, var, tuple(steps))
        return tally.pay(steps, mult)

    def _reduced(self, frame: Frame, var: Any, steps: tuple[Step, ...]) -> None:
        level = self.levels.of_steps(steps)
        if level:
            frame.incs[var] = self.levels.join(frame.incs.get(var, NONE), level)

    def resolve_partial(self, var: Any, state: State) -> Layout:
        """Where a partial output goes when nothing asks: reduce-scattered over its first
        free dimension that splits evenly, else all-reduced (less memory, fewer bytes)."""
        layout, partial = state
        if not partial:
            return layout
        partial_shards = shards(sorted(partial), self.sizes)
        shape = shape_of(var)
        for dim, axes in enumerate(layout):
            if shape[dim] % (shards(axes, self.sizes) * partial_shards) == 0:
                dims = [list(split) for split in layout]
                dims[dim] += sorted(partial)
                return canonical(dims, self.order)
        return layout

    def settle(
        self, var: Any, state: State, target: Layout | None, frame: Frame, tally: Tally, mult: float
    ) -> Layout:
        layout = target if target is not None else self.resolve_partial(var, state)
        if isinstance(var, jp.Literal):
            return layout
        self.move(var, layout, frame, tally, mult)
        return layout

    def settled(self, var: Any, frame: Frame, tally: Tally, mult: float) -> State:
        """``var``'s state with any partial sum reduced (where a rule needs whole values)."""
        state = self.read(frame, var)
        if not state[1]:
            return state
        return (self.settle(var, state, None, frame, tally, mult), NO_AXES)

    def work(self, eqn: Any, layout: Layout | None, tally: Tally, mult: float) -> None:
        """``eqn``'s flops (``flops.counted``) on one device's block of what it counts,
        laid out as ``layout`` (``None``: whole); dots count theirs as contractions."""
        for var, per_element in counted(eqn):
            block = replicated(len(shape_of(var))) if layout is None else layout
            tally.flops += self.local(shape_of(var), block) * per_element * mult

    def walk(
        self,
        jaxpr: Any,
        in_states: Sequence[State],
        tally: Tally,
        mult: float,
        outside: Mapping[int, Outside] | None = None,
        start: Level = NONE,
    ) -> Walked:
        """Walk a nested jaxpr (a call's or a loop's body) from these input states, its
        inputs at levels ``start`` (NOTE [all-reduce combiner]). ``outside``: the inputs
        (by position) that are loop invariants (NOTE [loop invariants]). The walk
        (``walk.py``) provides it."""
        raise NotImplementedError

    def gather_all(self, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
        """An operation the model does not know: operands replicated, outputs replicated."""
        for operand in eqn.invars:
            if not isinstance(operand, jp.Literal):
                self.move(operand, replicated(len(shape_of(operand))), frame, tally, mult)
        self.work(eqn, None, tally, mult)
        for result in eqn.outvars:
            self.set(frame, result, (replicated(len(shape_of(result))), NO_AXES))


@dataclass(frozen=True)
class Walked:
    """What a walk of a nested jaxpr found: its output states, a rough peak of its
    temporaries, its outputs' levels and the deepest it reached (NOTE [all-reduce
    combiner])."""

    outs: list[State]
    peak: float
    levels: list[Level]
    top: Level


#: A rule: applies one equation to the walk's frame (``(model, eqn, frame, tally,
#: mult)``) and returns the peak bytes of its inner temporaries (calls; else 0).
Rule = Callable[[Any, Any, Frame, Tally, float], float]


def no_peak(apply: Callable[[Any, Any, Frame, Tally, float], None]) -> Rule:
    """A rule for an equation without inner temporaries (``apply`` returns nothing)."""

    def rule(model: Any, eqn: Any, frame: Frame, tally: Tally, mult: float) -> float:
        apply(model, eqn, frame, tally, mult)
        return 0.0

    rule.__name__ = rule.__qualname__ = getattr(apply, "__name__", "rule")
    return rule


def aliased(
    arg_bytes: Sequence[float], donated: Sequence[bool], out_bytes: Sequence[float]
) -> float:
    """Bytes of donated inputs an output of the same per-device size takes over."""
    pool = sorted(
        (nbytes for nbytes, given in zip(arg_bytes, donated, strict=True) if given), reverse=True
    )
    total = 0.0
    for nbytes in sorted(out_bytes, reverse=True):
        if nbytes in pool:
            pool.remove(nbytes)
            total += nbytes
    return total
