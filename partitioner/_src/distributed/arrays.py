"""Host-local data <-> global arrays over a mesh spanning processes (seed 001).

NOTE [host-local positional semantics]: a process holds a block of each global
array: along a dimension partitioned over mesh axes, the part its own devices
cover (they must form one block of the mesh); a dimension not partitioned, or
partitioned only over axes that stay within the process, whole. The host-local
array is that block, so its shape is the global shape divided, per dimension, by
how many processes the dimension's mesh axes span. ``host_local_to_global`` builds
the global array from every process's block without moving data between
processes; ``global_to_host_local`` gives each process its block back (its device
buffers, no copy). ``host_local_slice`` says which rows that is, so a loader reads
only its shard of a dataset.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from ..sharding.parsed import ParsedPartitionSpec
from ..sharding.tree import broadcast_prefix


def _process_block(mesh: Mesh) -> dict[Any, tuple[int, int]]:
    """Per mesh axis: (this process's first index along it, how many it holds).

    Raises:
        ValueError: this process's devices do not form one block of the mesh.
    """
    me = jax.process_index()
    mine = np.vectorize(lambda d: d.process_index == me)(mesh.devices)
    if not mine.any():
        raise ValueError(
            f"host-local arrays: the mesh {dict(mesh.shape)} has no device of process {me}"
        )
    block: dict[Any, tuple[int, int]] = {}
    where = np.argwhere(mine)
    lo, hi = where.min(axis=0), where.max(axis=0) + 1
    if (
        int(np.prod(hi - lo)) != int(mine.sum())
        or not mine[tuple(slice(a, b) for a, b in zip(lo, hi))].all()
    ):
        raise ValueError(
            f"host-local arrays: process {me}'s devices do not form one block of the mesh "
            f"{dict(mesh.shape)} (device ids {mesh.device_ids.tolist()}); arrange the mesh so each "
            "process's devices are contiguous, e.g. np.array(jax.devices()).reshape(...)"
        )
    for name, a, b in zip(mesh.axis_names, lo, hi, strict=True):
        block[name] = (int(a), int(b - a))
    return block


def _split(spec: ParsedPartitionSpec, mesh: Mesh, ndim: int) -> list[tuple[int, int]]:
    """Per dimension: (how many process blocks it is split into, this process's block index)."""
    block = _process_block(mesh)
    parts = list(spec.partitions) + [()] * (ndim - len(spec.partitions))
    out = []
    for axes in parts:
        count, index = 1, 0
        for axis in axes:  # major to minor, as the sharding lays them out
            if axis not in block:
                raise ValueError(
                    f"{spec.describe()} names the axis {axis!r}, which the mesh "
                    f"{dict(mesh.shape)} does not have"
                )
            start, size = block[axis]
            blocks = mesh.shape[axis] // size
            count, index = count * blocks, index * blocks + start // size
        out.append((count, index))
    return out


def local_mesh(mesh: Mesh) -> Mesh:
    """This process's block of ``mesh`` (the whole mesh in a single process)."""
    block = _process_block(mesh)
    return Mesh(
        mesh.devices[tuple(slice(start, start + size) for start, size in block.values())],
        mesh.axis_names,
    )


def local_shape(global_shape: Sequence[int], mesh: Mesh, spec: Any) -> tuple[int, ...]:
    """The shape of this process's block of a global array laid out as ``spec``."""
    parsed = ParsedPartitionSpec.coerce(spec, "local_shape")
    split = _split(parsed, mesh, len(global_shape))
    return tuple(n // count for n, (count, _) in zip(global_shape, split, strict=True))


def global_shape(block_shape: Sequence[int], mesh: Mesh, spec: Any) -> tuple[int, ...]:
    """The global shape whose blocks (laid out as ``spec``) have ``block_shape``."""
    parsed = ParsedPartitionSpec.coerce(spec, "global_shape")
    split = _split(parsed, mesh, len(block_shape))
    return tuple(n * count for n, (count, _) in zip(block_shape, split, strict=True))


def host_local_slice(global_shape: Sequence[int], mesh: Mesh, spec: Any) -> tuple[slice, ...]:
    """The slice of a global array of ``global_shape`` this process holds (its loader reads it).

    Raises:
        ValueError: a partitioned dimension not divisible by its number of blocks,
            or a mesh this process has no contiguous block of.
    """
    parsed = ParsedPartitionSpec.coerce(spec, "host_local_slice")
    out = []
    for d, (size, (count, index)) in enumerate(
        zip(global_shape, _split(parsed, mesh, len(global_shape)), strict=True)
    ):
        if size % count:
            raise ValueError(
                f"host_local_slice: dimension {d} of size {size} is split over {count} processes by "
                f"{parsed.describe()}; it must be divisible by {count}"
            )
        step = size // count
        out.append(slice(index * step, (index + 1) * step))
    return tuple(out)


def host_local_to_global(tree: Any, mesh: Mesh, specs: Any) -> Any:
    """Global ``jax.Array``s from each process's host-local blocks (NOTE [host-local positional semantics]).

    Args:
        tree: a pytree of numpy arrays (or jax.Arrays, or scalars): this process's blocks.
        mesh: a mesh over the devices of every process.
        specs: a spec (prefix) tree for ``tree``: PartitionSpec or None leaves.

    Raises:
        ValueError: a spec names an axis the mesh lacks; a block's partitioned
            dimension is not divisible by the devices it spreads over within the process.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    spec_leaves, paths = broadcast_prefix(specs, tree, api="host_local_to_global", what="specs")
    out = []
    for leaf, spec, path in zip(leaves, spec_leaves, paths, strict=True):
        where = f"tree{jax.tree_util.keystr(path)}"
        out.append(_to_global(np.asarray(leaf), mesh, spec, where))
    return jax.tree_util.tree_unflatten(treedef, out)


def host_local_view(x: jax.Array) -> jax.Array:
    """This process's block of ``x``, laid out by ``x``'s own spec (``x`` itself in one process).

    Raises:
        ValueError: ``x`` spans processes but is not laid out by a NamedSharding.
    """
    if x.is_fully_addressable:
        return x
    sharding = x.sharding
    if not isinstance(sharding, NamedSharding):
        raise ValueError(
            f"an array spanning processes must be laid out by a NamedSharding, got {sharding}"
        )
    mesh, spec = sharding.mesh, sharding.spec
    assert isinstance(mesh, Mesh)  # an array's mesh is concrete
    return _block_of(x, local_mesh(mesh), spec, local_shape(x.shape, mesh, spec))


def _block_of(x: jax.Array, mine: Mesh, spec: Any, shape: tuple[int, ...]) -> jax.Array:
    """``x``'s shards on this process's devices, as one array of ``shape`` over ``mine``."""
    sharding = NamedSharding(mine, spec)
    by_device = {s.device: s.data for s in x.addressable_shards}
    shards = [by_device[d] for d in sharding.addressable_devices_indices_map(shape)]
    return jax.make_array_from_single_device_arrays(shape, sharding, shards)


def _to_global(local: np.ndarray, mesh: Mesh, spec: Any, where: str) -> jax.Array:
    parsed = ParsedPartitionSpec.coerce(spec, f"host_local_to_global {where}")
    split = _split(parsed, mesh, local.ndim)
    block = _process_block(mesh)
    for d, axes in enumerate(parsed.partitions):
        within = math.prod([block[axis][1] for axis in axes])
        if d < local.ndim and local.shape[d] % within:
            raise ValueError(
                f"host_local_to_global: {where} has shape {local.shape}; its dimension {d} "
                f"({local.shape[d]}) is split over {within} of this process's devices by "
                f"{parsed.describe()} and must be divisible by {within}"
            )
    global_shape = tuple(n * count for n, (count, _) in zip(local.shape, split, strict=True))
    sharding = NamedSharding(mesh, parsed.to_partition_spec())
    offsets = [n * index for n, (_, index) in zip(local.shape, split, strict=True)]
    arrays = []
    for device, found in sharding.addressable_devices_indices_map(global_shape).items():
        index = found or tuple(slice(None) for _ in global_shape)
        local_index = tuple(
            slice((s.start or 0) - off, (s.stop if s.stop is not None else n) - off)
            for s, off, n in zip(index, offsets, global_shape, strict=True)
        )
        arrays.append(jax.device_put(local[local_index], device))
    return jax.make_array_from_single_device_arrays(global_shape, sharding, arrays)


def global_to_host_local(tree: Any, mesh: Mesh, specs: Any) -> Any:
    """This process's blocks of global arrays, as arrays over its own devices.

    The inverse of :func:`host_local_to_global`: each result is laid out by ``specs``
    over the process's part of the mesh, on the same device buffers (no copy).

    Raises:
        ValueError: an array is not laid out as its spec says over ``mesh``.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    spec_leaves, paths = broadcast_prefix(specs, tree, api="global_to_host_local", what="specs")
    mine = local_mesh(mesh)
    out = []
    for leaf, spec, path in zip(leaves, spec_leaves, paths, strict=True):
        where = f"tree{jax.tree_util.keystr(path)}"
        parsed = ParsedPartitionSpec.coerce(spec, f"global_to_host_local {where}")
        wanted = NamedSharding(mesh, parsed.to_partition_spec())
        if not isinstance(leaf, jax.Array) or not leaf.sharding.is_equivalent_to(wanted, leaf.ndim):
            raise ValueError(
                f"global_to_host_local: {where} must be a jax.Array laid out as "
                f"{parsed.describe()} over the mesh {dict(mesh.shape)}, got "
                f"{getattr(leaf, 'sharding', type(leaf).__name__)}"
            )
        out.append(
            _block_of(leaf, mine, parsed.to_partition_spec(), local_shape(leaf.shape, mesh, parsed))
        )
    return jax.tree_util.tree_unflatten(treedef, out)
