"""The cost model: one pass over a jaxpr, given its inputs' layouts, to an :class:`Estimate`.

NOTE [auto cost model]: layouts flow forward through the jaxpr as GSPMD's
propagation would move them. Each equation picks, among the strategies its
operands suggest, the one with the least local cost: the collectives that bring
its operands to the layouts the strategy needs (``layouts.moves``) plus its
floating-point work divided over the devices that share it. A ``dot_general``
may shard each mesh axis over a batch, a free or a contracting dimension (the
last leaves a partial sum, reduced where a consumer needs it: all-reduce, or
reduce-scatter when the consumer shards the result over that axis); elementwise
operations take one operand's layout; reductions over a sharded dimension leave a
partial sum (``reduce_sum``) or all-reduce (max, min, ...); reshapes, transposes
and broadcasts carry an axis along with its dimension; an operation the model
does not know gathers its operands. A value moved to one layout once is not
moved there again (XLA reuses it). Calls, ``remat``, custom derivatives and
nested pjits are followed inside; a ``scan`` body counts ``length`` times, a
``while`` body once (its trip count is unknown), a ``cond`` its dearest branch.

Time is ``flops / FLOPS_PER_S + collective bytes / BYTES_PER_S + collectives *
LATENCY_S`` per device (docs/howto/auto.md states the model); memory is arguments
+ outputs + the peak of live temporaries - donated inputs an output of the same
per-device size can reuse. Temporaries are the values XLA materializes: results
of equations it does not fuse (dots, reductions, calls) and the fused values such
an equation reads; copies moved to a second layout count while the value lives.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import jax_private as jp
from ..primitives.constraint import sharding_constraint_p
from ..primitives.pjit_call import pjit_p
from ..sharding.auto import Estimate
from ..sharding.parsed import ParsedPartitionSpec
from .layouts import (
    NO_AXES,
    Axes,
    Layout,
    canonical,
    local_elements,
    moves,
    replicated,
    shards,
    used_axes,
)

#: Modelled floating-point rate of one device (FLOP/s).
FLOPS_PER_S = 1e11
#: Modelled collective bandwidth of one device (operand bytes/s).
BYTES_PER_S = 1e10
#: Modelled fixed cost of launching one collective (s): splitting a tiny vector to
#: save a few bytes is not worth a collective more.
LATENCY_S = 2e-6

State = tuple[Layout, Axes]  # a value's layout and the axes it is a partial sum over

# Linear in each operand marked True: a partial sum may pass through (NOTE [auto cost model]).
_LINEAR: dict[str, tuple[bool, ...] | None] = {
    "add": None,  # None: every operand must carry the same partial axes
    "sub": None,
    "add_any": None,
    "neg": (True,),
    "convert_element_type": (True,),
    "copy": (True,),
    "copy_p": (True,),
    "mul": (True, True),  # one operand partial, the other not
    "div": (True, False),
}
REDUCE_BY_SUM = {"reduce_sum"}
REDUCE_OTHER = {
    "reduce_max",
    "reduce_min",
    "reduce_prod",
    "argmax",
    "argmin",
    "reduce_and",
    "reduce_or",
}
ALONG_AXIS = {"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "sort", "rev"}


def spec_layout(spec: ParsedPartitionSpec, ndim: int, order: Sequence[str]) -> Layout:
    parts = list(spec.partitions) + [()] * (ndim - len(spec.partitions))
    return canonical([[str(a) for a in p] for p in parts[:ndim]], order)


def shape_of(v: Any) -> tuple[int, ...]:
    return getattr(v.aval, "shape", ())  # a tuple already: no copy on this hot path


def itemsize_of(v: Any) -> int:
    """Bytes per element; an extended dtype (a typed key) counts its physical words."""
    aval = v.aval
    if getattr(aval, "dtype", None) is None:
        return 0
    if jp.is_extended(aval):
        physical = jp.physical_aval(aval)
        extra = math.prod(physical.shape[len(aval.shape) :])
        return int(physical.dtype.itemsize * extra)
    return int(aval.dtype.itemsize)


@dataclass
class Tally:
    flops: float = 0.0
    collective_bytes: float = 0.0
    collectives: float = 0.0

    def pay(self, steps: Sequence[tuple[str, int, float]], mult: float) -> float:
        """Count the collectives of a move (groups of one device cost nothing); their bytes."""
        paid = [b for _, n, b in steps if n > 1]
        self.collective_bytes += sum(paid) * mult
        self.collectives += len(paid) * mult
        return sum(paid)

    def seconds(self) -> float:
        return (
            self.flops / FLOPS_PER_S
            + self.collective_bytes / BYTES_PER_S
            + self.collectives * LATENCY_S
        )


@dataclass
class Frame:
    """One jaxpr being walked: its values' states and the moves already paid for."""

    env: dict[Any, State] = field(default_factory=dict)
    moved: set[tuple[Any, Layout]] = field(default_factory=set)
    extra_bytes: dict[Any, float] = field(default_factory=dict)  # moved copies' bytes, by var
    extra_live: float = 0.0  # their sum while the originals are live


