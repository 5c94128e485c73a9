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


def window(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """reduce_window_* (pooling), select_and_gather_add: one operand's layout, kept
    where windows tile the blocks; the others, of the same shape, follow it."""
    v, out = eqn.invars[0], eqn.outvars[0]
    layout = _window_layout(model, eqn.params, v, model.settled(v, frame, tally, mult)[0])
    for w in eqn.invars:
        if shape_of(w) == shape_of(v):
            model.move(w, layout, frame, tally, mult)
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
    model.work(eqn, lay, tally, mult)
    model.set(frame, out, (lay, NO_AXES))


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
    model.work(eqn, upd, tally, mult)
    model.set(frame, eqn.outvars[0], (layout, NO_AXES))


def along_axis(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
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
    model.work(eqn, lay, tally, mult)
    for w in eqn.outvars:
        same_rank = len(shape_of(w)) == len(lay)
        model.set(frame, w, (lay if same_rank else replicated(len(shape_of(w))), NO_AXES))
