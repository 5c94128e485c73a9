"""One pass of the cost model over a jaxpr, for one assignment of input layouts.

NOTE [auto walk memo]: an equation's effect on the walk (its results' states, the
moves it pays, its tally, its inner peak) is a function of its structure (the
primitive, its params, its operands' and results' types) and of what it reads:
its operands' states and the layouts each operand was already moved to. The walk
keys that effect by both and replays it when they recur. So re-scoring an
assignment that changes one leaf recomputes only the equations whose operands'
states that leaf changes, and equal layers (unrolled copies of one block, the
body of a scan walked again) are worked out once and replayed for the others:
a pass over an N-layer program costs one layer's rules plus N cheap lookups.
Bodies are keyed by their text (``str(jaxpr)`` names variables canonically), so
two traces of one layer share their effects. The levels an equation gives its results
(NOTE [all-reduce combiner] in ``combiner.py``) depend on its operands' levels, which
the key leaves out (they differ from layer to layer, which would leave nothing to
replay): the effect keeps them relative to the join of its operands' levels, which
the replay adds back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ... import jax_private as jp
from ...primitives.auto_choice import Estimate
from .combiner import NONE, Level
from .equations import Structures, call_body, is_elementwise, itemsize_of, shape_of
from .flops import REDUCE_BY_SUM, REDUCE_OTHER
from .layouts import NO_AXES, Layout, replicated
from .rates import BYTES_PER_S, FLOPS_PER_S, LATENCY_S
from .rules import RULES, rule_for
from .values import Frame, Outside, Rule, State, Tally, Values, Walked, aliased


@dataclass(frozen=True)
class Effect:
    """What one equation did to the walk (NOTE [auto walk memo]): each result's state
    (None: not set), each move as (operand position, layout, copy bytes), the tally
    (flops, collective bytes, collectives) and the inner peak; ``levels``, where it
    reduces anything: the levels each operand's copy sits above the operand (in the
    order of its operands that are no literals), then each result's levels and the
    deepest reached over the join of those copies' (None: nothing reduced, its results
    at the join of its operands' levels; NOTE [all-reduce combiner])."""

    outs: tuple[State | None, ...]
    moves: tuple[tuple[int, Layout, float], ...]
    tally: tuple[float, float, float]
    peak: float
    levels: tuple[tuple[Level, ...], tuple[Level, ...], Level] | None = None


