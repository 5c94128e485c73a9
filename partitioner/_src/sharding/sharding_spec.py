"""pmap-style ``ShardingSpec``: a layout written per array dimension and per mesh axis.

Why keep this older form next to PartitionSpec: it says *directly* which slice of
the global array each device holds (``indices``), which is what argument sharding
and result assembly need, and it names replication per mesh axis explicitly.
jax 0.10.2 no longer ships it, so partitioner owns a small, pure-Python version.

The model. ``sharding`` has one entry per array dimension:

- ``NoSharding()``: the dimension is whole on every device;
- ``Chunked(chunks)``: the dimension is cut into ``prod(chunks)`` equal blocks; each
  entry of ``chunks`` is one *sharded axis* (major to minor);
- ``Unstacked(size)``: the dimension (of exactly ``size``) is indexed away, one
  element per position along one sharded axis (pmap's mapped axis).

Sharded axes are numbered in dimension order (a ``Chunked`` contributes one per
chunk entry, an ``Unstacked`` one). ``mesh_mapping`` has one entry per mesh axis:
``ShardedAxis(k)`` runs along sharded axis ``k``, ``Replicated(r)`` holds ``r``
copies. Every sharded axis is used by exactly one mesh axis, so the mesh shape is
implied by the spec (:attr:`ShardingSpec.mesh_shape`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from typing import Any, TypeAlias

import jax
import numpy as np
from jax.sharding import Mesh

from .. import jax_private as jp
from .checks import check_spec
from .parsed import ParsedPartitionSpec

OpSharding = jp.OpSharding


def _positive_int(value: Any, what: str) -> int:
    """``value`` as an int >= 1; the spec types are built by hand, so say what went wrong."""
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{what} must be an int, got {value!r} of type {type(value).__name__}"
        ) from None
    if n < 1:
        raise ValueError(f"{what} must be >= 1, got {n}")
    return n


# --- per-dimension sharding ---


@dataclasses.dataclass(frozen=True)
class NoSharding:
    """The dimension is not split: every device holds all of it."""


@dataclasses.dataclass(frozen=True)
class Chunked:
    """The dimension is split into ``prod(chunks)`` equal blocks, one sharded axis per chunk entry.

    ``Chunked((2, 4))`` splits into 8 blocks; block ``i * 4 + j`` goes to position
    ``i`` on the first sharded axis and ``j`` on the second: chunk entries are
    major to minor, like the axis names of a tuple spec entry.
    """

    chunks: tuple[int, ...]

    def __post_init__(self) -> None:
        if isinstance(self.chunks, (str, bytes)) or not hasattr(self.chunks, "__iter__"):
            raise TypeError(f"Chunked(chunks) takes a tuple of ints, got {self.chunks!r}")
        chunks = tuple(_positive_int(c, "Chunked chunk count") for c in self.chunks)
        object.__setattr__(self, "chunks", chunks)

    @property
    def total(self) -> int:
        """The number of blocks the dimension is cut into."""
        return math.prod(self.chunks)


@dataclasses.dataclass(frozen=True)
class Unstacked:
    """The dimension (of exactly ``size``) is indexed away: device ``i`` along its axis gets ``x[i]``."""

    size: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _positive_int(self.size, "Unstacked size"))


# --- per-mesh-axis mapping ---


@dataclasses.dataclass(frozen=True)
class ShardedAxis:
    """This mesh axis runs along sharded axis number ``axis`` (see the module docstring)."""

    axis: int

    def __post_init__(self) -> None:
        try:
            axis = operator.index(self.axis)
        except TypeError:
            raise TypeError(f"ShardedAxis(axis) takes an int, got {self.axis!r}") from None
        if axis < 0:
            raise ValueError(f"ShardedAxis(axis) must be >= 0, got {axis}")
        object.__setattr__(self, "axis", axis)


@dataclasses.dataclass(frozen=True)
class Replicated:
    """This mesh axis holds ``replicas`` identical copies."""

    replicas: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicas", _positive_int(self.replicas, "Replicated replicas"))


DimSharding: TypeAlias = NoSharding | Chunked | Unstacked
MeshMapping: TypeAlias = ShardedAxis | Replicated


@dataclasses.dataclass(frozen=True)
class ShardingSpec:
    """A device layout: how each array dimension is cut and how mesh axes walk the pieces.

    Invariants (checked at construction, relied on by the conversions): every
    sharded axis ``0 .. n-1`` appears in exactly one ``ShardedAxis`` entry, so
    ``mesh_shape`` is well defined and ``indices(shape).shape == mesh_shape``.
    ``None`` in ``sharding`` is read as ``NoSharding()`` (pmap's old spelling).
    """

    sharding: tuple[DimSharding, ...]
    mesh_mapping: tuple[MeshMapping, ...]

    def __post_init__(self) -> None:
        sharding = tuple(NoSharding() if s is None else s for s in self.sharding)
        mesh_mapping = tuple(self.mesh_mapping)
        for s in sharding:
            if not isinstance(s, (NoSharding, Chunked, Unstacked)):
                raise TypeError(
                    f"ShardingSpec.sharding entries are NoSharding(), Chunked(...) or "
                    f"Unstacked(...), got {s!r}"
                )
        for m in mesh_mapping:
            if not isinstance(m, (ShardedAxis, Replicated)):
                raise TypeError(
                    f"ShardingSpec.mesh_mapping entries are ShardedAxis(...) or "
                    f"Replicated(...), got {m!r}"
                )
        object.__setattr__(self, "sharding", sharding)
        object.__setattr__(self, "mesh_mapping", mesh_mapping)
        used = sorted(m.axis for m in mesh_mapping if isinstance(m, ShardedAxis))
        if used != list(range(len(self._sharded_axis_sizes()))):
            raise ValueError(
                f"ShardingSpec: the sharding {sharding} has "
                f"{len(self._sharded_axis_sizes())} sharded axes, and mesh_mapping must "
                f"name each exactly once with ShardedAxis(k), but it names {used}. "
                "Example: ShardingSpec((Chunked((2,)), NoSharding()), (ShardedAxis(0), "
                "Replicated(4)))."
            )

    # --- shape of the device mesh ---

    def _sharded_axis_sizes(self) -> list[int]:
        """The size of each sharded axis, in sharded-axis order (dimension order)."""
        sizes: list[int] = []
        for s in self.sharding:
            if isinstance(s, Chunked):
                sizes.extend(s.chunks)
            elif isinstance(s, Unstacked):
                sizes.append(s.size)
        return sizes

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The device mesh this spec lays a value over, one size per ``mesh_mapping`` entry."""
        sizes = self._sharded_axis_sizes()
        return tuple(
            m.replicas if isinstance(m, Replicated) else sizes[m.axis] for m in self.mesh_mapping
        )

    @property
    def num_devices(self) -> int:
        return math.prod(self.mesh_shape)

    def _mesh_axis_of_sharded_axis(self) -> dict[int, int]:
        return {m.axis: i for i, m in enumerate(self.mesh_mapping) if isinstance(m, ShardedAxis)}

    # --- conversions ---

    def to_op_sharding(self, *, encoding: str = "explicit") -> jp.OpSharding:
        """The XLA ``OpSharding`` with the same layout; device ``i`` is position ``i`` of the flat mesh.

        The tile grid is the mesh transposed so that, dimension by dimension, the
        mesh axes of each chunk come first (major to minor), followed by the
        replicated mesh axes folded into a trailing ``replicate_on_last_tile_dim``.
        A spec that cuts nothing is REPLICATED.

        Args:
            encoding: ``"explicit"`` (``tile_assignment_devices``) or ``"iota"``
                (``iota_reshape_dims`` + ``iota_transpose_perm``).

        Raises:
            ValueError: the spec has an ``Unstacked`` dimension (an XLA tile cannot
                drop a dimension), or ``encoding`` is unknown.
        """
        if encoding not in ("explicit", "iota"):
            raise ValueError(f"encoding must be 'explicit' or 'iota', got {encoding!r}")
        if any(isinstance(s, Unstacked) for s in self.sharding):
            raise ValueError(
                f"{self!r} has an Unstacked dimension, which no OpSharding can express: "
                "XLA tiles keep every dimension. Use Chunked((n,)) and squeeze the "
                "dimension inside the computation instead."
            )
        proto = OpSharding()
        chunked = [s for s in self.sharding if isinstance(s, Chunked)]
        if all(s.total == 1 for s in chunked):
            proto.type = OpSharding.Type.REPLICATED
            return proto

        mesh_axis_of = self._mesh_axis_of_sharded_axis()
        perm = [mesh_axis_of[k] for k in range(len(mesh_axis_of))]
        perm += [i for i, m in enumerate(self.mesh_mapping) if isinstance(m, Replicated)]
        tile_dims = [s.total if isinstance(s, Chunked) else 1 for s in self.sharding]
        replicas = math.prod(m.replicas for m in self.mesh_mapping if isinstance(m, Replicated))
        if replicas > 1:
            tile_dims.append(replicas)

        proto.type = OpSharding.Type.OTHER
        proto.tile_assignment_dimensions = tile_dims
        mesh_shape = list(self.mesh_shape)
        if encoding == "iota":
            proto.iota_reshape_dims = mesh_shape
            proto.iota_transpose_perm = perm
        else:
            positions = np.arange(self.num_devices).reshape(mesh_shape).transpose(perm)
            proto.tile_assignment_devices = [int(d) for d in positions.flat]
        proto.replicate_on_last_tile_dim = replicas > 1
        return proto

    def indices(self, shape: tuple[int, ...]) -> np.ndarray:
        """Which part of a global array of ``shape`` each device holds.

        Returns:
            numpy.ndarray: an object array shaped ``mesh_shape``; each element is a tuple
            with one entry per dimension: ``slice(None)`` for a whole dimension,
            ``slice(start, stop)`` for a block of a ``Chunked`` one, and an int for
            an ``Unstacked`` one. Property (tested): for a spec built by
            :func:`sharding_spec_from_parsed`, ``indices(shape).flat`` lists what
            ``NamedSharding(mesh, spec).devices_indices_map(shape)`` gives the
            devices of ``mesh.devices.flat``, in that order.

        Raises:
            ValueError: ``shape`` has the wrong rank, a ``Chunked`` dimension is not
                divisible by its block count, or an ``Unstacked`` size differs.
        """
        shape = tuple(int(d) for d in shape)
        if len(shape) != len(self.sharding):
            raise ValueError(
                f"ShardingSpec.indices: shape {shape} has rank {len(shape)} but the spec has "
                f"{len(self.sharding)} dimensions ({self.sharding})"
            )
        per_dim: list[list[Any]] = []
        for dim, (size, s) in enumerate(zip(shape, self.sharding, strict=True)):
            if isinstance(s, Unstacked):
                if size != s.size:
                    raise ValueError(
                        f"ShardingSpec.indices: dimension {dim} of shape {shape} has size "
                        f"{size}, but the spec unstacks it as Unstacked({s.size})"
                    )
                per_dim.append(list(range(size)))
            elif isinstance(s, Chunked) and s.total > 1:
                block, ragged = divmod(size, s.total)
                if ragged:
                    raise ValueError(
                        f"ShardingSpec.indices: dimension {dim} of shape {shape} has size "
                        f"{size}, which is not divisible by {s.total}, the number of blocks "
                        f"of {s!r}. Pad it to a multiple of {s.total}."
                    )
                per_dim.append([slice(i * block, (i + 1) * block) for i in range(s.total)])
            else:
                # A whole dimension, also a Chunked one cut into a single block: the
                # same spelling jax uses, so the two index maps compare equal.
                per_dim.append([slice(None)])

        # One entry per combination of blocks; the flat order of itertools.product
        # is row-major over dimensions, and a Chunked dimension's block number is
        # row-major over its chunks, so the reshape below gives one array axis per
        # sharded axis.
        pieces = np.empty(math.prod(len(p) for p in per_dim), dtype=object)
        for i, index in enumerate(itertools.product(*per_dim)):
            pieces[i] = index
        pieces = pieces.reshape(self._sharded_axis_sizes())

        # Lay the sharded axes out along the mesh axes that run over them, and
        # broadcast over the replicated ones.
        replicated = [m.replicas for m in self.mesh_mapping if isinstance(m, Replicated)]
        n_rep = itertools.count()
        perm = [
            next(n_rep) if isinstance(m, Replicated) else len(replicated) + m.axis
            for m in self.mesh_mapping
        ]
        return np.broadcast_to(pieces, tuple(replicated) + pieces.shape).transpose(perm).copy()


def sharding_spec_from_parsed(aval_shape: tuple[int, ...], spec: Any, mesh: Mesh) -> ShardingSpec:
    """The :class:`ShardingSpec` for a value of ``aval_shape`` laid out by ``spec`` on ``mesh``.

    Each dimension is ``Chunked`` by the sizes of the mesh axes the spec names for it
    (in spec order), or ``NoSharding``; each mesh axis is a ``ShardedAxis`` if the spec
    uses it, otherwise ``Replicated``. Size-1 mesh axes are kept (as chunks of 1), so
    ``mesh_shape == tuple(mesh.devices.shape)``. Properties (tested):
    ``to_op_sharding()`` equals :func:`get_aval_sharding_proto` as an HloSharding,
    and ``indices`` matches ``NamedSharding(mesh, spec).devices_indices_map``.

    Args:
        aval_shape: the value's shape (only its rank matters here).
        spec: a ParsedPartitionSpec, a PartitionSpec or None.
        mesh: the mesh; its devices may be any objects.

    Raises:
        ValueError: the spec names an axis not in ``mesh``, is longer than the rank,
            or has an UNCONSTRAINED dimension (which has no definite layout).
    """
    spec = ParsedPartitionSpec.coerce(
        spec, "sharding_spec_from_parsed spec", allow_unconstrained=True
    )
    shape = tuple(aval_shape)
    check_spec(spec, shape, mesh, "sharding_spec_from_parsed", check_divisible=False)
    if spec.unconstrained_dims:
        raise ValueError(
            f"sharding_spec_from_parsed: the spec {spec.describe()} leaves dimensions "
            f"{sorted(spec.unconstrained_dims)} UNCONSTRAINED, which has no definite device "
            "layout; use None or mesh axis names there."
        )
    sizes = dict(mesh.shape)
    parts = list(spec.partitions) + [()] * (len(shape) - len(spec.partitions))
    sharding: list[DimSharding] = [
        Chunked(tuple(sizes[a] for a in axes)) if axes else NoSharding() for axes in parts
    ]
    sharded_axis = {axis: k for k, axis in enumerate(spec.mesh_axes)}
    mesh_mapping: list[MeshMapping] = [
        ShardedAxis(sharded_axis[a]) if a in sharded_axis else Replicated(sizes[a])
        for a in mesh.axis_names
    ]
    return ShardingSpec(tuple(sharding), tuple(mesh_mapping))


def devices_indices_map(
    aval_shape: tuple[int, ...], spec: Any, mesh: Mesh
) -> dict[Any, tuple[Any, ...]]:
    """``{device: index}`` for every device of ``mesh``: what part of the value it holds.

    The same mapping as ``NamedSharding(mesh, spec).devices_indices_map(shape)``,
    computed from the spec alone (no jax sharding object, any device objects).
    """
    indices = sharding_spec_from_parsed(aval_shape, spec, mesh).indices(tuple(aval_shape))
    return dict(zip(mesh.devices.flat, indices.flat, strict=True))


def sharding_spec_of(x: jax.Array) -> ShardingSpec:
    """The pmap-style ``ShardingSpec`` of ``x``'s layout (a pmap output's: one slice per device).

    Raises:
        ValueError: ``x`` is not laid out by a NamedSharding over a mesh.
    """
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, jax.sharding.NamedSharding) or not isinstance(sharding.mesh, Mesh):
        raise ValueError(
            f"sharding_spec_of: expected a jax.Array laid out by a NamedSharding over a mesh, got "
            f"{sharding if sharding is not None else type(x).__name__}"
        )
    return sharding_spec_from_parsed(tuple(x.shape), sharding.spec, sharding.mesh)
