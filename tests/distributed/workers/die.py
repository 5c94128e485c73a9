"""A training loop in which process 1 is killed (SIGKILL) mid-run.

Process 1 prints ``KILLED <time.time()>`` just before it kills itself; the others
must stop with a ProcessLostError naming it, within the heartbeat timeout.
"""

from __future__ import annotations

import partitioner.distributed as pd

pd.initialize()

# isort: split
import os  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import partitioner  # noqa: E402
from partitioner import PartitionSpec as P  # noqa: E402

MESH = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
with partitioner.mesh(MESH.devices, MESH.axis_names):
    step = partitioner.pjit(
        lambda w, x: w - 0.01 * jnp.tanh(x @ w), (P(None, "b"), P("a")), P(None, "b")
    )
    w, x = np.eye(8, dtype=np.float32), np.ones((8, 8), np.float32)
    for i in range(10_000):
        w = step(w, x)
        w.block_until_ready()
        if i == 20 and jax.process_index() == 1:
            print(f"KILLED {time.time()!r}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.01)
print("NOT REACHED", flush=True)
