"""Hypothesis strategies for meshes, partition specs, shapes and every sharding form.

Needs hypothesis: ``pip install "partitioner[hypothesis]"``. Each strategy draws only
valid objects (a test draws thousands and checks each against jax's constructors and
partitioner's parsers), and shrinks towards small ones: fewer mesh axes, size-1 axes,
devices in order, Auto axes, specs that partition nothing and leave out trailing
``None`` entries, the smallest shapes. A failing property then reports a small mesh
and a short spec.

The strategies that take a ``mesh`` take a concrete one: draw it first, with
``st.data()`` or ``meshes().flatmap(...)``::

    @given(st.data())
    def test_rule(data):
        mesh = data.draw(meshes())
        spec, shape = data.draw(specs_and_shapes(mesh))
        ...

Meshes are over ``jax.devices()`` unless ``devices=`` gives others; any objects with
an ``id`` do for properties that only convert layouts (a mesh of 512 stand-in devices
costs nothing), while :func:`arrays` needs real devices.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Sequence
from typing import Any

try:
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ImportError as e:
    raise ImportError(
        "partitioner.testing.strategies needs hypothesis, which is not installed: "
        'pip install "partitioner[hypothesis]" (or pip install hypothesis)'
    ) from e

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding

from _partitioner_pytest.axis_types import AxisTypes, normalize_axis_types

from .._src import jax_private as jp
from .._src.sharding.checks import check_spec
from .._src.sharding.parsed import ParsedPartitionSpec
from .._src.sharding.partition_spec import UNCONSTRAINED, PartitionSpec, Spec
from .._src.sharding.sharding_spec import ShardingSpec, sharding_spec_from_parsed

DEFAULT_AXIS_NAMES: tuple[str, ...] = ("a", "b", "c", "d", "e", "f", "g", "h")
"""The axis names :func:`meshes` draws from unless told otherwise."""

ENCODINGS: tuple[str, ...] = ("iota", "explicit")
"""The device-list encodings :func:`op_shardings` draws: jax's own (``"iota"``, as
``NamedSharding`` converts) and an explicit list of device positions."""


# --- meshes ---


def meshes(
    *,
    devices: Sequence[Any] | None = None,
    min_axes: int = 1,
    max_axes: int = 3,
    axis_names: Sequence[Hashable] = DEFAULT_AXIS_NAMES,
    max_axis_size: int | None = None,
    axis_types: AxisTypes = (AxisType.Auto, AxisType.Explicit),
    shuffle_devices: bool = True,
) -> st.SearchStrategy[Mesh]:
    """``jax.sharding.Mesh`` objects over some of ``devices``.

    The axis sizes multiply to a divisor of the device count (8 devices give meshes
    of 1, 2, 4 or 8 of them); the mesh takes that many devices, in order or (with
    ``shuffle_devices``) any of them in any order.

    Args:
        devices: the devices to draw from; ``jax.devices()`` (read when drawing) if
            None. Any objects with an ``id`` do for conversions only.
        min_axes: the fewest mesh axes (at least 1).
        max_axes: the most mesh axes.
        axis_names: the names drawn from (distinct); each mesh takes as many as it
            has axes, in any order.
        max_axis_size: the largest size an axis may have (None: no bound).
        axis_types: one ``jax.sharding.AxisType`` (every axis of that type), or a
            sequence of them that each axis draws its type from (the first is what a
            failure shrinks to); a type may be given by name (``"auto"``), as
            everywhere in partitioner.testing.
        shuffle_devices: also draw meshes over other devices than the first, and
            in other orders.

    Raises:
        ValueError, TypeError: a bound is out of range, names repeat, there are
            fewer names than ``max_axes``, or ``axis_types`` is none of the above.
    """
    where = "meshes"
    _check_int(min_axes, "min_axes", where, 1)
    _check_int(max_axes, "max_axes", where, min_axes)
    if max_axis_size is not None:
        _check_int(max_axis_size, "max_axis_size", where, 1)
    names = tuple(axis_names)
    if len(set(names)) != len(names) or len(names) < max_axes:
        raise ValueError(
            f"meshes: axis_names must hold at least max_axes={max_axes} distinct names, "
            f"got {names!r}"
        )
    types = normalize_axis_types(axis_types, where)
    pool = None if devices is None else tuple(devices)
    if pool is not None and not pool:
        raise ValueError("meshes: devices is empty")
    drawn_from = (types,) if isinstance(types, AxisType) else types
    return _meshes(pool, min_axes, max_axes, names, max_axis_size, drawn_from, shuffle_devices)


@st.composite
def _meshes(
    draw: st.DrawFn,
    pool: tuple[Any, ...] | None,
    min_axes: int,
    max_axes: int,
    names: tuple[Hashable, ...],
    max_axis_size: int | None,
    types: tuple[AxisType, ...],
    shuffle_devices: bool,
) -> Mesh:
    devices = pool if pool is not None else tuple(jax.devices())
    # NOTE [edge cases drawn often]: a mesh is "drawn" (what a failure shrinks to) or,
    # one time in three, the largest over its number of axes: every device, spread as
    # evenly as the axes allow. Both kinds make the same draws, so that a failure found
    # on the largest mesh shrinks on: the shrinker turns the kind to "drawn", and the
    # drawn sizes take over. The most axes are drawn more often than the others.
    maximal = draw(st.sampled_from(_MESH_KINDS)) == "maximal"
    counts = (*range(min_axes, max_axes + 1), max_axes, max_axes)
    n_axes = draw(st.sampled_from(counts))  # the fewest first: what a failure shrinks to
    axis_names = draw(
        st.lists(st.sampled_from(names), min_size=n_axes, max_size=n_axes, unique=True)
    )
    spread = draw(st.permutations(_spread(len(devices), n_axes, max_axis_size)))
    # Every axis draws from the same choices (the divisors of the device count), cut
    # down to what is left: a draw whose choices depended on the sizes before it
    # would shift every later draw when one of those shrinks, and stall the shrinker.
    sizes, left = [], len(devices)
    for _ in range(n_axes):
        size = math.gcd(draw(st.sampled_from(_divisors(len(devices), max_axis_size))), left)
        sizes.append(size)
        left //= size
    sizes = list(spread) if maximal else sizes
    axis_types = tuple(draw(st.sampled_from(types)) for _ in range(n_axes))
    n = math.prod(sizes)
    chosen: Sequence[int] = range(n)
    if shuffle_devices and draw(st.booleans()):  # False (in order) is what a failure shrinks to
        # One drawn seed, not one draw per device: a mesh of 840 devices stays cheap.
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        chosen = rng.permutation(len(devices))[:n].tolist()
    grid = np.empty(n, dtype=object)
    grid[:] = [devices[i] for i in chosen]
    return Mesh(grid.reshape(sizes), tuple(axis_names), axis_types=axis_types)


@functools.lru_cache(maxsize=256)
def _divisors(n: int, cap: int | None) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0 and (cap is None or d <= cap))


#: NOTE [edge cases drawn often]: helpers that model code writes by hand break where
#: hypothesis, drawing each choice on its own, seldom goes: every mesh axis in one
#: dimension, tuples of three axes and more, size-1 axes inside tuples, the largest
#: mesh (all devices, the most axes). So a mesh is the largest one a third of the time
#: and a spec puts every axis, or a long tuple of them, in one dimension two times in three.
#: The first entry is the ordinary draw, what a failure shrinks to.
_MESH_KINDS = ("drawn", "drawn", "maximal")
_SPEC_KINDS = ("scattered", "every axis in one dimension", "a long tuple")


def _remainders(k: int) -> st.SearchStrategy[int]:
    """What is left over past a multiple of ``k`` pieces (NOTE [edge cases drawn often]):
    any of ``1 .. k-1``; or, three times in four, a divisor of ``k`` larger than 1 (half of a
    2x2 split, where a check of each axis on its own passes and the whole split does
    not); or one piece more or one short."""
    larger = _divisors(k, k - 1)[1:]
    kinds = [st.integers(1, k - 1), st.sampled_from(sorted({1, k - 1}))]
    if larger:  # half of the pieces (the largest divisor) is the most telling
        kinds += [st.sampled_from(larger), st.sampled_from(larger), st.just(larger[-1])] * 2
    return st.sampled_from(kinds).flatmap(lambda s: s)


@functools.lru_cache(maxsize=256)
def _spread(n: int, n_axes: int, cap: int | None) -> tuple[int, ...]:
    """Axis sizes multiplying to as much of ``n`` as ``cap`` allows, its prime factors
    dealt out one by one so that as many axes as possible are larger than 1."""
    factors, m, p = [], n, 2
    while m > 1:
        while m % p == 0:
            factors.append(p)
            m //= p
        p += 1
    sizes = [1] * n_axes
    for k, f in enumerate(sorted(factors)):
        axis = min(range(n_axes), key=lambda i: (sizes[i], i)) if k >= n_axes else k
        if cap is None or sizes[axis] * f <= cap:
            sizes[axis] *= f
    return tuple(sizes)


# --- partition specs and shapes ---


def partition_specs(
    mesh: Mesh, ndim: int | None = None, *, max_ndim: int = 4, unconstrained: bool = False
) -> st.SearchStrategy[Spec]:
    """Valid ``PartitionSpec`` objects over ``mesh`` for values of rank ``ndim``.

    Each mesh axis partitions at most one dimension; a dimension takes one axis, a
    tuple of axes (in any order, major to minor), ``None``, or (with
    ``unconstrained``) ``UNCONSTRAINED``; trailing ``None`` entries may be left out.
    A spec that partitions nothing (``P()``, ``P(None, None)``) is drawn too.

    Args:
        mesh: the mesh the specs are over.
        ndim: the rank of the values; drawn from ``0 .. max_ndim`` if None.
        max_ndim: the largest rank drawn when ``ndim`` is None.
        unconstrained: also draw ``UNCONSTRAINED`` entries (what
            ``with_sharding_constraint`` accepts; ``pjit`` inputs and outputs do not),
            over meshes with an Auto axis (jax refuses them otherwise).
    """
    _check_mesh(mesh, "partition_specs")
    return _specs(mesh, _ranks(ndim, max_ndim, "partition_specs"), unconstrained, False)


@st.composite
def _specs(
    draw: st.DrawFn, mesh: Mesh, ranks: tuple[int, ...], unconstrained: bool, split: bool
) -> Spec:
    """A spec of one of ``ranks``; with ``split``, one that cuts some dimension in pieces."""
    rank = draw(st.sampled_from(ranks))
    dims: list[list[Hashable]] = [[] for _ in range(rank)]
    if rank:
        # NOTE [edge cases drawn often]; every kind makes the same draws, so a failure
        # found with a long tuple shrinks on to a scattered spec.
        kind = draw(st.sampled_from(_SPEC_KINDS))
        axes = draw(st.permutations(mesh.axis_names))
        long = draw(st.integers(min(3, len(axes)), len(axes)))
        together = draw(st.integers(0, rank - 1))
        scattered = [draw(st.sampled_from((None, *range(rank)))) for _ in axes]  # None first
        many = {"scattered": 0, "a long tuple": long}.get(kind, len(axes))
        dims[together] += axes[:many]
        for axis, d in zip(axes[many:], scattered[many:], strict=True):
            if d is not None:
                dims[d].append(axis)
    sizes = dict(mesh.shape)
    # jax allows UNCONSTRAINED only where some mesh axis is Auto (XLA may choose there).
    unconstrained = unconstrained and AxisType.Auto in mesh.axis_types
    if split and not any(sizes[a] > 1 for axes in dims for a in axes):
        big = [a for a in mesh.axis_names if sizes[a] > 1]
        dims[draw(st.integers(0, rank - 1))].append(draw(st.sampled_from(big)))
    entries: list[Any] = []
    for axes in dims:
        if axes:
            entries.append(axes[0] if len(axes) == 1 else tuple(axes))
        else:
            entries.append(draw(st.sampled_from((None, UNCONSTRAINED))) if unconstrained else None)
    shortest = len(entries)
    while shortest and entries[shortest - 1] is None:
        shortest -= 1
    return PartitionSpec(*entries[: draw(st.integers(shortest, len(entries)))])


def shapes(
    mesh: Mesh,
    spec: Any,
    *,
    ndim: int | None = None,
    max_ndim: int = 4,
    uneven: bool = False,
    max_multiple: int = 3,
) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes of values that ``spec`` lays out over ``mesh``.

    Each dimension is a multiple (1 to ``max_multiple``) of the number of pieces the
    spec cuts it into, so every device gets an equal block; with ``uneven``, at
    least one cut dimension is not a multiple (XLA pads it; ``pjit`` inputs and
    outputs refuse it, ``with_sharding_constraint`` accepts it).

    Args:
        mesh: the mesh.
        spec: a PartitionSpec (or ParsedPartitionSpec, NamedSharding, None) valid for
            ``mesh``.
        ndim: the rank; drawn from ``len(spec) .. max(len(spec), max_ndim)`` if None.
        max_ndim: the largest rank drawn when ``ndim`` is None.
        uneven: draw only shapes the spec does not divide evenly.
        max_multiple: the largest number of blocks per piece.

    Raises:
        ValueError: ``spec`` is not valid for ``mesh``, is longer than ``ndim``, or
            (with ``uneven``) cuts no dimension into more than one piece.
    """
    where = "shapes"
    _check_mesh(mesh, where)
    _check_int(max_multiple, "max_multiple", where, 1)
    parsed = ParsedPartitionSpec.coerce(spec, f"{where} spec", allow_unconstrained=True)
    ranks = _ranks(ndim, max(max_ndim, len(parsed)), where, len(parsed))
    check_spec(parsed, (1,) * ranks[-1], mesh, where, check_divisible=False)
    if uneven and not any(k > 1 for k in parsed.shards_per_dim(mesh, len(parsed))):
        raise ValueError(
            f"shapes: uneven=True needs a spec that cuts some dimension into pieces, but "
            f"{parsed.describe()} over {dict(mesh.shape)} cuts none"
        )
    return _shapes(parsed, mesh, ranks, uneven, max_multiple)