class Estimator(Values):
    """Scores assignments of input layouts for one jaxpr over one mesh (NOTE [auto cost
    model], NOTE [auto walk memo]). ``applied`` counts equations worked out by their
    rule (the others were replayed)."""

    def __init__(self, jaxpr: Any, mesh_shape: Any) -> None:
        super().__init__(mesh_shape)
        self.jaxpr = jaxpr  # a ClosedJaxpr
        top = jaxpr.jaxpr
        self._eqns: dict[int, tuple[int, Rule, tuple[Any, ...]]] = {}  # by id(eqn)
        self.structures = Structures()
        self._memo: dict[Any, Effect] = {}
        self._sized: dict[Any, tuple[tuple[int, ...], int]] = {}  # a nested value's shape, item
        self.applied = 0
        plan = _top_plan(top, _last_uses(top), _materialized(top))
        self._top = [
            (
                self.structures.of(eqn),
                tuple(var for var in eqn.invars if not isinstance(var, jp.Literal)),
                tuple(eqn.outvars),
                *memory,
            )
            for eqn, memory in zip(top.eqns, plan, strict=True)
        ]

    def run(
        self,
        in_layouts: Sequence[Layout],
        out_targets: Sequence[Layout | None],
        donated: Sequence[bool],
    ) -> tuple[Estimate, list[Layout]]:
        """Estimate the program with these input layouts.

        ``out_targets``: per output, the layout it must end in, or None (the
        propagated layout, partial sums reduced). Returns the estimate and each
        output's final layout.
        """
        tally = Tally()
        frame = Frame()
        jaxpr = self.jaxpr.jaxpr
        for var in jaxpr.constvars:
            frame.env[var] = (replicated(len(shape_of(var))), NO_AXES)
        for var, layout in zip(jaxpr.invars, in_layouts, strict=True):
            frame.env[var] = (layout, NO_AXES)
        peak = self._walk_top(jaxpr, frame, tally)
        outs: list[Layout] = []
        levels = self.levels
        for var, target in zip(jaxpr.outvars, out_targets, strict=True):
            frame.incs = {}
            outs.append(self.settle(var, self.read(frame, var), target, frame, tally, 1.0))
            if frame.incs and not isinstance(var, jp.Literal):
                reached = levels.add(frame.depth.get(var, NONE), frame.incs[var])
                frame.top = levels.join(frame.top, reached)
        tally.collectives += levels.total(frame.top)  # NOTE [all-reduce combiner]
        arg_bytes = [
            self.nbytes(var, lay) for var, lay in zip(jaxpr.invars, in_layouts, strict=True)
        ]
        out_bytes = [self.nbytes(var, lay) for var, lay in zip(jaxpr.outvars, outs, strict=True)]
        memory = sum(arg_bytes) + sum(out_bytes) + peak - aliased(arg_bytes, donated, out_bytes)
        compute = tally.flops / FLOPS_PER_S
        comm = tally.collective_bytes / BYTES_PER_S + tally.collectives * LATENCY_S
        estimate = Estimate(
            time_s=compute + comm,
            compute_s=compute,
            comm_s=comm,
            collective_bytes=tally.collective_bytes,
            collectives=tally.collectives,
            memory_bytes=memory,
        )
        return estimate, outs

    def _walk_top(self, jaxpr: Any, frame: Frame, tally: Tally) -> float:
        """Walk the top-level equations, tracking live temporaries; their peak in bytes.

        The hot loop of the search: an equation whose key recurs (NOTE [auto walk
        memo]) is replayed here inline, without a call, its tally summed in locals."""
        live = 0.0
        peak = 0.0
        flops = collective_bytes = collectives = 0.0
        env, moved, extra, depth = frame.env, frame.moved, frame.extra_bytes, frame.depth
        env_get, moved_get, depth_get = env.get, moved.get, depth.get
        sizes = self._locals
        memo = self._memo
        join, add, joins = self.levels.join, self.levels.add, self.levels.joins
        for eqn, (structure, operands, outvars, counted, last, freed) in zip(
            jaxpr.eqns, self._top, strict=True
        ):
            if len(operands) == 1:
                var = operands[0]
                key: tuple[Any, ...] = (structure, 1.0, env_get(var), moved_get(var))
                base = depth_get(var, NONE)
            else:
                key = (
                    structure,
                    1.0,
                    tuple([env_get(var) for var in operands]),
                    tuple([moved_get(var) for var in operands]),
                )
                base = NONE
                for var in operands:  # the join of their levels (NOTE [all-reduce combiner])
                    level = depth_get(var, NONE)
                    if level != base and level:
                        base = (joins.get((base, level)) or join(base, level)) if base else level
            effect = memo.get(key)
            if effect is None:
                inner = self._apply(eqn, frame, tally, 1.0, key, operands)
            else:
                inner = effect.peak
                if effect.moves:
                    for pos, dst, copy in effect.moves:
                        frame.note_move(eqn.invars[pos], dst, copy)
                eqn_flops, eqn_bytes, eqn_collectives = effect.tally
                flops += eqn_flops
                collective_bytes += eqn_bytes
                collectives += eqn_collectives
                levels = effect.levels
                if levels is None:
                    for var, state in zip(outvars, effect.outs):
                        if state is not None:
                            env[var] = state
                            if base:
                                depth[var] = base
                else:
                    base = NONE
                    for var, inc in zip(operands, levels[0], strict=True):
                        base = join(base, add(depth_get(var, NONE), inc))
                    for var, state, level in zip(outvars, effect.outs, levels[1], strict=True):
                        if state is not None:
                            env[var] = state
                            depth[var] = add(base, level)
                    frame.top = join(frame.top, add(base, levels[2]))
            produced = 0.0
            for var, shape, item in counted:
                state = env_get(var)
                if state is not None:
                    found = sizes.get((shape, state[0]))
                    if found is None:
                        found = self.local(shape, state[0])
                    produced += found * item
            here = live + frame.extra_live + produced + inner
            if here > peak:
                peak = here
            live += produced
            for var in last:
                frame.extra_live -= extra.pop(var, 0.0)
            for var, shape, item in freed:
                layout = env[var][0]
                found = sizes.get((shape, layout))
                if found is None:
                    found = self.local(shape, layout)
                live -= found * item
        tally.flops += flops
        tally.collective_bytes += collective_bytes
        tally.collectives += collectives
        return peak

    def walk(
        self,
        jaxpr: Any,
        in_states: Sequence[State],
        tally: Tally,
        mult: float,
        outside: Mapping[int, Outside] | None = None,
        start: Level = NONE,
    ) -> Walked:
        frame = Frame()
        if outside:
            frame.outside = {jaxpr.invars[i]: invariant for i, invariant in outside.items()}
        for var in jaxpr.constvars:
            frame.env[var] = (replicated(len(shape_of(var))), NO_AXES)
        for var, state in zip(jaxpr.invars, in_states, strict=True):
            frame.env[var] = state
        if start:
            frame.top = start
            frame.depth.update((var, start) for var in (*jaxpr.constvars, *jaxpr.invars))
        peak = 0.0
        env, sizes, sized = frame.env, self._locals, self._sized
        for eqn in jaxpr.eqns:
            inner = self._eqn(eqn, frame, tally, mult)
            made = 0.0
            for var in eqn.outvars:
                made_state = env.get(var)
                if made_state is not None:
                    shape, item = sized.get(var) or self._size(var)
                    found = sizes.get((shape, made_state[0]))
                    if found is None:
                        found = self.local(shape, made_state[0])
                    made += found * item
            if inner + made > peak:
                peak = inner + made
        return Walked(
            [self.read(frame, var) for var in jaxpr.outvars],
            peak,
            [  # a literal result (a branch's constant) depends on no collective
                NONE if isinstance(var, jp.Literal) else frame.depth.get(var, start)
                for var in jaxpr.outvars
            ],
            frame.top,
        )

    def _size(self, var: Any) -> tuple[tuple[int, ...], int]:
        found = self._sized[var] = (shape_of(var), itemsize_of(var))
        return found

    # --- equations, remembered (NOTE [auto walk memo]) ---

    def _eqn(self, eqn: Any, frame: Frame, tally: Tally, mult: float) -> float:
        """Apply one equation (replayed where its structure and inputs recur); the peak
        bytes of its inner temporaries (calls only)."""
        structure, _, operands = self._kind(eqn)
        env, moved = frame.env, frame.moved
        if len(operands) == 1:
            (var,) = operands
            key: tuple[Any, ...] = (structure, mult, env.get(var), moved.get(var))
        else:
            key = (
                structure,
                mult,
                tuple([env.get(var) for var in operands]),
                tuple([moved.get(var) for var in operands]),
            )
        if frame.outside and any(var in frame.outside for var in operands):
            return self._apply(eqn, frame, tally, mult, None, operands)  # pays outside
        effect = self._memo.get(key)
        if effect is None:
            return self._apply(eqn, frame, tally, mult, key, operands)
        return self._replay(effect, eqn, frame, tally, operands)

    def _kind(self, eqn: Any) -> tuple[int, Rule, tuple[Any, ...]]:
        """What kind of equation it is (it depends on the jaxpr alone): its structure,
        its rule and its operands that are not literals."""
        found = self._eqns.get(id(eqn))
        if found is None:
            operands = tuple(var for var in eqn.invars if not isinstance(var, jp.Literal))
            found = self._eqns[id(eqn)] = (self.structures.of(eqn), rule_for(eqn, self), operands)
        return found

    def _apply(
        self, eqn: Any, frame: Frame, tally: Tally, mult: float, key: Any, operands: Any
    ) -> float:
        """Work ``eqn`` out by its rule and remember its effect under ``key`` (None: not);
        ``operands``: its operands that are no literals."""
        self.applied += 1
        rule = self._kind(eqn)[1]
        eqn_tally = Tally()
        log: list[Any] = []
        frame.log = log
        frame.incs, frame.inc, frame.called = {}, NONE, None
        try:
            peak = rule(self, eqn, frame, eqn_tally, mult)
        finally:
            frame.log = None
        tally.add(eqn_tally)
        levels = self._levels(eqn, frame, operands)
        position = {var: i for i, var in reversed(list(enumerate(eqn.invars)))
                    if not isinstance(var, jp.Literal)}  # fmt: skip
        if key is not None and all(var in position for var, _, _ in log):
            env = frame.env
            self._memo[key] = Effect(
                outs=tuple(
                    env.get(var) if not isinstance(var, jp.DropVar) else None for var in eqn.outvars
                ),
                moves=tuple((position[var], dst, copy) for var, dst, copy in log),
                tally=(eqn_tally.flops, eqn_tally.collective_bytes, eqn_tally.collectives),
                peak=peak,
                levels=levels,
            )
        return peak

    def _levels(
        self, eqn: Any, frame: Frame, operands: Any
    ) -> tuple[tuple[Level, ...], tuple[Level, ...], Level] | None:
        """Set the levels of ``eqn``'s results once its rule ran (NOTE [all-reduce
        combiner]): the join of its operands' copies' levels plus what it reduced its
        result over, or what its body left where it is a call; what it reduced (None:
        nothing, the results at the join of its operands' levels)."""
        levels, depth = self.levels, frame.depth
        incs = tuple(frame.incs.get(var, NONE) for var in operands) if frame.incs else None
        base = NONE
        for i, var in enumerate(operands):
            base = levels.join(base, levels.add(depth.get(var, NONE), incs[i] if incs else NONE))
        if frame.called is not None:
            outs, top = frame.called
        else:
            outs, top = (frame.inc,) * len(eqn.outvars), frame.inc
        frame.incs, frame.inc, frame.called = {}, NONE, None
        for var, level in zip(eqn.outvars, outs, strict=True):
            if var in frame.env:
                reached = levels.add(base, level)
                if reached:
                    depth[var] = reached
        if incs is None and not top and not any(outs):
            return None
        frame.top = levels.join(frame.top, levels.add(base, top))
        return incs or (NONE,) * len(operands), outs, top

    def _replay(self, effect: Effect, eqn: Any, frame: Frame, tally: Tally, operands: Any) -> float:
        """An equation's remembered effect, applied (inline in ``_walk_top``, for speed)."""
        invars = eqn.invars
        for pos, dst, copy in effect.moves:
            frame.note_move(invars[pos], dst, copy)
        tally.flops += effect.tally[0]
        tally.collective_bytes += effect.tally[1]
        tally.collectives += effect.tally[2]
        env, depth = frame.env, frame.depth
        levels = effect.levels
        if levels is None:
            base = NONE
            joins = self.levels.joins
            for var in operands:
                level = depth.get(var, NONE)
                if level != base and level:
                    base = (
                        (joins.get((base, level)) or self.levels.join(base, level))
                        if base
                        else level
                    )
            for var, state in zip(eqn.outvars, effect.outs):
                if state is not None:
                    env[var] = state
                    if base:
                        depth[var] = base
            return effect.peak
        join, add = self.levels.join, self.levels.add
        base = NONE
        for var, inc in zip(operands, levels[0], strict=True):
            base = join(base, add(depth.get(var, NONE), inc))
        for var, state, level in zip(eqn.outvars, effect.outs, levels[1], strict=True):
            if state is not None:
                env[var] = state
                reached = add(base, level)
                if reached:
                    depth[var] = reached
        frame.top = join(frame.top, add(base, levels[2]))
        return effect.peak


