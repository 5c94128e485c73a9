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
    for axis in model.order:
        if model.sizes[axis] == 1:
            continue
        found: list[Role] = [("none", -1)]
        for state, dims in zip(states, dims_of, strict=True):
            for dim, axes in enumerate(state[0]):
                if axis in axes and dim in dims:
                    found.append(dims[dim])
        roles[axis] = list(dict.fromkeys(found))
    return roles


def dot_dims(eqn: Any) -> tuple[dict[int, Role], dict[int, Role], dict[Role, tuple[int, ...]]]:
    """Each operand's dimension -> its role, and each role -> the dimensions it splits
    (lhs, rhs, out; -1 where an operand lacks it)."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
    lrank, rrank = len(shape_of(eqn.invars[0])), len(shape_of(eqn.invars[1]))
    lfree = [dim for dim in range(lrank) if dim not in lhs_contract and dim not in lhs_batch]
    rfree = [dim for dim in range(rrank) if dim not in rhs_contract and dim not in rhs_batch]
    where: dict[Role, tuple[int, ...]] = {}
    for k, (lhs_dim, rhs_dim) in enumerate(zip(lhs_batch, rhs_batch, strict=True)):
        where[("batch", k)] = (lhs_dim, rhs_dim, k)
    for k, (lhs_dim, rhs_dim) in enumerate(zip(lhs_contract, rhs_contract, strict=True)):
        where[("contract", k)] = (lhs_dim, rhs_dim, -1)
    for k, dim in enumerate(lfree):
        where[("lfree", k)] = (dim, -1, len(lhs_batch) + k)
    for k, dim in enumerate(rfree):
        where[("rfree", k)] = (-1, dim, len(lhs_batch) + len(lfree) + k)
    lhs = {dims[0]: role for role, dims in where.items() if dims[0] >= 0}
    rhs = {dims[1]: role for role, dims in where.items() if dims[1] >= 0}
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
    contraction: Contraction,
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
    shapes = tuple(shape_of(operand) for operand in contraction.operands) + (shape_of(out),)
    none = (-1,) * len(shapes)
    axes = list(roles)
    best: tuple[float, float, int, tuple[Layout, ...], Axes] | None = None
    for combo in itertools.product(*(roles[axis] for axis in axes)):
        dims: list[list[list[str]]] = [[[] for _ in shape] for shape in shapes]
        for axis, role in zip(axes, combo, strict=True):
            for i, dim in enumerate(contraction.where.get(role, none)):
                if dim >= 0:
                    dims[i][dim].append(axis)
        lay = tuple(canonical(split, model.order) for split in dims)
        if not all(
            fits(shape, layout, model.sizes)
            for shape, layout in zip(shapes[:-1], lay, strict=False)
        ):
            continue
        used = [axis for axis, role in zip(axes, combo, strict=True) if role[0] != "none"]
        costs = [
            model.move_cost(operand, layout, frame)
            for operand, layout in zip(contraction.operands, lay, strict=False)
        ]
        copies = sum(
            model.nbytes(operand, layout)
            for operand, layout, cost in zip(contraction.operands, lay, costs, strict=False)
            if cost
        )
        work = math.prod(shapes[-1]) * flops_per_out / shards(used, model.sizes)
        partial = frozenset(
            axis for axis, role in zip(axes, combo, strict=True) if role in contraction.summed
        )
        comm = sum(costs)
        if partial:  # reduced later (an all-reduce or a reduce-scatter of the result)
            comm += model.move_cost(out, lay[-1], frame, partial)
        score = (comm + work / FLOPS_PER_S, copies, -len(used))
        if best is None or score < best[:3]:
            best = (*score, lay, partial)
    if best is None:  # nothing splits evenly: compute replicated
        best = (0.0, 0.0, 0, tuple(replicated(len(shape)) for shape in shapes), NO_AXES)
    *_, lay, partial = best
    for operand, layout in zip(contraction.operands, lay, strict=False):
        model.move(operand, layout, frame, tally, mult)
    local = model.local(shapes[-1], lay[-1]) * flops_per_out
    tally.flops += local / shards(sorted(partial), model.sizes) * mult
    model.set(frame, out, (lay[-1], partial))


def dot_general(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    lhs, rhs = eqn.invars
    lhs_dims, rhs_dims, where = dot_dims(eqn)
    states = (model.read(frame, lhs), model.read(frame, rhs))
    roles = roles_from(model, states, (lhs_dims, rhs_dims))
    summed = frozenset(role for role in where if role[0] == "contract")
    contract(model, eqn, frame, tally, mult, Contraction((lhs, rhs), where, summed), roles)


# --- convolutions ---


def conv(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """``conv_general_dilated``: batch, output-feature (or feature-group) and
    input-feature splits; spatial dimensions whole (no halo exchange modelled)."""
    lhs, rhs = eqn.invars
    params = eqn.params
    numbers = params["dimension_numbers"]
    (lhs_batch, lhs_feature, *_), (rhs_out, rhs_in, *_), (out_batch, out_feature, *_) = (
        numbers.lhs_spec,
        numbers.rhs_spec,
        numbers.out_spec,
    )
    where: dict[Role, tuple[int, ...]] = {("rfree", 0): (-1, rhs_out, out_feature)}
    if params["batch_group_count"] == 1:
        where[("batch", 0)] = (lhs_batch, -1, out_batch)
    if params["feature_group_count"] == 1:
        where[("contract", 0)] = (lhs_feature, rhs_in, -1)
    else:  # feature groups (depthwise): a split of the groups splits all three alike
        where[("rfree", 0)] = (lhs_feature, rhs_out, out_feature)
    lhs_dims = {dims[0]: role for role, dims in where.items() if dims[0] >= 0}
    rhs_dims = {dims[1]: role for role, dims in where.items() if dims[1] >= 0}
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
    numbers = eqn.params["dimension_numbers"]
    sizes = eqn.params["slice_sizes"]
    oshape, ishape = shape_of(operand), shape_of(indices)
    out_rank = len(shape_of(eqn.outvars[0]))
    batch_out = [dim for dim in range(out_rank) if dim not in numbers.offset_dims]
    kept = [
        dim
        for dim in range(len(oshape))
        if dim not in numbers.collapsed_slice_dims and dim not in numbers.operand_batching_dims
    ]
    where: dict[Role, tuple[int, ...]] = {}
    for k, dim in enumerate(range(len(ishape) - 1)):  # the last dimension holds the index
        paired = list(numbers.start_indices_batching_dims)
        operand_dim = numbers.operand_batching_dims[paired.index(dim)] if dim in paired else -1
        where[("batch", k)] = (operand_dim, dim, batch_out[k])
    for k, dim in enumerate(kept):
        if sizes[dim] == oshape[dim] and dim not in numbers.start_index_map:
            where[("lfree", k)] = (dim, -1, numbers.offset_dims[k])
    for dim in numbers.start_index_map:
        if sizes[dim] == 1 and dim in numbers.collapsed_slice_dims:
            where[("contract", dim)] = (dim, -1, -1)
    _contract_like(model, eqn, frame, tally, mult, (operand, indices), where)


def scatter(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """scatter-add: updates split over their scatter (batch) dimensions leave a partial
    sum of the whole table; window dimensions split operand, updates and result alike;
    the table split over an indexed dimension takes whole updates (each device
    applies those landing in its block). Other scatters keep only the last two."""
    operand, indices, updates = eqn.invars[:3]
    numbers = eqn.params["dimension_numbers"]
    oshape, ushape = shape_of(operand), shape_of(updates)
    scatter_dims = [dim for dim in range(len(ushape)) if dim not in numbers.update_window_dims]
    window = [
        dim
        for dim in range(len(oshape))
        if dim not in numbers.inserted_window_dims and dim not in numbers.operand_batching_dims
    ]
    where: dict[Role, tuple[int, ...]] = {}
    for k, dim in enumerate(window):
        where[("lfree", k)] = (dim, -1, numbers.update_window_dims[k], dim)
    for dim in numbers.scatter_dims_to_operand_dims:
        if dim in numbers.inserted_window_dims:
            where[("rfree", dim)] = (dim, -1, -1, dim)
    if eqn.primitive.name == "scatter-add" and not numbers.operand_batching_dims:
        for k, dim in enumerate(range(len(shape_of(indices)) - 1)):
            where[("contract", k)] = (-1, dim, scatter_dims[k], -1)
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
    states = tuple(model.settled(operand, frame, tally, mult) for operand in operands)
    dims_of = [
        {dims[i]: role for role, dims in where.items() if dims[i] >= 0}
        for i in range(len(operands))
    ]
    roles = roles_from(model, states, dims_of)
    summed = frozenset(role for role in where if role[0] == "contract")
    contract(model, eqn, frame, tally, mult, Contraction(operands, where, summed), roles)