@st.composite
def _shapes(
    draw: st.DrawFn,
    spec: ParsedPartitionSpec,
    mesh: Mesh,
    ranks: tuple[int, ...],
    uneven: bool,
    max_multiple: int,
) -> tuple[int, ...]:
    rank = draw(st.sampled_from(ranks))
    pieces = spec.shards_per_dim(mesh, rank)
    ragged: set[int] = set()
    if uneven:
        cut = [d for d, k in enumerate(pieces) if k > 1]
        ragged = set(draw(st.lists(st.sampled_from(cut), min_size=1, unique=True)))
    shape = []
    for d, k in enumerate(pieces):
        if d in ragged:
            rest = draw(_remainders(k))
            shape.append(k * draw(st.integers(0, max_multiple - 1)) + rest)
        else:
            shape.append(k * draw(st.integers(1, max_multiple)))
    return tuple(shape)


def specs_and_shapes(
    mesh: Mesh,
    *,
    ndim: int | None = None,
    max_ndim: int = 4,
    unconstrained: bool = False,
    uneven: bool = False,
    max_multiple: int = 3,
) -> st.SearchStrategy[tuple[Spec, tuple[int, ...]]]:
    """``(spec, shape)`` pairs: a spec from :func:`partition_specs`, a shape from :func:`shapes`.

    With ``uneven``, the spec always cuts some dimension into pieces and the shape
    does not divide evenly. Arguments as those two strategies.

    Raises:
        ValueError: ``uneven`` over a mesh with no axis larger than 1, or with
            ``ndim=0``.
    """
    where = "specs_and_shapes"
    _check_mesh(mesh, where)
    ranks = _ranks(ndim, max_ndim, where, 1 if uneven else 0)
    if uneven and mesh.size == 1:
        raise ValueError(
            f"specs_and_shapes: uneven=True needs a mesh axis larger than 1, got {dict(mesh.shape)}"
        )
    return _specs(mesh, ranks, unconstrained, uneven).flatmap(
        lambda spec: st.tuples(
            st.just(spec),
            shapes(
                mesh,
                spec,
                ndim=ndim,
                max_ndim=max_ndim,
                uneven=uneven,
                max_multiple=max_multiple,
            ),
        )
    )


