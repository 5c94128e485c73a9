"""A collective over every device of the job, waited for on every local device.

``multihost_utils.process_allgather`` reads one shard back and may return while
another local device is still connecting its part to a peer (gloo, through the
coordination service): its log lines then come after the worker's last line, and a
peer that leaves first leaves that device waiting at exit. The exit tests wait on
the whole result instead.
"""

from __future__ import annotations

import sys

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import partitioner


def _total(x: jax.Array) -> jax.Array:
    return x.sum()


def sum_over_the_job() -> float:
    """Each device contributes its process index; the total, once every device is done."""
    mesh = jax.make_mesh((jax.device_count(),), ("i",), axis_types=(AxisType.Auto,))
    local = np.full((jax.local_device_count(),), float(jax.process_index()))
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), local)
    total = partitioner.jit(_total, out_shardings=NamedSharding(mesh, P()))(x)
    total.block_until_ready()  # every local device's part of the collective
    expected = sum(range(jax.process_count())) * jax.local_device_count()
    got = float(total.addressable_data(0))
    assert got == expected, (got, expected)
    return got


def say(line: str) -> None:
    """One write per line, so C++ log lines on the same pipe never split it."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
