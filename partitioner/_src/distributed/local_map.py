"""A pmap over the devices of every process, called with this process's slices.

NOTE [multi-process pmap]: as in classic jax.pmap, each process of a job calls
the same pmap-ed function with its *local* slice of every mapped argument (the
mapped dimension has one entry per local device of the map), and the map runs
over the devices of the whole job: collectives reach every device, and
``axis_index`` counts them in the order of ``devices`` (default: every
process's first devices, process by process). Here a call builds one global
array per mapped argument from the local slices (no data moves between
processes), runs the map on global arrays (the ordinary pjit path, fast path
included) and hands back this process's shards of each output.

Before its first call with a given local signature, every process publishes it
and compares (NOTE [program agreement]): mismatched local slices are a
``ValueError`` in every process instead of a collective that never completes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .. import jax_private as jp
from ..compiler.agreement import check_agreement
from .arrays import host_local_view


def is_multiprocess() -> bool:
    """Whether this is one process of a multi-process job (without starting a backend first)."""
    return jp.distributed_client() is not None and jax.process_count() > 1


def job_devices(n_local: int, backend: str | None) -> list[jax.Device]:
    """Each process's first ``n_local`` devices, process by process (classic pmap's order).

    Raises:
        ValueError: a process has fewer than ``n_local`` devices.
    """
    devices = []
    for p in range(jax.process_count()):
        mine = [d for d in jax.devices(backend) if d.process_index == p]
        if n_local > len(mine):
            raise ValueError(
                f"pmap: the mapped axis has {n_local} entries per process, but process {p} has "
                f"only {len(mine)} {mine[0].platform if mine else ''} devices"
            )
        devices.extend(mine[:n_local])
    return devices


class LocalSlices:
    """Turns one process's call of a multi-process pmap into a call on global arrays.

    ``dims(args, kwargs)`` gives the flat dynamic leaves with their mapped dims
    and a rebuilder; ``devices(n_local)`` the devices of the map, in map order.
    """

    def __init__(
        self,
        api: str,
        axis_name: str,
        flatten: Callable[[tuple[Any, ...], dict[str, Any]], Any],
        devices: Callable[[int], Sequence[jax.Device]],
    ) -> None:
        self.api, self.axis_name = api, axis_name
        self._flatten, self._devices = flatten, devices
        self._agreed: set[str] = set()

    def wrap(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` (on global arrays) taking and giving this process's slices."""

        def local_call(*args: Any, **kwargs: Any) -> Any:
            leaves, dims, rebuild = self._flatten(args, kwargs)
            sizes = {np.shape(x)[d] for x, d in zip(leaves, dims, strict=True) if d is not None}
            self._agree(leaves, dims)
            if len(sizes) != 1:  # no mapped argument, or sizes that differ: the plan says why
                return call(*args, **kwargs)
            (n_local,) = sizes
            mesh = Mesh(np.array(self._devices(n_local)), (self.axis_name,))
            glob = [
                _to_global(x, d, mesh, self.axis_name) if d is not None else _host_value(x, mesh)
                for x, d in zip(leaves, dims, strict=True)
            ]
            g_args, g_kwargs = rebuild(glob)
            out = call(*g_args, **g_kwargs)
            return jax.tree_util.tree_map(_local_part, out)

        return local_call

    def _agree(self, leaves: Sequence[Any], dims: Sequence[int | None]) -> None:
        """NOTE [multi-process pmap]: the processes' local slices agree (checked once per signature)."""
        mine = ", ".join(
            f"{jp.shaped_abstractify(x).str_short()}@{d}" for x, d in zip(leaves, dims, strict=True)
        )
        if mine in self._agreed:
            return
        check_agreement(
            self.api,
            "local slices (shape@mapped dimension)",
            mine,
            "Every process passes its local slice of each mapped argument: the same shapes, "
            "the mapped dimension of size its number of devices of the map.",
        )
        self._agreed.add(mine)


def _to_global(x: Any, dim: int, mesh: Mesh, axis: str) -> jax.Array:
    """The global array whose shards on this process's devices of ``mesh`` are ``x``'s entries."""
    local = np.asarray(x)
    devices = list(mesh.devices.flat)
    mine = [i for i, d in enumerate(devices) if d.process_index == jax.process_index()]
    shape = (*local.shape[:dim], len(devices), *local.shape[dim + 1 :])
    spec = PartitionSpec(*([None] * dim), axis)
    shards = [jax.device_put(np.take(local, [j], axis=dim), devices[i]) for j, i in enumerate(mine)]
    return jax.make_array_from_single_device_arrays(shape, NamedSharding(mesh, spec), shards)


def _host_value(x: Any, mesh: Mesh) -> Any:
    """An unmapped argument: the same value in every process (a local array as its value)."""
    if isinstance(x, jax.Array) and x.is_fully_addressable and mesh.is_multi_process:
        return np.asarray(x)
    return x


def _local_part(x: Any) -> Any:
    """This process's shards of a global output, over its own devices (in the map's order)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return x
    sharding = x.sharding
    if not isinstance(sharding, NamedSharding) or len(sharding.mesh.axis_names) != 1:
        return host_local_view(x)
    mesh = sharding.mesh
    me = jax.process_index()
    devices = [d for d in mesh.devices.flat if d.process_index == me]
    spec = sharding.spec
    dim = next((i for i, e in enumerate(spec) if e is not None), None)
    shape = list(x.shape)
    if dim is not None:
        shape[dim] = len(devices)
    by_device = {s.device: s.data for s in x.addressable_shards}
    local = NamedSharding(Mesh(np.array(devices), mesh.axis_names), spec)
    return jax.make_array_from_single_device_arrays(
        tuple(shape), local, [by_device[d] for d in devices]
    )