# --- the other forms of a layout ---


def named_shardings(
    mesh: Mesh, ndim: int | None = None, *, max_ndim: int = 4
) -> st.SearchStrategy[NamedSharding]:
    """``NamedSharding(mesh, spec)`` for specs from :func:`partition_specs`."""
    return partition_specs(mesh, ndim, max_ndim=max_ndim).map(lambda s: NamedSharding(mesh, s))


def op_shardings(
    mesh: Mesh,
    ndim: int | None = None,
    *,
    max_ndim: int = 4,
    encodings: Sequence[str] = ENCODINGS,
) -> st.SearchStrategy[Any]:
    """XLA ``OpSharding`` protos of values of rank ``ndim`` laid out over ``mesh``.

    Built by jax's own conversion (``NamedSharding(mesh, spec)`` to an HloSharding,
    for a spec from :func:`partition_specs`), not partitioner's, so a property
    comparing them with partitioner's parser checks one against the other. Device
    numbers are positions in ``mesh.devices.flat``, as in a compiled program's device
    assignment.

    Args:
        mesh: the mesh the value is laid out over.
        ndim: the rank of the value; drawn from ``0 .. max_ndim`` if None.
        max_ndim: the largest rank drawn when ``ndim`` is None.
        encodings: ``"iota"`` (jax's form: ``iota_reshape_dims`` and
            ``iota_transpose_perm``) and/or ``"explicit"`` (``tile_assignment_devices``).
    """
    _check_mesh(mesh, "op_shardings")
    forms = tuple(encodings)
    if not forms or not set(forms) <= set(ENCODINGS):
        raise ValueError(f"op_shardings: encodings must be some of {ENCODINGS}, got {forms!r}")
    return _op_shardings(mesh, _ranks(ndim, max_ndim, "op_shardings"), forms)


