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
two traces of one layer share their effects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ... import jax_private as jp
from ...primitives.auto_choice import Estimate
from .equations import Structures, call_body, is_elementwise, itemsize_of, shape_of
from .flops import REDUCE_BY_SUM, REDUCE_OTHER
from .layouts import NO_AXES, Layout, replicated
from .rates import BYTES_PER_S, FLOPS_PER_S, LATENCY_S
from .rules import RULES, rule_for
from .values import Frame, Outside, Rule, State, Tally, Values, aliased


@dataclass(frozen=True)
class Effect:
    """What one equation did to the walk (NOTE [auto walk memo]): each result's state
    (None: not set), each move as (operand position, layout, copy bytes), the tally
    (flops, collective bytes, collectives) and the inner peak."""

    outs: tuple[State | None, ...]
    moves: tuple[tuple[int, Layout, float], ...]
    tally: tuple[float, float, float]
    peak: float


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
        self.applied = 0
        plan = _top_plan(top, _last_uses(top), _materialized(top))
        self._top = [
            (
                self.structures.of(eqn),
                tuple(var for var in eqn.invars if not isinstance(var, jp.Literal)),
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
        for var, target in zip(jaxpr.outvars, out_targets, strict=True):
            outs.append(self.settle(var, self.read(frame, var), target, frame, tally, 1.0))
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
        memo]) is replayed here inline, without a call."""
        live = 0.0
        peak = 0.0
        env, moved, extra = frame.env, frame.moved, frame.extra_bytes
        block = self._block_bytes
        memo = self._memo
        for eqn, (structure, operands, counted, last, freed) in zip(
            jaxpr.eqns, self._top, strict=True
        ):
            if len(operands) == 1:
                var = operands[0]
                key: tuple[Any, ...] = (structure, 1.0, env.get(var), moved.get(var))
            else:
                key = (
                    structure,
                    1.0,
                    tuple([env.get(var) for var in operands]),
                    tuple([moved.get(var) for var in operands]),
                )
            effect = memo.get(key)
            if effect is None:
                inner = self._apply(eqn, frame, tally, 1.0, key)
            else:
                inner = effect.peak
                if effect.moves:
                    for pos, dst, copy in effect.moves:
                        frame.note_move(eqn.invars[pos], dst, copy)
                flops, collective_bytes, collectives = effect.tally
                tally.flops += flops
                tally.collective_bytes += collective_bytes
                tally.collectives += collectives
                for var, state in zip(eqn.outvars, effect.outs, strict=True):
                    if state is not None:
                        env[var] = state
            produced = 0.0
            for var, shape, item in counted:
                state = env.get(var)
                if state is not None:
                    produced += block(shape, item, state[0])
            here = live + frame.extra_live + produced + inner
            if here > peak:
                peak = here
            live += produced
            for var in last:
                frame.extra_live -= extra.pop(var, 0.0)
            for var, shape, item in freed:
                live -= block(shape, item, env[var][0])
        return peak

    def _block_bytes(self, shape: tuple[int, ...], itemsize: int, layout: Layout) -> float:
        found = self._locals.get((shape, layout))
        if found is None:
            found = self.local(shape, layout)
        return float(found * itemsize)

    def walk(
        self,
        jaxpr: Any,
        in_states: Sequence[State],
        tally: Tally,
        mult: float,
        outside: Mapping[int, Outside] | None = None,
    ) -> tuple[list[State], float]:
        frame = Frame()
        if outside:
            frame.outside = {jaxpr.invars[i]: invariant for i, invariant in outside.items()}
        for var in jaxpr.constvars:
            frame.env[var] = (replicated(len(shape_of(var))), NO_AXES)
        for var, state in zip(jaxpr.invars, in_states, strict=True):
            frame.env[var] = state
        peak = 0.0
        for eqn in jaxpr.eqns:
            inner = self._eqn(eqn, frame, tally, mult)
            made = sum(
                self.nbytes(var, frame.env[var][0]) for var in eqn.outvars if var in frame.env
            )
            peak = max(peak, inner + made)
        return [self.read(frame, var) for var in jaxpr.outvars], peak

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
            return self._apply(eqn, frame, tally, mult, None)  # pays outside: not replayable
        effect = self._memo.get(key)
        if effect is None:
            return self._apply(eqn, frame, tally, mult, key)
        return _replay(effect, eqn, frame, tally)

    def _kind(self, eqn: Any) -> tuple[int, Rule, tuple[Any, ...]]:
        """What kind of equation it is (it depends on the jaxpr alone): its structure,
        its rule and its operands that are not literals."""
        found = self._eqns.get(id(eqn))
        if found is None:
            operands = tuple(var for var in eqn.invars if not isinstance(var, jp.Literal))
            found = self._eqns[id(eqn)] = (self.structures.of(eqn), rule_for(eqn, self), operands)
        return found

    def _apply(self, eqn: Any, frame: Frame, tally: Tally, mult: float, key: Any) -> float:
        """Work ``eqn`` out by its rule and remember its effect under ``key`` (None: not)."""
        self.applied += 1
        rule = self._kind(eqn)[1]
        eqn_tally = Tally()
        log: list[Any] = []
        frame.log = log
        try:
            peak = rule(self, eqn, frame, eqn_tally, mult)
        finally:
            frame.log = None
        tally.add(eqn_tally)
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
            )
        return peak


def _replay(effect: Effect, eqn: Any, frame: Frame, tally: Tally) -> float:
    """An equation's remembered effect, applied (inline in ``_walk_top``, for speed)."""
    invars = eqn.invars
    for pos, dst, copy in effect.moves:
        frame.note_move(invars[pos], dst, copy)
    tally.flops += effect.tally[0]
    tally.collective_bytes += effect.tally[1]
    tally.collectives += effect.tally[2]
    env = frame.env
    for var, state in zip(eqn.outvars, effect.outs, strict=True):
        if state is not None:
            env[var] = state
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
