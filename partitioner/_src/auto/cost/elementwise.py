"""Rules for elementwise operations, reductions and shape changes.

Each rule applies one equation to the walk's frame (NOTE [auto cost model] in
``values.py``). Elementwise operations take one operand's layout, whichever moves
the fewest bytes (a partial sum passes through where the operation is linear in
it); reductions over a sharded dimension leave a partial sum (``reduce_sum``) or
all-reduce (max, min, ...); reshapes, transposes and broadcasts carry an axis along
with its dimension. ``rules.py`` registers them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .equations import shape_of
from .flops import REDUCE_BY_SUM
from .layouts import NO_AXES, Axes, Layout, canonical, replicated, shards, used_axes
from .rates import FLOPS_PER_S
from .values import Frame, State, Tally, Values

# --- elementwise ---

# Linear in each operand marked True: a partial sum may pass through (NOTE [auto cost model]).
_LINEAR: dict[str, tuple[bool, ...] | None] = {
    "convert_element_type": (True,),
    "copy": (True,),
    "copy_p": (True,),
}


def project(layout: Layout, shape: Sequence[int]) -> Layout:
    """``layout`` for an operand that broadcasts its size-1 dimensions (never split)."""
    return tuple(() if n == 1 else d for d, n in zip(layout, shape, strict=True))


def elementwise(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """Every operand the output's shape (a size-1 dimension broadcasts) or a scalar:
    the output takes one operand's layout, whichever moves the fewest bytes."""
    out = eqn.outvars[0]
    shape = shape_of(out)
    operands = [v for v in eqn.invars if len(shape_of(v)) == len(shape) and shape]
    states = [model.read(frame, v) for v in operands]
    options: list[State] = [(s[0], NO_AXES) for s in states] + [(replicated(len(shape)), NO_AXES)]
    p_options = _partial_options(eqn, operands, states)

    def kept(st: State, layout: Layout, p: Axes, v: Any) -> bool:  # a partial operand as is
        return bool(p) and st == (project(layout, shape_of(v)), p)

    best: tuple[tuple[float, int], State] | None = None
    for layout, p in dict.fromkeys(options + p_options):
        cost = sum(
            model.move_cost(v, project(layout, shape_of(v)), frame)
            for v, st in zip(operands, states, strict=True)
            if not kept(st, layout, p, v)
        )
        local = model.local(shape, layout)
        score = (cost + local / FLOPS_PER_S, local)
        if best is None or score < best[0]:
            best = (score, (layout, p))
    assert best is not None
    layout, p = best[1]
    for v, st in zip(operands, states, strict=True):
        if not kept(st, layout, p, v):
            model.move(v, project(layout, shape_of(v)), frame, tally, mult)
    model.work(eqn, layout, tally, mult)
    for v in eqn.outvars:
        same = shape_of(v) == shape
        model.set(frame, v, (layout, p) if same else (replicated(len(shape_of(v))), NO_AXES))


def _partial_options(eqn: Any, operands: list[Any], states: list[State]) -> list[State]:
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
    if eqn.primitive.name == "select_n":  # every case partial alike, the predicate not
        ok = carriers == list(range(1, len(states))) and not (used_axes(states[0][0]) & p)
        return [(layout, p)] if ok else []
    # products: one partial factor, the others whole and not split over p
    if len(carriers) != 1 or not linear[min(carriers[0], len(linear) - 1)]:
        return []
    if any(used_axes(s[0]) & p for i, s in enumerate(states) if i != carriers[0]):
        return []
    return [(layout, p)]


# --- reductions ---