@st.composite
def _op_shardings(
    draw: st.DrawFn, mesh: Mesh, ranks: tuple[int, ...], encodings: tuple[str, ...]
) -> Any:
    rank = draw(st.sampled_from(ranks))
    spec = draw(_specs(mesh, (rank,), False, False))
    hlo = jp.hlo_sharding_of(NamedSharding(mesh, spec), rank)
    proto = hlo.to_proto()
    if draw(st.sampled_from(encodings)) == "explicit" and proto.type == jp.OpSharding.Type.OTHER:
        explicit = jp.OpSharding()
        explicit.type = proto.type
        explicit.tile_assignment_dimensions = list(proto.tile_assignment_dimensions)
        explicit.tile_assignment_devices = [int(d) for d in hlo.tile_assignment_devices()]
        explicit.replicate_on_last_tile_dim = proto.replicate_on_last_tile_dim
        explicit.last_tile_dims = list(proto.last_tile_dims)
        return explicit
    return proto


def sharding_specs(
    mesh: Mesh, ndim: int | None = None, *, max_ndim: int = 4
) -> st.SearchStrategy[ShardingSpec]:
    """pmap-style ``ShardingSpec`` objects laying values of rank ``ndim`` out over ``mesh``.

    ``sharding_spec_from_parsed`` of a spec from :func:`partition_specs`: one
    ``Chunked`` or ``NoSharding`` entry per dimension, one ``ShardedAxis`` or
    ``Replicated`` entry per mesh axis, so ``mesh_shape`` is the mesh's shape.
    """
    _check_mesh(mesh, "sharding_specs")
    return _sharding_specs(mesh, _ranks(ndim, max_ndim, "sharding_specs"))


