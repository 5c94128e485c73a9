"""Layouts as the cost model sees them: axis sets per dimension, their sizes and moves.

NOTE [auto layouts]: a layout is a tuple with one entry per dimension, each a
tuple of mesh axis names in mesh order (``((), ("model",))`` is
``P(None, "model")``); a value may also be a *partial sum* over some axes (a
contraction over a sharded dimension leaves one). Keeping the order canonical
makes equal layouts equal keys. Moving a value between layouts costs collectives,
counted as the report's collectives table counts them (NOTE [collective table]):
each collective's operand bytes on one device. Partial axes the target shards
become one reduce-scatter, the rest one all-reduce; axes that change dimension
one all-to-all; axes the target drops one all-gather; axes the target adds are a
local slice, free.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence

Layout = tuple[tuple[str, ...], ...]
Axes = frozenset[str]
NO_AXES: Axes = frozenset()


def replicated(ndim: int) -> Layout:
    return ((),) * ndim


def canonical(dims: Sequence[Sequence[str]], order: Sequence[str]) -> Layout:
    """``dims`` with each dimension's axes in mesh order (NOTE [auto layouts])."""
    rank = {a: i for i, a in enumerate(order)}
    return tuple(tuple(sorted(d, key=rank.__getitem__)) for d in dims)


def used_axes(layout: Layout) -> Axes:
    return frozenset(a for d in layout for a in d)


def shards(axes: Sequence[str], sizes: Mapping[str, int]) -> int:
    return math.prod(sizes[a] for a in axes)


def local_elements(shape: Sequence[int], layout: Layout, sizes: Mapping[str, int]) -> int:
    """Elements of one device's block (the largest, for uneven splits)."""
    return math.prod(-(-n // shards(d, sizes)) for n, d in zip(shape, layout, strict=True))


def fits(shape: Sequence[int], layout: Layout, sizes: Mapping[str, int]) -> bool:
    """Whether every sharded dimension splits evenly."""
    return all(n % shards(d, sizes) == 0 for n, d in zip(shape, layout, strict=True))


def candidates(
    shape: Sequence[int], order: Sequence[str], sizes: Mapping[str, int], free: Sequence[str]
) -> list[Layout]:
    """Every layout of ``shape`` that splits evenly: each axis of ``free`` on one
    dimension or none.

    Replicated comes first (the search's starting point); axes of size 1 are never used.
    """
    axes = [a for a in order if sizes[a] > 1 and a in free]
    found: list[Layout] = []
    for placement in itertools.product(range(-1, len(shape)), repeat=len(axes)):
        dims: list[list[str]] = [[] for _ in shape]
        for a, d in zip(axes, placement, strict=True):
            if d >= 0:
                dims[d].append(a)
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
) -> Iterator[tuple[str, int, float]]:
    """The collectives that take a value from ``src`` (+ ``partial``) to ``dst``.

    Yields ``(kind, devices in each group, operand bytes per device)`` in the
    order they run (NOTE [auto layouts]).
    """
    cur = [list(d) for d in src]
    block = float(local_elements(shape, src, sizes) * itemsize)
    dst_axis_dim = {a: i for i, d in enumerate(dst) for a in d}
    if partial:
        scatter = sorted(a for a in partial if a in dst_axis_dim and a not in used_axes(src))
        reduce = sorted(partial - set(scatter))
        if reduce:
            yield "all-reduce", shards(reduce, sizes), block
        if scatter:
            yield "reduce-scatter", shards(scatter, sizes), block
            for a in scatter:
                cur[dst_axis_dim[a]].append(a)
            block /= shards(scatter, sizes)
    moved = [a for i, d in enumerate(cur) for a in d if dst_axis_dim.get(a, i) != i]
    if moved:
        yield "all-to-all", shards(moved, sizes), block
        for a in moved:
            for d in cur:
                if a in d:
                    d.remove(a)
            cur[dst_axis_dim[a]].append(a)
    gathered = [a for d in cur for a in d if a not in dst_axis_dim]
    if gathered:
        yield "all-gather", shards(gathered, sizes), block
