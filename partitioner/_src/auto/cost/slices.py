"""Rules for operations over parts of a dimension: pooling windows, slices, dynamic
slices and updates (caches), cumulative and sorting operations.

Each follows what XLA's SPMD partitioner does with the same layouts: a window keeps a
dimension split only where windows do not straddle blocks; a dynamic update leaves
its operand as it is (XLA masks the update into each block), while a dynamic slice,
a cumulative or a sorting operation needs its dimension whole. ``rules.py``
registers them.
"""

from __future__ import annotations

from typing import Any

from ... import jax_private as jp
from .equations import shape_of
from .layouts import NO_AXES, Layout, canonical, fits, replicated, shards
from .values import Frame, Tally, Values

# --- windows (pooling) ---


def _window_layout(model: Values, params: dict[str, Any], operand: Any, layout: Layout) -> Layout:
    """``layout`` with a split dimension kept only where windows tile each block: window
    and stride equal, no padding or dilation, and the block a whole number of windows."""
    shape = shape_of(operand)
    ones = (1,) * len(shape)

    def keeps(dim: int, axes: tuple[str, ...]) -> bool:
        if not axes:
            return True
        if tuple(params["padding"][dim]) != (0, 0):
            return False
        if any(params.get(name, ones)[dim] != 1 for name in ("base_dilation", "window_dilation")):
            return False
        size, stride = params["window_dimensions"][dim], params["window_strides"][dim]
        return size == stride and (shape[dim] // shards(axes, model.sizes)) % size == 0

    return tuple(axes if keeps(dim, axes) else () for dim, axes in enumerate(layout))


def window(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """reduce_window_* (pooling), select_and_gather_add: one operand's layout, kept
    where windows tile the blocks; the others, of the same shape, follow it."""
    first, out = eqn.invars[0], eqn.outvars[0]
    layout = _window_layout(model, eqn.params, first, model.settled(first, frame, tally, mult)[0])
    for operand in eqn.invars:
        if shape_of(operand) == shape_of(first):
            model.move(operand, layout, frame, tally, mult)
    model.work(eqn, layout, tally, mult)
    model.set(frame, out, (layout, NO_AXES))


def select_and_scatter_add(
    model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float
) -> None:
    """The gradient of a max pool: ``source`` (pooled) scattered back into ``operand``'s
    shape; both split alike where windows tile the blocks."""
    source, operand = eqn.invars
    layout = _window_layout(model, eqn.params, operand, model.read(frame, operand)[0])
    model.move(operand, layout, frame, tally, mult)
    model.move(source, layout, frame, tally, mult)
    model.work(eqn, layout, tally, mult)
    model.set(frame, eqn.outvars[0], (layout, NO_AXES))


# --- slices, dynamic slices and updates, cumulative and sorting operations ---


def sliced(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """slice, pad, concatenate, dynamic_slice: dimensions whose size changes are whole;
    the others keep the first operand's axes; scalar operands (indices) whole."""
    first, out = eqn.invars[0], eqn.outvars[0]
    in_shape, out_shape = shape_of(first), shape_of(out)
    if len(in_shape) != len(out_shape):
        return model.gather_all(eqn, frame, tally, mult)
    keep = list(model.settled(first, frame, tally, mult)[0])
    for operand in eqn.invars:
        shape = shape_of(operand)
        if len(shape) == len(out_shape):
            for dim in range(len(shape)):
                if shape[dim] != out_shape[dim] or in_shape[dim] != out_shape[dim]:
                    keep[dim] = ()
    lay = tuple(keep)
    _move_operands(model, eqn, lay, frame, tally, mult)
    model.work(eqn, lay, tally, mult)
    model.set(frame, out, (lay, NO_AXES))


def _move_operands(
    model: Values, eqn: Any, layout: Layout, frame: Frame, tally: Tally, mult: float
) -> None:
    """Operands of ``layout``'s rank to ``layout`` (a size-1 dimension whole), others whole."""
    for operand in eqn.invars:
        shape = shape_of(operand)
        if len(shape) == len(layout):
            lay = tuple(() if size == 1 else axes for axes, size in zip(layout, shape, strict=True))
            model.move(operand, lay, frame, tally, mult)
        elif not isinstance(operand, jp.Literal):
            model.move(operand, replicated(len(shape)), frame, tally, mult)


def dynamic_update_slice(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """The result laid out as the operand is (XLA masks the update into each block) or as
    the update is along the dimensions it spans, whichever costs less to move: a layer's
    gradient written into a stack of zeros (the transpose of a loop's slice of a
    stack) leaves the stack split as the gradient is. The update is whole along the
    dimensions it does not span."""
    operand, update = eqn.invars[:2]
    layout = model.settled(operand, frame, tally, mult)[0]
    oshape, ushape = shape_of(operand), shape_of(update)

    def spanned(lay: Layout) -> Layout:
        return tuple(
            axes if update_size == operand_size else ()
            for axes, update_size, operand_size in zip(lay, ushape, oshape, strict=True)
        )

    given = spanned(model.read(frame, update)[0])
    if given != layout and fits(oshape, given, model.sizes):
        own = model.move_cost(update, spanned(layout), frame)
        theirs = model.move_cost(operand, given, frame) + model.move_cost(update, given, frame)
        if theirs < own:
            model.move(operand, given, frame, tally, mult)
            layout = given
    upd = spanned(layout)
    model.move(update, upd, frame, tally, mult)
    for index in eqn.invars[2:]:
        model.move(index, replicated(len(shape_of(index))), frame, tally, mult)
    model.work(eqn, upd, tally, mult)
    model.set(frame, eqn.outvars[0], (layout, NO_AXES))


def along_axis(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """Operations along dimensions (cumulative ops, reverse, split): those whole (XLA
    gathers them), the others as the first operand has them; every output alike. A sort
    instead moves the axes of its dimension to another one that takes them (XLA's
    all-to-all), when one does."""
    first = eqn.invars[0]
    params = eqn.params
    shape = shape_of(first)
    dims = params.get("dimensions") or (
        params.get("axis", params.get("dimension", len(shape) - 1)),
    )
    dims = tuple(dim % max(len(shape), 1) for dim in dims)
    layout = model.settled(first, frame, tally, mult)[0]
    keep = [() if dim in dims else split for dim, split in enumerate(layout)]
    moved = [axis for dim in dims for axis in layout[dim]]
    if moved and eqn.primitive.name == "sort":
        for dim, split in enumerate(keep):
            if dim not in dims and shape[dim] % shards([*split, *moved], model.sizes) == 0:
                keep[dim] = canonical([[*split, *moved]], model.order)[0]
                break
    lay = tuple(keep)
    for operand in eqn.invars:
        if len(shape_of(operand)) == len(lay):
            model.move(operand, lay, frame, tally, mult)
    model.work(eqn, lay, tally, mult)
    for result in eqn.outvars:
        same_rank = len(shape_of(result)) == len(lay)
        model.set(frame, result, (lay if same_rank else replicated(len(shape_of(result))), NO_AXES))


def shift(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """A roll along one dimension (``primitives/shift.py``, a pipeline's step): the layout
    kept, a partial sum passing through (it is linear); split over some axes, each
    device sends its block to a neighbour, one collective-permute."""
    operand = eqn.invars[0]
    layout, partial = model.read(frame, operand)
    split = layout[eqn.params["axis"]]
    if split:
        block = model.nbytes(operand, layout)
        tally.pay([("collective-permute", shards(split, model.sizes), block, None)], mult)
    model.set(frame, eqn.outvars[0], (layout, partial))