@st.composite
def _sharding_specs(draw: st.DrawFn, mesh: Mesh, ranks: tuple[int, ...]) -> ShardingSpec:
    rank = draw(st.sampled_from(ranks))
    return sharding_spec_from_parsed((1,) * rank, draw(_specs(mesh, (rank,), False, False)), mesh)


def arrays(
    mesh: Mesh,
    spec: Any,
    shape: Sequence[int],
    dtype: Any = np.float32,
    *,
    elements: st.SearchStrategy[Any] | None = None,
) -> st.SearchStrategy[jax.Array]:
    """``jax.Array`` values of ``shape`` and ``dtype`` laid out by ``spec`` over ``mesh``.

    The values come from ``hypothesis.extra.numpy.arrays(dtype, shape,
    elements=elements)``; each is placed with ``jax.device_put`` on
    ``NamedSharding(mesh, spec)``.

    Raises:
        ValueError: ``spec`` is not valid for ``mesh`` and ``shape`` (jax lays out
            only shapes a spec divides evenly), or the mesh's devices are stand-ins.
    """
    where = "arrays"
    _check_mesh(mesh, where)
    parsed = ParsedPartitionSpec.coerce(spec, f"{where} spec")
    check_spec(parsed, tuple(shape), mesh, where)
    if not all(isinstance(d, jax.Device) for d in mesh.devices.flat):
        raise ValueError("arrays: the mesh must be over real jax devices to hold arrays")
    sharding = NamedSharding(mesh, parsed.to_closed_spec(), memory_kind=parsed.memory_kind)
    values = hnp.arrays(dtype, tuple(shape), elements=elements)
    return values.map(lambda x: jax.device_put(x, sharding))