class Estimator:
    """Scores assignments of input layouts for one jaxpr over one mesh (NOTE [auto cost model])."""

    def __init__(self, jaxpr: Any, mesh_shape: Mapping[str, int]) -> None:
        self.jaxpr = jaxpr  # a ClosedJaxpr
        self.sizes = dict(mesh_shape)
        self.order = tuple(mesh_shape)
        self._last_use = _last_uses(jaxpr.jaxpr)
        self._materialized = _materialized(jaxpr.jaxpr)
        # Pure functions of shapes and layouts, asked again and again across
        # assignments: memoized per estimator (the mesh is fixed).
        self._locals: dict[tuple[tuple[int, ...], Layout], int] = {}
        self._steps: dict[Any, tuple[tuple[str, int, float], ...]] = {}
        self._seconds: dict[Any, float] = {}
        self._rules: dict[int, Callable[[Any, Frame, Tally, float], float]] = {}  # by id(eqn)

    # --- the walk ---

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
        for v in jaxpr.constvars:
            frame.env[v] = (replicated(len(shape_of(v))), NO_AXES)
        for v, layout in zip(jaxpr.invars, in_layouts, strict=True):
            frame.env[v] = (layout, NO_AXES)
        peak = self._walk_top(jaxpr, frame, tally)
        outs: list[Layout] = []
        for v, target in zip(jaxpr.outvars, out_targets, strict=True):
            state = self.read(frame, v)
            outs.append(self.settle(v, state, target, frame, tally, 1.0))
        arg_bytes = [self.nbytes(v, lay) for v, lay in zip(jaxpr.invars, in_layouts, strict=True)]
        out_bytes = [self.nbytes(v, lay) for v, lay in zip(jaxpr.outvars, outs, strict=True)]
        aliased = _aliased(arg_bytes, donated, out_bytes)
        memory = sum(arg_bytes) + sum(out_bytes) + peak - aliased
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
        """Walk the top-level equations, tracking live temporaries; their peak in bytes."""
        pinned = {v for v in jaxpr.outvars if not isinstance(v, jp.Literal)}
        pinned |= set(jaxpr.invars) | set(jaxpr.constvars)  # counted as arguments/outputs
        live = 0.0
        peak = 0.0
        for i, eqn in enumerate(jaxpr.eqns):
            inner = self._eqn(eqn, frame, tally, 1.0)
            produced = sum(
                self.nbytes(v, frame.env[v][0])
                for v in eqn.outvars
                if v in frame.env and v not in pinned and v in self._materialized
            )
            peak = max(peak, live + frame.extra_live + produced + inner)
            live += produced
            for v in eqn.invars:
                if isinstance(v, jp.Literal) or self._last_use.get(v) != i:
                    continue
                frame.extra_live -= frame.extra_bytes.pop(v, 0.0)
                if v not in pinned and v in self._materialized:
                    live -= self.nbytes(v, frame.env[v][0])
        return peak

    def _walk(
        self, jaxpr: Any, in_states: Sequence[State], tally: Tally, mult: float
    ) -> tuple[list[State], float]:
        """Walk a nested jaxpr; its output states and a rough peak of its temporaries."""
        frame = Frame()
        for v in jaxpr.constvars:
            frame.env[v] = (replicated(len(shape_of(v))), NO_AXES)
        for v, s in zip(jaxpr.invars, in_states, strict=True):
            frame.env[v] = s
        peak = 0.0
        for eqn in jaxpr.eqns:
            inner = self._eqn(eqn, frame, tally, mult)
            peak = max(
                peak,
                inner + sum(self.nbytes(v, frame.env[v][0]) for v in eqn.outvars if v in frame.env),
            )
        return [self.read(frame, v) for v in jaxpr.outvars], peak

    # --- values ---

    def local(self, shape: tuple[int, ...], layout: Layout) -> int:
        """Elements of one device's block of ``shape`` laid out as ``layout``."""
        key = (shape, layout)
        found = self._locals.get(key)
        if found is None:
            found = self._locals[key] = local_elements(shape, layout, self.sizes)
        return found

    def steps(
        self, v: Any, src: Layout, partial: Axes, dst: Layout
    ) -> tuple[tuple[str, int, float], ...]:
        """The collectives that move ``v`` from ``src`` (+ ``partial``) to ``dst``."""
        key = (shape_of(v), itemsize_of(v), src, partial, dst)
        found = self._steps.get(key)
        if found is None:
            found = self._steps[key] = tuple(moves(*key, self.sizes))
        return found

    def read(self, frame: Frame, v: Any) -> State:
        if isinstance(v, jp.Literal) or v not in frame.env:
            return (replicated(len(shape_of(v))), NO_AXES)
        return frame.env[v]

    def nbytes(self, v: Any, layout: Layout) -> float:
        return float(self.local(shape_of(v), layout) * itemsize_of(v))

    def move(self, v: Any, dst: Layout, frame: Frame, tally: Tally, mult: float) -> float:
        """Bring ``v`` to ``dst``; the operand bytes of the collectives (counted once per layout)."""
        if isinstance(v, jp.Literal):
            return 0.0
        src, partial = self.read(frame, v)
        if src == dst and not partial:
            return 0.0
        key = (v, dst)
        if key in frame.moved:
            return 0.0
        cost = tally.pay(self.steps(v, src, partial, dst), mult)
        frame.moved.add(key)
        copy = self.nbytes(v, dst)
        frame.extra_bytes[v] = frame.extra_bytes.get(v, 0.0) + copy
        frame.extra_live += copy
        return cost

    def move_cost(self, v: Any, dst: Layout, frame: Frame) -> float:
        """The seconds :meth:`move` would cost, without paying them."""
        if isinstance(v, jp.Literal):
            return 0.0
        src, partial = self.read(frame, v)
        if (src == dst and not partial) or (v, dst) in frame.moved:
            return 0.0
        key = (shape_of(v), itemsize_of(v), src, partial, dst)
        found = self._seconds.get(key)
        if found is None:
            t = Tally()
            t.pay(self.steps(v, src, partial, dst), 1.0)
            found = self._seconds[key] = t.seconds()
        return found

    def resolve_partial(self, v: Any, state: State) -> Layout:
        """Where a partial output goes when nothing asks: reduce-scattered over its first
        free dimension that splits evenly, else all-reduced (less memory, fewer bytes)."""
        layout, partial = state
        if not partial:
            return layout
        n = shards(sorted(partial), self.sizes)
        shape = shape_of(v)
        for d, axes in enumerate(layout):
            if shape[d] % (shards(axes, self.sizes) * n) == 0:
                dims = [list(x) for x in layout]
                dims[d] += sorted(partial)
                return canonical(dims, self.order)
        return layout

    def settle(
        self, v: Any, state: State, target: Layout | None, frame: Frame, tally: Tally, mult: float
    ) -> Layout:
        layout = target if target is not None else self.resolve_partial(v, state)
        if isinstance(v, jp.Literal):
            return layout
        self.move(v, layout, frame, tally, mult)
        return layout

    # --- equations ---

    def _eqn(self, eqn: Any, frame: Frame, tally: Tally, mult: float) -> float:
        """Apply one equation; the peak bytes of its inner temporaries (calls only)."""
        rule = self._rules.get(id(eqn))
        if rule is None:  # what kind of equation it is depends on the jaxpr alone
            rule = self._rules[id(eqn)] = self._rule(eqn)
        return rule(eqn, frame, tally, mult)

    def _rule(self, eqn: Any) -> Callable[[Any, Frame, Tally, float], float]:
        """How :meth:`_eqn` applies ``eqn`` (NOTE [auto cost model])."""
        prim = eqn.primitive
        name = prim.name
        ndim = len(shape_of(eqn.outvars[0])) if eqn.outvars else 0
        if prim is pjit_p:
            return self._pinned_call
        if prim is sharding_constraint_p:
            layout = spec_layout(eqn.params["axis_resources"], ndim, self.order)
            return functools.partial(self._fixed, layout=layout)
        if name == "sharding_constraint" and "sharding" in eqn.params:  # jax's own
            layout = self._named_layout(eqn.params["sharding"], ndim)
            return functools.partial(self._fixed, layout=layout)
        if name in ("scan", "while", "cond"):
            return {"scan": self._scan, "while": self._while, "cond": self._cond}[name]
        body = _call_body(eqn)
        if body is not None:
            return functools.partial(self._call, body=body)
        handler = HANDLERS.get(name)
        if handler is not None:
            return functools.partial(_no_peak, functools.partial(handler, self))
        if _is_elementwise(eqn):
            return functools.partial(_no_peak, self._elementwise)
        return functools.partial(_no_peak, self.gather_all)

    def _named_layout(self, sharding: Any, ndim: int) -> Layout:
        """A jax sharding's layout over this mesh (replicated where it names other axes)."""
        spec = list(getattr(sharding, "spec", ()) or ())
        dims = [[] if p is None else [p] if isinstance(p, str) else list(p) for p in spec]
        dims = (dims + [[] for _ in range(ndim)])[:ndim]
        if any(a not in self.sizes for d in dims for a in d):
            return replicated(ndim)
        return canonical(dims, self.order)

    def set(self, frame: Frame, v: Any, state: State) -> None:
        if not isinstance(v, jp.DropVar):
            frame.env[v] = state

    def _fixed(self, eqn: Any, frame: Frame, tally: Tally, mult: float, layout: Layout) -> float:
        self.move(eqn.invars[0], layout, frame, tally, mult)
        self.set(frame, eqn.outvars[0], (layout, NO_AXES))
        return 0.0

    def work(self, v: Any, layout: Layout, tally: Tally, mult: float) -> None:
        """One flop per element of ``v``'s block (elementwise work; dots count their own)."""
        tally.flops += self.local(shape_of(v), layout) * mult

    def gather_all(self, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
        """An operation the model does not know: operands replicated, outputs replicated."""
        for v in eqn.invars:
            if not isinstance(v, jp.Literal):
                self.move(v, replicated(len(shape_of(v))), frame, tally, mult)
        for v in eqn.outvars:
            self.work(v, replicated(len(shape_of(v))), tally, mult)
            self.set(frame, v, (replicated(len(shape_of(v))), NO_AXES))

    def _elementwise(self, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
        """Every operand the output's shape (a size-1 dimension broadcasts) or a scalar:
        the output takes one operand's layout, whichever moves the fewest bytes."""
        out = eqn.outvars[0]
        shape = shape_of(out)
        operands = [v for v in eqn.invars if len(shape_of(v)) == len(shape) and shape]
        states = [self.read(frame, v) for v in operands]
        options: list[State] = [(s[0], NO_AXES) for s in states] + [
            (replicated(len(shape)), NO_AXES)
        ]
        p_options = self._partial_options(eqn, operands, states)
        best: tuple[tuple[float, int], State] | None = None
        for layout, p in dict.fromkeys(options + p_options):
            cost = sum(
                self.move_cost(v, _project(layout, shape_of(v)), frame)
                for v, st in zip(operands, states, strict=True)
                if not (p and st == (_project(layout, shape_of(v)), p))
            )
            local = self.local(shape, layout)
            score = (cost + local / FLOPS_PER_S, local)
            if best is None or score < best[0]:
                best = (score, (layout, p))
        assert best is not None
        layout, p = best[1]
        for v, st in zip(operands, states, strict=True):
            if not (p and st == (_project(layout, shape_of(v)), p)):
                self.move(v, _project(layout, shape_of(v)), frame, tally, mult)
        self.work(out, layout, tally, mult)
        for v in eqn.outvars:
            same = shape_of(v) == shape
            self.set(frame, v, (layout, p) if same else (replicated(len(shape_of(v))), NO_AXES))

    def _partial_options(self, eqn: Any, operands: list[Any], states: list[State]) -> list[State]:
        """Output states that keep a partial sum, where the operation is linear in it."""
        if len(operands) != len(eqn.invars) or eqn.primitive.name not in _LINEAR:
            return []
        partials = {s[1] for s in states if s[1]}
        if len(partials) != 1:
            return []
        (p,) = partials
        carriers = [i for i, s in enumerate(states) if s[1] == p]
        linear = _LINEAR[eqn.primitive.name]
        layout = states[carriers[0]][0]
        if linear is None:  # sums: every operand a partial sum over the same axes
            return [(layout, p)] if len(carriers) == len(states) else []
        # products: one partial factor, the others whole and not split over p
        if len(carriers) != 1 or not linear[min(carriers[0], len(linear) - 1)]:
            return []
        if any(used_axes(s[0]) & p for i, s in enumerate(states) if i != carriers[0]):
            return []
        return [(layout, p)]

    # --- calls and control flow ---

    def _call(self, eqn: Any, frame: Frame, tally: Tally, mult: float, body: Any) -> float:
        jaxpr = body.jaxpr if isinstance(body, jp.ClosedJaxpr) else body
        states = [self.read(frame, v) for v in eqn.invars]
        outs, peak = self._walk(jaxpr, states, tally, mult)
        for v, s in zip(eqn.outvars, outs, strict=True):
            self.set(frame, v, s)
        return peak

    def _pinned_call(self, eqn: Any, frame: Frame, tally: Tally, mult: float) -> float:
        """A nested pjit: its operands move to its input specs, its results are laid out as
        its output specs say (or as propagated where it leaves them open)."""
        params = eqn.params
        states = []
        for v, spec in zip(eqn.invars, params["in_axis_resources"], strict=True):
            if spec is None:
                states.append(self.read(frame, v))
                continue
            layout = spec_layout(spec, len(shape_of(v)), self.order)
            self.move(v, layout, frame, tally, mult)
            states.append((layout, NO_AXES))
        outs, peak = self._walk(params["jaxpr"].jaxpr, states, tally, mult)
        for v, s, spec in zip(eqn.outvars, outs, params["out_axis_resources"], strict=True):
            if spec is not None:
                layout = spec_layout(spec, len(shape_of(v)), self.order)
                tally.pay(self.steps(v, s[0], s[1], layout), mult)
                s = (layout, NO_AXES)
            self.set(frame, v, s)
        return peak

    def _scan(self, eqn: Any, frame: Frame, tally: Tally, mult: float) -> float:
        p = eqn.params
        n_consts, n_carry, length = p["num_consts"], p["num_carry"], p["length"]
        states: list[State] = []
        for i, v in enumerate(eqn.invars):
            src = self.read(frame, v)
            if i < n_consts + n_carry:
                states.append(self._settle_state(v, src, frame, tally, mult))
            else:  # a slice of xs per iteration: the leading dimension must be whole
                layout = ((),) + src[0][1:]
                self.move(v, layout, frame, tally, mult)
                states.append((layout[1:], NO_AXES))
        outs, peak = self._walk(p["jaxpr"].jaxpr, states, tally, mult * length)
        carry_in = states[n_consts : n_consts + n_carry]
        for k, (s, want) in enumerate(zip(outs[:n_carry], carry_in, strict=True)):
            v = p["jaxpr"].jaxpr.outvars[k]
            tally.pay(self.steps(v, s[0], s[1], want[0]), mult * length)
        for v, s in zip(eqn.outvars[:n_carry], carry_in, strict=True):
            self.set(frame, v, s)
        for v, s in zip(eqn.outvars[n_carry:], outs[n_carry:], strict=True):
            self.set(frame, v, (((),) + s[0], s[1]))
        return peak

    def _settle_state(self, v: Any, state: State, frame: Frame, tally: Tally, mult: float) -> State:
        if not state[1]:
            return state
        return (self.settle(v, state, None, frame, tally, mult), NO_AXES)

    def _while(self, eqn: Any, frame: Frame, tally: Tally, mult: float) -> float:
        p = eqn.params
        nc, nb = p["cond_nconsts"], p["body_nconsts"]
        states = [
            self._settle_state(v, self.read(frame, v), frame, tally, mult) for v in eqn.invars
        ]
        body_in = states[nc : nc + nb] + states[nc + nb :]
        outs, peak = self._walk(p["body_jaxpr"].jaxpr, body_in, tally, mult)
        _, cond_peak = self._walk(
            p["cond_jaxpr"].jaxpr, states[:nc] + states[nc + nb :], tally, mult
        )
        for k, (s, want) in enumerate(zip(outs, states[nc + nb :], strict=True)):
            v = p["body_jaxpr"].jaxpr.outvars[k]
            tally.pay(self.steps(v, s[0], s[1], want[0]), mult)
        for v, s in zip(eqn.outvars, states[nc + nb :], strict=True):
            self.set(frame, v, s)
        return max(peak, cond_peak)

    def _cond(self, eqn: Any, frame: Frame, tally: Tally, mult: float) -> float:
        states = [
            self._settle_state(v, self.read(frame, v), frame, tally, mult) for v in eqn.invars[1:]
        ]
        best: tuple[Tally, list[State], float] | None = None
        for branch in eqn.params["branches"]:
            t = Tally()
            outs, peak = self._walk(branch.jaxpr, states, t, mult)
            if best is None or t.seconds() > best[0].seconds():
                best = (t, outs, peak)
        assert best is not None
        tally.flops += best[0].flops
        tally.collective_bytes += best[0].collective_bytes
        tally.collectives += best[0].collectives
        for v, s in zip(eqn.outvars, best[1], strict=True):
            self.set(frame, v, s)
        return best[2]


def _no_peak(apply: Callable[[Any, Frame, Tally, float], None], *args: Any) -> float:
    """An equation without inner temporaries: apply it; no peak of its own."""
    apply(*args)
    return 0.0


def _is_elementwise(eqn: Any) -> bool:
    """Every output the first one's shape; every operand that shape (size-1 dimensions
    broadcasting) or a scalar."""
    if not eqn.outvars:
        return False
    shape = shape_of(eqn.outvars[0])
    return all(shape_of(v) == shape for v in eqn.outvars) and all(
        shape_of(v) == () or _broadcasts(shape_of(v), shape) for v in eqn.invars
    )


def _broadcasts(src: Sequence[int], dst: Sequence[int]) -> bool:
    return len(src) == len(dst) and all(a in (b, 1) for a, b in zip(src, dst, strict=True))


def _project(layout: Layout, shape: Sequence[int]) -> Layout:
    """``layout`` for an operand that broadcasts its size-1 dimensions (never split)."""
    return tuple(() if n == 1 else d for d, n in zip(layout, shape, strict=True))


def _call_body(eqn: Any) -> Any:
    """The jaxpr a call-like equation runs on its operands (pjit, remat, custom
    derivatives, closed calls), or None."""
    for value in eqn.params.values():
        jaxpr = value.jaxpr if isinstance(value, jp.ClosedJaxpr) else value
        if (
            isinstance(jaxpr, jp.Jaxpr)
            and len(jaxpr.invars) == len(eqn.invars)
            and len(jaxpr.outvars) == len(eqn.outvars)
        ):
            return value
    return None


def _last_uses(jaxpr: Any) -> dict[Any, int]:
    last: dict[Any, int] = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not isinstance(v, jp.Literal):
                last[v] = i
    for v in jaxpr.outvars:
        if not isinstance(v, jp.Literal):
            last[v] = len(jaxpr.eqns)
    return last


def _fusible(eqn: Any) -> bool:
    """Whether XLA fuses this equation into its consumers (elementwise and layout ops)."""
    name = eqn.primitive.name
    return name in ("broadcast_in_dim", "reshape", "transpose", "squeeze", "expand_dims") or (
        name not in HANDLERS and _call_body(eqn) is None and _is_elementwise(eqn)
    )


def _materialized(jaxpr: Any) -> set[Any]:
    """The values XLA keeps in memory (NOTE [auto cost model]): results of unfusible
    equations, and fused results an unfusible equation (a dot, a call) reads."""
    kept: set[Any] = set()
    for eqn in jaxpr.eqns:
        if not _fusible(eqn):
            kept.update(eqn.outvars)
            if eqn.primitive.name not in REDUCE_BY_SUM | REDUCE_OTHER:
                kept.update(v for v in eqn.invars if not isinstance(v, jp.Literal))
    return kept


def _aliased(
    arg_bytes: Sequence[float], donated: Sequence[bool], out_bytes: Sequence[float]
) -> float:
    """Bytes of donated inputs an output of the same per-device size takes over."""
    pool = sorted((b for b, d in zip(arg_bytes, donated, strict=True) if d), reverse=True)
    total = 0.0
    for b in sorted(out_bytes, reverse=True):
        if b in pool:
            pool.remove(b)
            total += b
    return total


#: The strategies of the primitives the model knows, by name, registered by
#: ``strategies.py`` (NOTE [auto cost model]); elementwise operations, calls and
#: control flow are handled here.
HANDLERS: dict[str, Callable[[Estimator, Any, Frame, Tally, float], None]] = {}