def reduce(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    (v,) = eqn.invars[:1]
    layout, partial = model.read(frame, v)
    if partial and eqn.primitive.name not in REDUCE_BY_SUM:
        layout = model.settle(v, (layout, partial), None, frame, tally, mult)
        partial = NO_AXES
    axes = set(eqn.params.get("axes", ()))
    reduced = frozenset(a for d in axes for a in layout[d])
    model.work(eqn, layout, tally, mult)
    out_layout = tuple(x for d, x in enumerate(layout) if d not in axes)
    out = eqn.outvars[0]
    if eqn.primitive.name in REDUCE_BY_SUM:  # linear: partial sums stay partial
        model.set(frame, out, (out_layout, reduced | partial))
        return
    if reduced:  # max, min, ...: all-reduce the partial results at once
        tally.pay(
            [("all-reduce", shards(sorted(reduced), model.sizes), model.nbytes(out, out_layout))],
            mult,
        )
    model.set(frame, out, (out_layout, NO_AXES))


# --- shapes ---


def broadcast_in_dim(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    v, out = eqn.invars[0], eqn.outvars[0]
    layout, partial = model.read(frame, v)
    out_shape = shape_of(out)
    dims: list[tuple[str, ...]] = [()] * len(out_shape)
    in_shape = shape_of(v)
    for i, d in enumerate(eqn.params["broadcast_dimensions"]):
        if in_shape[i] == out_shape[d]:
            dims[d] = layout[i]
    model.work(eqn, tuple(dims), tally, mult)
    model.set(frame, out, (tuple(dims), partial))


def transpose(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    v, out = eqn.invars[0], eqn.outvars[0]
    layout, partial = model.read(frame, v)
    model.set(frame, out, (tuple(layout[d] for d in eqn.params["permutation"]), partial))


def reshape(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """reshape, and squeeze / expand_dims (reshapes that only drop or add size-1 dims):
    each group of dimensions that merge or split carries its axes to its major
    dimension where it can; a group that cannot is gathered first, the others kept."""
    v, out = eqn.invars[0], eqn.outvars[0]
    layout, partial = model.read(frame, v)
    mapped = _reshape_layout(shape_of(v), shape_of(out), layout, model.sizes)
    if mapped is None:  # shapes this rule does not follow: gathered first
        model.move(v, replicated(len(shape_of(v))), frame, tally, mult)
        model.set(frame, out, (replicated(len(shape_of(out))), NO_AXES))
        return
    needed, carried = mapped
    if needed != layout:
        model.move(v, needed, frame, tally, mult)
        partial = NO_AXES
    model.set(frame, out, (canonical(carried, model.order), partial))


def _reshape_groups(
    src: Sequence[int], dst: Sequence[int]
) -> list[tuple[list[int], list[int]]] | None:
    """The groups of dimensions a reshape merges or splits: (source dims, result dims)
    of equal sizes in order; size-1 dimensions at the end join no group. None: the
    shapes do not line up so."""
    groups = []
    i = j = 0
    while i < len(src) and j < len(dst):
        gi, gj = [i], [j]
        a, b = src[i], dst[j]
        while a != b:
            if a < b and i + 1 < len(src):
                i += 1
                gi.append(i)
                a *= src[i]
            elif a > b and j + 1 < len(dst):
                j += 1
                gj.append(j)
                b *= dst[j]
            else:
                return None
        groups.append((gi, gj))
        i += 1
        j += 1
    if any(n != 1 for n in src[i:]) or any(n != 1 for n in dst[j:]):
        return None
    return groups


def _reshape_layout(
    src: Sequence[int], dst: Sequence[int], layout: Layout, sizes: Mapping[str, int]
) -> tuple[Layout, list[tuple[str, ...]]] | None:
    """The operand's layout the reshape needs and the result's: a group's axes go to
    its major dimension when only its first non-trivial dimension is split (and the
    major dimension takes them); otherwise the group is whole. None: see
    :func:`_reshape_groups`."""
    groups = _reshape_groups(src, dst)
    if groups is None:
        return None
    needed: list[tuple[str, ...]] = [() for _ in src]
    out: list[tuple[str, ...]] = [()] * len(dst)
    for gi, gj in groups:
        axes = [x for k in gi for x in layout[k]]
        if not axes:
            continue
        major = next((k for k in gj if dst[k] > 1), gj[0])
        sharded = [k for k in gi if layout[k]]
        first = next((k for k in gi if src[k] > 1), gi[0])
        if sharded == [first] and dst[major] % shards(axes, sizes) == 0:
            out[major] = tuple(axes)
            needed[first] = layout[first]
    return tuple(needed), out


def no_operands(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    for v in eqn.outvars:
        model.set(frame, v, (replicated(len(shape_of(v))), NO_AXES))
