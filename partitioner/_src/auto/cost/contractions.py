"""Rules for contractions: dots, convolutions, gathers and scatters.

Each rule applies one equation to the walk's frame (NOTE [auto cost model] in
``values.py``): it picks the layouts the operands move to, pays the moves and the
work, and sets the results' states. A contraction may split each mesh axis over a
role (a batch, a free or a contracting dimension; :func:`contract` tries every
combination the operands suggest). They follow what XLA's SPMD partitioner does
with the same layouts (checked against XLA's programs by
``tests/auto/test_cost_model.py``): a convolution splits its batch, its output
features, or its input features (a partial sum, as a contracting dimension); a
gather from a table split over the looked-up dimension is a partial sum (each
device contributes its rows), and a scatter-add of updates split over their batch a
partial sum of the whole table. ``rules.py`` registers them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .equations import shape_of
from .flops import counted
from .layouts import NO_AXES, Axes, Layout, canonical, fits, replicated, shards
from .rates import FLOPS_PER_S
from .values import Frame, State, Tally, Values

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
    leave the result a partial sum."""

    operands: tuple[Any, ...]
    where: Mapping[Role, tuple[int, ...]]
    summed: frozenset[Role]


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
    ((_, flops_per_out),) = counted(eqn)  # per result element, before any split
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
        work = math.prod(shapes[-1]) * flops_per_out / shards(used, model.sizes)
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
    local = model.local(shapes[-1], lay[-1]) * flops_per_out
    tally.flops += local / shards(sorted(partial), model.sizes) * mult
    model.set(frame, out, (lay[-1], partial))


def dot_general(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    lhs, rhs = eqn.invars
    lhs_dims, rhs_dims, where = dot_dims(eqn)
    states = (model.read(frame, lhs), model.read(frame, rhs))
    roles = roles_from(model, states, (lhs_dims, rhs_dims))
    summed = frozenset(r for r in where if r[0] == "contract")
    contract(model, eqn, frame, tally, mult, Contraction((lhs, rhs), where, summed), roles)


# --- convolutions ---


def conv(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """``conv_general_dilated``: batch, output-feature (or feature-group) and
    input-feature splits; spatial dimensions whole (no halo exchange modelled)."""
    lhs, rhs = eqn.invars
    p = eqn.params
    dn = p["dimension_numbers"]
    (lb, lf, *_), (ro, ri, *_), (ob, of, *_) = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    where: dict[Role, tuple[int, ...]] = {("rfree", 0): (-1, ro, of)}
    if p["batch_group_count"] == 1:
        where[("batch", 0)] = (lb, -1, ob)
    if p["feature_group_count"] == 1:
        where[("contract", 0)] = (lf, ri, -1)
    else:  # feature groups (depthwise): a split of the groups splits all three alike
        where[("rfree", 0)] = (lf, ro, of)
    lhs_dims = {w[0]: r for r, w in where.items() if w[0] >= 0}
    rhs_dims = {w[1]: r for r, w in where.items() if w[1] >= 0}
    states = (model.read(frame, lhs), model.read(frame, rhs))
    roles = roles_from(model, states, (lhs_dims, rhs_dims))
    summed = frozenset({("contract", 0)})
    contract(model, eqn, frame, tally, mult, Contraction((lhs, rhs), where, summed), roles)


# --- gathers and scatters (embedding lookups and their gradients) ---


def gather(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """Indices split over their batch dimensions split the result alike; the table
    split over a whole-slice dimension splits the result's matching offset dimension;
    split over a looked-up dimension (slices of one), a partial sum."""
    operand, indices = eqn.invars
    dn = eqn.params["dimension_numbers"]
    sizes = eqn.params["slice_sizes"]
    oshape, ishape = shape_of(operand), shape_of(indices)
    out_rank = len(shape_of(eqn.outvars[0]))
    batch_out = [d for d in range(out_rank) if d not in dn.offset_dims]
    kept = [
        d
        for d in range(len(oshape))
        if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims
    ]
    where: dict[Role, tuple[int, ...]] = {}
    for k, d in enumerate(range(len(ishape) - 1)):  # the last dimension holds the index
        paired = list(dn.start_indices_batching_dims)
        od = dn.operand_batching_dims[paired.index(d)] if d in paired else -1
        where[("batch", k)] = (od, d, batch_out[k])
    for k, d in enumerate(kept):
        if sizes[d] == oshape[d] and d not in dn.start_index_map:
            where[("lfree", k)] = (d, -1, dn.offset_dims[k])
    for d in dn.start_index_map:
        if sizes[d] == 1 and d in dn.collapsed_slice_dims:
            where[("contract", d)] = (d, -1, -1)
    _contract_like(model, eqn, frame, tally, mult, (operand, indices), where)


def scatter(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """scatter-add: updates split over their scatter (batch) dimensions leave a partial
    sum of the whole table; window dimensions split operand, updates and result alike;
    the table split over an indexed dimension takes whole updates (each device
    applies those landing in its block). Other scatters keep only the last two."""
    operand, indices, updates = eqn.invars[:3]
    dn = eqn.params["dimension_numbers"]
    oshape, ushape = shape_of(operand), shape_of(updates)
    scatter_dims = [d for d in range(len(ushape)) if d not in dn.update_window_dims]
    window = [
        d
        for d in range(len(oshape))
        if d not in dn.inserted_window_dims and d not in dn.operand_batching_dims
    ]
    where: dict[Role, tuple[int, ...]] = {}
    for k, d in enumerate(window):
        where[("lfree", k)] = (d, -1, dn.update_window_dims[k], d)
    for d in dn.scatter_dims_to_operand_dims:
        if d in dn.inserted_window_dims:
            where[("rfree", d)] = (d, -1, -1, d)
    if eqn.primitive.name == "scatter-add" and not dn.operand_batching_dims:
        for k, d in enumerate(range(len(shape_of(indices)) - 1)):
            where[("contract", k)] = (-1, d, scatter_dims[k], -1)
    _contract_like(model, eqn, frame, tally, mult, (operand, indices, updates), where)


def _contract_like(
    model: Values,
    eqn: Any,
    frame: Frame,
    tally: Tally,
    mult: float,
    operands: tuple[Any, ...],
    where: dict[Role, tuple[int, ...]],
) -> None:
    """A gather or scatter as a contraction (:func:`contract`): ``contract`` roles
    summed; partial operands reduced first."""
    states = tuple(model.settled(v, frame, tally, mult) for v in operands)
    dims_of = [{w[i]: r for r, w in where.items() if w[i] >= 0} for i in range(len(operands))]
    roles = roles_from(model, states, dims_of)
    summed = frozenset(r for r in where if r[0] == "contract")
    contract(model, eqn, frame, tally, mult, Contraction(operands, where, summed), roles)
