"""Strategies for the operations of common layers: convolutions, pooling windows,
embedding gathers and their scatter-add gradients, slices and dynamic updates
(caches), cumulative and sorting operations.

Each follows what XLA's SPMD partitioner does with the same layouts (checked by
``tests/test_auto_cost_model.py`` against XLA's programs): a convolution splits
its batch, its output features, or its input features (a partial sum, as a
contracting dimension); a window keeps a dimension split only where windows do
not straddle blocks; a gather from a table split over the looked-up dimension
is a partial sum (each device contributes its rows), and a scatter-add of
updates split over their batch a partial sum of the whole table; a dynamic
update leaves its operand as it is (XLA masks the update into each block),
while a dynamic slice, a cumulative or a sorting operation needs its dimension
whole. They register in ``cost.HANDLERS`` right after each definition.
"""

from __future__ import annotations

import math
from typing import Any

from .. import jax_private as jp
from .cost import HANDLERS, Frame, Tally, Values, no_peak, shape_of
from .layouts import NO_AXES, Layout, canonical, fits, replicated, shards
from .strategies import Contraction, Role, contract, roles_from

# --- convolutions ---


def _conv(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """``conv_general_dilated``: batch, output-feature (or feature-group) and
    input-feature splits; spatial dimensions whole (no halo exchange modelled)."""
    lhs, rhs = eqn.invars
    p = eqn.params
    dn = p["dimension_numbers"]
    (lb, lf, *_), (ro, ri, *rsp), (ob, of, *_) = dn.lhs_spec, dn.rhs_spec, dn.out_spec
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
    rshape = shape_of(rhs)
    flops = 2.0 * rshape[ri] * math.prod(rshape[d] for d in rsp)
    summed = frozenset({("contract", 0)})
    contract(model, eqn, frame, tally, mult, Contraction((lhs, rhs), where, summed, flops), roles)


HANDLERS["conv_general_dilated"] = no_peak(_conv)


# --- windows (pooling) ---


def _window_layout(model: Values, p: dict[str, Any], v: Any, layout: Layout) -> Layout:
    """``layout`` with a split dimension kept only where windows tile each block: window
    and stride equal, no padding or dilation, and the block a whole number of windows."""
    shape = shape_of(v)
    ones = (1,) * len(shape)

    def keeps(d: int, axes: tuple[str, ...]) -> bool:
        if not axes:
            return True
        if tuple(p["padding"][d]) != (0, 0):
            return False
        if any(p.get(k, ones)[d] != 1 for k in ("base_dilation", "window_dilation")):
            return False
        size, stride = p["window_dimensions"][d], p["window_strides"][d]
        return size == stride and (shape[d] // shards(axes, model.sizes)) % size == 0

    return tuple(axes if keeps(d, axes) else () for d, axes in enumerate(layout))


def _window(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """reduce_window_* (pooling), select_and_gather_add: one operand's layout, kept
    where windows tile the blocks; the others, of the same shape, follow it."""
    v, out = eqn.invars[0], eqn.outvars[0]
    layout = _window_layout(model, eqn.params, v, model.settled(v, frame, tally, mult)[0])
    for w in eqn.invars:
        if shape_of(w) == shape_of(v):
            model.move(w, layout, frame, tally, mult)
    model.work(v, layout, tally, mult)
    model.set(frame, out, (layout, NO_AXES))


for _name in ("reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window"):
    HANDLERS[_name] = no_peak(_window)
HANDLERS["select_and_gather_add"] = no_peak(_window)


def _select_and_scatter_add(
    model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float
) -> None:
    """The gradient of a max pool: ``source`` (pooled) scattered back into ``operand``'s
    shape; both split alike where windows tile the blocks."""
    source, operand = eqn.invars
    layout = _window_layout(model, eqn.params, operand, model.read(frame, operand)[0])
    model.move(operand, layout, frame, tally, mult)
    model.move(source, layout, frame, tally, mult)
    model.work(operand, layout, tally, mult)
    model.set(frame, eqn.outvars[0], (layout, NO_AXES))


HANDLERS["select_and_scatter_add"] = no_peak(_select_and_scatter_add)


# --- gathers and scatters (embedding lookups and their gradients) ---


def _gather(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
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


HANDLERS["gather"] = no_peak(_gather)


def _scatter(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
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


HANDLERS["scatter-add"] = HANDLERS["scatter"] = no_peak(_scatter)


def _contract_like(
    model: Values,
    eqn: Any,
    frame: Frame,
    tally: Tally,
    mult: float,
    operands: tuple[Any, ...],
    where: dict[Role, tuple[int, ...]],
) -> None:
    """A gather or scatter as a contraction (``strategies.contract``): one unit of work
    per result element, ``contract`` roles summed; partial operands reduced first."""
    states = tuple(model.settled(v, frame, tally, mult) for v in operands)
    dims_of = [{w[i]: r for r, w in where.items() if w[i] >= 0} for i in range(len(operands))]
    roles = roles_from(model, states, dims_of)
    summed = frozenset(r for r in where if r[0] == "contract")
    contract(model, eqn, frame, tally, mult, Contraction(operands, where, summed, 1.0), roles)


# --- slices, dynamic slices and updates, cumulative and sorting operations ---


def _sliced(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """slice, pad, concatenate, dynamic_slice: dimensions whose size changes are whole;
    the others keep the first operand's axes; scalar operands (indices) whole."""
    v, out = eqn.invars[0], eqn.outvars[0]
    in_shape, out_shape = shape_of(v), shape_of(out)
    if len(in_shape) != len(out_shape):
        return model.gather_all(eqn, frame, tally, mult)
    keep = list(model.settled(v, frame, tally, mult)[0])
    for w in eqn.invars:
        ws = shape_of(w)
        if len(ws) == len(out_shape):
            for d in range(len(ws)):
                if ws[d] != out_shape[d] or in_shape[d] != out_shape[d]:
                    keep[d] = ()
    lay = tuple(keep)
    _move_operands(model, eqn, lay, frame, tally, mult)
    model.work(out, lay, tally, mult)
    model.set(frame, out, (lay, NO_AXES))


HANDLERS.update({n: no_peak(_sliced) for n in ("slice", "pad", "concatenate", "dynamic_slice")})


def _move_operands(
    model: Values, eqn: Any, layout: Layout, frame: Frame, tally: Tally, mult: float
) -> None:
    """Operands of ``layout``'s rank to ``layout`` (a size-1 dimension whole), others whole."""
    for w in eqn.invars:
        ws = shape_of(w)
        if len(ws) == len(layout):
            lay = tuple(() if n == 1 else d for d, n in zip(layout, ws, strict=True))
            model.move(w, lay, frame, tally, mult)
        elif not isinstance(w, jp.Literal):
            model.move(w, replicated(len(ws)), frame, tally, mult)


def _dynamic_update_slice(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """The result laid out as the operand is (XLA masks the update into each block) or as
    the update is along the dimensions it spans, whichever costs less to move: a layer's
    gradient written into a stack of zeros (the transpose of a loop's slice of a
    stack) leaves the stack split as the gradient is. The update is whole along the
    dimensions it does not span."""
    operand, update = eqn.invars[:2]
    layout = model.settled(operand, frame, tally, mult)[0]
    oshape, ushape = shape_of(operand), shape_of(update)

    def spanned(lay: Layout) -> Layout:
        return tuple(d if n == m else () for d, n, m in zip(lay, ushape, oshape, strict=True))

    given = spanned(model.read(frame, update)[0])
    if given != layout and fits(oshape, given, model.sizes):
        own = model.move_cost(update, spanned(layout), frame)
        theirs = model.move_cost(operand, given, frame) + model.move_cost(update, given, frame)
        if theirs < own:
            model.move(operand, given, frame, tally, mult)
            layout = given
    upd = spanned(layout)
    model.move(update, upd, frame, tally, mult)
    for w in eqn.invars[2:]:
        model.move(w, replicated(len(shape_of(w))), frame, tally, mult)
    model.work(update, upd, tally, mult)
    model.set(frame, eqn.outvars[0], (layout, NO_AXES))


HANDLERS["dynamic_update_slice"] = no_peak(_dynamic_update_slice)


def _along_axis(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """Operations along dimensions (cumulative ops, reverse, split): those whole (XLA
    gathers them), the others as the first operand has them; every output alike. A sort
    instead moves the axes of its dimension to another one that takes them (XLA's
    all-to-all), when one does."""
    v = eqn.invars[0]
    p = eqn.params
    shape = shape_of(v)
    axes = p.get("dimensions") or (p.get("axis", p.get("dimension", len(shape) - 1)),)
    axes = tuple(a % max(len(shape), 1) for a in axes)
    layout = model.settled(v, frame, tally, mult)[0]
    keep = [() if d in axes else x for d, x in enumerate(layout)]
    moved = [a for d in axes for a in layout[d]]
    if moved and eqn.primitive.name == "sort":
        for d, x in enumerate(keep):
            if d not in axes and shape[d] % shards([*x, *moved], model.sizes) == 0:
                keep[d] = canonical([[*x, *moved]], model.order)[0]
                break
    lay = tuple(keep)
    for w in eqn.invars:
        if len(shape_of(w)) == len(lay):
            model.move(w, lay, frame, tally, mult)
    model.work(v, lay, tally, mult)
    for w in eqn.outvars:
        same_rank = len(shape_of(w)) == len(lay)
        model.set(frame, w, (lay if same_rank else replicated(len(shape_of(w))), NO_AXES))


_ALONG = ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "sort", "rev", "split")
HANDLERS.update({n: no_peak(_along_axis) for n in _ALONG})
# top_k: XLA gathers its operand whole, whichever dimension is split (the default rule).