def argument_shardings(mesh: Mesh, args: Any) -> st.SearchStrategy[Any]:
    """A ``NamedSharding`` over ``mesh`` for every array leaf of the pytree ``args``, each
    dividing its leaf's shape evenly (``None`` for a leaf that is not an array, or has
    rank 0 and nothing to split): the layouts a function's arguments may arrive in.

    Drawn as :func:`partition_specs` draws (every axis in one dimension, long tuples,
    size-1 axes, unused axes), then each dimension keeps the longest run of its axes
    whose sizes divide it. Shrinks towards every leaf replicated.

    Args:
        mesh: the mesh.
        args: a pytree whose leaves are arrays, ``jax.ShapeDtypeStruct`` s or other
            values (left alone).
    """
    _check_mesh(mesh, "argument_shardings")
    leaves, tree = jax.tree.flatten(args)
    return st.tuples(*(_leaf_sharding(mesh, leaf) for leaf in leaves)).map(
        lambda drawn: jax.tree.unflatten(tree, drawn)
    )


def _leaf_sharding(mesh: Mesh, leaf: Any) -> st.SearchStrategy[NamedSharding | None]:
    shape = getattr(leaf, "shape", None)
    if shape is None or not hasattr(leaf, "dtype"):
        return st.none()
    shape = tuple(shape)
    return _specs(mesh, (len(shape),), False, False).map(
        lambda spec: NamedSharding(mesh, _dividing(spec, shape, mesh))
    )


def _dividing(spec: Spec, shape: tuple[int, ...], mesh: Mesh) -> Spec:
    """``spec`` with each dimension keeping the longest prefix of its axes that divides it."""
    sizes, entries = dict(mesh.shape), []
    for d, entry in enumerate(tuple(spec) + (None,) * (len(shape) - len(spec))):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        kept: list[Hashable] = []
        for a in axes:
            if shape[d] % (math.prod(sizes[k] for k in kept) * sizes[a]):
                break
            kept.append(a)
        entries.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*entries)


# --- argument checks ---


def _check_mesh(mesh: Any, where: str) -> None:
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"{where}: mesh must be a jax.sharding.Mesh (draw one from meshes() first), "
            f"got {type(mesh).__name__}"
        )


def _check_int(value: Any, name: str, where: str, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{where}: {name} must be >= {minimum}, got {value}")


def _ranks(ndim: int | None, max_ndim: int, where: str, minimum: int = 0) -> tuple[int, ...]:
    """The ranks to draw: ``ndim`` alone, else ``minimum .. max_ndim``."""
    if ndim is not None:
        _check_int(ndim, "ndim", where, minimum)
        return (ndim,)
    _check_int(max_ndim, "max_ndim", where, minimum)
    return tuple(range(minimum, max_ndim + 1))


__all__ = [
    "DEFAULT_AXIS_NAMES",
    "ENCODINGS",
    "argument_shardings",
    "arrays",
    "meshes",
    "named_shardings",
    "op_shardings",
    "partition_specs",
    "shapes",
    "sharding_specs",
    "specs_and_shapes",
]