# --- what the top-level walk counts as memory (NOTE [auto cost model]) ---


def _last_uses(jaxpr: Any) -> dict[Any, int]:
    last: dict[Any, int] = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for var in eqn.invars:
            if not isinstance(var, jp.Literal):
                last[var] = i
    for var in jaxpr.outvars:
        if not isinstance(var, jp.Literal):
            last[var] = len(jaxpr.eqns)
    return last


def _fusible(eqn: Any) -> bool:
    """Whether XLA fuses this equation into its consumers (elementwise and layout ops)."""
    name = eqn.primitive.name
    return name in ("broadcast_in_dim", "reshape", "transpose", "squeeze", "expand_dims") or (
        name not in RULES and call_body(eqn) is None and is_elementwise(eqn)
    )


def _materialized(jaxpr: Any) -> set[Any]:
    """The values XLA keeps in memory: results of unfusible equations, and fused
    results an unfusible equation (a dot, a call) reads."""
    kept: set[Any] = set()
    for eqn in jaxpr.eqns:
        if not _fusible(eqn):
            kept.update(eqn.outvars)
            if eqn.primitive.name not in REDUCE_BY_SUM | REDUCE_OTHER:
                kept.update(var for var in eqn.invars if not isinstance(var, jp.Literal))
    return kept


def _top_plan(
    jaxpr: Any, last_use: dict[Any, int], materialized: set[Any]
) -> list[tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]]:
    """Per top-level equation: the results it adds to the live temporaries, the
    operands it reads last, and those of them that leave the live temporaries (each
    counted one with its shape and item size)."""
    pinned = {var for var in jaxpr.outvars if not isinstance(var, jp.Literal)}
    pinned |= set(jaxpr.invars) | set(jaxpr.constvars)  # counted as arguments/outputs

    def sized(values: Any) -> tuple[Any, ...]:
        kept = (var for var in values if var not in pinned and var in materialized)
        return tuple((var, shape_of(var), itemsize_of(var)) for var in kept)

    plan = []
    for i, eqn in enumerate(jaxpr.eqns):
        last = tuple(dict.fromkeys(
            var for var in eqn.invars if not isinstance(var, jp.Literal) and last_use.get(var) == i
        ))  # fmt: skip
        plan.append((sized(eqn.outvars), last, sized(last)))
    return plan
