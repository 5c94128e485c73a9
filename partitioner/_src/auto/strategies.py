"""Per-primitive strategies of the cost model: contractions, elementwise, reductions, shapes.

Each function applies one equation to the walk's frame (NOTE [auto cost model] in
``cost.py``): it picks the layouts the operands move to, pays the moves and the
work, and sets the results' states. They register in ``cost.HANDLERS`` by
primitive name, each right after its definition; ``layers.py`` holds the
strategies of layer-specific operations (convolutions, gathers, windows, slices),
``control.py`` those of calls and loops.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .cost import (
    FLOPS_PER_S,
    HANDLERS,
    REDUCE_BY_SUM,
    REDUCE_OTHER,
    Frame,
    State,
    Tally,
    Values,
    no_peak,
    shape_of,
)
from .layouts import NO_AXES, Axes, Layout, canonical, fits, replicated, shards, used_axes

# --- contractions ---

#: A mesh axis's role in a contraction: ("batch" | "contract" | "lfree" | "rfree", k) or
#: ("none", -1): which dimension of each operand (and of the result) it splits.
Role = tuple[str, int]


def roles_from(
    model: Values, states: Sequence[State], dims_of: Sequence[Mapping[int, Role]]
) -> dict[str, list[Role]]:
    """The roles each mesh axis may take: none, or the role of a dimension an operand
    already splits over it (``dims_of[i]``: operand ``i``'s dimension -> its role)."""
    roles: dict[str, list[Role]] = {}
    for a in model.order:
        if model.sizes[a] == 1:
            continue
        found: list[Role] = [("none", -1)]
        for state, dims in zip(states, dims_of, strict=True):
            for d, on in enumerate(state[0]):
                if a in on and d in dims:
                    found.append(dims[d])
        roles[a] = list(dict.fromkeys(found))
    return roles


def dot_dims(eqn: Any) -> tuple[dict[int, Role], dict[int, Role], dict[Role, tuple[int, ...]]]:
    """Each operand's dimension -> its role, and each role -> the dimensions it splits
    (lhs, rhs, out; -1 where an operand lacks it)."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lrank, rrank = len(shape_of(eqn.invars[0])), len(shape_of(eqn.invars[1]))
    lfree = [d for d in range(lrank) if d not in lc and d not in lb]
    rfree = [d for d in range(rrank) if d not in rc and d not in rb]
    where: dict[Role, tuple[int, ...]] = {}
    for k, (ld, rd) in enumerate(zip(lb, rb, strict=True)):
        where[("batch", k)] = (ld, rd, k)
    for k, (ld, rd) in enumerate(zip(lc, rc, strict=True)):
        where[("contract", k)] = (ld, rd, -1)
    for k, d in enumerate(lfree):
        where[("lfree", k)] = (d, -1, len(lb) + k)
    for k, d in enumerate(rfree):
        where[("rfree", k)] = (-1, d, len(lb) + len(lfree) + k)
    lhs = {w[0]: r for r, w in where.items() if w[0] >= 0}
    rhs = {w[1]: r for r, w in where.items() if w[1] >= 0}
    return lhs, rhs, where


@dataclass(frozen=True)
class Contraction:
    """How a contraction-like equation (a dot, a convolution, a gather or scatter) may
    be split: ``where`` maps each role to the dimension it splits in each of
    ``operands`` and then in the result (-1: none); axes in a role of ``summed``
    leave the result a partial sum; ``flops_per_out`` is the work per result
    element before any split of a summed dimension."""

    operands: tuple[Any, ...]
    where: Mapping[Role, tuple[int, ...]]
    summed: frozenset[Role]
    flops_per_out: float


def contract(
    model: Values,
    eqn: Any,
    frame: Frame,
    tally: Tally,
    mult: float,
    c: Contraction,
    roles: Mapping[str, Sequence[Role]],
) -> None:
    """Apply a contraction with the cheapest combination of roles: operands move to
    their layouts, the result is split as the roles say (NOTE [auto cost model]). A
    combination leaving a partial sum counts its reduction too: the result's block
    all-reduced (a reduce-scatter moves the same operand bytes), as XLA does next.
    Equal times go to the smaller copies (moving tokens to their experts rather than
    gathering the experts' weights), then to more axes used."""
    out = eqn.outvars[0]
    shapes = tuple(shape_of(v) for v in c.operands) + (shape_of(out),)
    none = (-1,) * len(shapes)
    axes = list(roles)
    best: tuple[float, float, int, tuple[Layout, ...], Axes] | None = None
    for combo in itertools.product(*(roles[a] for a in axes)):
        dims: list[list[list[str]]] = [[[] for _ in s] for s in shapes]
        for a, role in zip(axes, combo, strict=True):
            for i, d in enumerate(c.where.get(role, none)):
                if d >= 0:
                    dims[i][d].append(a)
        lay = tuple(canonical(x, model.order) for x in dims)
        if not all(fits(s, x, model.sizes) for s, x in zip(shapes[:-1], lay, strict=False)):
            continue
        used = [a for a, role in zip(axes, combo, strict=True) if role[0] != "none"]
        costs = [model.move_cost(v, x, frame) for v, x in zip(c.operands, lay, strict=False)]
        copies = sum(
            model.nbytes(v, x) for v, x, t in zip(c.operands, lay, costs, strict=False) if t
        )
        work = math.prod(shapes[-1]) * c.flops_per_out / shards(used, model.sizes)
        partial = frozenset(a for a, r in zip(axes, combo, strict=True) if r in c.summed)
        comm = sum(costs)
        if partial:  # reduced later (an all-reduce or a reduce-scatter of the result)
            comm += model.move_cost(out, lay[-1], frame, partial)
        score = (comm + work / FLOPS_PER_S, copies, -len(used))
        if best is None or score < best[:3]:
            best = (*score, lay, partial)
    if best is None:  # nothing splits evenly: compute replicated
        best = (0.0, 0.0, 0, tuple(replicated(len(s)) for s in shapes), NO_AXES)
    *_, lay, partial = best
    for v, x in zip(c.operands, lay, strict=False):
        model.move(v, x, frame, tally, mult)
    local = model.local(shapes[-1], lay[-1]) * c.flops_per_out
    tally.flops += local / shards(sorted(partial), model.sizes) * mult
    model.set(frame, out, (lay[-1], partial))


def _dot_general(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    lhs, rhs = eqn.invars
    lhs_dims, rhs_dims, where = dot_dims(eqn)
    states = (model.read(frame, lhs), model.read(frame, rhs))
    roles = roles_from(model, states, (lhs_dims, rhs_dims))
    (lc, _), _ = eqn.params["dimension_numbers"]
    flops = 2.0 * math.prod(shape_of(lhs)[d] for d in lc)
    summed = frozenset(r for r in where if r[0] == "contract")
    contract(model, eqn, frame, tally, mult, Contraction((lhs, rhs), where, summed, flops), roles)


HANDLERS["dot_general"] = no_peak(_dot_general)


# --- elementwise ---

# Linear in each operand marked True: a partial sum may pass through (NOTE [auto cost model]).
_LINEAR: dict[str, tuple[bool, ...] | None] = {
    "convert_element_type": (True,),
    "copy": (True,),
    "copy_p": (True,),
}


def is_elementwise(eqn: Any) -> bool:
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
    model.work(out, layout, tally, mult)
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


def _reduce(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    (v,) = eqn.invars[:1]
    layout, partial = model.read(frame, v)
    if partial and eqn.primitive.name not in REDUCE_BY_SUM:
        layout = model.settle(v, (layout, partial), None, frame, tally, mult)
        partial = NO_AXES
    axes = set(eqn.params.get("axes", ()))
    reduced = frozenset(a for d in axes for a in layout[d])
    model.work(v, layout, tally, mult)
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


HANDLERS.update({n: no_peak(_reduce) for n in REDUCE_BY_SUM | REDUCE_OTHER})


# --- shapes ---


def _broadcast_in_dim(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    v, out = eqn.invars[0], eqn.outvars[0]
    layout, partial = model.read(frame, v)
    out_shape = shape_of(out)
    dims: list[tuple[str, ...]] = [()] * len(out_shape)
    in_shape = shape_of(v)
    for i, d in enumerate(eqn.params["broadcast_dimensions"]):
        if in_shape[i] == out_shape[d]:
            dims[d] = layout[i]
    model.work(out, tuple(dims), tally, mult)
    model.set(frame, out, (tuple(dims), partial))


HANDLERS["broadcast_in_dim"] = no_peak(_broadcast_in_dim)


def _transpose(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    v, out = eqn.invars[0], eqn.outvars[0]
    layout, partial = model.read(frame, v)
    model.set(frame, out, (tuple(layout[d] for d in eqn.params["permutation"]), partial))


HANDLERS["transpose"] = no_peak(_transpose)


def _reshape(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
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


HANDLERS["reshape"] = HANDLERS["squeeze"] = HANDLERS["expand_dims"] = no_peak(_reshape)


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


def _no_operands(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    for v in eqn.outvars:
        model.set(frame, v, (replicated(len(shape_of(v))), NO_AXES))


HANDLERS["iota"] = HANDLERS["rng_bit_generator"] = no_peak(_no_operands)
