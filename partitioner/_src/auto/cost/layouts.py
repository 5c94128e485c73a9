"""Layouts as the cost model sees them: axis sets per dimension, their sizes and moves.

NOTE [auto layouts]: a layout is a tuple with one entry per dimension, each a
tuple of mesh axis names in mesh order (``((), ("model",))`` is
``P(None, "model")``); a value may also be a *partial sum* over some axes (a
contraction over a sharded dimension leaves one). Keeping the order canonical
makes equal layouts equal keys. Moving a value between layouts costs collectives,
counted as the report's collectives table counts them (NOTE [collective table]):
each collective's operand bytes on one device. Partial axes the target shards
become one reduce-scatter, the rest one all-reduce after it, of the scattered block
(XLA's order); axes that change dimension
one all-to-all; axes the target drops one all-gather; axes the target adds are a
local slice, free.

NOTE [one dimension per collective]: an all-gather gathers one dimension, and XLA:CPU
reduces with all-reduces (a reduce-scatter is an all-reduce and a slice). Where the
axes a move gathers split two dimensions, XLA gathers one dimension after the other,
the minor one first, each all-gather moving the block gathered so far; where a partial
sum is scattered over two dimensions, it all-reduces the whole block once per
dimension, then slices. Counting them as one collective over all the axes had the
model price a residual stream split over both mesh axes (the batch over "data", the
features over "model") at half XLA's bytes: 2.8 MB against 4.1 MB on 8 transformer
blocks, a layout it then preferred (probed on every move of an ``[8, 16, 128]`` value
over the 4x2 mesh).

NOTE [involuntary rematerialization]: some moves XLA's SPMD partitioner cannot make
with those collectives: where every tiled dimension changes (the target tiles none of
the dimensions the source tiles) and the move is not one all-to-all of one dimension's
tiles, whole, to one other dimension, it replicates the whole value on every device
and slices the target's block out ("Involuntary full rematerialization", its warning
says; the rule :func:`involuntary` states agrees with XLA's warning on the moves of
``tests/auto/test_involuntary.py``, neighbours each way, picked from a probe of every
move of a 2-d and a 3-d value over a 4x2 mesh). Such a
move is priced as XLA makes it (:data:`REMATERIALIZE`: every device gathers the whole
value, which it then holds), so the search sees its cost, and its memory, before XLA
does, and a layout that needs one is not what it proposes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence

from .combiner import Group

Layout = tuple[tuple[str, ...], ...]
#: The kind of a move XLA can only make by replicating the whole value (NOTE [involuntary
#: rematerialization]): an all-gather from every tile to the whole.
REMATERIALIZE = "all-gather (full rematerialization)"
Axes = frozenset[str]
NO_AXES: Axes = frozenset()


def replicated(ndim: int) -> Layout:
    return ((),) * ndim


def canonical(dims: Sequence[Sequence[str]], order: Sequence[str]) -> Layout:
    """``dims`` with each dimension's axes in mesh order (NOTE [auto layouts])."""
    rank = {axis: i for i, axis in enumerate(order)}
    return tuple(tuple(sorted(axes, key=rank.__getitem__)) for axes in dims)


def used_axes(layout: Layout) -> Axes:
    return frozenset(axis for axes in layout for axis in axes)


def shards(axes: Sequence[str], sizes: Mapping[str, int]) -> int:
    return math.prod(sizes[axis] for axis in axes)


