"""The devices a pmap runs on: the axis's mesh, the grid of a nest of maps, a job's devices.

Why its own module: which devices a map takes depends on ``devices=``, the
backend, a multi-process job (NOTE [multi-process pmap]) and the maps nested in
it (NOTE [nested pmap]); none of that is about the arguments, so the planner
asks here with a size and gets a mesh.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from ..distributed.local_map import job_devices
from .pmap_info import PmapInfo


def axis_mesh(info: PmapInfo, n: int) -> Mesh:
    """The one-axis mesh of the first ``n`` devices (the given ones, else local ones).

    Raises:
        ValueError: more entries than devices; a map made before a multi-process
            job started; ``devices`` that do not fit the map.
    """
    if info.devices is not None:
        # More devices than the axis: the outer map of a nest takes the devices of
        # the whole nest (checked against the nest in ``grid_mesh``, or ``check_devices``).
        if len(info.devices) % n:
            check_devices(info, n)
        available = list(info.devices)
    elif jax.process_count() > 1:  # NOTE [multi-process pmap]: global arrays here
        if not info.multiprocess:
            raise ValueError(
                f"{info.label}: this pmap was made before "
                "partitioner.distributed.initialize(); in a multi-process job, make it after"
            )
        available = job_devices(n // jax.process_count(), info.backend)
    else:
        available = jax.local_devices(backend=info.backend)
        if n > len(available):
            raise ValueError(
                f"{info.label}: the mapped axis has size {n}, larger than the "
                f"{len(available)} available {available[0].platform} devices"
            )
    return Mesh(np.array(available[:n]), (info.axis_name,))  # meshes are interned


def check_devices(info: PmapInfo, n: int) -> None:
    """Raise unless ``devices`` (if given) lists one device per device of the map."""
    if info.devices is not None and n != len(info.devices):
        raise ValueError(
            f"{info.label}: the map needs {n} devices (its mapped axis, times those "
            f"of the maps nested in it), but devices lists {len(info.devices)} devices; "
            "they must be equal"
        )


def grid_mesh(info: PmapInfo, n: int, chain: Sequence[tuple[str, int]]) -> Mesh:
    """The device grid of this map and the maps nested in it (NOTE [nested pmap]).

    Raises:
        ValueError: nested maps reuse an axis name, or need more devices than there are.
    """
    names = (info.axis_name, *(a for a, _ in chain))
    if len(set(names)) != len(names):
        raise ValueError(f"{info.label}: nested maps reuse an axis name: {names}")
    sizes = (n, *(s for _, s in chain))
    total = math.prod(sizes)
    available = (
        list(info.devices) if info.devices is not None else jax.local_devices(backend=info.backend)
    )
    if total > len(available):
        raise ValueError(
            f"{info.label}: nested maps over {dict(zip(names, sizes))} need {total} "
            f"devices, larger than the {len(available)} available"
        )
    return Mesh(np.array(available[:total]).reshape(sizes), names)


def map_devices(info: PmapInfo, n_local: int) -> list[jax.Device]:
    """The devices of a multi-process map with ``n_local`` entries in each process.

    Raises:
        ValueError: ``devices`` lists another number of this process's devices.
    """
    if info.devices is None:
        return job_devices(n_local, info.backend)
    mine = [d for d in info.devices if d.process_index == jax.process_index()]
    if len(mine) != n_local:
        raise ValueError(
            f"{info.label}: this process passes {n_local} entries of the mapped axis, but "
            f"devices lists {len(mine)} of its devices; they must be equal"
        )
    return list(info.devices)
