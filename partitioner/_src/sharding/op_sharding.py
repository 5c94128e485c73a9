"""Convert between partition specs and XLA's ``OpSharding`` (both directions).

Device numbers in an OpSharding are *positions* in ``mesh.devices.flat`` (the
executable's device assignment is the flattened mesh), never device ids, so
everything here works on fake devices too.

NOTE [mesh axis order]: a spec is a tiling of the mesh. Transpose the array of
device positions so that the axes the spec names come first, in spec order (major
to minor), followed by the unused axes in mesh order; reshape to one tile
dimension per array dimension plus a trailing replicated dimension holding the
unused axes. Size-1 mesh axes change no position, so (as jax does) they are
dropped: a spec over size-1 axes only is replicated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from jax.sharding import Mesh

from .. import jax_private as jp
from .checks import check_spec
from .parsed import REPLICATED, ParsedPartitionSpec
from .partition_spec import PartitionSpec, Spec

MSG_UNPARSEABLE_OP_SHARDING = """\
parse_op_sharding: the OpSharding {op_sharding} cannot be expressed as a PartitionSpec over \
the mesh {mesh_shape}: {detail}. Only shardings whose tiles follow mesh axes (as
get_aval_sharding_proto builds them) have a spec."""

OpSharding = jp.OpSharding
HloSharding = jp.HloSharding


def _tiling(
    shape: tuple[int, ...], spec: ParsedPartitionSpec, mesh: Mesh
) -> tuple[list[int], list[int], list[int], bool] | None:
    """``(tile_dims, reshape_dims, perm, replicate_last)`` for ``spec``, or None if replicated.

    ``reshape_dims``/``perm`` are over the mesh's non-size-1 axes (see NOTE [mesh axis order]).

    Raises:
        ValueError: an axis not in the mesh, or a spec longer than the rank.
    """
    check_spec(spec, shape, mesh, "get_aval_sharding_proto", check_divisible=False)
    sizes = dict(mesh.shape)
    names = [a for a in mesh.axis_names if sizes[a] != 1]
    used = [a for a in spec.mesh_axes if sizes[a] != 1]
    if not used:
        return None
    unused = [a for a in names if a not in used]
    tile_dims = list(spec.shards_per_dim(mesh, len(shape)))
    replicate_last = bool(unused)
    if replicate_last:
        tile_dims.append(math.prod(sizes[a] for a in unused))
    perm = [names.index(a) for a in used + unused]
    return tile_dims, [sizes[a] for a in names], perm, replicate_last


def get_aval_sharding_proto(
    aval: Any,
    axis_resources: Any,
    mesh: Mesh,
    *,
    encoding: str = "explicit",
    device_positions: Sequence[int] | None = None,
) -> Any:  # xla_client.OpSharding
    """The ``OpSharding`` that lays a value of ``aval.shape`` out as the spec says.

    Args:
        aval: anything with a ``.shape``.
        axis_resources: a PartitionSpec, a ParsedPartitionSpec or None.
        mesh: a ``jax.sharding.Mesh``; its devices may be any objects.
        encoding: ``"explicit"`` (``tile_assignment_devices``) or ``"iota"``
            (``iota_reshape_dims`` + ``iota_transpose_perm``); the same sharding.
        device_positions: where each mesh device sits in another device
            assignment (``device_positions[i]`` for ``mesh.devices.flat[i]``);
            the explicit device list is renumbered to it (NOTE [device
            positions] in ``lower/annotate.py``). Implies ``"explicit"``.

    Returns:
        REPLICATED for a spec that partitions nothing; otherwise OTHER, tiled as in
        NOTE [mesh axis order]. ``HloSharding.from_proto`` of it equals jax's
        ``NamedSharding(mesh, spec)._to_xla_hlo_sharding(ndim)``.
    """
    spec = ParsedPartitionSpec.coerce(
        axis_resources, "get_aval_sharding_proto axis_resources", allow_unconstrained=True
    )
    tiling = _tiling(tuple(aval.shape), spec, mesh)
    proto = OpSharding()
    if tiling is None:
        proto.type = OpSharding.Type.REPLICATED
        return proto
    tile_dims, reshape_dims, perm, replicate_last = tiling
    proto.type = OpSharding.Type.OTHER
    proto.tile_assignment_dimensions = tile_dims
    if encoding not in ("explicit", "iota"):
        raise ValueError(f"encoding must be 'explicit' or 'iota', got {encoding!r}")
    if encoding == "iota" and device_positions is None:
        proto.iota_reshape_dims = reshape_dims
        proto.iota_transpose_perm = perm
    else:
        order = np.arange(math.prod(reshape_dims)).reshape(reshape_dims).transpose(perm).flat
        renumber: Sequence[int] = (
            device_positions if device_positions is not None else range(mesh.size)
        )
        proto.tile_assignment_devices = [int(renumber[int(d)]) for d in order]
    proto.replicate_on_last_tile_dim = replicate_last
    return proto


def get_hlo_sharding(aval: Any, axis_resources: Any, mesh: Mesh) -> Any:  # xla_client.HloSharding
    """:func:`get_aval_sharding_proto` as an ``HloSharding`` (what ``mhlo.sharding`` prints)."""
    return HloSharding.from_proto(
        get_aval_sharding_proto(aval, axis_resources, mesh, encoding="iota")
    )


def hlo_sharding_text(aval: Any, axis_resources: Any, mesh: Mesh) -> str:
    """The GSPMD ``mhlo.sharding`` attribute text, e.g. ``{devices=[2,1,4]<=[8] last_tile_dim_replicate}``."""
    return str(get_hlo_sharding(aval, axis_resources, mesh))


# --- OpSharding -> spec ---


def _device_order(proto: Any) -> np.ndarray:
    """The flat tile assignment, whichever encoding the proto uses."""
    if len(proto.iota_reshape_dims):
        reshape = list(proto.iota_reshape_dims)
        perm = list(proto.iota_transpose_perm) or list(range(len(reshape)))
        return np.arange(math.prod(reshape)).reshape(reshape).transpose(perm).reshape(-1)
    return np.asarray(list(proto.tile_assignment_devices), dtype=np.int64)


class Unparseable(Exception):
    pass


def unflatten_superdims(assignment: Sequence[int] | np.ndarray) -> list[tuple[int, int]]:
    """Split a flat assignment into ``(size, stride)`` runs, minor-most first.

    Properties (tested): if it returns ``dims`` (for *any* input), then
    ``assignment[k] == sum(((k // prod(sizes before i)) % size_i) * stride_i)``;
    and every transposition of a reshaped ``np.arange(n)`` is accepted. Other
    inputs raise ``Unparseable`` unless they are such runs (it does not check
    that the runs form a permutation; ``_axis_order`` does). A run of size ``s``
    and stride ``t`` may span several mesh axes at once (``np.arange(8)`` is one
    run); :func:`explode_superdims` splits it.
    """
    flat = np.asarray(assignment, dtype=np.int64)
    if flat.size == 0 or flat[0] != 0:
        raise Unparseable("the assignment does not start at device position 0")
    dims: list[tuple[int, int]] = []
    while flat.size > 1:
        stride = int(flat[1])
        size = 1
        while size < flat.size and flat[size] == size * stride:
            size += 1
        if size < 2 or flat.size % size:
            raise Unparseable("the assignment is not a transposition of the mesh")
        # The run length comes from the first run only; every other run must
        # repeat it from its own start, or the (size, stride) pair describes
        # some other assignment (e.g. [0, 1, 3, 2] would read as [0, 1, 3, 4]).
        runs = flat.reshape(-1, size)
        if not np.array_equal(runs, runs[:, :1] + stride * np.arange(size)):
            raise Unparseable("the assignment is not a transposition of the mesh")
        dims.append((size, stride))
        flat = runs[:, 0]
    return dims


def explode_superdims(
    sizes: Sequence[int], strides: Sequence[int], dims: Sequence[tuple[int, int]]
) -> list[int]:
    """Map ``(size, stride)`` runs onto mesh axes; return axis indices, minor-most first.

    A run starting at axis ``i``'s stride covers axis ``i``, then the next more
    major axis, and so on until its size is used up.
    """
    by_stride = {st: i for i, st in enumerate(strides)}
    out: list[int] = []
    for size, stride in dims:
        while size > 1:
            i = by_stride.get(stride)
            if i is None or size % sizes[i]:
                raise Unparseable(
                    f"a run of {size} devices with stride {stride} does not follow mesh axes"
                )
            out.append(i)
            size //= sizes[i]
            stride *= sizes[i]
    return out


def _canonical_device_order(proto: Any, tile_dims: list[int], n_replicated: int) -> np.ndarray:
    """The flat tile assignment with each replica group's devices in ascending order.

    The devices of one replica group (the trailing replicated tile dimensions) all
    hold the same block, so the order they are listed in says nothing about the
    layout; sorting them lets any listing parse (as jax's own parser accepts).
    """
    devices = _device_order(proto)
    if not n_replicated or math.prod(tile_dims) != devices.size:
        return devices
    groups = math.prod(tile_dims[: len(tile_dims) - n_replicated])
    return np.sort(devices.reshape(groups, -1), axis=1).reshape(-1)


def _axis_order(devices: np.ndarray, mesh: Mesh) -> list[Any]:
    """Mesh axes (non-size-1) in the major-to-minor order the tile assignment uses."""
    mesh_sizes = dict(mesh.shape)
    names = [a for a in mesh.axis_names if mesh_sizes[a] != 1]
    sizes = [mesh_sizes[a] for a in names]
    strides = [math.prod(sizes[i + 1 :]) for i in range(len(sizes))]
    if devices.size != math.prod(sizes) or sorted(devices.tolist()) != list(range(devices.size)):
        raise Unparseable(
            f"it assigns {devices.size} tiles but the mesh has {math.prod(sizes)} devices"
        )
    order = explode_superdims(sizes, strides, unflatten_superdims(devices))[::-1]
    perm_sizes = [sizes[i] for i in order]
    rebuilt = (
        np.arange(devices.size).reshape(sizes).transpose(order).reshape(-1)
        if order
        else np.zeros(1, int)
    )
    if len(perm_sizes) != len(sizes) or not np.array_equal(rebuilt, devices):
        raise Unparseable("the tile assignment is not a transposition of the mesh devices")
    return [names[i] for i in order]


def parse_op_sharding_parsed(op_sharding: Any, mesh: Mesh) -> ParsedPartitionSpec | list[Any]:
    """The inverse of :func:`get_aval_sharding_proto`, as a ParsedPartitionSpec.

    Accepts OpSharding or HloSharding; REPLICATED, MAXIMAL on a one-device mesh,
    OTHER (explicit or iota device lists, ``replicate_on_last_tile_dim`` or
    replicated ``last_tile_dims``, the devices of a replica group in any order) and
    TUPLE (a list of results).

    Raises:
        ValueError: the sharding is not expressible as a spec over ``mesh``
            (MAXIMAL, MANUAL, a device order that does not follow mesh axes, or
            a tile that splits a mesh axis).
    """
    proto = op_sharding.to_proto() if isinstance(op_sharding, HloSharding) else op_sharding
    kind = proto.type
    T = OpSharding.Type
    if kind == T.TUPLE:
        return [parse_op_sharding_parsed(s, mesh) for s in proto.tuple_shardings]
    if kind == T.REPLICATED or (kind == T.MAXIMAL and mesh.size == 1):
        return REPLICATED  # (one device: the whole value is on it, as jax parses it)
    try:
        if kind != T.OTHER:
            raise Unparseable(f"sharding type {kind.name} has no PartitionSpec")
        tile_dims = list(proto.tile_assignment_dimensions)
        n_trailing = 1 if proto.replicate_on_last_tile_dim else len(proto.last_tile_dims)
        if any(t != T.REPLICATED for t in proto.last_tile_dims):
            raise Unparseable("only replicated subgroups have a PartitionSpec")
        if math.prod(tile_dims) != _device_order(proto).size:
            raise Unparseable(f"tile dimensions {tile_dims} do not multiply to the device count")
        order = iter(_axis_order(_canonical_device_order(proto, tile_dims, n_trailing), mesh))
        sizes = dict(mesh.shape)
        partitions: list[tuple[Any, ...]] = []
        for tile in tile_dims[: len(tile_dims) - n_trailing]:
            axes: list[Any] = []
            while tile > 1:
                axis = next(order, None)
                if axis is None or tile % sizes[axis]:
                    raise Unparseable(f"a tile dimension of {tile} splits a mesh axis")
                axes.append(axis)
                tile //= sizes[axis]
            partitions.append(tuple(axes))
    except Unparseable as e:
        raise ValueError(
            MSG_UNPARSEABLE_OP_SHARDING.format(
                op_sharding=proto, mesh_shape=dict(mesh.shape), detail=e
            )
        ) from None
    while partitions and partitions[-1] == ():
        partitions.pop()
    return ParsedPartitionSpec(PartitionSpec(*partitions), partitions)


def parse_op_sharding(op_sharding: Any, mesh: Mesh) -> Spec | list[Any]:
    """The spec an OpSharding (or HloSharding) lays out over ``mesh``.

    Returns a :class:`PartitionSpec` with trailing unpartitioned dims omitted (a
    list of them for a TUPLE sharding). See :func:`parse_op_sharding_parsed`.
    """

    def to_spec(parsed: ParsedPartitionSpec | list[Any]) -> Spec | list[Any]:
        if isinstance(parsed, list):
            return [to_spec(p) for p in parsed]
        return parsed.to_partition_spec()

    return to_spec(parse_op_sharding_parsed(op_sharding, mesh))
