"""Worker: leave the job with ``jax.distributed.shutdown()``, then keep working alone.

``leave_early.py SECONDS``: after a collective over both processes, each one shuts its
distributed client down (jax's way to leave a job in order) and works on alone for
``SECONDS`` (longer than the heartbeat timeout), then prints ``saved``. The peers
fall silent when they leave; that is not a lost process.
"""

from __future__ import annotations

import sys
import time

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import partitioner
import partitioner.distributed as pd


def main(seconds: str) -> None:
    pd.initialize()
    mesh = jax.make_mesh((jax.device_count(),), ("i",), axis_types=(AxisType.Auto,))
    local = np.full((jax.local_device_count(),), float(jax.process_index()))
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), local)
    total = partitioner.jit(jnp_sum, out_shardings=NamedSharding(mesh, P()))(x)
    # Every local device's part of the collective, not only the first shard read back:
    # a device still connecting to a peer that has left hangs this process at exit.
    total.block_until_ready()
    expected = sum(range(jax.process_count())) * jax.local_device_count()
    assert float(total.addressable_data(0)) == expected, total
    jax.distributed.shutdown()
    time.sleep(float(seconds))  # stands for local work after the job: writing a report
    print("saved")


def jnp_sum(x: jax.Array) -> jax.Array:
    return x.sum()


if __name__ == "__main__":
    main(*sys.argv[1:])