def local_elements(shape: Sequence[int], layout: Layout, sizes: Mapping[str, int]) -> int:
    """Elements of one device's block (the largest, for uneven splits)."""
    return math.prod(
        -(-size // shards(axes, sizes)) for size, axes in zip(shape, layout, strict=True)
    )


def fits(shape: Sequence[int], layout: Layout, sizes: Mapping[str, int]) -> bool:
    """Whether every sharded dimension splits evenly."""
    return all(size % shards(axes, sizes) == 0 for size, axes in zip(shape, layout, strict=True))


def candidates(
    shape: Sequence[int], order: Sequence[str], sizes: Mapping[str, int], free: Sequence[str]
) -> list[Layout]:
    """Every layout of ``shape`` that splits evenly: each axis of ``free`` on one
    dimension or none.

    Replicated comes first (the search's starting point); axes of size 1 are never used.
    """
    axes = [axis for axis in order if sizes[axis] > 1 and axis in free]
    found: list[Layout] = []
    for placement in itertools.product(range(-1, len(shape)), repeat=len(axes)):
        dims: list[list[str]] = [[] for _ in shape]
        for axis, dim in zip(axes, placement, strict=True):
            if dim >= 0:
                dims[dim].append(axis)
        layout = canonical(dims, order)
        if fits(shape, layout, sizes) and layout not in found:
            found.append(layout)
    return found


def moves(
    shape: Sequence[int],
    itemsize: int,
    src: Layout,
    partial: Axes,
    dst: Layout,
    sizes: Mapping[str, int],
) -> Iterator[tuple[str, int, float, Group]]:
    """The collectives that take a value from ``src`` (+ ``partial``) to ``dst``.

    Yields ``(kind, devices in each group, operand bytes per device, group)`` in the
    order they run (NOTE [auto layouts]); ``group`` is what XLA's all-reduce combiner
    merges the collective by (a sum over its mesh axes: XLA:CPU reduces with an
    all-reduce, also where it scatters), None for the others (NOTE [all-reduce
    combiner] in ``combiner.py``).
    """
    cur = [list(axes) for axes in src]
    block = float(local_elements(shape, src, sizes) * itemsize)
    dst_axis_dim = {axis: i for i, axes in enumerate(dst) for axis in axes}
    if partial:
        scatter = sorted(
            axis for axis in partial if axis in dst_axis_dim and axis not in used_axes(src)
        )
        reduce = sorted(partial - set(scatter))
        if scatter:  # first, so the all-reduce of the rest moves the scattered block
            dims = sorted({dst_axis_dim[axis] for axis in scatter})
            for dim in dims:  # NOTE [one dimension per collective]
                over = tuple(axis for axis in scatter if dst_axis_dim[axis] == dim)
                yield "reduce-scatter", shards(over, sizes), block, ("add", over)
            for axis in scatter:
                cur[dst_axis_dim[axis]].append(axis)
            block /= shards(scatter, sizes)
        if reduce:
            yield "all-reduce", shards(reduce, sizes), block, ("add", tuple(reduce))
    moved = [axis for i, axes in enumerate(cur) for axis in axes if dst_axis_dim.get(axis, i) != i]
    if involuntary(cur, dst):
        # NOTE [involuntary rematerialization]: XLA replicates the whole value, then
        # slices the target's block out of it.
        yield REMATERIALIZE, shards([axis for axes in cur for axis in axes], sizes), block, None
        return
    if moved:
        yield "all-to-all", shards(moved, sizes), block, None
        for axis in moved:
            for axes in cur:
                if axis in axes:
                    axes.remove(axis)
            cur[dst_axis_dim[axis]].append(axis)
    for split in reversed(cur):  # the minor dimension first (NOTE [one dimension per collective])
        gathered = [axis for axis in split if axis not in dst_axis_dim]
        if gathered:
            yield "all-gather", shards(gathered, sizes), block, None
            block *= shards(gathered, sizes)


def involuntary(src: Sequence[Sequence[str]], dst: Layout) -> bool:
    """Whether XLA can go from ``src`` to ``dst`` only by replicating the whole value
    (NOTE [involuntary rematerialization]): every tiled dimension changes (``dst`` tiles
    none of the dimensions ``src`` tiles), and the move is not one all-to-all of one
    source dimension's tiles, whole, to one target dimension (the other source
    dimensions gathered, the target sliced further)."""
    tiled = {d for d, axes in enumerate(src) if axes}
    target = {d for d, axes in enumerate(dst) if axes}
    if not tiled or not target or tiled & target:
        return False
    dst_dim = {axis: d for d, axes in enumerate(dst) for axis in axes}
    carried = [d for d in tiled if any(axis in dst_dim for axis in src[d])]
    if len(carried) != 1:
        return True  # none carried over (a gather and a slice), or two merged
    (source,) = carried
    return len({dst_dim.get(axis) for axis in src[source]}) != 1  # split, or partly dropped
